"""Upload first, commit once: a deferred commit keeps a job journal in the store (one small entry
object per written file, no commit per file) and lands ONE commit; a failed job leaves nothing; gc
keeps a live job's manifests and deletes a dead job's journal."""
import glob
import os
import time

import pytest

from cdcstore import Store
from cdcstore.core.commit import FileEntry
from cdcstore.core.errors import CdcError, InvalidAddressError
from cdcstore.storage import staging
from cdcstore.storage.maintenance import gc
from cdcstore.writers import deferred_commit, new_job


def _commits(root, repo="ds"):
    return {p: os.path.getsize(p) for p in glob.glob(os.path.join(root, "repos", repo, "commits", "*.json"))}


def _staging(root):
    return [p for p in glob.glob(os.path.join(root, "staging", "**"), recursive=True) if os.path.isfile(p)]


def _to_parquet(loc, parts, repo="ds"):
    import dask
    import dask.dataframe as dd
    import pandas as pd

    n = parts * 20
    df = dd.from_pandas(pd.DataFrame({"x": range(n), "s": [f"row-{i}" for i in range(n)]}), npartitions=parts)
    before = _commits(loc, repo)
    t0 = time.perf_counter()
    with deferred_commit(f"cdc://{repo}@main/", loc) as dc:
        with dask.config.set(scheduler="threads", num_workers=4):
            df.to_parquet(f"cdc://{repo}/out", storage_options=dc.storage_options, write_metadata_file=False)
    seconds = time.perf_counter() - t0
    new = {p: b for p, b in _commits(loc, repo).items() if p not in before}
    return dc, seconds, new


def test_dask_to_parquet_is_one_commit_linear_in_files(tmp_path):
    """50 vs 150 partitions: ONE commit object each, and its bytes grow with the files (on the
    staging-branch design each file was a commit holding the whole file map: quadratic, 9x for
    3x the files, whatever the count). 50/150 (was 200/600, then 100/300) tells the two apart
    just as well; the time is per partition."""
    pytest.importorskip("dask")
    loc = Store.init(str(tmp_path / "store")).location
    dc1, t1, small = _to_parquet(loc, 50, "a")
    dc2, t2, large = _to_parquet(loc, 150, "b")
    assert len(small) == 1 and len(large) == 1, (len(small), len(large))  # commit objects written
    b1, b2 = sum(small.values()), sum(large.values())
    assert b2 / b1 < 4, (b1, b2)  # 3x the partitions
    assert not _staging(loc)  # the journals are gone
    with Store(loc) as s:
        assert len(s.ls("cdc://a/out/")) == 50 and len(s.ls("cdc://b/out/")) == 150
        assert len(s.log("a")) == 1 and len(s.log("b")) == 1
    print(f"\ndask to_parquet deferred_commit (directory store, 4 threads): 50 parts {t1:.1f} s, "
          f"{b1} B of commit; 150 parts {t2:.1f} s, {b2} B of commit")


def test_pyarrow_write_dataset_with_deferred_commit_is_one_commit(server):
    import fsspec
    import pyarrow as pa
    import pyarrow.dataset as ds

    table = pa.table({"part": [i % 5 for i in range(500)], "x": list(range(500))})
    with deferred_commit("cdc://repo@main/", server.url) as dc:
        fs = fsspec.filesystem("cdc", skip_instance_cache=True, **dc.storage_options)
        ds.write_dataset(table, "repo/ds", filesystem=fs, format="parquet",
                         partitioning=ds.partitioning(pa.schema([("part", pa.int64())]), flavor="hive"))
        with Store(server.url, cache=False) as s:
            assert "repo" not in s.repos()  # nothing visible before the block ends
    with Store(server.url, cache=False) as s:
        assert len(s.log("repo")) == 1 and s.log("repo")[0]["commit"] == dc.result.commit
        names = [e["name"] for e in s.ls("cdc://repo/ds/", recursive=True)]
    assert len(names) == 5 and {n.split("/")[1] for n in names} == {f"part={i}" for i in range(5)}
    assert not _staging(server.store)


def _boom(df):
    if len(df) and df["x"].iloc[0] == 60:
        raise RuntimeError("task failed on purpose")
    return df


def test_failing_task_leaves_no_staging_objects_and_no_commit(tmp_path):
    dask = pytest.importorskip("dask")
    import dask.dataframe as dd
    import pandas as pd

    loc = Store.init(str(tmp_path / "store")).location
    with Store(loc) as s:
        (tmp_path / "seed").write_bytes(b"seed")
        s.push(str(tmp_path / "seed"), "cdc://ds/seed")
        before = s.log("ds")
    df = dd.from_pandas(pd.DataFrame({"x": range(200)}), npartitions=10).map_partitions(_boom)
    with pytest.raises(RuntimeError, match="on purpose"):
        with deferred_commit("cdc://ds@main/", loc) as dc:
            with dask.config.set(scheduler="threads", num_workers=2):
                df.to_parquet("cdc://ds/out", storage_options=dc.storage_options, write_metadata_file=False)
    with Store(loc) as s:
        assert s.log("ds") == before and dc.result is None
        assert [e["name"] for e in s.ls("cdc://ds/")] == ["seed"]
    # dask raises as soon as one task fails while its other threads run on: a task that writes after the
    # job closed finds the marker gone and deletes its own entry (staging.add), moments later
    deadline = time.monotonic() + 10
    while _staging(loc) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _staging(loc)


@pytest.fixture(params=["local", "server", "s3"])
def where(request, tmp_path, monkeypatch):
    if request.param == "local":
        return Store.init(str(tmp_path / "store")).location
    if request.param == "server":
        return request.getfixturevalue("server").url
    import secrets

    from conftest import S3_BUCKET

    request.getfixturevalue("s3_env")
    url = f"s3://{S3_BUCKET}/journal-{secrets.token_hex(4)}"
    Store.init(url).close()
    return url


def test_retried_task_counts_once_and_a_disagreement_lands_nothing(tmp_path, where):
    import fsspec

    with deferred_commit("cdc://ds@main/", where) as dc:
        fs = fsspec.filesystem("cdc", skip_instance_cache=True, **dc.storage_options)
        fs.pipe("ds/a.bin", b"A" * 1000)
        fs.pipe("ds/a.bin", b"A" * 1000)  # the task ran again: the same entry, one file
        fs.pipe("ds/b.bin", b"B" * 10)
    with Store(where, cache=False) as s:
        assert s.cat("cdc://ds/a.bin") == b"A" * 1000 and len(s.log("ds")) == 1
        with pytest.raises(InvalidAddressError, match="disagree on 'c.bin'"):
            with deferred_commit("cdc://ds@main/", where) as dc2:
                fs = fsspec.filesystem("cdc", skip_instance_cache=True, **dc2.storage_options)
                fs.pipe("ds/c.bin", b"one")
                fs.pipe("ds/c.bin", b"two")
        assert len(s.log("ds")) == 1 and "c.bin" not in [e["name"] for e in s.ls("cdc://ds/")]
        journal = s.journal()
        with pytest.raises(CdcError, match="over"):  # the job is closed: a late write is refused
            journal.add("ds", dc2.job, {"late.bin": FileEntry(s.resolve("cdc://ds/a.bin")[1].files["a.bin"].manifest,
                                                               1000)})
        assert journal.batches("ds", dc2.job) == []
    if "://" not in where:
        assert not _staging(where)


def test_rm_and_copy_inside_a_deferred_commit(store):
    import fsspec

    with deferred_commit("cdc://ds@main/", store.location) as dc:
        fs = fsspec.filesystem("cdc", skip_instance_cache=True, **dc.storage_options)
        fs.pipe("ds/keep.txt", b"k")
        fs.pipe("ds/gone.txt", b"g")
    with deferred_commit("cdc://ds@main/", store.location) as dc:
        fs = fsspec.filesystem("cdc", skip_instance_cache=True, **dc.storage_options)
        fs.rm("ds/gone.txt")
        fs.copy("ds/keep.txt", "ds/copy.txt")
    assert sorted(e["name"] for e in store.ls("cdc://ds/")) == ["copy.txt", "keep.txt"]
    assert len(store.log("ds")) == 2


def _age(root, seconds):
    old = time.time() - seconds
    for p in _staging(root) + glob.glob(os.path.join(root, "manifests", "*", "*")) + \
            glob.glob(os.path.join(root, "packs", "*", "*")):
        os.utime(p, (old, old))


def test_gc_keeps_a_live_jobs_files_and_deletes_a_dead_jobs_journal(tmp_path, store):
    """A driver still running (its job's marker fresh) keeps its uploaded files through a gc
    even past the grace window; a killed driver's journal (marker old) is deleted by gc."""
    (tmp_path / "f").write_bytes(os.urandom(50_000))
    repo = store.backend
    live, dead = new_job(), new_job()
    for job in (live, dead):
        store.journal().open("ds", job)
    entries = store.stage("ds", live, [(str(tmp_path / "f"), "f")])
    (tmp_path / "g").write_bytes(os.urandom(40_000))
    store.stage("ds", dead, [(str(tmp_path / "g"), "g")])
    _age(store.location, 2 * 24 * 3600)  # everything old: past grace and the stale window
    store.journal().open("ds", live)  # the live driver's heartbeat
    out = gc(repo, grace=3600)
    assert out["deleted"] and out["delete_staging"] == 2 and out["delete_manifests"] == 1
    assert staging.batches(repo, "ds", dead) == [] and not staging.is_open(repo, "ds", dead)
    res = store.land("cdc://ds@main/", live)  # the live job lands after the gc: its data is whole
    assert res is not None and store.cat("cdc://ds/f") == (tmp_path / "f").read_bytes()
    assert entries["f"] == store.resolve("cdc://ds/")[1].files["f"]
    assert not _staging(store.location)
    assert store.check(read_data=True)["problems"] == []


def test_job_ids_and_entries_are_checked(store):
    with pytest.raises(InvalidAddressError, match="job id"):
        store.journal().open("ds", "../../etc")
    with pytest.raises(InvalidAddressError, match="FileEntry"):
        staging.encode({"a": ("x" * 32, 1)})
    with pytest.raises(CdcError, match="damaged"):
        staging.decode(b'{"format": 1, "entries": [{"path": "../x", "manifest": "a", "size": 1}]}')
    data = staging.encode({"b/c": FileEntry("a" * 32, 3), "d": None})
    assert staging.decode(data) == [("b/c", FileEntry("a" * 32, 3)), ("d", None)]
    assert data == b'{"entries":[{"manifest":"' + b"a" * 32 + b'","path":"b/c","size":3},{"path":"d","remove":true}],"format":1}'


def test_a_transaction_inside_a_deferred_commit_is_one_journal_entry(where):
    import fsspec

    with Store(where, cache=False) as s:
        with deferred_commit("cdc://ds@main/", where) as dc:
            fs = fsspec.filesystem("cdc", skip_instance_cache=True, **dc.storage_options)
            with fs.transaction:
                for i in range(4):
                    fs.pipe(f"ds/t/{i}.txt", b"%d" % i)
            fs.pipe("ds/solo.txt", b"solo")
            batches = s.journal().batches("ds", dc.job)
            assert sorted(len(b) for b in batches) == [1, 4]  # one object for the transaction's 4 files
        assert len(s.log("ds")) == 1
        assert sorted(e["name"] for e in s.ls("cdc://ds/", recursive=True)) == \
            ["solo.txt", "t/0.txt", "t/1.txt", "t/2.txt", "t/3.txt"]
        assert s.journal().batches("ds", dc.job) == []


def test_a_scoped_token_learns_nothing_of_another_repos_files_through_jobs(tmp_path):
    """tok-a may not use repo b's jobs; naming b's manifest in a's job or asking whether it
    exists answers the same as for a manifest that does not exist: both are refused."""
    import json

    from cdcstore.storage.repository import LocalStore
    from cdcstore.testing import ServerProcess
    from test_tenants import TOKENS, _call

    LocalStore.init(str(tmp_path / "srv"))
    (tmp_path / "tokens.json").write_text(json.dumps(TOKENS))
    srv = ServerProcess(str(tmp_path / "srv"), "--tokens", str(tmp_path / "tokens.json")).start()
    try:
        (tmp_path / "secret.bin").write_bytes(os.urandom(20_000))
        with Store(srv.url, token="tok-b", cache=False) as sb:
            sb.push(str(tmp_path / "secret.bin"), "cdc://b/secret.bin")
            theirs = sb.resolve("cdc://b/")[1].files["secret.bin"]
        api, job = srv.url + "/v1", new_job()
        assert _call(f"{api}/repos/b/jobs/{job}", "tok-a", "PUT", b"{}")[0] == 403
        with Store(srv.url, token="tok-a", cache=False) as sa:
            assert sa.commits.manifests_present("a", [theirs.manifest, "0" * 32]) == set()
            sa.journal().open("a", job)
            other = new_job()
            sa.journal().open("a", other)
            refusals = []  # issue 31 case 4: refused at once, alike for b's manifest and a made-up one
            for j, manifest in ((other, "1" * 64), (job, theirs.manifest)):
                with pytest.raises(CdcError, match="may not read or the server lacks") as e:
                    sa.journal().add("a", j, {"x": FileEntry(manifest, theirs.size)})
                refusals.append((type(e.value), str(e.value).replace(manifest, "M")))
            assert refusals[0] == refusals[1]
            assert sa.land("cdc://a@main/", job) is None  # nothing to land
            assert "a" not in sa.repos() and sa.journal().batches("a", job) == []
    finally:
        srv.stop()

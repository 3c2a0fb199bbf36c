"""Many writers, one commit: workers in other processes upload and return entries (or write
through `cdc://` with deferred-commit options), and one commit publishes them all."""
import multiprocessing
import os
import secrets
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pytest

from cdcstore import InvalidAddressError, Store
from cdcstore.core.commit import FileEntry
from cdcstore.core.errors import CdcError, ConflictError
from cdcstore.writers import deferred_commit
from conftest import S3_BUCKET

pytestmark = pytest.mark.timeout(60) if hasattr(pytest.mark, "timeout") else []


@pytest.fixture(params=["local", "server", "s3"])
def location(request, tmp_path, monkeypatch):
    if request.param == "local":
        Store.init(str(tmp_path / "store")).close()
        return str(tmp_path / "store")
    if request.param == "server":
        return request.getfixturevalue("server").url
    request.getfixturevalue("s3_env")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine"))
    url = f"s3://{S3_BUCKET}/writers-{secrets.token_hex(4)}"
    Store.init(url).close()
    return url


def _worker_upload(location, files, dest):
    """A worker: upload, commit nothing, return the entries (pickled to the driver)."""
    with Store(location, cache=False) as s:
        return s.upload(files, dest)


def _pool(n=2):
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))


def test_workers_upload_driver_commits_once(tmp_path, location):
    data = {}
    jobs = []
    for w in range(2):
        d = tmp_path / f"w{w}"
        d.mkdir()
        for i in range(3):
            (d / f"part-{w}-{i}.bin").write_bytes(os.urandom(20_000 + i) + b"shared" * 1000)
            data[f"out/part-{w}-{i}.bin"] = (d / f"part-{w}-{i}.bin").read_bytes()
        jobs.append([str(d / f"part-{w}-{i}.bin") for i in range(3)])
    with Store(location, cache=False) as s:
        (tmp_path / "seed").write_bytes(b"seed")
        s.push(str(tmp_path / "seed"), "cdc://ds/seed")
        with _pool() as pool:
            parts = list(pool.map(_worker_upload, [location] * 2, jobs, ["cdc://ds/out/"] * 2))
        assert all(isinstance(e, FileEntry) for p in parts for e in p.values())
        assert [e["name"] for e in s.ls("cdc://ds/")] == ["seed"]  # uploaded, not visible
        res = s.commit_entries("cdc://ds@main/", parts, message="six parts")
        log = s.log("ds")
        assert len(log) == 2 and log[0]["commit"] == res.commit and log[0]["message"] == "six parts"
        assert {p: s.cat(f"cdc://ds/{p}") for p in data} == data
        assert s.cat("cdc://ds/seed") == b"seed"


def test_commit_entries_refuses_bad_entries(tmp_path, location):
    (tmp_path / "a.bin").write_bytes(os.urandom(5000))
    with Store(location, cache=False) as s:
        s.push(str(tmp_path / "a.bin"), "cdc://ds/a.bin")
        good = s.upload(str(tmp_path / "a.bin"), "cdc://ds/b.bin")
        e = good["b.bin"]
        wrong_size = {"b.bin": FileEntry(e.manifest, e.size + 1)}
        unknown = {"b.bin": FileEntry("0" * 32, 10)}
        for bad, says in ((wrong_size, "size|bytes"), (unknown, "not in the store|not on the server")):
            with pytest.raises((InvalidAddressError, CdcError), match=says):
                s.commit_entries("cdc://ds/", bad)
        with pytest.raises(InvalidAddressError, match="FileEntry"):
            s.commit_entries("cdc://ds/", {"x": ("a" * 32, 1)})
        with pytest.raises(InvalidAddressError, match="different files"):
            s.commit_entries("cdc://ds/", [good, {"b.bin": FileEntry(e.manifest, 0)}])
        assert len(s.log("ds")) == 1  # nothing landed
        s.commit_entries("cdc://ds/", [good, good])  # the same entry twice is fine
        assert s.cat("cdc://ds/b.bin") == (tmp_path / "a.bin").read_bytes()


def test_commit_entries_against_a_parent(tmp_path, store):
    (tmp_path / "f").write_bytes(b"one")
    store.push(str(tmp_path / "f"), "cdc://ds/x/f")
    base = store.log("ds")[0]["commit"]
    entries = store.upload(str(tmp_path / "f"), "cdc://ds/y/f")
    (tmp_path / "g").write_bytes(b"two")
    store.push(str(tmp_path / "g"), "cdc://ds/z/g")  # another writer, other paths
    res = store.commit_entries("cdc://ds/", entries, parent=base)  # rebased onto it
    assert {e["name"] for e in store.ls("cdc://ds/", recursive=True)} == {"x/f", "y/f", "z/g"}
    (tmp_path / "h").write_bytes(b"three")
    mine = store.upload(str(tmp_path / "h"), "cdc://ds/y/f")
    store.push(str(tmp_path / "g"), "cdc://ds/y/f")  # another writer changes the same path
    with pytest.raises(ConflictError, match="y/f"):
        store.commit_entries("cdc://ds/", mine, parent=res.commit)
    assert store.cat("cdc://ds/y/f") == b"two"


# -- fsspec: dask to_parquet on a process scheduler as ONE commit ----------------------------------

def _frame(n=600, parts=6):
    import pandas as pd
    import dask.dataframe as dd

    return dd.from_pandas(pd.DataFrame({"x": range(n), "s": [f"row-{i}" for i in range(n)]}), npartitions=parts)


@pytest.mark.parametrize("where", ["local", "server"])
def test_dask_to_parquet_processes_is_one_commit(tmp_path, request, where):
    dask = pytest.importorskip("dask")
    import dask.dataframe as dd

    if where == "local":
        loc = Store.init(str(tmp_path / "store")).location
    else:
        loc = request.getfixturevalue("server").url
    with Store(loc, cache=False) as s:
        (tmp_path / "seed").write_bytes(b"seed")
        s.push(str(tmp_path / "seed"), "cdc://ds/seed")
        with deferred_commit("cdc://ds@main/", loc) as dc:
            with dask.config.set(scheduler="processes", num_workers=2):
                _frame().to_parquet("cdc://ds/out", storage_options=dc.storage_options,
                                    write_metadata_file=False)
            assert [e["name"] for e in s.ls("cdc://ds/")] == ["seed"]  # nothing visible yet
        log = s.log("ds")
        assert len(log) == 2 and log[0]["commit"] == dc.result.commit  # exactly one new commit
        names = [e["name"] for e in s.ls("cdc://ds/out/")]
        assert len(names) == 6 and all(n.endswith(".parquet") for n in names)
        assert list(s.branches("ds")) == ["main"]  # no staging branch
    back = dd.read_parquet("cdc://ds/out", storage_options={"store": loc, "cache": False}).compute()
    assert sorted(back["x"]) == list(range(600)) and set(back["s"]) == {f"row-{i}" for i in range(600)}


def _worker_write(options, path, nbytes, kill_after):
    """A worker writing through cdc:// with deferred-commit options; with `kill_after`,
    SIGKILLed that many seconds into its write (mid-upload)."""
    import threading

    import fsspec

    fs = fsspec.filesystem("cdc", skip_instance_cache=True, **options)
    if kill_after:
        threading.Timer(kill_after, os.kill, (os.getpid(), 9)).start()
    fs.pipe(path, os.urandom(nbytes))
    return path


def test_worker_killed_mid_upload_lands_nothing_then_rerun_lands(tmp_path, server):
    """(concurrent.futures workers: dask's local process scheduler can hang for good when
    a worker is SIGKILLed, waiting for a result that never comes.)"""
    dask = pytest.importorskip("dask")
    import dask.dataframe as dd

    with Store(server.url, cache=False) as s:
        (tmp_path / "seed").write_bytes(b"seed")
        s.push(str(tmp_path / "seed"), "cdc://ds/seed")
        before = s.log("ds")
        t0 = time.monotonic()
        with pytest.raises(BrokenProcessPool):  # the killed worker breaks the job
            with deferred_commit("cdc://ds@main/", server.url) as dc, _pool(2) as pool:
                futs = [pool.submit(_worker_write, dc.storage_options, f"ds/out/p{i}.bin", 4 << 20,
                                    0.05 if i == 1 else 0) for i in range(3)]
                [f.result(timeout=30) for f in futs]
        assert time.monotonic() - t0 < 30
        assert s.log("ds") == before and dc.result is None  # the branch never moved
        assert [e["name"] for e in s.ls("cdc://ds/")] == ["seed"]
        assert list(s.branches("ds")) == ["main"]
        with deferred_commit("cdc://ds@main/", server.url) as dc:  # run again: it lands, once
            with dask.config.set(scheduler="processes", num_workers=2):
                _frame().to_parquet("cdc://ds/out", storage_options=dc.storage_options,
                                    write_metadata_file=False)
        assert len(s.log("ds")) == len(before) + 1
    back = dd.read_parquet("cdc://ds/out", storage_options={"store": server.url, "cache": False}).compute()
    assert sorted(back["x"]) == list(range(600))


def test_deferred_commit_with_nothing_written_and_a_new_repo(tmp_path, store):
    import fsspec

    (tmp_path / "seed").write_bytes(b"seed")
    store.push(str(tmp_path / "seed"), "cdc://ds/seed")
    with deferred_commit("cdc://ds@main/", store.location) as dc:
        pass
    assert dc.result is None and len(store.log("ds")) == 1 and list(store.branches("ds")) == ["main"]
    with deferred_commit("cdc://fresh@main/", store.location) as dc:
        fs = fsspec.filesystem("cdc", skip_instance_cache=True, **dc.storage_options)
        fs.pipe("fresh/a.txt", b"a")
        fs.pipe("fresh/b.txt", b"b")
        assert "fresh" not in store.repos()
    assert store.branches("fresh") == {"main": dc.result.commit}
    assert store.cat("cdc://fresh/b.txt") == b"b" and len(store.log("fresh")) == 1

"""Issue 32 item 2: a bucket store's index on a machine is bounded (CDCSTORE_INDEX_MAX_CHUNKS).
Past the bound the least recently used packs' rows are dropped (remembered as evicted); their
chunks count as unknown, never as absent: a read indexes the pack again, a push finds a large
file's pack again by its anchor, and gc keeps a pack whose footer it has not read. moto is the
bucket; cache dirs stand for machines."""
import os
import secrets

import pytest

from cdcstore import Store
from cdcstore.core.errors import CdcError
from cdcstore.storage import maintenance
from cdcstore.storage.repository import open_repository
from conftest import S3_BUCKET


@pytest.fixture
def bucket(s3_env, tmp_path, monkeypatch):
    url = f"s3://{S3_BUCKET}/bounded-{secrets.token_hex(4)}"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "writer"))
    Store.init(url).close()
    return url


def _rows(repo) -> int:
    return repo.index.conn.execute("SELECT count(*) FROM chunks").fetchone()[0]


def _push_batches(url, tmp_path, batches: int, per: int = 10):
    files = {}
    with Store(url) as s:
        for b in range(batches):
            folder = tmp_path / f"batch{b}"
            folder.mkdir()
            for i in range(per):
                data = os.urandom(500 + i)
                (folder / f"f{i}.bin").write_bytes(data)
                files[f"batch{b}/f{i}.bin"] = data
            s.push([str(folder)], f"cdc://ds/batch{b}/")
    return files


def test_the_index_stays_within_its_bound_and_every_file_still_reads(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("CDCSTORE_INDEX_MAX_CHUNKS", "25")
    files = _push_batches(bucket, tmp_path, 8)  # 8 packs of 10 chunks
    repo = open_repository(bucket)
    assert _rows(repo) <= 25 and len(repo.index.evicted()) >= 5
    with Store(bucket) as s:  # this machine reads them all back: evicted packs are indexed again as needed
        assert {p: s.cat(f"cdc://ds/{p}") for p in files} == files
    assert _rows(open_repository(bucket)) <= 25 + 10  # bounded again after each miss (one pack kept in use)


def test_a_large_file_is_found_again_by_its_anchor_after_eviction(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("CDCSTORE_INDEX_MAX_CHUNKS", "40")
    big = os.urandom(3 << 20)
    (tmp_path / "big.bin").write_bytes(big)
    with Store(bucket) as s:
        s.push([str(tmp_path / "big.bin")], "cdc://ds/big.bin")
    _push_batches(bucket, tmp_path, 6)  # pushes the big file's pack out of the index
    repo = open_repository(bucket)
    assert any(repo.index.evicted())
    with Store(bucket) as s:
        again = s.push([str(tmp_path / "big.bin")], "cdc://ds/copy.bin")
        assert again.new_bytes == 0  # its first chunk is an anchor: the pack is found and indexed again
        assert s.cat("cdc://ds/copy.bin") == big


def test_gc_never_deletes_a_pack_a_bounded_index_let_go(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("CDCSTORE_INDEX_MAX_CHUNKS", "25")
    files = _push_batches(bucket, tmp_path, 5)
    with Store(bucket) as s:
        out = s.gc(grace=0)
        assert out["deleted"] and out["delete_packs"] == 0
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other-machine"))
    with Store(bucket) as s:
        assert {p: s.cat(f"cdc://ds/{p}") for p in files} == files
        assert s.check(read_data=True)["problems"] == []


def test_a_pack_evicted_by_another_process_during_the_mark_is_kept(bucket, tmp_path, monkeypatch):
    """The race: gc indexes every pack, then another process on the machine evicts rows
    before gc plans. A pack without rows is unknown, never dead."""
    files = _push_batches(bucket, tmp_path, 3)
    repo = open_repository(bucket)
    repo.packs.recover(whole=True)
    evicted = repo.index.evict(0, {})
    assert len(evicted) == 3 and _rows(repo) == 0
    repo.recover = lambda forget_gone=True, whole=False: 0  # the rows stay out during this plan
    plan = maintenance.plan(repo, grace=0)
    assert plan.packs == [] and plan.repack == []
    with Store(bucket) as s:
        assert {p: s.cat(f"cdc://ds/{p}") for p in files} == files


def test_a_bad_bound_is_a_clear_error(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("CDCSTORE_INDEX_MAX_CHUNKS", "lots")
    (tmp_path / "a.bin").write_bytes(b"x" * 100)
    with pytest.raises(CdcError, match="CDCSTORE_INDEX_MAX_CHUNKS='lots'.*whole number"):
        with Store(bucket) as s:
            s.push([str(tmp_path / "a.bin")], "cdc://ds/a.bin")


def test_a_push_beyond_the_bound_keeps_its_own_packs_until_it_has_landed(bucket, tmp_path, monkeypatch):
    """The bound applies between pushes: a push's own packs stay indexed until its manifests'
    location records are written (every file of the push gets one) and its commit is checked."""
    import boto3

    from cdcstore.core import bundle

    monkeypatch.setenv("CDCSTORE_INDEX_MAX_CHUNKS", "5")
    _push_batches(bucket, tmp_path, 2, per=3)  # something to evict first
    folder = tmp_path / "big-push"
    folder.mkdir()
    for i in range(40):
        (folder / f"g{i}.bin").write_bytes(os.urandom(700 + i))
    with Store(bucket) as s:
        s.push([str(folder)], "cdc://ds/big/")
    s3 = boto3.client("s3")
    prefix = bucket.split("/", 3)[3]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=S3_BUCKET, Prefix=f"{prefix}/bundles/")["Contents"]]
    records = {}
    for k in keys:
        records.update(bundle.decode(s3.get_object(Bucket=S3_BUCKET, Key=k)["Body"].read()))
    assert len(records) == 46 and all(r for _, r in records.values())  # every manifest has its record
    repo = open_repository(bucket)
    repo.begin_push()  # the next push bounds the index again
    assert _rows(repo) <= 5

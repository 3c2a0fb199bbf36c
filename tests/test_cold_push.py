"""Issue 42: a push from a new machine (a CI runner) downloads no chunk bytes it does not upload
when a landed commit vouches for them (trust by history, docs/protocol.md).

Before, a one-file edit of a folder of Parquet files pushed from a fresh cache read every chunk it
deduplicated against from the bucket to check it against its id (trust by origin): 1.67 GB down to
push one edited 40 MB file into 1.94 GB. A chunk the branch's landed commit reaches at the pushed
path was verified or uploaded when that commit landed, so a genuine copy exists; only chunks known
solely from a pack nobody's landed commit reaches are still read (the co-tenant forgery of issue 30,
tests/test_trust_by_origin.py). moto behind a counting proxy; two cache dirs are two machines;
real-shaped Parquet written by plain pyarrow.
"""
import os
import secrets

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.storage import bundles as bundles_module
from conftest import S3_BUCKET
from test_trust_by_origin import _forge

FILES, ROWS = 4, 120_000


def _table(seed: int, rows: int = ROWS) -> pa.Table:
    import random
    rnd = random.Random(seed)
    return pa.table({
        "id": pa.array(range(seed * 10_000_000, seed * 10_000_000 + rows), pa.int64()),
        "x": pa.array([rnd.random() for _ in range(rows)], pa.float64()),
        "tag": pa.array([f"t{rnd.randrange(10_000):05d}-{rnd.randrange(1 << 30):x}" for _ in range(rows)]),
    })


@pytest.fixture
def lake(counted_bucket, tmp_path, monkeypatch):
    """A bucket store (behind the counting proxy) holding FILES Parquet files pushed by machine A;
    down: the bytes of every answer the proxy passed on since the last `clear`."""
    _, seen = counted_bucket
    src = tmp_path / "src"
    src.mkdir()
    for i in range(FILES):
        pq.write_table(_table(i), src / f"part-{i}.parquet")
    url = f"s3://{S3_BUCKET}/cold-{secrets.token_hex(4)}"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-a"))
    with Store.init(url) as s:
        s.push([str(src)], "cdc://lake/data/", message="v1")
    return url, src, seen, seen.down


def _edit(src, i: int = 1) -> None:
    """1% of one file's rows changed in one place, written again by plain pyarrow."""
    t = _table(i)
    x = t.column("x").to_pylist()
    for r in range(ROWS // 2, ROWS // 2 + ROWS // 100):
        x[r] = -1.0
    pq.write_table(t.set_column(1, "x", pa.array(x, pa.float64())), src / f"part-{i}.parquet")


def _stored(url) -> int:
    import boto3
    s3 = boto3.client("s3")
    prefix = url.split(f"{S3_BUCKET}/", 1)[1] + "/packs/"
    return sum(o["Size"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=prefix)
               for o in page.get("Contents", []))


def test_an_edit_pushed_from_a_new_machine_downloads_no_chunk_it_dedups_against(lake, tmp_path, monkeypatch):
    url, src, seen, down = lake
    packs = _stored(url)
    _edit(src)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))  # a new machine: a CI runner
    seen.clear()
    with Store(url) as s:
        r = s.push([str(src)], "cdc://lake/data/", message="v2")
    assert r.new_bytes < r.bytes * 0.25 / FILES * 2, r  # it deduplicated: about the edit is new
    pack_reads = sum(1 for m, p in seen if m == "GET" and "/packs/" in p)
    print(f"cold edit push: {len(seen)} requests, {sum(down)} B down, store {packs} B, new {r.new_bytes} of {r.bytes}")
    # footers of the packs its anchors named, never their chunks: far under 1% of the store
    assert sum(down) <= max(packs // 100, 256 << 10), (sum(down), packs, pack_reads)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-c"))
    with Store(url) as s:  # what it acknowledged reads back, verified, on a third machine
        for i in range(FILES):
            assert s.cat(f"cdc://lake/data/part-{i}.parquet") == (src / f"part-{i}.parquet").read_bytes()


def test_a_chunk_no_landed_commit_reaches_is_still_read_and_a_forgery_uploaded_again(lake, tmp_path, monkeypatch):
    """History vouches only for what the branch's commit reaches at the pushed path: a new file whose
    chunks a co-tenant forged (no landed commit reaches them) is checked and uploaded as before."""
    url, src, seen, down = lake
    prefix = url.split(f"{S3_BUCKET}/", 1)[1]
    new = src / "new.bin"
    new.write_bytes(secrets.token_bytes(3 << 20))
    forged = _forge(prefix, str(new))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))
    with Store(url) as s:
        r = s.push([str(src)], "cdc://lake/data/", message="v2")
        assert r.new_bytes >= new.stat().st_size  # every forged chunk failed its id: uploaded
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-c"))
    with Store(url) as s:
        assert s.cat("cdc://lake/data/new.bin") == new.read_bytes()
        problems = s.check(read_data=True)["problems"]
        assert any(forged in p for p in problems), problems


def test_a_forgery_of_chunks_history_vouches_for_never_reaches_a_reader(lake, tmp_path, monkeypatch):
    """A co-tenant forges a pack of chunks the landed commit reaches (a genuine copy exists): the
    new machine's push deduplicates against them by id without reading them; every reader still
    gets only verified bytes, from the genuine copy."""
    url, src, seen, down = lake
    prefix = url.split(f"{S3_BUCKET}/", 1)[1]
    _forge(prefix, str(src / "part-2.parquet"))
    _edit(src, 2)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))
    with Store(url) as s:
        s.push([str(src)], "cdc://lake/data/", message="v2")
    for machine in ("machine-b", "machine-c"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / machine))
        with Store(url) as s:
            for _ in range(2):
                assert s.cat("cdc://lake/data/part-2.parquet") == (src / "part-2.parquet").read_bytes()


def test_a_cold_edit_push_of_many_small_files_reads_each_bundle_once(counted_bucket, tmp_path, monkeypatch):
    """History vouches for small files through their manifests, which lie in bundles grouped by
    name, not by path: read file by file they missed a 16-bundle memo (20,000 files: 3,994 bundle
    GETs, 906 MB down). A push reads each bundle at most once."""
    _, seen = counted_bucket
    src = tmp_path / "src"
    for d in range(30):
        (src / f"d{d:02d}").mkdir(parents=True)
        for f in range(80):
            (src / f"d{d:02d}" / f"f{f:02d}.bin").write_bytes(secrets.token_bytes(700 + f))
    url = f"s3://{S3_BUCKET}/small-{secrets.token_hex(4)}"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-a"))
    with Store.init(url) as s:
        s.push([str(src)], "cdc://ds/", message="v1")
    bundles = {p for m, p in seen if m == "PUT" and "/bundles/" in p}
    (src / "d07" / "f03.bin").write_bytes(b"edited")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))
    monkeypatch.setattr(bundles_module, "KEPT_BUNDLES", 1)  # as 16 is to the bundles of 20,000 files
    seen.clear()
    with Store(url) as s:
        r = s.push([str(src)], "cdc://ds/", message="v2")
    gets = [p for m, p in seen if m == "GET" and "/bundles/" in p]
    assert len(gets) <= len(bundles) and len(set(gets)) == len(gets), (len(gets), len(bundles))
    assert r.new_bytes <= 4096, r.new_bytes  # the edit, not the folder
    assert sum(seen.down) < 2 << 20, sum(seen.down)
    with Store(url) as s:
        assert s.cat("cdc://ds/d07/f03.bin") == b"edited"


def test_an_unchanged_folder_pushed_from_a_new_machine_uploads_nothing(lake, tmp_path, monkeypatch):
    """A chunk the landed commit holds but no dedup anchor leads a new machine to (anchors sample 1
    chunk in 64) was uploaded again. The landed manifests' location records name its pack, whose
    footer is indexed: nothing of an unchanged folder is sent again."""
    url, src, seen, down = lake
    _edit(src)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))
    with Store(url) as s:  # the edit lands, its new chunks in a small pack of their own
        assert s.push([str(src)], "cdc://lake/data/", message="v2").new_bytes > 0
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-c"))
    seen.clear()
    with Store(url) as s:
        r = s.push([str(src)], "cdc://lake/data/", message="same")
    assert r.new_bytes == 0 and not r.changed, r
    assert not any(m == "PUT" and "/packs/" in p for m, p in seen)


def _small_files(src, folders: int, per: int, wide: int) -> None:
    """The layout of issue 42's second run: many small folders and one wide one."""
    for d in range(folders):
        (src / f"d{d:03d}").mkdir(parents=True)
        for f in range(per):
            (src / f"d{d:03d}" / f"f{f:02d}.bin").write_bytes(secrets.token_bytes(300 + f))
    (src / "wide").mkdir()
    for f in range(wide):
        (src / "wide" / f"w{f:05d}.bin").write_bytes(secrets.token_bytes(200 + f % 64))


@pytest.mark.parametrize("edit", ["d013/f05.bin", "wide/w00321.bin"])
def test_a_new_machine_reads_only_the_trees_on_the_changed_path(counted_bucket, tmp_path, monkeypatch, edit):
    """A one-file edit pushed from a new machine compares content ids (tree format 4/5) and reads
    the trees on the edited path only. Before: every tree of the folder (20,000 files: 1,882 tree
    GETs, 2,091 requests, 9.84 MB down). 60 folders of 20 files and a folder of 1,800: 3,000 files,
    ~200 trees."""
    _, seen = counted_bucket
    src = tmp_path / "src"
    _small_files(src, 60, 20, 1800)
    url = f"s3://{S3_BUCKET}/paths-{secrets.token_hex(4)}"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-a"))
    with Store.init(url) as s:
        s.push([str(src)], "cdc://ds/", message="v1")
    trees = {p for m, p in seen if m == "PUT" and "/trees/" in p}
    (src / edit).write_bytes(b"edited")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))
    seen.clear()
    with Store(url) as s:
        r = s.push([str(src)], "cdc://ds/", message="v2")
    tree_gets = [p for m, p in seen if m == "GET" and "/trees/" in p]
    print(f"{edit}: {len(seen)} requests, {len(tree_gets)} tree GETs of {len(trees)} trees, "
          f"{sum(seen.down)} bytes down")
    assert r.changed and r.new_bytes <= 4096, r
    assert len(tree_gets) <= 8, tree_gets  # the root, the folder (split nodes on the name's digits), a page
    assert len(seen) <= 60 and sum(seen.down) < 256 << 10, (len(seen), sum(seen.down))
    with Store(url) as s:
        assert s.cat(f"cdc://ds/{edit}") == b"edited"
        assert len(s.ls("cdc://ds/wide/")) == 1800 and len(s.ls("cdc://ds/d013/")) == 20


def test_a_new_machine_mirror_push_removes_what_it_lacks_reading_the_changed_paths(counted_bucket, tmp_path,
                                                                                    monkeypatch):
    """A mirror push (files the folder no longer has are removed) from a new machine finds the
    removed files by the same content descent: a deleted file and a deleted folder go, the rest
    is untouched and unread."""
    _, seen = counted_bucket
    src = tmp_path / "src"
    _small_files(src, 30, 20, 300)
    url = f"s3://{S3_BUCKET}/mirror-{secrets.token_hex(4)}"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-a"))
    with Store.init(url) as s:
        s.push([str(src)], "cdc://ds/", message="v1")
        s.push([str(src / "d000")], "cdc://ds/outside/", message="a folder the local side lacks")
    (src / "wide" / "w00007.bin").unlink()
    for f in (src / "d004").iterdir():
        f.unlink()
    (src / "d004").rmdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))
    seen.clear()
    with Store(url) as s:
        r = s.push([str(src) + "/"], "cdc://ds/", message="v2", delete=True)
    tree_gets = [p for m, p in seen if m == "GET" and "/trees/" in p]
    assert r.changed and len(tree_gets) <= 12, tree_gets
    with Store(url) as s:
        wide = {e["name"].rsplit("/", 1)[-1] for e in s.ls("cdc://ds/wide/")}
        assert "w00007.bin" not in wide and len(wide) == 299
        top = {e["name"].rsplit("/", 1)[-1] for e in s.ls("cdc://ds/")}
        assert "d004" not in top and "d005" in top and "outside" not in top  # the mirror is of ds/ itself
        assert len(s.ls("cdc://ds/d005/")) == 20


OLD_SERVER = """
import sys
from cdcstore.core import treeobj
treeobj.READ_VERSIONS = (treeobj.TREE_VERSION, treeobj.SPLIT_VERSION)  # a server from before content ids
from cdcstore.cli import main
sys.argv = ["cdcstore", "serve", "--store", sys.argv[1], "--port", sys.argv[2]]
main()
"""


def test_a_push_to_a_server_before_content_ids_still_lands(tmp_path):
    """A server from before tree formats 4 and 5 refuses our trees (400 "has tree format 4"): the
    client then sends the commit's file map (format 1), as for a server before protocol 1.5, and
    the server builds trees of its own format. A real server process, patched to read 2 and 3 only."""
    import subprocess
    import sys
    import time
    import urllib.request
    from cdcstore.storage.repository import LocalStore
    from cdcstore.testing import free_port
    root, port = str(tmp_path / "srv"), free_port()
    LocalStore.init(root)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.Popen([sys.executable, "-c", OLD_SERVER, root, str(port)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        src = tmp_path / "src"
        _small_files(src, 3, 5, 60)  # folders under the root: the root is a format 4 page
        with Store(f"http://127.0.0.1:{port}", cache=False) as s:
            s.push([str(src)], "cdc://ds/", message="v1")
            (src / "d001" / "f02.bin").write_bytes(b"edited")
            s.push([str(src)], "cdc://ds/", message="v2")
            assert s.cat("cdc://ds/d001/f02.bin") == b"edited" and len(s.ls("cdc://ds/wide/")) == 60
            assert s.backend.uncached().legacy_trees  # it fell back to file maps (the server built the trees)
        with Store(root) as local:
            assert [c["message"] for c in local.log("ds")] == ["v2", "v1"]
    finally:
        p.terminate()
        p.wait(10)

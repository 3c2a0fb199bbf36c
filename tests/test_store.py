"""The local store end to end through the Python API: real files, real sqlite."""
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cdcstore import (ConflictError, CorruptionError, InvalidAddressError, NotAStoreError, PathNotFoundError,
                      RepoNotFoundError, RevisionNotFoundError, Store)
from cdcstore.engine.ingest import IngestOptions
from cdcstore.storage.repository import LocalStore
from conftest import golden_input


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "data"
    write(str(root / "a.bin"), golden_input(3_000_000))
    write(str(root / "sub" / "b.bin"), golden_input(500_000)[::-1])
    write(str(root / "sub" / "deeper" / "empty.txt"), b"")
    write(str(root / "small.txt"), b"hello\n")
    return root


def test_push_pull_round_trip(store, dataset, tmp_path):
    r = store.push([str(dataset)], "cdc://ds/", message="v1")
    assert r.changed and r.files == 4 and r.bytes == 3_500_006
    assert r.new_bytes == r.bytes  # nothing to dedup against (the inputs share no chunks)
    assert 0 < r.stored_bytes <= r.bytes + 4096
    out = tmp_path / "out"
    p = store.pull("cdc://ds/", str(out))
    assert p.files == 4 and p.bytes == r.bytes
    for rel in ("a.bin", "sub/b.bin", "sub/deeper/empty.txt", "small.txt"):
        assert (out / rel).read_bytes() == (dataset / rel).read_bytes()
    again = store.pull("cdc://ds/", str(out))
    assert again.written_bytes == 0 and again.written_files == 0  # identical local files are left alone
    assert store.cat("cdc://ds/small.txt") == b"hello\n"
    assert [e["name"] for e in store.ls("cdc://ds/")] == ["a.bin", "small.txt", "sub"]
    assert store.ls("cdc://ds/sub")[0] == {"name": "sub/b.bin", "type": "file", "size": 500_000}
    assert {e["name"] for e in store.ls("cdc://ds/", recursive=True)} == {
        "a.bin", "small.txt", "sub/b.bin", "sub/deeper/empty.txt"}


def test_dedup_across_repos_versions_and_no_empty_commits(store, dataset):
    v1 = store.push([str(dataset)], "cdc://ds/")
    same = store.push([str(dataset)], "cdc://ds/")
    assert not same.changed and same.commit == v1.commit and same.new_bytes == 0
    other = store.push([str(dataset)], "cdc://copy/")
    assert other.changed and other.new_bytes == 0 and other.stored_bytes == 0
    # edit in the middle of the big file: only a few chunks are new
    data = bytearray(golden_input(3_000_000))
    data[1_500_000:1_500_010] = b"0123456789"
    write(str(dataset / "a.bin"), bytes(data))
    v2 = store.push([str(dataset)], "cdc://ds/", message="edit")
    assert v2.changed and v2.commit != v1.commit
    assert 0 < v2.new_bytes <= 3 * 256 * 1024
    assert store.cat("cdc://ds/a.bin") == bytes(data)
    assert store.cat(f"cdc://ds@{v1.commit}/a.bin") == golden_input(3_000_000)
    log = store.log("ds")
    assert [e["commit"] for e in log] == [v2.commit, v1.commit]
    assert log[0]["message"] == "edit" and log[1]["parent"] is None
    st = store.stats(f"cdc://ds@{v2.commit[:6]}/")
    assert st["new_bytes"] == v2.new_bytes and st["commit"] == v2.commit


def test_push_single_file_destinations_and_delete(store, dataset):
    store.push([str(dataset / "small.txt")], "cdc://r/docs/readme.txt")
    store.push([str(dataset / "small.txt")], "cdc://r/docs/")
    store.push([str(dataset / "small.txt"), str(dataset / "sub")], "cdc://r/multi")
    names = {e["name"] for e in store.ls("cdc://r/", recursive=True)}
    assert names == {"docs/readme.txt", "docs/small.txt", "multi/small.txt", "multi/sub/b.bin",
                     "multi/sub/deeper/empty.txt"}
    store.push([str(dataset / "sub")], "cdc://r/multi", delete=True)
    names = {e["name"] for e in store.ls("cdc://r/", recursive=True)}
    assert names == {"docs/readme.txt", "docs/small.txt", "multi/b.bin", "multi/deeper/empty.txt"}
    with pytest.raises(InvalidAddressError, match="both a file and a folder"):
        store.push([str(dataset / "small.txt")], "cdc://r/docs/readme.txt/x")


def test_branches_and_revisions(store, dataset):
    v1 = store.push([str(dataset / "small.txt")], "cdc://r/f.txt")
    v2 = store.push([str(dataset / "a.bin")], "cdc://r@dev/a.bin")
    assert store.branches("r") == {"main": v1.commit, "dev": v2.commit}
    assert {e["name"] for e in store.ls("cdc://r@dev/")} == {"f.txt", "a.bin"}  # branched from main
    assert {e["name"] for e in store.ls(f"cdc://r@{v1.commit[:4]}/")} == {"f.txt"}
    with pytest.raises(RevisionNotFoundError, match="no branch or tag 'nope'"):
        store.ls("cdc://r@nope/")
    with pytest.raises(RepoNotFoundError, match="no repo 'missing'"):
        store.ls("cdc://missing/")
    with pytest.raises(PathNotFoundError, match="no file or folder 'zzz'"):
        store.open("cdc://r/zzz")
    with pytest.raises(IsADirectoryError):
        store.open("cdc://r/")
    with pytest.raises(InvalidAddressError):
        store.ls("cdc://../")
    with pytest.raises(PathNotFoundError, match="does not exist"):
        store.push(["/no/such/file"], "cdc://r/")


def test_conflict_leaves_nothing_half_done_and_retry_succeeds(store, dataset, tmp_path):
    other = tmp_path / "other.txt"
    other.write_bytes(b"racing writer")
    raced = []

    def race(_n):
        if not raced:
            raced.append(store.push([str(other)], "cdc://r/a.bin"))  # the same path

    base = store.push([str(dataset / "small.txt")], "cdc://r/small.txt")
    with pytest.raises(ConflictError, match="a.bin"):
        store.push([str(dataset / "a.bin")], "cdc://r/a.bin", progress=race)
    head = store.branches("r")["main"]
    assert head == raced[0].commit and store.log("r")[1]["commit"] == base.commit
    assert store.cat("cdc://r/a.bin") == b"racing writer"
    retry = store.push([str(dataset / "a.bin")], "cdc://r/a.bin")
    assert retry.new_bytes == 0  # every chunk of the lost push was kept and reused
    assert {e["name"] for e in store.ls("cdc://r/")} == {"small.txt", "a.bin"}


def test_failed_push_changes_nothing(store, dataset):
    v1 = store.push([str(dataset / "small.txt")], "cdc://r/small.txt")

    def boom(_n):
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        store.push([str(dataset)], "cdc://r/", progress=boom)
    assert store.branches("r") == {"main": v1.commit}
    assert len(store.log("r")) == 1


def test_index_rebuild_and_recover(store, dataset):
    store.push([str(dataset)], "cdc://ds/")
    idx = LocalStore(store.location).index
    before = idx.totals()
    idx.clear()  # the index is a cache: a read that misses in it looks at the pack listing
    assert store.cat("cdc://ds/a.bin") == golden_input(3_000_000)
    idx.clear()
    r = store.rebuild_index()
    assert r["chunks"] == before["chunks"] and r["bad_packs"] == []
    assert store.cat("cdc://ds/a.bin") == golden_input(3_000_000)
    # a pack that is durable but was never indexed is picked up by the next push
    idx.clear()
    again = store.push([str(dataset)], "cdc://ds2/")
    assert again.new_bytes == 0


def pack_files(store):
    return sorted(glob.glob(os.path.join(store.location, "packs", "*", "*.pack")))


def test_flipped_byte_in_pack_is_never_returned(store, dataset):
    store.push([str(dataset / "a.bin")], "cdc://ds/a.bin")
    [pack] = pack_files(store)
    with open(pack, "r+b") as f:
        f.seek(200_000)
        b = f.read(1)
        f.seek(200_000)
        f.write(bytes([b[0] ^ 0x40]))
    s2 = Store(store.location)
    with pytest.raises(CorruptionError, match="does not match its id"):
        s2.cat("cdc://ds/a.bin")
    report = s2.check(read_data=True)
    assert any("does not match its name" in p for p in report["problems"])


def test_truncated_pack(store, dataset):
    store.push([str(dataset / "a.bin")], "cdc://ds/a.bin")
    [pack] = pack_files(store)
    with open(pack, "r+b") as f:
        f.truncate(1_000_000)
    s2 = Store(store.location)
    with pytest.raises(CorruptionError):
        s2.cat("cdc://ds/a.bin")
    assert s2.rebuild_index()["bad_packs"]


def test_not_a_store(tmp_path):
    with pytest.raises(NotAStoreError, match="cdcstore init"):
        Store(str(tmp_path / "nothing"))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file").write_text("x")
    with pytest.raises(NotAStoreError, match="not a cdcstore store"):
        Store(str(tmp_path / "junk"))
    with pytest.raises(NotAStoreError, match="not empty"):
        Store.init(str(tmp_path / "junk"))


def test_default_store_is_created_under_xdg(tmp_path):
    s = Store()
    assert s.location.startswith(str(tmp_path / "xdg-data"))
    assert os.path.exists(os.path.join(s.location, "cdcstore.json"))


KILL_SCRIPT = textwrap.dedent("""
    import sys
    from cdcstore import Store
    from cdcstore.engine.ingest import IngestOptions
    s = Store(sys.argv[1])
    s.push([sys.argv[2]], "cdc://big/big.bin",
           options=IngestOptions(max_pack_bytes=1 << 20, max_inflight_bytes=1 << 20, block_size=1 << 20))
""")


def test_sigkill_mid_push_leaves_store_consistent_and_chunks_reused(store, tmp_path):
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        for i in range(60):
            f.write(os.urandom(1 << 20))
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, store.location, str(big)])
    deadline = time.time() + 60
    while len(pack_files(store)) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(pack_files(store)) >= 3, "the push finished or stalled before it could be killed"
    s2 = Store(store.location)
    with pytest.raises(RepoNotFoundError):
        s2.ls("cdc://big/")  # nothing committed
    assert s2.check()["problems"] == []
    s2.recover()
    durable = LocalStore(s2.location).index.totals()["chunk_raw_bytes"]
    assert durable > 0
    r = s2.push([str(big)], "cdc://big/big.bin", options=IngestOptions(max_pack_bytes=1 << 20))
    assert r.new_bytes == big.stat().st_size - durable  # every durable chunk was reused
    assert s2.cat("cdc://big/big.bin") == big.read_bytes()
    assert os.listdir(os.path.join(store.location, "tmp")) == []  # the dead writer's temp files are gone


def test_two_processes_push_at_once(store, tmp_path):
    files = []
    for i in range(2):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(os.urandom(4 << 20))
        files.append(p)
    script = "import sys; from cdcstore import Store; Store(sys.argv[1]).push([sys.argv[2]], sys.argv[3])"
    procs = [subprocess.Popen([sys.executable, "-c", script, store.location, str(f), f"cdc://r{i}/f.bin"])
             for i, f in enumerate(files)]
    assert [p.wait() for p in procs] == [0, 0]
    for i, f in enumerate(files):
        assert store.cat(f"cdc://r{i}/f.bin") == f.read_bytes()

"""Pushes that touch only what changed: the push stat cache (as git's index) skips reading
files whose stat matches their last push; a cached entry is trusted only while the store holds
its manifest; racy files (modified in the second they were seen) are read again."""
import json
import os
import time

import pytest
from click.testing import CliRunner

from cdcstore import Store
from cdcstore.cli import cli
from cdcstore.core.commit import FileEntry
from cdcstore.engine import commits as commits_engine
from cdcstore.engine import ingest as push_engine
from cdcstore.storage.statcache import Seen, StatCache


def _folder(root, n, size=2048):
    root.mkdir()
    for i in range(n):
        (root / f"f{i:04d}.bin").write_bytes(os.urandom(size))
    time.sleep(1.05)  # the files' mtime and ctime fall in an earlier second than the push: not racy
    return root


@pytest.fixture
def reads(monkeypatch):
    """The local files a push reads (Ingest.add_file, and the content comparison's manifest_of), by name."""
    seen = []
    real = push_engine.Ingest.add_file

    def add_file(self, path, *args, **kw):  # whatever else it takes (`prehashed`) passed on
        seen.append(os.path.basename(path))
        return real(self, path, *args, **kw)

    monkeypatch.setattr(push_engine.Ingest, "add_file", add_file)
    real_of = commits_engine.manifest_of

    def manifest_of(path, opts):  # a push from a machine the stat cache knows nothing of compares first
        seen.append(os.path.basename(path))
        return real_of(path, opts)

    monkeypatch.setattr(commits_engine, "manifest_of", manifest_of)
    return seen


def _edit(path, data=None):
    with open(path, "r+b") as f:
        f.write(data or os.urandom(32))


def test_one_file_edit_through_a_server_reads_one_file_in_few_requests(tmp_path, server, reads):
    """2,000 files, one edited: one file read, requests < 20 (main: ~6,000 on a bucket; the
    file pushed alone takes 8 here). Bound: health, session open/close, branches, commit,
    presence, pack, manifests, commit POST: a constant, whatever the folder's size."""
    src = _folder(tmp_path / "src", 2000, 1024)
    with Store(server.url, cache=False) as s:
        s.push(str(src), "cdc://ds/data/")
        assert len(reads) == 2000
        reads.clear()
        _edit(src / "f0007.bin")
        c0 = s.counters()["requests"]
        r = s.push(str(src), "cdc://ds/data/")
        requests = s.counters()["requests"] - c0
        assert reads == ["f0007.bin"] and r.unread_files == 1999 and r.files == 2000
        assert requests < 20, requests
        assert s.cat("cdc://ds/data/f0007.bin") == (src / "f0007.bin").read_bytes()
        assert len(s.ls("cdc://ds/data/")) == 2000 and len(s.log("ds")) == 2
        reads.clear()
        r = s.push(str(src), "cdc://ds/data/", stat_cache=False)  # reads everything; nothing changed
        assert len(reads) == 2000 and not r.changed and r.unread_files == 0


def test_racy_and_forced_back_edits_are_read_again(tmp_path, store, reads):
    """A file edited in the same second it was pushed, with its size kept and its mtime forced
    back, is read again: its recorded stat is racy (mtime in the second it was seen), and its
    ctime moved anyway. The same edit on a file pushed long after it was written is caught by
    the ctime (os.utime cannot set it back)."""
    d = tmp_path / "d"
    d.mkdir()
    f = d / "racy.bin"
    f.write_bytes(b"a" * 1000)
    store.push(str(d), "cdc://ds/")  # within the second the file was written
    st = os.stat(f)
    _edit(f, b"b" * 10)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    reads.clear()
    store.push(str(d), "cdc://ds/")
    assert reads == ["racy.bin"] and store.cat("cdc://ds/racy.bin") == f.read_bytes()

    old = d / "old.bin"
    old.write_bytes(b"c" * 1000)
    time.sleep(1.05)
    store.push(str(d), "cdc://ds/")
    reads.clear()
    store.push(str(d), "cdc://ds/")
    assert reads == [] or reads == ["racy.bin"]  # old.bin is vouched for by its stat
    st = os.stat(old)
    _edit(old, b"d" * 10)
    os.utime(old, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as they were
    reads.clear()
    store.push(str(d), "cdc://ds/")
    assert "old.bin" in reads and store.cat("cdc://ds/old.bin") == old.read_bytes()


def test_racy_rule_unit(tmp_path):
    second = 1_700_000_000_000_000_000
    assert Seen(1, second + 5, 1, second - 10**9, second + 900_000_000).racy()  # mtime in the seen second
    assert not Seen(1, second - 1, 1, second - 1, second + 900_000_000).racy()
    c = StatCache(str(tmp_path / "sc.sqlite"))
    e = FileEntry("a" * 32, 1)
    c.record("S", [("/x", Seen(1, second - 1, 7, second - 1, second + 1), e),
                   ("/racy", Seen(1, second + 2, 7, second - 1, second + 1), e),
                   ("/short", Seen(2, second - 1, 7, second - 1, second + 1), e)])  # size != entry: never kept
    now = {p: Seen(s, second - 1 if p != "/racy" else second + 2, 7, second - 1, second + 10**10)
           for p, s in (("/x", 1), ("/racy", 1), ("/short", 2))}
    assert c.lookup("S", now) == {"/x": e}
    assert c.lookup("other store", now) == {}
    assert c.lookup("S", {"/x": Seen(1, second - 1, 8, second - 1, 0)}) == {}  # another inode


def test_a_cached_entry_whose_manifest_is_gone_is_not_trusted(tmp_path, store, reads):
    """The cache is never the truth: after the repo is deleted and gc freed its manifests,
    the files are read again and the push is whole."""
    src = _folder(tmp_path / "src", 5)
    store.push(str(src), "cdc://ds/")
    store.delete_repo("ds")
    assert store.gc(grace=0)["delete_manifests"] == 5
    reads.clear()
    r = store.push(str(src), "cdc://ds/")
    assert len(reads) == 5 and r.unread_files == 0
    assert store.check(read_data=True)["problems"] == []
    assert store.cat("cdc://ds/f0003.bin") == (src / "f0003.bin").read_bytes()
    reads.clear()
    r = store.push(str(src), "cdc://other/")  # another repo: presence vouches for the manifests
    assert reads == [] and r.unread_files == 5 and store.cat("cdc://other/f0001.bin") == (src / "f0001.bin").read_bytes()


def test_cli_no_stat_cache_reads_every_file(tmp_path, store, reads):
    src = _folder(tmp_path / "src", 3)
    run = CliRunner().invoke
    ok = run(cli, ["push", str(src), "cdc://ds/", "--store", store.location])
    assert ok.exit_code == 0, ok.output
    _edit(src / "f0001.bin")
    reads.clear()
    out = run(cli, ["push", str(src), "cdc://ds/", "--store", store.location, "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["unread_files"] == 2 and reads == ["f0001.bin"]
    reads.clear()
    out = run(cli, ["push", str(src), "cdc://ds/", "--store", store.location, "--no-stat-cache"])
    assert out.exit_code == 0 and sorted(reads) == ["f0000.bin", "f0001.bin", "f0002.bin"]
    assert "no changes" in out.output

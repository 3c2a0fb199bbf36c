"""gc: mark what branches and tags reach, delete the rest (after a grace window), never race a push."""
import json
import os
import subprocess
import sys
import threading

import pytest

from cdcstore import Store
from cdcstore.storage.maintenance import PushSession, gc, plan
from cdcstore.storage.repository import LocalStore, open_repository

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _file(folder, name, data):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return str(folder / name)


def _store_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(root, "packs")) for f in fs)


def test_gc_deletes_what_nothing_reaches_and_keeps_the_rest(store, tmp_path):
    keep = os.urandom(2 << 20)
    drop = os.urandom(3 << 20)
    store.push(_file(tmp_path / "k", "keep.bin", keep), "cdc://ds/keep.bin")
    tagged = store.push(_file(tmp_path / "t", "t.bin", b"tagged " * 1000), "cdc://ds/t.bin").commit
    store.tag("ds", "v1", tagged)
    store.push(_file(tmp_path / "d", "drop.bin", drop), "cdc://ds@exp/drop.bin")
    store.delete_branch("ds", "exp")
    before = _store_bytes(store.location)
    dry = store.gc(grace=0, dry_run=True)
    assert dry["delete_packs"] >= 1 and dry["bytes_freed"] >= 3 << 20 and not dry["deleted"]
    assert _store_bytes(store.location) == before  # a dry run changes nothing
    r = store.gc(grace=0)
    assert r["deleted"] and r["bytes_freed"] == dry["bytes_freed"] and r["delete_commits"] >= 1
    assert _store_bytes(store.location) <= before - (3 << 20)
    assert store.cat("cdc://ds/keep.bin") == keep and store.cat("cdc://ds@v1/t.bin") == b"tagged " * 1000
    assert store.check(read_data=True)["problems"] == []
    again = store.push(_file(tmp_path / "d2", "drop.bin", drop), "cdc://ds/drop.bin")
    assert again.new_bytes == len(drop)  # its chunks were really gone: stored again, not assumed present
    assert store.cat("cdc://ds/drop.bin") == drop


def test_young_objects_are_spared(store, tmp_path):
    store.push(_file(tmp_path / "d", "x.bin", os.urandom(1 << 20)), "cdc://ds@exp/x.bin")
    store.push(_file(tmp_path / "m", "y.bin", b"y"), "cdc://ds/y.bin")
    store.delete_branch("ds", "exp")
    r = store.gc()  # default grace: a day
    assert r["delete_packs"] == 0 and r["spared_young"] >= 1


def test_nothing_is_deleted_while_a_push_is_in_flight(store, tmp_path):
    store.push(_file(tmp_path / "d", "x.bin", os.urandom(1 << 20)), "cdc://ds@exp/x.bin")
    store.push(_file(tmp_path / "m", "y.bin", b"y"), "cdc://ds/y.bin")
    store.delete_branch("ds", "exp")
    repo = LocalStore(store.location)
    with PushSession(repo):
        r = gc(repo, grace=0)
        assert r["open_sessions"] == 1 and not r["deleted"]
    assert gc(repo, grace=0)["deleted"]


def test_push_and_gc_at_the_same_time_lose_nothing(store, tmp_path):
    """20 rounds: each pushes new data and re-pushes data whose only other copy is garbage (the
    dedup hazard: a presence answer for a chunk gc is about to delete), while gc runs with no
    grace window at all. Every acknowledged commit reads back; check is clean."""
    blobs = [os.urandom(300_000) for _ in range(20)]
    acked, errors, done = [], [], threading.Event()

    def pusher():
        try:
            for i, blob in enumerate(blobs):
                s = Store(store.location)
                s.push(_file(tmp_path / f"g{i}", "g.bin", blob), f"cdc://ds@tmp{i}/g.bin")
                s.delete_branch("ds", f"tmp{i}")  # now garbage ...
                r = s.push(_file(tmp_path / f"p{i}", "p.bin", blob), f"cdc://ds/r{i}.bin")  # ... and wanted again
                acked.append((r.commit, i))
                s.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            done.set()

    store.push(_file(tmp_path / "base", "b.bin", b"base"), "cdc://ds/b.bin")
    t = threading.Thread(target=pusher)
    t.start()
    runs = 0
    while not done.is_set():
        gc(LocalStore(store.location), grace=0)
        runs += 1
        done.wait(0.05)  # pushes wait while a gc runs: leave them gaps
    t.join()
    assert errors == [] and len(acked) == 20 and runs >= 1
    s = Store(store.location)
    for commit, i in acked:
        assert s.cat(f"cdc://ds@{commit}/r{i}.bin") == blobs[i]
    assert s.check(read_data=True)["problems"] == []


def test_gc_on_a_bucket(s3_env, tmp_path, monkeypatch):
    from conftest import S3_BUCKET
    import secrets

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = f"s3://{S3_BUCKET}/gc-{secrets.token_hex(4)}"
    Store.init(url).close()
    with Store(url) as s:
        s.push(_file(tmp_path / "d", "x.bin", os.urandom(1 << 20)), "cdc://ds@exp/x.bin")
        s.push(_file(tmp_path / "m", "y.bin", b"keep"), "cdc://ds/y.bin")
        s.delete_branch("ds", "exp")
        r = s.gc(grace=0)
        assert r["deleted"] and r["delete_packs"] == 1
        assert s.cat("cdc://ds/y.bin") == b"keep" and s.check()["problems"] == []
    assert plan(open_repository(url), grace=0).packs == []


def test_cli_gc_dry_run_and_bad_grace(store, tmp_path):
    store.push(_file(tmp_path / "d", "x.bin", os.urandom(1 << 20)), "cdc://ds@exp/x.bin")
    store.push(_file(tmp_path / "m", "y.bin", b"y"), "cdc://ds/y.bin")
    store.delete_branch("ds", "exp")
    env = {**os.environ, "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, "-m", "cdcstore", "gc", "--store", store.location, "--grace", "0",
                        "--dry-run", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and json.loads(p.stdout)["delete_packs"] == 1
    p = subprocess.run([sys.executable, "-m", "cdcstore", "gc", "--store", store.location, "--grace", "soon"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 1 and "--grace wants a duration" in p.stderr and len(p.stderr.splitlines()) == 1
    p = subprocess.run([sys.executable, "-m", "cdcstore", "gc", "--store", store.location, "--repack-dead", "1.5"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 1 and "repack_dead is the dead share" in p.stderr and len(p.stderr.splitlines()) == 1


def test_forget_keep_last_then_gc_frees_old_versions(store, tmp_path):
    from cdcstore.storage.maintenance import forget_plan

    # the pure policy: heads and tagged commits always, the N newest per branch, young ones
    hist = {"main": [("c5", 50), ("c4", 40), ("c3", 30), ("c2", 20), ("c1", 10)], "dev": [("d1", 5), ("c2", 20)]}
    assert forget_plan(hist, {}, keep_last=2, now=100) == ["c1", "c3"]
    assert forget_plan(hist, {"v": "c1"}, keep_last=2, now=100) == ["c3"]
    assert forget_plan(hist, {}, keep_within=65, now=100) == ["c1", "c2", "c3"]

    versions = []
    for i in range(5):
        data = os.urandom(1 << 20)
        versions.append((store.push(_file(tmp_path / f"v{i}", "d.bin", data), "cdc://ds/d.bin").commit, data))
    dry = store.forget("ds", keep_last=2, dry_run=True)
    assert len(dry["forget"]) == 3 and store.cat(f"cdc://ds@{versions[0][0]}/d.bin") == versions[0][1]
    r = store.forget("ds", keep_last=2)
    assert sorted(r["forget"]) == sorted(c for c, _ in versions[:3])
    freed = store.gc(grace=0)
    assert freed["bytes_freed"] >= 3 << 20 and freed["delete_commits"] == 0  # history stays, data goes
    for cid, data in versions[3:]:
        assert store.cat(f"cdc://ds@{cid}/d.bin") == data
    with pytest.raises(FileNotFoundError, match="was forgotten"):
        store.cat(f"cdc://ds@{versions[0][0]}/d.bin")
    assert len(store.log("ds")) == 5  # the log still shows every commit
    assert store.check(read_data=True)["problems"] == []
    with pytest.raises(ValueError, match="needs a policy"):
        store.forget("ds")


def test_delete_repo_then_gc_frees_its_data(store, tmp_path):
    store.push(_file(tmp_path / "a", "a.bin", os.urandom(1 << 20)), "cdc://gone/a.bin")
    keep = os.urandom(1 << 20)
    store.push(_file(tmp_path / "b", "b.bin", keep), "cdc://stays/b.bin")
    dry = store.delete_repo("gone", dry_run=True)
    assert dry["refs"] == 1 and dry["commits"] == 1 and "gone" in store.repos()
    store.delete_repo("gone")
    assert store.repos() == ["stays"]
    with pytest.raises(FileNotFoundError, match="no repo 'gone'"):
        store.ls("cdc://gone/")
    assert store.gc(grace=0)["bytes_freed"] >= 1 << 20
    assert store.cat("cdc://stays/b.bin") == keep and store.check(read_data=True)["problems"] == []


def test_sparse_packs_are_repacked(store, tmp_path):
    """One pack holding a kept file and a dropped one: gc rewrites it with the live chunks only."""
    keep, drop = os.urandom(300_000), os.urandom(1_500_000)
    folder = tmp_path / "both"
    folder.mkdir()
    (folder / "keep.bin").write_bytes(keep)
    (folder / "drop.bin").write_bytes(drop)
    store.push([str(folder)], "cdc://ds@exp/")  # one pack holds both files
    store.push([str(folder / "keep.bin")], "cdc://ds/keep.bin")  # main keeps only keep.bin (deduped)
    store.delete_branch("ds", "exp")
    before = _store_bytes(store.location)
    dry = store.gc(grace=0, dry_run=True)
    assert dry["repack_packs"] == 1 and dry["delete_packs"] == 0 and dry["bytes_freed"] >= 1_400_000
    r = store.gc(grace=0)
    assert r["deleted"] and _store_bytes(store.location) <= before - 1_400_000
    assert store.cat("cdc://ds/keep.bin") == keep
    assert store.check(read_data=True)["problems"] == []
    assert store.gc(grace=0)["repack_packs"] == 0  # the new pack is all live


def _age(root, seconds):
    """Make every object of a store directory look `seconds` old (the grace window's clock)."""
    past = __import__("time").time() - seconds
    for d, _, fs in os.walk(root):
        for f in fs:
            os.utime(os.path.join(d, f), (past, past))


def test_an_uploaded_manifest_keeps_old_garbage_it_dedups_against(store, tmp_path):
    """upload() now, commit_entries() later (the dask writers' path): the upload dedups against an
    old pack that nothing reaches; a gc in between must keep that pack (young manifests are roots)."""
    data = os.urandom(3 << 20)
    src = _file(tmp_path / "d", "x.bin", data)
    store.push(src, "cdc://ds@exp/x.bin")
    store.push(_file(tmp_path / "m", "y.bin", b"y"), "cdc://ds/y.bin")
    store.delete_branch("ds", "exp")
    _age(store.location, 7200)  # the garbage is two hours old
    entries = store.upload(src, "cdc://ds/x.bin")
    r = store.gc(grace=3600)
    assert r["deleted"]
    store.commit_entries("cdc://ds", entries)
    assert store.cat("cdc://ds/x.bin") == data
    assert store.check(read_data=True)["problems"] == []


def test_an_upload_holds_a_push_session_while_it_deduplicates(store, tmp_path):
    """`upload` (the dask writers' path) queries presence like a push: a gc between that answer
    and its manifests could delete what it deduplicated against, so it holds a session too."""
    seen = []
    src = _file(tmp_path / "d", "x.bin", os.urandom(1 << 20))
    store.upload(src, "cdc://ds/x.bin",
                 progress=lambda n: seen.append(len(os.listdir(os.path.join(store.location, "sessions")))))
    assert seen and max(seen) == 1
    assert os.listdir(os.path.join(store.location, "sessions")) == []


KILLED_GC = """
import sys, time
from cdcstore.storage import maintenance
from cdcstore.storage.repository import LocalStore
def stuck(*a, **kw):
    print("marker written", flush=True)
    time.sleep(600)
maintenance.plan = stuck  # gc has written its marker and counted sessions: it hangs in its mark
maintenance.gc(LocalStore(sys.argv[1]), grace=0)
"""


def test_a_gc_killed_mid_run_holds_no_push_off(store, tmp_path):
    """A SIGKILLed gc leaves its `gc/` marker; pushes waited on it (600 s, then BusyError; the
    marker counted as running for 6 h). Its process is gone: the marker is removed and the push
    goes on. A marker of a live gc, or an old empty one, still holds a push."""
    import signal

    from cdcstore.core.errors import BusyError

    p = subprocess.Popen([sys.executable, "-c", KILLED_GC, store.location], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert p.stdout.readline().strip() == "marker written"
    p.send_signal(signal.SIGKILL)
    p.wait()
    markers = os.path.join(store.location, "gc")
    assert len(os.listdir(markers)) == 1
    repo = LocalStore(store.location)
    with PushSession(repo, timeout=5):
        assert os.listdir(markers) == []
    r = store.push(_file(tmp_path / "d", "x.bin", b"after the killed gc"), "cdc://ds/x.bin")
    assert store.cat("cdc://ds/x.bin") == b"after the killed gc" and r.commit
    live = json.dumps({"host": __import__("socket").gethostname(), "pid": os.getpid()}).encode()
    for name, body in (("gc/1-live", live), ("gc/2-old-format", b"")):
        repo.objects.put(name, body)
        with pytest.raises(BusyError):
            with PushSession(repo, timeout=0.3):
                pass
        repo.objects.delete(name)


def test_a_repo_deleted_while_gc_marks_is_skipped(store, tmp_path):
    """delete-repo on another machine while gc walks that repo's history: its commits vanish
    under the mark. gc failed with "no repo 'gone' ... push to cdc://gone/ to create it" (the
    multi-machine fault test found it); the repo reaches nothing now, so gc skips it. A commit
    that a ref still names and that is missing still stops gc."""
    from cdcstore.core.errors import RevisionNotFoundError

    store.push(_file(tmp_path / "g", "g.bin", os.urandom(500_000)), "cdc://gone/g.bin")
    store.push(_file(tmp_path / "g2", "g2.bin", os.urandom(1000)), "cdc://gone/g2.bin")
    keep = os.urandom(300_000)
    store.push(_file(tmp_path / "k", "k.bin", keep), "cdc://stays/k.bin")
    repo = LocalStore(store.location)
    walk = repo.get_commit

    def get_commit(name, cid):
        if name == "gone" and repo.has_repo("gone"):
            Store(store.location).delete_repo("gone")  # another machine, mid-mark
        return walk(name, cid)

    repo.get_commit = get_commit
    r = gc(repo, grace=0)
    assert r["deleted"] and r["delete_packs"] >= 1
    assert store.cat("cdc://stays/k.bin") == keep and store.check(read_data=True)["problems"] == []
    store.push(_file(tmp_path / "k2", "k2.bin", b"k2"), "cdc://stays/k2.bin")
    first = store.get_commit("stays", store.branches("stays")["main"]).parent
    os.remove(os.path.join(store.location, "repos", "stays", "commits", f"{first}.json"))
    with pytest.raises(RevisionNotFoundError):
        gc(LocalStore(store.location), grace=0)


def test_a_server_kept_session_is_a_lease_that_a_dead_client_stops_renewing(tmp_path):
    """A replica writes its clients' session markers with no pid: a client or replica killed
    mid-push left one that held every gc off for 6 h (the many-machines fault test: 35 of 38
    admin gcs deleted nothing). A server-kept session is a lease now: stale 10 min after its
    client's last refresh (clients refresh every minute); a push's own marker keeps the 6 h rule."""
    import time
    from cdcstore.storage import maintenance

    store = LocalStore.init(str(tmp_path / "s"))
    now = time.time()

    def marker(name, age, owner):
        store.objects.put(f"sessions/{name}", json.dumps(owner).encode())
        os.utime(store.objects.local_path(f"sessions/{name}"), (now - age, now - age))

    marker("srv-" + "a" * 32, maintenance.SERVER_LEASE + 5, {"host": "replica", "pid": None})
    assert maintenance.open_sessions(store, grace=0, now=now) == 0  # its client stopped refreshing
    marker("srv-" + "b" * 32, maintenance.SERVER_LEASE - 60, {"host": "replica", "pid": None})
    marker("7-" + "c" * 16, maintenance.SERVER_LEASE + 5, {"host": "another-host", "pid": 7})
    assert maintenance.open_sessions(store, grace=0, now=now) == 2  # a live lease; a push of another host
    assert maintenance.SERVER_REFRESH * 5 <= maintenance.SERVER_LEASE


def test_a_push_lands_during_a_long_mark_and_what_it_dedups_against_survives(store, tmp_path, monkeypatch):
    """Issue 42: gc's mark runs with no marker, so a push during it does not wait (a 20-file upload
    waited 183 s at 200,000 files). The hazard is the push that deduplicates against garbage the
    mark has judged dead: gc marks again under its marker what landed meanwhile, so it survives.
    The mark here holds until the push has landed (a push that waited on gc would hold it 20 s)."""
    from cdcstore.storage import maintenance

    blob = os.urandom(1 << 20)
    store.push(_file(tmp_path / "d", "x.bin", blob), "cdc://ds@exp/x.bin")
    store.push(_file(tmp_path / "m", "y.bin", b"y"), "cdc://ds/y.bin")
    store.delete_branch("ds", "exp")  # x's chunks are garbage now ...
    marking, pushed, real = threading.Event(), threading.Event(), maintenance._mark_history
    during = []

    def slow(*a, **kw):
        real(*a, **kw)
        if not marking.is_set():
            marking.set()
            during.append(pushed.wait(20))  # a long mark: the push below lands inside it

    monkeypatch.setattr(maintenance, "_mark_history", slow)
    out = {}
    t = threading.Thread(target=lambda: out.update(gc(LocalStore(store.location), grace=0)))
    t.start()
    assert marking.wait(30)
    r = Store(store.location).push(_file(tmp_path / "again", "x.bin", blob), "cdc://ds/x.bin")  # ... wanted again
    pushed.set()
    t.join()
    assert during == [True]  # it landed while the mark ran: it did not wait for gc
    assert r.new_bytes == 0  # it deduplicated against the garbage
    assert out["deleted"] and out["open_sessions"] == 0
    assert store.cat("cdc://ds/x.bin") == blob
    assert store.check(read_data=True)["problems"] == []

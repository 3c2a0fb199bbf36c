"""Lifecycle through a server: gc, check, forget and delete-repo with an admin token (and only
with one), push sessions over the wire that a server-side gc honours, heartbeats of long pushes."""
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from cdcstore import Store
from cdcstore.core.errors import AccessDeniedError, InvalidAddressError
from cdcstore.storage import maintenance
from cdcstore.storage.maintenance import PushSession, gc
from cdcstore.storage.repository import LocalStore

TOKENS = {"R": {"scope": "read", "repos": ["*"]}, "W": {"scope": "write", "repos": ["*"]},
          "A": {"scope": "admin", "repos": ["*"]}, "S": {"scope": "write", "repos": ["ds"]}}


def _file(folder, name, data):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return str(folder / name)


def _age(root, seconds):
    past = time.time() - seconds
    for d, _, fs in os.walk(root):
        for f in fs:
            os.utime(os.path.join(d, f), (past, past))


def _pack_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(root, "packs")) for f in fs)


# a test's server: read, write, admin and repo-scoped tokens, and no floor on gc's grace
pytestmark = pytest.mark.served("--min-gc-grace", "0", tokens=TOKENS)


def _garbage(url, tmp_path, token="W", size=2 << 20):
    """A store holding kept data and `size` bytes that only a deleted branch reached."""
    with Store(url, token=token) as s:
        s.push(_file(tmp_path / "k", "keep.bin", b"keep" * 1000), "cdc://ds/keep.bin")
        s.push(_file(tmp_path / "d", "drop.bin", os.urandom(size)), "cdc://ds@exp/drop.bin")
        s.delete_branch("ds", "exp")


def test_only_an_admin_token_runs_lifecycle_commands(server, tmp_path):
    _garbage(server.url, tmp_path)
    for token in ("R", "W", "S", None, "forged"):
        with Store(server.url, token=token) as s:
            with pytest.raises(AccessDeniedError):
                s.gc(grace=0)
            with pytest.raises(AccessDeniedError):
                s.delete_repo("ds")
            with pytest.raises(AccessDeniedError):
                s.forget("ds", keep_last=1)
            with pytest.raises(AccessDeniedError):
                s.check()
    before = _pack_bytes(server.store)
    with Store(server.url, token="A") as s:
        dry = s.gc(grace=0, dry_run=True)
        assert dry["bytes_freed"] >= 2 << 20 and not dry["deleted"] and _pack_bytes(server.store) == before
        r = s.gc(grace=0)
        assert r["deleted"] and r["bytes_freed"] == dry["bytes_freed"]
        assert _pack_bytes(server.store) <= before - (2 << 20)
        assert s.check(read_data=True)["problems"] == []
        assert s.cat("cdc://ds/keep.bin") == b"keep" * 1000  # an admin token reads and writes too
        assert s.delete_repo("ds", dry_run=True)["dry_run"] and s.cat("cdc://ds/keep.bin")


def test_admin_requests_with_bad_options_are_refused_clearly(server, tmp_path):
    with Store(server.url, token="A") as s:
        with pytest.raises(InvalidAddressError, match="repack_dead"):
            s.gc(grace=0, repack_dead=2.0)
        with pytest.raises(InvalidAddressError, match="keep-last"):
            s.forget("ds", keep_last=0)
        with pytest.raises(InvalidAddressError, match="repo"):
            s.delete_repo("../etc")
    for path, body in [("/v1/admin/format-disk", b"{}"), ("/v1/admin/gc", b'{"grace": "zero"}'),
                       ("/v1/admin/gc", b'{"rm": true}'), ("/v1/admin/gc", b"[1]"), ("/v1/admin/gc", b"{" * 5000)]:
        req = urllib.request.Request(server.url + path, data=body, method="POST",
                                     headers={"Authorization": "Bearer A"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and json.loads(e.value.read())["error"]


@pytest.mark.served(tokens=TOKENS)  # the default floor: 1h
def test_a_server_refuses_a_grace_under_its_floor(server):
    with Store(server.url, token="A") as s:
        with pytest.raises(InvalidAddressError, match="min-gc-grace"):
            s.gc(grace=0)
        assert s.gc(grace=7200, dry_run=True)["dry_run"]


def test_a_remote_push_session_holds_a_server_side_gc(server, tmp_path):
    _garbage(server.url, tmp_path)
    with Store(server.url, token="W") as w, Store(server.url, token="A") as a:
        with w.backend.uncached().push_session() as session:
            assert session.sid and os.path.exists(os.path.join(server.store, "sessions", f"srv-{session.sid}"))
            r = a.gc(grace=0)
            assert r["open_sessions"] == 1 and not r["deleted"]
        assert not os.listdir(os.path.join(server.store, "sessions"))
        assert a.gc(grace=0)["deleted"]


def test_session_ids_are_checked(server):
    for sid in ("../../packs/x", "A" * 32, "0" * 31):
        req = urllib.request.Request(f"{server.url}/v1/sessions/{sid}", method="DELETE",
                                     headers={"Authorization": "Bearer W"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code in (400, 404)
    req = urllib.request.Request(f"{server.url}/v1/sessions", data=b"{}", method="POST",
                                 headers={"Authorization": "Bearer R"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 403  # a read token pushes nothing, so it opens no session


def test_pushes_and_gc_through_a_server_at_the_same_time_lose_nothing(server, tmp_path):
    """20 rounds through the server: each round pushes data, makes it garbage, and pushes it again
    (the dedup hazard), while an admin runs gc with no grace window. Nothing acknowledged is lost."""
    blobs = [os.urandom(200_000) for _ in range(20)]
    acked, errors, done = [], [], threading.Event()

    def pusher():
        try:
            with Store(server.url, token="W") as s:
                for i, blob in enumerate(blobs):
                    s.push(_file(tmp_path / f"g{i}", "g.bin", blob), f"cdc://ds@tmp{i}/g.bin")
                    s.delete_branch("ds", f"tmp{i}")
                    r = s.push(_file(tmp_path / f"p{i}", "p.bin", blob), f"cdc://ds/r{i}.bin")
                    acked.append((r.commit, i))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            done.set()

    with Store(server.url, token="A") as a:
        a.push(_file(tmp_path / "base", "b.bin", b"base"), "cdc://ds/b.bin")
        t = threading.Thread(target=pusher)
        t.start()
        runs = deleted = 0
        while not done.is_set():
            deleted += a.gc(grace=0)["deleted"]
            runs += 1
            done.wait(0.05)
        t.join()
        assert errors == [] and len(acked) == 20 and runs >= 1
        for commit, i in acked:
            assert a.cat(f"cdc://ds@{commit}/r{i}.bin") == blobs[i]
        assert a.check(read_data=True)["problems"] == []


def test_cli_gc_check_and_forget_through_a_server(server, tmp_path):
    _garbage(server.url, tmp_path)
    cli = [sys.executable, "-m", "cdcstore"]
    env = {**os.environ, "CDCSTORE_TOKEN": "W"}
    r = subprocess.run(cli + ["gc", "--store", server.url, "--grace", "0"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode != 0 and "admin scope" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(cli + ["gc", "--store", server.url, "--token", "A", "--grace", "0", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["deleted"] and json.loads(r.stdout)["bytes_freed"] >= 2 << 20
    r = subprocess.run(cli + ["check", "--store", server.url, "--token", "A", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["problems"] == []
    r = subprocess.run(cli + ["forget", "ds", "--keep-last", "1", "--dry-run", "--store", server.url,
                              "--token", "A", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["dry_run"]


def test_an_admin_token_must_cover_every_repo(tmp_path):
    root = str(tmp_path / "srv")
    LocalStore.init(root)
    (tmp_path / "t.json").write_text(json.dumps({"A": {"scope": "admin", "repos": ["ds"]}}))
    r = subprocess.run([sys.executable, "-m", "cdcstore", "serve", "--store", root, "--port", "0",
                        "--tokens", str(tmp_path / "t.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and 'repos must be ["*"]' in r.stderr


def test_a_long_push_keeps_its_session_fresh(store, tmp_path, monkeypatch):
    """A push longer than SESSION_STALE must not look dead: its heartbeat touches the marker."""
    monkeypatch.setattr(PushSession, "REFRESH", 0.2)
    repo = LocalStore(store.location)
    with PushSession(repo) as s:
        path = os.path.join(store.location, s.name)
        os.utime(path, (time.time() - 10 * 3600, time.time() - 10 * 3600))  # as if started 10 h ago
        assert maintenance.open_sessions(repo, grace=0) == 0  # without a heartbeat it would look dead
        time.sleep(0.6)
        assert maintenance.open_sessions(repo, grace=0) == 1
        assert gc(repo, grace=0)["open_sessions"] == 1


def test_max_unused_reclaims_thin_garbage(store, tmp_path):
    """Garbage spread thin (under the repack threshold in every pack) is reclaimed, most dead
    packs first, until the dead bytes left are at most max_unused of the live ones."""
    from cdcstore.engine.ingest import IngestOptions
    parts = [os.urandom(1 << 20) for _ in range(8)]
    opts = IngestOptions(max_pack_bytes=4 << 20)  # two packs of 4 MiB
    src = _file(tmp_path / "v1", "f.bin", b"".join(parts))
    store.push(src, "cdc://ds/f.bin", options=opts)
    for i in (1, 5):  # drop two separate 1 MiB pieces: each pack loses a little
        parts[i] = b""
    store.push(_file(tmp_path / "v2", "f.bin", b"".join(parts)), "cdc://ds/f.bin", options=opts)
    store.forget("ds", keep_last=1)
    _age(store.location, 7200)
    # a threshold no pack reaches: only max_unused can reclaim the garbage
    assert store.gc(grace=3600, repack_dead=0.99, max_unused=None, dry_run=True)["repack_packs"] == 0
    r = store.gc(grace=3600, repack_dead=0.99, max_unused=0.0)
    assert r["repack_packs"] >= 1 and r["bytes_freed"] >= 1 << 20
    assert store.cat("cdc://ds/f.bin") == b"".join(parts)
    assert store.check(read_data=True)["problems"] == []


def test_a_killed_push_does_not_hold_gc_off(store, tmp_path):
    """A push SIGKILLed on this host leaves its session marker; gc sees its process is gone,
    removes the marker and collects (a marker of a live process or another host still counts)."""
    import signal
    code = ("import sys, time; from cdcstore.storage.maintenance import PushSession; "
            "from cdcstore.storage.repository import LocalStore; "
            "s = PushSession(LocalStore(sys.argv[1])).__enter__(); print('open', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, store.location], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "open"
    repo = LocalStore(store.location)
    assert maintenance.open_sessions(repo, grace=0) == 1  # alive: counted
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert maintenance.open_sessions(repo, grace=0) == 0
    assert os.listdir(os.path.join(store.location, "sessions")) == []
    repo.objects.put("sessions/elsewhere", json.dumps({"host": "another-host", "pid": 1}).encode())
    assert maintenance.open_sessions(repo, grace=0) == 1  # another host's push: counted until stale

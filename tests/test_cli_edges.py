"""First-try edges of the CLI (issue 8 §6) and pulls that must stay inside their destination (§2)."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from cdcstore import Store
from cdcstore.core import ids
from cdcstore.core.errors import CdcError
from server_util import ServerProcess, free_port
import forker


def cdc(*args, stdin=None, timeout=60, **popen):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if stdin is None and set(popen) <= {"cwd"}:  # forked from a preloaded Python (stdin: /dev/null)
        return forker.cli(args, env=env, timeout=timeout, cwd=popen.get("cwd"))
    return subprocess.run([sys.executable, "-m", "cdcstore", *args], capture_output=True, env=env,
                          timeout=timeout, input=stdin, **popen)


def one_line(p) -> str:
    err = p.stderr.decode()
    assert p.returncode == 1, (p.returncode, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def local(tmp_path):
    """A store holding cdc://r/ with f.bin and d/g.txt."""
    store = str(tmp_path / "store")
    data = tmp_path / "data"
    (data / "d").mkdir(parents=True)
    (data / "f.bin").write_bytes(b"x" * 5000)
    (data / "d" / "g.txt").write_bytes(b"hello\n")
    assert cdc("init", "--store", store).returncode == 0
    assert cdc("push", str(data), "cdc://r/", "--store", store).returncode == 0
    return store


# -- 1. special files on push ------------------------------------------------------------------
def test_push_skips_fifo_socket_device_and_folder_symlink_loops(tmp_path, local):
    data = tmp_path / "special"
    data.mkdir()
    (data / "ok.txt").write_bytes(b"regular\n")
    (data / "target.txt").write_bytes(b"through a link\n")
    os.symlink(data / "target.txt", data / "link.txt")
    os.mkfifo(data / "fifo")
    os.symlink("/dev/zero", data / "zero")
    os.symlink(".", data / "loop")  # a folder symlink loop
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(data / "sock"))
    try:
        p = cdc("push", str(data), "cdc://s/", "--store", local, timeout=30)
    finally:
        sock.close()
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert "Traceback" not in err
    assert "skipped 4 files that are not regular files" in err
    for name in ("fifo", "zero", "loop", "sock"):
        assert f"{name} (" in err
    names = {e["name"] for e in json.loads(cdc("ls", "-r", "cdc://s/", "--json", "--store", local).stdout)["entries"]}
    assert names == {"ok.txt", "target.txt", "link.txt"}
    assert cdc("cat", "cdc://s/link.txt", "--store", local).stdout == b"through a link\n"


def test_push_of_only_a_fifo_is_one_line(tmp_path, local):
    os.mkfifo(tmp_path / "fifo")
    p = cdc("push", str(tmp_path / "fifo"), "cdc://s/", "--store", local, timeout=30)
    assert "nothing to push" in p.stderr.decode().splitlines()[-1]
    assert p.returncode == 1 and "Traceback" not in p.stderr.decode()


# -- 2. pull never replaces symlinks, FIFOs or devices --------------------------------------------
def test_pull_refuses_symlink_and_fifo_targets(tmp_path, local):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep me")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / "f.bin")
    line = one_line(cdc("pull", "cdc://r/", str(out), "--store", local))
    assert "is a symlink" in line and "f.bin" in line
    assert os.path.islink(out / "f.bin") and victim.read_bytes() == b"keep me"
    os.mkfifo(tmp_path / "pipe")
    line = one_line(cdc("pull", "cdc://r/f.bin", str(tmp_path / "pipe"), "--store", local, timeout=30))
    assert "is a FIFO" in line


def test_pull_refuses_dev_stdout(tmp_path, local):
    """A link like /dev/stdout (made in tmp_path: the old code replaced the real one)."""
    stdout = tmp_path / "stdout"
    os.symlink("/proc/self/fd/1", stdout)
    line = one_line(cdc("pull", "cdc://r/f.bin", str(stdout), "--store", local))
    assert str(stdout) in line and "cdcstore cat" in line
    assert os.path.islink(stdout)


# -- 3. a trailing '/' means a folder -----------------------------------------------------------
def test_pull_file_into_new_folder_with_trailing_slash(tmp_path, local):
    p = cdc("pull", "cdc://r/f.bin", str(tmp_path / "newdir") + "/", "--store", local)
    assert p.returncode == 0, p.stderr.decode()
    assert (tmp_path / "newdir" / "f.bin").read_bytes() == b"x" * 5000


# -- 4. cat | head ---------------------------------------------------------------------------------
def test_cat_into_closed_pipe_is_quiet(tmp_path, local):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(4 << 20))
    assert cdc("push", str(big), "cdc://b/", "--store", local).returncode == 0
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run(f"{sys.executable} -m cdcstore cat cdc://b/big.bin --store {local} | head -c 10",
                       shell=True, capture_output=True, env=env, timeout=60, executable="/bin/bash")
    assert len(p.stdout) == 10
    assert p.stderr == b"", p.stderr.decode()


# -- 5. a refused connection fails fast and says why ----------------------------------------------
def test_wrong_port_fails_fast_with_one_line(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    line = one_line(cdc("ls", "cdc://r/", "--store", url))
    assert time.monotonic() - t0 < 5
    assert url in line and "cdcstore serve" in line and "refused" in line


def test_retry_note_names_what_is_retrying(tmp_path):
    """A server that answers 503 with Retry-After: the wait is announced, and -q hides it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Busy(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"error": "busy"}'
            self.send_response(503)
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = (f"import sys; from cdcstore.cli import cli; sys.argv[0]='cdcstore';"
                f"from cdcstore.remote.client import store; store.Transport.__init__.__kwdefaults__['retries'] = 1;"
                f"cli()")
        p = subprocess.run([sys.executable, "-c", code, "ls", "cdc://r/", "--store", url],
                           capture_output=True, env=env, timeout=60)
        err = p.stderr.decode()
        assert "retrying GET" in err and "in 1.0 s" in err, err
        q = subprocess.run([sys.executable, "-c", code, "ls", "-q", "cdc://r/", "--store", url],
                           capture_output=True, env=env, timeout=60)
        assert "retrying" not in q.stderr.decode() and one_line(q)
    finally:
        srv.shutdown()


# -- 6. serve on a busy port ---------------------------------------------------------------------
def test_serve_on_busy_port_does_not_announce(tmp_path, local):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    try:
        p = cdc("serve", "--store", local, "--port", str(port), timeout=30)
    finally:
        sock.close()
    assert "serving" not in p.stdout.decode()
    assert one_line(p).endswith(f"port {port} is in use: pick another with --port")


# -- 7, 8. init on a URL, unknown schemes -------------------------------------------------------
def test_init_on_url_says_server_side(tmp_path, monkeypatch):
    line = one_line(cdc("init", "--store", "http://127.0.0.1:1/"))
    assert "created on the server" in line and "created store" not in line
    monkeypatch.setenv("CDCSTORE_STORE", "http://127.0.0.1:1/")
    line = one_line(cdc("init", cwd=tmp_path))
    assert "created on the server" in line and os.listdir(tmp_path) == []


@pytest.mark.parametrize("url", ["htp://127.0.0.1:1/", "ftp://bucket/x", "file://x"])
def test_unknown_scheme_is_refused(tmp_path, url):
    line = one_line(cdc("ls", "cdc://r/", "--store", url, cwd=tmp_path))
    assert "unsupported store scheme" in line and "http://" in line
    assert not os.path.exists(tmp_path / (url.split(":")[0] + ":"))


def test_an_unreachable_bucket_store_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("CDCSTORE_S3_CLIENT", "s3fs")
    # one attempt, not the default five with botocore's jittered backoff (~10-20 s of sleeping):
    # the error after the last retry is the same line
    code = ("import sys, inspect; from cdcstore.storage import s3; init = s3.S3Objects.__init__;"
            "assert list(inspect.signature(init).parameters)[2] == 'retries';"
            "init.__defaults__ = (1,) + init.__defaults__[1:];"
            "sys.argv[0] = 'cdcstore'; from cdcstore.cli import cli; cli()")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", code, "ls", "cdc://r/", "--store", "s3://bucket/x"],
                       capture_output=True, env=env, timeout=60, cwd=tmp_path)
    line = one_line(p)
    assert "s3://bucket/x" in line or "127.0.0.1:1" in line, line


# -- 9, 10. --json errors and -q -------------------------------------------------------------
def test_json_error_is_one_json_object(tmp_path, local):
    p = cdc("ls", "cdc://nope/", "--json", "--store", local)
    assert p.returncode == 1 and p.stderr == b""
    doc = json.loads(p.stdout)
    assert doc["type"] == "RepoNotFoundError" and "nope" in doc["error"]


def test_quiet_prints_only_the_result(tmp_path, local):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1 << 20))
    for args in (["-q", "push"], ["push", "-q"]):
        p = cdc(*args, str(big), "cdc://q/", "--store", local)
        assert p.returncode == 0 and p.stderr == b"", p.stderr.decode()


# -- 11. pull --json fields ---------------------------------------------------------------------
def test_pull_json_fields_mean_what_they_say(tmp_path, local):
    out = str(tmp_path / "out")
    first = json.loads(cdc("pull", "cdc://r/", out, "--json", "--store", local).stdout)
    assert (first["files"], first["bytes"], first["written_files"], first["written_bytes"]) == (2, 5006, 2, 5006)
    assert "new_bytes" not in first and "stored_bytes" not in first
    again = json.loads(cdc("pull", "cdc://r/", out, "--json", "--store", local).stdout)
    assert (again["written_files"], again["written_bytes"]) == (0, 0)


# -- §2. hostile commits -----------------------------------------------------------------------
def _hostile_branch(store: str, paths: list[str]) -> None:
    """Add branch `evil` to repo r: a commit naming f.bin's manifest under `paths`."""
    head = open(os.path.join(store, "repos", "r", "branches", "main")).read().strip()
    good = Store(store).get_commit("r", head)
    entry = good.files["f.bin"]
    # written by hand: Commit.encode refuses such paths, a tampered store or hostile server does not
    doc = {"format": 1, "repo": "r", "parent": head, "message": "evil", "time": time.time(),
           "files": {p: {"manifest": entry.manifest, "size": entry.size} for p in paths}}
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    cid = ids.hexdigest(data)
    with open(os.path.join(store, "repos", "r", "commits", f"{cid}.json"), "wb") as f:
        f.write(data)
    with open(os.path.join(store, "repos", "r", "branches", "evil"), "w") as f:
        f.write(cid)


@pytest.mark.parametrize("bad", ["../escaped.bin", "a/../../escaped.bin", "/abs/escaped.bin", "a//b"])
def test_pull_refuses_paths_leaving_the_destination(tmp_path, local, bad):
    _hostile_branch(local, [bad])
    out = tmp_path / "out" / "dest"
    out.mkdir(parents=True)
    p = cdc("pull", "cdc://r@evil/", str(out), "--store", local)
    line = one_line(p) if p.returncode == 1 and "Traceback" not in p.stderr.decode() else p.stderr.decode()
    assert "unsafe path" in line or "not a valid commit" in line, line
    assert not (tmp_path / "out" / "escaped.bin").exists() and not os.path.exists("/abs/escaped.bin")
    with pytest.raises(CdcError):
        Store(local).pull("cdc://r@evil/", str(out))
    assert os.listdir(out) == []


@pytest.mark.parametrize("via", ["cli pull", "fs.get"])
def test_pull_never_follows_a_symlinked_parent_out(tmp_path, local, via):
    import fsspec

    _hostile_branch(local, ["link/escaped.bin"])
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "dest"
    out.mkdir()
    os.symlink(outside, out / "link")
    if via == "cli pull":
        assert "symlink out of" in one_line(cdc("pull", "cdc://r@evil/", str(out), "--store", local))
    else:
        fs = fsspec.filesystem("cdc", store=local, skip_instance_cache=True)
        with pytest.raises(CdcError, match="symlink out of"):
            fs.get("cdc://r@evil/", str(out) + "/", recursive=True)
    assert os.listdir(outside) == []


def test_pull_from_hostile_server(tmp_path, local):
    _hostile_branch(local, ["../escaped.bin"])
    srv = ServerProcess(local).start()
    try:
        out = tmp_path / "dest"
        out.mkdir()
        p = cdc("pull", "cdc://r@evil/", str(out), "--store", srv.url)
        assert p.returncode == 1 and "Traceback" not in p.stderr.decode()
        assert not (tmp_path / "escaped.bin").exists()
    finally:
        srv.stop()


def test_fs_get_refuses_dotdot_and_symlink_targets(tmp_path, local):
    import fsspec

    _hostile_branch(local, ["../escaped.bin"])
    fs = fsspec.filesystem("cdc", store=local)
    out = tmp_path / "dest"
    out.mkdir()
    with pytest.raises((CdcError, ValueError, FileNotFoundError)):  # the commit fails validation when read
        fs.get("cdc://r@evil/", str(out) + "/", recursive=True)
    assert not (tmp_path / "escaped.bin").exists()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    os.symlink(victim, out / "f.bin")
    with pytest.raises(CdcError):
        fs.get("cdc://r/f.bin", str(out / "f.bin"))
    assert victim.read_bytes() == b"keep"

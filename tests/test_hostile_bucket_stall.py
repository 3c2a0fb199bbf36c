"""Issue 19, "a stalled server: the client gives up after 437 s", for buckets: an S3 endpoint that
accepts a request and then never answers (or answers its headers and stalls the body) fails the
request in about $CDCSTORE_TIMEOUT seconds with one line naming the endpoint, saying it stalled and
naming the knob, with both S3 clients; a push it stalls leaves nothing half-visible.

The endpoint is a real loopback HTTP proxy in front of moto's S3 server that passes requests on
until the test tells it to stall some of them."""
import http.client
import secrets
import socket
import threading
import time
import urllib.parse

import pytest
from click.testing import CliRunner

from cdcstore import Store
from cdcstore.cli import cli
from cdcstore.storage import s3
from conftest import S3_BUCKET, golden_input

CLIENTS = ["obstore", "s3fs"]


class StallingProxy:
    """HTTP/1.1 on loopback, passing each request on to `upstream`, except those `rule(method,
    path)` names: "silent" reads the request and never answers, "body" answers the headers and half
    the body, then nothing more, "slow" takes the request's body in at SLOW bytes/s and then passes
    it on. Held connections are let go when the proxy closes."""

    def __init__(self, upstream: str):
        u = urllib.parse.urlsplit(upstream)
        self.upstream = (u.hostname, u.port)
        self.rule = lambda method, path: None
        self.rewrite = lambda method, path, data: data  # an answer's body as the proxy passes it on
        self.stalled: list[tuple[str, str, str]] = []
        self.done = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.done.set()
        self.sock.close()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        up = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            while True:
                line = f.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                headers = []
                while (h := f.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode().partition(":")
                    headers.append((k.strip(), v.strip()))
                low = {k.lower(): v for k, v in headers}
                action = self.rule(method, path)
                if "100-continue" in low.get("expect", "").lower():
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = _read_body(f, low, slow=action == "slow")
                if action == "silent":
                    self.stalled.append((method, path, action))
                    self.done.wait()  # read it all, answer nothing
                    return
                up.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for k, v in headers:
                    if k.lower() != "expect":
                        up.putheader(k, v)
                up.endheaders(body or None)
                r = up.getresponse()
                data = self.rewrite(method, path, r.read())
                keep = [(k, v) for k, v in r.getheaders()
                        if method == "HEAD" or k.lower() not in ("content-length", "transfer-encoding")]
                if method != "HEAD":
                    keep.append(("Content-Length", str(len(data))))
                head = f"HTTP/1.1 {r.status} {r.reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in keep) + "\r\n"
                if action == "body" and len(data) > 1:
                    self.stalled.append((method, path, action))
                    conn.sendall(head.encode() + data[:len(data) // 2])
                    self.done.wait()  # the rest never comes
                    return
                conn.sendall(head.encode() + data)
        except OSError:
            return
        finally:
            up.close()
            conn.close()


SLOW = 2 * 1024 * 1024


def _read_body(f, headers: dict, slow: bool = False) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():  # passed on as it came
        out = b""
        while True:
            size_line = f.readline()
            out += size_line
            n = int(size_line.split(b";")[0], 16)
            out += f.read(n + 2)
            if n == 0:
                return out
    n = int(headers.get("content-length") or 0)
    if not slow:
        return f.read(n)
    out = b""
    while len(out) < n:
        out += f.read(min(64 * 1024, n - len(out)))
        time.sleep(64 * 1024 / SLOW)
    return out


@pytest.fixture
def proxy(s3_endpoint):
    p = StallingProxy(s3_endpoint)
    yield p
    p.close()


@pytest.fixture(params=CLIENTS)
def stalling(request, s3_env, proxy, tmp_path, monkeypatch):
    """A store in the bucket with repo ds (a.bin, 300 KB), reached through the proxy with
    CDCSTORE_TIMEOUT=1 and one S3 client; yields (url, data)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "writer"))
    url = f"s3://{S3_BUCKET}/stall-{secrets.token_hex(4)}"
    data = golden_input(300_000)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(data)
    with Store.init(url) as s:
        s.push([str(src)], "cdc://ds/")
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv(s3.CLIENT_ENV, request.param)
    monkeypatch.setenv("CDCSTORE_TIMEOUT", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "reader"))  # a machine that has read nothing
    Store(url).close()  # this process's client for the proxy is made (and the proxy passes requests)
    yield url, data


def _assert_clear(message: str, proxy: StallingProxy) -> None:
    assert "stalled" in message, message
    assert proxy.url in message, message  # names the endpoint
    assert "CDCSTORE_TIMEOUT" in message, message  # names the knob
    assert "\n" not in message.strip() and "Traceback" not in message, message


def test_a_silent_endpoint_fails_a_read_in_seconds(stalling, proxy):
    """Every request stalls: `cat` gives up in about CDCSTORE_TIMEOUT (1 s here), one line, exit 1."""
    url, _ = stalling
    proxy.rule = lambda method, path: "silent"
    began = time.monotonic()
    r = CliRunner().invoke(cli, ["cat", "cdc://ds/a.bin", "--store", url])
    took = time.monotonic() - began
    assert r.exit_code == 1, (r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    _assert_clear(r.output, proxy)
    assert proxy.stalled and took < 2.5, (took, proxy.stalled)


def test_a_body_that_stalls_mid_stream_fails_a_read_in_seconds(stalling, proxy):
    """The store opens; then each pack range answers its headers and half its bytes, and stops:
    Store.open().read() gives up in seconds with the clear error, never a short read."""
    url, data = stalling
    with Store(url) as s:
        assert s.ls("cdc://ds/")  # the store and repo open through the proxy
        proxy.rule = lambda method, path: "body" if method == "GET" and "/packs/" in path else None
        began = time.monotonic()
        with pytest.raises(OSError) as e:
            with s.open("cdc://ds/a.bin") as f:
                got = f.read()
                assert got == data  # never reached: a stalled body is not a short read
        took = time.monotonic() - began
    _assert_clear(str(e.value), proxy)
    assert any(a == "body" for _, _, a in proxy.stalled) and took < 2.5, (took, proxy.stalled)


def test_a_push_to_a_stalled_endpoint_fails_in_seconds_and_leaves_nothing_half_visible(stalling, proxy, tmp_path):
    """Pack uploads stall (the endpoint reads the pack and never answers): the push fails in
    seconds with the clear error; the branch still names the old commit, check finds nothing
    wrong, and the same push made later (endpoint well again) lands whole."""
    url, data = stalling
    src = tmp_path / "v2"
    src.mkdir()
    new = golden_input(700_000)[400_000:]
    (src / "b.bin").write_bytes(new)
    with Store(url) as s:
        before = s.log("ds")
        proxy.rule = lambda method, path: "silent" if method == "PUT" and "/packs/" in path else None
        began = time.monotonic()
        with pytest.raises(OSError) as e:
            s.push([str(src)], "cdc://ds/")
        took = time.monotonic() - began
        _assert_clear(str(e.value), proxy)
        assert proxy.stalled and took < 2.5, (took, proxy.stalled)
        proxy.rule = lambda method, path: None
        assert s.log("ds") == before  # nothing half-visible: no commit, no moved branch
        assert [e["name"] for e in s.ls("cdc://ds/")] == ["a.bin"]
        assert s.check()["problems"] == []
        s.push([str(src)], "cdc://ds/")
        assert s.cat("cdc://ds/b.bin") == new and s.cat("cdc://ds/a.bin") == data


def test_a_slow_upload_that_keeps_moving_is_not_a_stall(stalling, proxy):
    """A 2.5 MiB put taken in at 2 MiB/s answers after 1.25 s, more than CDCSTORE_TIMEOUT (1 s):
    a put's budget grows with its body (1 MiB/s), so it lands."""
    url, _ = stalling
    objects = s3.S3Objects(url)
    data = golden_input(5 << 19)
    proxy.rule = lambda method, path: "slow" if method == "PUT" else None
    began = time.monotonic()
    objects.put("probe/slow.bin", data)
    assert time.monotonic() - began > 1.1  # it did wait past the stall timeout
    proxy.rule = lambda method, path: None
    assert bytes(objects.get("probe/slow.bin")) == data


def test_a_bad_timeout_setting_is_a_clear_error(s3_env, monkeypatch):
    monkeypatch.setenv("CDCSTORE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="CDCSTORE_TIMEOUT"):
        s3.S3Objects(f"s3://{S3_BUCKET}/x")
    monkeypatch.setenv("CDCSTORE_TIMEOUT", "-1")
    with pytest.raises(ValueError, match="CDCSTORE_TIMEOUT"):
        s3.S3Objects(f"s3://{S3_BUCKET}/x")

"""Ranges received straight into place (remote/client/receiver.py): the fast path takes only a plain
206 of exactly the range asked for; every other answer (the range ignored, a chunked body, bytes
past the body, a connection closed or stalled mid-body, an error status) goes through the full
client, which gives the same bytes or the same clear error as before. A real socket server on
loopback plays each server, and a real `cdcstore serve` the honest one."""
import contextlib
import os
import re
import socket
import threading
import time

import pytest

from cdcstore import Store
from cdcstore.core.errors import NotFoundError, RemoteError
from cdcstore.remote.client.store import Transport

DATA = os.urandom(3 << 20)


class RawServer:
    """An HTTP/1.1 server on a raw socket, keep-alive, serving ranges of DATA at /f as `mode` says."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.requests = 0
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for c in self._open:
            try:
                c.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    got = conn.recv(65536)
                    if not got:
                        return
                    buf += got
                head, buf = buf.split(b"\r\n\r\n", 1)
                self.requests += 1
                m = re.search(rb"Range: bytes=(\d+)-(\d+)", head)
                lo, hi = int(m.group(1)), int(m.group(2)) + 1
                if not self._answer(conn, lo, hi):
                    conn.close()
                    return
        except OSError:
            return

    def _answer(self, conn: socket.socket, lo: int, hi: int) -> bool:
        body, mode = DATA[lo:hi], self.mode
        if mode == "ignore-range":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(DATA) + DATA)
            return True
        if mode == "garbage":  # not HTTP at all
            conn.sendall(b"\x00\xffSSH-2.0-not-a-web-server\r\n" * 50)
            return False
        if mode == "huge-head":  # headers without end
            conn.sendall(b"HTTP/1.1 206 Partial Content\r\n" + b"X-Pad: " + b"a" * (256 << 10))
            return False
        if mode == "gone-once":  # the first answer changes the server: a replica forgets a pack it found gone
            mode = "pack-missing" if self.requests == 1 else "not-found"
        if mode == "pack-missing":
            err = b'{"error": "pack p is missing: read again", "code": "pack_missing"}'
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(err) + err)
            return True
        if mode == "busy-once":
            mode = "busy" if self.requests == 1 else "ok"
        if mode == "busy":
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
            return True
        if mode == "not-found":
            err = b'{"error": "NotFound", "message": "no such pack"}'
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(err) + err)
            return True
        head = b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\n" % (lo, hi - 1, len(DATA))
        if mode == "chunked":
            conn.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
            return True
        if mode == "close":  # one answer per connection
            conn.sendall(head + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            return False
        if mode == "extra":  # bytes past the body (a server out of step with its own framing)
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body + b"GARBAGE")
            return True
        if mode == "short":  # the connection drops mid-body, every time
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body[:len(body) // 2])
            return False
        if mode == "stall":  # half the body, then silence
            conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body[:len(body) // 2])
            self._stop.wait(60)
            return False
        conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        if mode == "one-then-close":  # keep-alive claimed, the connection closed once idle
            time.sleep(0.05)
            return False
        return True


@contextlib.contextmanager
def _transport(url: str, **kw):
    t = Transport(url, **kw)
    try:
        yield t
    finally:
        t.close()


def _get(t: Transport, lo: int, hi: int, pieces: int = 3) -> bytes:
    """Bytes [lo, hi) of /f received into a scatter list of `pieces` views of one buffer."""
    buf = bytearray(hi - lo)
    view = memoryview(buf)
    cuts = [0] + [(hi - lo) * k // pieces for k in range(1, pieces)] + [hi - lo]
    t.run(t.get_range_into("/f", lo, hi, [view[a:b] for a, b in zip(cuts, cuts[1:])]))
    return bytes(buf)


@pytest.fixture
def raw():
    servers = []

    def make(mode: str) -> RawServer:
        servers.append(RawServer(mode))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_a_plain_range_lands_in_place_on_kept_alive_connections(raw):
    srv = raw("ok")
    with _transport(srv.url, timeout=5, retries=1) as t:
        for lo, hi in [(0, 1), (5, 70_000), (1 << 20, 3 << 20), (len(DATA) - 10, len(DATA))]:
            assert _get(t, lo, hi) == DATA[lo:hi]
        assert t.direct_ranges == 4 and t.requests == 4
        assert srv.connections == 1  # one connection, kept alive across the four
        idle = [c for conns in t._receiver._idle.values() for c in conns]
        assert idle and all(not c._views for c in idle)  # an idle connection holds no reader's buffer


@pytest.mark.parametrize("mode", ["ignore-range", "chunked"])
def test_an_answer_that_is_not_a_plain_206_is_served_by_the_full_client(raw, mode):
    srv = raw(mode)
    with _transport(srv.url, timeout=5, retries=1) as t:
        assert _get(t, 1000, 300_000) == DATA[1000:300_000]
        assert t.direct_ranges == 0
        assert srv.requests >= 2  # asked once on the fast path, once through the full client


def test_bytes_past_a_body_drop_the_connection_not_the_range(raw):
    """The body is received to its Content-Length and no further; what follows it arrives on an
    idle connection, which is dropped, never read as the next answer's start."""
    srv = raw("extra")
    with _transport(srv.url, timeout=5, retries=1) as t:
        for lo in (0, 7):
            assert _get(t, lo, lo + 100_000) == DATA[lo:lo + 100_000]
            time.sleep(0.1)
        assert t.direct_ranges == 2 and srv.connections == 2


def test_connections_closed_by_the_server_are_replaced(raw):
    for mode in ("close", "one-then-close"):
        srv = raw(mode)
        with _transport(srv.url, timeout=5, retries=1) as t:
            for k in range(4):
                assert _get(t, k * 1000, k * 1000 + 200_000) == DATA[k * 1000:k * 1000 + 200_000]
                time.sleep(0.1)  # the server closes the idle connection meanwhile
            assert t.direct_ranges == 4, mode
            assert srv.connections == 4, mode


def test_an_error_status_is_the_full_clients_clear_error(raw):
    srv = raw("not-found")
    with _transport(srv.url, timeout=5, retries=1) as t:
        with pytest.raises(NotFoundError):
            _get(t, 0, 1000)
        assert t.direct_ranges == 0


def test_an_error_answer_is_translated_as_it_came_never_asked_again(raw):
    """A replica that finds a pack gone says so (pack_missing: the reader locates again) and
    forgets it; asked again it would say only "not found". The first answer is the one seen."""
    from cdcstore.core.errors import PackMissingError

    srv = raw("gone-once")
    with _transport(srv.url, timeout=5, retries=1) as t:
        with pytest.raises(PackMissingError):
            _get(t, 0, 1000)
        assert srv.requests == 1 and t.requests == 1


@pytest.mark.parametrize("mode", ["garbage", "huge-head"])
def test_an_answer_that_is_not_http_is_a_clear_error_quickly(raw, mode):
    srv = raw(mode)
    with _transport(srv.url, timeout=5, retries=1, backoff=0.01) as t:
        t0 = time.monotonic()
        with pytest.raises(RemoteError):
            _get(t, 0, 300_000)
        assert time.monotonic() - t0 < 10 and t.direct_ranges == 0


def test_many_ranges_at_once_share_the_connections(raw):
    """64 ranges in flight at once over at most 8 connections, each byte exact."""
    srv = raw("ok")
    with _transport(srv.url, timeout=5, retries=1) as t:
        bufs = {lo: bytearray(40_000) for lo in range(0, 64 * 40_000, 40_000)}
        futs = [t.submit(t.get_range_into("/f", lo, lo + 40_000, [memoryview(b)])) for lo, b in bufs.items()]
        for f in futs:
            f.result(30)
        assert all(bytes(b) == DATA[lo:lo + 40_000] for lo, b in bufs.items())
        assert t.direct_ranges == 64 and srv.connections <= 8


def test_a_busy_answer_is_retried_by_the_full_client(raw):
    srv = raw("busy-once")
    with _transport(srv.url, timeout=5, retries=2, backoff=0.01) as t:
        assert _get(t, 10, 50_000) == DATA[10:50_000]
        assert srv.requests == 2


def test_a_header_or_path_it_would_have_to_escape_goes_to_the_full_client(raw):
    """A token with a line break must never reach the wire as a second header line."""
    srv = raw("ok")
    with _transport(srv.url, token="abc\r\nX-Injected: 1", timeout=5, retries=0) as t:
        with pytest.raises(Exception):
            _get(t, 0, 1000)
        assert t.direct_ranges == 0 and srv.requests == 0  # aiohttp refused it before sending
    with _transport(srv.url, timeout=5, retries=0) as t:
        buf = bytearray(100)
        t.run(t.get_range_into("/f?x=1 2", 0, 100, [memoryview(buf)]))
        assert bytes(buf) == DATA[:100] and t.direct_ranges == 0


def test_a_body_cut_short_every_time_is_an_error_not_a_hang(raw):
    srv = raw("short")
    with _transport(srv.url, timeout=5, retries=1, backoff=0.01) as t:
        t0 = time.monotonic()
        with pytest.raises(RemoteError):
            _get(t, 0, 500_000)
        assert time.monotonic() - t0 < 10
        assert t.direct_ranges == 0


def test_a_body_that_stalls_is_given_up_on_within_the_timeout(raw):
    srv = raw("stall")
    with _transport(srv.url, timeout=1.5, retries=3) as t:
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match="stalled"):
            _get(t, 0, 500_000)
        assert time.monotonic() - t0 < 5  # one budget, not one per attempt or per path


def test_a_cold_read_from_a_real_server_takes_the_fast_path_and_is_checked(tmp_path):
    from cdcstore.testing import ServerProcess

    from cdcstore.storage.repository import LocalStore

    store = tmp_path / "store"
    LocalStore.init(str(store))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(DATA)
    with Store(str(store)) as s:
        s.push([str(src / "a.bin")], "cdc://r/")
    srv = ServerProcess(str(store), "--allow-no-auth").start()
    try:
        results = {}
        for direct in (False, True):  # the second Store reuses the objects the first read (storage/memo.py)
            with Store(srv.url, cache=False, direct_receive=direct, range_bytes=256 << 10) as s:
                assert s.cat("cdc://r/a.bin") == DATA
                b = s.backend
                while not hasattr(b, "t"):
                    b = b.inner
                results[direct] = (b.t.direct_ranges, b.t.requests)
        assert results[True][0] >= 10 and results[False][0] == 0
        assert results[True][1] <= results[False][1]  # no request more on the fast path
    finally:
        srv.stop()

"""Loopback proxies that put faults between a client and a real server: for tests of what a client
(or a server) does when the network or an endpoint misbehaves.

`FaultProxy`: TCP, in front of any server: passes bytes both ways, and cuts connections
mid-stream or drips an answer at a few bytes a second.
`StallingProxy`: HTTP/1.1, in front of an HTTP endpoint (an S3 server): passes requests on, and
stalls those a rule names (no answer, half an answer, a slowly read body) or rewrites answers.

Both listen on 127.0.0.1 on a free port (`url`) and run on daemon threads until close() (or the
end of a `with`)."""
from __future__ import annotations

import http.client
import random
import socket
import threading
import time
import urllib.parse
from typing import BinaryIO, Callable, Self

from .. import runtime


class _Listener:
    """A loopback listener on a free port (`port`, `url`): each connection it accepts goes to
    `_take` on the accepting thread, until close() (or the end of a `with`)."""

    def _listen(self, name: str, backlog: int = 64) -> None:
        self.closed = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=backlog)
        self.port: int = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        runtime.thread(self._accept, name=name)

    def close(self) -> None:
        self.closed.set()
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._take(conn)

    def _take(self, conn: socket.socket) -> None:
        raise NotImplementedError


class FaultProxy(_Listener):
    """A loopback TCP proxy in front of the server listening on `target_port`, faulting connections:

    cuts: each of the first `cuts` connections is cut after a random number of bytes, drawn from
        `cut_after` (inclusive; `seed`ed) for each direction on its own: mid request body, mid answer
        body or mid headers. Both of its sockets are shut at once; later connections pass through (so
        that a test's retries end).
    drip_after: past this many bytes of a connection's answer, the rest is dripped at `drip_rate`
        bytes a second (a lying or broken middlebox: the answer never stops, it crawls). None: no drip.

    `connections` counts the connections taken, `cut` the directions cut (a connection counts at
    most twice)."""

    def __init__(self, target_port: int, *, cuts: int = 0, seed: int = 5,
                 cut_after: tuple[int, int] = (200, 1_500_000), drip_after: int | None = None,
                 drip_rate: int = 100):
        self.target, self.to_cut, self.cut_after = target_port, cuts, cut_after
        self.drip_after, self.drip_rate = drip_after, drip_rate
        self.rng = random.Random(seed)
        self.connections = self.cut = 0
        self.lock = threading.Lock()
        self._listen("fault-proxy")

    def _take(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target))
        except OSError:  # the server is gone: so is this connection
            client.close()
            return
        with self.lock:
            self.connections += 1
            faulted = self.connections <= self.to_cut
            up, down = (self.rng.randint(*self.cut_after) if faulted else None for _ in range(2))
        pair = (client, upstream)
        runtime.thread(self._pump, client, upstream, up, None, pair, name="fault-proxy-up")
        runtime.thread(self._pump, upstream, client, down, self.drip_after, pair, name="fault-proxy-down")

    def _pump(self, src: socket.socket, dst: socket.socket, budget: int | None, drip_after: int | None,
              pair: tuple[socket.socket, socket.socket]) -> None:
        """Pass what `src` sends to `dst`: cut after `budget` bytes, drip past `drip_after` bytes."""
        passed = 0
        try:
            while not self.closed.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if budget is not None and len(data) >= budget:
                    dst.sendall(data[:budget])
                    with self.lock:
                        self.cut += 1
                    break
                if budget is not None:
                    budget -= len(data)
                if drip_after is None or passed + len(data) <= drip_after:
                    dst.sendall(data)
                else:
                    step = max(1, self.drip_rate // 10)
                    for i in range(0, len(data), step):
                        if self.closed.is_set():
                            return
                        dst.sendall(data[i:i + step])
                        time.sleep(step / self.drip_rate)
                passed += len(data)
        except OSError:
            pass
        finally:
            for s in pair:  # either side gone, or cut: both connections end at once
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


Rule = Callable[[str, str], str | None]
Rewrite = Callable[[str, str, bytes], bytes]
SLOW = 2 * 1024 * 1024  # bytes a second a "slow" request's body is read at


class StallingProxy(_Listener):
    """HTTP/1.1 on loopback, passing each request on to `upstream` (an http URL), except those
    `rule(method, path)` names: "silent" reads the request and never answers, "body" answers the
    headers and half the body, then nothing more, "slow" takes the request's body in at SLOW
    bytes/s and then passes it on (None: passed on as it is). `rewrite(method, path, body)` is the
    body of an answer as passed on. `stalled` lists the (method, path, action) stalled; held
    connections are let go when the proxy closes."""

    def __init__(self, upstream: str):
        u = urllib.parse.urlsplit(upstream)
        if u.hostname is None or u.port is None:
            raise ValueError(f"{upstream!r} is not an http://HOST:PORT URL")
        self.upstream: tuple[str, int] = (u.hostname, u.port)
        self.rule: Rule = lambda method, path: None
        self.rewrite: Rewrite = lambda method, path, data: data
        self.stalled: list[tuple[str, str, str]] = []
        self._listen("stalling-proxy")

    def _take(self, conn: socket.socket) -> None:
        runtime.thread(self._serve, conn, name="stalling-proxy-conn")

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
                    self.closed.wait()  # read it all, answer nothing
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
                    self.closed.wait()  # the rest never comes
                    return
                conn.sendall(head.encode() + data)
        except OSError:
            return
        finally:
            up.close()
            conn.close()


def _read_body(f: BinaryIO, headers: dict[str, str], slow: bool = False) -> bytes:
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

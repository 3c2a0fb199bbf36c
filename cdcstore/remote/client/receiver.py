"""Range bodies received straight into place: HTTP/1.1 range GETs over kept-alive
connections whose body bytes the kernel copies into the caller's buffers (an asyncio
`BufferedProtocol`: `recv_into` the destination), with no intermediate buffer, no
per-piece bytes objects and no second copy.

This is the cold read's fast path: it takes a plain `206` answer whose `Content-Range` and
`Content-Length` are exactly the range asked for, over `http://`. `call` is the same path for a
small request (a GET, or a POST with its body in memory) whose answer has a Content-Length: the
metadata a stream reads before its first batch, with no aiohttp in the process (importing it costs
a cold process about 0.1 s, its SSL contexts included).
An error answer (4xx or 5xx with a Content-Length of at most 64 KiB) is returned
with its body for the caller to translate, never asked again: a server may change
its state when it answers (a replica forgets a pack it found gone, and the same
request then gets another error). Anything else (a 200 that ignored the range, a
redirect, a chunked or encoded body, a refused or dropped connection, a header
block over 64 KiB, a body longer or shorter than asked) is `Unserved`: the caller
sends the request again through its full client (aiohttp), which retries and fails
over. A connection that was idle in the pool and is found closed before
any answer is tried once more on a new connection (a server's keep-alive timeout).
"""
from __future__ import annotations

import asyncio
import re
import urllib.parse

MAX_HEAD = 64 * 1024  # an answer's status line and headers: longer is not a cdcstore server
MAX_ERROR_BODY = 64 * 1024  # an error answer's body, kept for the caller to translate
_CRLF2 = b"\r\n\r\n"
_SAFE_TARGET = re.compile(r"[A-Za-z0-9._~/%:@!$&'()*+,;=?-]+")  # a request target needing no quoting
_UNSAFE_VALUE = re.compile(r"[\r\n\x00]")  # would end a header line early


class Unserved(Exception):
    """The fast path did not deliver the range; send the request through the full client."""


class Stalled(Unserved):
    """No byte arrived for the idle timeout, or the answer came slower than the minimum rate."""


MIN_RATE = 1024 * 1024  # bytes/s: an answer slower than this past the idle timeout is a stall (as the full client's)


class _Conn(asyncio.BufferedProtocol):
    """One kept-alive connection receiving one answer at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._head = bytearray()
        self._scratch = bytearray(MAX_HEAD)
        self._views: list[memoryview] = []
        self._done: asyncio.Future | None = None
        self.headers: dict[str, str] = {}
        self.status = 0
        self.error_body: bytearray | None = None  # an error answer's body (`Receiver.get`)
        self.body: bytearray | None = None  # a call's answer (`Receiver.call`)
        self._collect = 0  # a call: the longest answer taken (0: a range)
        self._error_want = 0
        self.got = 0  # body bytes so far
        self.head_bytes = 0
        self.sent = 0  # bytes of the request
        self._want = 0
        self._k = self._pos = 0  # the view being filled, and the place in it
        self._in_body = False
        self.progress = 0.0  # loop time of the last byte received

    # -- asyncio callbacks (loop thread) ---------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._done is not None and not self._done.done():
            self._done.set_exception(Unserved(f"connection lost: {exc or 'closed by the server'}"))

    def eof_received(self):
        return False  # close the transport: an answer cut short is unserved

    def get_buffer(self, sizehint: int):
        if self._in_body and self.error_body is None and self._k < len(self._views):
            return self._views[self._k][self._pos:]
        return self._scratch  # the head, or bytes past the body (a protocol error, seen below)

    def buffer_updated(self, nbytes: int) -> None:
        if self._done is None or self._done.done():
            self._fail(Unserved("bytes arrived with no request waiting"))
            return
        self.progress = asyncio.get_running_loop().time()
        if not self._in_body:
            self._head += self._scratch[:nbytes]
            self._parse_head()
            return
        if self.error_body is not None:
            self._error_bytes(self._scratch[:nbytes])
            return
        if self._k >= len(self._views):
            self._fail(Unserved("a longer body than its Content-Length"))
            return
        self._advance(nbytes)

    # -- one answer ------------------------------------------------------------------------------
    def begin(self, views: list[memoryview], collect: int = 0) -> asyncio.Future:
        self._collect = collect
        self.body = None
        self._views = [v for v in views if len(v)]
        self._want = sum(len(v) for v in self._views)
        self._k = self._pos = self.got = self.status = self.head_bytes = 0
        self._head = bytearray()
        self._in_body = False
        self.headers = {}
        self.error_body = None
        self._done = asyncio.get_running_loop().create_future()
        self.progress = asyncio.get_running_loop().time()
        return self._done

    def _parse_head(self) -> None:
        end = self._head.find(_CRLF2)
        if end < 0:
            if len(self._head) > MAX_HEAD:
                self._fail(Unserved("an answer's headers over 64 KiB"))
            return
        lines = bytes(self._head[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self._fail(Unserved(f"not an HTTP/1.x answer: {lines[0][:80]!r}"))
            return
        self.status = int(parts[1])
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                self.headers[name.strip().lower()] = value.strip()
        self.head_bytes = end + 4
        length = self.headers.get("content-length", "")
        if (400 <= self.status < 600 and length.isdigit() and int(length) <= MAX_ERROR_BODY
                and "transfer-encoding" not in self.headers):
            self._in_body, self.error_body, self._error_want = True, bytearray(), int(length)
            self._error_bytes(memoryview(self._head)[end + 4:])
            self._head = bytearray()
            return
        if self._collect:  # a call: a 2xx answer whose Content-Length is at most `collect`, read whole
            n = self._length()
            if not 200 <= self.status < 300 or n is None or n > self._collect:
                self._fail(Unserved(f"answer {self.status} of {self.headers.get('content-length', 'no')} bytes"))
                return
            self.body = bytearray(n)
            self._views, self._want = ([memoryview(self.body)] if n else []), n
        elif self.status != 206 or not self._plain_body():
            self._fail(Unserved(f"answer {self.status} {self.headers.get('content-range', '')}"))
            return
        body = memoryview(self._head)[end + 4:]
        self._head = bytearray()
        self._in_body = True
        if len(body) > self._want:
            self._fail(Unserved("a longer body than its Content-Length"))
            return
        while len(body):  # the first body bytes came with the head
            view = self._views[self._k][self._pos:]
            take = min(len(view), len(body))
            view[:take] = body[:take]
            body = body[take:]
            self._advance(take)
        if not self._want:
            self._finish()

    def _error_bytes(self, data) -> None:
        self.error_body += data
        if len(self.error_body) >= self._error_want:
            del self.error_body[self._error_want:]
            self._finish()

    def _plain_body(self) -> bool:
        return self._length() == self._want

    def _length(self) -> int | None:
        """The body's length, if it comes plain (no transfer or content encoding) with a Content-Length."""
        h = self.headers
        if "transfer-encoding" in h or h.get("content-encoding", "identity") != "identity":
            return None
        return int(h["content-length"]) if h.get("content-length", "").isdigit() else None

    def _advance(self, n: int) -> None:
        self.got += n
        self._pos += n
        if self._pos == len(self._views[self._k]):
            self._k, self._pos = self._k + 1, 0
        if self.got == self._want:
            self._finish()

    def _finish(self) -> None:
        self._views = []  # an idle connection must not keep the reader's buffers alive
        assert self._done is not None  # reached only from `buffer_updated`, which checked it
        if not self._done.done():
            self._done.set_result(None)

    def _fail(self, e: Exception) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(e)
        self.abort()

    def abort(self) -> None:
        """Drop the connection at once: no byte more is written into the views, and an answer
        still awaited is cancelled, or its failure marked as heard (its waiter may be gone:
        a cancelled read)."""
        self.closed = True
        self._views = []
        if self._done is not None:
            if not self._done.done():
                self._done.cancel()
            elif not self._done.cancelled():
                self._done.exception()
        if self.transport is not None:
            self.transport.abort()


class Receiver:
    """Kept-alive connections per server, at most `connections` answers at once; one per
    process and event loop (the owner makes it on its loop)."""

    def __init__(self, connections: int = 8) -> None:
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._slots = asyncio.Semaphore(connections)
        self.served = 0  # ranges delivered on the fast path (a test reads it)

    @staticmethod
    def serves(base: str) -> bool:
        return base.startswith("http://")

    async def get(self, base: str, path: str, start: int, end: int, into: list[memoryview],
                  headers: dict[str, str], idle_timeout: float, min_rate: float = MIN_RATE) -> _Conn:
        """Bytes [start, end) of `base + path` written across `into` (their lengths add up
        to end - start); returns the connection's record of the answer (status, headers,
        head bytes; an error answer's status and `error_body`, nothing written). Unserved
        (or Stalled: no byte for `idle_timeout`, or not all of them within `idle_timeout` plus
        their time at `min_rate`, so a drip cannot hold a read) when the fast path cannot
        deliver them."""
        url = urllib.parse.urlsplit(base)
        host, port = url.hostname or "", url.port or 80
        target = (url.path.rstrip("/") + path) or "/"
        if not _SAFE_TARGET.fullmatch(target) or any(_UNSAFE_VALUE.search(v) for v in headers.values()):
            raise Unserved("a path or header this client does not write itself")  # aiohttp quotes or refuses it
        lines = [f"GET {target} HTTP/1.1", f"Host: {url.netloc}", f"Range: bytes={start}-{end - 1}",
                 "Accept-Encoding: identity"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        conn = await self._run(host, port, request, into, 0, idle_timeout, idle_timeout + (end - start) / min_rate)
        self.served += conn.status == 206
        return conn

    async def call(self, base: str, method: str, path: str, body: bytes, headers: dict[str, str],
                   idle_timeout: float, budget: float, limit: int) -> _Conn:
        """`method` (GET or POST, `body` in memory) of `base + path`: the connection's record of the
        answer, its bytes in `body` (a 2xx answer of at most `limit` bytes) or `error_body` (an
        error answer). Unserved when this path cannot deliver it (the caller then sends it through
        its full client), Stalled past `idle_timeout` without a byte or `budget` in all."""
        url = urllib.parse.urlsplit(base)
        host, port = url.hostname or "", url.port or 80
        target = (url.path.rstrip("/") + path) or "/"
        if (method not in ("GET", "POST") or not _SAFE_TARGET.fullmatch(target)
                or any(_UNSAFE_VALUE.search(f"{k}{v}") for k, v in headers.items())):
            raise Unserved("a request this client does not write itself")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {url.netloc}", "Accept-Encoding: identity"]
        if method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        lines += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        return await self._run(host, port, request, [], max(1, limit), idle_timeout, budget)

    async def _run(self, host: str, port: int, request: bytes, into: list[memoryview], collect: int,
                   idle_timeout: float, budget: float) -> _Conn:
        """One exchange on a kept-alive connection (once more on a new one when an idle connection
        turns out closed before any answer); the connection is kept for the next after a whole
        2xx answer."""
        async with self._slots:
            for fresh in (False, True):
                conn, reused = await self._conn(host, port, fresh)
                try:
                    await self._exchange(conn, request, into, idle_timeout, budget, collect)
                except Unserved:
                    conn.abort()
                    if not reused or conn.status or conn.got:
                        raise
                    continue  # an idle connection the server had closed: once more, on a new one
                except BaseException:  # cancelled (the reader gave up): nothing more lands in `into`
                    conn.abort()
                    raise
                if (200 <= conn.status < 300 and conn.error_body is None
                        and conn.headers.get("connection", "").lower() != "close" and not conn.closed):
                    self._idle.setdefault((host, port), []).append(conn)
                else:
                    conn.abort()
                return conn
        raise AssertionError("unreachable")

    async def _conn(self, host: str, port: int, fresh: bool) -> tuple[_Conn, bool]:
        """An idle connection to (host, port) unless `fresh`, else a new one; and whether it was idle."""
        idle = self._idle.get((host, port), [])
        while idle and not fresh:
            conn = idle.pop()
            if not conn.closed:
                return conn, True
        try:
            _, conn = await asyncio.get_running_loop().create_connection(_Conn, host, port)
        except OSError as e:
            raise Unserved(f"cannot connect: {e}") from None
        return conn, False

    @staticmethod
    async def _exchange(conn: _Conn, request: bytes, into: list[memoryview], idle_timeout: float,
                        budget: float, collect: int = 0) -> None:
        done = conn.begin(into, collect)
        conn.sent = len(request)
        assert conn.transport is not None  # set by connection_made, before create_connection returned
        conn.transport.write(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        while not done.done():
            wait = min(conn.progress + idle_timeout, deadline) - loop.time()
            if wait <= 0:
                raise Stalled(f"no byte for {idle_timeout:.0f} s" if loop.time() < deadline else
                              f"{conn.got} bytes of the answer in {budget:.0f} s: under the minimum rate")
            await asyncio.wait((done,), timeout=wait)
        done.result()

    def close(self) -> None:
        """Close every idle connection (on the loop thread)."""
        for conns in self._idle.values():
            for conn in conns:
                conn.abort()
        self._idle.clear()

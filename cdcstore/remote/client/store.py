"""The HTTP client: `RemoteStore` is a `Backend` that talks to `cdcstore serve`.

The core is synchronous; `Transport` runs one aiohttp session on an event loop in
a background thread (rebuilt after a fork) and the sync methods wait on it. It
retries connection errors, 408, 429 and 5xx with exponential backoff and jitter,
honours Retry-After, gives up on a stalled transfer after a timeout, fetches a
range wanted twice at once only once, and counts requests and bytes on the wire.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import logging
import os
import random
import tempfile
import threading
from typing import TYPE_CHECKING, Callable, Iterable

from ... import runtime, settings
from ...core import ids
from ...core import treeobj
from ...core import wire
from ...core.commit import Commit
from ...core.errors import (AccessDeniedError, CdcError, ConflictError, CorruptionError, InvalidAddressError,
                            NotFoundError, RefExistsError, RemoteError, RepoNotFoundError, RevisionNotFoundError,
                            error_class)
from ...core.manifest import MAX_MANIFEST_BYTES, Manifest
from ...core.pack import PackEntry, decode_chunk
from ...core.ranges import ByteRange, lands, plan_ranges, scatter, slices
from ...core.wire import url_repo
from ...storage import memo
from ...storage.backend import Backend, BackendCapabilities
from ...storage.roles import Located, Raw, ViaRefStore
from .journal import RemoteJournal, manifests_present
from .receiver import Receiver, Stalled, Unserved
from .refs import RemoteRefs

if TYPE_CHECKING:
    import aiohttp

RETRY_STATUS = {408, 429, 500, 502, 503, 504}  # never 507 (disk full): a retry cannot help
REFUSED_RETRIES = 2  # a refused connection means no server: retry quickly, then say so
RANGE_BYTES = 8 * 1024 * 1024  # a read's ranges: large, yet many at once over the 8 connections
ADMIN_TIMEOUT = 24 * 3600.0  # seconds an admin command may run before the client gives up
#: Seconds a request may wait on a server that sends nothing, all its attempts together (plus the time
#: its body and expected answer take at `min_rate`); $CDCSTORE_TIMEOUT or `timeout=` set it.
DEFAULT_TIMEOUT = 30.0
ENV_TIMEOUT = settings.TIMEOUT.name
#: The longest answer the client accepts to any request but a range (a range: exactly its length). The
#: largest honest one is a 64 MiB manifest with its chunks' locations (about 215 MiB).
MAX_ANSWER_BYTES = 256 * 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024  # an error answer is read this far at most (its message is in the first bytes)
BUNDLES_KEPT = 1 << 18  # manifest -> server-side bundle pointers a RemoteStore keeps for its commits
MEMO_OBJECTS = 256  # (x16) trees a RemoteStore made keeps for its commits (objects read: storage/memo.py)
NOTE_AFTER = 1.0  # seconds: a retry waiting this long is logged (the CLI prints it unless -q)
log = logging.getLogger("cdcstore.client")


def _aiohttp():
    """aiohttp, imported when a request first needs the full client (about 0.1 s of a cold process,
    its SSL contexts included): a stream's reads over `http://` never do (`Transport._light`)."""
    import aiohttp
    return aiohttp


def _refused(e: BaseException) -> bool:
    """A connection refused (nothing listens on the port), as opposed to a timeout or reset."""
    aiohttp = _aiohttp()
    return isinstance(e, aiohttp.ClientConnectorError) and isinstance(e.os_error, ConnectionRefusedError)
ENV_TOKEN = settings.TOKEN.name
UPLOAD_PREFIX = "cdcstore-upload-"  # + "<pid>-": temp packs, removable once that pid is gone


def clean_upload_temps(tmpdir: str | None = None) -> int:
    """Remove temp pack files that processes which died mid-push left behind."""
    tmpdir = tmpdir or tempfile.gettempdir()
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(tmpdir):
            pid = name[len(UPLOAD_PREFIX):].split("-", 1)[0] if name.startswith(UPLOAD_PREFIX) else ""
            if pid.isdigit() and runtime.dead_elsewhere(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(tmpdir, name))
                    removed += 1
    return removed


def _header_bytes(headers) -> int:
    return sum(len(k) + len(v) + 4 for k, v in headers.items()) + 2


def _map_error(status: int, body: bytes, what: str, base: str = "", native_port: str | None = None) -> Exception:
    """The exception for an error answer: by the body's `code` (protocol 1.2), else by status."""
    if body.lstrip().startswith(b"<?xml") and b"<Error>" in body:  # S3's error document
        return _s3_answer(what, base, native_port)
    try:
        doc = json.loads(body)
        message, code = doc["error"], doc.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, code = body[:200].decode("utf-8", "replace") or f"HTTP {status}", None
    if status == 507 or code == "disk_full":  # never retried: waiting does not free space
        return RemoteError(f"{what}: the server's disk is full (507): {message}")
    if (status, message) == (404, "Not Found"):  # the router's own answer, not a missing object's
        return _no_route(what, base, message)
    cls = error_class(code) if isinstance(code, str) else None
    if cls is not None and cls is not RemoteError:
        return cls(message)
    if code is None:
        return _map_legacy(status, message, what)
    if status in (401, 403):
        return AccessDeniedError(message)
    if status == 404:
        return NotFoundError(message)
    return RemoteError(f"{what}: server answered {status}: {message}")


def _s3_answer(what: str, base: str, native_port: str | None) -> RemoteError:
    """`base` answered as an S3 endpoint: cdcstore's S3 gateway (`serve --s3-port`, which names
    the API's port in a header), or another S3 service; one line with the URL to use."""
    import urllib.parse
    if native_port and native_port.isdigit():
        parts = urllib.parse.urlsplit(base)
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        return RemoteError(f"{what}: {base} is the S3 gateway port of `cdcstore serve`, not its API: use "
                           f"{parts.scheme}://{host}:{native_port}")
    return RemoteError(f"{what}: {base} answers as an S3 endpoint, not as cdcstore's API: give the URL "
                       f"`cdcstore serve` printed (http://HOST:PORT/v1); for a bucket, s3://BUCKET/PREFIX")


def _no_route(what: str, base: str, message: str) -> NotFoundError:
    """A 404 of the router itself: the URL names no cdcstore API (or an older server lacks a route)."""
    return NotFoundError(f"{what}: the server at {base} has no such route ({message}): give the URL "
                         f"`cdcstore serve` printed (http://HOST:PORT/v1, or just http://HOST:PORT)")


def _map_legacy(status: int, message: str, what: str) -> Exception:
    """Servers before protocol 1.2 send no code: the status, and for 404 and 409 the message."""
    if status in (401, 403):
        return AccessDeniedError(message)
    if status == 404:
        if message.startswith("no repo"):
            return RepoNotFoundError(message)
        if message.startswith(("no branch", "no tag", "no commit", "revision ")):
            return RevisionNotFoundError(message)
        return NotFoundError(message)
    if status == 409 and "already exists" in message:
        return RefExistsError(message)
    if status == 409 and "moved" in message:
        return ConflictError(message)
    if status == 422:
        return CorruptionError(message)
    return RemoteError(f"{what}: server answered {status}: {message}")


def replica_urls(url: str) -> list[str]:
    """The server URLs of "http://a:1,http://b:2" (replicas over one bucket), in order; the
    URL `cdcstore serve` prints (`http://HOST:PORT/v1`) is the same server."""
    bases = [_server_base(u) for u in url.split(",") if u.strip()]
    if not bases or not all(b.startswith(("http://", "https://")) and _parses(b) for b in bases):
        raise InvalidAddressError(f"bad server address {url!r}: give one URL, or several replicas' URLs "
                                  f"separated by commas (http://host-a:8765,http://host-b:8765; an IPv6 "
                                  f"host in brackets: http://[::1]:8765)")
    return bases


def _server_base(url: str) -> str:
    """One server URL without a trailing slash or API prefix (`wire.API`, which requests add)."""
    base = url.strip().rstrip("/")
    return base[:-len(wire.API)] if base.endswith(wire.API) else base


def _parses(url: str) -> bool:
    """Whether `url` has a host and, if any, a port that a client can use (`http://[::1` has not)."""
    import urllib.parse
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return False
    return bool(parts.hostname)


async def _read_body(resp: aiohttp.ClientResponse, limit: int, what: str, base: str, truncate: bool = False) -> bytes:
    """A response body of at most `limit` bytes: a longer one (by its Content-Length, or as it
    arrives) is refused before it is held, or with `truncate` cut at `limit` (the rest unread)."""
    if resp.method == "HEAD":  # its Content-Length is the resource's, and no body follows
        return b""
    if resp.content_length is not None and resp.content_length > limit and not truncate:
        raise RemoteError(f"{what}: the server at {base} answered {resp.content_length} bytes, more than "
                          f"the {limit} expected: it is not a cdcstore server, or it is damaged")
    out = bytearray()
    async for piece in resp.content.iter_any():
        if len(out) + len(piece) > limit:
            if truncate:
                out += piece[:limit - len(out)]
                resp.close()  # the rest is not read: this connection cannot be reused
                break
            resp.close()
            raise RemoteError(f"{what}: the server at {base} answered more than the {limit} bytes expected: "
                              f"it is not a cdcstore server, or it is damaged")
        out += piece
    return bytes(out)


async def _read_into(resp: aiohttp.ClientResponse, into: list[memoryview]) -> int:
    """A response body written as it arrives into the views of `into`, one after another
    (a scatter list); it must fill them exactly."""
    total = sum(len(v) for v in into)
    if resp.content_length is not None and resp.content_length != total:
        raise CorruptionError(f"range answer of {resp.content_length} bytes: wanted {total}")
    n = k = pos = 0  # bytes so far; the view being filled and the position in it
    async for piece in resp.content.iter_any():
        if n + len(piece) > total:
            resp.close()
            raise CorruptionError(f"long range answer: wanted {total} bytes, got more")
        n += len(piece)
        rest = memoryview(piece)
        while rest:
            view = into[k]
            take = min(len(view) - pos, len(rest))
            view[pos:pos + take] = rest[:take]
            rest = rest[take:]
            pos += take
            if pos == len(view):
                k, pos = k + 1, 0
    if n != total:
        raise CorruptionError(f"short range read: wanted {total} bytes, got {n}")
    return n


def _scatter_copy(data, into: list[memoryview]) -> None:
    """`data` written across the views of `into`, in order."""
    at = 0
    for view in into:
        view[:] = data[at:at + len(view)]
        at += len(view)


class Transport:
    def __init__(self, url: str, token: str | None = None, *, timeout: float | None = None, retries: int = 6,
                 backoff: float = 0.25, max_backoff: float = 20.0, connections: int = 8,
                 min_rate: float = 1024 * 1024, direct_receive: bool = True):
        self.bases = replica_urls(url)  # replicas of one store: a request fails over to the next
        self._current = 0
        self.token = token
        self.timeout = _timeout(timeout)  # seconds a stalled request waits, all attempts together
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.connections = connections
        self.min_rate = min_rate  # bytes/s below which a transfer counts as stalled
        self.direct_receive = direct_receive  # ranges received straight into place (remote/client/receiver.py)
        self.requests = self.sent_bytes = self.received_bytes = 0
        self.store_location: str | None = None  # the store's location: the store id each answer names is noted for it
        self._here = runtime.Local()  # this process's loop (its session and flights are per process too)
        self._lock = runtime.Lock()

    # -- loop thread, per process --------------------------------------------------------------
    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            return self._here.get(self._start)  # the runtime's loop of this process (a fork gets its own)

    def _start(self) -> asyncio.AbstractEventLoop:
        self._loop = runtime.loop()
        atexit.register(self.close)
        self._session: aiohttp.ClientSession | None = None
        self._receiver: Receiver | None = None
        self._flights: dict = {}
        return self._loop

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self._ensure())

    def run(self, coro):
        return self.submit(coro).result()

    def close(self) -> None:
        with self._lock:
            if self._here.here() is None:
                return
            self._here.clear()
        if self._receiver is not None:
            self._loop.call_soon_threadsafe(self._receiver.close)
            self._receiver = None
        if self._session is not None:  # the loop is the runtime's: it keeps running
            asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(timeout=10)
            self._session = None

    @property
    def base(self) -> str:
        """The replica that requests go to now."""
        return self.bases[self._current]

    def fail_over(self, base: str) -> bool:
        """After `base` failed at the connection level, send requests to the next replica
        (unless another request moved on already); False with a single server."""
        if len(self.bases) == 1:
            return False
        if self.base == base:
            self._current = (self._current + 1) % len(self.bases)
            log.info("server %s failed: trying replica %s", base, self.base)
        return True

    def counters(self) -> dict:
        return {"requests": self.requests, "sent_bytes": self.sent_bytes, "received_bytes": self.received_bytes}

    @property
    def direct_ranges(self) -> int:
        """Ranges this process received straight into place (the fast path of `get_range_into`)."""
        return self._receiver.served if self._here.here() is not None and self._receiver is not None else 0

    # -- requests --------------------------------------------------------------------------------
    async def _get_session(self) -> aiohttp.ClientSession:
        """The session, made anew when there is none or `close` closed it (a reader thread may go
        on after another thread closed the store: what it needs is reopened)."""
        aiohttp = _aiohttp()
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, self.timeout),
                                              sock_read=self.timeout))
        return self._session

    def _attempt_timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        """aiohttp's own timeouts for one attempt: the attempt's whole budget between two reads
        (`request` bounds the attempt as a whole)."""
        return _aiohttp().ClientTimeout(total=None, sock_connect=min(10.0, seconds), sock_read=seconds)

    def delay(self, attempt: int) -> float:
        """Exponential backoff with jitter."""
        return min(self.max_backoff, self.backoff * 2 ** attempt) * (0.5 + random.random())

    async def request(self, method: str, path: str, *, body: bytes | None = None, body_path: str | None = None,
                      headers: dict | None = None, ok=(200, 201, 206), landed=None,
                      into: list[memoryview] | None = None, timeout: float | None = None,
                      expect: int | None = None, limit: int = MAX_ANSWER_BYTES) -> tuple[int, bytes]:
        """One request with retries; returns (status, body) or raises a mapped error.

        `landed`, for uploads: a coroutine asked before each retry whether the
        previous attempt took effect after all (then the body is not sent again).
        `into`, for a range: a 206 answer's body is written there as it arrives (no
        copy of its own; the body returned is then empty) and must fill it exactly. `expect`, for
        a range: its length; a longer answer is refused (any other answer: past `limit`).
        A server that sends nothing is given `timeout` seconds in all (plus the time the body and
        the expected answer take at `min_rate`), whatever the retries: then RemoteError."""
        retries = self.retries
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        size = len(body) if body is not None else (os.path.getsize(body_path) if body_path else 0)
        budget = (self.timeout if timeout is None else timeout) + (size + (expect or 0)) / self.min_rate
        if body_path is None and landed is None and into is None and timeout is None:
            light = await self._light(method, path, body or b"", h, ok, limit, budget)
            if light is not None:
                return light
        aiohttp = _aiohttp()
        stalled = 0.0  # seconds spent in attempts that timed out
        loop = asyncio.get_running_loop()
        what = f"{method} {path}"
        refused = 0
        retries += len(self.bases) - 1  # one more try per extra replica
        for attempt in range(retries + 1):
            delay = None
            if attempt and landed is not None and await landed():
                return 200, b""
            base = self.base
            session = await self._get_session()
            try:
                fh = open(body_path, "rb") if body_path else None
                data = fh if fh is not None else body
                began = loop.time()
                try:
                    async with asyncio.timeout(budget - stalled):
                        async with session.request(method, base + path, data=data, headers=h,
                                                   timeout=self._attempt_timeout(budget - stalled)) as resp:
                            if into is not None and resp.status == 206:
                                payload, got = b"", await _read_into(resp, into)
                            else:
                                most = MAX_ERROR_BYTES if resp.status not in ok else \
                                    expect if expect is not None and resp.status == 206 else limit
                                payload = await _read_body(resp, most, what, base, truncate=resp.status not in ok)
                                got = len(payload)
                            self.requests += 1
                            self._note_store(resp.headers.get(wire.STORE_HEADER))
                            self.sent_bytes += size + _header_bytes(resp.request_info.headers) + len(what) + 12
                            self.received_bytes += got + sum(
                                len(k) + len(v) + 4 for k, v in resp.raw_headers) + 17
                            if resp.status in ok:
                                return resp.status, payload
                            if resp.status not in RETRY_STATUS or attempt == retries:
                                raise _map_error(resp.status, payload, what, base,
                                                 resp.headers.get(wire.NATIVE_PORT_HEADER))
                            reason = "server busy" if resp.status == 429 else f"server answered {resp.status}"
                            retry_after = resp.headers.get("Retry-After")
                            if retry_after and retry_after.strip().isdigit():
                                delay = min(float(retry_after), self.max_backoff * 3)
                finally:
                    if fh is not None:
                        fh.close()
            except aiohttp.ClientResponseError as e:  # an answer aiohttp could not parse: not HTTP at all
                reason = (e.message or "").strip().splitlines()[0][:120] if e.message else f"status {e.status}"
                raise RemoteError(f"{what}: the server at {base} gave an answer this client cannot read ({reason}): "
                                  f"it is not a cdcstore server, or something else listens on that port") from None
            except aiohttp.ClientSSLError as e:  # a scheme or certificate no retry can mend
                raise RemoteError(_tls_failure(what, base, e)) from None
            except RuntimeError as e:  # another thread closed the session under this request: a new one
                if "closed" not in str(e) or attempt == retries:
                    raise
                reason, delay = "the session was closed meanwhile", 0.0
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as e:
                failed_over = self.fail_over(base)  # every request of the protocol is idempotent
                if isinstance(e, TimeoutError):
                    stalled = 0.0 if failed_over else stalled + loop.time() - began  # a replica: its own budget
                    if stalled >= budget * 0.99 or (failed_over and attempt == retries):
                        raise _stalled(what, base, budget) from None
                if _refused(e):
                    refused += 1
                    if refused > REFUSED_RETRIES * len(self.bases) or attempt == retries:
                        where = ", ".join(self.bases)
                        raise RemoteError(f"cannot connect to {where}: connection refused; "
                                          f"is `cdcstore serve` running there?") from None
                    delay = self.backoff * 0.4
                elif failed_over and attempt < retries:
                    delay = self.backoff * 0.4  # another replica answers at once if it is up
                elif attempt == retries:
                    kind = "timed out (stalled)" if isinstance(e, TimeoutError) else f"failed: {e}"
                    raise RemoteError(f"{what} to {base} {kind} after {attempt + 1} attempts; "
                                      f"check that `cdcstore serve` is running and reachable") from None
                reason = "timed out" if isinstance(e, TimeoutError) else type(e).__name__
            delay = self.delay(attempt) if delay is None else delay
            if delay >= NOTE_AFTER:
                log.info("retrying %s in %.1f s (%s), attempt %d of %d", what, delay, reason,
                         attempt + 2, retries + 1)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _light(self, method: str, path: str, body: bytes, headers: dict, ok, limit: int,
                     budget: float) -> tuple[int, bytes] | None:
        """A request sent on the receiver's path (`Receiver.call`: no aiohttp), as `request` answers
        it; None when that path did not deliver it (another kind of answer, a refused or dropped
        connection, an error worth a retry): `request` then sends it through the full client, which
        retries and fails over (every request of the protocol may be sent twice)."""
        base = self.base
        if not self.direct_receive or not Receiver.serves(base) or method not in ("GET", "POST"):
            return None
        if self._receiver is None:
            self._receiver = Receiver(self.connections)
        if method == "POST" and not any(k.lower() == "content-type" for k in headers):
            headers = {**headers, "Content-Type": "application/octet-stream"}  # as aiohttp sends bytes
        what = f"{method} {path}"
        try:
            conn = await self._receiver.call(base, method, path, body, headers, self.timeout, budget, limit)
        except Stalled:
            if self.fail_over(base):
                return None
            raise _stalled(what, base, budget) from None
        except Unserved as e:
            log.debug("%s to %s: %s; through the full client", what, base, e)
            return None
        payload = bytes(conn.body if conn.body is not None else conn.error_body or b"")
        self.requests += 1
        self._note_store(conn.headers.get(wire.STORE_HEADER.lower()))
        self.sent_bytes += conn.sent
        self.received_bytes += conn.head_bytes + len(payload)
        if conn.status in ok:
            return conn.status, payload
        if conn.status in RETRY_STATUS:
            return None  # `request` sends it again, with its backoff and Retry-After
        raise _map_error(conn.status, payload, what, base, conn.headers.get(wire.NATIVE_PORT_HEADER.lower()))

    def _note_store(self, sid: str | None) -> None:
        """The store id an answer names (`wire.STORE_HEADER`), noted in `meta` (a server before
        it names none; an id that is not one is ignored: heads stay keyed by the URL)."""
        if sid and self.store_location is not None:
            with contextlib.suppress(ValueError):
                memo.saw_store(self.store_location, sid)

    async def get_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a resource; a range already in flight is shared."""
        key = (path, start, end)
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = [asyncio.ensure_future(self._fetch_range(path, start, end)), 0]
            flight[0].add_done_callback(lambda t: _landed_flight(self._flights, key, flight))
        flight[1] += 1
        try:
            return await asyncio.shield(flight[0])
        finally:
            flight[1] -= 1
            if not flight[1]:  # nobody waits for it any more (a reader gave up): stop it
                flight[0].cancel()

    async def _receive(self, path: str, start: int, end: int, into: list[memoryview]) -> bool:
        """Bytes [start, end) received straight into `into` on the fast path (`remote/client/receiver.py`);
        False when it did not deliver them (the caller then sends the request through `request`)."""
        base = self.base
        if not self.direct_receive or end <= start or not Receiver.serves(base):
            return False
        if self._receiver is None:
            self._receiver = Receiver(self.connections)
        h = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            conn = await self._receiver.get(base, path, start, end, into, h, self.timeout)
        except Stalled:
            if self.fail_over(base):
                return False
            raise _stalled(f"GET {path}", base, self.timeout) from None
        except Unserved as e:
            log.debug("range %s [%d, %d) from %s: %s; through the full client", path, start, end, base, e)
            return False
        self.requests += 1
        self._note_store(conn.headers.get(wire.STORE_HEADER.lower()))
        self.sent_bytes += conn.sent
        if conn.error_body is not None:  # answered, with an error: translated, never asked again
            self.received_bytes += conn.head_bytes + len(conn.error_body)
            if conn.status in RETRY_STATUS:
                return False  # `request` retries it, with backoff
            raise _map_error(conn.status, bytes(conn.error_body), f"GET {path}")
        self.received_bytes += conn.head_bytes + end - start
        return True

    async def get_range_into(self, path: str, start: int, end: int, into: list[memoryview]) -> None:
        """Bytes [start, end) of a resource written across the views of `into` (a scatter
        list whose lengths add up to end - start), as they arrive."""
        if await self._receive(path, start, end, into):
            return
        status, data = await self.request("GET", path, headers={"Range": f"bytes={start}-{end - 1}"}, into=into,
                                          expect=end)
        if status == 200:  # server ignored the range
            data = data[start:end]
            if len(data) != end - start:
                raise CorruptionError(f"short range read from {path}: wanted {end - start} bytes, got {len(data)}")
            _scatter_copy(data, into)

    async def _fetch_range(self, path: str, start: int, end: int):
        """Bytes [start, end) of a resource, received into one buffer of that size."""
        buf = bytearray(end - start)
        if await self._receive(path, start, end, [memoryview(buf)]):
            return buf
        status, data = await self.request("GET", path, headers={"Range": f"bytes={start}-{end - 1}"},
                                          into=[memoryview(buf)] if buf else None, expect=end - start)
        if status == 206 and buf:
            return buf
        if status == 200:  # server ignored the range
            data = data[start:end]
        if len(data) != end - start:
            raise CorruptionError(f"short range read from {path}: wanted {end - start} bytes, got {len(data)}")
        return data


def _tls_failure(what: str, base: str, e: aiohttp.ClientSSLError) -> str:
    """One line for a TLS handshake that failed: what it means and the fix."""
    if "WRONG_VERSION_NUMBER" in str(e).upper():
        return (f"{what}: {base} does not speak TLS (it answers plain http): use "
                f"{base.replace('https://', 'http://', 1)}")
    reason = getattr(getattr(e, "certificate_error", None), "verify_message", None) or str(e)
    if isinstance(e, _aiohttp().ClientConnectorCertificateError):
        return (f"{what}: the certificate of {base} is not trusted ({reason}): give its CA's certificate "
                f"in SSL_CERT_FILE, or fix the server's certificate")
    return f"{what}: the TLS handshake with {base} failed ({reason}): check the URL's scheme and the server"


def _stalled(what: str, base: str, budget: float) -> RemoteError:
    return RemoteError(f"{what} to {base} timed out (stalled): no answer within {budget:.0f} s; the server "
                       f"is hung or overloaded (set {ENV_TIMEOUT}=SECONDS to wait longer)")


def _timeout(timeout: float | None) -> float:
    """`timeout`, else $CDCSTORE_TIMEOUT, else DEFAULT_TIMEOUT (seconds; positive)."""
    if timeout is None:
        timeout = settings.TIMEOUT.get(DEFAULT_TIMEOUT)
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    return float(timeout)


def _landed_flight(flights: dict, key, flight: list) -> None:
    """A range fetch finished: forget it, and mark its outcome seen (a waiter that gave up on it
    would otherwise leave "Task exception was never retrieved" on stderr)."""
    if flights.get(key) is flight:
        del flights[key]
    if not flight[0].cancelled():
        flight[0].exception()


def _batches(blobs):
    """Blobs in batches that fit one upload request (`wire.MAX_MANIFEST_BATCH_BYTES` with each
    blob's 4-byte length, at most `wire.MAX_MANIFESTS_PER_REQUEST`): manifests and trees alike."""
    batch: list[bytes] = []
    size = 0
    for data in blobs:
        if batch and (size + len(data) + 4 > wire.MAX_MANIFEST_BATCH_BYTES
                      or len(batch) == wire.MAX_MANIFESTS_PER_REQUEST):
            yield batch
            batch, size = [], 0
        batch.append(data)
        size += len(data) + 4
    if batch:
        yield batch


def _place_range(r: ByteRange, places: dict, out: memoryview, spare, stored: dict | None, keep) -> None:
    """Verify each chunk of a range received by `scatter` (a chunk that lands already sits at
    its first place in `out`; the others, and the holes, in `spare`) and copy it to its other
    places. `stored` gets each chunk's stored bytes: a landed chunk's as a view of `keep` (or
    a copy when there is none), the others' as views of `spare`."""
    pos, at = r.start, 0
    for e in r.entries:
        at += e.offset - pos  # a hole
        dest = lands(e, places)
        if dest is not None:
            raw = decode_chunk(out[dest:dest + e.raw_len], e.codec, e.raw_len, e.chunk_id)
            if stored is not None:
                stored[e.chunk_id] = keep[dest:dest + e.raw_len] if keep is not None else bytes(raw)
            rest = places[e.chunk_id][1:]
        else:
            stored_bytes = spare[at:at + e.stored_len]
            at += e.stored_len
            raw = decode_chunk(stored_bytes, e.codec, e.raw_len, e.chunk_id)
            if stored is not None:
                stored[e.chunk_id] = stored_bytes
            rest = places[e.chunk_id]
        for d, lo, hi in rest:
            out[d:d + hi - lo] = raw[lo:hi]
        pos = e.offset + e.stored_len


class _Answer(dict):
    """A server's JSON answer: a key it lacks is a RemoteError naming the request, not a KeyError."""

    def __init__(self, doc: dict, what: str):
        super().__init__(doc)
        self.what = what

    def __missing__(self, key):
        raise RemoteError(f"{self.what} lacks {key!r}: is it a cdcstore server (of a version this client knows)?")


class RemoteStore(ViaRefStore, Backend):
    """A store behind `cdcstore serve`, used exactly like a local one: chunks, packs, manifests,
    trees and commits here; its refs are `ref_store`'s (`refs.RemoteRefs`, `roles.ViaRefStore`)."""

    capabilities = BackendCapabilities(counts_requests=True, proves_possession=True, remote_admin=True,
                                       reads_into=True, bundles=True)

    def __init__(self, url: str, token: str | None = None, *, upload_concurrency: int = 4,
                 range_bytes: int = RANGE_BYTES, **transport):
        self.location = ",".join(replica_urls(url))  # one store, one name: with or without /v1
        self.range_bytes = range_bytes  # largest pack range one request asks for
        self.t = Transport(url, token if token is not None else settings.TOKEN.get(), **transport)
        self.upload_concurrency = upload_concurrency
        self.proven_chunks = 0  # chunks proved held instead of sent (another tenant stored them)
        self._uploads: list[concurrent.futures.Future] = []
        self._uploads_lock = runtime.Lock()
        self._upload_slots = threading.BoundedSemaphore(upload_concurrency)
        self._api = wire.API
        self.t.store_location = self.location
        self.scope = memo.scope(self.location, self.t.token)  # immutable objects are kept in `meta` per it
        self.legacy_trees = False  # the server predates protocol 1.5 (no tree routes)
        self.batch_trees = True  # until a server before protocol 2.1 says it has no POST .../trees/get
        self.batch_located = True  # until a server before protocol 2.3 says it has no POST .../manifests/located
        self._local_trees: dict[str, treeobj.Tree] = {}  # trees this process made (and uploaded)
        self._bundles: dict[str, str] = {}  # manifest -> the bundle the server put it in (protocol 2.2)
        self.ref_store = RemoteRefs(self)  # repos, branches, tags, and the commit that moves a branch
        clean_upload_temps()

    def _remembered(self, key: tuple, fetch):
        """An immutable object (a commit or manifest, verified against its name) fetched
        once per store and token in this process (`memo.objects`): a pinned commit never asks
        the server twice for the same thing."""
        def fetched():
            memo.count("objects_server")
            return fetch()
        return memo.objects().remembered((self.scope, *key), fetched)

    def _call(self, method: str, path: str, **kw) -> bytes:
        return self.t.run(self.t.request(method, self._api + path, **kw))[1]

    def _json(self, method: str, path: str, **kw) -> dict:
        data = self._call(method, path, **kw)
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise RemoteError(f"{method} {path}: the answer of {self.t.base} is not cdcstore JSON "
                              f"({bytes(data[:40])!r}...): is it a cdcstore server?")
        return _Answer(doc, f"{method} {path}: the answer of {self.t.base}")

    def counters(self) -> dict:
        return self.t.counters() | {"proven_chunks": self.proven_chunks}

    def health(self) -> dict:
        return self._json("GET", "/health")

    # -- chunks and packs --------------------------------------------------------------------
    def present(self, chunk_ids: list[bytes]) -> set[bytes]:
        return self._presence(dict.fromkeys(chunk_ids))

    def present_or_prove(self, chunks: dict[bytes, bytes], firsts: Iterable[bytes] = (),
                         vouched: Callable[[set[bytes]], set[bytes]] | None = None) -> set[bytes]:
        """Presence, with proof of possession: chunks this token cannot see (flagged 2, held or
        not) are proved by a keyed hash of their bytes; those the server holds (another
        tenant's) are not sent again (docs/protocol.md). `vouched` is not used: the server
        verified every chunk it holds when it received it."""
        return self._presence(dict(chunks))

    def _presence(self, chunks: dict[bytes, bytes | None]) -> set[bytes]:
        """Presence of these chunks; proved where every chunk's bytes are given."""
        out: set[bytes] = set()
        held = {k: v for k, v in chunks.items() if v is not None}
        can_prove = len(held) == len(chunks)
        step = wire.MAX_IDS_PER_REQUEST
        for width, wanted in wire.by_width(chunks).items():  # a server refuses 16-byte (v1) ids here
            headers = wire.id_headers(width) | ({wire.PROVE_HEADER: "1"} if can_prove else {})
            for i in range(0, len(wanted), step):
                batch = wanted[i:i + step]
                answer = self._call("POST", "/chunks/query", body=wire.encode_ids(batch), headers=headers)
                out |= wire.decode_presence(batch, answer)
                if can_prove:
                    out |= self._prove(held, wire.decode_to_prove(batch, answer),
                                       wire.presence_nonce(batch, answer))
        return out

    def _prove(self, chunks: dict[bytes, bytes], to_prove: list[bytes], nonce: bytes) -> set[bytes]:
        proved: set[bytes] = set()
        for j in range(0, len(to_prove), wire.MAX_PROOFS_PER_REQUEST):
            part = to_prove[j:j + wire.MAX_PROOFS_PER_REQUEST]
            proofs = [(c, wire.chunk_proof(chunks[c], nonce)) for c in part]
            flags = self._call("POST", "/chunks/prove", body=wire.encode_proofs(nonce, proofs),
                               headers=wire.id_headers(wire.ID))
            if len(flags) != len(part):
                raise CorruptionError("proof answer has the wrong length")
            proved.update(c for c, ok in zip(part, flags) if ok)
        self.proven_chunks += len(proved)
        return proved

    def begin_push(self) -> None:
        self.health()

    # -- lifecycle: push sessions and administration (remote/server/admin.py) ----------------------
    def push_session(self) -> "RemoteSession":
        """The server-side marker of this push: a gc on the server deletes nothing while it is open."""
        return RemoteSession(self)

    def journal(self):
        """The server's job journals (protocol 1.5: its job routes)."""
        return RemoteJournal(self)

    def manifests_present(self, repo: str, names: list[str]) -> set[str]:
        """The manifests the server holds, in one request per batch (none from an older server)."""
        return manifests_present(self, repo, names) or set()

    def admin(self, command: str, **options) -> dict:
        """Run gc, check, forget or delete-repo on the server's store (an admin token). A gc
        over a large store takes long: the answer may come hours later."""
        body = json.dumps({k: v for k, v in options.items() if v is not None}).encode()
        return self._json("POST", f"/admin/{command}", body=body, timeout=ADMIN_TIMEOUT,
                          headers={"Content-Type": "application/json"})

    def tmp_path(self) -> str:
        fd, path = tempfile.mkstemp(prefix=f"{UPLOAD_PREFIX}{os.getpid()}-", suffix=".pack")
        os.close(fd)
        return path

    def add_pack(self, tmp: str, name: str, entries: list[PackEntry]) -> concurrent.futures.Future:
        """Upload in the background (at most `upload_concurrency` at once); the future
        completes when the pack is stored on the server."""
        self._upload_slots.acquire()
        fut = self.t.submit(self._upload(tmp, name))
        with self._uploads_lock:
            self._uploads.append(fut)

        def done(f):
            self._upload_slots.release()
            with self._uploads_lock:  # its outcome belongs to the session that holds the future
                self._uploads.remove(f)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

        fut.add_done_callback(done)
        return fut

    async def _upload(self, tmp: str, name: str) -> None:
        """PUT a pack; before any retry, ask whether the last attempt landed after all,
        so that a pack the server already stored is never sent twice."""
        path = f"{self._api}/packs/{name}"

        async def landed() -> bool:
            status, _ = await self.t.request("HEAD", path, ok=(200, 404))
            return status == 200

        await self.t.request("PUT", path, body_path=tmp, headers={"Content-Type": "application/octet-stream"},
                             landed=landed)

    def flush(self) -> None:
        """Wait for every upload still in flight. Each caller of `add_pack` gets its own
        upload's future and learns its outcome there: a push session waits only for its
        own, so one thread's flush never hides another's uploads, nor raises its errors."""
        with self._uploads_lock:
            uploads = list(self._uploads)
        concurrent.futures.wait(uploads)

    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> dict[bytes, tuple[str, PackEntry]]:
        out: dict[bytes, tuple[str, PackEntry]] = {}
        step = wire.MAX_IDS_PER_REQUEST
        for width, wanted in wire.by_width(dict.fromkeys(chunk_ids)).items():  # v1 data: 16-byte ids
            for i in range(0, len(wanted), step):
                body = self._call("POST", f"/repos/{url_repo(repo)}/locate", body=wire.encode_ids(wanted[i:i + step]),
                                  headers=wire.id_headers(width))
                out.update(wire.decode_locations(body, width))
        return out

    def read_chunks(self, items: list[tuple[str, PackEntry]], repo: str | None = None,
                    stored: dict | None = None) -> dict[bytes, bytes]:
        """Verified chunks by id, fetched in merged range requests; `stored`, if given,
        receives each chunk's stored (compressed) bytes too (for a cache)."""
        ranges = plan_ranges(items, max_range=self.range_bytes)
        futures = {self.t.submit(self.t.get_range(f"{self._api}/repos/{url_repo(repo)}/packs/{r.pack}",
                                                  r.start, r.end)): r for r in ranges}
        out: dict[bytes, bytes] = {}
        try:
            for fut in concurrent.futures.as_completed(futures):  # verify each range while the rest arrive
                self._decode_range(futures[fut], fut.result(), out, stored)
        finally:
            for fut in futures:
                fut.cancel()
        return out

    def read_chunks_into(self, items: list[tuple[str, PackEntry]], places: dict, out: memoryview,
                         repo: str | None = None, stored: dict | None = None, keep: memoryview | None = None) -> None:
        """Verified chunks written into `out`: `places[chunk_id]` lists (dest, lo, hi),
        meaning out[dest:dest + hi - lo] = chunk[lo:hi]. Each range is one request whose
        bytes go where they belong as they arrive (`core.ranges.scatter`): a raw chunk wanted
        whole lands at its place in `out` (one copy, from the socket) and is verified there;
        compressed and partly wanted chunks go to a spare buffer, then are decoded and copied.
        `stored` receives each chunk's stored bytes (for a cache): for a landed chunk a
        view of `keep` (a read-only view of the same memory that keeps it alive), else a copy."""
        futures = {}
        for r in plan_ranges(items, max_range=self.range_bytes):
            segments, spare_len = scatter(r, places)
            spare = memoryview(bytearray(spare_len))
            views = [out[at:at + n] if in_output else spare[at:at + n] for in_output, at, n in segments]
            path = f"{self._api}/repos/{repo}/packs/{r.pack}"
            futures[self.t.submit(self.t.get_range_into(path, r.start, r.end, views))] = (r, spare)
        try:
            for fut in concurrent.futures.as_completed(futures):  # verify each range while the rest arrive
                fut.result()
                r, spare = futures[fut]
                _place_range(r, places, out, spare, stored, keep)
        finally:
            for fut in futures:
                fut.cancel()

    @staticmethod
    def _decode_range(r: ByteRange, data, out: dict, stored: dict | None) -> None:
        """Verified chunks of one fetched range into `out` (and their stored bytes into `stored`)."""
        for e, stored_bytes in slices(r, data):
            out[e.chunk_id] = decode_chunk(stored_bytes, e.codec, e.raw_len, e.chunk_id)
            if stored is not None:
                stored[e.chunk_id] = stored_bytes

    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> bytes:
        return self.read_chunks([(pack, entry)], repo)[entry.chunk_id]

    # -- manifests, commits, branches ----------------------------------------------------------
    def put_manifests(self, manifests: list[Manifest]) -> list[str]:
        names: list[str] = []

        def send(batch: list[bytes]) -> None:
            answer = self._json("POST", "/manifests", body=wire.encode_blobs(batch))
            got = answer["manifests"]
            expect = [ids.hexdigest(b) for b in batch]
            if got != expect:
                raise CorruptionError("server named the manifests differently than their hashes")
            names.extend(got)
            where = answer.get("bundles")  # a server over a bucket: its bundles (a hint; protocol 2.2)
            if isinstance(where, dict):
                self.learn_bundles((n, b) for n, b in where.items()
                                   if n in expect and isinstance(b, str) and ids.is_new_hex_id(b))

        for batch in _batches(m.encode() for m in manifests):
            send(batch)
        return names

    def learn_bundles(self, pairs) -> None:
        """Remember which server-side bundle holds a manifest (the server's answer to a put),
        for the tree entries this client writes (`bundle_of`); at most BUNDLES_KEPT."""
        for name, b in pairs:
            if b is not None:
                if len(self._bundles) >= BUNDLES_KEPT:
                    self._bundles.clear()
                self._bundles[name] = b

    def bundle_of(self, name: str) -> str | None:
        return self._bundles.get(name)

    def get_manifest(self, name: str, repo: str | None = None) -> Manifest:
        return self._remembered(("manifest", repo, name), lambda: self._fetch_manifest(name, repo))

    def _fetch_manifest(self, name: str, repo: str | None) -> Manifest:
        return self._checked_manifest(name, self._call("GET", f"/repos/{url_repo(repo)}/manifests/{name}",
                                                       limit=MAX_MANIFEST_BYTES))

    @staticmethod
    def _checked_manifest(name: str, data: bytes) -> Manifest:
        if not ids.matches(data, name):
            raise CorruptionError(f"manifest {name} from the server does not match its name")
        return Manifest.decode(data, f"manifest {name}")

    def get_manifest_located(self, name: str, repo: str | None = None) -> tuple[Manifest, dict]:
        """A manifest and where its chunks are, in one request (protocol 1.3; a server
        before it answers the manifest alone: no locations). A manifest fetched before
        costs no request and comes without locations (a reader locates as it reads)."""
        key = ("manifest", repo, name)
        kept = memo.objects().get((self.scope, *key))
        if kept is not None:
            return kept, {}
        data, found = wire.decode_located(self._call("GET", f"/repos/{url_repo(repo)}/manifests/{name}?locations=1"))
        memo.count("objects_server")
        m = self._checked_manifest(name, data)
        return self._remembered(key, lambda: m), found

    def get_manifests_located(self, names: list[str], repo: str | None = None, tail: int = 0,
                              chunks: dict[bytes, Raw] | None = None) -> dict[str, tuple[Manifest, Located]]:
        """`get_manifest_located` of many manifests, in one request per `wire.LOCATED_PER_GET` of them
        (protocol 2.3; a server before it, or a manifest it leaves out, is asked one GET each). With
        `chunks` and `tail`, the server sends the chunks that hold each file's last `tail` bytes too:
        each is checked against the id its manifest names (itself checked against its name) and put
        in `chunks`, id -> raw bytes; an answer whose bytes do not match raises CorruptionError."""
        out: dict[str, tuple[Manifest, Located]] = {}
        tail = min(tail, wire.MAX_TAIL) if chunks is not None else 0
        want = [n for n in dict.fromkeys(names)  # a manifest kept here is asked again only for its end
                if tail or memo.objects().get((self.scope, "manifest", repo, n)) is None]
        at = 0
        while self.batch_located and len(want) - at > (0 if tail else 1):  # one alone: a GET, unless with its tail
            part = want[at:at + wire.LOCATED_PER_GET]
            try:
                body = self._call("POST", f"/repos/{url_repo(repo)}/manifests/located",
                                  body=json.dumps({"manifests": part, "tail": tail}).encode(),
                                  headers={"Content-Type": "application/json"})
            except NotFoundError:  # a server before protocol 2.3 (or no such repo: asked alone, it says so)
                self.batch_located = False
                break
            answered = wire.decode_located_many(body, len(part))
            for name, (located, end) in zip(part, answered):
                if located:
                    out[name] = self._located_entry(name, repo, bytes(located), end, tail, chunks)
            at += len(answered)
        for name in dict.fromkeys(names):
            if name not in out:
                out[name] = self.get_manifest_located(name, repo)
        return out

    def _located_entry(self, name: str, repo: str | None, located: bytes, end: memoryview, tail: int,
                       chunks: dict[bytes, Raw] | None) -> tuple[Manifest, Located]:
        """One entry of a `manifests/located` answer: the manifest (checked against its name and
        remembered, as `get_manifest_located` does), its locations, and its tail's chunks checked
        into `chunks`."""
        data, found = wire.decode_located(located)
        checked = self._checked_manifest(name, data)
        memo.count("objects_server")
        m = self._remembered(("manifest", repo, name), lambda: checked)
        if end and chunks is not None:
            span = m.span(max(0, m.size - tail), m.size)
            start = m.chunk_start(span.start) if span else m.size
            if len(end) != m.size - start:
                raise CorruptionError(f"the server at {self.t.base} sent {len(end)} bytes as the end of manifest "
                                      f"{name}'s file, whose last chunks hold {m.size - start}: it is damaged "
                                      f"or not a cdcstore server")
            pos = 0
            for i in span:
                n = m.lengths[i]
                raw = bytes(end[pos:pos + n])
                if not ids.matches(raw, m.chunk_ids[i]):
                    raise CorruptionError(f"chunk {m.chunk_ids[i].hex()} (the end of manifest {name}'s file) from "
                                          f"the server at {self.t.base} does not match its id: the server's store "
                                          f"is damaged, or something between rewrites its answers")
                chunks[m.chunk_ids[i]] = raw
                pos += n
        return m, found

    # -- trees (protocol 1.5) ------------------------------------------------------------------
    def put_trees(self, trees: dict[str, treeobj.Tree]) -> None:
        """Upload trees (before the commit that names them), in batches. A server before
        protocol 1.5 has no tree route, and one before tree format 4 refuses our trees: the
        trees are then kept here and `commit` sends the commit in format 1 (its whole file
        map), from which such a server builds trees of its own format."""
        def send(batch: list[bytes]) -> None:
            if self.legacy_trees:
                return
            try:
                got = self._json("POST", "/trees", body=wire.encode_blobs(batch))["trees"]
            except NotFoundError:  # a server before protocol 1.5
                self.legacy_trees = True
                return
            except CdcError as e:  # a server before tree formats 4 and 5 (content ids) refuses them:
                if "tree format" not in str(e):  # it then gets the commit's file map and builds its own
                    raise
                self.legacy_trees = True
                return
            if got != [ids.hexdigest(b) for b in batch]:
                raise CorruptionError("server named the trees differently than their hashes")

        if len(self._local_trees) > MEMO_OBJECTS * 16:
            self._local_trees.clear()
        self._local_trees.update(trees)
        for batch in _batches(t.encode() for t in trees.values()):
            send(batch)

    def get_tree(self, name: str, repo: str | None = None) -> treeobj.Tree:
        local = self._local_trees.get(name)
        if local is not None:
            return local
        return self._remembered(("tree", repo, name), lambda: self._fetch_tree(name, repo))

    def get_trees(self, names: list[str], repo: str | None = None) -> list[treeobj.Tree]:
        """Many trees in one request (a level of a split folder; protocol 2.1), each checked against
        its name; one the answer leaves out, or a server without the route, is asked for alone."""
        want = [n for n in dict.fromkeys(names) if n not in self._local_trees]
        got: dict[str, treeobj.Tree] = {}
        for at in range(0, len(want) if self.batch_trees and len(want) > 1 else 0, wire.TREES_PER_GET):
            part = want[at:at + wire.TREES_PER_GET]
            try:
                blobs = wire.decode_blobs(self._call("POST", f"/repos/{url_repo(repo)}/trees/get",
                                                     body=json.dumps({"names": part}).encode(),
                                                     headers={"Content-Type": "application/json"}))
            except NotFoundError:  # a server before protocol 2.1
                self.batch_trees = False
                break
            except ValueError as e:
                raise CorruptionError(f"the server's answer of {len(part)} trees is damaged: {e}") from None
            if len(blobs) != len(part):
                raise CorruptionError(f"the server answered {len(blobs)} trees for {len(part)} asked")
            for name, data in zip(part, blobs):
                if data:
                    if not ids.matches(data, name):
                        raise CorruptionError(f"tree {name} from the server does not match its name")
                    tree = treeobj.Tree.decode(bytes(data), f"tree {name}")
                    got[name] = self._remembered(("tree", repo, name), lambda t=tree: t)
        return [got[n] if n in got else self.get_tree(n, repo) for n in names]

    def _fetch_tree(self, name: str, repo: str | None) -> treeobj.Tree:
        data = self._call("GET", f"/repos/{url_repo(repo)}/trees/{name}")
        if not ids.matches(data, name):
            raise CorruptionError(f"tree {name} from the server does not match its name")
        return treeobj.Tree.decode(data, f"tree {name}")

    def get_commit(self, repo: str, commit_id: str) -> Commit:
        if not ids.is_hex_id(commit_id):  # a full id only, as a local store takes it
            raise RevisionNotFoundError(f"no commit {commit_id!r} in repo {url_repo(repo)!r}")
        # kept per process: bound to this store's trees (another RemoteStore of the scope may have kept it)
        kept = self._remembered(("commit", repo, commit_id), lambda: self._fetch_commit(repo, commit_id))
        return self.bound(repo, kept)

    def _fetch_commit(self, repo: str, commit_id: str) -> Commit:
        data = self._call("GET", f"/repos/{url_repo(repo)}/commits/{commit_id}")
        if not ids.matches(data, commit_id):
            raise CorruptionError(f"commit {commit_id} from the server does not match its id")
        return self.bound(repo, Commit.decode(data, f"commit {commit_id}"))

    def totals(self) -> dict:
        return self._json("GET", "/stats")












    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.t.close()


class RemoteSession:
    """A push session on a server (a context manager): opened before the push's first presence
    query, refreshed while it runs, closed after its commit. A server without sessions (before
    protocol 1.4) protects pushes by its grace window alone: then this does nothing."""

    def __init__(self, store: RemoteStore):
        self.store, self.sid = store, None
        self._stop: Callable[[], None] | None = None

    def __enter__(self) -> "RemoteSession":
        try:
            doc = self.store._json("POST", "/sessions", body=b"{}", headers={"Content-Type": "application/json"})
        except NotFoundError:
            return self
        self.sid = doc["session"]
        self._stop = runtime.every(float(doc.get("refresh", 3600)), self._refresh, "session")
        return self

    def _refresh(self) -> None:
        self.store._call("PUT", f"/sessions/{self.sid}")

    def __exit__(self, *exc) -> None:
        if self.sid is None:
            return
        if self._stop is not None:
            self._stop()
        try:
            self.store._call("DELETE", f"/sessions/{self.sid}")
        except CdcError:  # the push is done either way; a stale session expires on the server
            pass

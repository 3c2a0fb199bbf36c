"""`cdcstore serve`: an aiohttp server over a repository (protocol v1, docs/protocol.md).

The server trusts nothing it receives: it re-hashes every chunk of every pack,
checks manifests against the chunks it holds and commits against the manifests,
caps counts and body sizes, and answers bad input with a 4xx and a JSON error.
Every bound on what a client can make it hold is in `limits.ServerLimits`: bodies are
streamed to disk or parsed in slices, answers built from the store are streamed, and
uploads and reads take slots of separate pools, of which no token holds all; past them
the answer is 429 with Retry-After. CPU work runs off the event loop.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import sqlite3
import time
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ... import runtime
from ...core import wire
from ...core.address import check_name
from ...core.errors import (BusyError, CdcError, ConflictError, CorruptionError,
                            PackMissingError, RefExistsError, RepoNotFoundError, RevisionNotFoundError)
from ...core.pack import WRITE_BUFFER
from ...storage.access import AccessRecords
from ...storage.check import rebuild_index
from ...storage.repository import Repository
from . import batches
from .auth import Auth, Scope
from .limits import Busy, ServerLimits, Slots
from .metadata import MetadataRoutes
from .packs import PackRoutes
from .refs import RefRoutes
from .routes import STORE_ROOTS, HTTPError, sanitize
from .staging import JournalSpace
from .tokens import TokenFile

log = logging.getLogger("cdcstore.server")


SERVER_THREADS = min(32, (os.cpu_count() or 1) + 4)  # blocking store work at once (asyncio's default executor size)


@dataclass
class ServerConfig:
    tokens: dict | TokenFile | None = None  # token -> {"scope", "repos", "name"}; a file: reloaded; None: open
    max_heavy: int | None = None  # sets limits.write_slots and limits.read_slots (cdcstore serve --max-heavy)
    retry_after: int = 1
    body_idle_timeout: float = 30.0  # seconds without a body byte before 408
    min_body_rate: float = 16 * 1024  # bytes/s a body must average once past the idle timeout
    maintenance_interval: float = 600.0  # seconds between temp cleanups and recoveries
    first_maintenance_idle: float = 2.0  # a bucket replica's first recovery waits for this long without requests
    presence_refresh: float = 2.0  # seconds between bucket listings that a chunks/query miss may start
    min_gc_grace: float = 3600.0  # the shortest grace window an admin's gc may ask for (remote/server/admin.py)
    limits: ServerLimits = field(default_factory=ServerLimits)  # every bound on what a client can take

    def __post_init__(self) -> None:
        if self.max_heavy is not None:
            self.limits.write_slots = self.limits.read_slots = self.max_heavy


class ClientGone(Exception):
    """The client closed the connection in the middle of its request body."""


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _disk_full(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return e.errno in DISK_FULL
    return isinstance(e, sqlite3.OperationalError) and "full" in str(e)


# the code of an error raised without a CdcError behind it (a CdcError sends its class's code)
STATUS_CODES = {400: "bad_request", 401: "access_denied", 403: "access_denied", 404: "not_found", 408: "timeout",
                409: "refused", 413: "too_large", 416: "range", 422: "corrupt", 429: "busy", 507: "disk_full",
                500: "internal"}


def _error(status: int, message: str, headers: dict | None = None, code: str | None = None) -> web.Response:
    """An error body {"error": one line, "status", "code"}; clients map `code`, never the text."""
    code = code or STATUS_CODES.get(status, "error")
    return web.json_response({"error": message, "status": status, "code": code}, status=status, headers=headers)


@web.middleware
async def errors_middleware(request: web.Request, handler):
    response = await _handle_errors(request, handler)
    if response.status >= 400 and getattr(response, "body", None) and response.content_type == "application/json":
        doc = json.loads(response.body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            doc["error"] = sanitize(doc["error"], request.app[STORE_ROOTS])
            response = _error(response.status, doc["error"], {k: v for k, v in response.headers.items()
                                                              if k.lower().startswith(("retry-after", "www-auth"))},
                              doc.get("code"))
    return response


async def _handle_errors(request: web.Request, handler):
    try:
        return await handler(request)
    except HTTPError as e:
        return _error(e.status, str(e), e.headers)
    except web.HTTPException as e:
        if e.status >= 400:
            return _error(e.status, e.reason or "error")
        raise
    except PackMissingError as e:  # a gc or repack through another replica: the client locates again
        return _error(404, str(e), code=e.code)
    except (RepoNotFoundError, RevisionNotFoundError, FileNotFoundError) as e:
        return _error(404, str(e), code=getattr(e, "code", None))
    except BusyError as e:  # e.g. a gc runs: retried by clients after Retry-After
        return _error(503, str(e), {"Retry-After": "5"}, code=e.code)
    except (ConflictError, RefExistsError) as e:
        return _error(409, str(e), code=e.code)
    except CorruptionError as e:
        return _error(422, str(e), code=e.code)
    except CdcError as e:
        return _error(400, str(e) or type(e).__name__, code=e.code)
    except (ValueError, KeyError, TypeError) as e:
        return _error(400, str(e) or type(e).__name__)
    except ClientGone as e:  # nobody reads the answer; one quiet line
        log.info("%s %s: %s", request.method, request.path, e)
        return _error(400, str(e))
    except ConnectionResetError as e:  # the client hung up mid-answer (aiohttp's ClientConnectionResetError)
        log.info("%s %s: the client hung up (%s)", request.method, request.path, type(e).__name__)
        return _error(400, "the client hung up")
    except asyncio.CancelledError:
        raise
    except Exception as e:
        if _disk_full(e):
            log.error("disk full on %s %s: %s", request.method, request.path, e)
            return _error(507, "disk full: the server has no space left to store this; "
                               "free space on the server, then push again")
        # a bug: log it, never crash, never leak a traceback
        log.exception("internal error on %s %s", request.method, request.path)
        return _error(500, f"internal error: {type(e).__name__}")


class Server:
    """What every handler shares (config, auth, slots, bodies, the store work pool, what a scoped
    token may see, ranges sent block by block, upkeep); the handlers are its role objects, each
    with its routes: `packs`, `metadata`, `refs` here, and admin, staging and the web view."""

    def __init__(self, store: Repository, config: ServerConfig):
        self.store = store
        self.config = config
        self.auth = Auth(config.tokens)
        self.limits = lim = config.limits
        self.writes = Slots("uploads", lim.write_slots, lim.write_slots_per_token)
        self.reads = Slots("reads", lim.read_slots, lim.read_slots_per_token, own=True)  # + one per token
        self.parsing = asyncio.Semaphore(lim.parse_slots)  # batches parsed at once (their bodies wait on disk)
        self.access = AccessRecords(store)  # what each token may read: only a server keeps it
        self.journals = JournalSpace(store, lim.max_journal_bytes_per_token)  # each token's job journal bytes
        self._maintenance: asyncio.Future | None = None
        self._token_watch: asyncio.Future | None = None
        self._serving, self._last_request = 0, time.monotonic()  # requests in flight; when one last ended
        self.packs, self.metadata, self.refs = PackRoutes(self), MetadataRoutes(self), RefRoutes(self)  # the handlers

    # -- requests and bodies -------------------------------------------------------------------
    async def io(self, fn, *args):
        """Blocking store work on the runtime's `server` pool (as many threads as asyncio's default
        executor would have; a forked server gets its own, like every pool)."""
        return await asyncio.get_running_loop().run_in_executor(runtime.pool("server", SERVER_THREADS), fn, *args)

    async def blocks(self, request: web.Request):
        """The request body, block by block. A client that sends nothing for
        `body_idle_timeout` seconds, or less than `min_body_rate` bytes/s on average
        once past it, gets 408 and loses its slot; one that hangs up raises ClientGone."""
        idle, rate = self.config.body_idle_timeout, self.config.min_body_rate
        loop = asyncio.get_running_loop()
        start, got = loop.time(), 0
        while True:
            try:
                async with asyncio.timeout(idle):
                    block = await request.content.readany()
            except TimeoutError:
                raise HTTPError(408, f"no request body bytes for {idle:g} s: send the body without pauses",
                                {"Connection": "close"}) from None
            except ConnectionError as e:
                raise ClientGone(f"client went away mid-body after {got} bytes ({type(e).__name__})") from None
            except (HttpProcessingError, RequestPayloadError) as e:  # e.g. a bad Content-Encoding
                raise HTTPError(400, f"request body cannot be read: {e}") from None
            if not block:
                return
            got += len(block)
            elapsed = loop.time() - start
            if elapsed > idle and got < rate * elapsed:
                raise HTTPError(408, f"request body arrives at {got / elapsed:.0f} bytes/s, under the "
                                     f"minimum of {rate:.0f} bytes/s", {"Connection": "close"})
            yield block

    async def read_body(self, request: web.Request, limit: int) -> bytes:
        """The whole request body, or a 413 past `limit` bytes."""
        if request.content_length is not None and request.content_length > limit:
            raise HTTPError(413, f"body of {request.content_length} bytes is over the limit of {limit}")
        data = bytearray()
        async for block in self.blocks(request):
            data += block
            if len(data) > limit:
                raise HTTPError(413, f"body is over the limit of {limit} bytes")
        return bytes(data)

    async def read_json(self, request: web.Request) -> dict:
        """A JSON object body; anything else (bad JSON, nesting too deep, huge numbers) is a 400."""
        try:
            doc = json.loads(await self.read_body(request, self.limits.max_json_bytes))
        except (ValueError, RecursionError) as e:
            raise HTTPError(400, f"body is not valid JSON: {str(e)[:200]}") from None
        if not isinstance(doc, dict):
            raise HTTPError(400, "body must be a JSON object")
        return doc

    @contextlib.asynccontextmanager
    async def spooled(self, request: web.Request):
        """The request body (at most `limits.max_batch_bytes`) in a temp file, removed after;
        then one of the `limits.parse_slots` that parse batches (waited for in line)."""
        limit = self.limits.max_batch_bytes
        if request.content_length is not None and request.content_length > limit:
            raise HTTPError(413, f"body of {request.content_length} bytes is over the limit of {limit}")
        tmp = self.store.tmp_path()
        try:
            size = 0
            with open(tmp, "wb", buffering=WRITE_BUFFER) as f:
                async for block in self.blocks(request):
                    size += len(block)
                    if size > limit:
                        raise HTTPError(413, f"body is over the limit of {limit} bytes")
                    f.write(block)
            async with self.parsing:
                try:
                    yield tmp
                except batches.TooLarge as e:
                    raise HTTPError(413, str(e)) from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @contextlib.contextmanager
    def slot(self, pool: Slots, request: web.Request):
        """A slot of `pool` (self.writes or self.reads) for the request's token, or 429 with
        Retry-After when all are taken or the token holds its share."""
        held = pool.take(self.auth.owner(request))
        try:
            held.__enter__()
        except Busy as e:
            raise HTTPError(429, str(e), {"Retry-After": str(self.config.retry_after)}) from None
        try:
            yield
        finally:
            held.__exit__(None, None, None)

    async def wait_read(self, request: web.Request) -> None:
        """Wait in line (up to `limits.read_wait` s) for a read slot: reads are short and
        bounded, so a crowd of readers queues here instead of retrying blindly."""
        await self.reads.wait(self.auth.owner(request), self.limits.read_wait)

    def checked_repo(self, request: web.Request, write: bool = False) -> str:
        """The route's REPO, checked as a name and against the request's token (for writing if `write`)."""
        repo = check_name("repo", request.match_info["repo"])
        self.auth.check(request, repo, write)
        return repo

    # -- what a scoped token may see -----------------------------------------------------------
    def visible(self, scope: Scope | None, chunk_ids, repos: tuple[str, ...] | None = None) -> set[bytes]:
        """The chunks among `chunk_ids` that the server holds and `scope` may learn of
        (its repos, or `repos`, reach them, or it uploaded them): nothing leaks through dedup."""
        if scope is None:
            return self.store.present(list(chunk_ids))
        return self.access.visible(chunk_ids, list(scope.repos if repos is None else repos), scope.owner)

    def refresh(self, repos, scope: Scope | None, packs: bool = True) -> None:
        """After a reach miss: learn what other replicas recorded in the bucket (packs they
        stored, commits they landed, uploads and proofs they acknowledged), so a request
        that fails here because it went to another replica than the last one succeeds."""
        if packs:
            self.store.packs.recover()
        for repo in repos:
            self.access.refresh(repo)
        if scope is not None:
            self.access.refresh_uploads(scope.owner)

    def require_visible(self, scope: Scope | None, chunk_ids: set[bytes], what: str) -> None:
        """A 403 unless a scoped token may see every chunk of `chunk_ids` (`what` names them)."""
        if scope is None or not chunk_ids:
            return
        hidden = chunk_ids - self.visible(scope, chunk_ids)
        if hidden:  # maybe uploaded or landed through another replica
            self.refresh(scope.repos, scope)
            hidden = chunk_ids - self.visible(scope, chunk_ids)
        if hidden:
            raise HTTPError(403, f"{what} names {len(hidden)} chunks that this token neither uploaded nor may "
                                 f"read (e.g. {next(iter(hidden)).hex()}): upload their packs first")

    def locate_reached(self, repo: str, wanted, scope: Scope | None) -> dict:
        """Locations of the chunks that `repo` reaches or the token uploaded: locate never
        reveals other repos' chunks."""
        found = self.store.locate(wanted)
        keep = self.access.reached(found, [repo], scope.owner if scope else None)
        if len(keep) < len(found):  # maybe landed or uploaded through another replica
            self.refresh([repo], scope, packs=False)  # store.locate listed the packs on a miss already
            keep = self.access.reached(found, [repo], scope.owner if scope else None)
        return {c: loc for c, loc in found.items() if c in keep}

    async def send_range(self, request: web.Request, start: int, stop: int, block, status: int = 206,
                         headers: dict | None = None) -> web.StreamResponse:
        """Answer bytes [start, stop) (of a pack: a 206) `limits.send_block` bytes at a time
        (`block(lo, hi)` builds each, off the event loop). A client that takes no piece for
        `send_timeout` s, or reads slower than `min_body_rate` once past it, is cut off."""
        headers = {"Content-Type": "application/octet-stream",
                   **({"Content-Range": f"bytes {start}-{stop - 1}/*"} if status == 206 else {}), **(headers or {})}
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = stop - start
        first = await self.io(block, start, min(stop, start + self.limits.send_block))
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        began, timeout, rate = loop.time(), self.limits.send_timeout, self.config.min_body_rate
        lo = start
        try:
            while lo < stop:
                hi = min(stop, lo + self.limits.send_block)
                data = first if lo == start else await self.io(block, lo, hi)
                first = None
                async with asyncio.timeout(timeout):
                    await resp.write(data)
                lo = hi
                elapsed = loop.time() - began
                if elapsed > timeout and lo - start < rate * elapsed:
                    raise TimeoutError
            await resp.write_eof()
        except TimeoutError:
            log.info("%s %s: the client read %d of %d bytes too slowly: cut off", request.method, request.path,
                     lo - start, stop - start)
            if request.transport is not None:
                request.transport.abort()
        except ConnectionError:
            pass
        except Exception as e:  # the status line is sent: the client sees a short body, never a wrong one
            log.warning("%s %s: stopped after %d bytes: %s: %s", request.method, request.path, lo - start,
                        type(e).__name__, e)
            if request.transport is not None:
                request.transport.abort()
        return resp

    # -- maintenance ---------------------------------------------------------------------------
    def maintain(self) -> None:
        """Remove temp files of dead writers and index packs that are durable but not
        indexed (a server or writer killed between the two steps)."""
        self.store.clean_tmp()
        if self.store.reach_stale():  # indexed before chunk-level reach: grant from the commits once
            log.warning("rebuilding the index once: this store predates chunk-level access records")
            rebuild_index(self.store)
        self.access.drop_deleted()  # a repo deleted through another replica: its name's reach is reset
        added = self.store.packs.recover()
        if added:
            log.warning("recovered %d packs that were durable but not indexed", added)

    async def _maintain_once(self) -> None:
        try:
            await self.io(self.maintain)
        except Exception as e:  # a full or read-only disk: serve anyway, try again next round
            log.error("maintenance failed: %s: %s", type(e).__name__, e)

    async def _maintenance_loop(self, now: bool = False) -> None:
        while True:
            if now:
                await self._until_idle(self.config.first_maintenance_idle, self.config.maintenance_interval)
            else:
                await asyncio.sleep(self.config.maintenance_interval)
            now = False
            await self._maintain_once()

    async def _until_idle(self, idle: float, most: float) -> None:
        """Return once no request has been in flight for `idle` s, or after `most` s whatever the traffic."""
        give_up = time.monotonic() + most
        while (now := time.monotonic()) < give_up:
            quiet = now - self._last_request
            if not self._serving and quiet >= idle:
                return
            await asyncio.sleep(min(max(idle - quiet, 0.05), give_up - now))

    @contextlib.contextmanager
    def serving(self):
        """Held around each request: what `_until_idle` watches."""
        self._serving += 1
        try:
            yield
        finally:
            self._serving -= 1
            self._last_request = time.monotonic()

    async def on_startup(self, app: web.Application) -> None:
        if hasattr(signal, "SIGHUP"):  # reload the tokens, never stop
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.auth.reload)
        self._token_watch = asyncio.ensure_future(self._watch_tokens())
        bucket = self.store.shared
        if not bucket:
            await self._maintain_once()  # a directory: before the first request is served
        # a bucket: a replica answers at once (reads go by location records, pushes sync at their
        # session); the listing of every pack runs in the background once the replica is idle, so a
        # new replica's first reads never wait behind it (issue 32: 99 pack GETs at 20,000 files)
        self._maintenance = asyncio.ensure_future(self._maintenance_loop(now=bucket))

    async def _watch_tokens(self) -> None:
        """Look at the tokens file every second with no request too: a bad edit is logged at once."""
        while self.auth.tokens is not None:
            await asyncio.sleep(1.0)

    async def on_cleanup(self, app: web.Application) -> None:
        if self._token_watch is not None:
            self._token_watch.cancel()
        if hasattr(signal, "SIGHUP"):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance

    # -- its own handlers ----------------------------------------------------------------------
    async def health(self, request):
        return web.json_response({"ok": True, "protocol": wire.PROTOCOL_VERSION})

    async def stats(self, request):
        """Store totals; a token limited to some repos sees only what they reach."""
        scope = self.auth.scope(request)
        if scope is None:
            return web.json_response(await self.io(self.store.totals))
        return web.json_response(await self.io(self.access.totals, list(scope.repos)))

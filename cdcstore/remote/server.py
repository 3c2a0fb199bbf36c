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

from .. import runtime
from ..core import ids, treeobj
from . import batches, wire
from .admin import Lifecycle
from .app import SERVER, STORE_ROOTS, HTTPError, sanitize
from .limits import ANONYMOUS, Busy, ServerLimits, Slots
from .staging import JournalSpace, StagingRoutes
from .tokens import TokenFile, default_name, owner_id, refusal
from .web import WebView
from .tokens import add as add_token, revoke as revoke_token  # noqa: F401 (`cdcstore token`)
from ..core.address import check_name, check_ref_name, check_write_target
from ..core.commit import Commit
from ..core.errors import (BusyError, CdcError, ConflictError, CorruptionError, InvalidAddressError, PackMissingError,
                     RefExistsError,
                     RepoNotFoundError, RevisionNotFoundError)
from ..core.manifest import MANIFEST_VERSION, Manifest
from ..core.chunker import MAX_CHUNK_BYTES
from ..core.pack import PACK_VERSION, TRAILER as PACK_TRAILER, WRITE_BUFFER, decode_chunk, pack_version, read_index
from ..storage.access import AccessRecords
from ..storage.check import rebuild_index
from ..storage.manifest_file import ManifestFile, ManifestMissing
from ..storage.objects import NotFound
from ..storage.repository import Repository, open_repository

log = logging.getLogger("cdcstore.server")


SERVER_THREADS = min(32, (os.cpu_count() or 1) + 4)  # blocking store work at once (asyncio's default executor size)
REF_KINDS = {"tags": "tag", "branches": "branch"}  # URL segment -> kind of name


def _require_new_ids(request, what: str) -> None:
    """Refuse a request about 16-byte (format-v1, xxh3) ids: dedup or a proof against such an
    id would let one token claim another's chunk by a collision."""
    header = request.headers.get(wire.ID_HEADER)
    try:
        width = wire.id_width(header)
    except ValueError as e:
        raise HTTPError(400, str(e)) from None
    if width != wire.ID:
        raise HTTPError(400, f"{what} with {width}-byte chunk ids ({wire.ID_HEADER}: {header or 'absent'}): "
                             f"{ids.LEGACY_REFUSED}")


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
    min_gc_grace: float = 3600.0  # the shortest grace window an admin's gc may ask for (remote/admin.py)
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


@dataclass(frozen=True)
class Scope:
    """A token limited to some repos: it sees chunks those repos reach and chunks it uploaded."""

    repos: tuple[str, ...]
    owner: str  # a hash of the token (tokens are never stored)


class Auth:
    """Bearer-token checks; `None` tokens means an open (loopback) server. A `TokenFile`'s
    tokens are looked up at each request: an edit of the file (a revoked token) counts
    from the next request on."""

    def __init__(self, tokens: dict | TokenFile | None):
        self._file = tokens if isinstance(tokens, TokenFile) else None
        self._tokens = None if self._file is not None else tokens

    @property
    def tokens(self) -> dict | None:
        return self._file.current() if self._file is not None else self._tokens

    def reload(self) -> None:
        """SIGHUP: read the tokens file again (a bad one keeps the tokens in force)."""
        if self._file is None:
            log.warning("SIGHUP: this server has no --tokens file to reload; it goes on serving")
        else:
            self._file.reload()

    def author(self, request: web.Request) -> str | None:
        """Who a push is by: the token's name (None on an open server: the client says)."""
        if self.tokens is None:
            return None
        token = request.headers.get("Authorization", "").strip().partition(" ")[2].strip()
        return self.grant(request).get("name") or default_name(token)

    def grant(self, request: web.Request) -> dict | None:
        tokens = self.tokens
        if tokens is None:
            return {"scope": "write", "repos": ["*"]}
        scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        grant = tokens.get(token) if token else None
        if grant is None:
            raise HTTPError(401, "missing or unknown token: pass --token or set CDCSTORE_TOKEN",
                            {"WWW-Authenticate": "Bearer"})
        return grant

    def check_admin(self, request: web.Request) -> None:
        """An admin token (an open loopback server trusts every client with everything)."""
        if self.grant(request)["scope"] != "admin" and self.tokens is not None:
            raise HTTPError(403, "this command needs a token with admin scope (gc, check, forget, delete-repo)")

    def check(self, request: web.Request, repo: str | None, write: bool) -> None:
        problem = refusal(self.grant(request), repo, write)  # the S3 gateway's writes ask it too
        if problem:
            raise HTTPError(403, problem)

    def scope(self, request: web.Request) -> Scope:
        """What a request's token may learn of: None for an open server or a "*" token
        (everything), else its repos and an owner id for the chunks it uploads."""
        g = self.grant(request)
        if "*" in g["repos"]:
            return None
        token = request.headers.get("Authorization", "").strip().partition(" ")[2].strip()
        return Scope(tuple(g["repos"]), owner_id(token))

    def owner(self, request: web.Request) -> str:
        """Who holds a slot or a session: a hash of the token (each request on an open server)."""
        if self.tokens is None:
            return f"{ANONYMOUS}{id(request)}"
        token = request.headers.get("Authorization", "").strip().partition(" ")[2].strip()
        return owner_id(token)

    def visible(self, request: web.Request, repos: list[str]) -> list[str]:
        g = self.grant(request)
        return repos if "*" in g["repos"] else [r for r in repos if r in g["repos"]]


MAX_STORED_BYTES = MAX_CHUNK_BYTES + MAX_CHUNK_BYTES // 128 + 4096  # a chunk's stored record (zstd's worst case)


class Server:
    def __init__(self, store: Repository, config: ServerConfig):
        self.store = store
        self.config = config
        self.auth = Auth(config.tokens)
        self.limits = lim = config.limits
        self.writes = Slots("uploads", lim.write_slots, lim.write_slots_per_token)
        self.reads = Slots("reads", lim.read_slots, lim.read_slots_per_token, own=True)  # + one per token
        self._parsing = asyncio.Semaphore(lim.parse_slots)  # batches parsed at once (their bodies wait on disk)
        self.access = AccessRecords(store)  # what each token may read: only a server keeps it
        self.journals = JournalSpace(store, lim.max_journal_bytes_per_token)  # each token's job journal bytes
        self._maintenance: asyncio.Future | None = None
        self._token_watch: asyncio.Future | None = None
        self._listed = float("-inf")  # when a presence miss last listed the bucket's packs
        self._serving, self._last_request = 0, time.monotonic()  # requests in flight; when one last ended

    # -- helpers -----------------------------------------------------------------------------
    async def io(self, fn, *args):
        """Blocking store work on the runtime's `server` pool (as many threads as asyncio's default
        executor would have; a forked server gets its own, like every pool)."""
        return await asyncio.get_running_loop().run_in_executor(runtime.pool("server", SERVER_THREADS), fn, *args)

    async def _blocks(self, request: web.Request):
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
        async for block in self._blocks(request):
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

    # -- handlers ------------------------------------------------------------------------------
    async def health(self, request):
        return web.json_response({"ok": True, "protocol": wire.PROTOCOL_VERSION})

    async def query_chunks(self, request):
        self.auth.check(request, None, write=True)
        _require_new_ids(request, "a presence query (dedup)")
        wanted = wire.decode_ids(await self.read_body(request, wire.MAX_IDS_PER_REQUEST * wire.ID))
        scope = self.auth.scope(request)
        held = await self.io(self._held, wanted)
        if scope is not None:  # 0 for what it may not see, held or not (X-Cdc-Prove changes nothing)
            held = await self.io(self._visible, scope, held)
        return web.Response(body=wire.encode_presence(wanted, held), content_type="application/octet-stream")

    def _held(self, wanted: list[bytes]) -> set[bytes]:
        """The chunks among `wanted` that the server holds. On a miss, packs stored through
        another replica are indexed first, at most once per `presence_refresh` seconds (a
        listing of the bucket's packs; new data always misses): between two listings a
        chunk another replica stored may answer absent and be uploaded again (dedup loss,
        never data loss)."""
        held = self.store.present(wanted)
        now = time.monotonic()
        shared = self.store.shared  # a bucket other replicas write to
        if shared and len(held) < len(wanted) and now - self._listed >= self.config.presence_refresh:
            self._listed = now
            if self.store.recover():
                held = self.store.present(wanted)
        return held

    def _visible(self, scope: Scope | None, chunk_ids, repos: tuple[str, ...] | None = None) -> set[bytes]:
        """The chunks among `chunk_ids` that the server holds and `scope` may learn of
        (its repos, or `repos`, reach them, or it uploaded them): nothing leaks through dedup."""
        if scope is None:
            return self.store.present(list(chunk_ids))
        return self.access.visible(chunk_ids, list(scope.repos if repos is None else repos), scope.owner)

    def _refresh(self, repos, scope: Scope | None, packs: bool = True) -> None:
        """After a reach miss: learn what other replicas recorded in the bucket (packs they
        stored, commits they landed, uploads and proofs they acknowledged), so a request
        that fails here because it went to another replica than the last one succeeds."""
        if packs:
            self.store.recover()
        for repo in repos:
            self.access.refresh(repo)
        if scope is not None:
            self.access.refresh_uploads(scope.owner)

    def require_visible(self, scope: Scope | None, chunk_ids: set[bytes], what: str) -> None:
        """A 403 unless a scoped token may see every chunk of `chunk_ids` (`what` names them)."""
        if scope is None or not chunk_ids:
            return
        hidden = chunk_ids - self._visible(scope, chunk_ids)
        if hidden:  # maybe uploaded or landed through another replica
            self._refresh(scope.repos, scope)
            hidden = chunk_ids - self._visible(scope, chunk_ids)
        if hidden:
            raise HTTPError(403, f"{what} names {len(hidden)} chunks that this token neither uploaded nor may "
                                 f"read (e.g. {next(iter(hidden)).hex()}): upload their packs first")

    async def prove_chunks(self, request):
        """Proof of possession (protocol 1.1), kept for older clients: a token that sees the whole
        store learns which chunks are held; a scoped one gets 0 for every pair, held or not, and
        uploads (a proof from guessed bytes would be a presence oracle: docs/protocol.md)."""
        self.auth.check(request, None, write=True)
        _require_new_ids(request, "a proof of possession")
        body = await self.read_body(request, wire.NONCE + wire.MAX_PROOFS_PER_REQUEST * (wire.ID + wire.PROOF))
        _, proofs = wire.decode_proofs(body)
        held = set()
        if self.auth.scope(request) is None:  # nothing is hidden from this token
            held = await self.io(self.store.present, [c for c, _ in proofs])
        return web.Response(body=bytes(c in held for c, _ in proofs), content_type="application/octet-stream")

    async def put_pack(self, request):
        self.auth.check(request, None, write=True)
        name = request.match_info["name"]
        if not ids.is_new_hex_id(name):
            if ids.is_hex_id(name):
                raise HTTPError(400, f"pack {name}: {ids.LEGACY_REFUSED}")
            raise HTTPError(400, f"invalid pack name {name!r}: 64 lowercase hex digits (BLAKE3-256 of its bytes)")
        limit = self.limits.max_pack_bytes
        if request.content_length is not None and request.content_length > limit:
            raise HTTPError(413, f"pack of {request.content_length} bytes is over the limit of {limit}")
        scope = self.auth.scope(request)
        with self.slot(self.writes, request):
            if await self.io(self.store.index_found_pack, name):  # already stored (a retried upload)
                if scope is None:  # nothing to prove: answered without reading the body
                    resp = web.json_response({"pack": name, "stored": False})
                    resp.force_close()  # the body left unread is not taken for the next request
                    return resp
                h, size = ids.hasher(), 0
                async for block in self._blocks(request):  # the token may show it holds every byte
                    size += len(block)
                    if size > limit:
                        raise HTTPError(413, f"pack is over the limit of {limit} bytes", {"Connection": "close"})
                    h.update(block)
                if h.hexdigest() == name:
                    await self.io(self._record_upload, scope, name, None)
                return web.json_response({"pack": name, "stored": False})
            tmp = self.store.tmp_path()
            h = ids.hasher()
            size = 0
            try:
                with open(tmp, "wb", buffering=WRITE_BUFFER) as f:  # large folios: cheap to serve
                    async for block in self._blocks(request):
                        size += len(block)
                        if size > limit:
                            raise HTTPError(413, f"pack is over the limit of {limit} bytes", {"Connection": "close"})
                        h.update(block)
                        f.write(block)
                if h.hexdigest() != name:
                    raise HTTPError(422, f"pack bytes do not match the name {name} (truncated or damaged upload)")
                async with self._parsing:  # verification holds chunks and the index: a few at once
                    entries = await self.io(self._verify_and_add, tmp, name, scope)
                count = len(entries)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return web.json_response({"pack": name, "stored": True, "chunks": count}, status=201)

    def _record_upload(self, scope: Scope, name: str, entries) -> None:
        if entries is None:
            entries = self.store.read_pack_index(name)
        self.access.record_upload(scope.owner, [e.chunk_id for e in entries])

    def _verify_and_add(self, tmp: str, name: str, scope: Scope | None = None) -> list:
        """Verify an uploaded pack, record the token's upload, then make the pack durable:
        in that order, a pack that a retry finds stored (HEAD, after a replica died mid-PUT)
        was granted to its uploader already."""
        with open(tmp, "rb") as f:
            if (version := pack_version(f)) != PACK_VERSION:  # v1 ids are xxh3 ones, which can be collided
                raise HTTPError(400, f"uploaded pack {name} is format v{version}: {ids.LEGACY_REFUSED}")
            size = os.fstat(f.fileno()).st_size
            if size >= PACK_TRAILER.size:  # the index is parsed whole: its size is bounded first
                f.seek(size - PACK_TRAILER.size)
                count = PACK_TRAILER.unpack(f.read(PACK_TRAILER.size))[0]
                if count > self.limits.max_pack_chunks:
                    raise HTTPError(413, f"uploaded pack {name} holds {count} chunks; this server's limit is "
                                         f"{self.limits.max_pack_chunks} per pack: push with smaller packs")
            entries = read_index(f, size, f"uploaded pack {name}")
            for e in entries:  # BLAKE3 each chunk; a record never larger than a chunk can be stored
                if e.stored_len > MAX_STORED_BYTES:
                    raise HTTPError(422, f"uploaded pack {name} has a record of {e.stored_len} bytes, over the "
                                         f"format's maximum of {MAX_STORED_BYTES}")
                f.seek(e.offset)
                decode_chunk(f.read(e.stored_len), e.codec, e.raw_len, e.chunk_id, e.check)
        if scope is not None:
            self._record_upload(scope, name, entries)
        self.store.add_pack(tmp, name, entries)
        return entries

    async def head_pack(self, request):
        self.auth.check(request, None, write=True)
        name = request.match_info["name"]
        exists = ids.is_hex_id(name) and await self.io(self.store.index_found_pack, name)
        return web.Response(status=200 if exists else 404)

    @contextlib.asynccontextmanager
    async def _spooled(self, request: web.Request):
        """The request body (at most `limits.max_batch_bytes`) in a temp file, removed after;
        then one of the `limits.parse_slots` that parse batches (waited for in line)."""
        limit = self.limits.max_batch_bytes
        if request.content_length is not None and request.content_length > limit:
            raise HTTPError(413, f"body of {request.content_length} bytes is over the limit of {limit}")
        tmp = self.store.tmp_path()
        try:
            size = 0
            with open(tmp, "wb", buffering=WRITE_BUFFER) as f:
                async for block in self._blocks(request):
                    size += len(block)
                    if size > limit:
                        raise HTTPError(413, f"body is over the limit of {limit} bytes")
                    f.write(block)
            async with self._parsing:
                try:
                    yield tmp
                except batches.TooLarge as e:
                    raise HTTPError(413, str(e)) from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    async def put_manifests(self, request):
        self.auth.check(request, None, write=True)
        with self.slot(self.writes, request):
            async with self._spooled(request) as path:
                batch = batches.ManifestBatch(self, path, self.auth.scope(request))
                names = await self.io(batch.run)
        return web.json_response({"manifests": names})

    def add_manifests(self, blobs: list[bytes], scope: Scope | None = None) -> list[str]:
        """Decode, check (`require_named`) and store uploaded manifests; their names."""
        manifests = [Manifest.decode(b, "uploaded manifest") for b in blobs]
        if any(m.version != MANIFEST_VERSION for m in manifests):
            raise HTTPError(400, f"a format-v1 manifest was uploaded: {ids.LEGACY_REFUSED}")
        self.require_named(scope, list({c for m in manifests for c in m.chunk_ids}))
        return self.store.put_manifests(manifests)

    def require_named(self, scope: Scope | None, chunk_ids: list[bytes]) -> None:
        """The chunks a manifest names must be ones the token may see (403 for a scoped token,
        whether the server holds them or not: one answer, no presence oracle) and held (409)."""
        if scope is not None:
            self.require_visible(scope, set(chunk_ids), "a manifest")  # what it may see is held
            return
        missing = set(chunk_ids) - self.store.present(chunk_ids)
        if missing and self.store.recover():  # packs stored through another replica
            missing -= self.store.present(list(missing))
        if missing:
            raise HTTPError(409, f"{len(missing)} chunks named by the manifests are not on the server "
                                 f"(e.g. {next(iter(missing)).hex()}): upload their packs first")

    async def put_trees(self, request):
        """Trees (protocol 1.5), checked for their format; a commit naming them checks the rest."""
        self.auth.check(request, None, write=True)
        with self.slot(self.writes, request):
            async with self._spooled(request) as path:
                names = await self.io(self._add_trees, path)
        return web.json_response({"trees": names})

    def _add_trees(self, path: str) -> list[str]:
        names = []
        for group in batches.tree_groups(path, self.limits):
            trees = {}
            for b in group:
                try:
                    trees[ids.hexdigest(b)] = treeobj.Tree.decode(b, "uploaded tree")
                except CorruptionError as e:
                    raise HTTPError(400, str(e)) from None
                names.append(ids.hexdigest(b))
            self.store.put_trees(trees)
        return names

    async def get_tree(self, request):
        repo = self.checked_repo(request)
        name = request.match_info["name"]
        if not ids.is_hex_id(name) or not await self.io(self._reaches, repo, name, "tree"):
            raise HTTPError(404, f"no tree {name} in repo {repo!r}")
        try:
            body = await self.io(self.store.tree_bytes, name)
        except NotFound:
            raise HTTPError(404, f"tree {name} is missing on the server: run `cdcstore check` there") from None
        return web.Response(body=body, content_type="application/json")

    async def list_repos(self, request):
        repos = await self.io(self.store.repos)
        return web.json_response({"repos": self.auth.visible(request, repos)})

    async def branches(self, request):
        repo = self.checked_repo(request)
        return web.json_response({"branches": await self.io(self.store.branches, repo)})

    async def forgotten(self, request):
        """The repo's forgotten commits (`forget`): history whose files are not kept."""
        repo = self.checked_repo(request)
        return web.json_response({"forgotten": sorted(await self.io(self.store.forgotten, repo))})

    async def resolve(self, request):
        repo = self.checked_repo(request)
        rev = check_name("revision", request.match_info["rev"])
        cid, kind = await self.io(self.store.resolve_ref, repo, rev)
        return web.json_response({"commit": cid, "kind": kind})

    async def tags(self, request):
        repo = self.checked_repo(request)
        return web.json_response({"tags": await self.io(self.store.tags, repo)})

    async def _ref_doc(self, request) -> tuple[str, str]:
        doc = await self.read_json(request)
        if not isinstance(doc.get("name"), str) or not isinstance(doc.get("commit"), str):
            raise HTTPError(400, 'expected a JSON object {"name": NAME, "commit": COMMIT_ID}')
        if not ids.is_hex_id(doc["commit"]):
            raise HTTPError(400, f"invalid commit id {doc['commit']!r}: 64 lowercase hex digits (32 for format v1)")
        return doc["name"], doc["commit"]

    async def create_ref(self, request):
        repo = self.checked_repo(request, write=True)
        kind = REF_KINDS[request.match_info["kind"]]
        name, cid = await self._ref_doc(request)
        check_ref_name(kind, name)
        await self.io(self.store.create_ref, repo, kind, name, cid)
        return web.json_response({kind: name, "commit": cid}, status=201)

    async def delete_ref(self, request):
        repo = self.checked_repo(request, write=True)
        kind = REF_KINDS[request.match_info["kind"]]
        name = check_name(kind, request.match_info["name"])
        cid = await self.io(self.store.delete_ref, repo, kind, name)
        return web.json_response({kind: name, "commit": cid})

    async def get_commit(self, request):
        repo = self.checked_repo(request)
        cid = request.match_info["id"]
        if not ids.is_hex_id(cid):
            raise HTTPError(400, f"invalid commit id {cid!r}")
        commit = await self.io(self.store.get_commit, repo, cid)
        return web.Response(body=commit.encode(), content_type="application/json")

    async def post_commit(self, request):
        repo = self.checked_repo(request, write=True)
        doc = await self.read_json(request)
        commit = _uploaded_commit(doc.get("commit"))
        branch = check_write_target(doc.get("branch") if isinstance(doc.get("branch"), str) else "")
        expected = doc.get("expected")
        if expected is not None and not (isinstance(expected, str) and ids.is_hex_id(expected)):
            raise HTTPError(400, '"expected" must be null or a commit id (64 lowercase hex digits, 32 for format v1)')
        if commit.repo != repo:
            raise HTTPError(400, f"commit names repo {commit.repo!r} but was sent to {repo!r}")
        author = self.auth.author(request)  # a token push is by the token, whatever the client says
        if author is not None and commit.author != author:
            if commit.tree is None:  # format 1 (an older client): landed as format 3, its trees built here
                commit = await self.io(self._as_format2, commit)
            commit = commit.with_author(author)
        cid = await self.io(self._commit, repo, commit, branch, expected, self.auth.scope(request))
        return web.json_response({"commit": cid, "rebased": cid != commit.id, "author": commit.author},
                                 status=201)

    def _parent(self, repo: str, parent) -> Commit | None:
        """The parent commit: a commit id of this repo, never a path (no file-existence oracle)."""
        if parent is None:
            return None
        if not isinstance(parent, str) or not ids.is_hex_id(parent):
            raise InvalidAddressError("commit parent must be a commit id (64 hex digits, 32 for format v1) or null")
        try:
            return self.store.get_commit(repo, parent)
        except (CdcError, OSError):
            raise InvalidAddressError(f"commit parent {parent} is not a commit of repo {repo!r}: "
                                      f"base the commit on the branch head") from None

    def _as_format2(self, commit: Commit) -> Commit:
        try:
            return self.store.as_format2(commit)
        except ValueError as e:  # a path that does not normalize, a file/folder clash
            raise HTTPError(400, f"invalid commit: {e}") from None

    def _commit(self, repo: str, commit: Commit, branch: str, expected: str | None,
                scope: Scope | None = None) -> str:
        """Check what the commit adds to its parent (its cost follows the change: trees and
        files the parent has are not read again), then store it and move the branch."""
        parent = self._parent(repo, commit.parent)
        base = self.store.view(repo, parent) if parent else None

        def load(tid: str) -> treeobj.Tree:
            try:
                return self.store.get_tree(tid)
            except CorruptionError:
                raise HTTPError(409, f"tree {tid} is not on the server: upload it first (POST /trees)") from None

        view = (treeobj.View.of_files(commit.files, load) if commit.tree is None
                else treeobj.View(load, commit.tree))

        def check_tree(path: str, tree: treeobj.Tree, entry) -> None:
            if entry is not None and (entry.size, entry.files) != (tree.size, tree.file_count):
                raise HTTPError(400, f"folder {path!r} of the commit says {entry.files} files and {entry.size} "
                                     f"bytes, but its tree holds {tree.file_count} and {tree.size}")

        changed, _ = treeobj.changes(base, view, check=check_tree)
        new_chunks: set[bytes] = set()
        sizes: dict[str, set[int]] = {}
        for f in changed.values():
            if not ids.is_hex_id(f.manifest):
                raise HTTPError(400, f"invalid manifest name {f.manifest!r}")
            sizes.setdefault(f.manifest, set()).add(f.size)
        for name, wanted in sizes.items():  # each manifest read in slices: a huge one is no memory bomb
            try:
                m = ManifestFile(self.store, name)
            except CorruptionError:
                raise HTTPError(409, f"manifest {name} is not on the server: upload it first") from None
            if wanted != {m.size}:
                raise HTTPError(400, f"a file size in the commit does not match manifest {name} ({m.size} bytes)")
            prove = scope is not None and not self.access.reaches(repo, "manifest", name)
            for chunk_ids in m.scan(self.limits.slice_chunks):  # checks its bytes against its name
                if prove:  # what the repo reaches already needs no new proof
                    new_chunks.update(chunk_ids)
                    if len(new_chunks) >= self.limits.slice_chunks:
                        self.require_visible(scope, new_chunks, "the commit")
                        new_chunks.clear()
        self.require_visible(scope, new_chunks, "the commit")  # manifest names can be guessed or learned
        return self.access.commit(commit, branch, expected)

    async def get_manifest(self, request):
        repo = self.checked_repo(request)
        name = request.match_info["name"]
        if not ids.is_hex_id(name) or not await self.io(self._reaches, repo, name):
            raise HTTPError(404, f"no manifest {name} in repo {repo!r}")
        missing = HTTPError(404, f"manifest {name} is missing on the server: run `cdcstore check` there")
        if request.query.get("locations") == "1":  # protocol 1.3: the manifest and where its chunks are
            await self.wait_read(request)
            with self.slot(self.reads, request):
                try:
                    body = await self.io(self._manifest_located, repo, name, self.auth.scope(request))
                except (NotFound, FileNotFoundError):
                    raise missing from None
                if isinstance(body, bytes):
                    return web.Response(body=body, content_type="application/octet-stream")
                return await self.send_range(request, 0, body.size, body.block, status=200)
        path = self.store.manifest_file(name)
        if path is not None:
            if not os.path.isfile(path):
                raise missing
            return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})
        try:
            body = await self.io(self.store.manifest_bytes, name)
        except NotFound:
            raise missing from None
        return web.Response(body=body, content_type="application/octet-stream")

    def _manifest_located(self, repo: str, name: str, scope: Scope | None):
        """A manifest's bytes and the locations of its first and last `LOCATED_ENDS` chunks
        that `repo` may see (what `locate` would answer): one round trip instead of two for
        a small file, and for where reads of a large one start (a scan, a Parquet footer).
        A manifest over `limits.decode_bytes` is never read whole: a `batches.LocatedBody` to stream."""
        try:
            large = ManifestFile(self.store, name)
        except ManifestMissing:
            raise NotFound(name) from None
        if large.bytes > self.limits.decode_bytes:  # never decoded whole: streamed
            found = self._locate_reached(repo, list(dict.fromkeys(large.ends(wire.LOCATED_ENDS))), scope)
            return batches.LocatedBody(large, found)
        data = large.data  # a small manifest came whole with its first read
        if data is None:
            path = self.store.manifest_file(name)
            if path is not None:
                with open(path, "rb") as f:
                    data = f.read()
            else:
                data = self.store.manifest_bytes(name)
        manifest = Manifest.decode(data, f"manifest {name}")
        self.store.load_locations(name, manifest)  # a new replica: no listing, no footers for this file
        chunks, ends = manifest.chunk_ids, wire.LOCATED_ENDS
        picked = chunks if len(chunks) <= 2 * ends else chunks[:ends] + chunks[-ends:]  # where reads start
        return wire.encode_located(data, self._locate_reached(repo, list(dict.fromkeys(picked)), scope))

    def _reaches(self, repo: str, name: str, kind: str = "manifest") -> bool:
        """Whether `repo` reaches manifest (or tree) `name`, asking the bucket on a miss (a
        commit landed through another replica)."""
        if self.access.reaches(repo, kind, name):
            return True
        if self.access.grant_if_headed(repo, name, kind):  # in a branch or tag now: no walk of the history
            return True
        self.access.refresh(repo)  # 0 when a request that ran first granted it: ask the index again
        return self.access.reaches(repo, kind, name)

    async def locate(self, request):
        repo = self.checked_repo(request)  # checks the token's access to the repo
        try:
            width = wire.id_width(request.headers.get(wire.ID_HEADER))  # reads of format-v1 data: 16
        except ValueError as e:
            raise HTTPError(400, str(e)) from None
        wanted = wire.decode_ids(await self.read_body(request, wire.MAX_IDS_PER_REQUEST * width), width)
        found = await self.io(self._locate_reached, repo, wanted, self.auth.scope(request))
        return web.Response(body=wire.encode_locations(found, width), content_type="application/octet-stream")

    def _locate_reached(self, repo: str, wanted, scope: Scope | None) -> dict:
        """Locations of the chunks that `repo` reaches or the token uploaded: locate never
        reveals other repos' chunks."""
        found = self.store.locate(wanted)
        keep = self.access.reached(found, [repo], scope.owner if scope else None)
        if len(keep) < len(found):  # maybe landed or uploaded through another replica
            self._refresh([repo], scope, packs=False)  # store.locate listed the packs on a miss already
            keep = self.access.reached(found, [repo], scope.owner if scope else None)
        return {c: loc for c, loc in found.items() if c in keep}

    async def get_pack(self, request):
        """Pack bytes. An open server or a "*" token gets the file (ranges served by aiohttp);
        a scoped token gets one range in which every byte that is not part of a chunk its
        repo reaches (or it uploaded) is zero: other repos' chunks and the footer never leave."""
        repo = self.checked_repo(request)
        name = request.match_info["name"]
        scope = self.auth.scope(request)
        if not ids.is_hex_id(name) or not await self.io(self._has_pack, name):
            raise HTTPError(404, f"no pack {name} in repo {repo!r}")
        path = self.store.pack_file(name)
        if path is not None and not os.path.isfile(path):
            raise self.store.pack_gone(name)
        if scope is None and path is not None:
            return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})
        try:
            rng = request.http_range
        except ValueError:
            rng = None
        start, stop = (rng.start, rng.stop) if rng is not None else (None, None)
        limit = self.limits.max_range_bytes
        if start is None or stop is None or start < 0 or stop <= start or stop - start > limit:
            raise HTTPError(416, f"packs of this server are read by one byte range "
                                 f"(Range: bytes=a-b, at most {limit} bytes)" if scope is None else
                                 f"a token limited to some repos reads packs by one byte range "
                                 f"(Range: bytes=a-b, at most {limit} bytes)")
        await self.wait_read(request)
        with self.slot(self.reads, request):  # built block by block: `send_block` bytes held per read
            if scope is None:  # an object store: the range is read from it and sent
                stop = await self.io(self._range_stop, name, start, stop)
                return await self.send_range(request, start, stop, lambda lo, hi: self._object_block(name, lo, hi))
            spans, stop = await self.io(self._masked_spans, repo, scope, name, start, stop)
            return await self.send_range(request, start, stop, lambda lo, hi: self._masked_block(name, spans, lo, hi))

    def _has_pack(self, name: str) -> bool:
        """Whether pack `name` is indexed, after a recovery on a miss (stored through another replica)."""
        return self.store.knows_pack(name) or (self.store.recover() > 0 and self.store.indexed_pack(name))

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

    def _range_stop(self, name: str, start: int, stop: int) -> int:
        """`stop`, clamped to the end of a pack kept in an object store."""
        try:
            size = self.store.pack_size(name)
        except NotFound:
            raise self.store.pack_gone(name) from None
        if start >= size:
            raise HTTPError(416, f"range starts past the end of pack {name}")
        return min(stop, size)

    def _object_block(self, name: str, lo: int, hi: int) -> bytes:
        try:
            return self.store.pack_range(name, lo, hi - lo)
        except NotFound:
            raise self.store.pack_gone(name) from None

    def _masked_spans(self, repo: str, scope: Scope, name: str, start: int, stop: int):
        """The byte spans of [start, stop) that `repo` may read (chunks it reaches or the token
        uploaded), and `stop` clamped to the pack's end."""
        entries = self.store.pack_chunks(name, start, stop)
        keep = self.access.reached([e.chunk_id for e in entries], [repo], scope.owner)
        if not keep and entries:  # maybe landed or uploaded through another replica
            self._refresh([repo], scope)
            keep = self.access.reached([e.chunk_id for e in entries], [repo], scope.owner)
        spans = [(max(e.offset, start), min(e.offset + e.stored_len, stop)) for e in entries if e.chunk_id in keep]
        if not spans:
            raise HTTPError(404, f"no chunk of repo {repo!r} in that range of pack {name}")
        try:
            stop = min(stop, self.store.pack_size(name))
        except NotFound:
            raise self.store.pack_gone(name) from None
        return spans, stop

    def _masked_block(self, name: str, spans: list, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of a masked range: zeros but for `spans` (sorted by offset)."""
        out = bytearray(hi - lo)
        for a, b in spans:
            a, b = max(a, lo), min(b, hi)
            if a < b:
                out[a - lo:b - lo] = self.store.read_stored(name, a, b - a)
        return bytes(out)

    # -- maintenance -------------------------------------------------------------------------
    def maintain(self) -> None:
        """Remove temp files of dead writers and index packs that are durable but not
        indexed (a server or writer killed between the two steps)."""
        self.store.clean_tmp()
        if self.store.reach_stale():  # indexed before chunk-level reach: grant from the commits once
            log.warning("rebuilding the index once: this store predates chunk-level access records")
            rebuild_index(self.store)
        self.access.drop_deleted()  # a repo deleted through another replica: its name's reach is reset
        added = self.store.recover()
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

    async def stats(self, request):
        """Store totals; a token limited to some repos sees only what they reach."""
        scope = self.auth.scope(request)
        if scope is None:
            return web.json_response(await self.io(self.store.totals))
        return web.json_response(await self.io(self.access.totals, list(scope.repos)))


def _store_id(store: Repository) -> str:
    """The id every answer names the store by (`wire.STORE_HEADER`): its `store-id`, made now for a
    store that has none; a store that cannot be written gets a stable one from its identity."""
    try:
        return store.store_id()
    except (OSError, CdcError):
        return ids.weak_hexdigest(store.identity.encode())


async def _name_store(response: web.StreamResponse, sid: str) -> None:
    response.headers[wire.STORE_HEADER] = sid


@web.middleware
async def _serving_middleware(request: web.Request, handler):
    with request.app[SERVER].serving():
        return await handler(request)


def make_app(store: Repository, config: ServerConfig | None = None) -> web.Application:
    config = config or ServerConfig()
    s = Server(store, config)
    app = web.Application(middlewares=[_serving_middleware, errors_middleware],
                          client_max_size=config.limits.max_json_bytes)
    app.on_startup.append(s.on_startup)
    app.on_cleanup.append(s.on_cleanup)
    roots = {store.location} | ({os.path.realpath(store.location)} if os.path.isdir(store.location) else set())
    app[STORE_ROOTS] = tuple(sorted(roots, key=len, reverse=True))
    app[SERVER] = s
    sid = _store_id(store)
    app.on_response_prepare.append(lambda request, response: _name_store(response, sid))
    api = wire.API
    app.add_routes([
        web.get(f"{api}/health", s.health),
        web.post(f"{api}/chunks/query", s.query_chunks),
        web.post(f"{api}/chunks/prove", s.prove_chunks),
        web.put(f"{api}/packs/{{name}}", s.put_pack),
        web.head(f"{api}/packs/{{name}}", s.head_pack),
        web.post(f"{api}/manifests", s.put_manifests),
        web.post(f"{api}/trees", s.put_trees),
        web.get(f"{api}/stats", s.stats),
        web.get(f"{api}/repos", s.list_repos),
        web.get(f"{api}/repos/{{repo}}/branches", s.branches),
        web.get(f"{api}/repos/{{repo}}/resolve/{{rev}}", s.resolve),
        web.get(f"{api}/repos/{{repo}}/forgotten", s.forgotten),
        web.get(f"{api}/repos/{{repo}}/tags", s.tags),
        web.post(f"{api}/repos/{{repo}}/{{kind:tags|branches}}", s.create_ref),
        web.delete(f"{api}/repos/{{repo}}/{{kind:tags|branches}}/{{name}}", s.delete_ref),
        web.get(f"{api}/repos/{{repo}}/commits/{{id}}", s.get_commit),
        web.post(f"{api}/repos/{{repo}}/commits", s.post_commit),
        web.get(f"{api}/repos/{{repo}}/manifests/{{name}}", s.get_manifest),
        web.get(f"{api}/repos/{{repo}}/trees/{{name}}", s.get_tree),
        web.post(f"{api}/repos/{{repo}}/locate", s.locate),
        web.get(f"{api}/repos/{{repo}}/packs/{{name}}", s.get_pack),
        *Lifecycle(s).routes(api),
        *StagingRoutes(s).routes(api),
        *WebView(s).routes(),  # the read-only web view under /ui/ (remote/web.py)
    ])
    return app


LOOPBACK = ("127.0.0.1", "::1", "localhost")


class OneLineErrors(logging.Filter):
    """aiohttp logs each malformed request with a traceback: keep one line that names it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            e = record.exc_info[1]
            text = " ".join(str(e).split())[:200]
            record.msg, record.args = f"{record.getMessage()}: {type(e).__name__}: {text}", ()
            record.exc_info = record.exc_text = None
        return True


def _uploaded_commit(text) -> Commit:
    """The commit of a POST body, fully validated (a bad one is a 400)."""
    if not isinstance(text, str):
        raise HTTPError(400, '"commit" must be the commit\'s JSON, as a string')
    try:
        return Commit.decode(text.encode(), "uploaded commit")
    except (CorruptionError, UnicodeError) as e:
        raise HTTPError(400, str(e)) from None


def serve(store_path: str, host: str, port: int, tokens_file: str | None = None,
          allow_open: bool = False, max_heavy: int | None = None, limit_items=(), s3_port: int | None = None,
          publisher=None, **limits) -> None:
    """Run the server until interrupted. Without tokens it only binds loopback,
    unless `allow_open` says otherwise explicitly. `limit_items`: NAME=VALUE overrides
    of `ServerLimits` (`cdcstore serve --limit`). `s3_port`: also serve the S3 read
    gateway (remote/gateway.py) on that port of `host`; `publisher(repository)` (publish.Publisher)
    is what its writes store and commit through (None: writes answer 501)."""
    tokens = TokenFile(tokens_file) if tokens_file else None
    if tokens is None:
        if host not in LOOPBACK and not allow_open:
            raise InvalidAddressError(
                f"refusing to serve {host} without --tokens: anyone could read and write. "
                f"Pass --tokens FILE, bind 127.0.0.1, or add --allow-no-auth to accept the risk")
    store = open_repository(store_path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiohttp.server").addFilter(OneLineErrors())
    config = ServerConfig(tokens=tokens, max_heavy=max_heavy, limits=ServerLimits.parse(limit_items), **limits)
    app = make_app(store, config)
    if s3_port is not None:
        from .gateway import listen
        from .gateway_write import writes_over
        listen(app, host, s3_port, native_port=port, writes=writes_over(publisher(store)) if publisher else None)

    def announce(_msg: str) -> None:  # run_app calls this only once it listens: bind first, announce after
        if tokens is None:
            log.warning("serving without authentication (no --tokens): anyone who can connect can write")
        print(f"cdcstore serving {store.location} on http://{host}:{port}{wire.API}", flush=True)
        print(f"cdcstore web view (read-only) on http://{host}:{port}/ui/", flush=True)

    try:
        web.run_app(app, host=host, port=port, print=announce,
                    access_log=logging.getLogger("cdcstore.access"), access_log_format='%a "%r" %s %b %Tfs')
    except OSError as e:
        if e.errno == errno.EADDRINUSE or "address already in use" in str(e):
            raise InvalidAddressError(f"port {port} is in use: pick another with --port") from None
        raise
    finally:
        store.close()

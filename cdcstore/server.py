"""`cdcstore serve`: an aiohttp server over a LocalStore (protocol v1, docs/protocol.md).

The server trusts nothing it receives: it re-hashes every chunk of every pack,
checks manifests against the chunks it holds and commits against the manifests,
caps counts and body sizes, and answers bad input with a 4xx and a JSON error.
Heavy requests (pack uploads, manifest batches, range reads) are capped; past
the cap the answer is 429 with Retry-After. CPU work runs off the event loop.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import contextlib
from dataclasses import dataclass

from aiohttp import web

from . import ids, transfer
from .address import check_name, normalize_path
from .commit import Commit
from .errors import (CdcError, ConflictError, CorruptionError, InvalidAddressError, RepoNotFoundError,
                     RevisionNotFoundError)
from .manifest import Manifest
from .pack import decode_chunk, read_index
from .store import LocalStore

log = logging.getLogger("cdcstore.server")


class HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass
class ServerConfig:
    tokens: dict | None = None  # token -> {"scope": "read"|"write", "repos": [...]}; None: open
    max_heavy: int = 8  # concurrent heavy requests before 429
    retry_after: int = 1


def load_tokens(path: str) -> dict:
    """Read and check a tokens file: {"TOKEN": {"scope": "read"|"write", "repos": ["*"] | [names]}}."""
    with open(path) as f:
        try:
            doc = json.load(f)
        except ValueError as e:
            raise InvalidAddressError(f"tokens file {path} is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidAddressError(f"tokens file {path} must hold a JSON object of token -> grant")
    for grant in doc.values():
        if (not isinstance(grant, dict) or grant.get("scope") not in ("read", "write")
                or not isinstance(grant.get("repos"), list)):
            raise InvalidAddressError(
                f"tokens file {path}: the grant of a token must look like "
                f'{{"scope": "read" or "write", "repos": ["*"] or a list of repo names}}')
    return doc


def _error(status: int, message: str, headers: dict | None = None) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status, headers=headers)


STORE_ROOTS = web.AppKey("store_roots", tuple)
_REPO_LIST = re.compile(r" \(repos: [^)]*\)")


def sanitize(message: str, roots: tuple) -> str:
    """An error message without the server's paths or the list of other tenants' repos."""
    for root in roots:
        message = message.replace(root, "the server's store")
    return _REPO_LIST.sub("", message)


@web.middleware
async def errors_middleware(request: web.Request, handler):
    response = await _handle_errors(request, handler)
    if response.status >= 400 and getattr(response, "body", None) and response.content_type == "application/json":
        doc = json.loads(response.body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            doc["error"] = sanitize(doc["error"], request.app[STORE_ROOTS])
            response = _error(response.status, doc["error"], {k: v for k, v in response.headers.items()
                                                              if k.lower().startswith(("retry-after", "www-auth"))})
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
    except (RepoNotFoundError, RevisionNotFoundError, FileNotFoundError) as e:
        return _error(404, str(e))
    except ConflictError as e:
        return _error(409, str(e))
    except CorruptionError as e:
        return _error(422, str(e))
    except (CdcError, ValueError, KeyError, TypeError) as e:
        return _error(400, str(e) or type(e).__name__)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a bug: log it, never crash, never leak a traceback
        log.exception("internal error on %s %s", request.method, request.path)
        return _error(500, f"internal error: {type(e).__name__}")


class Auth:
    """Bearer-token checks; `None` tokens means an open (loopback) server."""

    def __init__(self, tokens: dict | None):
        self.tokens = tokens

    def grant(self, request: web.Request) -> dict | None:
        if self.tokens is None:
            return {"scope": "write", "repos": ["*"]}
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.startswith("Bearer ") else ""
        grant = self.tokens.get(token) if token else None
        if grant is None:
            raise HTTPError(401, "missing or unknown token: pass --token or set CDCSTORE_TOKEN",
                            {"WWW-Authenticate": "Bearer"})
        return grant

    def check(self, request: web.Request, repo: str | None, write: bool) -> None:
        g = self.grant(request)
        if write and g["scope"] != "write":
            raise HTTPError(403, "this token may only read: use a token with write scope")
        if repo is not None and "*" not in g["repos"] and repo not in g["repos"]:
            raise HTTPError(403, f"this token has no access to repo {repo!r}")

    def visible(self, request: web.Request, repos: list[str]) -> list[str]:
        g = self.grant(request)
        return repos if "*" in g["repos"] else [r for r in repos if r in g["repos"]]


class Server:
    def __init__(self, store: LocalStore, config: ServerConfig):
        self.store = store
        self.config = config
        self.auth = Auth(config.tokens)
        self._heavy = 0

    # -- helpers -----------------------------------------------------------------------------
    async def _io(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def _body(self, request: web.Request, limit: int) -> bytes:
        if request.content_length is not None and request.content_length > limit:
            raise HTTPError(413, f"body of {request.content_length} bytes is over the limit of {limit}")
        data = bytearray()
        async for block in request.content.iter_chunked(1 << 20):
            data += block
            if len(data) > limit:
                raise HTTPError(413, f"body is over the limit of {limit} bytes")
        return bytes(data)

    @contextlib.contextmanager
    def heavy(self):
        """A slot for a heavy request, or 429 with Retry-After when all are taken."""
        if self._heavy >= self.config.max_heavy:
            raise HTTPError(429, "server busy: retry later", {"Retry-After": str(self.config.retry_after)})
        self._heavy += 1
        try:
            yield
        finally:
            self._heavy -= 1

    def _repo(self, request: web.Request, write: bool = False) -> str:
        repo = check_name("repo", request.match_info["repo"])
        self.auth.check(request, repo, write)
        return repo

    # -- handlers ------------------------------------------------------------------------------
    async def health(self, request):
        return web.json_response({"ok": True, "protocol": transfer.PROTOCOL_VERSION})

    async def query_chunks(self, request):
        self.auth.check(request, None, write=True)
        wanted = transfer.decode_ids(await self._body(request, transfer.MAX_IDS_PER_REQUEST * transfer.ID))
        present = await self._io(self.store.present, wanted)
        return web.Response(body=transfer.encode_presence(wanted, present),
                            content_type="application/octet-stream")

    async def put_pack(self, request):
        self.auth.check(request, None, write=True)
        name = request.match_info["name"]
        if not ids.is_hex_id(name):
            raise HTTPError(400, f"invalid pack name {name!r}: 32 lowercase hex digits")
        if request.content_length is not None and request.content_length > transfer.MAX_PACK_BYTES:
            raise HTTPError(413, f"pack of {request.content_length} bytes is over the limit "
                                 f"of {transfer.MAX_PACK_BYTES}")
        with self.heavy():
            if os.path.exists(self.store.pack_path(name)):
                async for _ in request.content.iter_chunked(1 << 20):
                    pass  # already stored (a retried upload): drain and accept
                return web.json_response({"pack": name, "stored": False})
            tmp = self.store.tmp_path()
            h = ids.hasher()
            size = 0
            try:
                with open(tmp, "wb") as f:
                    async for block in request.content.iter_chunked(1 << 20):
                        size += len(block)
                        if size > transfer.MAX_PACK_BYTES:
                            raise HTTPError(413, f"pack is over the limit of {transfer.MAX_PACK_BYTES} bytes")
                        h.update(block)
                        f.write(block)
                if h.hexdigest() != name:
                    raise HTTPError(422, f"pack bytes do not match the name {name} (truncated or damaged upload)")
                count = await self._io(self._verify_and_add, tmp, name)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return web.json_response({"pack": name, "stored": True, "chunks": count}, status=201)

    def _verify_and_add(self, tmp: str, name: str) -> int:
        with open(tmp, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            entries = read_index(f, size, f"uploaded pack {name}")
            for e in entries:  # re-hash every chunk: ids are never taken on trust
                f.seek(e.offset)
                decode_chunk(f.read(e.stored_len), e.codec, e.raw_len, e.chunk_id)
        self.store.add_pack(tmp, name, entries)
        return len(entries)

    async def head_pack(self, request):
        self.auth.check(request, None, write=True)
        name = request.match_info["name"]
        exists = ids.is_hex_id(name) and os.path.exists(self.store.pack_path(name))
        return web.Response(status=200 if exists else 404)

    async def put_manifests(self, request):
        self.auth.check(request, None, write=True)
        with self.heavy():
            blobs = transfer.decode_blobs(await self._body(request, transfer.MAX_MANIFEST_BATCH_BYTES))
            names = await self._io(self._add_manifests, blobs)
        return web.json_response({"manifests": names})

    def _add_manifests(self, blobs: list[bytes]) -> list[str]:
        manifests = [Manifest.decode(b, "uploaded manifest") for b in blobs]
        wanted = list({c for m in manifests for c in m.chunk_ids})
        missing = set(wanted) - self.store.present(wanted)
        if missing:
            raise HTTPError(409, f"{len(missing)} chunks named by the manifests are not on the server "
                                 f"(e.g. {next(iter(missing)).hex()}): upload their packs first")
        return self.store.put_manifests(manifests)

    async def list_repos(self, request):
        repos = await self._io(self.store.repos)
        return web.json_response({"repos": self.auth.visible(request, repos)})

    async def branches(self, request):
        repo = self._repo(request)
        return web.json_response({"branches": await self._io(self.store.branches, repo)})

    async def resolve(self, request):
        repo = self._repo(request)
        rev = check_name("revision", request.match_info["rev"])
        return web.json_response({"commit": await self._io(self.store.resolve, repo, rev)})

    async def get_commit(self, request):
        repo = self._repo(request)
        cid = request.match_info["id"]
        if not ids.is_hex_id(cid):
            raise HTTPError(400, f"invalid commit id {cid!r}")
        commit = await self._io(self.store.get_commit, repo, cid)
        return web.Response(body=commit.encode(), content_type="application/json")

    async def post_commit(self, request):
        repo = self._repo(request, write=True)
        doc = json.loads(await self._body(request, transfer.MAX_JSON_BYTES))
        commit = Commit.decode(doc["commit"].encode(), "uploaded commit")
        branch = check_name("branch", doc["branch"])
        expected = doc.get("expected")
        if commit.repo != repo:
            raise HTTPError(400, f"commit names repo {commit.repo!r} but was sent to {repo!r}")
        for path in commit.files:
            if not path or normalize_path(path) != path:
                raise HTTPError(400, f"invalid file path {path!r} in commit: use relative '/'-separated paths "
                                     f"without '.', '..' or empty parts")
        cid = await self._io(self._commit, repo, commit, branch, expected)
        return web.json_response({"commit": cid}, status=201)

    def _check_parent(self, repo: str, parent) -> None:
        """A parent must be a 32-hex commit id of this repo: never a path (no file-existence oracle)."""
        if parent is None:
            return
        if not isinstance(parent, str) or not ids.is_hex_id(parent):
            raise HTTPError(400, "commit parent must be a 32-hex-digit commit id or null")
        try:
            self.store.get_commit(repo, parent)
        except (CdcError, OSError):
            raise HTTPError(400, f"commit parent {parent} is not a commit of repo {repo!r}: "
                                 f"base the commit on the branch head") from None

    def _commit(self, repo: str, commit: Commit, branch: str, expected: str | None) -> str:
        self._check_parent(repo, commit.parent)
        sizes: dict[str, set[int]] = {}
        for f in commit.files.values():
            if not ids.is_hex_id(f.manifest):
                raise HTTPError(400, f"invalid manifest name {f.manifest!r}")
            sizes.setdefault(f.manifest, set()).add(f.size)
        for name, wanted in sizes.items():
            try:
                m = self.store.get_manifest(name)
            except CorruptionError:
                raise HTTPError(409, f"manifest {name} is not on the server: upload it first") from None
            if wanted != {m.size}:
                raise HTTPError(400, f"a file size in the commit does not match manifest {name} ({m.size} bytes)")
        return self.store.commit(commit, branch, expected)

    async def get_manifest(self, request):
        repo = self._repo(request)
        name = request.match_info["name"]
        if not ids.is_hex_id(name) or not await self._io(self.store.index.reaches, repo, "manifest", name):
            raise HTTPError(404, f"no manifest {name} in repo {repo!r}")
        path = self.store.manifest_path(name)
        return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})

    async def locate(self, request):
        repo = self._repo(request)  # checks the token's access to the repo
        wanted = transfer.decode_ids(await self._body(request, transfer.MAX_IDS_PER_REQUEST * transfer.ID))
        found = await self._io(self._locate_reached, repo, wanted)
        return web.Response(body=transfer.encode_locations(found), content_type="application/octet-stream")

    def _locate_reached(self, repo: str, wanted) -> dict:
        """Locations only of chunks in packs that `repo` reaches: locate never reveals other repos' chunks."""
        found = self.store.locate(wanted)
        packs = {p for p, _ in found.values()}
        reached = {p for p in packs if self.store.index.reaches(repo, "pack", p)}
        return {c: loc for c, loc in found.items() if loc[0] in reached}

    async def get_pack(self, request):
        repo = self._repo(request)
        name = request.match_info["name"]
        if not ids.is_hex_id(name) or not await self._io(self.store.index.reaches, repo, "pack", name):
            raise HTTPError(404, f"no pack {name} in repo {repo!r}")
        return web.FileResponse(self.store.pack_path(name), headers={"Content-Type": "application/octet-stream"})

    async def stats(self, request):
        self.auth.grant(request)
        return web.json_response(await self._io(self.store.totals))


def make_app(store: LocalStore, config: ServerConfig | None = None) -> web.Application:
    config = config or ServerConfig()
    s = Server(store, config)
    app = web.Application(middlewares=[errors_middleware], client_max_size=transfer.MAX_JSON_BYTES)
    app[STORE_ROOTS] = tuple(sorted({store.root, os.path.realpath(store.root)}, key=len, reverse=True))
    api = transfer.API
    app.add_routes([
        web.get(f"{api}/health", s.health),
        web.post(f"{api}/chunks/query", s.query_chunks),
        web.put(f"{api}/packs/{{name}}", s.put_pack),
        web.head(f"{api}/packs/{{name}}", s.head_pack),
        web.post(f"{api}/manifests", s.put_manifests),
        web.get(f"{api}/stats", s.stats),
        web.get(f"{api}/repos", s.list_repos),
        web.get(f"{api}/repos/{{repo}}/branches", s.branches),
        web.get(f"{api}/repos/{{repo}}/resolve/{{rev}}", s.resolve),
        web.get(f"{api}/repos/{{repo}}/commits/{{id}}", s.get_commit),
        web.post(f"{api}/repos/{{repo}}/commits", s.post_commit),
        web.get(f"{api}/repos/{{repo}}/manifests/{{name}}", s.get_manifest),
        web.post(f"{api}/repos/{{repo}}/locate", s.locate),
        web.get(f"{api}/repos/{{repo}}/packs/{{name}}", s.get_pack),
    ])
    return app


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def serve(store_path: str, host: str, port: int, tokens_file: str | None = None,
          allow_open: bool = False, max_heavy: int = 8) -> None:
    """Run the server until interrupted. Without tokens it only binds loopback,
    unless `allow_open` says otherwise explicitly."""
    tokens = load_tokens(tokens_file) if tokens_file else None
    if tokens is None:
        if host not in LOOPBACK and not allow_open:
            raise InvalidAddressError(
                f"refusing to serve {host} without --tokens: anyone could read and write. "
                f"Pass --tokens FILE, bind 127.0.0.1, or add --allow-no-auth to accept the risk")
        log.warning("serving without authentication (no --tokens): anyone who can connect can write")
    store = LocalStore(store_path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = make_app(store, ServerConfig(tokens=tokens, max_heavy=max_heavy))
    print(f"cdcstore serving {store.root} on http://{host}:{port}{transfer.API}", flush=True)
    web.run_app(app, host=host, port=port, print=None, access_log=logging.getLogger("cdcstore.access"),
                access_log_format='%a "%r" %s %b %Tfs')
    store.close()

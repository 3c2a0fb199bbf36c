"""The server's manifests and trees: batches uploaded, checked against the chunks the token may
see, and stored; served to a repo that reaches them, a manifest with where its chunks are
(`MetadataRoutes`)."""
from __future__ import annotations

import os

from aiohttp import web

from ...core import ids, treeobj
from ...core import wire
from ...core.errors import CdcError, CorruptionError
from ...core.manifest import MANIFEST_VERSION, Manifest
from ...storage.manifest_file import ManifestFile, ManifestMissing
from ...storage.objects import NotFound
from ...storage.reader import FileReader
from . import batches
from .auth import Scope
from .routes import HTTPError, RouteGroup


TREES_GET_BYTES = 16 << 20  # and the bytes of its answer (the rest: empty, fetched one by one)
LOCATED_GET_BYTES = 16 << 20  # a `manifests/located` answer stops past this (the client asks for the rest)


class MetadataRoutes(RouteGroup):
    """Manifest and tree handlers of a `server.Server`; `batches.ManifestBatch` stores through it."""

    def routes(self, api: str) -> list:
        return [
            web.post(f"{api}/manifests", self.put_manifests),
            web.post(f"{api}/trees", self.put_trees),
            web.get(f"{api}/repos/{{repo}}/manifests/{{name}}", self.get_manifest),
            web.get(f"{api}/repos/{{repo}}/trees/{{name}}", self.get_tree),
            web.post(f"{api}/repos/{{repo}}/trees/get", self.get_trees),
            web.post(f"{api}/repos/{{repo}}/manifests/located", self.get_manifests_located),
        ]

    async def put_manifests(self, request):
        self.auth.check(request, None, write=True)
        with self.server.slot(self.server.writes, request):
            async with self.server.spooled(request) as path:
                batch = batches.ManifestBatch(self, path, self.auth.scope(request))
                names = await self.io(batch.run)
        answer = {"manifests": names}
        if self.store.capabilities.bundles:  # where a bucket store put them (protocol 2.2, additive)
            where = {n: self.store.bundle_of(n) for n in names}
            answer["bundles"] = {n: b for n, b in where.items() if b is not None}
        return web.json_response(answer)

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
            self.server.require_visible(scope, set(chunk_ids), "a manifest")  # what it may see is held
            return
        missing = set(chunk_ids) - self.store.present(chunk_ids)
        if missing and self.store.packs.recover():  # packs stored through another replica
            missing -= self.store.present(list(missing))
        if missing:
            raise HTTPError(409, f"{len(missing)} chunks named by the manifests are not on the server "
                                 f"(e.g. {next(iter(missing)).hex()}): upload their packs first")

    async def put_trees(self, request):
        """Trees (protocol 1.5), checked for their format; a commit naming them checks the rest."""
        self.auth.check(request, None, write=True)
        with self.server.slot(self.server.writes, request):
            async with self.server.spooled(request) as path:
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
        repo = self.server.checked_repo(request)
        name = request.match_info["name"]
        if not ids.is_hex_id(name) or not await self.io(self._reaches, repo, name, "tree"):
            raise HTTPError(404, f"no tree {name} in repo {repo!r}")
        try:
            body = await self.io(self.store.metadata.tree_bytes, name)
        except NotFound:
            raise HTTPError(404, f"tree {name} is missing on the server: run `cdcstore check` there") from None
        return web.Response(body=body, content_type="application/json")

    async def get_trees(self, request):
        """Many trees in one answer (a level of a split folder: protocol 2.1): the body names them,
        `{"names": [id, ...]}` (at most wire.TREES_PER_GET); the answer is their bytes, length-prefixed
        in that order, an empty blob for one the repo does not reach, the server lacks, or that
        would take the answer past TREES_GET_BYTES (the client asks for those one by one)."""
        repo = self.server.checked_repo(request)
        names = (await self.server.read_json(request)).get("names")
        if not (isinstance(names, list) and len(names) <= wire.TREES_PER_GET
                and all(isinstance(n, str) and ids.is_hex_id(n) for n in names)):
            raise HTTPError(400, f"names must be a list of at most {wire.TREES_PER_GET} tree ids")
        await self.server.wait_read(request)
        with self.server.slot(self.server.reads, request):
            body = await self.io(self._trees_body, repo, names)
        return web.Response(body=body, content_type="application/octet-stream")

    def _trees_body(self, repo: str, names: list[str]) -> bytes:
        blobs, size = [], 0
        for name in names:
            data = b""
            if size < TREES_GET_BYTES and self._reaches(repo, name, "tree"):
                try:
                    data = self.store.metadata.tree_bytes(name)
                except NotFound:
                    pass
            size += len(data)
            blobs.append(data if size <= TREES_GET_BYTES else b"")
        return wire.encode_blobs(blobs)

    async def get_manifest(self, request):
        repo = self.server.checked_repo(request)
        name = request.match_info["name"]
        if not ids.is_hex_id(name) or not await self.io(self._reaches, repo, name):
            raise HTTPError(404, f"no manifest {name} in repo {repo!r}")
        missing = HTTPError(404, f"manifest {name} is missing on the server: run `cdcstore check` there")
        if request.query.get("locations") == "1":  # protocol 1.3: the manifest and where its chunks are
            await self.server.wait_read(request)
            with self.server.slot(self.server.reads, request):
                try:
                    body = await self.io(self._manifest_located, repo, name, self.auth.scope(request))
                except (NotFound, FileNotFoundError):
                    raise missing from None
                if isinstance(body, bytes):
                    return web.Response(body=body, content_type="application/octet-stream")
                return await self.server.send_range(request, 0, body.size, body.block, status=200)
        path = self.store.metadata.manifest_file(name)
        if path is not None:
            if not os.path.isfile(path):
                raise missing
            return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})
        try:
            body = await self.io(self.store.metadata.manifest_bytes, name)
        except NotFound:
            raise missing from None
        return web.Response(body=body, content_type="application/octet-stream")

    async def get_manifests_located(self, request):
        """Many `manifests/{name}?locations=1` answers in one (protocol 2.3), each with the raw bytes
        of its file's last chunks: the footers of a revision's Parquet files in one request. The body
        is `{"manifests": [names], "tail": bytes}`; the answer (`wire.encode_located_many`) covers the
        first manifests asked, up to `LOCATED_GET_BYTES` (at least one); a manifest the repo does not
        reach, the server lacks, or over `limits.decode_bytes` gets an empty entry (the client asks
        for it alone, and hears why there)."""
        repo = self.server.checked_repo(request)
        doc = await self.server.read_json(request)
        names, tail = doc.get("manifests"), doc.get("tail", 0)
        if not (isinstance(names, list) and 1 <= len(names) <= wire.LOCATED_PER_GET
                and all(isinstance(n, str) and ids.is_hex_id(n) for n in names)):
            raise HTTPError(400, f"manifests must be a list of 1 to {wire.LOCATED_PER_GET} manifest ids")
        if not (isinstance(tail, int) and not isinstance(tail, bool) and 0 <= tail <= wire.MAX_TAIL):
            raise HTTPError(400, f"tail must be a number of bytes from 0 to {wire.MAX_TAIL}")
        await self.server.wait_read(request)
        with self.server.slot(self.server.reads, request):
            body = await self.io(self._located_many, repo, names, tail, self.auth.scope(request))
        return web.Response(body=body, content_type="application/octet-stream")

    def _located_many(self, repo: str, names: list[str], tail: int, scope: Scope | None) -> bytes:
        entries: list[tuple[bytes, bytes]] = []
        size = 0
        for name in names:
            if entries and size >= LOCATED_GET_BYTES:
                break
            located, end = b"", b""
            if self._reaches(repo, name):
                try:
                    small = self._small_located(repo, name, scope)
                except (NotFound, FileNotFoundError, CorruptionError):
                    small = None  # asked alone, the client hears why
                if small is not None:
                    data, manifest, found = small
                    located = wire.encode_located(data, found)
                    end = self._tail(name, manifest, found, tail) if tail else b""
            entries.append((located, end))
            size += len(located) + len(end)
        return wire.encode_located_many(entries)

    def _tail(self, name: str, manifest: Manifest, found: dict, tail: int) -> bytes:
        """The file's bytes from the start of the chunk holding byte `size - tail` to its end, read
        through the one read core (each chunk checked by its origin), when every one of those
        chunks is among `found` (the repo may read them) and they are at most `wire.MAX_TAIL_SENT`
        bytes; else none (the client reads them as any other bytes)."""
        size = manifest.size
        span = manifest.span(max(0, size - tail), size)
        if not span:
            return b""
        start = manifest.chunk_start(span.start)
        if size - start > wire.MAX_TAIL_SENT or any(c not in found for c in manifest.chunk_ids[span.start:]):
            return b""
        try:
            with FileReader(self.store, manifest, name, readahead_bytes=0, locations=dict(found)) as r:
                return r.pread(start, size - start)
        except CdcError:  # a damaged or missing chunk: the client's own read of it reports it
            return b""

    def _small_located(self, repo: str, name: str, scope: Scope | None) -> tuple[bytes, Manifest, dict] | None:
        """A manifest's bytes, the manifest, and the locations `_manifest_located` answers; None for
        one over `limits.decode_bytes` (streamed on its own)."""
        body = self._manifest_located(repo, name, scope, keep=True)
        return body if isinstance(body, tuple) else None

    def _manifest_located(self, repo: str, name: str, scope: Scope | None, keep: bool = False):
        """A manifest's bytes and the locations of its first and last `LOCATED_ENDS` chunks
        that `repo` may see (what `locate` would answer): one round trip instead of two for
        a small file, and for where reads of a large one start (a scan, a Parquet footer).
        A manifest over `limits.decode_bytes` is never read whole: a `batches.LocatedBody` to stream.
        With `keep`, a small one's (bytes, manifest, locations) instead of its encoded answer."""
        try:
            large = ManifestFile(self.store, name)
        except ManifestMissing:
            raise NotFound(name) from None
        if large.bytes > self.limits.decode_bytes:  # never decoded whole: streamed
            found = self.server.locate_reached(repo, list(dict.fromkeys(large.ends(wire.LOCATED_ENDS))), scope)
            return batches.LocatedBody(large, found)
        data = large.data  # a small manifest came whole with its first read
        if data is None:
            path = self.store.metadata.manifest_file(name)
            if path is not None:
                with open(path, "rb") as f:
                    data = f.read()
            else:
                data = self.store.metadata.manifest_bytes(name)
        manifest = Manifest.decode(data, f"manifest {name}")
        self.store.packs.hints.load_locations(name, manifest)  # a new replica: no listing, no footers for this file
        chunks, ends = manifest.chunk_ids, wire.LOCATED_ENDS
        picked = chunks if len(chunks) <= 2 * ends else [*chunks[:ends], *chunks[-ends:]]  # where reads start
        found = self.server.locate_reached(repo, list(dict.fromkeys(picked)), scope)
        return (data, manifest, found) if keep else wire.encode_located(data, found)

    def _reaches(self, repo: str, name: str, kind: str = "manifest") -> bool:
        """Whether `repo` reaches manifest (or tree) `name`, asking the bucket on a miss (a
        commit landed through another replica)."""
        if self.access.reaches(repo, kind, name):
            return True
        if self.access.grant_if_headed(repo, name, kind):  # in a branch or tag now: no walk of the history
            return True
        self.access.refresh(repo)  # 0 when a request that ran first granted it: ask the index again
        return self.access.reaches(repo, kind, name)

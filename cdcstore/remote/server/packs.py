"""The server's chunks and packs: presence and proofs, pack uploads (each chunk re-hashed), locate,
and pack reads, whole, by range or masked to what a scoped token's repos reach (`PackRoutes`)."""
from __future__ import annotations

import os
import time

from aiohttp import web

from ...core import ids
from ...core import wire
from ...core.chunker import MAX_CHUNK_BYTES
from ...core.pack import PACK_VERSION, TRAILER as PACK_TRAILER, WRITE_BUFFER, decode_chunk, pack_version, read_index
from ...storage.objects import NotFound
from .auth import Scope
from .routes import HTTPError, RouteGroup

MAX_STORED_BYTES = MAX_CHUNK_BYTES + MAX_CHUNK_BYTES // 128 + 4096  # a chunk's stored record (zstd's worst case)


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


class PackRoutes(RouteGroup):
    """Chunk and pack handlers of a `server.Server` (its store, access records, slots and bodies)."""

    def __init__(self, server):
        super().__init__(server)
        self._listed = float("-inf")  # when a presence miss last listed the bucket's packs

    def routes(self, api: str) -> list:
        return [
            web.post(f"{api}/chunks/query", self.query_chunks),
            web.post(f"{api}/chunks/prove", self.prove_chunks),
            web.put(f"{api}/packs/{{name}}", self.put_pack),
            web.head(f"{api}/packs/{{name}}", self.head_pack),
            web.post(f"{api}/repos/{{repo}}/locate", self.locate),
            web.get(f"{api}/repos/{{repo}}/packs/{{name}}", self.get_pack),
        ]

    async def query_chunks(self, request):
        self.auth.check(request, None, write=True)
        _require_new_ids(request, "a presence query (dedup)")
        wanted = wire.decode_ids(await self.server.read_body(request, wire.MAX_IDS_PER_REQUEST * wire.ID))
        scope = self.auth.scope(request)
        held = await self.io(self._held, wanted)
        if scope is not None:  # 0 for what it may not see, held or not (X-Cdc-Prove changes nothing)
            held = await self.io(self.server.visible, scope, held)
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
        if shared and len(held) < len(wanted) and now - self._listed >= self.server.config.presence_refresh:
            self._listed = now
            if self.store.packs.recover():
                held = self.store.present(wanted)
        return held

    async def prove_chunks(self, request):
        """Proof of possession (protocol 1.1), kept for older clients: a token that sees the whole
        store learns which chunks are held; a scoped one gets 0 for every pair, held or not, and
        uploads (a proof from guessed bytes would be a presence oracle: docs/protocol.md)."""
        self.auth.check(request, None, write=True)
        _require_new_ids(request, "a proof of possession")
        body = await self.server.read_body(request, wire.NONCE + wire.MAX_PROOFS_PER_REQUEST * (wire.ID + wire.PROOF))
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
        with self.server.slot(self.server.writes, request):
            if await self.io(self.store.packs.index_found_pack, name):  # already stored (a retried upload)
                if scope is None:  # nothing to prove: answered without reading the body
                    resp = web.json_response({"pack": name, "stored": False})
                    resp.force_close()  # the body left unread is not taken for the next request
                    return resp
                h, size = ids.hasher(), 0
                async for block in self.server.blocks(request):  # the token may show it holds every byte
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
                    async for block in self.server.blocks(request):
                        size += len(block)
                        if size > limit:
                            raise HTTPError(413, f"pack is over the limit of {limit} bytes", {"Connection": "close"})
                        h.update(block)
                        f.write(block)
                if h.hexdigest() != name:
                    raise HTTPError(422, f"pack bytes do not match the name {name} (truncated or damaged upload)")
                async with self.server.parsing:  # verification holds chunks and the index: a few at once
                    entries = await self.io(self._verify_and_add, tmp, name, scope)
                count = len(entries)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return web.json_response({"pack": name, "stored": True, "chunks": count}, status=201)

    def _record_upload(self, scope: Scope, name: str, entries) -> None:
        if entries is None:
            entries = self.store.packs.read_pack_index(name)
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
        exists = ids.is_hex_id(name) and await self.io(self.store.packs.index_found_pack, name)
        return web.Response(status=200 if exists else 404)

    async def locate(self, request):
        repo = self.server.checked_repo(request)  # checks the token's access to the repo
        try:
            width = wire.id_width(request.headers.get(wire.ID_HEADER))  # reads of format-v1 data: 16
        except ValueError as e:
            raise HTTPError(400, str(e)) from None
        wanted = wire.decode_ids(await self.server.read_body(request, wire.MAX_IDS_PER_REQUEST * width), width)
        found = await self.io(self.server.locate_reached, repo, wanted, self.auth.scope(request))
        return web.Response(body=wire.encode_locations(found, width), content_type="application/octet-stream")

    async def get_pack(self, request):
        """Pack bytes. An open server or a "*" token gets the file (ranges served by aiohttp);
        a scoped token gets one range in which every byte that is not part of a chunk its
        repo reaches (or it uploaded) is zero: other repos' chunks and the footer never leave."""
        repo = self.server.checked_repo(request)
        name = request.match_info["name"]
        scope = self.auth.scope(request)
        if not ids.is_hex_id(name) or not await self.io(self._has_pack, name):
            raise HTTPError(404, f"no pack {name} in repo {repo!r}")
        path = self.store.packs.pack_file(name)
        if path is not None and not os.path.isfile(path):
            raise self.store.packs.pack_gone(name)
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
        await self.server.wait_read(request)
        with self.server.slot(self.server.reads, request):  # built block by block: `send_block` bytes held per read
            if scope is None:  # an object store: the range is read from it and sent
                stop = await self.io(self._range_stop, name, start, stop)
                return await self.server.send_range(request, start, stop, lambda lo, hi: self._object_block(name, lo, hi))
            spans, stop = await self.io(self._masked_spans, repo, scope, name, start, stop)
            return await self.server.send_range(request, start, stop, lambda lo, hi: self._masked_block(name, spans, lo, hi))

    def _has_pack(self, name: str) -> bool:
        """Whether pack `name` is indexed, after a recovery on a miss (stored through another replica)."""
        return self.store.packs.knows_pack(name) or (self.store.packs.recover() > 0 and self.store.packs.indexed_pack(name))

    def _range_stop(self, name: str, start: int, stop: int) -> int:
        """`stop`, clamped to the end of a pack kept in an object store."""
        try:
            size = self.store.packs.pack_size(name)
        except NotFound:
            raise self.store.packs.pack_gone(name) from None
        if start >= size:
            raise HTTPError(416, f"range starts past the end of pack {name}")
        return min(stop, size)

    def _object_block(self, name: str, lo: int, hi: int) -> bytes:
        try:
            return self.store.packs.pack_range(name, lo, hi - lo)
        except NotFound:
            raise self.store.packs.pack_gone(name) from None

    def _masked_spans(self, repo: str, scope: Scope, name: str, start: int, stop: int):
        """The byte spans of [start, stop) that `repo` may read (chunks it reaches or the token
        uploaded), and `stop` clamped to the pack's end."""
        entries = self.store.packs.pack_chunks(name, start, stop)
        keep = self.access.reached([e.chunk_id for e in entries], [repo], scope.owner)
        if not keep and entries:  # maybe landed or uploaded through another replica
            self.server.refresh([repo], scope)
            keep = self.access.reached([e.chunk_id for e in entries], [repo], scope.owner)
        spans = [(max(e.offset, start), min(e.offset + e.stored_len, stop)) for e in entries if e.chunk_id in keep]
        if not spans:
            raise HTTPError(404, f"no chunk of repo {repo!r} in that range of pack {name}")
        try:
            stop = min(stop, self.store.packs.pack_size(name))
        except NotFound:
            raise self.store.packs.pack_gone(name) from None
        return spans, stop

    def _masked_block(self, name: str, spans: list, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of a masked range: zeros but for `spans` (sorted by offset)."""
        out = bytearray(hi - lo)
        for a, b in spans:
            a, b = max(a, lo), min(b, hi)
            if a < b:
                out[a - lo:b - lo] = self.store.packs.read_stored(name, a, b - a)
        return bytes(out)

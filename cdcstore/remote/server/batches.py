"""Manifest and tree batches on the server, in bounded memory (`ServerLimits`).

A batch body (length-prefixed blobs, `wire.encode_blobs`) is first spooled to a temp file,
never held in memory. Its manifests are then decoded a few at a time (`decode_bytes` of
them); a larger manifest is checked in slices of `slice_chunks` chunk ids read from the
file, and stored from a temp copy: a 64 MiB batch costs a few MiB of memory, not a GiB.
Trees are decoded one at a time, each at most `max_tree_bytes`. `LocatedBody` is the answer
to `GET manifests/{name}?locations=1` for a large manifest, streamed from the store.
"""
from __future__ import annotations

import os
import struct

from ...core import ids
from ...core import wire
from ...core.errors import CorruptionError
from ...core.manifest import ENTRY, HEADER, MAGIC, MANIFEST_VERSION
from ...core.pack import WRITE_BUFFER
from ...storage.manifest_file import ManifestFile
from .routes import HTTPError

_LEN = struct.Struct("<I")


class TooLarge(Exception):
    """A batch over a limit (the server answers 413)."""


def positions(f, size: int, max_count: int, what: str) -> list[tuple[int, int]]:
    """(offset, length) of each blob of a spooled batch of `size` bytes."""
    out, pos = [], 0
    while pos < size:
        f.seek(pos)
        head = f.read(_LEN.size)
        if len(head) < _LEN.size:
            raise ValueError("truncated blob length")
        (n,) = _LEN.unpack(head)
        pos += _LEN.size
        if pos + n > size:
            raise ValueError("blob longer than the body")
        out.append((pos, n))
        if len(out) > max_count:
            raise TooLarge(f"over {max_count} {what} in one request; the limit is {max_count}: send smaller batches")
        pos += n
    return out


def _read(f, offset: int, n: int) -> bytes:
    f.seek(offset)
    return f.read(n)


class ManifestBatch:
    """Check and store the manifests of one spooled batch, for `server` (a metadata.MetadataRoutes)."""

    def __init__(self, server, path: str, scope):
        self.server, self.store, self.path, self.scope = server, server.store, path, scope
        self.limits = server.limits

    def run(self) -> list[str]:
        names: list[str] = []
        with open(self.path, "rb") as f:
            blobs = positions(f, os.fstat(f.fileno()).st_size, wire.MAX_MANIFESTS_PER_REQUEST, "manifests")
            group: list[bytes] = []
            group_bytes = 0
            for offset, n in blobs:
                if n > self.limits.decode_bytes:
                    names += self._flush(group)
                    group, group_bytes = [], 0
                    names.append(self._large(f, offset, n))
                    continue
                if group and group_bytes + n > self.limits.decode_bytes:
                    names += self._flush(group)
                    group, group_bytes = [], 0
                group.append(_read(f, offset, n))
                group_bytes += n
            names += self._flush(group)
        return names

    def _flush(self, group: list[bytes]) -> list[str]:
        return self.server.add_manifests(group, self.scope) if group else []

    def _check_ids(self, chunk_ids: list[bytes]) -> None:
        """As `MetadataRoutes.add_manifests` checks the chunks of a batch (`require_named`)."""
        self.server.require_named(self.scope, chunk_ids)

    def _large(self, f, offset: int, n: int) -> str:
        """A manifest too large to decode at once: checked slice by slice while it is copied to
        a temp file, then stored from it (no location record: a reader locates its chunks)."""
        what = "uploaded manifest"
        head = _read(f, offset, HEADER.size)
        if len(head) < HEADER.size:
            raise CorruptionError(f"{what} is truncated")
        magic, version, count, size, _ = HEADER.unpack(head)
        if magic != MAGIC:
            raise CorruptionError(f"{what} is not a cdcstore manifest")
        if version != MANIFEST_VERSION:
            raise HTTPError(400, f"a format-v{version} manifest was uploaded: {ids.LEGACY_REFUSED}")
        if n != HEADER.size + count * ENTRY.size:
            raise CorruptionError(f"{what} has the wrong length for {count} chunks")
        h = ids.hasher()
        h.update(head)
        tmp = self.store.tmp_path()
        total = 0
        try:
            with open(tmp, "wb", buffering=WRITE_BUFFER) as out:
                out.write(head)
                step = self.limits.slice_chunks
                for first in range(0, count, step):
                    k = min(step, count - first)
                    part = _read(f, offset + HEADER.size + first * ENTRY.size, k * ENTRY.size)
                    h.update(part)
                    out.write(part)
                    entries = list(ENTRY.iter_unpack(part))
                    total += sum(e[1] for e in entries)
                    self._check_ids(list({bytes(e[0]) for e in entries}))
                    del entries, part
            if total != size:
                raise CorruptionError(f"{what}: chunk lengths do not add up to the file size")
            name = h.hexdigest()
            self.store.metadata.put_manifest_file(name, tmp)  # young again if stored before, as put_manifests does
            return name
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def tree_groups(path: str, limits):
    """The trees of a spooled batch as groups of (bytes) of at most `decode_bytes` together
    (each tree at most `max_tree_bytes`)."""
    with open(path, "rb") as f:
        blobs = positions(f, os.fstat(f.fileno()).st_size, wire.MAX_MANIFESTS_PER_REQUEST, "trees")
        for _, n in blobs:
            if n > limits.max_tree_bytes:
                raise TooLarge(f"a tree of {n} bytes is over the limit of {limits.max_tree_bytes}")
        group: list[bytes] = []
        group_bytes = 0
        for offset, n in blobs:
            if group and group_bytes + n > limits.decode_bytes:
                yield group
                group, group_bytes = [], 0
            group.append(_read(f, offset, n))
            group_bytes += n
        if group:
            yield group


class LocatedBody:
    """The answer to `GET manifests/{name}?locations=1` for a large manifest, read from the
    store in blocks: prefix, the manifest's bytes, then the located chunks' records."""

    def __init__(self, manifest: ManifestFile, found: dict):
        self.manifest = manifest
        self.prefix = wire.located_prefix(manifest.bytes)
        self.tail = wire.encode_locations(found, manifest.entry.size - 4)
        self.size = len(self.prefix) + manifest.bytes + len(self.tail)

    def block(self, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of the answer."""
        out = bytearray()
        m0, m1 = len(self.prefix), len(self.prefix) + self.manifest.bytes
        if lo < m0:
            out += self.prefix[lo:min(hi, m0)]
        if lo < m1 and hi > m0:
            a, b = max(lo, m0), min(hi, m1)
            data = self.manifest.read(a - m0, b - a)
            if len(data) != b - a:
                raise CorruptionError("a manifest changed or went while it was sent")
            out += data
        if hi > m1:
            out += self.tail[max(lo, m1) - m1:hi - m1]
        return bytes(out)

"""Location records (format v1): where each chunk of one manifest was stored when it was pushed.

    header   20 B   b"CDCLOCS\\0", u32 version, u32 pack count P, u32 entry count N
    packs    P x    u8 name length, the pack name (ASCII hex)
    entries  N x 16 B  u32 pack number (0..P-1), u64 offset, u32 stored length: one per manifest
                    entry, in manifest order (ids and raw lengths come from the manifest)
    codecs   N x 1 B   the codec of each entry

Little-endian. A record is a hint, never the truth: a reader that finds a pack gone (a
repack moved its chunks) drops the hint and looks the chunks up the slow way, and every chunk
read is verified against its id. Pure logic, no I/O.
"""
from __future__ import annotations

import struct

from . import header
from .errors import CorruptionError
from .manifest import Manifest
from .pack import PackEntry

LOCATIONS_VERSION = 1
MAGIC = b"CDCLOCS\x00"
HEADER = struct.Struct("<8sIII")
ENTRY = struct.Struct("<IQI")
MAX_NAME = 128


def encode(manifest: Manifest, where: dict[bytes, tuple[str, PackEntry]]) -> bytes | None:
    """The record of `manifest` from chunk locations (None if any chunk is not located)."""
    packs: dict[str, int] = {}
    entries, codecs = [], bytearray()
    for cid in manifest.chunk_ids:
        found = where.get(cid)
        if found is None:
            return None
        pack, e = found
        entries.append(ENTRY.pack(packs.setdefault(pack, len(packs)), e.offset, e.stored_len))
        codecs.append(e.codec)
    names = b"".join(bytes([len(p)]) + p.encode() for p in packs)
    return HEADER.pack(MAGIC, LOCATIONS_VERSION, len(packs), len(entries)) + names + b"".join(entries) + bytes(codecs)


def decode(data: bytes, manifest: Manifest, what: str = "location record") -> dict[bytes, tuple[str, PackEntry]]:
    """Chunk id -> (pack, entry) for every chunk of `manifest`; CorruptionError if the record
    is malformed or does not fit the manifest."""
    npacks, n = header.unpack(data, HEADER, MAGIC, LOCATIONS_VERSION, "location record", what)
    if n != len(manifest.chunk_ids):
        raise CorruptionError(f"{what} lists {n} chunks; its manifest has {len(manifest.chunk_ids)}")
    pos, packs = HEADER.size, []
    for _ in range(npacks):
        if pos >= len(data) or not 0 < data[pos] <= MAX_NAME or pos + 1 + data[pos] > len(data):
            raise CorruptionError(f"{what} has a damaged pack list")
        name = data[pos + 1:pos + 1 + data[pos]]
        if not name.isascii() or not name.isalnum():
            raise CorruptionError(f"{what} names an invalid pack")
        packs.append(name.decode())
        pos += 1 + data[pos]
    if len(data) != pos + n * (ENTRY.size + 1):
        raise CorruptionError(f"{what} has the wrong length for {n} chunks")
    codecs = data[pos + n * ENTRY.size:]
    out: dict[bytes, tuple[str, PackEntry]] = {}
    for i, (p, offset, stored) in enumerate(ENTRY.iter_unpack(memoryview(data)[pos:pos + n * ENTRY.size])):
        if p >= npacks:
            raise CorruptionError(f"{what} names pack number {p} of {npacks}")
        cid = manifest.chunk_ids[i]
        out[cid] = (packs[p], PackEntry(cid, offset, stored, manifest.lengths[i], codecs[i]))
    return out

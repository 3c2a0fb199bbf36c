"""Manifest bundles (bundle format v1): the manifests of many small files, and their location
records, in one object, so a push of N small files writes N/1024 objects, not 2N.

    header     24 B      b"CDCBNDL\\0", u32 version = 1, u32 entry count N, u64 body bytes
    directory  N x 40 B  manifest name (32 B, the BLAKE3-256 of its bytes), u32 manifest length,
                         u32 location record length (0: none)
    bodies               each entry's manifest bytes, then its location record, in directory order

Little-endian; names strictly ascending (one bundle per set of entries). A bundle is named by
the BLAKE3-256 of its bytes. Each manifest is checked against its name when taken out, so a
bundle only ever yields true manifests whoever wrote it; the location records are hints, as
they are in their own objects (core/locations.py). Pure logic, no I/O.
"""
from __future__ import annotations

import struct

from . import header, ids
from .errors import CorruptionError

BUNDLE_VERSION = 1
MAGIC = b"CDCBNDL\x00"
HEADER = struct.Struct("<8sIIQ")
ENTRY = struct.Struct("<32sII")
MAX_ENTRIES = 1024  # manifests a bundle holds at most
MAX_MANIFEST = 64 * 1024  # a larger manifest (a file of ~1,800+ chunks) is stored on its own
MAX_BYTES = 1024 * 1024  # a bundle's size at most (a reader takes it whole: opening one file reads its bundle)


def fits(manifest: bytes) -> bool:
    """Whether a manifest may go in a bundle (a format v2 one, small enough)."""
    return len(manifest) <= MAX_MANIFEST


def plan(items: list[tuple[str, bytes, bytes]]) -> list[list[tuple[str, bytes, bytes]]]:
    """(name, manifest, record) triples cut into bundles within MAX_ENTRIES and MAX_BYTES, in
    name order (the same set of triples always gives the same bundles)."""
    out: list[list[tuple[str, bytes, bytes]]] = []
    size = 0
    for item in sorted({t[0]: t for t in items}.values()):
        need = ENTRY.size + len(item[1]) + len(item[2])
        if not out or len(out[-1]) >= MAX_ENTRIES or size + need > MAX_BYTES - HEADER.size:
            out.append([])
            size = 0
        out[-1].append(item)
        size += need
    return out


def encode(items: list[tuple[str, bytes, bytes]]) -> bytes:
    """One bundle of (name, manifest bytes, location record bytes), sorted by name."""
    items = sorted(items)
    if not 0 < len(items) <= MAX_ENTRIES:
        raise ValueError(f"a bundle holds 1 to {MAX_ENTRIES} manifests, not {len(items)}")
    names = [n for n, _, _ in items]
    if len(set(names)) != len(names) or not all(ids.is_new_hex_id(n) for n in names):
        raise ValueError("bundle entries need distinct format v2 manifest names")
    body = b"".join(m + r for _, m, r in items)
    directory = b"".join(ENTRY.pack(bytes.fromhex(n), len(m), len(r)) for n, m, r in items)
    data = HEADER.pack(MAGIC, BUNDLE_VERSION, len(items), len(body)) + directory + body
    if len(data) > MAX_BYTES:
        raise ValueError(f"a bundle is at most {MAX_BYTES} bytes")
    return data


def decode(data: bytes | memoryview, what: str = "manifest bundle") -> dict[str, tuple[bytes, bytes]]:
    """Manifest name -> (manifest bytes, location record bytes); CorruptionError if the bundle
    is malformed or any manifest does not match its name."""
    data = memoryview(data)
    n, body = header.unpack(data, HEADER, MAGIC, BUNDLE_VERSION, "manifest bundle", what)
    start = HEADER.size + n * ENTRY.size
    if not 0 < n <= MAX_ENTRIES or start + body != len(data):
        raise CorruptionError(f"{what} is damaged ({n} entries, {len(data)} bytes)")
    out: dict[str, tuple[bytes, bytes]] = {}
    pos, last = start, b""
    for raw, mlen, rlen in ENTRY.iter_unpack(data[HEADER.size:start]):
        if raw <= last or pos + mlen + rlen > len(data) or mlen == 0:
            raise CorruptionError(f"{what} has a damaged directory")
        name, last = raw.hex(), raw
        manifest = bytes(data[pos:pos + mlen])
        if not ids.matches(manifest, name):
            raise CorruptionError(f"{what}: manifest {name} does not match its name (damaged or forged)")
        out[name] = (manifest, bytes(data[pos + mlen:pos + mlen + rlen]))
        pos += mlen + rlen
    if pos != len(data):
        raise CorruptionError(f"{what} has bytes its directory does not account for")
    return out

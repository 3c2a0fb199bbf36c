"""Wire format v1 of the HTTP protocol (pure logic: bodies and limits).

docs/protocol.md describes the endpoints; this module is the one place that
encodes and decodes their binary bodies, so the server and the client cannot
drift apart.
"""
from __future__ import annotations

import hashlib
import struct

from ..core.errors import CorruptionError
from ..core.pack import PackEntry

API = "/v1"
PROTOCOL_VERSION = 1
ID = 16

# limits the server enforces (and the client respects)
MAX_IDS_PER_REQUEST = 65536
MAX_PACK_BYTES = 128 * 1024 * 1024
MAX_MANIFEST_BATCH_BYTES = 64 * 1024 * 1024
MAX_MANIFESTS_PER_REQUEST = 10_000
MAX_JSON_BYTES = 16 * 1024 * 1024

LOCATE = struct.Struct("<16s16sQIIB3x")  # chunk id, pack name (16 raw bytes), offset, stored, raw, codec
_LEN = struct.Struct("<I")


def encode_ids(ids: list[bytes]) -> bytes:
    return b"".join(ids)


def decode_ids(body: bytes) -> list[bytes]:
    if len(body) % ID:
        raise ValueError(f"body of {len(body)} bytes is not a whole number of 16-byte ids")
    n = len(body) // ID
    if n > MAX_IDS_PER_REQUEST:
        raise ValueError(f"{n} ids in one request; the limit is {MAX_IDS_PER_REQUEST}")
    return [body[i * ID:(i + 1) * ID] for i in range(n)]


def encode_presence(ids: list[bytes], present: set[bytes], provable: set[bytes] = frozenset(),
                    nonce: bytes = b"") -> bytes:
    """N flags (1 held, 2 held but prove it, 0 absent), then the 16-byte nonce for proofs if any flag is 2."""
    return bytes(1 if i in present else 2 if i in provable else 0 for i in ids) + (nonce if provable else b"")


def decode_presence(ids: list[bytes], body: bytes) -> set[bytes]:
    """Chunks answered 1 (held and visible)."""
    return {i for i, flag in zip(ids, _flags(ids, body)) if flag == 1}


def decode_to_prove(ids: list[bytes], body: bytes) -> list[bytes]:
    """Chunks answered 2 (held, but the token must prove it holds their bytes)."""
    return [i for i, flag in zip(ids, _flags(ids, body)) if flag == 2]


def presence_nonce(ids: list[bytes], body: bytes) -> bytes:
    """The nonce to key proofs with (after the flags), or b"" when nothing is to be proved."""
    _flags(ids, body)
    return body[len(ids):]


def _flags(ids: list[bytes], body: bytes) -> bytes:
    if len(body) not in (len(ids), len(ids) + ID):
        raise CorruptionError("presence answer has the wrong length")
    return body[:len(ids)]


PROVE_HEADER = "X-Cdc-Prove"  # a query that sends it may get 2 = "held: prove you hold it" (protocol 1.1)
MAX_PROOFS_PER_REQUEST = 4096
PROOF = 16  # bytes of blake2b(raw chunk, key=nonce)


def chunk_proof(raw, nonce: bytes) -> bytes:
    """Proof that the sender holds a chunk's bytes: a keyed blake2b of them."""
    return hashlib.blake2b(raw, key=nonce, digest_size=PROOF).digest()


def encode_proofs(nonce: bytes, proofs: list[tuple[bytes, bytes]]) -> bytes:
    return nonce + b"".join(cid + proof for cid, proof in proofs)


def decode_proofs(body: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    nonce, rest = body[:ID], body[ID:]
    if len(nonce) != ID or len(rest) % (ID + PROOF):
        raise ValueError("proof body must be a 16-byte nonce then 32-byte (chunk id, proof) pairs")
    n = len(rest) // (ID + PROOF)
    if n > MAX_PROOFS_PER_REQUEST:
        raise ValueError(f"{n} proofs in one request; the limit is {MAX_PROOFS_PER_REQUEST}")
    step = ID + PROOF
    return nonce, [(rest[i:i + ID], rest[i + ID:i + step]) for i in range(0, len(rest), step)]


def encode_locations(found: dict[bytes, tuple[str, PackEntry]]) -> bytes:
    return b"".join(LOCATE.pack(cid, bytes.fromhex(pack), e.offset, e.stored_len, e.raw_len, e.codec)
                    for cid, (pack, e) in found.items())


def decode_locations(body: bytes) -> dict[bytes, tuple[str, PackEntry]]:
    if len(body) % LOCATE.size:
        raise CorruptionError("location answer has the wrong length")
    return {cid: (pack.hex(), PackEntry(cid, off, slen, rlen, codec))
            for cid, pack, off, slen, rlen, codec in LOCATE.iter_unpack(body)}


LOCATED_MAGIC = b"CDCMLOC\x00"  # `GET manifests/{name}?locations=1` (protocol 1.3)
LOCATED_ENDS = 512  # it locates a manifest's first and last this many chunks (a reader's block)


def encode_located(manifest: bytes, found: dict[bytes, tuple[str, PackEntry]]) -> bytes:
    """A manifest and locations of its chunks in one body: magic, u32 manifest length,
    the manifest's bytes, then `encode_locations`."""
    return LOCATED_MAGIC + _LEN.pack(len(manifest)) + manifest + encode_locations(found)


def decode_located(body: bytes) -> tuple[bytes, dict[bytes, tuple[str, PackEntry]]]:
    """(manifest bytes, locations); a plain manifest (a server before 1.3 ignores the
    query) comes back with no locations."""
    if not body.startswith(LOCATED_MAGIC):
        return body, {}
    head = len(LOCATED_MAGIC) + _LEN.size
    if len(body) < head:
        raise CorruptionError("manifest-with-locations answer is truncated")
    (n,) = _LEN.unpack_from(body, len(LOCATED_MAGIC))
    if head + n > len(body):
        raise CorruptionError("manifest-with-locations answer is truncated")
    return body[head:head + n], decode_locations(body[head + n:])


def encode_blobs(blobs: list[bytes]) -> bytes:
    """Length-prefixed concatenation (manifest batches)."""
    return b"".join(_LEN.pack(len(b)) + b for b in blobs)


def decode_blobs(body: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(body):
        if pos + 4 > len(body):
            raise ValueError("truncated blob length")
        (n,) = _LEN.unpack_from(body, pos)
        pos += 4
        if pos + n > len(body):
            raise ValueError("blob longer than the body")
        out.append(body[pos:pos + n])
        pos += n
    return out

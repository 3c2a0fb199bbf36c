"""Wire format of the HTTP protocol (pure logic: bodies and limits).

Chunk ids in bodies are 32 bytes (BLAKE3-256, format v2) or, for reads of format-v1
data, 16 (xxh3-128): a request says which in `ID_HEADER` (absent: 16, as clients
before protocol 2.0 sent); every id of one body has that width.

docs/protocol.md describes the endpoints; this module is the one place that
encodes and decodes their binary bodies, so the server and the client cannot
drift apart.
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Set as AbstractSet
from typing import TYPE_CHECKING

from . import ids as _ids
from .address import check_name
from .chunker import MAX_CHUNK_BYTES
from .errors import CorruptionError
from .pack import PackEntry

if TYPE_CHECKING:
    from typing_extensions import Buffer

API = "/v1"
PROTOCOL_VERSION = 2  # 2.0: 32-byte BLAKE3 ids (ID_HEADER); 16-byte ids are refused for new data
ID = _ids.ID_BYTES  # width of the ids of new data
LEGACY_ID = _ids.LEGACY_ID_BYTES
ID_HEADER = "X-Cdc-Id-Bytes"  # the width of the ids in a request body: "32", or "16" (also when absent)
NONCE = 16  # bytes of a proof nonce

# limits the server enforces (and the client respects)
MAX_IDS_PER_REQUEST = 65536
MAX_PACK_BYTES = 128 * 1024 * 1024
MAX_MANIFEST_BATCH_BYTES = 64 * 1024 * 1024
MAX_MANIFESTS_PER_REQUEST = 10_000
MAX_JSON_BYTES = 16 * 1024 * 1024

# chunk id, pack name (raw bytes; a chunk of W-byte id lives in a pack of W-byte name), offset,
# stored, raw, codec: W = 32 (84-byte records) or, for format-v1 data, 16 (52-byte records)
LOCATES = {ID: struct.Struct("<32s32sQIIB3x"), LEGACY_ID: struct.Struct("<16s16sQIIB3x")}
LOCATE = LOCATES[ID]
_LEN = struct.Struct("<I")


def url_repo(repo: str | None) -> str | None:
    """A repo name checked before it goes into a URL (one clear error, as a local store gives)."""
    return repo if repo is None else check_name("repo", repo)


def id_width(header: str | None) -> int:
    """The id width a request declares in `ID_HEADER` (16 when it says nothing)."""
    if header is None:
        return LEGACY_ID
    if header.strip() not in ("16", "32"):
        raise ValueError(f"{ID_HEADER} must be 32 (BLAKE3 ids) or 16 (format-v1 ids), not {header!r}")
    return int(header)


def id_headers(width: int) -> dict[str, str]:
    return {ID_HEADER: str(width)}


def encode_ids(ids: list[bytes]) -> bytes:
    return b"".join(ids)


def decode_ids(body: bytes, width: int = ID) -> list[bytes]:
    if len(body) % width:
        raise ValueError(f"body of {len(body)} bytes is not a whole number of {width}-byte ids")
    n = len(body) // width
    if n > MAX_IDS_PER_REQUEST:
        raise ValueError(f"{n} ids in one request; the limit is {MAX_IDS_PER_REQUEST}")
    return [body[i * width:(i + 1) * width] for i in range(n)]


def by_width(chunk_ids: Iterable[bytes]) -> dict[int, list[bytes]]:
    """Ids grouped by width (one request per width), in order within each group."""
    out: dict[int, list[bytes]] = {}
    for c in chunk_ids:
        out.setdefault(len(c), []).append(c)
    return out


def encode_presence(ids: list[bytes], present: set[bytes], provable: AbstractSet[bytes] = frozenset(),
                    nonce: bytes = b"") -> bytes:
    """N flags (1 held, 2 prove it: a scoped token may not see it, held or not; 0 absent), then the 16-byte
    nonce for proofs if any flag is 2."""
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
    if len(body) not in (len(ids), len(ids) + NONCE):
        raise CorruptionError("presence answer has the wrong length")
    return body[:len(ids)]


STORE_HEADER = "X-Cdc-Store"  # every answer names the store behind the URL (its `store-id`): clients key heads by it
NATIVE_PORT_HEADER = "X-Cdc-Native-Port"  # the S3 gateway's errors name the API's port (a native client sent there)
PROVE_HEADER = "X-Cdc-Prove"  # a query that sends it may get 2 = "prove you hold it" (protocol 1.1)
MAX_PROOFS_PER_REQUEST = 4096
PROOF = 16  # bytes of blake2b(raw chunk, key=nonce)


def chunk_proof(raw: Buffer, nonce: bytes) -> bytes:
    """Proof that the sender holds a chunk's bytes: a keyed blake2b of them."""
    return hashlib.blake2b(raw, key=nonce, digest_size=PROOF).digest()


def encode_proofs(nonce: bytes, proofs: list[tuple[bytes, bytes]]) -> bytes:
    return nonce + b"".join(cid + proof for cid, proof in proofs)


def decode_proofs(body: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    nonce, rest = body[:NONCE], body[NONCE:]
    if len(nonce) != NONCE or len(rest) % (ID + PROOF):
        raise ValueError(f"proof body must be a {NONCE}-byte nonce then {ID + PROOF}-byte (chunk id, proof) "
                         f"pairs (32-byte chunk ids)")
    n = len(rest) // (ID + PROOF)
    if n > MAX_PROOFS_PER_REQUEST:
        raise ValueError(f"{n} proofs in one request; the limit is {MAX_PROOFS_PER_REQUEST}")
    step = ID + PROOF
    return nonce, [(rest[i:i + ID], rest[i + ID:i + step]) for i in range(0, len(rest), step)]


def encode_locations(found: dict[bytes, tuple[str, PackEntry]], width: int = ID) -> bytes:
    """Locations of chunks whose ids are `width` bytes (their packs' names are as wide)."""
    rec = LOCATES[width]
    return b"".join(rec.pack(cid, bytes.fromhex(pack), e.offset, e.stored_len, e.raw_len, e.codec)
                    for cid, (pack, e) in found.items() if len(cid) == width and len(pack) == 2 * width)


def decode_locations(body: bytes, width: int = ID) -> dict[bytes, tuple[str, PackEntry]]:
    rec = LOCATES[width]
    if len(body) % rec.size:
        raise CorruptionError("location answer has the wrong length")
    out = {cid: (pack.hex(), PackEntry(cid, off, slen, rlen, codec))
           for cid, pack, off, slen, rlen, codec in rec.iter_unpack(body)}
    if any(e.stored_len > MAX_CHUNK_BYTES or e.raw_len > MAX_CHUNK_BYTES for _, e in out.values()):
        raise CorruptionError(f"location answer lists a chunk over the format's {MAX_CHUNK_BYTES} bytes: "
                              f"the server is damaged or not a cdcstore server")  # a client never asks more
    return out


LOCATED_MAGIC = b"CDCMLOC\x00"  # `GET manifests/{name}?locations=1` (protocol 1.3)
LOCATED_ENDS = 512  # it locates a manifest's first and last this many chunks (a reader's block)


def _manifest_id_width(manifest: bytes) -> int:
    """The chunk-id width of a manifest's bytes (16 in a format-v1 manifest, else 32)."""
    return LEGACY_ID if manifest[8:12] == b"\x01\x00\x00\x00" else ID


def encode_located(manifest: bytes, found: dict[bytes, tuple[str, PackEntry]]) -> bytes:
    """A manifest and locations of its chunks in one body: magic, u32 manifest length,
    the manifest's bytes, then `encode_locations` (ids as wide as the manifest's)."""
    return located_prefix(len(manifest)) + manifest + encode_locations(found, _manifest_id_width(manifest))


def located_prefix(manifest_size: int) -> bytes:
    """What comes before the manifest's bytes in `encode_located` (a server streams the rest)."""
    return LOCATED_MAGIC + _LEN.pack(manifest_size)


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
    manifest = body[head:head + n]
    return manifest, decode_locations(body[head + n:], _manifest_id_width(manifest))


TREES_PER_GET = 1024  # trees one POST /repos/{repo}/trees/get names at most (protocol 2.1)

# `POST /repos/{repo}/manifests/located` (protocol 2.3): many `?locations=1` answers in one, each
# with the raw bytes of its file's last chunks (a Parquet footer)
LOCATED_MANY_MAGIC = b"CDCMLOCS"
LOCATED_MANY_VERSION = 1  # the answer's format; a client refuses another
LOCATED_PER_GET = 1024  # manifests one request names at most
MAX_TAIL = 1 << 20  # the largest `tail` a request may ask (bytes at the end of each file)
MAX_TAIL_SENT = 4 << 20  # a file's tail (whole chunks) is sent only up to this size
_LOCATED_MANY_HEAD = struct.Struct("<8sII")  # magic, format version, entries answered


def encode_located_many(entries: list[tuple[bytes, bytes]]) -> bytes:
    """The answer to `manifests/located`: magic, u32 version, u32 count, then per manifest answered
    (the first `count` asked, in order) a u32 length and its `encode_located` body (empty: not
    served here, ask for it alone), then a u32 length and the raw bytes of the file from the
    start of the chunk that holds its byte `size - tail` to its end (empty: none sent)."""
    out = [_LOCATED_MANY_HEAD.pack(LOCATED_MANY_MAGIC, LOCATED_MANY_VERSION, len(entries))]
    for located, tail in entries:
        out += [_LEN.pack(len(located)), located, _LEN.pack(len(tail)), tail]
    return b"".join(out)


def decode_located_many(body: Buffer, asked: int) -> list[tuple[memoryview, memoryview]]:
    """(located body, tail) of each manifest answered, from `encode_located_many`; at least one
    and at most `asked`. Views of `body`."""
    view = memoryview(body).cast("B")
    if len(view) < _LOCATED_MANY_HEAD.size:
        raise CorruptionError("manifests-located answer is truncated")
    magic, version, count = _LOCATED_MANY_HEAD.unpack_from(view)
    if magic != LOCATED_MANY_MAGIC:
        raise CorruptionError("manifests-located answer does not start with its magic")
    if version != LOCATED_MANY_VERSION:
        raise CorruptionError(f"manifests-located answer of format {version}; this cdcstore reads "
                              f"{LOCATED_MANY_VERSION}: upgrade it")
    if not 1 <= count <= asked:
        raise CorruptionError(f"manifests-located answer holds {count} entries for {asked} asked")
    out, pos = [], _LOCATED_MANY_HEAD.size
    for _ in range(count):
        parts = []
        for _ in range(2):
            if pos + _LEN.size > len(view):
                raise CorruptionError("manifests-located answer is truncated")
            (n,) = _LEN.unpack_from(view, pos)
            pos += _LEN.size
            if pos + n > len(view):
                raise CorruptionError("manifests-located answer is truncated")
            parts.append(view[pos:pos + n])
            pos += n
        out.append((parts[0], parts[1]))
    if pos != len(view):
        raise CorruptionError("manifests-located answer has bytes past its last entry")
    return out


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

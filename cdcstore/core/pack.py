"""Packs (format v2; v1 still read): immutable containers of compressed chunks (pure logic).

    header   16 B   b"CDCPACK\\0", u32 version (2), u32 reserved (0)
    records         each chunk's stored bytes, back to back
    index    N*64 B per chunk: id (32 B, BLAKE3-256 of the raw chunk), offset u64,
                    stored length u32, raw length u32, xxh3-64 of the raw chunk u64,
                    codec u8 (0 raw, 1 zstd), 7 zero bytes
    trailer  32 B   u32 N, u32 version, xxh3-128 of the index, b"CDCPEND\\0"

All integers are little-endian. A v2 pack is named by the BLAKE3-256 of all its bytes.
Version 1 differs only in its index entries (N*36 B: id 16 B xxh3-128, offset u64,
stored u32, raw u32, codec u8, 3 zero bytes; no checksum) and in its name (xxh3-128).
Every chunk is checked against its id before it is written (`encode_chunk`) and
whenever it crosses a trust boundary (`decode_chunk`); the xxh3-64 checksum lets a
store's reads of its own packs detect damage cheaply (`decode_checked`).
"""
from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Generic, Literal, TypeVar, cast, overload

import zstandard

from . import _xxh3, ids
from .chunker import MAX_CHUNK_BYTES
from .errors import CorruptionError

PACK_VERSION = 2
LEGACY_PACK_VERSION = 1
MAGIC = b"CDCPACK\x00"
END_MAGIC = b"CDCPEND\x00"
HEADER = struct.Struct("<8sII")
ENTRY = struct.Struct("<32sQIIQB7x")  # v2: id, offset, stored, raw, xxh3-64 of raw, codec
LEGACY_ENTRY = struct.Struct("<16sQIIB3x")  # v1: id, offset, stored, raw, codec
ENTRIES = {PACK_VERSION: ENTRY, LEGACY_PACK_VERSION: LEGACY_ENTRY}
TRAILER = struct.Struct("<II16s8s")
CODEC_RAW = 0
CODEC_ZSTD = 1
DEFAULT_MAX_PACK_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_PACK_CHUNKS = 8192
DEFAULT_ZSTD_LEVEL = 1  # as small as level 3 on Parquet, CSV and JSON, and faster to write (docs/compression.md)
# pack files are written through a buffer this large: the page cache then holds them in large
# folios, and reading them back costs about half the CPU it does after 64 KiB writes (Linux 6.x)
WRITE_BUFFER = 4 * 1024 * 1024

#: bytes of a chunk: a raw chunk is handed back as the object it came in (no copy)
_Bytes = TypeVar("_Bytes", bound="bytes | bytearray | memoryview")
#: what `PackWriter.finish` returns: the pack's name, or None when it is not hashed as written
_Name = TypeVar("_Name", bound="str | None", covariant=True)


@dataclass(frozen=True, slots=True)
class PackEntry:
    """Where one chunk lives inside a pack."""

    chunk_id: bytes
    offset: int
    stored_len: int
    raw_len: int
    codec: int
    # xxh3-64 of the raw chunk (pack v2); None in v1 packs and where not carried (index rows,
    # wire locations): not part of an entry's identity
    check: int | None = field(default=None, compare=False)


_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "decompressor", None)
    if d is None:
        d = _local.decompressor = zstandard.ZstdDecompressor()
    return d


def _bounded_decompress(stored: bytes | bytearray | memoryview, raw_len: int) -> bytes:
    """Decompress at most `raw_len` + 1 bytes: a frame whose header claims another
    size is refused unread (zstd would allocate whatever the header claims)."""
    size = zstandard.frame_content_size(stored)
    if size == raw_len:
        return _decompressor().decompress(stored, max_output_size=raw_len)
    if size != -1:
        raise zstandard.ZstdError(f"its frame declares {size} bytes, the index {raw_len}")
    with _decompressor().stream_reader(stored) as r:
        return r.read(raw_len + 1)


PROBE_BYTES = 2048  # each of the three samples `encode_chunk` compresses first
MIN_SAVING = 1 / 4  # zstd is kept only when it saves at least this fraction of a chunk (docs/compression.md)


def worth_compressing(raw: bytes | bytearray | memoryview) -> bool:
    """A cheap probe: does zstd (level 1) save at least `MIN_SAVING` on three 2 KiB
    samples of the chunk (its start, middle and end, compressed as one)? Already
    compressed bytes (Parquet pages, images, archives) fail it, so they are never fed
    to zstd whole; text, CSV and JSON pass it."""
    n = len(raw)
    if n <= 3 * PROBE_BYTES:
        return True  # small: the whole chunk is the probe
    step = (n - PROBE_BYTES) // 2
    sample = b"".join((raw[:PROBE_BYTES], raw[step:step + PROBE_BYTES], raw[n - PROBE_BYTES:]))
    return len(_compressor(1).compress(sample)) <= len(sample) * (1 - MIN_SAVING)


class FileProbe:
    """Which chunks of one file are worth zstd, in file order (pure; one per file).

    Every chunk is probed (`worth_compressing`) until `RUN` in a row fail; from then on only
    one chunk in `EVERY` is, and the rest are stored raw unprobed, until a probe passes and
    every chunk is probed again. A file of compressed pages (Parquet with snappy or zstd,
    images, archives) then pays for about one probe in `EVERY` chunks; a file that compresses
    is probed as before. `regions`: offsets where the data changes kind (a Parquet file's column
    chunks), each starting with its first chunk probed; inside a region one failed probe is
    enough (`REGION_RUN`: a column chunk's pages are all compressed by its codec, or none is).
    `worth` must see every chunk of the file, in order. The choice changes how a chunk is
    stored, never its id."""

    RUN = 8
    REGION_RUN = 1
    EVERY = 16

    def __init__(self, regions: list[int] | None = None) -> None:
        self._fails = 0
        self._n = 0
        self._regions = list(regions or ())
        self._run = self.REGION_RUN if self._regions else self.RUN
        self._next = 0  # index of the next region start not yet passed
        self._offset = 0  # where the next chunk starts in the file

    def worth(self, raw: bytes | bytearray | memoryview) -> bool:
        """Whether to compress `raw`, the file's next chunk."""
        offset, self._offset = self._offset, self._offset + len(raw)
        regions = self._regions
        if self._next < len(regions) and offset >= regions[self._next]:
            while self._next < len(regions) and offset >= regions[self._next]:
                self._next += 1
            self._fails = 0
        self._n += 1
        if self._fails >= self._run and self._n % self.EVERY:
            return False
        ok = worth_compressing(raw)
        self._fails = 0 if ok else self._fails + 1
        return ok


def encode_chunk(raw: _Bytes, chunk_id: bytes, level: int = DEFAULT_ZSTD_LEVEL, id_of_raw: bool = False,
                 probe: bool | None = None) -> tuple[int, bytes | _Bytes]:
    """Compress a chunk for storage and verify the result decodes to `chunk_id`.

    Returns (codec, stored bytes). The chunk is kept raw when the probe says zstd
    would not pay (`probe`: the caller's answer, e.g. a `FileProbe`'s; None: probe it
    here), or when zstd saves less than `MIN_SAVING` of it. A compressed
    chunk is always decoded and re-hashed; a raw one is re-hashed unless `id_of_raw`
    says the caller computed `chunk_id` from these very bytes, unchanged since (a push's
    read-only views of read blocks nothing writes while a view is alive): hashing them
    again would check nothing new.
    Safe to call from several threads at once (zstd releases the GIL).
    """
    raw_len = len(raw)
    if raw_len and (worth_compressing(raw) if probe is None else probe):
        packed = _compressor(level).compress(raw)
        if len(packed) <= raw_len * (1 - MIN_SAVING):
            decode_chunk(packed, CODEC_ZSTD, raw_len, chunk_id)
            return CODEC_ZSTD, packed
    if not id_of_raw and not ids.matches(raw, chunk_id):
        raise CorruptionError(f"chunk {chunk_id.hex()} does not match its id")
    return CODEC_RAW, raw


def _unpack(stored: _Bytes, codec: int, raw_len: int, chunk_id: bytes) -> bytes | _Bytes:
    if not 0 <= raw_len <= MAX_CHUNK_BYTES:
        raise CorruptionError(f"chunk {chunk_id.hex()} claims {raw_len} bytes; the format's maximum "
                              f"chunk size is {MAX_CHUNK_BYTES}")
    raw: bytes | _Bytes
    if codec == CODEC_ZSTD:
        try:
            raw = _bounded_decompress(stored, raw_len)
        except zstandard.ZstdError as e:
            raise CorruptionError(f"chunk {chunk_id.hex()} does not decompress: {e}") from None
    elif codec == CODEC_RAW:
        raw = stored  # no copy: a view stays a view
    else:
        raise CorruptionError(f"chunk {chunk_id.hex()} has unknown codec {codec}")
    if len(raw) != raw_len:
        raise CorruptionError(f"chunk {chunk_id.hex()} does not match its id")
    return raw


def decode_chunk(stored: _Bytes, codec: int, raw_len: int, chunk_id: bytes,
                 check: int | None = None) -> bytes | _Bytes:
    """The raw bytes of a stored chunk (bytes-like: a raw chunk comes back as the
    object it was given), checked against its id (the hash its length names) and
    length, and against `check` (its xxh3-64) when given. A raw length over the
    format's maximum is refused before anything is decompressed, and decompression
    never produces more than `raw_len` bytes. Use this for bytes from anywhere."""
    raw = _unpack(stored, codec, raw_len, chunk_id)
    if not ids.matches(raw, chunk_id) or (check is not None and ids.checksum(raw) != check):
        raise CorruptionError(f"chunk {chunk_id.hex()} does not match its id")
    return raw


def decode_checked(stored: _Bytes, codec: int, raw_len: int, chunk_id: bytes,
                   check: int | None) -> bytes | _Bytes:
    """`decode_chunk` for a store's reads of its own pack: checked against the entry's
    xxh3-64 checksum when it has one (damage detection; the id was verified when the
    pack was written or received), else against the id."""
    if check is None:
        return decode_chunk(stored, codec, raw_len, chunk_id)
    raw = _unpack(stored, codec, raw_len, chunk_id)
    if ids.checksum(raw) != check:
        raise CorruptionError(f"chunk {chunk_id.hex()} does not match its id (its checksum differs)")
    return raw


read_run = _xxh3.read_run  # (fd, offset, out, lengths, checks) -> -1, a bad chunk's index, or -2: see _xxh3.c


def first_mismatch(view: bytes | bytearray | memoryview, chunk_ids: Sequence[bytes], lengths: Sequence[int],
                   checks: Sequence[int | None] | None = None) -> int:
    """The index of the first raw chunk, of those back to back in `view`, whose bytes do
    not match its id (or, where `checks` gives one, its xxh3-64 checksum: a store's own
    pack); -1 when all match (each is hashed straight from `view`)."""
    if checks is not None and None not in checks:
        return _xxh3.first_mismatch(view, lengths, cast("Sequence[int]", checks))  # in C, the GIL released
    pos = 0
    checksum = ids.checksum
    for k, (cid, n) in enumerate(zip(chunk_ids, lengths)):
        c = checks[k] if checks is not None else None
        if not (checksum(view[pos:pos + n]) == c if c is not None else ids.matches(view[pos:pos + n], cid)):
            return k
        pos += n
    return -1


class PackWriter(Generic[_Name]):
    """Appends verified chunks to a binary file and finishes it with the index.

    The caller owns the file (a temp file, normally) and decides where the finished
    pack goes; `finish` returns the pack name (hex). New packs are version 2; version 1
    (16-byte ids, named by xxh3-128) is written only to repack a v1 pack's chunks and
    by tests that build old stores. A pack's ids all have its version's width.
    """

    @overload
    def __init__(self: PackWriter[str], out: BinaryIO, version: int = ...,
                 hash_as_written: Literal[True] = ...) -> None: ...

    @overload
    def __init__(self: PackWriter[None], out: BinaryIO, version: int = ..., *,
                 hash_as_written: Literal[False]) -> None: ...

    @overload
    def __init__(self: PackWriter[str | None], out: BinaryIO, version: int = ...,
                 hash_as_written: bool = ...) -> None: ...

    def __init__(self, out: BinaryIO, version: int = PACK_VERSION, hash_as_written: bool = True) -> None:
        if version not in ENTRIES:
            raise ValueError(f"pack version {version}; this cdcstore writes {sorted(ENTRIES)}")
        self.version = version
        self._id_bytes = ids.ID_BYTES if version == PACK_VERSION else ids.LEGACY_ID_BYTES
        self._out = out
        # without hash_as_written the caller names the pack from the finished file's bytes
        self._hash: ids.Hasher | None = \
            (ids.hasher() if version == PACK_VERSION else ids.legacy_hasher()) if hash_as_written else None
        self.entries: list[PackEntry] = []
        self.size = 0
        self._write(HEADER.pack(MAGIC, version, 0))

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self._out.write(data)
        if self._hash is not None:
            self._hash.update(data)
        self.size += len(data)

    def add(self, chunk_id: bytes, codec: int, stored: bytes | bytearray | memoryview, raw_len: int,
            check: int | None = None) -> PackEntry:
        """Append a chunk's stored bytes. A v2 entry carries the xxh3-64 of the raw chunk:
        pass it as `check` (the caller has the raw bytes); without it the stored bytes
        are decoded to compute it (not verified: `encode_chunk` and readers do that)."""
        if len(chunk_id) != self._id_bytes:
            raise ValueError(f"a pack of format v{self.version} holds {self._id_bytes}-byte ids, "
                             f"not {len(chunk_id)}-byte ones")
        if self.version == PACK_VERSION:
            if check is None:
                try:
                    check = ids.checksum(_unpack(stored, codec, raw_len, chunk_id))
                except CorruptionError:  # undecodable (a test's hostile pack): every reader refuses it
                    check = 0
        else:
            check = None
        entry = PackEntry(chunk_id, self.size, len(stored), raw_len, codec, check)
        self._write(stored)
        self.entries.append(entry)
        return entry

    def finish(self) -> _Name:
        if self.version == PACK_VERSION:
            index = b"".join(ENTRY.pack(e.chunk_id, e.offset, e.stored_len, e.raw_len, e.check, e.codec)
                             for e in self.entries)
        else:
            index = b"".join(LEGACY_ENTRY.pack(e.chunk_id, e.offset, e.stored_len, e.raw_len, e.codec)
                             for e in self.entries)
        self._write(index)
        self._write(TRAILER.pack(len(self.entries), self.version, _index_digest(index), END_MAGIC))
        return cast(_Name, self._hash.hexdigest() if self._hash is not None else None)  # per __init__'s overloads


def _index_digest(index: bytes) -> bytes:
    """The trailer's check of the index: xxh3-128 in both versions (damage detection; the
    pack's name covers the index too)."""
    return ids.legacy_digest(index)


def read_index(f: BinaryIO, size: int, name: str = "pack") -> list[PackEntry]:
    """Parse and check a pack's index (v2 or v1) from an open file of `size` bytes."""
    if size < HEADER.size + TRAILER.size:
        raise CorruptionError(f"{name} is truncated ({size} bytes)")
    f.seek(0)
    magic, version, _ = HEADER.unpack(f.read(HEADER.size))
    if magic != MAGIC:
        raise CorruptionError(f"{name} is not a cdcstore pack (bad magic)")
    entry_struct = ENTRIES.get(version)
    if entry_struct is None:
        raise CorruptionError(f"{name} has pack format version {version}; this cdcstore reads "
                              f"{LEGACY_PACK_VERSION} and {PACK_VERSION}")
    f.seek(size - TRAILER.size)
    count, tversion, index_digest, end = TRAILER.unpack(f.read(TRAILER.size))
    if end != END_MAGIC or tversion != version:
        raise CorruptionError(f"{name} is truncated or damaged (bad trailer)")
    index_len = count * entry_struct.size
    index_start = size - TRAILER.size - index_len
    if index_start < HEADER.size:
        raise CorruptionError(f"{name} is damaged (index larger than pack)")
    f.seek(index_start)
    index = f.read(index_len)
    if _index_digest(index) != index_digest:
        raise CorruptionError(f"{name} has a damaged index")
    if version == PACK_VERSION:
        entries = [PackEntry(cid, off, slen, rlen, codec, check)
                   for cid, off, slen, rlen, check, codec in ENTRY.iter_unpack(index)]
    else:
        entries = [PackEntry(*fields) for fields in LEGACY_ENTRY.iter_unpack(index)]
    for e in entries:
        if e.offset < HEADER.size or e.offset + e.stored_len > index_start:
            raise CorruptionError(f"{name} has an index entry outside its records")
        if e.raw_len > MAX_CHUNK_BYTES:
            raise CorruptionError(f"{name} has a chunk of {e.raw_len} bytes; the format's maximum chunk "
                                  f"size is {MAX_CHUNK_BYTES}")
    return entries


def pack_version(f: BinaryIO) -> int:
    """The format version in a pack's header, unchecked (0 if it is too short for one)."""
    f.seek(0)
    head = f.read(HEADER.size)
    return HEADER.unpack(head)[1] if len(head) == HEADER.size else 0


def read_verified(f: BinaryIO, size: int, name: str = "pack") -> list[PackEntry]:
    """`read_index`, then decode every chunk and check it against its id and checksum (ids
    are never taken on trust): the entries of a pack that is whole."""
    entries = read_index(f, size, name)
    for e in entries:
        f.seek(e.offset)
        decode_chunk(f.read(e.stored_len), e.codec, e.raw_len, e.chunk_id, e.check)
    return entries

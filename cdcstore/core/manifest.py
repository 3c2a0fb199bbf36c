"""File manifests (format v2; v1 still read): a file as the ordered list of its chunks.

    header  48 B   b"CDCMANI\\0", u32 version (2), u32 chunk count N, u64 file size,
                   xxh3-128 of the whole file (16 B; a check, not a name), 8 zero bytes
    entries N*36 B chunk id (32 B, BLAKE3-256), u32 raw length

Little-endian. A v2 manifest is named by the BLAKE3-256 of its bytes. Version 1 has
16-byte (xxh3-128) chunk ids (N*20 B entries) and is named by its xxh3-128. Pure
logic: the byte-range planning a reader needs (`span`) lives here, away from any I/O.
"""
from __future__ import annotations

import array
import bisect
import itertools
import operator
import struct
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from . import ids
from .chunker import DEFAULT_PARAMS, MAX_CHUNK_BYTES
from .errors import CorruptionError
from .pages import CUT_ALLOWANCE, MIN_CUT_SPACING

#: The largest manifest a store takes: one upload batch (`wire.MAX_MANIFEST_BATCH_BYTES`)
#: less its 4-byte length. With 36-byte entries, 1,864,133 chunks (`max_entries`).
MAX_MANIFEST_BYTES = 64 * 1024 * 1024 - 4

MANIFEST_VERSION = 2
LEGACY_MANIFEST_VERSION = 1
MAGIC = b"CDCMANI\x00"
HEADER = struct.Struct("<8sIIQ16s8x")
ENTRY = struct.Struct("<32sI")
LEGACY_ENTRY = struct.Struct("<16sI")
ENTRIES = {MANIFEST_VERSION: ENTRY, LEGACY_MANIFEST_VERSION: LEGACY_ENTRY}


def max_chunks(size: int, min_size: int = DEFAULT_PARAMS.min_size) -> int:
    """The most chunks a file of `size` bytes can have, by design: each segment between forced cut
    points gives chunks of at least `min_size` bytes but its last, and there are at most
    size // MIN_CUT_SPACING + CUT_ALLOWANCE + 1 segments (`pages.thin_cuts`)."""
    return size // min_size + size // MIN_CUT_SPACING + CUT_ALLOWANCE + 2


def max_entries() -> int:
    """The most chunks one manifest of MAX_MANIFEST_BYTES lists."""
    return (MAX_MANIFEST_BYTES - HEADER.size) // ENTRY.size


def _max_file_bytes() -> int:
    """The largest file whose chunks fit one manifest whatever its bytes (default chunk sizes)."""
    lo, hi = 0, 1 << 50
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if max_chunks(mid) <= max_entries() else (lo, mid - 1)
    return lo


#: Any file up to this size is stored whatever its bytes (about 6.1 GB: the worst case, a Parquet
#: file of tiny pages); a larger one is stored when its chunks average more than
#: size / max_entries() bytes (typical files: 64 KiB and more, so about 120 GB), else push refuses
#: it, naming it, as soon as its chunks pass max_entries().
MAX_FILE_BYTES = _max_file_bytes()


class ChunkIds(Sequence[bytes]):
    """A decoded manifest's chunk ids, read in place from its bytes: a manifest of N chunks costs
    its N * 36 bytes, not N bytes objects (~100 B each) in a list. Indexing gives bytes; a
    slice gives a list; it equals any sequence of the same ids."""

    __slots__ = ("_buf", "_at", "_stride", "_width", "_n", "_row")

    def __init__(self, buf: bytes, at: int, stride: int, width: int, n: int):
        self._buf, self._at, self._stride, self._width, self._n = buf, at, stride, width, n
        self._row = struct.Struct(f"<{width}s{stride - width}x")

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            lo, hi, step = i.indices(self._n)
            if step != 1:
                return [self[k] for k in range(lo, hi, step)]
            view = memoryview(self._buf)[self._at + lo * self._stride:self._at + max(lo, hi) * self._stride]
            return list(map(operator.itemgetter(0), self._row.iter_unpack(view)))
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("chunk index out of range")
        at = self._at + i * self._stride
        return self._buf[at:at + self._width]

    def __iter__(self) -> Iterator[bytes]:
        view = memoryview(self._buf)[self._at:self._at + self._n * self._stride]
        return map(operator.itemgetter(0), self._row.iter_unpack(view))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)) or len(other) != self._n:
            return False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # unhashable, as a list is (typeshed's idiom)

    def __add__(self, other: Iterable[bytes]) -> list[bytes]:  # as a list would
        return list(self) + list(other)

    def __radd__(self, other: Iterable[bytes]) -> list[bytes]:
        return list(other) + list(self)

    def __reduce__(self) -> tuple[type[ChunkIds], tuple[bytes, int, int, int, int]]:
        return ChunkIds, (self._buf, self._at, self._stride, self._width, self._n)

    def __repr__(self) -> str:
        return f"ChunkIds({self._n} ids)"


def _lengths(data: bytes, at: int, stride: int, width: int, n: int) -> array.array[int]:
    """The u32 lengths of n entries of `stride` bytes from `at` (each after a `width`-byte id),
    gathered a byte column at a time (no object per entry)."""
    out = bytearray(4 * n)
    for b in range(4):
        out[b::4] = data[at + width + b:at + n * stride:stride]
    lengths = array.array("I")
    lengths.frombytes(bytes(out))
    if sys.byteorder != "little":
        lengths.byteswap()
    return lengths


@dataclass
class Manifest:
    chunk_ids: Sequence[bytes]  # a list, or `ChunkIds` when decoded
    lengths: Sequence[int]  # a list, or an array of u32 when decoded
    size: int
    file_hash: bytes
    version: int = MANIFEST_VERSION  # 1 only for a manifest read from (or written as) format v1
    _ends: Sequence[int] | None = field(default=None, repr=False, compare=False)
    _raw: bytes | None = field(default=None, init=False, repr=False, compare=False)  # the bytes decoded

    def __post_init__(self) -> None:
        if len(self.chunk_ids) != len(self.lengths):
            raise ValueError("manifest needs one length per chunk id")
        if len(self.file_hash) != 16:
            raise ValueError("a manifest's file hash is the 16-byte xxh3-128 of the file (ids.weak_hasher)")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Manifest):
            return NotImplemented
        return (self.size, self.file_hash, self.version) == (other.size, other.file_hash, other.version) \
            and list(self.lengths) == list(other.lengths) and self.chunk_ids == other.chunk_ids

    __hash__ = None  # type: ignore[assignment]  # unhashable (mutable), as a list is (typeshed's idiom)

    @property
    def ends(self) -> Sequence[int]:
        """Cumulative end offset of each chunk."""
        if self._ends is None:
            self._ends = array.array("q", itertools.accumulate(self.lengths))
        return self._ends

    def chunk_start(self, i: int) -> int:
        return self.ends[i] - self.lengths[i]

    def span(self, start: int, end: int) -> range:
        """Indices of the chunks that overlap the byte range [start, end)."""
        end = min(end, self.size)
        if start >= end:
            return range(0)
        first = bisect.bisect_right(self.ends, start)
        last = bisect.bisect_left(self.ends, end)
        return range(first, last + 1)

    def encode(self) -> bytes:
        if self._raw is not None:  # decoded: its bytes as they were
            return self._raw
        entry = ENTRIES.get(self.version)
        if entry is None:
            raise ValueError(f"manifest version {self.version}; this cdcstore writes {sorted(ENTRIES)}")
        width = entry.size - 4
        if any(len(c) != width for c in self.chunk_ids):
            raise ValueError(f"a format-v{self.version} manifest holds {width}-byte chunk ids only")
        head = HEADER.pack(MAGIC, self.version, len(self.chunk_ids), self.size, self.file_hash)
        return head + b"".join(entry.pack(c, n) for c, n in zip(self.chunk_ids, self.lengths))

    @classmethod
    def decode(cls, data: bytes, name: str = "manifest") -> "Manifest":
        if len(data) < HEADER.size:
            raise CorruptionError(f"{name} is truncated")
        magic, version, count, size, file_hash = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise CorruptionError(f"{name} is not a cdcstore manifest")
        entry = ENTRIES.get(version)
        if entry is None:
            raise CorruptionError(f"{name} has manifest version {version}; this cdcstore reads "
                                  f"{LEGACY_MANIFEST_VERSION} and {MANIFEST_VERSION}")
        if len(data) != HEADER.size + count * entry.size:
            raise CorruptionError(f"{name} has the wrong length for {count} chunks")
        data = bytes(data)
        width = entry.size - 4
        lengths = _lengths(data, HEADER.size, entry.size, width, count)
        if count and not (1 <= min(lengths) and max(lengths) <= MAX_CHUNK_BYTES):
            # every chunk holds 1 to MAX_CHUNK_BYTES bytes: a reader never trusts more
            bad = min(lengths) if min(lengths) < 1 else max(lengths)
            what = "an empty chunk" if bad == 0 else f"a chunk of {bad} bytes, over the format's limit"
            raise CorruptionError(f"{name} lists {what} (of {MAX_CHUNK_BYTES} bytes at most): it is damaged")
        m = cls(ChunkIds(data, HEADER.size, entry.size, width, count), lengths, size, file_hash, version)
        if (m.ends[-1] if count else 0) != size:
            raise CorruptionError(f"{name}: chunk lengths do not add up to the file size")
        m._raw = data
        return m

    def name(self) -> str:
        """BLAKE3-256 of the bytes (v2); xxh3-128 for a v1 manifest (its old name)."""
        data = self.encode()
        return ids.legacy_hexdigest(data) if self.version == LEGACY_MANIFEST_VERSION else ids.hexdigest(data)

"""File manifests (format v1): a file as the ordered list of its chunks.

    header  48 B   b"CDCMANI\\0", u32 version, u32 chunk count N, u64 file size,
                   xxh3-128 of the whole file (16 B), 8 zero bytes
    entries N*20 B chunk id (16 B), u32 raw length

Little-endian. A manifest is named by the xxh3-128 of its bytes. Pure logic: the
byte-range planning a reader needs (`span`) lives here, away from any I/O.
"""
from __future__ import annotations

import bisect
import itertools
import struct
from dataclasses import dataclass, field

from . import ids
from .errors import CorruptionError

MANIFEST_VERSION = 1
MAGIC = b"CDCMANI\x00"
HEADER = struct.Struct("<8sIIQ16s8x")
ENTRY = struct.Struct("<16sI")


@dataclass
class Manifest:
    chunk_ids: list[bytes]
    lengths: list[int]
    size: int
    file_hash: bytes
    _ends: list[int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.chunk_ids) != len(self.lengths):
            raise ValueError("manifest needs one length per chunk id")

    @property
    def ends(self) -> list[int]:
        """Cumulative end offset of each chunk."""
        if self._ends is None:
            self._ends = list(itertools.accumulate(self.lengths))
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
        head = HEADER.pack(MAGIC, MANIFEST_VERSION, len(self.chunk_ids), self.size, self.file_hash)
        return head + b"".join(ENTRY.pack(c, n) for c, n in zip(self.chunk_ids, self.lengths))

    @classmethod
    def decode(cls, data: bytes, name: str = "manifest") -> "Manifest":
        if len(data) < HEADER.size:
            raise CorruptionError(f"{name} is truncated")
        magic, version, count, size, file_hash = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise CorruptionError(f"{name} is not a cdcstore manifest")
        if version != MANIFEST_VERSION:
            raise CorruptionError(f"{name} has manifest version {version}; this cdcstore reads {MANIFEST_VERSION}")
        if len(data) != HEADER.size + count * ENTRY.size:
            raise CorruptionError(f"{name} has the wrong length for {count} chunks")
        entries = list(ENTRY.iter_unpack(memoryview(data)[HEADER.size:]))
        m = cls([bytes(e[0]) for e in entries], [e[1] for e in entries], size, file_hash)
        if (m.ends[-1] if entries else 0) != size:
            raise CorruptionError(f"{name}: chunk lengths do not add up to the file size")
        return m

    def name(self) -> str:
        return ids.hexdigest(self.encode())

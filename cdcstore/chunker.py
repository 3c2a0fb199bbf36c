"""Content-defined chunking: gear-hash CDC of the FastCDC family (chunk format v1).

The boundary scan is native (`cdcstore._gear`); this module feeds it. Boundaries
depend only on the bytes, never on how they arrive: `Chunker.feed` accepts pieces
of any size and yields exactly the chunks a single whole-buffer scan would.
The rule itself is written down in docs/format.md and pinned by golden vectors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Iterator

from . import _gear

CHUNK_FORMAT_VERSION = 1
KiB = 1024


@dataclass(frozen=True)
class ChunkParams:
    """Minimum, target (average) and maximum chunk size in bytes."""

    min_size: int = 16 * KiB
    avg_size: int = 64 * KiB
    max_size: int = 256 * KiB

    def __post_init__(self) -> None:
        if not (1 <= self.min_size <= self.avg_size <= self.max_size):
            raise ValueError(
                f"chunk sizes must satisfy 1 <= min <= avg <= max, got "
                f"min={self.min_size} avg={self.avg_size} max={self.max_size}"
            )


DEFAULT_PARAMS = ChunkParams()


def chunk_ends(data, params: ChunkParams = DEFAULT_PARAMS) -> list[int]:
    """End offsets of the chunks of a whole buffer (the last one is len(data))."""
    return _gear.scan(data, params.min_size, params.avg_size, params.max_size, True)


class Chunker:
    """Streaming chunker: feed bytes in pieces of any size, then call `finish`.

    Memory is bounded by about twice the maximum chunk size plus one piece.
    Yielded chunks are `bytes` objects owned by the caller.
    """

    def __init__(self, params: ChunkParams = DEFAULT_PARAMS):
        self.params = params
        self._buf = bytearray()

    def feed(self, data) -> list[bytes]:
        """Add bytes; return the chunks they complete (possibly none)."""
        self._buf += data
        if len(self._buf) >= 2 * self.params.max_size:
            return self._cut(eof=False)
        return []

    def finish(self) -> list[bytes]:
        """Return the remaining chunks; the chunker is then empty."""
        return self._cut(eof=True)

    def _cut(self, eof: bool) -> list[bytes]:
        p = self.params
        buf = self._buf
        ends = _gear.scan(buf, p.min_size, p.avg_size, p.max_size, eof)
        start = 0
        with memoryview(buf) as view:
            chunks = []
            for end in ends:
                chunks.append(bytes(view[start:end]))
                start = end
        if start:
            del buf[:start]
        return chunks


def iter_chunks(stream: BinaryIO, params: ChunkParams = DEFAULT_PARAMS,
                block_size: int = 8 * 1024 * KiB) -> Iterator[bytes]:
    """Chunks of a binary stream, read `block_size` bytes at a time."""
    chunker = Chunker(params)
    while True:
        block = stream.read(block_size)
        if not block:
            break
        yield from chunker.feed(block)
    yield from chunker.finish()

"""Content-defined chunking: gear-hash CDC of the FastCDC family (chunk format v3; the byte rule is v1's).

The boundary scan is native (`cdcstore._gear`); this module feeds it. Boundaries
depend only on the bytes, never on how they arrive: `Chunker.feed` accepts pieces
of any size and yields exactly the chunks a single whole-buffer scan would. A
segment of `PARALLEL_MIN_BYTES` or more is scanned as two halves in two native
threads that resynchronise at a common cut point (the same cuts, in half the time).
The rule itself is written down in docs/format.md and pinned by golden vectors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Iterable, Iterator

from . import _gear

if TYPE_CHECKING:
    from typing_extensions import Buffer

CHUNK_FORMAT_VERSION = 3  # v3: v1 for bytes, page groups for Parquet (v2), TAR members (docs/format.md)
KiB = 1024
MAX_CHUNK_BYTES = 16 * KiB * KiB  # format limit: no chunk is larger (readers refuse bigger raw lengths)
PARALLEL_MIN_BYTES = 4 * KiB * KiB  # a segment this large is scanned as two halves at once


@dataclass(frozen=True)
class ChunkParams:
    """Minimum, target (average) and maximum chunk size in bytes."""

    min_size: int = 16 * KiB
    avg_size: int = 64 * KiB
    max_size: int = 256 * KiB

    def __post_init__(self) -> None:
        if not (1 <= self.min_size <= self.avg_size <= self.max_size <= MAX_CHUNK_BYTES):
            raise ValueError(
                f"chunk sizes must satisfy 1 <= min <= avg <= max <= {MAX_CHUNK_BYTES}, got "
                f"min={self.min_size} avg={self.avg_size} max={self.max_size}"
            )


DEFAULT_PARAMS = ChunkParams()


def split_point(n: int, params: ChunkParams) -> int:
    """Where a scan of `n` bytes is split in two halves (0: scanned in one thread)."""
    return n // 2 if n >= max(PARALLEL_MIN_BYTES, 8 * params.max_size) else 0


def scan(data: bytes | bytearray | memoryview, params: ChunkParams, eof: bool,
         split: int | None = None) -> list[int]:
    """End offsets of the complete chunks of `data` (with `eof`, of all of it). `split`
    (default: `split_point`) only changes how the work is shared, never the result."""
    split = split_point(len(data), params) if split is None else split
    return _gear.scan(data, params.min_size, params.avg_size, params.max_size, eof, split)


def chunk_ends(data: bytes | bytearray | memoryview, params: ChunkParams = DEFAULT_PARAMS,
               split: int | None = None) -> list[int]:
    """End offsets of the chunks of a whole buffer (the last one is len(data))."""
    return scan(data, params, True, split)


class Chunker:
    """Streaming chunker: feed bytes in pieces of any size, then call `finish`.

    `cuts` are absolute offsets where a chunk must end (e.g. Parquet page
    groups): the stream is then chunked as independent segments, each with the
    rule above; with `whole_segments`, a segment of at most `max_size` bytes between two
    cuts is one chunk (Parquet page groups, `pages.page_cuts`; TAR members,
    `tar.member_cuts`), and only longer ones are cut by the rule. Memory is bounded by about twice the maximum chunk size plus one
    piece. Chunks are read-only memoryviews of the bytes fed (no copies, except the
    few that straddle two pieces); they stay valid after later calls (bytes fed with
    `feed_block` stay valid while their owner keeps them unchanged: see there).
    """

    def __init__(self, params: ChunkParams = DEFAULT_PARAMS, cuts: Iterable[int] = (),
                 whole_segments: bool = False):
        self.params = params
        self._whole_segments = whole_segments
        self._pieces: list[bytes | memoryview] = []  # bytes (or views of bytes) not yet cut, oldest first
        self._size = 0
        self._base = 0  # absolute offset of the first uncut byte
        self._cuts = iter(sorted(set(cuts)))
        self._next_cut = self._next_after(0)
        self._seg_start = 0  # absolute offset of the last cut passed (where the current segment began)

    def _next_after(self, pos: int) -> int | None:
        return next((c for c in self._cuts if c > pos), None)

    def feed(self, data: Buffer) -> list[memoryview]:
        """Add bytes; return the chunks they complete (possibly none). Anything but `bytes`
        is copied first (`feed_block` takes a buffer its owner will not change)."""
        return self._feed(data if isinstance(data, bytes) else bytes(data))

    def feed_block(self, block: memoryview) -> list[memoryview]:
        """`feed` without a copy of a writable buffer: the chunks (and the uncut tail this
        chunker keeps) are read-only views of `block`, so its owner must not write it again
        while any view of it is alive. A bytearray counts those views (each memoryview of it,
        and every slice of one, holds an export until it is freed) and cannot be resized while
        one is held: `engine.ingest.ReadBlocks` reuses a read block only once it has none."""
        return self._feed(block.toreadonly())

    def _feed(self, data: bytes | memoryview) -> list[memoryview]:
        if self._size + len(data) < 2 * self.params.max_size:
            self._pieces.append(data)
            self._size += len(data)
            return []
        return self._take(data)

    def read_from(self, f: BinaryIO, size: int) -> tuple[bytes, list[memoryview]]:
        """Read up to `size` bytes of binary file `f` and `feed` them: (the bytes read,
        the chunks they complete); the bytes are empty at end of file."""
        block = f.read(size)
        return block, (self.feed(block) if block else [])

    def _take(self, block: bytes | memoryview) -> list[memoryview]:
        """Cut the uncut bytes followed by `block` without copying `block` whole: only
        the uncut tail and the start of `block` are joined (the chunks that straddle
        them are copies), the rest is cut in place (views of `block`)."""
        head = 2 * self.params.max_size
        if not self._pieces or len(block) <= head:
            self._pieces.append(block)
            self._size += len(block)
            return self._cut(eof=False)
        view = memoryview(block)
        self._pieces.append(view[:head])
        self._size += head
        chunks = self._cut(eof=False)
        if self._size > head:  # the uncut bytes reach back before `block` (cannot happen; be safe)
            self._pieces.append(view[head:])
            self._size += len(block) - head
            return chunks + self._cut(eof=False)
        off = head - self._size  # the uncut bytes start here in `block`
        self._pieces = [view[off:]]
        self._size = len(block) - off
        return chunks + self._cut(eof=False)

    def finish(self) -> list[memoryview]:
        """Return the remaining chunks; the chunker is then empty."""
        return self._cut(eof=True)

    def _cut(self, eof: bool) -> list[memoryview]:
        p = self.params
        buf = self._pieces[0] if len(self._pieces) == 1 else b"".join(self._pieces)
        view = memoryview(buf).toreadonly()  # chunks are views of bytes not written again while viewed: no copies
        chunks: list[memoryview] = []
        start = 0
        while start < len(buf):
            cut = self._next_cut
            whole = cut is not None and cut - self._base <= len(buf)
            seg_end = cut - self._base if whole and cut is not None else len(buf)
            if self._whole_segments and cut is not None and cut - self._seg_start <= p.max_size \
                    and (whole or not eof):
                if not whole:
                    break  # one chunk: wait for the rest of it (fewer than max_size bytes)
                ends = [seg_end - start]
            else:
                ends = scan(view[start:seg_end], p, whole or eof)
            prev = 0
            for end in ends:
                chunks.append(view[start + prev:start + end])
                prev = end
            if not whole or cut is None:  # (`whole` says cut is not None)
                start += prev
                break
            start = seg_end
            self._seg_start = cut
            self._next_cut = self._next_after(cut)
        rest = buf[start:] if start < len(buf) else b""
        self._pieces = [rest] if rest else []
        self._size = len(rest)
        self._base += start
        return chunks


def iter_chunks(stream: BinaryIO, params: ChunkParams = DEFAULT_PARAMS,
                block_size: int = 8 * 1024 * KiB, cuts: Iterable[int] = (),
                whole_segments: bool = False) -> Iterator[memoryview]:
    """Chunks of a binary stream, read `block_size` bytes at a time."""
    chunker = Chunker(params, cuts, whole_segments)
    while True:
        block = stream.read(block_size)
        if not block:
            break
        yield from chunker.feed(block)
    yield from chunker.finish()

"""Native gear-hash CDC scan (`_gear.c`)."""
from _typeshed import ReadableBuffer

def scan(buffer: ReadableBuffer, min: int, avg: int, max: int, eof: bool, split: int = 0, /) -> list[int]:
    """End offsets of the chunks of `buffer` (a trailing partial chunk left out unless `eof`); with
    0 < split < len(buffer), scanned as two halves in two threads (the same result)."""

def page_groups(fd: int, size: int, ranges: ReadableBuffer, hard: ReadableBuffer, min: int, avg: int,
                max: int, /) -> list[int] | None:
    """Cut offsets of the page groups of the Parquet file open as `fd` (`size` bytes), or None when
    its pages do not walk cleanly. `ranges`: packed u64 (start, end) pairs of the column chunks,
    sorted and disjoint; `hard`: packed u64 offsets that always cut, sorted."""

def tar_cuts(fd: int, size: int, min: int, /) -> list[int] | None:
    """Start and end of every data region of at least `min` bytes of the tar file open as `fd`
    (`size` bytes), as `tar.walk` walks it; None when a header is not to be trusted."""

def gear_table() -> tuple[int, ...]:
    """The 256-entry gear table (format constant)."""

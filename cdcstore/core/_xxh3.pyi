"""XXH3-64 and verified runs of chunks, in C (`_xxh3.c`)."""
from collections.abc import Sequence

from _typeshed import ReadableBuffer, WriteableBuffer

def xxh3_64(buffer: ReadableBuffer, /) -> int:
    """XXH3-64 of `buffer` (seed 0, the default secret)."""

def first_mismatch(buffer: ReadableBuffer, lengths: Sequence[int], checks: Sequence[int], /) -> int:
    """The index of the first chunk (of `lengths`, back to back in `buffer`) whose XXH3-64 is not its
    entry of `checks`, or -1. ValueError if the lengths do not add up to the buffer's length."""

def read_run(fd: int, offset: int, out: WriteableBuffer, lengths: Sequence[int], checks: Sequence[int], /) -> int:
    """Read `len(out)` bytes of `fd` from `offset` into `out` and check each chunk's XXH3-64: -1 when
    all match, k the first chunk that does not, -2 when the file ended first."""

"""XXH3-64 and verified runs of chunks, in C (`_xxh3.c`)."""
from collections.abc import Sequence

from _typeshed import ReadableBuffer, WriteableBuffer

def _vector(on: bool, /) -> bool:
    """Use the AVX2 path when the CPU has it (on by default; tests turn it off): the old setting."""

def xxh3_64(buffer: ReadableBuffer, /) -> int:
    """XXH3-64 of `buffer` (seed 0, the default secret)."""

def first_mismatch(buffer: ReadableBuffer, lengths: Sequence[int], checks: Sequence[int], /) -> int:
    """The index of the first chunk (of `lengths`, back to back in `buffer`) whose XXH3-64 is not its
    entry of `checks`, or -1. ValueError if the lengths do not add up to the buffer's length."""

def read_run(fd: int, offset: int, out: WriteableBuffer, lengths: Sequence[int], checks: Sequence[int], /) -> int:
    """Read `len(out)` bytes of `fd` from `offset` into `out` and check each chunk's XXH3-64: -1 when
    all match, k the first chunk that does not, -2 when the file ended first."""

class Filler:
    """A native thread that reads and checks runs of chunks into a buffer without the GIL (a
    window filled ahead while the reader's thread runs Python)."""

    def __init__(self, spin_us: int = 500) -> None:
        """`spin_us`: how long a waiting thread spins before it sleeps."""

    @property
    def busy(self) -> bool:
        """A job was started and not yet waited for."""

    def start(self, out: WriteableBuffer, runs: Sequence[tuple[int, int, int, Sequence[int], Sequence[int]]], /) -> None:
        """Read each run (fd, offset, at, lengths, checks): the chunks back to back in `fd` from
        `offset`, landing at out[at:], each checked against its XXH3-64. The fds are duplicated for
        the job; `out` is held until `wait`. RuntimeError if a job is running."""

    def wait(self) -> tuple[int, int] | None:
        """Do a share of the job's slices here (GIL released), wait for the rest: None when every
        chunk landed and matched, else (run, k) of the first failure (k = -2: the file ended
        first). OSError for an I/O error."""

    def close(self) -> None:
        """Wait for a job still running and end the thread."""

"""The chunk cache's bytes: append-only segment files in a folder beside its sqlite file.

The cache's sqlite file says which chunk is where (segment, offset, length) and keeps the
eviction order; the bytes live here. sqlite in WAL mode writes a blob twice (to the log, then
to the database) and checksums every frame: a third of a cold read's CPU went there. A segment
is written once, by one process (the one that made it), front to back, and never rewritten;
the cache deletes it when nothing in it is alive. Nothing here is durable or trusted: each
read is checked against the chunk's id by the caller, and a gone segment reads as None.
"""
from __future__ import annotations

import collections
import os
from typing import Sequence

from .. import runtime
from .local import write_all

SEGMENT_BYTES = 64 * 1024 * 1024  # a process starts a new segment past this size
OPEN_READERS = 64  # segment files a process keeps open for reading
SUFFIX = ".seg"


class Segments:
    """Segment files `<folder>/<number>.seg`: append buffers, read byte ranges, remove."""

    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self._readers = runtime.Local()  # this process's open files, by segment number (LRU)
        self._lock = runtime.Lock()

    def path(self, seg: int) -> str:
        return os.path.join(self.folder, f"{seg}{SUFFIX}")

    def create(self, seg: int) -> int:
        """A new, empty segment file open for writing (a file left by a lost cache database of
        the same number is emptied)."""
        return os.open(self.path(seg), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)

    @staticmethod
    def append(fd: int, end: int, buffers: Sequence[bytes | memoryview]) -> list[int]:
        """Write `buffers` one after another from offset `end` of the open segment `fd`; their
        offsets. No copy: the buffers go to the kernel as they are."""
        offsets: list[int] = []
        pos = end
        for b in buffers:
            offsets.append(pos)
            pos += len(b)
        write_all(fd, buffers, end)
        return offsets

    def read(self, seg: int, offset: int, size: int) -> bytes | None:
        """`size` bytes at `offset` of segment `seg` (fewer if it is short: the caller's check
        fails); None if the segment is gone."""
        fd = self._reader(seg)
        if fd is None:
            return None
        return os.pread(fd, size, offset)

    def _reader(self, seg: int) -> int | None:
        with self._lock:
            open_: collections.OrderedDict[int, int] = self._readers.get(collections.OrderedDict)
            fd = open_.get(seg)
            if fd is not None:
                open_.move_to_end(seg)
                return fd
            try:
                fd = os.open(self.path(seg), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                return None
            open_[seg] = fd
            while len(open_) > OPEN_READERS:
                os.close(open_.popitem(last=False)[1])
            return fd

    def remove(self, seg: int) -> None:
        """Delete a segment file (gone already is fine); this process stops reading it."""
        with self._lock:
            fd = (self._readers.here() or {}).pop(seg, None)
            if fd is not None:
                os.close(fd)
        try:
            os.unlink(self.path(seg))
        except FileNotFoundError:
            pass

    def numbers(self) -> set[int]:
        """The numbers of the segment files in the folder."""
        out: set[int] = set()
        for name in os.listdir(self.folder):
            stem = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else ""
            if stem.isdigit():
                out.add(int(stem))
        return out

    def close_readers(self) -> None:
        with self._lock:
            open_ = self._readers.here() or {}
            while open_:
                os.close(open_.popitem()[1])

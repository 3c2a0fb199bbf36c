"""A seekable, read-only file object over a file manifest.

A read maps its byte range to chunks (`Manifest.span`), takes chunks from a
small per-file LRU, and decodes the rest through the chunk source - verifying
each against its id. Sequential reads prefetch the next chunks on a thread
pool (decoding releases the GIL); random reads fetch exactly what they touch.
"""
from __future__ import annotations

import collections
import io
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from .errors import CorruptionError
from .manifest import Manifest
from .pack import PackEntry


class ChunkSource(Protocol):
    def locate(self, chunk_ids) -> dict[bytes, tuple[str, PackEntry]]: ...
    def read_chunk(self, pack: str, entry: PackEntry) -> bytes: ...


_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None


def _decode_pool() -> ThreadPoolExecutor:
    """One process-wide decode pool, rebuilt after a fork."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max(2, os.cpu_count() or 2),
                                                     thread_name_prefix="cdcstore-read"))
        return _pool[1]


class FileReader(io.RawIOBase):
    """File object for one file of one revision. Thread-compatible, not thread-safe."""

    def __init__(self, source: ChunkSource, manifest: Manifest, name: str = "",
                 readahead_bytes: int = 16 * 1024 * 1024, cache_chunks: int = 64):
        super().__init__()
        self._src = source
        self._m = manifest
        self.name = name
        self._pos = 0
        self._locs: dict[bytes, tuple[str, PackEntry]] = {}
        self._lru: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._lru_cap = cache_chunks
        self._ahead: dict[int, Future] = {}
        self._readahead = readahead_bytes
        self._last_end = -1

    # -- io.RawIOBase ---------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    @property
    def size(self) -> int:
        return self._m.size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._m.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(22, f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, b) -> int:
        data = self.read(len(b))
        n = len(data)
        memoryview(b).cast("B")[:n] = data
        return n

    def readall(self) -> bytes:
        return self.read(-1)

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        start = self._pos
        end = self._m.size if size is None or size < 0 else min(self._m.size, start + size)
        if start >= end:
            return b""
        data = self.pread(start, end - start)
        self._pos = end
        return data

    def close(self) -> None:
        for fut in self._ahead.values():
            fut.cancel()
        self._ahead.clear()
        self._lru.clear()
        super().close()

    # -- ranges ----------------------------------------------------------------------
    def pread(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) without moving the file position."""
        m = self._m
        span = m.span(offset, offset + length)
        if not span:
            return b""
        sequential = offset == self._last_end
        self._last_end = offset + length
        pieces = self._chunks(span, prefetch=sequential)
        first_start = m.chunk_start(span.start)
        if len(pieces) == 1:
            lo = offset - first_start
            return pieces[0][lo:lo + length]
        buf = b"".join(pieces)
        lo = offset - first_start
        return buf[lo:lo + length]

    def _chunks(self, span: range, prefetch: bool) -> list[bytes]:
        m = self._m
        wanted = list(span)
        ahead: list[int] = []
        if prefetch and self._readahead:
            budget = self._readahead
            i = span.stop
            while i < len(m.lengths) and budget > 0:
                budget -= m.lengths[i]
                ahead.append(i)
                i += 1
        self._locate([m.chunk_ids[i] for i in wanted + ahead if i not in self._lru and i not in self._ahead])
        pool = _decode_pool()
        # schedule everything first so that decoding overlaps
        for i in wanted[1:] + ahead:
            if i not in self._lru and i not in self._ahead:
                self._ahead[i] = pool.submit(self._decode, i)
        out = []
        for i in wanted:
            data = self._lru.get(i)
            if data is not None:
                self._lru.move_to_end(i)
            else:
                fut = self._ahead.pop(i, None)
                data = fut.result() if fut is not None else self._decode(i)
                self._remember(i, data)
            out.append(data)
        if not prefetch:  # random access: drop stale read-ahead
            for i in [k for k in self._ahead if k < span.start or k >= span.stop]:
                self._ahead.pop(i).cancel()
        return out

    def _remember(self, i: int, data: bytes) -> None:
        self._lru[i] = data
        while len(self._lru) > self._lru_cap:
            self._lru.popitem(last=False)

    def _locate(self, chunk_ids: list[bytes]) -> None:
        missing = [c for c in chunk_ids if c not in self._locs]
        if missing:
            self._locs.update(self._src.locate(missing))

    def _decode(self, i: int) -> bytes:
        cid = self._m.chunk_ids[i]
        loc = self._locs.get(cid)
        if loc is None:
            self._locate([cid])
            loc = self._locs.get(cid)
            if loc is None:
                raise CorruptionError(f"chunk {cid.hex()} of {self.name or 'file'} is not in the store "
                                      f"(index damaged?): run `cdcstore rebuild-index`")
        return self._src.read_chunk(*loc)

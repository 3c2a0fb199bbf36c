"""A seekable, read-only file object over a file manifest.

A read maps its byte range to chunks (`Manifest.span`), takes chunks from a
small per-file LRU, and fetches the rest from the store in one batch (a remote
store merges them into few range requests); every chunk is verified against its
id. Sequential reads prefetch the next chunks in batches of about 4 MiB on a
thread pool (decoding releases the GIL); random reads fetch only what they touch.

Exit: pyarrow keeps what it read through a Python file (the file itself and every
buffer `read_buffer` returned) in C++ objects that its own threads may still be
freeing after `read_table` has returned. A C++ thread that takes the GIL once the
interpreter is finalising aborts the process ("terminate called without an active
exception", exit 134; apache/arrow#34314, #39162). So every object handed to
pyarrow is tracked, and an `atexit` hook waits (GIL released, bounded) until
pyarrow has let go of them, while the interpreter is still whole.
"""
from __future__ import annotations

import atexit
import bisect
import collections
import functools
import gc
import io
import os
import sys
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING, Callable, TypeVar, overload

from .. import runtime
from ..core.errors import CorruptionError, PackMissingError
from ..core.manifest import Manifest
from ..core.pack import PackEntry
from .fileplan import FilePlan, Piece
from .roles import ChunkSource, Located
from .window import ReadWindow, read_pieces

if TYPE_CHECKING:
    from typing_extensions import Buffer

_T = TypeVar("_T")

READ_THREADS = max(8, 2 * (os.cpu_count() or 2))  # tasks wait on the network or decode (GIL released)


def _prefetch_pool() -> ThreadPoolExecutor:
    """The process's read-ahead pool (the runtime's "read" pool)."""
    return runtime.pool("read", READ_THREADS)

DIRECT_MIN = 1024 * 1024  # reads this large land straight in their result (see `_pread_direct`)
RUNS_MIN = 256 * 1024  # local reads this large land in their result run by run (see `_pread_runs`);
#                        smaller sequential ones are copied out of a `window.ReadWindow`
PARALLEL_RUNS_MIN = 2 * 1024 * 1024  # raw runs of a read this large are read and checked on two threads
PARALLEL_DECODE_MIN = 2 * 1024 * 1024  # compressed chunks of a read this large decode on two threads


@functools.lru_cache(maxsize=1)
def _bytes_api() -> tuple[ModuleType, Callable[[None, int], bytes], Callable[[bytes], int]] | None:
    """CPython's PyBytes_FromStringAndSize and PyBytes_AsString through ctypes (set up once),
    or None elsewhere."""
    try:
        import ctypes
        api = ctypes.pythonapi
        alloc, addr = api.PyBytes_FromStringAndSize, api.PyBytes_AsString
    except (ImportError, AttributeError):
        return None
    alloc.restype, alloc.argtypes = ctypes.py_object, (ctypes.c_char_p, ctypes.c_ssize_t)
    addr.restype, addr.argtypes = ctypes.c_void_p, (ctypes.py_object,)
    return ctypes, alloc, addr


def _new_bytes(n: int) -> tuple[bytes | bytearray, memoryview]:
    """A new bytes object of length n and a writable view of its memory, to fill before
    anyone else sees it (what C code does with PyBytes_FromStringAndSize(NULL, n)): a
    result is then written once, not built and copied. The view keeps the bytes alive.
    Elsewhere than CPython: a bytearray (the caller copies it)."""
    api = _bytes_api() if n >= 2 else None  # CPython shares its empty and one-byte bytes: never write those
    if api is None:
        buf = bytearray(n)
        return buf, memoryview(buf)
    ctypes, alloc, addr = api
    obj = alloc(None, n)
    arr = (ctypes.c_char * n).from_address(addr(obj))
    arr.keep = obj  # the view holds the array, the array the bytes
    return obj, memoryview(arr).cast("B")


_arrow_held: dict[int, weakref.ref[object]] = {}  # readers and buffers pyarrow may still hold, by id
_arrow_read = threading.Event()  # set once pyarrow has read through a FileReader
_filesystems_made = threading.Event()  # set once a `cdc://` filesystem exists (fs.py): pyarrow may wrap it


def _hand_to_arrow(obj: _T) -> _T:
    """Track `obj` until it is freed (the callback runs in whichever thread frees it)."""
    ref: weakref.ref[object] = weakref.ref(obj, _forget)
    _arrow_held[id(ref)] = ref  # by id: a weak reference hashes its object, which may be unhashable
    return obj


def handed_to_arrow(obj: _T) -> _T:
    """`obj` (a file object pyarrow reads through, or a buffer it was handed) is tracked until it
    is freed: the exit hook (`arrow_settled`) waits for pyarrow to let go of it."""
    _arrow_read.set()
    return _hand_to_arrow(obj)


def _forget(ref: weakref.ref[object]) -> None:
    _arrow_held.pop(id(ref), None)


def arrow_settled(timeout: float = 5.0, patience: float = 0.1) -> bool:
    """Wait, with the GIL released, until pyarrow has freed what it read through a
    FileReader: True when all is freed. Stops early when nothing was freed for
    `patience` seconds (the rest is held by live Python objects, which the main
    thread frees later, safely) and after `timeout` seconds in any case."""
    if not _arrow_read.is_set() or not (_arrow_held or _filesystems_made.is_set()):
        return True  # nothing held: no collection of a large heap at every exit
    gc.collect()  # frees pyarrow objects kept in reference cycles, here, with the GIL
    if _filesystems_made.is_set():  # a scan of every object (0.1 s in a large process): only if there can be any
        for handler in _fsspec_handlers():
            _hand_to_arrow(handler)
    now = time.monotonic()
    deadline, last_progress, left = now + timeout, now, len(_arrow_held)
    while _arrow_held and now < deadline and now - last_progress < patience:
        time.sleep(0.002)  # pyarrow's threads take the GIL to drop their references
        now = time.monotonic()
        if len(_arrow_held) < left:
            last_progress, left = now, len(_arrow_held)
    return not _arrow_held


def filesystem_made() -> None:
    """A `cdc://` filesystem was made in this process (pyarrow may hold it in an FSSpecHandler)."""
    _filesystems_made.set()


def _fsspec_handlers() -> list[object]:
    """pyarrow's wrappers of `cdc://` filesystems (`FSSpecHandler`) still alive: a
    dataset's fragments hold one, and may be freed on a pyarrow thread."""
    fs = sys.modules.get("pyarrow.fs")
    handler = getattr(fs, "FSSpecHandler", None)
    if handler is None:
        return []
    return [o for o in gc.get_objects()
            if issubclass(type(o), handler)  # type(), not isinstance: never touch objects' __class__
            and getattr(getattr(o, "fs", None), "protocol", None) == "cdc"]


atexit.register(arrow_settled)


class PositionedFile(io.RawIOBase):
    """A read-only binary file of `size` bytes with a position (`_pos`): readable, seekable,
    `tell`, `seek` and `readall`; a subclass gives `size` and `read` (`FileReader`, and the
    stream's file of bytes fetched ahead, `streaming.sources.HeldSpans`)."""

    _pos = 0

    @property
    def size(self) -> int:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(22, f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readall(self) -> bytes:
        return self.read(-1)


class FileReader(PositionedFile):
    """File object for one file of one revision. Thread-safe: reads from several threads at once
    (duckdb reads one handle from its worker threads) take turns on the reader's lock, so the
    read-ahead table, the LRU and the window stay consistent."""

    def __init__(self, source: ChunkSource, manifest: Manifest, name: str = "", repo: str | None = None,
                 readahead_bytes: int = 32 * 1024 * 1024, cache_chunks: int = 64,
                 batch_bytes: int = 8 * 1024 * 1024, sequential: bool = False, locations: Located | None = None):
        super().__init__()
        self._src = source
        self._m = manifest
        self._repo = repo
        self.name = name
        self._pos = 0
        self._plan = FilePlan(source, manifest, name, repo, locations)  # where the chunks are
        # chunks by index (bytes-like: a local store's raw chunks are views of what it read)
        self._lru: collections.OrderedDict[int, bytes | memoryview] = collections.OrderedDict()
        self._lru_cap = cache_chunks
        self._pending: dict[int, Future[dict[int, bytes | memoryview]]] = {}
        self._ahead_end = 0  # chunks below this were scheduled for read-ahead (see `_chunks`)
        self._win = ReadWindow(source, manifest, self._plan, repo, _prefetch_pool)  # small sequential local reads
        self._readahead = readahead_bytes
        self._batch = batch_bytes
        self._last_end = 0 if sequential else -1  # a sequential reader prefetches from its first read
        self._streak = readahead_bytes if sequential else 0  # bytes read back to back so far
        self._handed = False  # pyarrow reads through this file (`read_buffer`)
        self._by_runs = source.capabilities.reads_runs  # a local store: see `_pread_runs`
        self._lock = runtime.Lock(reentrant=True)  # one read at a time (`pread`, `read`, `close`)

    # -- io.RawIOBase ---------------------------------------------------------------
    @property
    def size(self) -> int:
        return self._m.size

    def readinto(self, b: Buffer) -> int:
        """Bytes at the position into the caller's buffer `b`: a local store's raw chunks go from
        the kernel straight into it and are checked there, as do a server's raw chunks of a large
        read; small sequential reads are copied from the window (one copy, as a buffered file)."""
        self._checkClosed()
        out = memoryview(b).cast("B")
        start = self._pos  # taken before the lock, as `read` does
        end = min(self._m.size, start + len(out))
        if start >= end:
            return 0
        with self._lock:
            self._pread_into(start, end, out[:end - start])
        self._pos = end
        return end - start

    def read_buffer(self, size: int | None = -1) -> memoryview:
        """`read` for pyarrow (its Python-file wrapper prefers this method): the bytes
        as a view that is tracked until pyarrow frees it, see `arrow_settled`."""
        if not self._handed:
            self._handed = True
            handed_to_arrow(self)
        return _hand_to_arrow(memoryview(self.read(size)))

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        # the position is taken before anything can let another thread run (the lock in `pread`):
        # duckdb calls seek() then read() under the GIL and counts on nothing moving between them
        start = self._pos
        end = self._m.size if size is None or size < 0 else min(self._m.size, start + size)
        if start >= end:
            return b""
        if self._by_runs and end - start < RUNS_MIN:  # fast path: a small read the window holds
            with self._lock:
                data = self._win.take(start, end)
                if data is not None:
                    self._last_end = end
            if data is not None:
                self._pos = end
                return data
        data = self.pread(start, end - start)
        self._pos = end
        return data

    def close(self) -> None:
        with self._lock:
            for fut in self._pending.values():
                fut.cancel()
            self._pending.clear()
            self._lru.clear()
            self._win.close()
        super().close()

    # -- ranges ----------------------------------------------------------------------
    def pread(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) without moving the file position."""
        with self._lock:
            return self._pread(offset, length)

    def _pread(self, offset: int, length: int) -> bytes:
        if self._by_runs and offset < self._m.size:
            if 0 < length < RUNS_MIN and (offset == self._last_end or self._win.covers(offset, length)):
                return self._pread_window(offset, min(offset + length, self._m.size))
            if length >= RUNS_MIN:
                return self._pread_runs(offset, min(offset + length, self._m.size))
        if length >= DIRECT_MIN and self._direct_ok(offset, length):
            return self._pread_direct(offset, min(offset + length, self._m.size))
        pieces = self.pieces(offset, length)
        if len(pieces) == 1:
            return bytes(pieces[0])
        return b"".join(pieces)  # one copy

    def _pread_into(self, offset: int, end: int, out: memoryview) -> None:
        """`_pread` into `out` (end - offset bytes; offset inside the file): the same strategies,
        each landing in the caller's buffer instead of a new one."""
        length = end - offset
        if self._by_runs:
            if length < RUNS_MIN and (offset == self._last_end or self._win.covers(offset, length)):
                self._pread_window(offset, end, out)
                return
            if length >= RUNS_MIN:
                self._pread_runs(offset, end, out)
                return
        if length >= DIRECT_MIN and self._direct_ok(offset, length):
            self._pread_direct(offset, end, out)
            return
        at = 0
        for piece in self.pieces(offset, length):
            n = len(piece)
            out[at:at + n] = piece
            at += n

    @overload
    def _pread_window(self, offset: int, end: int, into: None = None) -> bytes: ...
    @overload
    def _pread_window(self, offset: int, end: int, into: memoryview) -> None: ...

    def _pread_window(self, offset: int, end: int, into: memoryview | None = None) -> bytes | None:
        """A small sequential read of a local store, copied out of the window (see
        `window.ReadWindow`): into `into`, or into new bytes returned."""
        self._last_end = end
        if into is not None:
            self._win.copy(offset, end, into, self._fill_located)
            return None
        if self._win.covers(offset, end - offset):
            return bytes(self._win.view(offset, end))
        result, out = _new_bytes(end - offset)
        self._win.copy(offset, end, out, self._fill_located)
        del out
        return bytes(result) if isinstance(result, bytearray) else result

    def _fill_located(self, offset: int, end: int, out: memoryview) -> None:
        """`_fill`, locating the file again once if a pack moved since it was located."""
        try:
            self._fill(offset, end, out)
        except PackMissingError:
            self._plan.relocate(())
            self._fill(offset, end, out)

    def _direct_ok(self, offset: int, length: int) -> bool:
        """A large read lands straight in its result when the source can, nothing is
        being read ahead, and it would start no read-ahead (it reaches the end, or is
        not sequential, or the reader never reads ahead)."""
        if self._pending or not self._src.capabilities.reads_into or offset >= self._m.size:
            return False
        return offset + length >= self._m.size or offset != self._last_end or not self._readahead

    @overload
    def _pread_direct(self, offset: int, end: int, into: None = None) -> bytes: ...
    @overload
    def _pread_direct(self, offset: int, end: int, into: memoryview) -> None: ...

    def _pread_direct(self, offset: int, end: int, into: memoryview | None = None) -> bytes | None:
        """Bytes [offset, end) in one buffer (`into`, or a new one returned) that chunks are
        written into as they are verified (ranges of raw chunks are received into it from the
        socket)."""
        m, ids = self._m, self._m.chunk_ids
        span = m.span(offset, end)
        self._streak = self._streak + end - offset if offset == self._last_end else end - offset
        self._last_end = end
        result, out = _new_bytes(end - offset) if into is None else (None, into)
        places: dict[bytes, list[tuple[int, int, int]]] = {}
        for i in span:
            cs = m.chunk_start(i)
            lo, hi = max(offset, cs) - cs, min(end, cs + m.lengths[i]) - cs
            data = self._lru.get(i)
            if data is not None:
                out[cs + lo - offset:cs + hi - offset] = memoryview(data)[lo:hi]
            else:
                places.setdefault(ids[i], []).append((cs + lo - offset, lo, hi))
        if places:
            wanted = [i for i in span if ids[i] in places]
            self._plan.locate(wanted)
            self._plan.check_lengths(span)
            for attempt in (1, 2):
                try:
                    self._src.read_chunks_into([self._plan.location(cid) for cid in places], places, out, self._repo,
                                               keep=memoryview(result) if result is not None else None)
                    break
                except PackMissingError:  # a gc moved them since they were located: locate again, once
                    if attempt == 2:
                        raise
                    self._plan.relocate(wanted)
                    self._plan.check_lengths(span)
        del out
        if result is None:
            return None
        return bytes(result) if isinstance(result, bytearray) else result

    @overload
    def _pread_runs(self, offset: int, end: int, into: None = None) -> bytes: ...
    @overload
    def _pread_runs(self, offset: int, end: int, into: memoryview) -> None: ...

    def _pread_runs(self, offset: int, end: int, into: memoryview | None = None) -> bytes | None:
        """Bytes [offset, end) of a file in a local store, in one new buffer: each run of
        raw chunks is read straight into it, a piece at a time, and every chunk verified
        there while it is still in the CPU's cache; compressed chunks and chunks cut by
        the edges are decoded and copied. A pack gone since the file was located (a gc
        moved its chunks) makes it locate the file again, once. With `into`, the bytes land
        there and nothing is returned."""
        for fut in self._pending.values():  # a large read starts no read-ahead
            fut.cancel()
        self._pending.clear()
        self._ahead_end = 0
        self._streak = self._streak + end - offset if offset == self._last_end else end - offset
        self._last_end = end
        if into is None:
            result, out = _new_bytes(end - offset)
        else:
            result, out = None, into
        self._fill_located(offset, end, out)
        del out
        if result is None:
            return None
        return bytes(result) if isinstance(result, bytearray) else result

    def _fill(self, offset: int, end: int, out: memoryview) -> None:
        """Bytes [offset, end) of the file into `out`: edge chunks copied, whole ones landed."""
        m = self._m
        ends, lens = m.ends, m.lengths
        span = m.span(offset, end)
        full_lo = span.start if ends[span.start] - lens[span.start] >= offset else span.start + 1
        full_hi = span.stop if ends[span.stop - 1] <= end else span.stop - 1
        edges = [i for i in dict.fromkeys((span.start, span.stop - 1)) if not full_lo <= i < full_hi]
        if edges:
            self._copy_edges(edges, offset, end, out)
        if full_lo < full_hi:
            self._land(full_lo, full_hi, offset, out)

    def _copy_edges(self, edges: list[int], offset: int, end: int, out: memoryview) -> None:
        """The parts of chunks cut by [offset, end), from the LRU or read whole (and kept:
        the next sequential read starts in the last one)."""
        ends, lens = self._m.ends, self._m.lengths
        need = [i for i in edges if i not in self._lru]
        got = self._fetch(need) if need else {}
        got.update((i, self._lru[i]) for i in edges if i not in got)  # all before any is remembered (evicts)
        for i in edges:
            data = got[i]
            cs = ends[i] - lens[i]
            lo, hi = max(offset, cs) - cs, min(end, ends[i]) - cs
            out[cs + lo - offset:cs + hi - offset] = memoryview(data)[lo:hi]
            self._remember(i, data)

    def _land(self, first: int, stop: int, base: int, out: memoryview) -> None:
        """Whole chunks [first, stop) into `out` (which holds the file from byte `base`).
        Raw runs are read and checked in C with the GIL released: a run of `PARALLEL_RUNS_MIN` or
        more is read half here, half on the read-ahead pool, as compressed chunks are decoded."""
        pieces, packed = self._plan.pieces(first, stop)
        ends, lens = self._m.ends, self._m.lengths
        if packed and self._by_runs:  # compressed chunks between raw runs: one read for both
            self._land_mixed(self._plan.mixed(pieces, packed, base), out)
            return
        half = None
        if len(packed) >= 2 and sum(lens[i] for i in packed) >= PARALLEL_DECODE_MIN:
            # compressed chunks decode on two cores: zstd and the hashes release the GIL
            cut = len(packed) // 2
            half = _prefetch_pool().submit(self._fetch, packed[cut:])
            packed = packed[:cut]
        other = None
        if len(pieces) >= 2 and ends[pieces[-1][3] - 1] - (ends[pieces[0][2]] - lens[pieces[0][2]]) >= PARALLEL_RUNS_MIN:
            # raw runs are read and checked in C with the GIL released: half of them on a second core
            cut = len(pieces) // 2
            other = _prefetch_pool().submit(self._read_pieces, pieces[cut:], base, out)
            pieces = pieces[:cut]
        try:
            self._read_pieces(pieces, base, out)
            if other is not None:
                other.result()
            for got in ((self._fetch(packed) if packed else {}), (half.result() if half else {})):
                for i, data in got.items():
                    at = ends[i] - lens[i] - base
                    out[at:at + lens[i]] = data
        finally:
            for fut in (half, other):
                if fut is not None and not fut.cancel():
                    fut.exception()  # wait: it writes into `out`

    def _land_mixed(self, reads: list[tuple[str, list[tuple[int, PackEntry]]]], out: memoryview) -> None:
        """Reads of raw and compressed chunks back to back (`FilePlan.mixed`) into `out`: a read
        of `PARALLEL_RUNS_MIN` or more, half of them on the read-ahead pool (the preads, the
        checks and zstd release the GIL)."""
        other = None
        if len(reads) >= 2 and sum(e.raw_len for _, parts in reads for _, e in parts) >= PARALLEL_RUNS_MIN:
            cut = len(reads) // 2
            other = _prefetch_pool().submit(self._read_mixed, reads[cut:], out)
            reads = reads[:cut]
        try:
            self._read_mixed(reads, out)
            if other is not None:
                other.result()
        finally:
            if other is not None and not other.cancel():
                other.exception()  # wait: it writes into `out`

    def _read_mixed(self, reads: list[tuple[str, list[tuple[int, PackEntry]]]], out: memoryview) -> None:
        for pack, parts in reads:
            self._src.read_mixed_into(pack, parts, out)

    def _read_pieces(self, pieces: list[Piece], base: int, out: memoryview) -> None:
        read_pieces(self._src, self._m, pieces, base, out)

    def pieces(self, offset: int, length: int) -> list[bytes | memoryview]:
        """The bytes [offset, offset+length) as a list of bytes-like pieces (views of
        the chunks, no copies); for callers that write or hash rather than join."""
        m = self._m
        span = m.span(offset, offset + length)
        if not span:
            return [b""]
        sequential = offset == self._last_end
        self._last_end = offset + length
        self._streak = self._streak + length if sequential else length
        chunks = self._chunks(span, prefetch=sequential)
        lo = offset - m.chunk_start(span.start)
        if len(chunks) == 1:
            return [memoryview(chunks[0])[lo:lo + length]]
        hi = offset + length - m.chunk_start(span.stop - 1)  # bytes wanted from the last chunk
        return [memoryview(chunks[0])[lo:], *chunks[1:-1], memoryview(chunks[-1])[:hi]]

    def read_pieces(self, size: int) -> list[bytes | memoryview]:
        """Like `read(size)` but returns `pieces` (empty list at the end of file)."""
        self._checkClosed()
        start = self._pos
        end = min(self._m.size, start + size)
        if start >= end:
            return []
        self._pos = end
        return self.pieces(start, end - start)

    def _chunks(self, span: range, prefetch: bool) -> list[bytes | memoryview]:
        m = self._m
        ahead: list[int] = []
        if prefetch and self._readahead:
            # the read-ahead grows with the run of back-to-back reads (4x what it read), so that two
            # adjacent small reads (frame i, then i + 1) do not start a 32 MiB read-ahead. Chunks
            # before `_ahead_end` were scheduled by an earlier read: each is looked at once, so a
            # scan in small reads costs O(chunks), not O(reads x window)
            ends = m.ends
            target = ends[span.stop - 1] + min(self._readahead, 4 * self._streak)
            stop = min(len(ends), bisect.bisect_left(ends, target, span.stop) + 1)
            # (with nothing pending, nothing ahead is scheduled: a direct read may have come between)
            ahead = list(range(max(span.stop, self._ahead_end) if self._pending else span.stop, stop))
            self._ahead_end = max(self._ahead_end, stop)
        else:  # random access: drop read-ahead that this read does not use
            self._ahead_end = 0
            used = {id(self._pending[k]) for k in span if k in self._pending}
            for k in [k for k in self._pending if k not in span]:
                fut = self._pending.pop(k)
                if id(fut) not in used:
                    fut.cancel()
        need = [i for i in span if i not in self._lru and i not in self._pending]
        later = [i for i in ahead if i not in self._lru and i not in self._pending]
        self._plan.locate(need + later)
        pool = _prefetch_pool()
        group: list[int] = []
        size = 0
        for i in later:  # prefetch in ~batch_bytes groups so that they decode in parallel
            group.append(i)
            size += m.lengths[i]
            if size >= self._batch or i == later[-1]:
                fut = pool.submit(self._fetch, group)
                for k in group:
                    self._pending[k] = fut
                group, size = [], 0
        got = self._fetch(need) if need else {}
        out = []
        for i in span:  # collect everything before caching anything: caching may evict
            data = self._lru.get(i)
            if data is None:
                data = got[i] if i in got else self._pending.pop(i).result()[i]
            out.append(data)
        # a sequential scan only comes back for the chunk it stopped in; random reads keep all
        keep = zip(span, out) if not prefetch else [(span[-1], out[-1])]
        for i, data in keep:
            self._remember(i, data)
        return out

    def _remember(self, i: int, data: bytes | memoryview) -> None:
        self._lru[i] = data
        self._lru.move_to_end(i)
        while len(self._lru) > self._lru_cap:
            self._lru.popitem(last=False)

    def _fetch(self, indices: list[int]) -> dict[int, bytes | memoryview]:
        """Chunks by index, verified; a pack gone since they were located (a gc moved
        them) makes them located again, once."""
        try:
            return self._fetch_once(indices)
        except PackMissingError:
            self._plan.relocate(indices)
            return self._fetch_once(indices)

    def _fetch_once(self, indices: list[int]) -> dict[int, bytes | memoryview]:
        ids = self._m.chunk_ids
        data = self._src.read_chunks(self._plan.items(indices), self._repo)
        out: dict[int, bytes | memoryview] = {i: data[ids[i]] for i in indices}
        for i, chunk in out.items():  # whatever the source: never a short (or long) chunk
            if len(chunk) != self._m.lengths[i]:
                self._plan.check_lengths([i])
                raise CorruptionError(f"{self.name or 'file'}: chunk {i} ({ids[i].hex()[:16]}...) holds "
                                      f"{len(chunk)} bytes, its manifest says {self._m.lengths[i]}: the manifest "
                                      f"is damaged; the file cannot be read")
        return out

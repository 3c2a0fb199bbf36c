"""The window small sequential reads of a local store are served from.

A read of 64 KiB through Python costs a copy out of something; walking the chunks for each
one costs more. So a `FileReader` of a local store keeps a window of whole chunks (about
`WINDOW` bytes, read run by run and verified there, `read_run` in C with the GIL released)
and copies each small read out of it, as a buffered file does. While the reader copies out
of one window, the next is read and verified on the read pool into a second buffer: the
two cores do the copying and the checking side by side, and a scan never waits for a fill
it could have overlapped.

On a store whose packs are files here (`run_fd`), the next window is filled by a native
thread (`_xxh3.Filler`) that never takes the GIL: a pool thread must take it to start and
to finish each fill, and while the reader's thread runs Python it waits up to the switch
interval (5 ms) for it, so fills ran behind the reads instead of beside them (64 KiB reads
of a 140 MB file: 35 ms, against 14.9 ms of filling on one core). A reader that reaches the
window before it is full reads and checks the rest of its slices itself.

Windows start and end at chunk boundaries, so a fill never cuts a chunk: a background
fill touches neither the reader's LRU nor its plan (its reads are planned, in the
reader's thread, before it is handed over). A fill that fails in the background (a pack
moved by a gc, damage) is dropped, and the window is filled again in the reader's
thread, where the error surfaces or the file is located again.
"""
from __future__ import annotations

import bisect
from concurrent.futures import Executor, Future
from typing import Callable, Mapping

from ..core._xxh3 import Filler
from ..core.errors import CdcError, CorruptionError
from ..core.manifest import Manifest
from .fileplan import FilePlan, Piece
from .roles import ChunkSource

WINDOW = 1024 * 1024  # bytes of whole chunks per window (one chunk when a chunk is larger): L2-sized
SPIN_US = 0  # the native filler's spin before it sleeps: none (with other jobs on the cores, spinning
#              took their time: 64 KiB reads 0.38x plain with 500 us, 0.49x without, load 5)

Fill = Callable[[int, int, memoryview], None]  # reads bytes [start, stop) of the file into a view
Filled = tuple[bytearray, int, int, int]  # a window read ahead: its buffer, first byte, length, the chunk after it
Run = tuple[int, int, int, list[int], list[int]]  # a native run: pack fd, offset, where in the window, lengths, checks


def read_pieces(source: ChunkSource, manifest: Manifest, pieces: list[Piece], base: int, out: memoryview) -> None:
    """Each piece of raw chunks (`FilePlan.pieces`) read straight into its place in `out` (the
    file from byte `base`) and checked there, against the pack entries' checksums (the store's
    own packs, docs/architecture.md "Trust model"); any thread."""
    ids, lens, ends = manifest.chunk_ids, manifest.lengths, manifest.ends
    read = source.read_run_into
    for pack, offset, i, j, checks in pieces:
        at = ends[i] - lens[i] - base
        read(pack, offset, out[at:ends[j - 1] - base], ids[i:j], lens[i:j], checks)


class ReadWindow:
    """Two buffers of whole chunks of one file: the one reads are copied from, and the
    next, filled ahead on `pool()`. Not thread-safe by itself: the reader's lock guards it.

    `copy`'s `fill(start, stop, out)` reads bytes [start, stop) of the file into `out` in the
    caller's thread (locating again if a pack moved; passed per call, so that the window holds
    no reference back to its reader); the window ahead is planned with `plan` (a `FilePlan`) in
    the caller's thread and read from `source` on the pool."""

    def __init__(self, source: ChunkSource, manifest: Manifest, plan: FilePlan, repo: str | None,
                 pool: Callable[[], Executor],
                 size: int | None = None):
        self._src, self._m, self._plan, self._repo = source, manifest, plan, repo
        self._pool = pool
        self._size = size or WINDOW
        self._buf: bytearray | None = None  # the current window's memory (refilled in place)
        self._view, self._at = memoryview(b""), 0  # its bytes and its first byte's offset in the file
        self._spare: bytearray | None = None  # the next window's memory
        # the next window's fill (a Future; None: on the native filler), its buffer, first byte, length, chunk after it
        self._next: tuple[Future[Filled] | None, bytearray, int, int, int] | None = None
        self._run_fd: Callable[[str], int] | None = getattr(source, "run_fd", None)  # packs are files here
        self._filler: Filler | None = None

    def covers(self, offset: int, length: int) -> bool:
        return self._at <= offset and offset + length <= self._at + len(self._view)

    def copy(self, offset: int, end: int, out: memoryview, fill: Fill) -> None:
        """Bytes [offset, end) of the file into `out`, window after window."""
        pos = offset
        while pos < end:
            lo = pos - self._at
            if not 0 <= lo < len(self._view):
                self._move(pos, fill)
                lo = pos - self._at
            n = min(end - pos, len(self._view) - lo)
            out[pos - offset:pos - offset + n] = self._view[lo:lo + n]
            pos += n

    def take(self, offset: int, end: int) -> bytes | None:
        """Bytes [offset, end) copied out of the window, or None when it does not hold them all."""
        lo = offset - self._at
        if lo < 0 or end - self._at > len(self._view):
            return None
        return bytes(self._view[lo:end - self._at])

    def view(self, offset: int, end: int) -> memoryview:
        """Bytes [offset, end) as a view into the window (valid until the next read), when
        the window holds them all (`covers`)."""
        lo = offset - self._at
        return self._view[lo:lo + end - offset]

    def _bounds(self, first: int) -> tuple[int, int, int]:
        """The window that starts at chunk `first`: its first byte, its length, the chunk after it."""
        ends, lens = self._m.ends, self._m.lengths
        start = ends[first] - lens[first]
        stop = max(first + 1, bisect.bisect_right(ends, start + self._size, first))
        return start, ends[stop - 1] - start, stop

    def _move(self, pos: int, fill: Fill) -> None:
        """Make the window hold byte `pos`: the window filled ahead when it holds it, else a
        fill here; then the one after it is started on the pool."""
        self._view = memoryview(b"")  # a failed fill leaves no window
        got = self._take_next(pos)
        if got is None:
            first = bisect.bisect_right(self._m.ends, pos)
            start, length, stop = self._bounds(first)
            if self._buf is None or len(self._buf) < length:
                self._buf = bytearray(max(self._size, length))
            view = memoryview(self._buf)[:length]
            fill(start, start + length, view)
        else:
            buf, start, length, stop = got
            self._spare, self._buf = self._buf, buf
            view = memoryview(buf)[:length]
        self._view, self._at = view, start
        self._ahead(stop)

    def _take_next(self, pos: int) -> Filled | None:
        """The window filled ahead, when it holds `pos` (waited for if still being filled) and its
        fill succeeded; else None. Its buffer is kept as the spare either way."""
        nxt, self._next = self._next, None
        if nxt is None:
            return None
        fut, buf, start, length, stop = nxt
        if fut is None:  # on the native filler: help it, or wait (it writes into the buffer)
            assert self._filler is not None
            try:
                bad = self._filler.wait()
            except (OSError, RuntimeError):  # an I/O error; or a forked child, where the thread never ran
                bad = (-1, -1)
            if bad is None and start <= pos < start + length:
                return buf, start, length, stop
            self._spare = buf  # damage or an error: the fill is done again here, where it surfaces
            return None
        if start <= pos < start + length:
            try:
                return fut.result()
            except Exception:  # noqa: BLE001 - the fill is done again here, where its error surfaces
                self._spare = buf
                return None
        if not fut.cancel():
            fut.exception()  # wait: it writes into the buffer about to be reused
        self._spare = buf
        return None

    def _native(self, pieces: list[Piece], base: int) -> list[Run] | None:
        """`pieces` as runs for the native filler, or None when it cannot take them (no
        descriptors here, a chunk without its checksum, a pack gone: the pool path decides)."""
        if self._run_fd is None:
            return None
        ends, lens = self._m.ends, self._m.lengths
        runs: list[Run] = []
        for pack, offset, i, j, checks in pieces:
            if checks is None or None in checks:
                return None
            try:
                fd = self._run_fd(pack)
            except (OSError, CdcError):
                return None
            runs.append((fd, offset, ends[i] - lens[i] - base, list(lens[i:j]), checks))  # type: ignore[arg-type]
        return runs

    def _ahead(self, first: int) -> None:
        """Start filling the window that begins at chunk `first` on the pool."""
        if first >= len(self._m.lengths):
            return
        start, length, stop = self._bounds(first)
        pieces, packed = self._plan.pieces(first, stop)  # planned here: the fill touches no shared state
        items = self._plan.items(packed)
        buf = self._spare
        if buf is None or len(buf) < length:
            buf = bytearray(max(self._size, length))
        self._spare = None  # the fill owns it until it is taken
        runs = None if packed else self._native(pieces, start)
        if runs is not None:
            if self._filler is None:
                self._filler = Filler(SPIN_US)
            try:
                self._filler.start(memoryview(buf)[:length], runs)
            except OSError:
                self._spare = buf
                return
            self._next = (None, buf, start, length, stop)
            return

        def fill() -> Filled:
            out = memoryview(buf)[:length]
            read_pieces(self._src, self._m, pieces, start, out)
            if packed:  # compressed chunks: decoded and checked by the source
                self._place(self._src.read_chunks(items, self._repo), packed, start, out)
            return buf, start, length, stop
        self._next = (self._pool().submit(fill), buf, start, length, stop)

    def _place(self, data: Mapping[bytes, bytes | memoryview], packed: list[int], base: int, out: memoryview) -> None:
        ids, ends, lens = self._m.chunk_ids, self._m.ends, self._m.lengths
        for i in packed:
            chunk = data[ids[i]]
            if len(chunk) != lens[i]:
                raise CorruptionError(f"chunk {i} ({ids[i].hex()[:16]}...) holds {len(chunk)} bytes, its "
                                      f"manifest says {lens[i]}")
            at = ends[i] - lens[i] - base
            out[at:at + lens[i]] = chunk

    def close(self) -> None:
        """Drop the windows (a fill still running finishes into memory nobody reads)."""
        if self._next is not None and self._next[0] is not None:
            self._next[0].cancel()
        self._next = None
        if self._filler is not None:
            self._filler.close()  # waits for a fill still running: it writes into our buffer
            self._filler = None
        self._buf = self._spare = None
        self._view = memoryview(b"")

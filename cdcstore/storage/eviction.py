"""The chunk cache's budget: what goes when the cache is over its size, and the files it frees.

Eviction is a segmented LRU (cache.py's module doc): probation before hot, least recently used
first, hot entries past `HOT_SHARE` of the budget demoted first. Then the segment files that
eviction emptied are deleted, and the live entries of the emptiest others copied forward into
this process's segment, until the folder fits the budget too. Only closed segments are touched:
sealed, or their writer gone or idle for `ABANDONED` seconds.
"""
from __future__ import annotations

import os
import time
import sqlite3
from typing import ContextManager, Protocol

from .. import runtime
from .roles import Raw
from .segments import Segments
from .sqlite import ints


class EvictionHost(Protocol):
    """What eviction asks of the cache it keeps in budget (`cache.ChunkCache`)."""

    max_bytes: int

    @property
    def conn(self) -> sqlite3.Connection: ...

    def transaction(self) -> ContextManager[sqlite3.Connection]: ...

    def bytes(self) -> int: ...

    def appending(self) -> int | None: ...

    def append(self, buffers: list[Raw], now: float) -> tuple[int, list[int]]: ...

HOT_SHARE = 0.8  # share of the budget hot (read twice) entries may keep
ABANDONED = 600.0  # seconds after its last write that another process may reclaim an unsealed segment


class Eviction:
    """Keeps one `cache.ChunkCache` within its budget (its rows and its segment files)."""

    def __init__(self, cache: EvictionHost, files: Segments) -> None:
        self._cache = cache  # cache.ChunkCache: its connection, transactions and appends
        self._files = files

    def prune(self, max_bytes: int | None = None) -> int:
        """`ChunkCache.prune`: evict to 90% of the budget, then reclaim segment files."""
        limit = self._cache.max_bytes if max_bytes is None else max_bytes
        freed = self._evict(limit, max_bytes is not None)
        self._reclaim(limit)
        return freed

    def _evict(self, limit: int, asked: bool) -> int:
        target = int(limit * 0.9) if self._cache.bytes() > limit or asked else limit
        freed = 0
        self._demote(int(target * HOT_SHARE))
        while True:
            excess = self._cache.bytes() - target
            if excess <= 0:
                return freed
            with self._cache.transaction():
                conn = self._cache.conn
                rows = conn.execute("SELECT id, size FROM chunks ORDER BY hot, used LIMIT 1000").fetchall()
                if not rows:
                    return freed
                drop, total = [], 0
                for cid, size in rows:
                    drop.append((cid,))
                    total += size
                    if total >= excess:
                        break
                conn.executemany("DELETE FROM chunks WHERE id = ?", drop)
                freed += total

    def _reclaim(self, limit: int) -> None:
        """Delete the segments no live entry is in, and while the folder holds more than `limit`
        bytes, move the live entries of the emptiest segments to this process's segment and
        delete those too. Only closed segments: sealed, or their writer gone or idle for
        `ABANDONED` s (a writer finds its segment gone and starts another). Files are deleted
        after the rows stop naming them; a reader that looked before finds none: a miss."""
        now = time.time()
        gone: list[int] = []
        with self._cache.transaction():
            own, conn = self._cache.appending(), self._cache.conn
            rows = conn.execute("SELECT seg, size, live, sealed, owner, at FROM segments").fetchall()
            closed = [r for r in rows if r[0] != own and
                      (r[3] or r[5] < now - ABANDONED or runtime.dead_elsewhere(r[4]))]
            gone = [r[0] for r in closed if r[2] <= 0]
            disk = sum(r[1] for r in rows) - sum(r[1] for r in closed if r[2] <= 0)
            for seg, size, live, *_ in sorted((r for r in closed if r[2] > 0), key=lambda r: r[2] / max(r[1], 1)):
                if disk <= limit:
                    break
                self._move_out(seg, now)
                gone.append(seg)
                disk += live - size
            conn.executemany("DELETE FROM segments WHERE seg = ?", [(g,) for g in gone])
            known = {r[0] for r in conn.execute("SELECT seg FROM segments")}
        for seg in gone:
            self._files.remove(seg)
        for seg in self._files.numbers() - known:  # left by a lost database or an aborted write
            try:
                if os.path.getmtime(self._files.path(seg)) < now - 60:
                    self._files.remove(seg)
            except FileNotFoundError:
                pass

    def _move_out(self, seg: int, now: float) -> None:
        """Inside a write transaction: copy the live entries of segment `seg` to this process's
        segment (entries whose bytes are lost or short are dropped)."""
        conn = self._cache.conn
        rows = conn.execute("SELECT id, off, size FROM chunks WHERE seg = ?", (seg,)).fetchall()
        keep: list[tuple[bytes, bytes]] = []
        lost: list[tuple[bytes, bytes | None]] = []
        for cid, off, size in rows:
            data = self._files.read(seg, off, size) if ints(off, size) else None
            if data is not None and len(data) == size:
                keep.append((cid, data))
            else:
                lost.append((cid, data))
        conn.executemany("DELETE FROM chunks WHERE id = ? AND seg = ?", [(c, seg) for c, _ in lost])
        if keep:
            to, offsets = self._cache.append([d for _, d in keep], now)
            conn.executemany("UPDATE chunks SET seg = ?, off = ? WHERE id = ? AND seg = ?",
                             [(to, off, cid, seg) for (cid, _), off in zip(keep, offsets)])

    def _demote(self, cap: int) -> None:
        """Move the oldest hot entries to probation until hot ones hold at most `cap` bytes."""
        with self._cache.transaction():
            conn = self._cache.conn
            excess = conn.execute("SELECT COALESCE(SUM(size), 0) FROM chunks WHERE hot = 1").fetchone()[0] - cap
            if excess <= 0:
                return
            drop, total = [], 0
            for cid, size in conn.execute("SELECT id, size FROM chunks WHERE hot = 1 ORDER BY used"):
                if total >= excess:
                    break
                drop.append((cid,))
                total += size
            conn.executemany("UPDATE chunks SET hot = 0 WHERE id = ?", drop)

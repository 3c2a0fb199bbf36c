"""The local dedup cache: chunks (and immutable manifests and commits) by id.

One sqlite file (WAL mode, busy timeout) shared by every file, version, repo and
process on the machine: a chunk fetched for v1 serves v2, and DataLoader workers
share it. sqlite says where each chunk is and in what order to evict; the chunk bytes
are in append-only segment files beside it (`segments.py`: written once, not twice as
a WAL blob is). Entries keep their stored (compressed) form and are checked against
their id on every read; a corrupt or lost entry is dropped and fetched again. The cache is
bounded: past `max_bytes`, entries go until it is at 90%, least recently used first,
and segments that eviction emptied (or mostly emptied: their live entries are copied
forward first) are deleted, so the folder stays within the budget too.

Admission is scan resistant (a segmented LRU): a chunk enters on probation and is
promoted ("hot") when it is read from the cache once more. Eviction takes probation
first, so a one-pass scan larger than the cache (a stream, a cold pull) replaces
only other probation entries and leaves the hot set alone; hot entries past
`HOT_SHARE` of the budget are demoted to probation, oldest first, so that new data
always gets in. Recency is refreshed at most once a minute per entry, so hits
rarely write (a promotion is one write per entry).

`CachedBackend` puts the cache in front of any `Backend` (normally a
`RemoteStore`): reads take what the cache holds and fetch only the rest.
"""
from __future__ import annotations

import builtins
import collections
import contextlib
import dataclasses
import logging
import os
import queue
import re
import sqlite3
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping, TYPE_CHECKING, TypeVar, TypedDict, cast

import platformdirs

from .. import runtime, settings
from ..core import ids
from ..core import treeobj
from ..core.address import is_commit_like
from ..core.commit import Commit
from ..core.errors import CorruptionError, InvalidAddressError
from ..core.wire import LOCATED_ENDS
from ..core.manifest import Manifest
from ..core.pack import CODEC_RAW, PackEntry, decode_chunk
from . import cache_tables
from . import memo
from .backend import Backend, BackendCapabilities
from .eviction import Eviction
from .memo import HEAD_TTL
from .overlay import Held, Overlay
from .roles import Located, Places, Raw
from .segments import SEGMENT_BYTES, Segments
from .sqlite import Connections, ints, is_closed_error

ENV_CACHE = settings.CACHE.name
ENV_CACHE_SIZE = settings.CACHE_SIZE.name
DEFAULT_MAX_BYTES = 20 * 1024**3
TOUCH_EVERY = 60.0  # seconds between recency updates of one entry
PUT_TXN_BYTES = 2 * 1024 * 1024  # bytes a background write holds the write lock for, at most
PENDING_BYTES = 256 * 1024 * 1024  # background cache writes waiting at most (then readers wait)
TAG_PREFIX = "tag/"  # heads rows of tags (kept without a time limit: tags never move)
RECENT_IDS = 1 << 16  # ids of chunks this process wrote to the cache that `fetched_here` remembers
FLIGHT_WAIT = 120.0  # seconds a read waits for another thread's fetch of the same chunk before its own
STORE_ID_PREFIX = "store-id:"  # heads rows naming the store id a location's server named last (repo = prefix + location)
_BATCH = 500
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}

_Entry = tuple[bytes, int, int, Raw]  # (id, codec, raw length, stored bytes): what `put` stores
_Job = tuple[list[_Entry], int]  # a batch for the background writer and its stored bytes
_Item = tuple[str, PackEntry]  # (location, entry): a pack name or a `Held` place
_Claimed = tuple[_Item, threading.Event]  # an item another thread fetches, and the event of its landing

if TYPE_CHECKING:
    from typing import Protocol

    class _LearnsBundles(Protocol):
        """What an inner backend whose `capabilities.bundles` is set answers besides `Backend`
        (storage/roles.py: `BackendCapabilities.bundles`)."""

        def learn_bundles(self, pairs: Iterable[tuple[str, str]]) -> None: ...


class CacheStats(TypedDict):
    """`ChunkCache.stats`."""

    path: str
    chunks: int
    bytes: int
    raw_bytes: int
    objects: int
    max_bytes: int
    segments: int
    segment_bytes: int


def _parts(entries: list[_Entry], limit: int) -> list[list[_Entry]]:
    """`entries` (id, codec, raw length, stored bytes) cut into runs of about `limit` bytes."""
    out: list[list[_Entry]] = []
    part: list[_Entry] = []
    size = 0
    for e in entries:
        part.append(e)
        size += len(e[3])
        if size >= limit:
            out.append(part)
            part, size = [], 0
    return out + [part] if part else out


def parse_size(text: str | int) -> int:
    """'20G', '512M', '1.5T' or a number of bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgtKMGT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise InvalidAddressError(f"invalid size {text!r}: use bytes or a number with K, M, G or T")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def default_cache_path() -> str:
    return settings.CACHE.get() or os.path.join(platformdirs.user_cache_dir("cdcstore"), "cache.sqlite")


class ChunkCache:
    def __reduce__(self) -> tuple[type[ChunkCache], tuple[str, int]]:
        # pickles as its settings (connections and threads are per process)
        return ChunkCache, (self.path, self.max_bytes)

    def __init__(self, path: str | None = None, max_bytes: int | str | None = None):
        self.path = os.path.abspath(os.path.expanduser(path or default_cache_path()))
        if max_bytes is None and (raw := settings.CACHE_SIZE.get()) is not None:  # set (`is_set`)
            try:
                max_bytes = parse_size(raw)
            except InvalidAddressError:
                raise settings.SettingError(f"{settings.CACHE_SIZE.name}={raw!r}: expected a size such as 20GB, "
                                            f"512M or a number of bytes") from None
        self.max_bytes = parse_size(DEFAULT_MAX_BYTES if max_bytes is None else max_bytes)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        # a cache needs no durability (every read is verified): no fsyncs; 16 KiB pages for 64 KiB blobs
        self._conns = Connections(self.path, synchronous="OFF", page_size=16384)
        self._proc = runtime.Local()  # set once this process's in-memory state is made (`_here`)
        self._wlock = runtime.Lock()  # this process's cache writers queue on it (`transaction`)
        self._here()
        cache_tables.create(self.conn)
        cache_tables.add_hot(self.conn)
        self._files = Segments(self.path + "-chunks")
        self._eviction = Eviction(self, self._files)  # the budget (eviction.py)
        self._writing = runtime.Local()  # [segment, fd, end]: the segment this process appends to
        cache_tables.add_segments(self.conn)

    def _here(self) -> None:
        """This process's in-memory state (the writer queue and the condition guarding it). A
        forked child starts afresh: the parent's condition may be held by the parent's writer
        thread, which does not exist in the child (a DataLoader worker hung on it)."""
        self._proc.get(self._fresh)

    def _fresh(self) -> bool:
        self._idle = threading.Condition()
        self._pending = 0
        self._writer = False  # the background writer runs in this process
        self._writer_thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue[_Job | None] | None = None
        self._queued: dict[bytes, _Entry] = {}  # id -> entry waiting for the background writer
        self._recent: collections.OrderedDict[bytes, None] = collections.OrderedDict()  # ids it wrote lately (`fetched_here`)
        self._busy = threading.Lock()  # held by the background writer while it is in sqlite
        return True

    @property
    def conn(self) -> sqlite3.Connection:
        """This thread's connection (a new one after a fork)."""
        return self._conns.conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction. Writers of this process queue on a lock, so that a small
        write (a manifest, a head) waits for one short background transaction rather than
        in sqlite's busy handler, which sleeps up to 100 ms a round."""
        with self._wlock, self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            yield self.conn

    # -- chunks -----------------------------------------------------------------------------
    def has(self, chunk_ids: Iterable[bytes]) -> dict[bytes, PackEntry]:
        """Which of these chunks the cache holds (as entries with their raw length)."""
        wanted = list(dict.fromkeys(chunk_ids))
        self._here()
        queued = self._queued
        out = {cid: PackEntry(cid, 0, len(e[3]), e[2], e[1]) for cid in wanted if (e := queued.get(cid))}
        wanted = [c for c in wanted if c not in out]
        for i in range(0, len(wanted), _BATCH):
            batch = wanted[i:i + _BATCH]
            q = f"SELECT id, codec, raw_len, size FROM chunks WHERE id IN ({','.join('?' * len(batch))})"
            for cid, codec, raw_len, size in self.conn.execute(q, batch):
                if ints(codec, raw_len, size):  # a row of the wrong types is a miss (`get` drops it)
                    out[cid] = PackEntry(cid, 0, size, raw_len, codec)
        return out

    def get(self, chunk_ids: Iterable[bytes], touch: bool = True) -> dict[bytes, Raw]:
        """Verified raw bytes of the cached chunks among `chunk_ids`; corrupt entries
        are deleted and left out (so the caller fetches them again). A hit writes only
        when its recency is over a minute old, so warm reads stay read-only. `touch=False`:
        the hit is not a use (a reader reading again what it fetched itself moments ago:
        no promotion, no recency write)."""
        wanted = list(dict.fromkeys(chunk_ids))
        out, bad, stale, promote = {}, [], [], []
        self._here()
        queued = self._queued
        for cid in wanted:  # entries still waiting for the background writer
            e = queued.get(cid)
            if e is not None:
                out[cid] = decode_chunk(e[3], e[1], e[2], cid)
        wanted = [c for c in wanted if c not in out]
        now = time.time()
        for i in range(0, len(wanted), _BATCH):
            batch = wanted[i:i + _BATCH]
            q = (f"SELECT id, codec, raw_len, used, hot, data, seg, off, size FROM chunks "
                 f"WHERE id IN ({','.join('?' * len(batch))}) ORDER BY seg, off")
            for cid, codec, raw_len, used, hot, data, seg, off, size in self.conn.execute(q, batch).fetchall():
                try:
                    if not (ints(codec, raw_len, hot) and isinstance(used, (int, float)) and isinstance(data, bytes)):
                        raise CorruptionError("a cache row of the wrong types")
                    if seg is not None:
                        if not ints(seg, off, size):
                            raise CorruptionError("a cache row of the wrong types")
                        data = self._files.read(seg, off, size)
                        if data is None:
                            raise CorruptionError("its segment is gone")
                    out[cid] = decode_chunk(data, codec, raw_len, cid)
                    if not touch:
                        continue
                    if not hot:
                        promote.append(cid)
                    elif used < now - TOUCH_EVERY:
                        stale.append(cid)
                except CorruptionError:
                    bad.append((cid, seg))
        if bad or stale or promote:
            with self.transaction():  # a bad row goes only if it still names what was read (not moved since)
                self.conn.executemany("DELETE FROM chunks WHERE id = ? AND seg IS ?", bad)
                self.conn.executemany("UPDATE chunks SET used = ? WHERE id = ?", [(now, c) for c in stale])
                self.conn.executemany("UPDATE chunks SET used = ?, hot = 1 WHERE id = ?",
                                      [(now, c) for c in promote])
        return out

    def fetched_here(self, chunk_ids: Iterable[bytes]) -> dict[bytes, Raw]:
        """Verified raw bytes of the chunks among `chunk_ids` that this process fetched lately (still
        queued for the writer, or among the last `RECENT_IDS` it wrote): a reader reading again what
        it fetched, without a sqlite query for the rest. Not a use (`get(touch=False)`)."""
        self._here()
        queued, recent = self._queued, self._recent
        out = {}
        written = []
        for cid in chunk_ids:
            e = queued.get(cid)
            if e is not None:
                out[cid] = decode_chunk(e[3], e[1], e[2], cid)
            elif cid in recent:
                written.append(cid)
        if written:
            out.update(self.get(written, touch=False))
        return out

    def queued(self, chunk_ids: Iterable[bytes]) -> set[bytes]:
        """Which of these chunks wait in this process's queue for the writer (no sqlite)."""
        self._here()
        return {c for c in chunk_ids if c in self._queued}

    def put(self, entries: list[_Entry]) -> None:
        """Store (id, codec, raw length, stored bytes) entries on probation, then evict if
        over budget. An entry already cached is left as it is."""
        if not entries:
            return
        now = time.time()
        for part in _parts(entries, PUT_TXN_BYTES):
            with self.transaction():
                self._put_part(part, now)
            time.sleep(0)  # let a waiting writer of this process have the lock
        if self.bytes() > self.max_bytes:
            self.prune()

    def _put_part(self, part: list[_Entry], now: float) -> None:
        """Inside a write transaction: append the bytes of the entries not cached yet to this
        process's segment, then add their rows (bytes first: a row never names unwritten bytes)."""
        wanted = list(dict.fromkeys(e[0] for e in part))
        q = f"SELECT id FROM chunks WHERE id IN ({','.join('?' * len(wanted))})"
        have = {r[0] for r in self.conn.execute(q, wanted)}
        new = []
        for e in part:
            if e[0] not in have:
                have.add(e[0])
                new.append(e)
        if not new:
            return
        seg, offsets = self.append([e[3] for e in new], now)
        self.conn.executemany(
            "INSERT INTO chunks (id, codec, raw_len, size, used, data, seg, off) VALUES (?, ?, ?, ?, ?, x'', ?, ?)",
            [(cid, codec, raw_len, len(data), now, seg, off) for (cid, codec, raw_len, data), off in zip(new, offsets)])
        # the byte counts, once per part: per-row insert triggers cost 70% of the inserts (45 ms per
        # 100 MB of chunks). An older cdcstore re-creates its triggers when it opens the cache; then
        # they count and this does not.
        added = sum(len(e[3]) for e in new)
        counted = {r[0] for r in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name IN ('chunks_add', 'seg_add')")}
        if "chunks_add" not in counted:
            self.conn.execute("UPDATE meta SET value = value + ? WHERE key = 'bytes'", (added,))
        if "seg_add" not in counted:
            self.conn.execute("UPDATE segments SET live = live + ? WHERE seg = ?", (added, seg))

    def append(self, buffers: list[Raw], now: float) -> tuple[int, list[int]]:
        """Inside a write transaction: write `buffers` to this process's segment (a new one when
        it is full, or when another process reclaimed it or its file was deleted); (segment, offsets)."""
        size = sum(len(b) for b in buffers)
        w: list[int] | None = self._writing.here()  # [segment, fd, end]
        if w is not None and (w[2] + size > SEGMENT_BYTES and w[2] or os.fstat(w[1]).st_nlink == 0
                              or self.conn.execute("SELECT 1 FROM segments WHERE seg = ?", (w[0],)).fetchone() is None):
            self._seal()
            w = None
        if w is None:
            seg = self.conn.execute("INSERT INTO segments (owner, at) VALUES (?, ?)", (os.getpid(), now)).lastrowid
            assert seg is not None  # the row just inserted
            w = [seg, self._files.create(seg), 0]
            self._writing.set(w)
        offsets = self._files.append(w[1], w[2], buffers)
        w[2] += size
        self.conn.execute("UPDATE segments SET size = ?, at = ? WHERE seg = ?", (w[2], now, w[0]))
        return w[0], offsets

    def appending(self) -> int | None:
        """The segment this process appends to, if any."""
        w = self._writing.here()
        return w[0] if w is not None else None

    def _seal(self) -> None:
        """This process writes no more to its segment (inside a write transaction)."""
        w = self._writing.here()
        if w is None:
            return
        self._writing.clear()
        os.close(w[1])
        self.conn.execute("UPDATE segments SET sealed = 1 WHERE seg = ?", (w[0],))

    def put_later(self, entries: list[_Entry]) -> None:
        """`put` on a background thread, so that a read does not wait for sqlite.
        Queued entries already count as cached in this process; past `PENDING_BYTES`
        waiting, the caller waits (memory stays bounded)."""
        if not entries:
            return
        size = sum(len(e[3]) for e in entries)
        self._here()
        with self._idle:
            if not self._writer:
                self._queue, self._pending, self._writer = queue.SimpleQueue(), 0, True
                self._queued = {}
                self._writer_thread = runtime.thread(self._write_loop, self._queue, name="cache-writer")
                _WRITERS.add(self)
            self._idle.wait_for(lambda: self._pending + size <= PENDING_BYTES or not self._pending, 60)
            self._pending += size
            for e in entries:
                self._queued[e[0]] = e
        assert self._queue is not None  # made above (a `close` meanwhile failed here before, too)
        self._queue.put((entries, size))

    def _write_loop(self, q: queue.SimpleQueue[_Job | None]) -> None:
        while True:
            item = q.get()
            if item is None:  # `close`
                return
            entries, size = item
            try:
                with self._busy:  # a fork waits for this (`_hold_writers`)
                    self.put(entries)
            except sqlite3.Error:
                pass  # a cache write that fails only costs a later fetch
            finally:
                with self._idle:
                    self._pending -= size
                    for e in entries:
                        self._queued.pop(e[0], None)
                        self._recent[e[0]] = None
                    while len(self._recent) > RECENT_IDS:
                        self._recent.popitem(last=False)
                    self._idle.notify_all()

    def wait(self, timeout: float = 60.0) -> None:
        """Block until this process's background writes are done."""
        self._here()
        with self._idle:
            if self._writer:
                self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        """Land the queued writes, then let go of this process's files and writer thread:
        the segment it appends to is sealed, its open segment files closed. A Store closes
        the cache it opened; one passed to it is the caller's to close. A closed cache may
        be used again: it reopens what it needs."""
        self._here()
        self.wait()
        with self._idle:
            q, self._queue, self._writer = (self._queue if self._writer else None), None, False
        if q is not None:
            q.put(None)  # the writer ends once its last batch is written
            assert self._writer_thread is not None  # started with the queue (`put_later`)
            self._writer_thread.join(60)
        if self._writing.here() is not None:
            try:
                with self.transaction():
                    self._seal()
            except sqlite3.Error:  # a broken cache: its file is let go all the same
                w = self._writing.here()
                self._writing.clear()
                if w is not None:
                    os.close(w[1])
        self._files.close_readers()
        self._conns.close()

    def bytes(self) -> int:
        return cast(int, self.conn.execute("SELECT value FROM meta WHERE key = 'bytes'").fetchone()[0])

    # (below, `bytes` in an annotation would name the method above: the type is `builtins.bytes`)

    def prune(self, max_bytes: int | None = None) -> int:
        """Evict chunks until at most 90% of `max_bytes` remain, probation before hot,
        least recently used first (hot entries past `HOT_SHARE` are demoted first), then
        delete the segments that leaves empty and copy forward the live entries of the
        emptiest others until the folder fits `max_bytes`; returns the bytes evicted."""
        return self._eviction.prune(max_bytes)

    # -- immutable objects (manifests, commits) ------------------------------------------------
    def get_object(self, kind: str, name: str) -> builtins.bytes | None:
        row = self.conn.execute("SELECT data FROM objects WHERE kind = ? AND name = ?", (kind, name)).fetchone()
        if row is None:
            return None
        if not isinstance(row[0], bytes) or not ids.matches(row[0], name):
            with self.conn:
                self.conn.execute("DELETE FROM objects WHERE kind = ? AND name = ?", (kind, name))
            return None
        return row[0]

    def put_object(self, kind: str, name: str, data: builtins.bytes) -> None:
        with self.transaction():
            self.conn.execute("INSERT OR IGNORE INTO objects (kind, name, data) VALUES (?, ?, ?)", (kind, name, data))

    # -- branch heads, briefly ----------------------------------------------------------------
    def get_head(self, repo: str, rev: str, ttl: float = HEAD_TTL, since: float = 0.0) -> str | None:
        """A head written in the last `ttl` seconds and after `since` (a write of this process)."""
        row = self.conn.execute("SELECT revcommit FROM heads WHERE repo = ? AND rev = ? AND typeof(at) = 'real'"
                                " AND at > ?",
                                (repo, rev, max(time.time() - ttl, since))).fetchone()
        return row[0] if row and isinstance(row[0], str) and ids.is_hex_id(row[0]) else None

    def put_head(self, repo: str, rev: str, commit_id: str) -> None:
        with self.transaction():
            self.conn.execute("INSERT OR REPLACE INTO heads VALUES (?, ?, ?, ?)", (repo, rev, commit_id, time.time()))

    def forget_head(self, repo: str, rev: str) -> None:
        with self.transaction():
            self.conn.execute("DELETE FROM heads WHERE repo = ? AND rev = ?", (repo, rev))

    # -- housekeeping --------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        n, raw = self.conn.execute("SELECT COUNT(*), COALESCE(SUM(raw_len), 0) FROM chunks").fetchone()
        objects = self.conn.execute("SELECT COUNT(*) FROM objects").fetchone()[0]
        segs, disk = self.conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM segments").fetchone()
        return {"path": self.path, "chunks": n, "bytes": self.bytes(), "raw_bytes": raw,
                "objects": objects, "max_bytes": self.max_bytes, "segments": segs, "segment_bytes": disk}

    def clear(self) -> None:
        with self.transaction():
            self._seal()
            for table in ("chunks", "objects", "heads", "segments"):
                self.conn.execute(f"DELETE FROM {table}")
        for seg in self._files.numbers():
            self._files.remove(seg)
        self.conn.execute("VACUUM")


_WRITERS: "weakref.WeakSet[ChunkCache]" = weakref.WeakSet()  # caches whose background writer runs here
_HELD: list[threading.Lock] = []  # the writers' locks a fork in progress holds


def _hold_writers() -> None:
    """Before a fork: wait (up to 30 s each) until no background cache writer is inside sqlite. A
    DataLoader forks its workers right after the dataset read its footers, while the writer stores
    them: a child forked mid-transaction inherits sqlite's mutexes held and hangs on its first call."""
    for cache in list(_WRITERS):
        lock = getattr(cache, "_busy", None)
        if cache._proc.here() and lock is not None and lock.acquire(timeout=30):
            _HELD.append(lock)


def _release_writers() -> None:
    while _HELD:
        _HELD.pop().release()


runtime.around_fork(_hold_writers, _release_writers)

_LANDED = threading.Event()  # a claim whose chunks are in the cache already
_LANDED.set()

_T = TypeVar("_T")
_EMPTY_ANSWER = {"has": dict, "get": dict, "fetched_here": dict, "queued": set}  # a broken cache's answers (else None)


def _warn_cache(path: str, err: Exception) -> None:
    logging.getLogger("cdcstore").warning(
        f"cdcstore: warning: the cache {path} cannot be used ({err}); reading without it "
        f"(delete it, or set {ENV_CACHE} to a file path, to get a new one)")


def open_cache(spec: ChunkCache | str | bool) -> GuardedCache | None:
    """The cache a `Store` asked for, or None (after one warning) if it cannot be opened."""
    if isinstance(spec, ChunkCache):
        return GuardedCache(spec)  # the caller's, to close
    path = spec if isinstance(spec, str) else None  # (True: the default path)
    try:
        return GuardedCache(ChunkCache(path), owned=True)
    except (sqlite3.Error, OSError) as e:
        _warn_cache(os.path.abspath(os.path.expanduser(path or default_cache_path())), e)
        return None


class GuardedCache:
    """A ChunkCache that, once it fails (a corrupt or truncated file), warns once and
    then answers like an empty cache, so that reads go on without it."""

    def __init__(self, cache: ChunkCache, owned: bool = False):
        self.inner = cache
        self.path = cache.path
        self.broken = False
        self.owned = owned  # opened from a path for a Store, which closes it

    def __reduce__(self) -> tuple[type[GuardedCache], tuple[ChunkCache, bool]]:
        return GuardedCache, (self.inner, self.owned)

    @property
    def max_bytes(self) -> int:
        return self.inner.max_bytes

    def _guarded(self, name: str, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)`, or once the cache failed, what an empty cache answers."""
        for attempt in (0, 1):
            if self.broken:
                break
            try:
                return fn(*args)
            except (sqlite3.DatabaseError, OSError) as e:
                if attempt == 0 and is_closed_error(e):
                    continue  # another thread closed the cache meanwhile: it reopens on this call
                self.broken = True
                _warn_cache(self.path, e)
        return cast(_T, _EMPTY_ANSWER.get(name, lambda: None)())

    # -- ChunkCache's calls, each guarded
    def has(self, chunk_ids: Iterable[bytes]) -> dict[bytes, PackEntry]:
        return self._guarded("has", self.inner.has, chunk_ids)

    def get(self, chunk_ids: Iterable[bytes], touch: bool = True) -> dict[bytes, Raw]:
        return self._guarded("get", self.inner.get, chunk_ids, touch)

    def fetched_here(self, chunk_ids: Iterable[bytes]) -> dict[bytes, Raw]:
        return self._guarded("fetched_here", self.inner.fetched_here, chunk_ids)

    def queued(self, chunk_ids: Iterable[bytes]) -> set[bytes]:
        return self._guarded("queued", self.inner.queued, chunk_ids)

    def put(self, entries: list[_Entry]) -> None:
        self._guarded("put", self.inner.put, entries)

    def put_later(self, entries: list[_Entry]) -> None:
        self._guarded("put_later", self.inner.put_later, entries)

    def wait(self, timeout: float = 60.0) -> None:
        self._guarded("wait", self.inner.wait, timeout)

    def close(self) -> None:
        self._guarded("close", self.inner.close)

    def prune(self, max_bytes: int | None = None) -> int | None:  # (None: the cache failed)
        return self._guarded("prune", self.inner.prune, max_bytes)

    def get_object(self, kind: str, name: str) -> bytes | None:
        return self._guarded("get_object", self.inner.get_object, kind, name)

    def put_object(self, kind: str, name: str, data: bytes) -> None:
        self._guarded("put_object", self.inner.put_object, kind, name, data)

    def get_head(self, repo: str, rev: str, ttl: float = HEAD_TTL, since: float = 0.0) -> str | None:
        return self._guarded("get_head", self.inner.get_head, repo, rev, ttl, since)

    def put_head(self, repo: str, rev: str, commit_id: str) -> None:
        self._guarded("put_head", self.inner.put_head, repo, rev, commit_id)

    def forget_head(self, repo: str, rev: str) -> None:
        self._guarded("forget_head", self.inner.forget_head, repo, rev)

    def stats(self) -> CacheStats | None:  # (None: the cache failed)
        return self._guarded("stats", self.inner.stats)

    def clear(self) -> None:
        self._guarded("clear", self.inner.clear)

    def bytes(self) -> int | None:  # (None: the cache failed)
        return self._guarded("bytes", self.inner.bytes)


def _end_ids(m: Manifest, tail: int) -> list[bytes]:
    """The ids of the chunks that hold a file's last `tail` bytes, and of its last `LOCATED_ENDS`
    chunks (what a reader of its end locates at once: a server's answer locates them)."""
    first = m.span(max(0, m.size - tail), m.size).start if m.size else 0
    return list(m.chunk_ids[min(first, max(0, len(m.chunk_ids) - LOCATED_ENDS)):])


class CachedBackend(Overlay):
    """An overlay whose reads go through a `ChunkCache` first; the rest passes through (`Overlay`).

    Chunks the cache holds are located at `Held.CACHE`. Immutable objects are kept by `meta` in
    this process and in the cache's `objects` table for the machine; tags in the `heads` table for
    good, keyed by the store's identity (storage/memo.py); branch heads are asked of the store."""

    def __init__(self, backend: Backend, cache: ChunkCache | GuardedCache, token: str | None = None,
                 owns_cache: bool = False):
        super().__init__(backend)
        self.cache = cache
        self.owns_cache = owns_cache  # closed with this backend (a Store opened it from a path)
        self._token = token
        # commits and trees are remembered per store and token, so that another token must still
        # ask the server (which checks it); chunks and manifests are shared: they are reached only
        # through a commit
        self._scope = memo.scope(backend.identity, token)
        self._hits = self._misses = 0  # chunks read from the cache / not found there
        self._count_lock = runtime.Lock()
        self._flights = runtime.Local()  # chunk id -> Event of this process's fetches (see `_claim`)

    @property
    def capabilities(self) -> BackendCapabilities:  # type: ignore[override]  # as `Overlay.capabilities`
        """The inner backend's, except that locating goes by blocks (misses go to the inner one) and
        chunks are read into a buffer (`read_chunks_into`), whatever the inner one reads."""
        return dataclasses.replace(self.inner.capabilities, local_reads=False, reads_into=True, reads_runs=False)

    def cache_counters(self) -> dict[str, int]:
        """Chunk reads found in the cache (`cache_hits`) and not found there (`cache_misses`)."""
        return {"cache_hits": self._hits, "cache_misses": self._misses}

    # reads: cache first
    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> Located:
        wanted = list(dict.fromkeys(chunk_ids))
        out: Located = {c: (Held.CACHE, e) for c, e in self.cache.has(wanted).items()}
        rest = [c for c in wanted if c not in out]
        if rest:
            out.update(self.inner.locate(rest, repo))
        return out

    def read_chunks(self, items: list[tuple[str, PackEntry]], repo: str | None = None,
                    stored: dict[bytes, bytes] | None = None) -> dict[bytes, Raw]:
        """Cache first, the rest from `inner` (`_serve`). `stored`, the role's: the cache keeps the
        stored bytes itself, so it fills none."""
        out: dict[bytes, Raw] = {}

        def fetch(some: list[_Item]) -> None:
            fetched, entries = self._fetch(some, repo)
            out.update(fetched)
            self.cache.put_later(entries)
        self._serve(items, repo, out.update, fetch)
        return out

    def read_chunks_into(self, items: list[tuple[str, PackEntry]], places: Places, out: memoryview,
                         repo: str | None = None, *, stored: dict[bytes, bytes] | None = None,
                         keep: memoryview | None = None) -> None:
        """`read_chunks` written into `out` (see `RemoteStore.read_chunks_into`); `stored`, as in
        `read_chunks`: none filled."""
        def place(raws: Mapping[bytes, Raw]) -> None:
            for cid, raw in raws.items():
                for dest, lo, hi in places[cid]:
                    out[dest:dest + hi - lo] = raw[lo:hi]
        self._serve(items, repo, place, lambda some: self._fetch_into(some, places, out, repo, keep, place))

    def _serve(self, items: list[_Item], repo: str | None, take: Callable[[Mapping[bytes, Raw]], None],
               fetch: Callable[[list[_Item]], None]) -> None:
        """The read: `take(raws)` what the cache answers, then `fetch(items)` what this thread
        claimed, then take what other threads fetched meanwhile (`_claim`), fetching here what
        they could not."""
        cached = self._cached(items)
        take(cached)
        missing = self._relocate([(p, e) for p, e in items if e.chunk_id not in cached], repo)
        mine, theirs = self._claim(missing)
        try:
            if mine:
                fetch(mine)
        finally:
            self._land(mine)
        late, rest = self._await(theirs)
        take(late)
        if rest:
            fetch(rest)
        self._count(len(items) - len(mine) - len(rest), len(mine) + len(rest))

    def _fetch_into(self, items: list[_Item], places: Places, out: memoryview, repo: str | None,
                    keep: memoryview | None, place: Callable[[Mapping[bytes, Raw]], None]) -> None:
        if self.inner.capabilities.local_reads:  # a bucket read directly: decoded chunks, then placed
            fetched, entries = self._fetch(items, repo)
            place(fetched)
            self.cache.put_later(entries)
            return
        stored: dict[bytes, bytes] = {}
        self.inner.read_chunks_into(items, places, out, repo, stored=stored, keep=keep)
        self.cache.put_later([(e.chunk_id, e.codec, e.raw_len, stored[e.chunk_id]) for _, e in items])

    def _cached(self, items: list[_Item]) -> dict[bytes, Raw]:
        """The cache's answer for chunks located in it, and for those located in a pack that this
        process fetched since (a reader locates once, then reads a chunk again: a stream's footer
        check, its row group, read-ahead); a re-read of the reader's own fetch is not a second use."""
        out = self.cache.get([e.chunk_id for p, e in items if p is Held.CACHE])
        rest = [e.chunk_id for p, e in items if p is not Held.CACHE]
        if rest:
            out.update(self.cache.fetched_here(rest))
        return out

    def _relocate(self, missing: list[_Item], repo: str | None) -> list[_Item]:
        """Chunks located in the cache but gone since (evicted or corrupt) are located again."""
        if not any(p is Held.CACHE for p, _ in missing):
            return missing
        again = self.inner.locate([e.chunk_id for p, e in missing if p is Held.CACHE], repo)
        return [again[e.chunk_id] if p is Held.CACHE else (p, e) for p, e in missing]
    def _count(self, hits: int, misses: int) -> None:
        with self._count_lock:
            self._hits += hits
            self._misses += misses

    def _in_flight(self) -> dict[bytes, threading.Event]:
        """Chunk id -> Event of the fetches this process has in flight (new after a fork: the
        parent's fetching threads do not exist in the child)."""
        return self._flights.get(dict)

    def _claim(self, missing: list[_Item]) -> tuple[list[_Item], list[_Claimed]]:
        """Single flight: split `missing` into the chunks this thread fetches and the (item, event)
        of those another thread of this process is fetching now. Two reads in flight that share
        chunks (a stream's row groups read ahead, a footer check) then fetch each chunk once."""
        mine: list[_Item] = []
        theirs: list[_Claimed] = []
        seen: set[bytes] = set()
        claim = threading.Event()  # one for the whole claim: set when its fetch lands (`_land`)
        with self._count_lock:
            flights = self._in_flight()
            for p, e in missing:
                if e.chunk_id in seen:
                    continue
                seen.add(e.chunk_id)
                ev = flights.get(e.chunk_id)
                if ev is None:
                    flights[e.chunk_id] = claim
                    mine.append((p, e))
                else:
                    theirs.append(((p, e), ev))
        raced = self.cache.queued([e.chunk_id for _, e in mine]) if mine else set()
        if raced:  # another thread's fetch landed between this read's cache lookup and its claim
            with self._count_lock:
                flights = self._in_flight()
                for cid in raced:
                    if flights.get(cid) is claim:
                        del flights[cid]
            theirs += [((p, e), _LANDED) for p, e in mine if e.chunk_id in raced]
            mine = [(p, e) for p, e in mine if e.chunk_id not in raced]
            if not mine:  # nothing left to fetch under this claim: whoever waits on it looks again
                claim.set()
        return mine, theirs

    def _land(self, mine: list[_Item]) -> None:
        """End this thread's claims (after its fetch was queued for the cache, or failed)."""
        with self._count_lock:
            flights = self._in_flight()
            done = {id(ev): ev for ev in (flights.pop(e.chunk_id, None) for _, e in mine) if ev is not None}
        for ev in done.values():
            ev.set()

    def _await(self, theirs: list[_Claimed]) -> tuple[dict[bytes, Raw], list[_Item]]:
        """The raw bytes of chunks other threads fetched, from the cache, and the items to fetch
        here after all (their fetch failed, or the cache could not keep them)."""
        if not theirs:
            return {}, []
        for ev in {id(ev): ev for _, ev in theirs}.values():
            ev.wait(FLIGHT_WAIT)
        got = self.cache.get([e.chunk_id for (_, e), _ in theirs])
        return got, [(p, e) for (p, e), _ in theirs if e.chunk_id not in got]

    def _fetch(self, items: list[_Item], repo: str | None) -> tuple[Mapping[bytes, Raw], list[_Entry]]:
        """Fetch from the inner backend; keep each chunk's stored (compressed) form."""
        stored: dict[bytes, bytes] = {}
        raw = self.inner.read_chunks(items, repo, stored=stored)
        entries = [(e.chunk_id, e.codec, e.raw_len, stored[e.chunk_id]) if e.chunk_id in stored
                   else (e.chunk_id, CODEC_RAW, e.raw_len, raw[e.chunk_id]) for _, e in items]
        return raw, entries

    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> Raw:
        return self.read_chunks([(pack, entry)], repo)[entry.chunk_id]

    def _once(self, lookup: Callable[[], bytes | None], fetch: Callable[[], bytes]) -> bytes:
        """`lookup()` in the cache, else `fetch()` - by one process of the machine at a
        time (a file lock), so that workers starting together ask the server once and
        the others find the answer cached."""
        found = lookup()
        if found is not None:
            return found
        with runtime.file_lock(self.cache.path + ".lock"):
            found = lookup()
            return found if found is not None else fetch()

    def _object(self, kind: str, name: str) -> Callable[[], bytes | None]:
        """A lookup of the machine's table of immutable objects (counted in `meta` when it answers)."""
        def lookup() -> bytes | None:
            data = self.cache.get_object(kind, name)
            if data is not None:
                memo.count("objects_machine")
            return data
        return lookup

    # immutable objects: this process (`meta`), then the machine (the cache's table), then the store
    def get_manifest(self, name: str, repo: str | None = None) -> Manifest:
        def load() -> Manifest:
            def fetch() -> bytes:
                data = self.inner.get_manifest(name, repo).encode()
                self.cache.put_object("manifest", name, data)
                return data
            return Manifest.decode(self._once(self._object("manifest", name), fetch), f"manifest {name}")

        return memo.objects().remembered((self._scope, "manifest", repo, name), load)

    def get_manifest_located(self, name: str, repo: str | None = None) -> tuple[Manifest, Located]:
        """A manifest and where its chunks are, in one request when the manifest is not
        cached (chunks the cache holds are located in it); a cached manifest comes
        without locations (a reader locates as it reads, cache first). An inner backend that
        does not locate with its manifests answers `get_manifest` (no locations)."""
        kept: Manifest | None = memo.objects().get((self._scope, "manifest", repo, name))
        if kept is not None:
            return kept, {}
        if self.cache.get_object("manifest", name) is not None or not self.inner.capabilities.remote_admin:
            return self.get_manifest(name, repo), {}
        m, found = self.inner.get_manifest_located(name, repo)
        self.cache.put_object("manifest", name, m.encode())
        found.update({c: (Held.CACHE, e) for c, e in self.cache.has(list(found)).items()})
        return m, found

    def get_manifests_located(self, names: list[str], repo: str | None = None, tail: int = 0,
                              chunks: dict[bytes, Raw] | None = None) -> dict[str, tuple[Manifest, Located]]:
        """`get_manifest_located` of many: those neither this process nor the machine holds are asked
        of the inner store together, with the chunks of each file's last `tail` bytes, which the
        inner store verified: they go into the cache and are located there, so that reading a
        file's end (a Parquet footer) costs no request."""
        out: dict[str, tuple[Manifest, Located]] = {}
        ask = []
        for n in dict.fromkeys(names):
            if memo.objects().get((self._scope, "manifest", repo, n)) is not None \
                    or self.cache.get_object("manifest", n) is not None or not self.inner.capabilities.remote_admin:
                out[n] = self.get_manifest_located(n, repo)
            else:
                ask.append(n)
        if tail and out and self.inner.capabilities.remote_admin:  # a known manifest whose end is not all cached:
            # asked too (else reading its end would locate those chunks, a request per file)
            ends = {n: _end_ids(m, tail) for n, (m, _) in out.items()}
            held = self.cache.has([c for end in ends.values() for c in end])
            for n, end in ends.items():
                if any(c not in held for c in end):
                    ask.append(n)
                    del out[n]
        if not ask:
            return out
        got: dict[bytes, Raw] = {}
        answers = self.inner.get_manifests_located(ask, repo, tail, got)
        if got:
            self.cache.put_later([(c, CODEC_RAW, len(raw), raw) for c, raw in got.items()])
            if chunks is not None:
                chunks.update(got)
        for n, (fetched, found) in answers.items():
            self.cache.put_object("manifest", n, fetched.encode())
            m: Manifest = memo.objects().remembered((self._scope, "manifest", repo, n), lambda: fetched)  # noqa: B023
            found.update({c: (Held.CACHE, e) for c, e in self.cache.has(list(found)).items()})  # tails too
            out[n] = m, found
        return out

    def get_tree(self, name: str, repo: str | None = None) -> treeobj.Tree:
        """A tree, from this machine's cache when any process read it before (trees are
        immutable: named by their bytes); kept per token scope, as commits are."""
        kind = f"tree:{self._scope}"

        def load() -> treeobj.Tree:
            def fetch() -> bytes:
                data = self.inner.get_tree(name, repo).encode()
                self.cache.put_object(kind, name, data)
                return data
            return treeobj.Tree.decode(self._once(self._object(kind, name), fetch), f"tree {name}")

        return self._learn([memo.objects().remembered((self._scope, "tree", repo, name), load)])[0]

    def _learn(self, trees: list[treeobj.Tree]) -> list[treeobj.Tree]:
        """Hand the inner store the manifest bundles these trees' files name (`learn_bundles`:
        it may not have read them itself, when they came from this machine's cache)."""
        if self.inner.capabilities.bundles:
            cast("_LearnsBundles", self.inner).learn_bundles([p for t in trees for p in t.bundled()])
        return trees

    def get_trees(self, names: list[str], repo: str | None = None) -> list[treeobj.Tree]:
        """Trees from this process and this machine where kept; the rest from the store in one
        `inner.get_trees` (a server: one request), then kept as `get_tree` keeps them."""
        kind, kept = f"tree:{self._scope}", memo.objects()
        got: dict[str, treeobj.Tree] = {}
        want: list[str] = []
        for name in dict.fromkeys(names):
            tree: treeobj.Tree | None = kept.get((self._scope, "tree", repo, name))
            if tree is None:
                data = self._object(kind, name)()
                if data is not None:
                    tree = treeobj.Tree.decode(data, f"tree {name}")
            if tree is None:
                want.append(name)
            else:
                got[name] = tree
        for name, tree in zip(want, self.inner.get_trees(want, repo) if want else []):
            self.cache.put_object(kind, name, tree.encode())
            got[name] = tree
        for name, tree in got.items():
            kept.put((self._scope, "tree", repo, name), tree)
        return self._learn([got[n] for n in names])

    def put_trees(self, trees: dict[str, treeobj.Tree]) -> None:
        """Store trees, and keep them in this machine's cache as `get_tree` keeps the trees it reads:
        the writer's next push, in any process, walks the trees it made from disk (a cold push of a
        one-file edit read every tree of its folder from the store)."""
        self.inner.put_trees(trees)
        kind = f"tree:{self._scope}"
        for name, tree in trees.items():
            self.cache.put_object(kind, name, tree.encode())

    def get_commit(self, repo: str, commit_id: str) -> Commit:
        """A commit from the machine's table, else the store's (bound to this overlay's trees)."""
        kind = f"commit:{self._scope}:{repo}"

        def fetch() -> bytes:
            data = self.inner.get_commit(repo, commit_id).encode()
            self.cache.put_object(kind, commit_id, data)
            return data

        return self.bound(repo, Commit.decode(self._once(self._object(kind, commit_id), fetch),
                                              f"commit {commit_id}"))

    # heads: tags from the machine (the cache's table), branches from the store
    def _store_key(self) -> str:
        """The heads' identity of the inner store (storage/memo.py). A process that has not heard
        the store's id yet takes the one a process of this machine heard last, within `HEAD_TTL`
        (a request that hears another corrects it)."""
        loc = self.inner.identity
        if memo.store_id(loc) is None:
            sid = self.cache.get_head(STORE_ID_PREFIX + loc, "")
            if sid is not None:
                memo.saw_store(loc, sid)
        return memo.identity(loc)

    def _heads_key(self, repo: str) -> str:
        """The `heads` table's key of a repo: the store's identity and the token, hashed."""
        return f"{memo.scope(self._store_key(), self._token)}:{repo}"

    def _heard(self) -> None:
        """Tell the machine which store id the inner store's server named (see `_store_key`)."""
        loc = self.inner.identity
        sid = memo.store_id(loc)
        if sid is not None and ids.is_hex_id(sid):
            self.cache.put_head(STORE_ID_PREFIX + loc, "", sid)

    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        """A full commit id already seen, or a tag resolved once (tags never move), costs no
        request; a branch is asked of the store every time (one small request: a commit another
        process or machine landed is seen at once; a filesystem instance may keep what it asked
        for `head_ttl`, fs.py). A commit id or prefix never reads a cached head."""
        if is_commit_like(rev):
            if ids.is_hex_id(rev) and self.cache.get_object(f"commit:{self._scope}:{repo}", rev) is not None:
                return rev, "commit"
            return self.inner.resolve_ref(repo, rev)
        key = self._heads_key(repo)
        tag = self.cache.get_head(key, TAG_PREFIX + rev, ttl=float("inf"))
        if tag is not None:
            memo.count("heads_machine")
            return tag, "tag"
        cid, kind = self.inner.resolve_ref(repo, rev)
        self._heard()
        if kind == "tag":
            self.cache.put_head(self._heads_key(repo), TAG_PREFIX + rev, cid)
        return cid, kind

    # writes that move heads: the one invalidation rule (storage/memo.py), here and for the machine
    def _wrote(self, repo: str, rev: str) -> None:
        memo.wrote(self._store_key(), repo, rev)
        key = self._heads_key(repo)
        self.cache.forget_head(key, rev)
        self.cache.forget_head(key, TAG_PREFIX + rev)

    def create_tag(self, repo: str, name: str, commit_id: str) -> None:
        self.inner.create_tag(repo, name, commit_id)
        self._wrote(repo, name)

    def delete_tag(self, repo: str, name: str) -> str:
        cid = self.inner.delete_tag(repo, name)
        self._wrote(repo, name)
        return cid

    def create_branch(self, repo: str, name: str, commit_id: str) -> None:
        self.inner.create_branch(repo, name, commit_id)
        self._wrote(repo, name)

    def delete_branch(self, repo: str, name: str) -> str:
        cid = self.inner.delete_branch(repo, name)
        self._wrote(repo, name)
        return cid

    def commit(self, commit: Commit, branch: str, expected: str | None) -> str:
        """Commit, then forget the cached head: this machine sees its own push on the next
        resolve, and never an older head whose answer came back later than a newer one's."""
        cid = self.inner.commit(commit, branch, expected)
        self._wrote(commit.repo, branch)
        return cid

    def close(self) -> None:
        self.cache.wait()  # let queued cache writes land
        self.inner.close()
        if self.owns_cache:
            self.cache.close()

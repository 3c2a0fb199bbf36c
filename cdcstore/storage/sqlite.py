"""sqlite connections that are safe across threads, processes and forks.

One connection per thread and per process (a fork gets new ones; the inherited
ones are kept open and never used, as sqlite asks), WAL mode set once per file,
and a 60-second busy timeout so that concurrent writers wait instead of failing.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import AbstractContextManager
from typing import Any, Callable, Iterator, TypedDict, Unpack

from .. import runtime

_INHERITED: list[object] = []  # connections inherited across fork: kept, never used or closed


def ints(*values: object) -> bool:
    """Whether each value read from a row is an int (sqlite keeps whatever type was written)."""
    return all(type(v) is int for v in values)


def _holding(base: type, name: str,
             lock: Callable[[Any], AbstractContextManager[object]] = lambda obj: obj.connection.in_use
             ) -> Callable[..., Any]:
    """`base.name`, called while holding the connection's `in_use` lock."""
    method = getattr(base, name)

    def locked(self: Any, *args: Any) -> Any:
        with lock(self):
            return method(self, *args)
    locked.__name__ = name
    return locked


class _Cursor(sqlite3.Cursor):
    """A cursor whose every step holds its connection's lock (`_Connection`)."""

    execute, executemany, fetchone, fetchmany, fetchall, __next__ = (
        _holding(sqlite3.Cursor, n) for n in ("execute", "executemany", "fetchone", "fetchmany", "fetchall", "__next__"))

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # rows in batches, not the cursor
        """Rows a batch at a time: the lock is taken per ITER_ROWS rows, not per row (a file's
        chunk lookups paid ~50 us a row under threads), and memory stays bounded."""
        while rows := self.fetchmany(ITER_ROWS):
            yield from rows


ITER_ROWS = 1024


class _Connection(sqlite3.Connection):
    """A connection that another thread may close while its own thread uses it: each call and
    each step of a cursor holds `in_use`, and `close` waits for it. Python's sqlite3 crashed
    (a segmentation fault) when `Connections.close` closed a connection in the middle of
    another thread's query; now that thread's next step raises ProgrammingError ("closed
    database") instead, and its next `Connections.conn` is a new connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_use = threading.RLock()  # per connection; a forked child never uses an inherited one

    def cursor(self, factory: Callable[[sqlite3.Connection], sqlite3.Cursor] = _Cursor  # type: ignore[override]
               ) -> sqlite3.Cursor:  # (the base's factory=None overload fails at runtime anyway)
        return super().cursor(factory)

    def execute(self, *args: Any) -> sqlite3.Cursor:
        return self.cursor().execute(*args)

    def executemany(self, *args: Any) -> sqlite3.Cursor:
        return self.cursor().executemany(*args)

    commit, rollback, __exit__, close = (
        _holding(sqlite3.Connection, n, lambda c: c.in_use) for n in ("commit", "rollback", "__exit__", "close"))


def is_closed_error(e: BaseException) -> bool:
    """Whether `e` is a query's on a connection that `Connections.close` closed meanwhile."""
    return isinstance(e, sqlite3.ProgrammingError) and "closed" in str(e)


def connect(path: str, synchronous: str = "NORMAL", page_size: int | None = None) -> sqlite3.Connection:
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False, factory=_Connection)
    if new and page_size:
        conn.execute(f"PRAGMA page_size={int(page_size)}")  # only before the file has pages
    for attempt in range(200):  # switching to WAL can fail fast while another process holds a lock
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or attempt == 199:
                raise
            time.sleep(0.05)
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


class ConnectOptions(TypedDict, total=False):
    """`connect`'s options, as `Connections` keeps them."""

    synchronous: str
    page_size: int | None


class Connections:
    """`conn` is this thread's connection to `path`, opened on first use; `close` closes
    every connection this process opened through it (the next use opens new ones)."""

    def __init__(self, path: str, **options: Unpack[ConnectOptions]):
        self.path = path
        self.options = options  # for `connect`
        self._local = threading.local()
        self._lock = runtime.Lock()  # a fork while another thread holds it must not hang the child
        # this process's: thread -> its connection (runtime.Local is untyped)
        self._open = runtime.Local()  # type: ignore[no-untyped-call]
        self._generation = 0  # a connection of an earlier generation was closed by `close`

    @property
    def conn(self) -> sqlite3.Connection:
        local = self._local
        held = getattr(local, "held", None)
        if held is None or local.generation != self._generation:
            held = local.held = runtime.Local()  # type: ignore[no-untyped-call]  # runtime.Local is untyped
            local.generation = self._generation
        return held.get(self._connect, _INHERITED.append)

    def _connect(self) -> sqlite3.Connection:
        conn = connect(self.path, **self.options)
        with self._lock:
            mine: dict[threading.Thread, sqlite3.Connection] = self._open.get(dict)
            for t in [t for t in mine if not t.is_alive()]:  # a thread that ended: its connection too
                mine.pop(t).close()
            mine[threading.current_thread()] = conn
        return conn

    def close(self) -> None:
        """Close this process's connections (a forked child never closes the parent's)."""
        with self._lock:
            mine: dict[threading.Thread, sqlite3.Connection] = (
                self._open.here() or {})  # type: ignore[no-untyped-call]  # runtime.Local is untyped
            self._open.clear()
            self._generation += 1
        for conn in mine.values():
            conn.close()

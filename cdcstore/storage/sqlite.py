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

from .. import runtime

_INHERITED: list = []  # connections inherited across fork: kept, never used or closed


def connect(path: str, synchronous: str = "NORMAL", page_size: int | None = None) -> sqlite3.Connection:
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
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


class Connections:
    """`conn` is this thread's connection to `path`, opened on first use."""

    def __init__(self, path: str, **options):
        self.path = path
        self.options = options  # for `connect`
        self._local = threading.local()

    @property
    def conn(self) -> sqlite3.Connection:
        local = self._local
        held = getattr(local, "held", None)
        if held is None:
            held = local.held = runtime.Local()
        return held.get(lambda: connect(self.path, **self.options), _INHERITED.append)

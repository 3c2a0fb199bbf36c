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

_INHERITED: list = []  # connections inherited across fork: kept, never used or closed


def connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
    for attempt in range(200):  # switching to WAL can fail fast while another process holds a lock
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or attempt == 199:
                raise
            time.sleep(0.05)
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


class Connections:
    """`conn` is this thread's connection to `path`, opened on first use."""

    def __init__(self, path: str):
        self.path = path
        self._local = threading.local()

    @property
    def conn(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            if getattr(local, "conn", None) is not None:
                _INHERITED.append(local.conn)
            local.conn, local.pid = connect(self.path), os.getpid()
        return local.conn

"""The push stat cache (as git's index): a file whose stat matches the last push of that path
from this machine to the same store is not read again.

A small sqlite file under the user cache dir ($XDG_CACHE_HOME/cdcstore/statcache.sqlite) maps
(store identity, absolute local path) to the stat seen when the file was last read for a push
(size, mtime_ns, inode, ctime_ns), the manifest it made, and `seen_ns`: the clock just before
that stat. It is a cache, never the truth: `Store.push` reuses an entry only when the store
still holds its manifest (named by the commit being built on, or answered present in one batch),
and reads the file otherwise.

Racy files (git's rule): an entry whose mtime falls in the same second as (or after) its
`seen_ns` is never trusted: the file may have changed again within the clock's granularity
after it was read, leaving size and mtime as they were. ctime is part of the key, so an edit
whose size and mtime were forced back (`touch -d`, `os.utime`) still changes the ctime and is
read again. A cache that cannot be opened or written is skipped silently: pushes read files.

Lost chunks: an unchanged file says nothing of the store's copy of it. When `check` (or
`rebuild-index`) here finds chunks that commits use gone from the store (damaged, or in a lost
pack), it records their ids for the store (table `lost`); while any of them is still absent,
a push trusts no skip that would keep it from storing them again: neither this cache's entry
nor the base's equal content ids of a file that names one (engine/commits.py: `doubted`).
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass

import platformdirs

from .. import settings
from ..core.commit import FileEntry

ENV_PATH = settings.STAT_CACHE.name
SCHEMA = 1
_BATCH = 500


def default_path() -> str:
    return settings.STAT_CACHE.get() or os.path.join(platformdirs.user_cache_dir("cdcstore"), "statcache.sqlite")


@dataclass(frozen=True)
class Seen:
    """What a push saw of a local file before reading it."""

    size: int
    mtime_ns: int
    ino: int
    ctime_ns: int
    seen_ns: int

    @classmethod
    def of(cls, path: str, seen_ns: int) -> "Seen | None":
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, seen_ns)

    def key(self) -> tuple[int, int, int, int]:
        return self.size, self.mtime_ns, self.ino, self.ctime_ns

    def racy(self) -> bool:
        """Modified in the second it was seen in (or later): its stat cannot vouch for its bytes."""
        second = self.seen_ns // 1_000_000_000 * 1_000_000_000
        return self.mtime_ns >= second or self.ctime_ns >= second


def store_identity(kind: str, location: str, identity: str) -> str:
    """A store's key in this cache: its backend's class name and its location (a real path
    for a directory) or, for a bucket, its objects' identity (two services may share a name)."""
    return f"{kind}:{os.path.realpath(location) if os.path.isdir(location) else identity}"


class StatCache:
    def __init__(self, path: str | None = None, create: bool = True):
        """`create=False`: no file is made where none is (then nothing is remembered)."""
        self.path = path or default_path()
        self.db: sqlite3.Connection | None = None
        if not create and not os.path.exists(self.path):
            return
        with contextlib.suppress(sqlite3.Error, OSError):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            db = sqlite3.connect(self.path, timeout=5, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS files (store TEXT, path TEXT, size INT, mtime_ns INT, ino INT, "
                       "ctime_ns INT, seen_ns INT, manifest TEXT, PRIMARY KEY (store, path)) WITHOUT ROWID")
            db.execute("CREATE TABLE IF NOT EXISTS lost (store TEXT, id BLOB, PRIMARY KEY (store, id)) WITHOUT ROWID")
            db.execute(f"PRAGMA user_version={SCHEMA}")
            self.db = db

    def lookup(self, store: str, seen: dict[str, Seen]) -> dict[str, FileEntry]:
        """Entries whose recorded stat equals what is seen now and is not racy."""
        if self.db is None or not seen:
            return {}
        out: dict[str, FileEntry] = {}
        paths = list(seen)
        try:
            for i in range(0, len(paths), _BATCH):
                part = paths[i:i + _BATCH]
                rows = self.db.execute(
                    f"SELECT path, size, mtime_ns, ino, ctime_ns, seen_ns, manifest FROM files "
                    f"WHERE store=? AND path IN ({','.join('?' * len(part))})", [store, *part]).fetchall()
                for path, size, mtime_ns, ino, ctime_ns, seen_ns, manifest in rows:
                    old = Seen(size, mtime_ns, ino, ctime_ns, seen_ns)
                    if old.key() == seen[path].key() and not old.racy():
                        out[path] = FileEntry(manifest, size)
        except sqlite3.Error:
            return {}
        return out

    def record(self, store: str, rows: list[tuple[str, Seen, FileEntry]]) -> None:
        """Remember what was read (only files whose manifest size matches what was seen)."""
        if self.db is None or not rows:
            return
        with contextlib.suppress(sqlite3.Error):
            self.db.execute("BEGIN")
            self.db.executemany(
                "INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?,?,?)",
                [(store, p, s.size, s.mtime_ns, s.ino, s.ctime_ns, s.seen_ns, e.manifest)
                 for p, s, e in rows if e.size == s.size])
            self.db.execute("COMMIT")

    def forget(self, store: str, paths: list[str]) -> None:
        if self.db is None or not paths:
            return
        with contextlib.suppress(sqlite3.Error):
            self.db.executemany("DELETE FROM files WHERE store=? AND path=?", [(store, p) for p in paths])

    def lost(self, store: str) -> set[bytes]:
        """The chunk ids a check here found gone from `store` (not yet seen stored again)."""
        if self.db is None:
            return set()
        try:
            return {r[0] for r in self.db.execute("SELECT id FROM lost WHERE store=?", (store,))}
        except sqlite3.Error:
            return set()

    def set_lost(self, store: str, chunk_ids: set[bytes]) -> None:
        """Record the chunks now found gone from `store` (the record of it replaced)."""
        if self.db is None:
            return
        with contextlib.suppress(sqlite3.Error):
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute("DELETE FROM lost WHERE store=?", (store,))
                self.db.executemany("INSERT OR IGNORE INTO lost (store, id) VALUES (?, ?)",
                                    [(store, c) for c in chunk_ids])
                self.db.execute("COMMIT")
            except sqlite3.Error:
                self.db.execute("ROLLBACK")
                raise

    def stored_again(self, store: str, chunk_ids: set[bytes]) -> None:
        """These lost chunks are in `store` again: no longer doubted."""
        if self.db is None or not chunk_ids:
            return
        with contextlib.suppress(sqlite3.Error):
            self.db.executemany("DELETE FROM lost WHERE store=? AND id=?", [(store, c) for c in chunk_ids])

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None


def now_ns() -> int:
    return time.time_ns()

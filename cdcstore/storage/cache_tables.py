"""The chunk cache's sqlite tables: made for a new cache, and brought up from older versions.

    chunks    id, codec, raw_len, size, used, data; hot (0 probation, 1 hot); seg, off (its bytes)
    segments  seg, size, live, sealed, owner, at (the segment files: segments.py)
    objects   kind, name, data (immutable manifests and commits)
    heads     repo, rev, revcommit, at (branch heads, briefly)
    meta      key, value ('bytes': the stored bytes of every chunk, kept by triggers and puts)

Each step is idempotent and safe against another process doing it at the same moment.
"""
from __future__ import annotations

import sqlite3


def create(conn: sqlite3.Connection) -> None:
    """The tables of a new cache (kept as they are in an existing one)."""
    with conn:
        conn.executescript("""
            CREATE TABLE IF NOT EXISTS chunks (id BLOB PRIMARY KEY, codec INTEGER NOT NULL,
                raw_len INTEGER NOT NULL, size INTEGER NOT NULL, used REAL NOT NULL, data BLOB NOT NULL);
            CREATE INDEX IF NOT EXISTS chunks_used ON chunks(used);
            CREATE TABLE IF NOT EXISTS objects (kind TEXT NOT NULL, name TEXT NOT NULL, data BLOB NOT NULL,
                PRIMARY KEY (kind, name));
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS heads (repo TEXT NOT NULL, rev TEXT NOT NULL, revcommit TEXT NOT NULL,
                at REAL NOT NULL, PRIMARY KEY (repo, rev));
            INSERT OR IGNORE INTO meta VALUES ('bytes', 0);
            DROP TRIGGER IF EXISTS chunks_add;
            CREATE TRIGGER IF NOT EXISTS chunks_del AFTER DELETE ON chunks
                BEGIN UPDATE meta SET value = value - OLD.size WHERE key = 'bytes'; END;
        """)


def add_hot(conn: sqlite3.Connection) -> None:
    """The `hot` column (0 probation, 1 hot) and its eviction index; a cache made by an
    older version gets them here, its entries on probation."""
    if "hot" in [r[1] for r in conn.execute("PRAGMA table_info(chunks)")]:
        return
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            if "hot" not in [r[1] for r in conn.execute("PRAGMA table_info(chunks)")]:
                conn.execute("ALTER TABLE chunks ADD COLUMN hot INTEGER NOT NULL DEFAULT 0")
    except sqlite3.OperationalError as e:  # another process added it first
        if "duplicate column" not in str(e):
            raise
    with conn:
        conn.execute("CREATE INDEX IF NOT EXISTS chunks_evict ON chunks(hot, used)")


def add_segments(conn: sqlite3.Connection) -> None:
    """Where each chunk's bytes are (`seg`, `off`: NULL for an entry of an older version, whose
    bytes are in its `data` column) and the segments table, whose `live` bytes `ChunkCache._put_part` and
    triggers (deletes, moves) keep."""
    cols = [r[1] for r in conn.execute("PRAGMA table_info(chunks)")]
    if "seg" not in cols:
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                if "seg" not in [r[1] for r in conn.execute("PRAGMA table_info(chunks)")]:
                    conn.execute("ALTER TABLE chunks ADD COLUMN seg INTEGER")
                    conn.execute("ALTER TABLE chunks ADD COLUMN off INTEGER")
        except sqlite3.OperationalError as e:  # another process added them first
            if "duplicate column" not in str(e):
                raise
    with conn:
        conn.executescript("""
            CREATE TABLE IF NOT EXISTS segments (seg INTEGER PRIMARY KEY AUTOINCREMENT,
                size INTEGER NOT NULL DEFAULT 0, live INTEGER NOT NULL DEFAULT 0,
                sealed INTEGER NOT NULL DEFAULT 0, owner INTEGER NOT NULL DEFAULT 0, at REAL NOT NULL DEFAULT 0);
            CREATE INDEX IF NOT EXISTS chunks_seg ON chunks(seg);
            DROP TRIGGER IF EXISTS seg_add;
            CREATE TRIGGER IF NOT EXISTS seg_del AFTER DELETE ON chunks WHEN OLD.seg IS NOT NULL
                BEGIN UPDATE segments SET live = live - OLD.size WHERE seg = OLD.seg; END;
            CREATE TRIGGER IF NOT EXISTS seg_move AFTER UPDATE OF seg ON chunks
                BEGIN UPDATE segments SET live = live - OLD.size WHERE seg = OLD.seg;
                      UPDATE segments SET live = live + NEW.size WHERE seg = NEW.seg; END;
        """)

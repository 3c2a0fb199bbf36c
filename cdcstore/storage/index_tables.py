"""The chunk index's sqlite tables: made for a new index, and brought up from older schemas.

Each step is idempotent, and safe against another process doing it at the same moment (a
write transaction, the table looked for again inside it); each records the schema version.
"""
from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 6  # 2: repo_chunks, token_chunks, chunks_by_pack (and chunks.xsum, added in place); 3: dup_chunks, store_id; 4: damaged_chunks; 5: own_packs; 6: evicted, pack_use

# The tables a new index starts with (schema 1; later versions add theirs in `ensure`).
_SCHEMA = (
    "CREATE TABLE packs (name TEXT PRIMARY KEY, size INTEGER, chunks INTEGER)",
    "CREATE TABLE chunks (id BLOB PRIMARY KEY, pack TEXT NOT NULL, offset INTEGER NOT NULL,"
    " stored_len INTEGER NOT NULL, raw_len INTEGER NOT NULL, codec INTEGER NOT NULL, xsum INTEGER) WITHOUT ROWID",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
    # what each repo's commits reach (the server's access checks; rebuildable from commits)
    "CREATE TABLE repo_objects (repo TEXT, kind TEXT, name TEXT, PRIMARY KEY (repo, kind, name))",
)


def ensure(conn: sqlite3.Connection) -> None:
    """Make the tables, or add those an older version of cdcstore did not make."""
    if not _has_chunks(conn):
        _create(conn)
    _add_reach_tables(conn)
    _add_checksums(conn)
    _add_dup_table(conn)
    _add_damage_table(conn)
    _add_own_table(conn)
    _add_eviction_tables(conn)


def _has_chunks(conn: sqlite3.Connection) -> bool:
    return conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='chunks'").fetchone() is not None


def _create(conn: sqlite3.Connection) -> None:
    # plain DDL: sqlite-utils imported pandas and numpy to do this (0.8 s of every new index)
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        if not _has_chunks(conn):
            for ddl in _SCHEMA:
                conn.execute(ddl)
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))


def _add_table(conn: sqlite3.Connection, name: str, *ddl: str) -> None:
    """Run `ddl` once, when table `name` is missing, and record the schema version."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone():
        return
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        for statement in ddl:
            conn.execute(statement)
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))


def _add_reach_tables(conn: sqlite3.Connection) -> None:
    """Chunk-level reach (schema 2): which chunks each repo's landed commits name, and
    which chunks each token uploaded. A store indexed before schema 2 is marked
    `reach_stale` until its grants are rebuilt from the commits (the server does so at start)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='repo_chunks'").fetchone():
        return
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='repo_chunks'").fetchone():
            return
        conn.execute("CREATE TABLE repo_chunks (repo TEXT NOT NULL, id BLOB NOT NULL, PRIMARY KEY (repo, id))"
                     " WITHOUT ROWID")
        conn.execute("CREATE TABLE token_chunks (owner TEXT NOT NULL, id BLOB NOT NULL, PRIMARY KEY (owner, id))"
                     " WITHOUT ROWID")
        conn.execute("CREATE INDEX IF NOT EXISTS chunks_by_pack ON chunks (pack, offset)")
        if conn.execute("SELECT 1 FROM repo_objects LIMIT 1").fetchone():
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('reach_stale', '1')")


def _add_checksums(conn: sqlite3.Connection) -> None:
    """`chunks.xsum`: a v2 pack entry's xxh3-64 checksum (NULL for v1 chunks, and for rows
    indexed before the column existed), so a local read checks damage without BLAKE3."""
    if any(r[1] == "xsum" for r in conn.execute("PRAGMA table_info(chunks)")):
        return
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        if not any(r[1] == "xsum" for r in conn.execute("PRAGMA table_info(chunks)")):
            conn.execute("ALTER TABLE chunks ADD COLUMN xsum INTEGER")


def _add_dup_table(conn: sqlite3.Connection) -> None:
    """Schema 3: the other copies of chunks that more than one pack holds (two writers
    raced, a repack in flight). `chunks` keeps one row a chunk (where reads go);
    `dup_chunks` keeps the rest, so that when a pack is gone a chunk's other copy takes
    its place and gc sees every pack that holds a live chunk. An index made before
    schema 3 lacks the duplicates it ignored until `rebuild-index` (a dedup miss at worst:
    gc counts the duplicate's pack as dead only if it marks from this index alone)."""
    _add_table(conn, "dup_chunks",
               "CREATE TABLE IF NOT EXISTS dup_chunks (id BLOB NOT NULL, pack TEXT NOT NULL,"
               " offset INTEGER NOT NULL, stored_len INTEGER NOT NULL, raw_len INTEGER NOT NULL,"
               " codec INTEGER NOT NULL, xsum INTEGER, PRIMARY KEY (id, pack)) WITHOUT ROWID",
               "CREATE INDEX IF NOT EXISTS dup_chunks_by_pack ON dup_chunks (pack)")


def _add_damage_table(conn: sqlite3.Connection) -> None:
    """Schema 4: the stored copies known damaged (a read or `check` found them failing
    verification), so that `rebuild-index`, which reads only footers, does not make them
    readable again. A copy stays recorded until its pack is gone (gc) or it verifies again."""
    _add_table(conn, "damaged_chunks", "CREATE TABLE IF NOT EXISTS damaged_chunks (id BLOB NOT NULL,"
               " pack TEXT NOT NULL, PRIMARY KEY (id, pack)) WITHOUT ROWID")


def _add_own_table(conn: sqlite3.Connection) -> None:
    """Schema 5: the packs this machine wrote, or read and verified in full (name and every
    chunk). In a bucket a push deduplicates against another pack's chunk only after reading
    it and checking it against its id (trust by origin, docs/protocol.md)."""
    _add_table(conn, "own_packs", "CREATE TABLE IF NOT EXISTS own_packs (name TEXT PRIMARY KEY) WITHOUT ROWID")


def _add_eviction_tables(conn: sqlite3.Connection) -> None:
    """Schema 6: a bucket store's index on a machine is bounded (`ChunkIndex.evict`): the packs
    whose rows it dropped (`evicted`: indexed again when needed, never counted as absent) and
    when each pack was last used (`pack_use`, least recently used out first)."""
    _add_table(conn, "evicted", "CREATE TABLE IF NOT EXISTS evicted (name TEXT PRIMARY KEY, size INTEGER) WITHOUT ROWID",
               "CREATE TABLE IF NOT EXISTS pack_use (name TEXT PRIMARY KEY, used REAL NOT NULL) WITHOUT ROWID")

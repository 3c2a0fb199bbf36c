"""The chunk index: chunk id -> (pack, offset, lengths, codec), in sqlite.

A cache of what the packs say (invariant 4): `LocalStore.rebuild_index` recreates
it from the packs alone. WAL mode and a busy timeout let several processes use
it at once; connections are per thread and per process (rebuilt after a fork).
"""
from __future__ import annotations

import os
import sqlite3
from typing import AbstractSet, Iterable

from ..core.errors import CdcError, CorruptionError, damaged_message
from ..core.pack import PackEntry
from . import index_tables
from .sqlite import Connections

_ROW = "id, pack, offset, stored_len, raw_len, codec, xsum"
_BATCH = 500  # ids per IN (...) query, below sqlite's variable limit
_PRESENT_BATCH = 8192  # ids per presence query where sqlite allows that many variables (3.32+)


def _present_batch(conn: sqlite3.Connection) -> int:
    try:
        return max(_BATCH, min(_PRESENT_BATCH, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)))
    except AttributeError:  # Python < 3.11: no getlimit
        return _BATCH


def _xsum(check: int | None) -> int | None:
    """A u64 checksum as sqlite's signed 64-bit INTEGER."""
    return None if check is None else check - (1 << 64) if check >= 1 << 63 else check


def _check(xsum: int | None) -> int | None:
    return None if xsum is None else xsum & ((1 << 64) - 1)


def _entry(cid: bytes, off: int, slen: int, rlen: int, codec: int, xsum: int | None) -> PackEntry:
    return PackEntry(cid, off, slen, rlen, codec, _check(xsum))


class ChunkIndex:
    def __init__(self, path: str):
        self.path = path
        if os.path.lexists(path) and not os.path.isfile(path):
            raise CorruptionError(f"the chunk index {path} is not a file (a folder or another kind of file is in "
                                  f"its place): run `cdcstore rebuild-index` (it moves it aside to "
                                  f"{os.path.basename(path)}.damaged and builds the index again)")
        self._conns = Connections(path)
        try:
            index_tables.ensure(self.conn)
        except sqlite3.OperationalError as e:  # cannot open or write: not damage
            raise CdcError(f"cannot use the chunk index {path} ({e}): the store directory must be "
                           f"writable, for reads too (sqlite WAL mode); check its permissions and disk") from None
        except sqlite3.DatabaseError as e:
            raise CorruptionError(damaged_message(e)) from None

    def close(self) -> None:
        """Close this process's connections (the next use opens new ones)."""
        self._conns.close()

    @property
    def conn(self) -> sqlite3.Connection:
        """This thread's connection (a new one after a fork)."""
        return self._conns.conn

    def own_packs(self, names: Iterable[str]) -> set[str]:
        """Which of these packs this machine wrote or verified in full."""
        names = list(set(names))
        out: set[str] = set()
        for i in range(0, len(names), _BATCH):
            batch = names[i:i + _BATCH]
            out.update(r[0] for r in self.conn.execute(
                f"SELECT name FROM own_packs WHERE name IN ({','.join('?' * len(batch))})", batch))
        return out

    def damaged(self) -> set[tuple[str, bytes]]:
        """(pack, chunk id) of every stored copy known damaged."""
        return {(p, c) for c, p in self.conn.execute("SELECT id, pack FROM damaged_chunks")}

    # -- whose index this is ------------------------------------------------------------------
    def store_id(self) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key='store_id'").fetchone()
        return row[0] if row else None

    def adopt_store(self, store_id: str) -> bool:
        """Make this index the cache of the store whose `store-id` is `store_id`: an index
        of another store (a bucket made again under the same name, another service's bucket
        of that name) is emptied first. Returns whether it was emptied."""
        if self.store_id() == store_id:
            return False
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT value FROM meta WHERE key='store_id'").fetchone()
            if row and row[0] == store_id:  # another process adopted it meanwhile
                return False
            self._clear(conn, tokens=True)
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('store_id', ?)", (store_id,))
        return True

    def reach_stale(self) -> bool:
        return self.conn.execute("SELECT 1 FROM meta WHERE key='reach_stale'").fetchone() is not None

    def present(self, chunk_ids: Iterable[bytes]) -> set[bytes]:
        """The subset of `chunk_ids` that the index knows: one query per `_PRESENT_BATCH`
        ids (a push asks about ~4,096 at a time), sorted so the b-tree is walked in order."""
        ids = sorted(set(chunk_ids))
        found: set[bytes] = set()
        conn = self.conn
        step = _present_batch(conn)
        for i in range(0, len(ids), step):
            batch = ids[i:i + step]
            q = f"SELECT id FROM chunks WHERE id IN ({','.join('?' * len(batch))})"
            found.update(row[0] for row in conn.execute(q, batch))
        return found

    def locate(self, chunk_ids: Iterable[bytes]) -> dict[bytes, tuple[str, PackEntry]]:
        """Where each known chunk lives; unknown ids are left out."""
        ids = list(dict.fromkeys(chunk_ids))
        out: dict[bytes, tuple[str, PackEntry]] = {}
        conn = self.conn
        for i in range(0, len(ids), _BATCH):
            batch = ids[i:i + _BATCH]
            q = f"SELECT {_ROW} FROM chunks WHERE id IN ({','.join('?' * len(batch))})"
            for cid, pack, off, slen, rlen, codec, xsum in conn.execute(q, batch):
                out[cid] = (pack, _entry(cid, off, slen, rlen, codec, xsum))
        return out

    def add_pack(self, name: str, size: int, entries: list[PackEntry], own: bool = False) -> None:
        """Record a durable pack and its chunks in one transaction (the first pack indexed
        is where a chunk is read from; other copies are kept in `dup_chunks`). `own`: this
        machine wrote it, or verified it in full (`own_packs`)."""
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            self._add(conn, name, size, entries)
            if own:
                conn.execute("INSERT OR IGNORE INTO own_packs (name) VALUES (?)", (name,))

    @staticmethod
    def _add(conn: sqlite3.Connection, name: str, size: int, entries: list[PackEntry]) -> None:
        if conn.execute("SELECT 1 FROM packs WHERE name=?", (name,)).fetchone():
            return
        conn.execute("DELETE FROM evicted WHERE name=?", (name,))
        conn.execute("INSERT INTO packs (name, size, chunks) VALUES (?, ?, ?)", (name, size, len(entries)))
        rows = [(e.chunk_id, name, e.offset, e.stored_len, e.raw_len, e.codec, _xsum(e.check)) for e in entries]
        before = conn.total_changes
        conn.executemany(f"INSERT OR IGNORE INTO chunks ({_ROW}) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        if conn.total_changes - before < len(rows):  # some chunks are in another pack too
            conn.executemany(f"INSERT OR IGNORE INTO dup_chunks ({_ROW}) SELECT ?, ?, ?, ?, ?, ?, ?"
                             " WHERE EXISTS (SELECT 1 FROM chunks WHERE id = ? AND pack != ?)",
                             [(*r, r[0], name) for r in rows])

    def rows(self) -> dict[bytes, tuple[str, PackEntry]]:
        """Every chunk's read location: id -> (pack, entry)."""
        return {cid: (pack, _entry(cid, off, slen, rlen, codec, xsum)) for cid, pack, off, slen, rlen, codec, xsum
                in self.conn.execute(f"SELECT {_ROW} FROM chunks")}

    def all_rows(self) -> Iterable[tuple[str, PackEntry]]:
        """Every copy of every chunk: (pack, entry), duplicates included (gc's view)."""
        for table in ("chunks", "dup_chunks"):
            for cid, pack, off, slen, rlen, codec, xsum in self.conn.execute(f"SELECT {_ROW} FROM {table}"):
                yield pack, _entry(cid, off, slen, rlen, codec, xsum)

    def drop_chunks(self, pack: str, chunk_ids: Iterable[bytes], damaged: bool = False) -> None:
        """Forget these chunks' rows in `pack` (a stored copy that failed verification
        counts as absent, so the next push stores the chunk again; another pack's copy, if
        the index knows one, takes its place). `damaged`: the copies failed verification;
        they are recorded so that `rebuild-index` leaves them out."""
        conn = self.conn
        chunk_ids = list(chunk_ids)
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            if damaged:
                conn.executemany("INSERT OR IGNORE INTO damaged_chunks (id, pack) VALUES (?, ?)",
                                 [(c, pack) for c in chunk_ids])
            conn.executemany("DELETE FROM dup_chunks WHERE id=? AND pack=?", [(c, pack) for c in chunk_ids])
            gone = [c for c in chunk_ids
                    if conn.execute("DELETE FROM chunks WHERE id=? AND pack=?", (c, pack)).rowcount]
            self._promote(conn, gone)

    @staticmethod
    def _promote(conn: sqlite3.Connection, chunk_ids: list[bytes]) -> None:
        """Make another known copy the read location of chunks that lost theirs."""
        for i in range(0, len(chunk_ids), _BATCH):
            batch = chunk_ids[i:i + _BATCH]
            marks = ",".join("?" * len(batch))
            conn.execute(f"INSERT OR IGNORE INTO chunks ({_ROW}) SELECT {_ROW} FROM dup_chunks"
                         f" WHERE id IN ({marks})", batch)
            conn.execute(f"DELETE FROM dup_chunks WHERE id IN ({marks}) AND EXISTS"
                         " (SELECT 1 FROM chunks c WHERE c.id = dup_chunks.id AND c.pack = dup_chunks.pack)", batch)

    @classmethod
    def _drop(cls, conn: sqlite3.Connection, pack: str) -> None:
        gone = [r[0] for r in conn.execute("SELECT id FROM chunks WHERE pack=?", (pack,))]
        conn.execute("DELETE FROM chunks WHERE pack=?", (pack,))
        conn.execute("DELETE FROM dup_chunks WHERE pack=?", (pack,))
        conn.execute("DELETE FROM damaged_chunks WHERE pack=?", (pack,))
        conn.execute("DELETE FROM own_packs WHERE name=?", (pack,))
        conn.execute("DELETE FROM packs WHERE name=?", (pack,))
        conn.execute("DELETE FROM evicted WHERE name=?", (pack,))
        conn.execute("DELETE FROM pack_use WHERE name=?", (pack,))
        cls._promote(conn, gone)

    # -- bounded (a bucket store's index on a machine: a cache of the pack footers) -------------
    def chunk_count(self) -> int:
        """Chunk rows, as the packs count them (one query over the packs, not the chunks)."""
        count: int = self.conn.execute("SELECT coalesce(sum(chunks), 0) FROM packs").fetchone()[0]
        return count

    def evicted(self) -> dict[str, int]:
        """The packs whose rows `evict` dropped: name -> size."""
        return dict(self.conn.execute("SELECT name, size FROM evicted"))

    def forget_evicted(self, names: Iterable[str]) -> None:
        """No longer remember these evicted packs (gone from the store)."""
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("DELETE FROM evicted WHERE name=?", [(n,) for n in names])

    def evict(self, max_chunks: int, used: dict[str, float], keep: AbstractSet[str] = frozenset()) -> list[str]:
        """Record when packs were last used (`used`: name -> time), then, when the index holds
        more than `max_chunks` chunk rows, drop the rows of the least recently used packs
        (never those in `keep`, nor a pack with a copy recorded damaged) until it holds 3/4
        of that, and remember them in `evicted`. Their chunks count as unknown: a push stores
        them again or finds them by their anchors, a read indexes the pack again, gc keeps
        the pack. Returns the packs evicted."""
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            known = {r[0] for r in conn.execute("SELECT name FROM packs")} if used else set()
            conn.executemany("INSERT OR REPLACE INTO pack_use (name, used) VALUES (?, ?)",
                             [(p, t) for p, t in used.items() if p in known])
            total = conn.execute("SELECT coalesce(sum(chunks), 0) FROM packs").fetchone()[0]
            if total <= max_chunks:
                return []
            target, out = max_chunks * 3 // 4, []
            rows = conn.execute("SELECT p.name, p.size, p.chunks FROM packs p LEFT JOIN pack_use u ON u.name = p.name"
                                " WHERE NOT EXISTS (SELECT 1 FROM damaged_chunks d WHERE d.pack = p.name)"
                                " ORDER BY coalesce(u.used, 0), p.name").fetchall()
            for name, size, n in rows:
                if total <= target:
                    break
                if name in keep:
                    continue
                gone = [r[0] for r in conn.execute("SELECT id FROM chunks WHERE pack=?", (name,))]
                conn.execute("DELETE FROM chunks WHERE pack=?", (name,))
                conn.execute("DELETE FROM dup_chunks WHERE pack=?", (name,))
                conn.execute("DELETE FROM packs WHERE name=?", (name,))
                conn.execute("DELETE FROM pack_use WHERE name=?", (name,))
                conn.execute("INSERT OR REPLACE INTO evicted (name, size) VALUES (?, ?)", (name, size))
                self._promote(conn, gone)
                total -= n or 0
                out.append(name)
            return out

    def replace_pack(self, old: str, new: str, size: int, entries: list[PackEntry]) -> None:
        """Move chunks from pack `old` to its repacked copy `new`, in one transaction (a reader
        finds every chunk in one of the two at any moment)."""
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            self._drop(conn, old)
            self._add(conn, new, size, entries)
            conn.execute("INSERT OR IGNORE INTO own_packs (name) VALUES (?)", (new,))  # this machine wrote it

    def drop_pack(self, pack: str) -> None:
        """Forget a pack and every chunk row in it (gc before it deletes the pack; a reader or
        a sync that found it gone). A chunk another known pack holds is read from there."""
        self.drop_packs([pack])

    def drop_packs(self, packs: Iterable[str]) -> None:
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            for pack in packs:
                self._drop(conn, pack)

    def grant(self, repo: str, kind: str, names: Iterable[str]) -> None:
        """Record that `repo` reaches these objects ("pack" or "manifest")."""
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT OR IGNORE INTO repo_objects (repo, kind, name) VALUES (?, ?, ?)",
                             [(repo, kind, n) for n in names])

    def drop_repo(self, repo: str) -> None:
        """Forget what `repo` reaches (a deleted repo: a new repo of that name starts with nothing)."""
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM repo_objects WHERE repo = ?", (repo,))
            conn.execute("DELETE FROM repo_chunks WHERE repo = ?", (repo,))

    def bad_packs(self) -> dict[str, int]:
        """Packs found unreadable (name -> the size they had then): skipped until they change."""
        return {row[0][len("badpack:"):]: int(row[1]) for row in self.conn.execute(
            "SELECT key, value FROM meta WHERE key >= 'badpack:' AND key < 'badpack;'")}

    def mark_bad_pack(self, name: str, size: int) -> None:
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", ("badpack:" + name, str(size)))

    def tombstones(self) -> set[str]:
        """The delete-repo tombstones whose repos' records this index has dropped."""
        return {row[0][len("deleted:"):] for row in self.conn.execute(
            "SELECT key FROM meta WHERE key >= 'deleted:' AND key < 'deleted;'")}

    def add_tombstones(self, names: Iterable[str]) -> None:
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, '')",
                             [("deleted:" + n,) for n in names])

    def granted_repos(self) -> set[str]:
        """The repos that this index records any reach for."""
        return {row[0] for row in self.conn.execute(
            "SELECT DISTINCT repo FROM repo_objects UNION SELECT DISTINCT repo FROM repo_chunks")}

    def grant_chunks(self, table: str, who: str, chunk_ids: Iterable[bytes]) -> None:
        """Record that repo `who` reaches (table "repo_chunks") or token owner `who`
        uploaded (table "token_chunks") these chunks."""
        assert table in ("repo_chunks", "token_chunks")
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(f"INSERT OR IGNORE INTO {table} VALUES (?, ?)", [(who, c) for c in chunk_ids])

    def visible(self, chunk_ids: Iterable[bytes], repos: list[str], owner: str | None) -> set[bytes]:
        """The subset of `chunk_ids` that the index holds and that one of `repos` reaches
        or that token `owner` uploaded (what a token scoped to `repos` may learn of)."""
        return self.reached(self.present(chunk_ids), repos, owner)

    def reached(self, chunk_ids: Iterable[bytes], repos: list[str], owner: str | None) -> set[bytes]:
        """The subset of `chunk_ids` that one of `repos` reaches or token `owner` uploaded,
        whether or not this index knows where they are (located from a location record)."""
        ids = list(dict.fromkeys(chunk_ids))
        found: set[bytes] = set()
        conn = self.conn
        step = max(1, _BATCH - len(repos) - 1)
        for i in range(0, len(ids), step):
            batch = ids[i:i + step]
            marks = ",".join("?" * len(batch))
            q = (f"SELECT id FROM repo_chunks WHERE id IN ({marks}) AND repo IN ({','.join('?' * len(repos)) or 'NULL'})"
                 f" UNION SELECT id FROM token_chunks WHERE id IN ({marks}) AND owner = ?")
            found.update(row[0] for row in conn.execute(q, [*batch, *repos, *batch, owner or ""]))
        return found

    def pack_chunks(self, pack: str, start: int, end: int) -> list[PackEntry]:
        """Indexed chunks of `pack` whose bytes overlap [start, end)."""
        rows: list[tuple[bytes, int, int, int, int, int | None]] = self.conn.execute(
            "SELECT id, offset, stored_len, raw_len, codec, xsum FROM chunks WHERE pack = ? AND offset < ?"
            " AND offset >= ? ORDER BY offset", (pack, end, start - (1 << 25))).fetchall()  # chunks < 32 MiB stored
        return [PackEntry(*r[:5], _check(r[5])) for r in rows if r[1] + r[2] > start]

    def reach_totals(self, repos: list[str]) -> dict[str, int]:
        """Chunk totals over what `repos` reach (a scoped token's view of the store)."""
        row = self.conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(raw_len), 0), COALESCE(SUM(stored_len), 0) FROM chunks c WHERE EXISTS"
            f" (SELECT 1 FROM repo_chunks r WHERE r.id = c.id AND r.repo IN ({','.join('?' * len(repos)) or 'NULL'}))",
            repos).fetchone()
        return {"chunks": row[0], "chunk_raw_bytes": row[1], "chunk_stored_bytes": row[2]}

    def reaches(self, repo: str, kind: str, name: str) -> bool:
        return self.conn.execute("SELECT 1 FROM repo_objects WHERE repo=? AND kind=? AND name=?",
                                 (repo, kind, name)).fetchone() is not None

    def has_pack(self, name: str) -> bool:
        return self.conn.execute("SELECT 1 FROM packs WHERE name=?", (name,)).fetchone() is not None

    def packs(self) -> set[str]:
        return {row[0] for row in self.conn.execute("SELECT name FROM packs")}

    def replace_all(self, packs: list[tuple[str, int, list[PackEntry]]],
                    grants: list[tuple[str, str, str]], chunk_grants: Iterable[tuple[str, bytes]] = (),
                    damaged: Iterable[tuple[str, bytes]] = ()) -> None:
        """Swap in a whole new index in one transaction (first pack wins a chunk).
        Uploads recorded per token are kept (they cannot be rebuilt from the packs);
        `damaged` (pack, chunk id) replaces the record of damaged copies."""
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            for table in ("chunks", "packs", "repo_objects", "repo_chunks", "damaged_chunks", "evicted"):
                conn.execute(f"DELETE FROM {table}")
            conn.executemany("INSERT OR IGNORE INTO damaged_chunks (id, pack) VALUES (?, ?)",
                             [(c, p) for p, c in damaged])
            conn.execute("DELETE FROM meta WHERE key = 'reach_stale'")
            conn.executemany("INSERT OR IGNORE INTO repo_chunks (repo, id) VALUES (?, ?)", chunk_grants)
            conn.execute("DELETE FROM dup_chunks")
            for n, size, entries in packs:
                self._add(conn, n, size, entries)
            conn.executemany("INSERT OR IGNORE INTO repo_objects (repo, kind, name) VALUES (?, ?, ?)", grants)

    def clear(self) -> None:
        conn = self.conn
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            self._clear(conn)

    @staticmethod
    def _clear(conn: sqlite3.Connection, tokens: bool = False) -> None:
        for table in ("chunks", "dup_chunks", "packs", "repo_objects", "repo_chunks", "damaged_chunks", "evicted",
                      "pack_use") + (
                ("token_chunks",) if tokens else ()):
            conn.execute(f"DELETE FROM {table}")

    def totals(self) -> dict[str, int]:
        row = self.conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(raw_len), 0), COALESCE(SUM(stored_len), 0) FROM chunks"
        ).fetchone()
        packs = self.conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM packs").fetchone()
        return {"chunks": row[0], "chunk_raw_bytes": row[1], "chunk_stored_bytes": row[2],
                "packs": packs[0], "pack_bytes": packs[1]}

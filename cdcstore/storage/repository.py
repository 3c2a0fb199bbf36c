"""The local directory store: packs, manifests, commits and branches on disk.

Layout (store format v1, see docs/format.md):

    cdcstore.json                     {"format": "cdcstore", "version": 1}
    packs/ab/<name>.pack              immutable, named by xxh3-128 of their bytes
    manifests/ab/<name>               file manifests, named likewise
    repos/<repo>/commits/<id>.json    commits, named by xxh3-128 of their JSON
    repos/<repo>/branches/<branch>    the commit id a branch points at
    repos/<repo>/tags/<tag>           the commit id a tag names (never rewritten)
    index.sqlite                      chunk index (a rebuildable cache)
    tmp/                              files being written (<pid>-<random>.tmp)

Every object is written to tmp/, fsynced and renamed into place, so nothing
half-written is ever visible. Write order is packs -> index rows -> manifests ->
commit -> branch (the commit point, a compare-and-swap under a file lock).
"""
from __future__ import annotations

import abc
import collections
import concurrent.futures
import contextlib
import fcntl
import json
import os
import secrets
import sqlite3
import threading
from typing import Iterable, Iterator

from ..core import ids
from ..core.address import check_name, check_ref_name, check_write_target, is_commit_like
from ..core.commit import Commit, changes, rebase_files, touched
from ..core.errors import (CdcError, ConflictError, CorruptionError, InvalidAddressError, NotAStoreError,
                     PathNotFoundError, RefExistsError, RepoNotFoundError, RevisionNotFoundError,
                     StoreFormatError)
from .index import ChunkIndex
from ..core.manifest import Manifest
from ..core.pack import PackEntry, decode_chunk, read_index, read_verified
from ..core.ranges import plan_ranges, slices

STORE_FORMAT = "cdcstore"
STORE_VERSION = 1
MARKER = "cdcstore.json"
MAX_MAPS = 256  # open pack maps per process
LOCAL_RUN = 4 << 20  # bytes per pread: larger buffers are fresh pages each time (~10x slower here)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sample(names: list[str], fraction: float) -> set[str]:
    """A deterministic pseudo-random sample of about `fraction` of `names` (at least one
    when fraction > 0): those whose xxh3 is lowest."""
    if fraction <= 0 or not names:
        return set()
    k = max(1, round(len(names) * min(fraction, 1.0)))
    return set(sorted(names, key=lambda n: ids.hexdigest(n.encode()))[:k])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Backend(abc.ABC):
    """What the API, the writer and the reader need from a store, local or remote.

    Ids are 16-byte digests for chunks and hex strings for packs, manifests and
    commits. Implementations keep the write order of invariant 2.
    """

    location: str

    # chunks and packs
    @abc.abstractmethod
    def present(self, chunk_ids: list[bytes]) -> set[bytes]: ...
    def present_or_prove(self, chunks: dict[bytes, bytes]) -> set[bytes]:
        """Which of these chunks (id -> raw bytes) the store holds for this writer. A
        server may hold a chunk that the writer's token cannot see yet; the writer then
        proves it holds the bytes (docs/protocol.md) instead of sending them."""
        return self.present(list(chunks))

    @abc.abstractmethod
    def begin_push(self) -> None: ...
    @abc.abstractmethod
    def tmp_path(self) -> str: ...
    @abc.abstractmethod
    def add_pack(self, tmp: str, name: str, entries: list[PackEntry]) -> None: ...
    def flush(self) -> None:
        """Wait until every added pack is durable in the store (uploads finished)."""

    @abc.abstractmethod
    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> dict[bytes, tuple[str, PackEntry]]: ...
    @abc.abstractmethod
    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> bytes: ...

    def read_chunks(self, items: list[tuple[str, PackEntry]], repo: str | None = None,
                    stored: dict | None = None) -> dict[bytes, bytes]:
        """Decoded, verified chunks by id (a remote store merges ranges). `stored`, if
        given, may receive chunks' stored bytes (for a cache)."""
        return {e.chunk_id: self.read_chunk(p, e, repo) for p, e in items}

    # manifests, commits, branches
    @abc.abstractmethod
    def put_manifests(self, manifests: list[Manifest]) -> list[str]: ...
    @abc.abstractmethod
    def get_manifest(self, name: str, repo: str | None = None) -> Manifest: ...
    @abc.abstractmethod
    def commit(self, commit: Commit, branch: str, expected: str | None) -> str:
        """Store `commit` and move `branch` from `expected` to it (compare-and-swap);
        ConflictError if the branch moved. Returns the commit id."""
    @abc.abstractmethod
    def get_commit(self, repo: str, commit_id: str) -> Commit: ...
    def resolve(self, repo: str, rev: str) -> str:
        return self.resolve_ref(repo, rev)[0]

    @abc.abstractmethod
    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        """(commit id, "commit" | "branch" | "tag") of a revision (see docs/format.md)."""
    @abc.abstractmethod
    def branches(self, repo: str) -> dict[str, str]: ...
    @abc.abstractmethod
    def tags(self, repo: str) -> dict[str, str]: ...
    @abc.abstractmethod
    def create_tag(self, repo: str, name: str, commit_id: str) -> None:
        """A new tag; RefExistsError if the name is taken by a tag or a branch."""
    @abc.abstractmethod
    def delete_tag(self, repo: str, name: str) -> str: ...
    @abc.abstractmethod
    def create_branch(self, repo: str, name: str, commit_id: str) -> None: ...
    @abc.abstractmethod
    def delete_branch(self, repo: str, name: str) -> str:
        """Remove a branch (never the last one of a repo); returns the commit it named."""
    @abc.abstractmethod
    def has_repo(self, repo: str) -> bool: ...
    @abc.abstractmethod
    def repos(self) -> list[str]: ...
    @abc.abstractmethod
    def totals(self) -> dict: ...

    def log(self, repo: str, rev: str) -> Iterator[tuple[str, Commit]]:
        cid: str | None = self.resolve(repo, rev)
        while cid:
            c = self.get_commit(repo, cid)
            yield cid, c
            cid = c.parent

    def close(self) -> None:
        pass


class LocalStore(Backend):
    """A store in a local directory. Use `LocalStore.init` to create one."""

    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        marker = os.path.join(self.root, MARKER)
        if not os.path.isdir(self.root):
            raise NotAStoreError(f"no store at {self.root}: create one with `cdcstore init --store {self.root}`")
        try:
            with open(marker) as f:
                meta = json.load(f)
        except FileNotFoundError:
            raise NotAStoreError(
                f"{self.root} is not a cdcstore store (no {MARKER}): pass the store's directory, "
                f"or create a new store in an empty directory with `cdcstore init --store DIR`"
            ) from None
        except ValueError:
            raise StoreFormatError(f"{marker} is damaged; restore it as "
                                   f'{{"format": "cdcstore", "version": {STORE_VERSION}}}') from None
        if not isinstance(meta, dict):
            raise StoreFormatError(f"{marker} is damaged (not a JSON object); restore it as "
                                   f'{{"format": "cdcstore", "version": {STORE_VERSION}}}')
        if meta.get("format") != STORE_FORMAT or meta.get("version") != STORE_VERSION:
            raise StoreFormatError(f"{self.root} holds store format {meta!r}; this cdcstore reads "
                                   f"version {STORE_VERSION}: upgrade cdcstore")
        self.location = self.root
        self._index_error: CorruptionError | None = None
        try:
            self._index = ChunkIndex(os.path.join(self.root, "index.sqlite"))
        except CorruptionError as e:  # only `rebuild_index` works then
            self._index_error = e
        self._fds: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._fd_pid = os.getpid()
        self._fd_lock = threading.Lock()

    # -- creation ------------------------------------------------------------------
    @classmethod
    def init(cls, root: str, exist_ok: bool = False) -> "LocalStore":
        root = os.path.abspath(os.path.expanduser(root))
        if os.path.exists(os.path.join(root, MARKER)):
            if exist_ok:
                return cls(root)
            raise FileExistsError(f"a store already exists at {root}")
        if os.path.isdir(root) and os.listdir(root):
            raise NotAStoreError(f"{root} is not empty: create the store in a new or empty directory")
        for sub in ("packs", "manifests", "repos", "tmp"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        ChunkIndex(os.path.join(root, "index.sqlite"))
        doc = json.dumps({"format": STORE_FORMAT, "version": STORE_VERSION}).encode()
        tmp = os.path.join(root, "tmp", f"{os.getpid()}-marker.tmp")
        with open(tmp, "wb") as f:
            f.write(doc)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(root, MARKER))
        fsync_dir(root)
        return cls(root)

    # -- atomic files -------------------------------------------------------------
    def tmp_path(self) -> str:
        return os.path.join(self.root, "tmp", f"{os.getpid()}-{secrets.token_hex(8)}.tmp")

    def publish(self, tmp: str, final: str) -> None:
        """fsync `tmp` and rename it to `final` (creating parent dirs)."""
        parent = os.path.dirname(final)
        os.makedirs(parent, exist_ok=True)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        fsync_dir(parent)

    def write_atomic(self, final: str, data: bytes) -> None:
        tmp = self.tmp_path()
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            self.publish(tmp, final)
        except BaseException:  # a full disk: leave no temp file behind
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def clean_tmp(self) -> None:
        """Remove temp files left by processes that died mid-write."""
        tmpdir = os.path.join(self.root, "tmp")
        for name in os.listdir(tmpdir):
            pid = name.split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(tmpdir, name))

    # -- packs and chunks -----------------------------------------------------------
    def present(self, chunk_ids: list[bytes]) -> set[bytes]:
        return self.index.present(chunk_ids)

    def begin_push(self) -> None:
        self.clean_tmp()
        self.recover()

    def totals(self) -> dict:
        return self.index.totals()

    def pack_path(self, name: str) -> str:
        return os.path.join(self.root, "packs", name[:2], f"{name}.pack")

    def add_pack(self, tmp: str, name: str, entries: list[PackEntry]) -> None:
        """Make a finished pack durable, then index its chunks (invariant 2)."""
        final = self.pack_path(name)
        size = os.path.getsize(tmp)
        self.publish(tmp, final)
        self.index.add_pack(name, size, entries)

    def iter_pack_names(self) -> Iterator[str]:
        base = os.path.join(self.root, "packs")
        for sub in sorted(os.listdir(base)):
            d = os.path.join(base, sub)
            if os.path.isdir(d):
                for fn in sorted(os.listdir(d)):
                    if fn.endswith(".pack"):
                        yield fn[:-5]

    def read_pack_index(self, name: str) -> list[PackEntry]:
        path = self.pack_path(name)
        with open(path, "rb") as f:
            return read_index(f, os.fstat(f.fileno()).st_size, f"pack {name}")

    def recover(self) -> int:
        """Index packs that are on disk but not in the index (a push killed between
        making a pack durable and indexing it). Returns how many were added."""
        known = self.index.packs()
        added = 0
        for name in self.iter_pack_names():
            if name not in known:
                try:
                    entries = self.read_pack_index(name)
                except CorruptionError:
                    continue  # reported by `check`; never indexed
                self.index.add_pack(name, os.path.getsize(self.pack_path(name)), entries)
                added += 1
        return added

    def index_found_pack(self, name: str) -> bool:
        """Whether pack `name` is indexed, indexing it first when it is durable on disk
        but not in the index (a writer killed between the two steps). The found file
        is verified in full (name and every chunk); a damaged one counts as absent."""
        if self.index.has_pack(name):
            return True
        path = self.pack_path(name)
        try:
            if self._pack_hash(name) != name:
                return False
            with open(path, "rb") as f:
                entries = read_verified(f, os.fstat(f.fileno()).st_size, f"pack {name}")
        except (FileNotFoundError, IsADirectoryError, CorruptionError):
            return False
        self.index.add_pack(name, os.path.getsize(path), entries)
        return True

    def rebuild_index(self) -> dict:
        """Recreate the chunk index from the packs and commits, in one transaction (a
        served store's readers see the old index until the new one is complete).

        A damaged pack is reported and skipped, but its old index rows that still
        verify are kept, so nothing readable becomes unreadable. A garbage index file
        is moved aside to index.sqlite.damaged and a new one is built."""
        try:
            old_rows = self._safe_rows()
        except CorruptionError:
            old_rows = {}
            self._replace_damaged_index()
        bad: list[str] = []
        packs = []
        for name in self.iter_pack_names():
            try:
                entries = self.read_pack_index(name)
            except CorruptionError as e:
                entries = [en for en in old_rows.get(name, ()) if self._verifies(name, en)]
                bad.append(f"{e}; kept {len(entries)} chunks whose old index rows still verify")
            packs.append((name, os.path.getsize(self.pack_path(name)), entries))
        grants, chunk_grants = self._grants_from_commits(bad)
        self.index.replace_all(packs, grants, chunk_grants)
        return {"packs": len(packs), "bad_packs": bad, **self.index.totals()}

    def _safe_rows(self) -> dict[str, list[PackEntry]]:
        """The current index rows by pack ({} if sqlite cannot read them)."""
        out: dict[str, list[PackEntry]] = collections.defaultdict(list)
        try:
            for pack, e in self.index.rows().values():
                out[pack].append(e)
        except sqlite3.DatabaseError:
            return {}
        return out

    def _replace_damaged_index(self) -> None:
        path = os.path.join(self.root, "index.sqlite")
        os.replace(path, path + ".damaged")
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)
        self._index = ChunkIndex(path)
        self._index_error = None

    def _grants_from_commits(self, bad: list[str]) -> tuple[list[tuple[str, str, str]], set[tuple[str, bytes]]]:
        """What each repo reaches through the commits its branches and tags name (commits
        that never landed grant nothing): (repo, "manifest", name) and (repo, chunk id)."""
        out: set[tuple[str, str, str]] = set()
        chunks: set[tuple[str, bytes]] = set()
        manifests: dict[str, Manifest | None] = {}
        for repo in self.repos():
            seen: set[str] = set()
            for head in set(self.refs(repo).values()):
                cid: str | None = head
                while cid and cid not in seen:
                    seen.add(cid)
                    try:
                        commit = self.get_commit(repo, cid)
                    except CdcError as e:
                        bad.append(str(e))
                        break
                    for fe in commit.files.values():
                        if fe.manifest not in manifests:
                            try:
                                manifests[fe.manifest] = self.get_manifest(fe.manifest)
                            except CdcError as e:
                                manifests[fe.manifest] = None
                                bad.append(str(e))
                        m = manifests[fe.manifest]
                        if (repo, "manifest", fe.manifest) not in out:
                            out.add((repo, "manifest", fe.manifest))
                            chunks.update((repo, c) for c in (m.chunk_ids if m else ()))
                    cid = commit.parent
        return sorted(out), chunks

    @property
    def index(self) -> ChunkIndex:
        """The chunk index; a damaged one is tried again on each use (another process may
        have rebuilt it meanwhile), else CorruptionError naming rebuild-index."""
        if self._index_error:
            self._index = ChunkIndex(os.path.join(self.root, "index.sqlite"))
            self._index_error = None
        return self._index

    def check(self, read_data: bool = False, subset: float | None = None) -> dict:
        """Verify the store; returns {"packs", "chunks", "problems", "details"}.

        Always: each pack's footer, every index row against a present pack and its
        footer, and every commit and manifest that a branch or tag reaches (parses,
        and its chunks are indexed). `read_data` also hashes every pack and decodes
        every chunk; `subset` (0..1) does so for a deterministic sample of packs. A
        chunk whose stored copy fails verification loses its index row, so the next
        push of its file stores it again. Each problem names the files it affects.
        Durable packs that a killed push left unindexed are indexed first (`recover`)."""
        found: list[tuple[str, set[bytes]]] = []  # (problem, chunk ids it affects)
        recovered = self.recover()  # durable packs a killed push left unindexed: not damage
        rows = self.index.rows()
        names = list(self.iter_pack_names())
        sample = _sample(names, 1.0 if read_data else subset or 0.0)
        by_pack: dict[str, dict[bytes, PackEntry]] = collections.defaultdict(dict)
        for cid, (pack, e) in rows.items():
            by_pack[pack][cid] = e
        chunks = 0
        for name in names:
            chunks += self._check_pack(name, name in sample, rows, by_pack.get(name, {}), found)
        on_disk = set(names)
        lost = collections.defaultdict(set)
        for cid, (pack, _) in rows.items():
            if pack not in on_disk:
                lost[pack].add(cid)
        for pack, cids in sorted(lost.items()):
            self.index.drop_chunks(pack, cids)
            found.append((f"pack {pack} is missing: {len(cids)} indexed chunks are lost "
                          f"(push the original files again, or restore the pack)", cids))
        users = self._check_reachable(found)
        problems, details = [], []
        for text, cids in found:
            files = sorted({f for c in cids for f in ((c,) if isinstance(c, str) else users.get(c, ()))})
            shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
            problems.append(text + (f"; affects {shown}" if files else ""))
            details.append({"problem": text, "files": files})
        return {"packs": len(names), "chunks": chunks, "read_packs": len(sample), "recovered_packs": recovered,
                "problems": problems, "details": details}

    def _check_pack(self, name: str, read: bool, rows: dict, indexed: dict, found: list) -> int:
        """Check one pack's footer against the index rows (`indexed`: its own), and its
        bytes when `read`."""
        try:
            entries = self.read_pack_index(name)
        except CorruptionError as e:
            entries = None
            found.append((f"{e}; run `cdcstore rebuild-index` (rows that still verify are kept)",
                           set(indexed)))
        if entries is not None:
            by_id = {e.chunk_id: e for e in entries}
            missing = {c for c in by_id if c not in rows and self._verifies(name, by_id[c])}
            wrong = {c for c, e in indexed.items() if by_id.get(c) != e}
            if missing:
                found.append((f"the index lacks {len(missing)} chunks of pack {name}: "
                              f"run `cdcstore rebuild-index`", missing))
            if wrong:
                self.index.drop_chunks(name, wrong)
                found.append((f"{len(wrong)} index rows of pack {name} do not match its footer "
                              f"(dropped): run `cdcstore rebuild-index`", wrong))
        if not read:
            return len(entries or ())
        if self._pack_hash(name) != name:
            found.append((f"pack {name} does not match its name (damaged)", set()))
        bad = {e.chunk_id for e in (entries if entries is not None else indexed.values())
               if not self._verifies(name, e)}
        bad &= set(indexed)  # a damaged copy that another pack's copy replaced is harmless
        if bad:
            self.index.drop_chunks(name, bad)
            found.append((f"{len(bad)} chunks of pack {name} fail verification (their index rows are "
                          f"dropped: push the original files again to repair them)", bad))
        return len(entries or indexed)

    def _verifies(self, pack: str, e: PackEntry) -> bool:
        try:
            decode_chunk(self.read_stored(pack, e.offset, e.stored_len), e.codec, e.raw_len, e.chunk_id)
            return True
        except CorruptionError:
            return False

    def _pack_hash(self, name: str) -> str:
        h = ids.hasher()
        with open(self.pack_path(name), "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        return h.hexdigest()

    def refs(self, repo: str) -> dict[str, str]:
        """Branches and tags of a repo (name -> commit id); tags as "tag:NAME"."""
        return {**self.branches(repo), **{f"tag:{n}": c for n, c in self.tags(repo).items()}}

    def _check_reachable(self, found: list) -> dict[bytes, set[str]]:
        """Walk every commit that a branch or tag reaches; returns chunk id -> the files
        (cdc://repo@ref/path) that use it, and adds problems for what does not parse or
        is not indexed."""
        users: dict[bytes, set[str]] = collections.defaultdict(set)
        manifests: dict[str, Manifest | None] = {}
        seen_commits: set[tuple[str, str]] = set()
        for repo in self.repos():
            for ref, head in self.refs(repo).items():
                cid = head
                while cid and (repo, cid) not in seen_commits:
                    seen_commits.add((repo, cid))
                    try:
                        commit = self.get_commit(repo, cid)
                    except CdcError as e:
                        found.append((f"{e}: restore it from a copy",
                                      {f"cdc://{repo}@{ref.removeprefix('tag:')}"}))
                        break
                    for path, fe in commit.files.items():
                        label = f"cdc://{repo}@{ref.removeprefix('tag:')}/{path}"
                        m = self._check_manifest(fe.manifest, label, manifests, found)
                        for c in m.chunk_ids if m else ():
                            users[c].add(label)
                    cid = commit.parent
        needed = set(users)
        absent = needed - self.index.present(needed)
        if absent:
            found.append((f"{len(absent)} chunks that commits use are not in the index "
                          f"(push the original files again to repair them)", absent))
        return users

    def _check_manifest(self, name: str, label: str, cache: dict, found: list) -> Manifest | None:
        """The parsed manifest, or None after recording the problem (with `label` among
        the files it affects)."""
        if name not in cache:
            try:
                cache[name] = self.get_manifest(name)
            except CdcError as e:
                cache[name] = None
                found.append((f"{e}: restore it from a copy, or push the file again", set()))
                cache[("problem", name)] = found[-1][1]
        if cache[name] is None:
            cache[("problem", name)].add(label)
        return cache[name]

    def _fd(self, pack: str) -> int:
        """An open descriptor of a pack (per process; at most MAX_MAPS kept open).

        Reads use os.pread, never mmap: a pack truncated under a reader gives a
        short read (a CorruptionError), not a SIGBUS."""
        with self._fd_lock:
            if self._fd_pid != os.getpid():
                self._fds = collections.OrderedDict()  # the parent's descriptors stay theirs
                self._fd_pid = os.getpid()
            fd = self._fds.get(pack)
            if fd is None:
                try:
                    fd = os.open(self.pack_path(pack), os.O_RDONLY)
                except FileNotFoundError:
                    raise CorruptionError(f"pack {pack} is missing from {self.root}; "
                                          f"run `cdcstore check` and restore it from a copy") from None
                self._fds[pack] = fd
                while len(self._fds) > MAX_MAPS:
                    os.close(self._fds.popitem(last=False)[1])
            else:
                self._fds.move_to_end(pack)
            return fd

    def read_stored(self, pack: str, offset: int, length: int):
        """Raw bytes of a pack range (no decoding); CorruptionError if the pack is short."""
        data = os.pread(self._fd(pack), length, offset) if offset >= 0 else b""
        if len(data) < length and data:  # a short read that is not the end of the file
            data += self._read_rest(pack, offset + len(data), length - len(data))
        if len(data) != length:
            raise CorruptionError(f"pack {pack} is truncated: wanted {length} bytes at {offset}, "
                                  f"got {len(data)}; run `cdcstore check`")
        return memoryview(data)

    def _read_rest(self, pack: str, offset: int, length: int) -> bytes:
        parts = []
        while length > 0 and (part := os.pread(self._fd(pack), length, offset)):
            parts.append(part)
            offset += len(part)
            length -= len(part)
        return b"".join(parts)

    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> dict[bytes, tuple[str, PackEntry]]:
        return self.index.locate(chunk_ids)

    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> bytes:
        return self.read_chunks([(pack, entry)])[entry.chunk_id]

    def read_chunks(self, items: list[tuple[str, PackEntry]], repo: str | None = None,
                    stored: dict | None = None) -> dict[bytes, bytes]:
        """One view per run of adjacent chunks in a pack; each chunk verified."""
        out = {}
        for r in plan_ranges(items, max_hole=0, max_range=LOCAL_RUN):  # large preads fault in fresh pages
            for e, stored_bytes in slices(r, self.read_stored(r.pack, r.start, r.end - r.start)):
                try:
                    out[e.chunk_id] = decode_chunk(stored_bytes, e.codec, e.raw_len, e.chunk_id)
                except CorruptionError as err:
                    self.index.drop_chunks(r.pack, [e.chunk_id])  # absent now: a push stores it again
                    raise CorruptionError(f"{err} in pack {r.pack}: the store is damaged; run `cdcstore check`,"
                                          f" or push the original files again to repair it") from None
        return out

    def close(self) -> None:
        with self._fd_lock:
            if self._fd_pid == os.getpid():
                for fd in self._fds.values():
                    os.close(fd)
            self._fds = collections.OrderedDict()

    # -- manifests ------------------------------------------------------------------
    def manifest_path(self, name: str) -> str:
        return os.path.join(self.root, "manifests", name[:2], name)

    def put_manifest(self, manifest: Manifest) -> str:
        data = manifest.encode()
        name = ids.hexdigest(data)
        path = self.manifest_path(name)
        if not os.path.exists(path):
            self.write_atomic(path, data)
        return name

    def put_manifests(self, manifests: list[Manifest]) -> list[str]:
        """Store many manifests durably: write temp files and fsync each (on a few
        threads), then rename them into place and fsync their directories."""
        encoded = [m.encode() for m in manifests]
        names = [ids.hexdigest(d) for d in encoded]
        todo = {n: d for n, d in zip(names, encoded) if not os.path.exists(self.manifest_path(n))}
        if len(todo) <= 16:
            for n, d in todo.items():
                self.write_atomic(self.manifest_path(n), d)
            return names
        staged = [(self.tmp_path(), self.manifest_path(n)) for n in todo]
        try:
            with concurrent.futures.ThreadPoolExecutor(4) as pool:  # fsync waits on the disk, not the GIL
                list(pool.map(_write_synced, [t for t, _ in staged], todo.values()))
        except BaseException:
            for tmp, _ in staged:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise
        parents = set()
        for tmp, final in staged:
            parent = os.path.dirname(final)
            if parent not in parents:
                os.makedirs(parent, exist_ok=True)
                parents.add(parent)
            os.replace(tmp, final)
        for parent in parents:
            fsync_dir(parent)
        return names

    @staticmethod
    def _read_named(path: str, name: str, what: str, missing: Exception) -> bytes:
        """The bytes of an object file, checked against the hash that names it."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise missing from None
        if ids.hexdigest(data) != name:
            raise CorruptionError(f"{what} does not match its name (damaged)")
        return data

    def get_manifest(self, name: str, repo: str | None = None) -> Manifest:
        data = self._read_named(self.manifest_path(name), name, f"manifest {name}",
                                CorruptionError(f"manifest {name} is missing from {self.root}"))
        return Manifest.decode(data, f"manifest {name}")

    # -- repos, commits, branches -------------------------------------------------------
    def repo_dir(self, repo: str) -> str:
        return os.path.join(self.root, "repos", check_name("repo", repo))

    def repos(self) -> list[str]:
        """Repo folders (a stray file in repos/ is not a repo)."""
        base = os.path.join(self.root, "repos")
        return sorted(n for n in os.listdir(base) if os.path.isdir(os.path.join(base, n)))

    def has_repo(self, repo: str) -> bool:
        return os.path.isdir(self.repo_dir(repo))

    def _require_repo(self, repo: str) -> str:
        d = self.repo_dir(repo)
        if not os.path.isdir(d):
            known = ", ".join(self.repos()) or "none yet"
            raise RepoNotFoundError(f"no repo {repo!r} in store {self.root} (repos: {known}); "
                                    f"push to cdc://{repo}/ to create it")
        return d

    def branches(self, repo: str) -> dict[str, str]:
        return self._read_refs(os.path.join(self._require_repo(repo), "branches"))

    def put_commit(self, commit: Commit) -> str:
        self.ensure_repo(commit.repo)
        data = commit.encode()
        cid = ids.hexdigest(data)
        path = os.path.join(self.repo_dir(commit.repo), "commits", f"{cid}.json")
        if not os.path.exists(path):
            self.write_atomic(path, data)
        return cid

    def get_commit(self, repo: str, commit_id: str) -> Commit:
        path = os.path.join(self._require_repo(repo), "commits", f"{commit_id}.json")
        data = self._read_named(path, commit_id, f"commit {commit_id} in repo {repo!r}",
                                RevisionNotFoundError(f"no commit {commit_id} in repo {repo!r}"))
        return Commit.decode(data, f"commit {commit_id}")

    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        """(commit id, kind) of a revision: 4+ hex digits are a commit id or a unique
        prefix of one ("commit"); any other name is a branch or a tag, never both."""
        d = self._require_repo(repo)
        if is_commit_like(rev):
            prefix = rev.lower()
            matches = [fn[:-5] for fn in os.listdir(os.path.join(d, "commits"))
                       if fn.startswith(prefix) and fn.endswith(".json")]
            return pick_commit(repo, rev, matches), "commit"
        check_name("revision", rev)
        branches = self.branches(repo)
        return resolve_name(repo, rev, branches.get(rev), self.tags(repo).get(rev), branches)

    def _ref_dir(self, repo: str, kind: str) -> str:
        return os.path.join(self._require_repo(repo), "branches" if kind == "branch" else "tags")

    def _read_refs(self, d: str) -> dict[str, str]:
        out = {}
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if name.startswith("."):
                continue
            with open(os.path.join(d, name)) as f:
                out[name] = f.read().strip()
        return out

    def tags(self, repo: str) -> dict[str, str]:
        return self._read_refs(self._ref_dir(repo, "tag"))

    def create_ref(self, repo: str, kind: str, name: str, commit_id: str) -> None:
        """Create branch or tag `name` at `commit_id` under the repo lock; refuses a
        name that is already a branch or a tag, and a commit the repo lacks."""
        check_ref_name(kind, name)
        self.get_commit(repo, commit_id)  # must exist (and be intact) in this repo
        with self._repo_lock(repo):
            for other in ("branch", "tag"):
                if os.path.exists(os.path.join(self._ref_dir(repo, other), name)):
                    raise RefExistsError(f"{other} {name!r} already exists in repo {repo!r}: "
                                         f"choose another {kind} name" + (
                                             "; tags are never moved" if other == "tag" else ""))
            self.write_atomic(os.path.join(self._ref_dir(repo, kind), name), (commit_id + "\n").encode())

    def create_tag(self, repo: str, name: str, commit_id: str) -> None:
        self.create_ref(repo, "tag", name, commit_id)

    def create_branch(self, repo: str, name: str, commit_id: str) -> None:
        self.create_ref(repo, "branch", name, commit_id)

    def delete_ref(self, repo: str, kind: str, name: str) -> str:
        """Remove a branch or tag (never the repo's last branch); returns its commit id."""
        check_name(kind, name)
        with self._repo_lock(repo):
            refs = self._read_refs(self._ref_dir(repo, kind))
            if name not in refs:
                raise RevisionNotFoundError(f"no {kind} {name!r} in repo {repo!r} "
                                            f"({kind}s: {', '.join(refs) or 'none'})")
            if kind == "branch" and len(refs) == 1:
                raise InvalidAddressError(f"branch {name!r} is the only branch of repo {repo!r}: "
                                          f"create another branch before deleting it")
            path = os.path.join(self._ref_dir(repo, kind), name)
            os.unlink(path)
            fsync_dir(os.path.dirname(path))
            return refs[name]

    def delete_tag(self, repo: str, name: str) -> str:
        return self.delete_ref(repo, "tag", name)

    def delete_branch(self, repo: str, name: str) -> str:
        return self.delete_ref(repo, "branch", name)

    @contextlib.contextmanager
    def _repo_lock(self, repo: str):
        d = self.repo_dir(repo)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "lock"), "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def commit(self, commit: Commit, branch: str, expected: str | None) -> str:
        cid = self.put_commit(commit)
        return self.update_branch(commit.repo, branch, expected, cid, commit, landed=self._grant)

    def _grant(self, commit: Commit) -> None:
        """Record which manifests and chunks the commit's repo reaches (what a server
        lets a repo's tokens read). Only manifests new since the parent are walked."""
        names = {f.manifest for f in commit.files.values()}
        if commit.parent:
            try:
                names -= {f.manifest for f in self.get_commit(commit.repo, commit.parent).files.values()}
            except CdcError:
                pass
        chunk_ids: set[bytes] = set()
        for n in names:
            chunk_ids.update(self.get_manifest(n).chunk_ids)
        self.index.grant(commit.repo, "manifest", names)
        self.index.grant_chunks("repo_chunks", commit.repo, chunk_ids)

    def update_branch(self, repo: str, branch: str, expected: str | None, new: str,
                      commit: Commit | None = None, landed=None) -> str:
        """Move `branch` from `expected` (None: must not exist) to `new`, atomically;
        returns the commit the branch now points at. `landed(commit)` runs under the
        lock once the commit that lands is known, before the branch file is written.

        If another writer moved the branch first and `commit` (the commit named `new`)
        touches no path that the branch's new history touched, a rebased copy of it
        lands on the moved head instead (see docs/architecture.md). Otherwise
        ConflictError, naming the overlapping paths; nothing changes then.
        """
        check_write_target(branch)
        with self._repo_lock(repo):
            if os.path.exists(os.path.join(self.repo_dir(repo), "tags", branch)):
                raise InvalidAddressError(f"{branch!r} is a tag of repo {repo!r}: a tag is immutable: "
                                          f"push to a branch")
            path = os.path.join(self.repo_dir(repo), "branches", branch)
            try:
                with open(path) as f:
                    current = f.read().strip()
            except FileNotFoundError:
                current = None
            if current != expected:
                if commit is None or current is None:
                    raise ConflictError(
                        f"branch {branch!r} of repo {repo!r} moved to {current or 'nothing'} while this push "
                        f"was based on {expected or 'no commit'}: run the push again (stored chunks are reused)")
                new, fresh = self._rebase(commit, branch, current)
                if not fresh:  # this very commit landed before (a retried request)
                    return new
            if landed is not None:
                landed(self.get_commit(repo, new))
            self.write_atomic(path, (new + "\n").encode())
            return new

    def _applied_path(self, repo: str, original: str) -> str:
        return os.path.join(self.repo_dir(repo), "applied", original)

    def _history(self, repo: str, head: str, base: str | None) -> Iterator[tuple[str, Commit]]:
        """Commits from `head` back to (not including) `base`; ConflictError if `base`
        is not an ancestor of `head`."""
        cid: str | None = head
        while cid != base:
            if cid is None:
                raise ConflictError(f"commit {base} is not in the history of {head} in repo {repo!r}: "
                                    f"the branch was reset; run the push again")
            c = self.get_commit(repo, cid)
            yield cid, c
            cid = c.parent

    def _rebase(self, commit: Commit, branch: str, head: str) -> tuple[str, bool]:
        """Land `commit` on `head` (called under the repo lock). Returns (the rebased
        commit's id, True), or (the landed id, False) when `commit` or its rebased
        copy is already in the history since its parent (a retried request).
        Raises ConflictError on overlapping paths."""
        repo, cid = commit.repo, commit.id
        try:
            with open(self._applied_path(repo, cid)) as f:
                recorded = f.read().strip()
        except FileNotFoundError:
            recorded = None
        theirs: set[str] = set()
        for hid, h in self._history(repo, head, commit.parent):
            if hid in (cid, recorded):
                return hid, False
            parent_files = self.get_commit(repo, h.parent).files if h.parent else {}
            theirs |= touched(parent_files, h.files)
        base_files = self.get_commit(repo, commit.parent).files if commit.parent else {}
        files, overlap = rebase_files(changes(base_files, commit.files), theirs,
                                      self.get_commit(repo, head).files)
        if files is None:
            shown = ", ".join(overlap[:5]) + (f" and {len(overlap) - 5} more" if len(overlap) > 5 else "")
            raise ConflictError(f"branch {branch!r} of repo {repo!r} moved to {head} and another writer changed "
                                f"the same paths: {shown}; pull the branch and run the push again")
        landed = self.put_commit(Commit(repo, head, commit.message, commit.time, files))
        self.write_atomic(self._applied_path(repo, cid), (landed + "\n").encode())  # before the branch moves
        return landed, True

    def ensure_repo(self, repo: str) -> None:
        d = self.repo_dir(repo)
        for sub in ("commits", "branches"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)


def pick_commit(repo: str, rev: str, matches: list[str]) -> str:
    """The one commit id a hex prefix names; an error for none or several."""
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise RevisionNotFoundError(f"revision {rev!r} is ambiguous in repo {repo!r} "
                                    f"({len(matches)} commits match): give more digits")
    raise RevisionNotFoundError(f"no commit {rev!r} in repo {repo!r} (4 or more hex digits name a "
                                f"commit id or a prefix of one; see `cdcstore log {repo}`)")


def resolve_name(repo: str, rev: str, branch: str | None, tag: str | None,
                 branches: dict[str, str]) -> tuple[str, str]:
    """(commit id, kind) of a name that is a branch or a tag; an error if both or neither."""
    if branch and tag:
        raise RevisionNotFoundError(f"revision {rev!r} is ambiguous in repo {repo!r}: it is both a branch "
                                    f"and a tag; delete one of them")
    if branch or tag:
        return (branch, "branch") if branch else (tag, "tag")
    names = ", ".join(branches) or "none"
    raise RevisionNotFoundError(f"no branch or tag {rev!r} in repo {repo!r} (branches: {names}); "
                                f"a commit id prefix needs at least 4 hex digits")


def no_such_path(addr_repo: str, rev: str, path: str) -> PathNotFoundError:
    return PathNotFoundError(f"no file or folder {path!r} in cdc://{addr_repo}@{rev}/: "
                             f"list what is there with `cdcstore ls cdc://{addr_repo}@{rev}/`")

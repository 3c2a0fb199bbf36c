"""The local directory store: packs, manifests, commits and branches on disk.

Layout (store format v1, see docs/format.md):

    cdcstore.json                     {"format": "cdcstore", "version": 1}
    packs/ab/<name>.pack              immutable, named by xxh3-128 of their bytes
    manifests/ab/<name>               file manifests, named likewise
    repos/<repo>/commits/<id>.json    commits, named by xxh3-128 of their JSON
    repos/<repo>/branches/<branch>    the commit id a branch points at
    index.sqlite                      chunk index (a rebuildable cache)
    tmp/                              files being written (<pid>-<random>.tmp)

Every object is written to tmp/, fsynced and renamed into place, so nothing
half-written is ever visible. Write order is packs -> index rows -> manifests ->
commit -> branch (the commit point, a compare-and-swap under a file lock).
"""
from __future__ import annotations

import abc
import collections
import contextlib
import fcntl
import json
import mmap
import os
import secrets
import threading
from typing import Iterable, Iterator

from . import ids
from .address import check_name
from .commit import Commit
from .errors import (CdcError, ConflictError, CorruptionError, NotAStoreError, PathNotFoundError,
                     RepoNotFoundError, RevisionNotFoundError, StoreFormatError)
from .index import ChunkIndex
from .manifest import Manifest
from .pack import PackEntry, decode_chunk, read_index
from .transfer import plan_ranges

STORE_FORMAT = "cdcstore"
STORE_VERSION = 1
MARKER = "cdcstore.json"
MAX_MAPS = 256  # open pack maps per process


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    @abc.abstractmethod
    def resolve(self, repo: str, rev: str) -> str: ...
    @abc.abstractmethod
    def branches(self, repo: str) -> dict[str, str]: ...
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
        if meta.get("format") != STORE_FORMAT or meta.get("version") != STORE_VERSION:
            raise StoreFormatError(f"{self.root} holds store format {meta!r}; this cdcstore reads "
                                   f"version {STORE_VERSION}: upgrade cdcstore")
        self.location = self.root
        self.index = ChunkIndex(os.path.join(self.root, "index.sqlite"))
        self._maps: collections.OrderedDict[str, mmap.mmap] = collections.OrderedDict()
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
        with open(tmp, "wb") as f:
            f.write(data)
        self.publish(tmp, final)

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

    def rebuild_index(self) -> dict:
        """Recreate the chunk index from the packs alone."""
        self.index.clear()
        bad = []
        packs = 0
        for name in self.iter_pack_names():
            try:
                entries = self.read_pack_index(name)
            except CorruptionError as e:
                bad.append(str(e))
                continue
            self.index.add_pack(name, os.path.getsize(self.pack_path(name)), entries)
            packs += 1
        for repo in self.repos():  # what each repo reaches, from its commits
            for fn in os.listdir(os.path.join(self.repo_dir(repo), "commits")):
                commit = self.get_commit(repo, fn[:-5])
                self._grant(Commit(repo, None, "", 0.0, commit.files))
        return {"packs": packs, "bad_packs": bad, **self.index.totals()}

    def check(self) -> dict:
        """Verify every pack against its name and every chunk against its id."""
        problems = []
        packs = chunks = 0
        for name in self.iter_pack_names():
            packs += 1
            path = self.pack_path(name)
            h = ids.hasher()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
            if h.hexdigest() != name:
                problems.append(f"pack {name} does not match its name (damaged)")
                continue
            try:
                entries = self.read_pack_index(name)
                with open(path, "rb") as f:
                    for e in entries:
                        f.seek(e.offset)
                        decode_chunk(f.read(e.stored_len), e.codec, e.raw_len, e.chunk_id)
                        chunks += 1
            except CorruptionError as e:
                problems.append(str(e))
        return {"packs": packs, "chunks": chunks, "problems": problems}

    def _map(self, pack: str) -> mmap.mmap:
        """A read-only map of a pack (per process; at most MAX_MAPS kept open).

        Reads from the map skip one copy; packs are immutable, so a map never sees
        a change. (A pack truncated by hand while mapped would raise SIGBUS, not
        an error: `check` finds such damage.)"""
        with self._fd_lock:
            if self._fd_pid != os.getpid():
                self._maps = collections.OrderedDict()
                self._fd_pid = os.getpid()
            m = self._maps.get(pack)
            if m is None:
                try:
                    with open(self.pack_path(pack), "rb") as f:
                        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                except FileNotFoundError:
                    raise CorruptionError(f"pack {pack} is missing from {self.root}; "
                                          f"run `cdcstore check` and restore it from a copy") from None
                except ValueError:  # an empty file cannot be mapped
                    raise CorruptionError(f"pack {pack} is empty (damaged); run `cdcstore check`") from None
                self._maps[pack] = m
                while len(self._maps) > MAX_MAPS:
                    self._maps.popitem(last=False)  # closed once no read holds a view of it
            else:
                self._maps.move_to_end(pack)
            return m

    def read_stored(self, pack: str, offset: int, length: int):
        """Raw bytes of a pack range (a read-only view; no decoding)."""
        m = self._map(pack)
        if offset < 0 or offset + length > len(m):
            raise CorruptionError(f"pack {pack} is truncated: wanted {length} bytes at {offset}, "
                                  f"it has {len(m)}; run `cdcstore check`")
        return memoryview(m)[offset:offset + length]

    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> dict[bytes, tuple[str, PackEntry]]:
        return self.index.locate(chunk_ids)

    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> bytes:
        return self.read_chunks([(pack, entry)])[entry.chunk_id]

    def read_chunks(self, items: list[tuple[str, PackEntry]], repo: str | None = None,
                    stored: dict | None = None) -> dict[bytes, bytes]:
        """One view per run of adjacent chunks in a pack; each chunk verified."""
        out = {}
        for r in plan_ranges(items, max_hole=0):
            data = self.read_stored(r.pack, r.start, r.end - r.start)
            for e in r.entries:
                lo = e.offset - r.start
                try:
                    out[e.chunk_id] = decode_chunk(data[lo:lo + e.stored_len], e.codec, e.raw_len, e.chunk_id)
                except CorruptionError as err:
                    raise CorruptionError(f"{err} in pack {r.pack}: the store is damaged; "
                                          f"run `cdcstore check`") from None
        return out

    def close(self) -> None:
        with self._fd_lock:
            self._maps = collections.OrderedDict()  # maps close when the last view goes

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
        """Store many manifests durably with one sync instead of an fsync each:
        write temp files, sync, then rename into place and sync the directories."""
        encoded = [m.encode() for m in manifests]
        names = [ids.hexdigest(d) for d in encoded]
        todo = {n: d for n, d in zip(names, encoded) if not os.path.exists(self.manifest_path(n))}
        if len(todo) <= 16:
            for n, d in todo.items():
                self.write_atomic(self.manifest_path(n), d)
            return names
        staged = []
        for n, d in todo.items():
            tmp = self.tmp_path()
            with open(tmp, "wb") as f:
                f.write(d)
            staged.append((tmp, self.manifest_path(n)))
        os.sync()  # every staged file is durable before any becomes visible
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
        return sorted(os.listdir(os.path.join(self.root, "repos")))

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
        d = os.path.join(self._require_repo(repo), "branches")
        out = {}
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            with open(os.path.join(d, name)) as f:
                out[name] = f.read().strip()
        return out

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

    def resolve(self, repo: str, rev: str) -> str:
        """A branch name, a commit id or a unique prefix of one (4+ hex digits) -> commit id."""
        d = self._require_repo(repo)
        branch = os.path.join(d, "branches", rev)
        if os.path.isfile(branch):
            with open(branch) as f:
                return f.read().strip()
        if len(rev) >= 4 and all(c in "0123456789abcdef" for c in rev):
            matches = [fn[:-5] for fn in os.listdir(os.path.join(d, "commits")) if fn.startswith(rev)]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                raise RevisionNotFoundError(f"revision {rev!r} is ambiguous in repo {repo!r} "
                                            f"({len(matches)} commits match): give more digits")
        names = ", ".join(self.branches(repo)) or "none"
        raise RevisionNotFoundError(f"no branch or commit {rev!r} in repo {repo!r} (branches: {names}); "
                                    f"a commit id prefix needs at least 4 hex digits")

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
        self.update_branch(commit.repo, branch, expected, cid, landed=lambda: self._grant_landed(commit))
        return cid

    def _grant_landed(self, commit: Commit) -> None:
        """Grant a commit's reach once its compare-and-swap succeeded: a refused commit grants nothing."""
        self._grant(commit)

    def _grant(self, commit: Commit) -> None:
        """Record which manifests and packs the commit's repo reaches (what a server
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
        self.index.grant(commit.repo, "pack", {pack for pack, _ in self.index.locate(chunk_ids).values()})

    def update_branch(self, repo: str, branch: str, expected: str | None, new: str, landed=None) -> None:
        """Move `branch` from `expected` (None: must not exist) to `new`, atomically.
        `landed()` runs under the lock after the check, before the branch file is written.

        Raises ConflictError when another writer moved it first; nothing changes then.
        """
        check_name("branch", branch)
        with self._repo_lock(repo):
            path = os.path.join(self.repo_dir(repo), "branches", branch)
            try:
                with open(path) as f:
                    current = f.read().strip()
            except FileNotFoundError:
                current = None
            if current != expected:
                raise ConflictError(
                    f"branch {branch!r} of repo {repo!r} moved to {current or 'nothing'} while this push was "
                    f"based on {expected or 'no commit'}: run the push again (stored chunks are reused)"
                )
            if landed is not None:
                landed()
            self.write_atomic(path, (new + "\n").encode())

    def ensure_repo(self, repo: str) -> None:
        d = self.repo_dir(repo)
        for sub in ("commits", "branches"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)


def no_such_path(addr_repo: str, rev: str, path: str) -> PathNotFoundError:
    return PathNotFoundError(f"no file or folder {path!r} in cdc://{addr_repo}@{rev}/: "
                             f"list what is there with `cdcstore ls cdc://{addr_repo}@{rev}/`")

"""The Python API: `Store` publishes, lists and reads versioned files.

    store = Store("/data/cdcstore")              # or Store() for $CDCSTORE_STORE / the default
    result = store.push(["./dataset"], "cdc://ds/", message="v1")
    with store.open("cdc://ds/train.parquet") as f: ...
    store.pull("cdc://ds@v1/", "./copy")
"""
from __future__ import annotations

import functools
import getpass
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

import platformdirs

from . import runtime
from . import settings
from .core import ids, tree, treeobj
from .core.address import DEFAULT_BRANCH, Address, check_name, check_write_target, normalize_path
from .core.commit import MAX_AUTHOR, Commit, FileEntry, check_author as _check_author
from .core.manifest import Manifest
from .core.errors import CdcError, CorruptionError, InvalidAddressError, MissingChunksError, PathNotFoundError
from .engine.history import History, as_address as _as_address
from .engine.pull import PULL_LOCATE_CHUNKS, check_replaceable, pull_files  # noqa: F401 (check_replaceable: fs.py's)
from .storage.reader import FileReader
from .storage.backend import Backend
from .storage.cache import ChunkCache, parse_size  # noqa: F401 (the cache's public names)
from .storage import meta, staging  # meta: the process's heads and objects (fs.py uses it through here)
from .storage.maintenance import DEFAULT_GRACE, DEFAULT_MAX_UNUSED, DEFAULT_REPACK_DEAD
from .storage.repository import LocalStore, is_object_url, no_such_path, open_repository
from .engine.push import Ingest, IngestOptions
from .storage import statcache
from .storage.statcache import Seen, StatCache


ENV_STORE = settings.STORE.name


def check_author(author) -> str:
    """`author` as given, or InvalidAddressError saying what an author may be."""
    try:
        return _check_author(author)
    except ValueError as e:
        raise InvalidAddressError(str(e)) from None


# -- who a commit is by, when nobody says (a push to a server with tokens: the token's name) --
def _git(key: str) -> str:
    try:
        out = subprocess.run(["git", "config", "--get", key], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return " ".join(out.stdout.split()) if out.returncode == 0 else ""


@functools.lru_cache(maxsize=1)
def default_author() -> str:
    """"Name <email>" from git's settings (either alone when only one is set), else the OS
    user's login name, else "unknown"; read once per process."""
    if shutil.which("git"):
        name, email = _git("user.name"), _git("user.email")
        who = f"{name} <{email}>" if name and email else name or (f"<{email}>" if email else "")
        if who:
            return who[:MAX_AUTHOR]
    try:
        user = getpass.getuser()
    except Exception:  # no login name and no passwd entry (a bare container)
        user = ""
    user = "".join(c for c in user if c.isprintable()).strip()
    return user[:MAX_AUTHOR] or "unknown"


def default_store_path() -> str:
    """$CDCSTORE_STORE, else a directory under the user's data dir (XDG)."""
    return settings.STORE.get() or os.path.join(platformdirs.user_data_dir("cdcstore"), "store")


@dataclass
class TransferResult:
    """What a push or pull did. `new_bytes` counts raw bytes of chunks the target lacked."""

    files: int
    bytes: int
    new_bytes: int
    stored_bytes: int  # chunk records written into packs (compressed chunks), as `stats` counts them
    seconds: float
    commit: str | None
    chunks: int = 0
    pack_bytes: int = 0  # the pack files written: stored_bytes plus each pack's header, index and trailer
    new_chunks: int = 0
    changed: bool = True
    sent_bytes: int = 0  # on the wire, bodies and headers (remote stores)
    received_bytes: int = 0
    requests: int = 0
    files_detail: dict | None = None  # per pushed file: bytes, new_bytes, chunks, chunking
    unread_files: int = 0  # files the push stat cache vouched for: not read (statcache.py)

    @property
    def new_bytes_by_file(self) -> dict[str, int]:
        """Where the new bytes of a push landed, largest first (files with none left out).
        A chunk new to the store counts for the first file that contains it."""
        d = self.files_detail or {}
        return dict(sorted(((p, f["new_bytes"]) for p, f in d.items() if f["new_bytes"]),
                           key=lambda kv: (-kv[1], kv[0])))

    def to_dict(self, detail: bool = False) -> dict:
        d = asdict(self)
        d["new_bytes_by_file"] = self.new_bytes_by_file
        if not detail or d["files_detail"] is None:
            del d["files_detail"]
        return d


@dataclass
class PullResult:
    """What a pull did: `bytes` of `files` in the revision; `written_files` and
    `written_bytes` had to be written (the rest already matched on disk)."""

    files: int
    bytes: int
    written_files: int
    written_bytes: int
    seconds: float
    commit: str
    sent_bytes: int = 0
    received_bytes: int = 0
    requests: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _special(path: str) -> str | None:
    """Why a local path is not pushed (a FIFO, socket, device, folder symlink, dangling
    link), or None for a regular file or a symlink to one. Never opens the path."""
    try:
        st = os.stat(path)  # follows a symlink to a file
    except OSError:
        return "a broken symlink"
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISDIR(st.st_mode):
        return "a symlink to a folder (not followed)"
    kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
    return kind + (" (through a symlink)" if os.path.islink(path) else "")


def plan_sources(sources: Iterable[str], dest: str, dest_is_dir: bool,
                 on_skip: Callable[[str, str], None] | None = None) -> list[tuple[str, str]]:
    """(local file, path in the revision) pairs for a push.

    One folder: its contents go under DEST. One file: to DEST, or DEST/name when
    DEST is empty or ends with '/'. Several sources: each goes to DEST/name.
    Symlinks to files are followed; FIFOs, sockets, devices and folder symlinks
    are skipped (never opened) and reported to `on_skip(path, why)`.
    """
    sources = list(sources)
    if not sources:
        raise InvalidAddressError("push needs at least one local file or folder")
    for s in sources:
        if not os.path.exists(s):
            raise PathNotFoundError(f"local path {s!r} does not exist: check the spelling")
    base = normalize_path(dest)
    dest_is_dir = dest_is_dir or not base
    pairs: list[tuple[str, str]] = []

    def join(*parts: str) -> str:
        return normalize_path("/".join(p for p in parts if p))

    def skip(path: str, why: str) -> None:
        if on_skip:
            on_skip(path, why)

    for s in sources:
        name = os.path.basename(os.path.normpath(s))
        if os.path.isdir(s):
            root = base if len(sources) == 1 else join(base, name)
            for dirpath, dirnames, filenames in os.walk(s):  # never follows folder symlinks: no loops
                dirnames.sort()
                rel = os.path.relpath(dirpath, s)
                for fn in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
                    local = os.path.join(dirpath, fn)
                    why = _special(local)
                    if why:
                        skip(local, why)
                    else:
                        pairs.append((local, join(root, "" if rel == "." else rel, fn)))
        elif why := _special(s):
            skip(s, why)
        elif len(sources) == 1 and not dest_is_dir:
            pairs.append((s, base))
        else:
            pairs.append((s, join(base, name)))
    if not pairs:
        raise InvalidAddressError("nothing to push: no regular files among the sources")
    dests = [d for _, d in pairs]
    if len(set(dests)) != len(dests):
        raise InvalidAddressError("two sources map to the same path in the repo: push them to different folders")
    return pairs


def _clash(paths: list[str]) -> InvalidAddressError:
    return InvalidAddressError(f"{sorted(paths)[0]!r} would be both a file and a folder: "
                               f"push to another path or remove one of them")


def is_url(location: str) -> bool:
    """True for an http(s):// server URL; False for a folder or an object store URL
    (s3://, memory://); any other `scheme://` is refused."""
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", location)
    if m and m.group(1).lower() not in ("http", "https", "s3", "memory"):
        raise InvalidAddressError(f"unsupported store scheme {m.group(1)}://: give a folder path, "
                                  f"an object store URL (s3://BUCKET/PREFIX), or a server URL "
                                  f"starting with http:// or https://")
    return bool(m) and not is_object_url(location)


class Store:
    """A cdcstore store: a local directory, or a server's http(s):// URL.

    `author` is who the commits it makes are by (default: git's user.name and user.email,
    else the OS user; a server with tokens records the token's name instead).
    `token` (default $CDCSTORE_TOKEN) authenticates to a server; `transport`
    options (timeout, retries, ...) go to `client.Transport`. Reads from a server
    go through the local dedup cache (`cache.ChunkCache`; default location under the
    user cache dir or $CDCSTORE_CACHE): pass a path or a `ChunkCache` to choose
    another, or `cache=False` to read without one.
    """

    backend: Backend
    author: str | None = None  # who commits are by; None: `default_author()` (a server with tokens: the token's)
    created = False  # this Store made its store (the default one, on first use)

    def __init__(self, location: str | None = None, *, token: str | None = None, create: bool | None = None,
                 cache: ChunkCache | str | bool = True, author: str | None = None, **transport):
        path = location or default_store_path()
        self._cache = None
        self.created = False  # this call made the store (the default one, on first use)
        self.author = check_author(author) if author is not None else None
        from .storage.cache import CachedBackend, open_cache

        if is_url(path):
            from .remote.client import RemoteStore

            remote = RemoteStore(path, token, **transport)
            self.backend = remote
            c = open_cache(cache) if cache is not False and cache is not None else None
            if c is not None:  # a cache that cannot be opened was warned about once
                self.backend = CachedBackend(remote, c, remote.t.token, owns_cache=c.owned)
                self._cache = c
        else:
            if create is None:  # the default store is created on first use
                create = location is None and not settings.STORE.is_set()
            if is_object_url(path):
                self.backend = open_repository(path, create=bool(create))
                c = open_cache(cache) if path.startswith("s3://") and cache is not False and cache is not None else None
                if c is not None:  # a bucket read directly shares the machine's dedup cache, as a server's reads do
                    self.backend = CachedBackend(self.backend, c, None, owns_cache=c.owned)
                    self._cache = c
            else:
                if create and not os.path.exists(os.path.join(path, "cdcstore.json")):
                    LocalStore.init(path, exist_ok=True)
                    self.created = True
                self.backend = LocalStore(path)
        self.location = self.backend.location

    @classmethod
    def over(cls, backend: Backend) -> "Store":
        """A `Store` over a backend already open (an in-memory store, a test's backend)."""
        store = cls.__new__(cls)
        store.backend, store._cache, store.location = backend, None, backend.location
        return store

    @classmethod
    def init(cls, location: str | None = None, create_bucket: bool = False) -> "Store":
        """Create an empty store; `create_bucket`: an `s3://` store's bucket too (if absent)."""
        location = location or default_store_path()  # $CDCSTORE_STORE may name a server too
        if is_url(location):
            raise InvalidAddressError(f"{location} is a server: a server's store is created on the server "
                                      f"(run `cdcstore init --store DIR` there, then `cdcstore serve`)")
        if create_bucket:
            if not location.startswith("s3://"):
                raise InvalidAddressError(f"--create-bucket is for an s3://BUCKET/PREFIX store, not {location}")
            from .storage.s3 import S3Objects

            S3Objects(location).create_bucket()
        if is_object_url(location):
            open_repository(location, create=True).close()
        else:
            LocalStore.init(location)
        return cls(location)

    # -- administration: on this machine for a directory or bucket, on a server's side for a URL --
    def _admin(self, command: str, **options):
        """Run a maintenance command where the store is (`roles.Upkeep.admin`): in this process
        for a directory or a bucket (`runs_here`), by the server's admin route for a URL
        (`remote_admin`: an admin token)."""
        inner = self.backend.uncached()
        if not (inner.capabilities.runs_here or inner.capabilities.remote_admin):
            raise InvalidAddressError(f"{command} works on a store directory, a bucket or a server, "
                                      f"not {self.location}")
        return inner.admin(command, **options)

    def _local(self, command: str, **options):
        """Run a command that works only where the store's objects are (`runs_here`)."""
        inner = self.backend.uncached()
        if not inner.capabilities.runs_here:
            raise InvalidAddressError(f"{command} works on a store directory or a bucket, not {self.location}: "
                                      f"run `cdcstore {command} --store DIR` on the server")
        return inner.admin(command, **options)

    def check(self, read_data: bool = False, subset: float | None = None) -> dict:
        """Verify the store (see `cdcstore check`): {"problems": [...], "packs", "chunks", ...}."""
        return self._admin("check", read_data=read_data, subset=subset)

    def rebuild_index(self, read_data: bool = False) -> dict:
        """Recreate the chunk index from the packs alone; copies known damaged stay out unless
        they verify now (`read_data`: verify every chunk first)."""
        return self._local("rebuild-index", read_data=read_data)

    def recover(self) -> int:
        """Index packs that are durable but were never indexed (a killed push); their count."""
        return self._local("recover")

    @property
    def cache(self) -> "ChunkCache | None":
        """The local dedup cache reads from a server go through (None for a local store)."""
        return self._cache

    @property
    def identity(self) -> str:
        """What tells this store from any other this machine reaches: the key of what a process
        keeps of it (heads, manifests: storage/meta.py)."""
        return self.backend.identity

    def repos(self) -> list[str]:
        return self.backend.repos()

    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        """(commit id, "branch" | "tag" | "commit") that `rev` names now."""
        return self.backend.resolve_ref(check_name("repo", repo), rev)

    def get_commit(self, repo: str, commit_id: str) -> Commit:
        return self.backend.get_commit(check_name("repo", repo), commit_id)

    def view(self, repo: str, commit: Commit) -> treeobj.View:
        """A commit's files, read folder by folder (`core.treeobj.View`: get, kind, listing,
        walk, under); the same for format 1 and format 2 commits."""
        return self.backend.view(check_name("repo", repo), commit)

    def manifest(self, repo: str, name: str) -> Manifest:
        """A file's manifest by name, as `repo` may read it."""
        return self.backend.get_manifest(name, repo)

    def reader(self, repo: str, manifest: Manifest, label: str = "", **options) -> FileReader:
        """A seekable file object over a manifest of `repo` (see `open` for an address)."""
        return FileReader(self.backend, manifest, label, repo, **options)

    def counters(self) -> dict:
        """Requests and bytes on the wire so far (zeros for a local store)."""
        return self.backend.counters()

    def cache_counters(self) -> dict:
        """Chunk reads the local dedup cache served (hits) and did not (misses) so far."""
        if self._cache is None:
            return {"cache_hits": 0, "cache_misses": 0}
        return self.backend.cache_counters()

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- revisions and refs (engine/history.py) -------------------------------------------
    @property
    def history(self) -> History:
        """Revisions and refs of this store (`engine.history.History`)."""
        return History(self.backend)

    def resolve(self, addr: str | Address) -> tuple[str, Commit]:
        """(commit id, commit) that an address's revision names."""
        return self.history.resolve(addr)

    def log(self, repo: str, rev: str = DEFAULT_BRANCH, limit: int | None = None,
            path: str | None = None) -> list[dict]:
        """Commits from `rev` back to the first, newest first; at most `limit`. With `path`,
        only the commits that changed the file or folder at `path`."""
        return self.history.log(repo, rev, limit, path)

    def replaced_paths(self, repo: str, commit: str, paths: list[str]) -> set[str]:
        """Which of `paths` the parent of `commit` already held (files a push replaced)."""
        return self.history.replaced_paths(repo, commit, paths)

    def diff(self, old: str | Address, new: str | Address) -> list[dict]:
        """Files added, removed and changed from revision `old` to `new` (addresses; a path
        narrows both), each with its bytes and `new_bytes`: the bytes of its chunks that `old`
        does not hold anywhere (what storing `new` after `old` costs for that file)."""
        return self.history.diff(old, new)

    def branches(self, repo: str) -> dict[str, str]:
        return self.history.branches(repo)

    def tags(self, repo: str) -> dict[str, str]:
        return self.history.tags(repo)

    def tag(self, repo: str, name: str, rev: str = DEFAULT_BRANCH) -> str:
        """Name the commit `rev` resolves to with a new tag, forever; returns the commit id."""
        return self.history.create_ref("tag", repo, name, rev)

    def delete_tag(self, repo: str, name: str) -> str:
        return self.history.delete_tag(repo, name)

    def create_branch(self, repo: str, name: str, rev: str = DEFAULT_BRANCH) -> str:
        """A new branch at the commit `rev` resolves to; returns the commit id."""
        return self.history.create_ref("branch", repo, name, rev)

    def delete_branch(self, repo: str, name: str) -> str:
        return self.history.delete_branch(repo, name)

    # -- writing -------------------------------------------------------------------------
    def push(self, sources: Iterable[str] | str, dest: str | Address, message: str = "",
             *, delete: bool = False, options: IngestOptions | None = None,
             progress: Callable[[int], None] | None = None,
             on_skip: Callable[[str, str], None] | None = None,
             include: Iterable[str] = (), exclude: Iterable[str] = (),
             stat_cache: bool = True, author: str | None = None) -> TransferResult:
        """Publish local files and folders as one new commit on DEST's branch.

        Files already in the branch and not pushed stay; with `delete=True`, files
        under DEST that are not among the sources are removed. Nothing changes
        when the push adds nothing new (no empty commits). FIFOs, sockets, devices
        and folder symlinks are skipped and reported to `on_skip(path, why)`.
        A file whose size, mtime, inode and ctime match the last push of it from this
        machine to this store is not read again when the store still holds its manifest
        (`storage/statcache.py`); `stat_cache=False` reads every file. `author`: who the
        commit is by (default: the Store's `author`; see `Store`).
        """
        a = _as_address(dest)
        if isinstance(sources, str):
            sources = [sources]
        pairs = plan_sources(sources, a.path, isinstance(dest, str) and dest.endswith("/"), on_skip)
        cut = len(tree.prefix_of(a.path))
        keep = (lambda p: tree.selected(p[cut:], include, exclude)) if include or exclude else None
        if keep:  # globs match the path below DEST; --delete removes only what they select
            pairs = [(f, p) for f, p in pairs if keep(p)]
        under = (a.path + "/" if a.path else "") if delete else None
        cache = StatCache() if stat_cache else None
        identity = self._identity()
        seen_ns = statcache.now_ns()  # before any stat: the racy-file reference (statcache.py)
        seen = {os.path.abspath(f): Seen.of(f, seen_ns) for f, _ in pairs}
        hits = cache.lookup(identity, {f: s for f, s in seen.items() if s is not None}) if cache else {}
        known = {p: hits[os.path.abspath(f)] for f, p in pairs if os.path.abspath(f) in hits}
        try:
            result = self.commit_files(a.repo, a.ref, pairs, message, remove_under=under, options=options,
                                       progress=progress, remove_filter=keep, known=known, author=author)
            if cache is not None:
                read = getattr(result, "_read", {})
                cache.record(identity, [(os.path.abspath(f), seen[os.path.abspath(f)], read[p]) for f, p in pairs
                                        if p in read and seen[os.path.abspath(f)] is not None])
            return result
        finally:
            if cache is not None:
                cache.close()

    def _identity(self) -> str:
        """The store's identity for caches on this machine: its location (a real path for a
        directory) and, for a bucket, the endpoint (two services may share a bucket name)."""
        inner = self.backend.uncached()
        loc = os.path.realpath(self.location) if os.path.isdir(self.location) else inner.identity
        return f"{type(inner).__name__}:{loc}"

    def _manifests_present(self, repo: str, names: list[str]) -> set[str]:
        """Which of these manifests the store holds, in one request to a server (protocol 1.5;
        an older server: none, so the files are read) or a look at each object here."""
        names = list(dict.fromkeys(names))
        return self.backend.uncached().manifests_present(repo, names) if names else set()

    def commit_files(self, repo: str, branch: str, pairs: list[tuple[str, str]], message: str = "",
                     **kw) -> TransferResult:
        """One commit on `branch` of `repo`: add (local file, path in repo) pairs and
        remove the paths in `remove` (each must exist); with `remove_under`, also
        remove every file under that prefix that is not being added. `entries` sets
        paths to stored files (manifests already in the store: a copy reads no data).
        Returns the landed commit (a rebased one if another writer moved the branch).
        `parent` bases the change on that commit instead of the branch head. `known` maps
        paths of `pairs` to the entries the stat cache vouches for: one whose manifest the
        store holds is used without reading the file.

        A commit refused because a chunk this machine's index listed is gone from the store
        (`MissingChunksError`: a gc elsewhere deleted its pack) is pushed again once, every file
        read: the refusal made the index forget that pack, so the chunks are sent this time."""
        try:
            return self._commit_files(repo, branch, pairs, message, **kw)
        except MissingChunksError:
            kw.pop("known", None)  # a file the stat cache vouched for may name the gone chunks
            return self._commit_files(repo, branch, pairs, message, **kw)

    def _commit_files(self, repo: str, branch: str, pairs: list[tuple[str, str]], message: str = "", *,
                      remove: Iterable[str] = (), remove_under: str | None = None,
                      entries: dict[str, FileEntry] | None = None, options: IngestOptions | None = None,
                      progress: Callable[[int], None] | None = None, parent: str | None = None,
                      remove_filter: Callable[[str], bool] | None = None,
                      known: dict[str, FileEntry] | None = None, author: str | None = None) -> TransferResult:
        t0, c0 = time.perf_counter(), self.counters()
        check_name("repo", repo)
        check_write_target(branch)
        author = check_author(author or self.author or default_author())  # before any work
        be = self.backend
        branches = be.branches(repo) if be.has_repo(repo) else {}
        if branches and branch not in branches and branch in be.tags(repo):
            raise InvalidAddressError(f"{branch!r} is a tag of repo {repo!r}: a tag is immutable: push to a branch")
        expected = branches.get(branch)
        if parent is not None:  # the change is made against PARENT; newer commits rebase it or conflict
            if expected is None:
                raise InvalidAddressError(f"branch {branch!r} of repo {repo!r} does not exist: "
                                          f"commit without parent= to create it")
            parent = expected = self.history.resolve_now(repo, parent)
        else:
            parent = expected or branches.get(DEFAULT_BRANCH)
        base = be.get_commit(repo, parent) if parent else None
        view = be.view(repo, base) if base else None
        removed: set[str] = set()
        for path in remove:
            p = normalize_path(path)
            if view is None or view.get(p) is None:
                raise no_such_path(repo, branch, path)
            removed.add(p)

        with self._push_session():  # a gc deletes nothing while this push is in flight
            # manifests the base names at the pushed paths are in the store (reachable): not re-put
            held = {e.manifest for e in (view.get(p) for _, p in pairs) if e is not None} if view is not None else set()
            unread = self._vouched(repo, known or {}, held)
            todo = [(f, p) for f, p in pairs if p not in unread]
            ingest, added, per_file = self._ingest(todo, options, progress, skip=held)
            read = dict(added)
            added.update(unread)
            per_file.update({p: {"bytes": e.size, "new_bytes": 0, "chunks": None, "chunking": "unchanged"}
                             for p, e in unread.items()})  # not read: the stat cache vouched for them
            if progress and unread:
                progress(sum(e.size for e in unread.values()))
            folder = (remove_under or "").rstrip("/")
            if remove_under is not None and view is not None and view.kind(folder) == "directory":
                adding = set(added)
                removed.update(p for p, _ in view.walk(folder) if p not in adding
                               and (remove_filter is None or remove_filter(p)))
            updates = dict(added)
            for path, entry in (entries or {}).items():
                updates[normalize_path(path)] = entry
            removed -= set(updates)
            updates = {p: e for p, e in updates.items() if view is None or view.get(p) != e}
            changed = base is None or bool(updates) or bool(removed) or expected is None
            commit_id = parent
            if changed:
                try:
                    commit = be.make_commit(repo, parent, message, time.time(), updates, removed, base=base,
                                            author=author)
                except treeobj.Clash as e:
                    raise _clash(e.paths) from None
                commit_id = be.commit(commit, branch, expected)
                meta.wrote(meta.identity(be.identity), repo, branch)  # the one invalidation rule (storage/meta.py)
        result = TransferResult(
            files=len(pairs), bytes=ingest.bytes + sum(e.size for e in unread.values()), new_bytes=ingest.new_bytes,
            stored_bytes=ingest.stored_bytes, pack_bytes=ingest.pack_bytes, seconds=time.perf_counter() - t0,
            commit=commit_id,
            chunks=ingest.chunks, new_chunks=ingest.new_chunks, changed=changed,
            files_detail=per_file, unread_files=len(unread), **self._wire(c0))
        result._read = read  # what was read, for the stat cache
        return result

    def _vouched(self, repo: str, known: dict[str, FileEntry], held: set[str]) -> dict[str, FileEntry]:
        """The stat cache's entries whose manifests the store holds: those the commit being
        built on names (reachable, so kept), and those one presence batch answers for."""
        ok = {p: e for p, e in known.items() if e.manifest in held}
        rest = {p: e for p, e in known.items() if p not in ok}
        if rest:
            present = self._manifests_present(repo, [e.manifest for e in rest.values()])
            ok.update({p: e for p, e in rest.items() if e.manifest in present})
        return ok

    def _push_session(self):
        """The marker of a push in flight, where the store is (a directory, a bucket, or a
        server's side): a gc deletes nothing while it is open."""
        return self.backend.uncached().push_session()

    def forget(self, repo: str, keep_last: int | None = None, keep_within: float | None = None,
               keep_tags: bool = False, dry_run: bool = False) -> dict:
        """Retention: forget the commits of `repo` that no rule keeps (the `keep_last` newest of
        each branch, those younger than `keep_within` seconds, tagged ones with `keep_tags`,
        and every branch head). Forgotten commits stay in the log; `gc` frees their files."""
        repo = check_name("repo", repo)
        return self._admin("forget", repo=repo, keep_last=keep_last, keep_within=keep_within, keep_tags=keep_tags,
                           dry_run=dry_run)

    def delete_repo(self, repo: str, dry_run: bool = False) -> dict:
        """Remove a repo and its history (gc then frees the data only it used)."""
        repo = check_name("repo", repo)
        return self._admin("delete-repo", repo=repo, dry_run=dry_run)

    def gc(self, grace: float = DEFAULT_GRACE, dry_run: bool = False, repack_dead: float = DEFAULT_REPACK_DEAD,
           max_unused: float | None = DEFAULT_MAX_UNUSED) -> dict:
        """Delete what no branch or tag reaches and is older than `grace` seconds, and rewrite
        packs more than `repack_dead` dead, then the most dead ones until the dead bytes left are
        at most `max_unused` of the live ones (see `storage.maintenance`); with `dry_run`, only
        report the plan. On a server, its admin route runs it (an admin token)."""
        return self._admin("gc", grace=grace, dry_run=dry_run, repack_dead=repack_dead, max_unused=max_unused)

    def _ingest(self, pairs: list[tuple[str, str]], options: IngestOptions | None,
                progress: Callable[[int], None] | None,
                skip: set[str] = frozenset()) -> tuple[Ingest, dict[str, FileEntry], dict]:
        """Store the files' chunks (durable) and then their manifests: (ingest, path ->
        entry, per-file detail). Nothing is committed. Manifests named in `skip` (the store
        holds them: the commit being built on names them) are not stored again."""
        ingest = Ingest(self.backend, options, progress)
        try:
            manifests = list(zip([p for _, p in pairs], ingest.add_files(pairs)))
            ingest.finish()
        finally:
            ingest.close()
        per_file = {path: {"bytes": m.size, "new_bytes": ingest.file_new[path], "chunks": len(m.chunk_ids),
                           "chunking": ingest.file_mode[path]} for path, m in manifests}
        names = [ids.hexdigest(m.encode()) for _, m in manifests]
        todo = {n: m for (_, m), n in zip(manifests, names) if n not in skip}
        if todo:  # only after their chunks are durable
            stored = self.backend.put_manifests(list(todo.values()))
            if stored != list(todo):
                raise CorruptionError("the store named the manifests differently than their hashes")
        added = {path: FileEntry(name, m.size) for (path, m), name in zip(manifests, names)}
        return ingest, added, per_file

    # -- many writers, one commit --------------------------------------------------------------
    def upload(self, sources: Iterable[str] | str, dest: str | Address, *, options: IngestOptions | None = None,
               progress: Callable[[int], None] | None = None,
               on_skip: Callable[[str, str], None] | None = None) -> dict[str, FileEntry]:
        """Store local files (chunks, then manifests) WITHOUT committing them: returns
        {path in the repo: FileEntry}, small picklable records that `commit_entries`
        publishes later, in any process. Paths are planned as for `push` (DEST's revision
        is ignored). Uploaded but never committed data is invisible to readers."""
        a = _as_address(dest)
        check_name("repo", a.repo)
        if isinstance(sources, str):
            sources = [sources]
        pairs = plan_sources(sources, a.path, isinstance(dest, str) and dest.endswith("/"), on_skip)
        with self._push_session():  # a gc deletes nothing while chunks are being deduplicated against
            return self._ingest(pairs, options, progress)[1]

    def commit_entries(self, dest: str | Address, entries: dict[str, FileEntry] | Iterable[dict[str, FileEntry]],
                       message: str = "", *, parent: str | None = None, remove: Iterable[str] = (),
                       remove_under: str | None = None) -> TransferResult:
        """ONE commit on DEST's branch setting every path of `entries` (from `upload`,
        one dict or a list of them, e.g. one per worker) to its stored file; `remove`
        and `remove_under` as in `commit_files`. Every entry is checked first: its
        manifest must be in this store and its size must match (a server checks it too).
        With `parent` (a commit id), the change is made against that commit and lands
        on the branch only if the branch's newer commits touch other paths (else
        ConflictError); by default it is made against the branch head."""
        a = _as_address(dest)
        merged = _merge_entries(entries)
        self._check_entries(a.repo, merged)
        return self.commit_files(a.repo, a.ref, [], message or f"commit {len(merged)} uploaded files",
                                 remove=remove, remove_under=remove_under, entries=merged, parent=parent)

    # -- job journals: upload first, commit once (storage/staging.py, writers.py) ------------------
    def journal(self):
        """The journal role where the store is: its objects (a directory, a bucket) or a server's
        job routes (protocol 1.5). Methods: open, add, batches, close (repo, job id)."""
        return self.backend.uncached().journal()

    def stage(self, repo: str, job: str, pairs: list[tuple[str, str]] = (), *,
              entries: dict[str, FileEntry] | None = None, remove: Iterable[str] = (),
              options: IngestOptions | None = None) -> dict[str, FileEntry]:
        """Upload (local file, path) pairs and add them, with `entries` (stored files) and
        `remove` (paths), to job `job` of `repo` as ONE journal entry object; no commit.
        The entry is written inside the push session, so gc never sees the manifests
        unprotected (young while uploading, named by a live job after). Returns the entries."""
        check_name("repo", repo)
        staging.check_job(job)
        batch: dict[str, FileEntry | None] = {normalize_path(p): None for p in remove}
        with self._push_session():
            added = self._ingest(list(pairs), options, None)[1] if pairs else {}
            batch.update({normalize_path(p): e for p, e in (entries or {}).items()})
            batch.update(added)
            if batch:
                self.journal().add(repo, job, batch)
        return {p: e for p, e in batch.items() if e is not None}

    def land(self, dest: str | Address, job: str, message: str = "", *, parent: str | None = None,
             exclusive: Iterable[str] = ()) -> "TransferResult | None":
        """Land job `job` on DEST's branch as ONE commit (made against `parent`, rebased onto newer
        commits that touch other paths) and close the job; None when it holds nothing. The job
        is closed whether it lands or fails. Two different entries for one path are refused."""
        a = _as_address(dest)
        journal = self.journal()
        try:
            files, removed = staging.merge(journal.batches(a.repo, job))
            if not files and not removed:
                return None
            taken = [p for p in exclusive if p in files]
            if taken and self.backend.has_repo(a.repo):
                head = self.backend.uncached().branches(a.repo).get(a.ref)
                now = self.get_commit(a.repo, head).files if head else {}
                if any(p in now for p in taken):
                    raise FileExistsError(f"cdc://{a.repo}@{a.ref}/{next(p for p in taken if p in now)} exists "
                                          f"(mode 'xb'): nothing was committed")
            if files:
                self._check_entries(a.repo, files)
            names = sorted(files) or removed
            message = message or f"write {len(files)} files: {', '.join(names[:3])}" + (" ..." if len(names) > 3 else "")
            return self.commit_files(a.repo, a.ref, [], message, remove=removed, entries=files, parent=parent)
        finally:
            journal.close(a.repo, job)

    def _check_entries(self, repo: str, entries: dict[str, FileEntry]) -> None:
        """Each entry names a manifest this store holds, of the entry's size. A server
        checks this itself when it receives the commit (uncommitted manifests are not
        readable through a repo), so only local and object stores are read here."""
        inner = self.backend.uncached()
        if not inner.capabilities.runs_here:
            return
        sizes: dict[str, set[int]] = {}
        for path, e in entries.items():
            sizes.setdefault(e.manifest, set()).add(e.size)
        def fetch(name):
            try:
                return inner.get_manifest(name)
            except (CdcError, OSError):
                return None

        names = list(sizes)
        found = map(fetch, names) if len(names) <= 4 else runtime.pool("io", 8).map(fetch, names)
        for name, m in zip(names, list(found)):
            wanted = sizes[name]
            if m is None:
                path = next(p for p, e in entries.items() if e.manifest == name)
                raise InvalidAddressError(f"{path!r}: manifest {name} is not in the store {self.location}: "
                                          f"upload the file to this store first (Store.upload)")
            if wanted != {m.size}:
                path = next(p for p, e in entries.items() if e.manifest == name and e.size != m.size)
                raise InvalidAddressError(f"{path!r}: the entry says {entries[path].size} bytes but manifest "
                                          f"{name} holds {m.size}: pass the entries `upload` returned, unchanged")

    def remove(self, addr: str | Address, recursive: bool = False, message: str = "") -> TransferResult:
        """A commit without a file, or (recursive) without a folder."""
        a = _as_address(addr)
        _, view, found = self._entries(a)
        if not recursive and view.get(a.path) is None:
            raise IsADirectoryError(f"{a} is a folder: remove it with recursive=True")
        return self.commit_files(a.repo, a.ref, [], message or f"remove {a.path}", remove=list(found))

    def copy(self, src: str | Address, dst: str | Address, message: str = "") -> TransferResult:
        """A commit on DST's branch holding SRC's file (or folder) at DST, made from
        SRC's manifests: no data is read or written. DST may be in another repo."""
        s, d = _as_address(src), _as_address(dst)
        _, view, found = self._entries(s)
        if view.get(s.path) is not None:
            entries = {d.path: found[s.path]}
        else:
            cut = len(s.path) + 1 if s.path else 0
            entries = {"/".join(q for q in (d.path, p[cut:]) if q): f for p, f in found.items()}
        if not all(entries):
            raise InvalidAddressError(f"copy {s} to a file path, not to the root of {d.repo}")
        return self.commit_files(d.repo, d.ref, [], message or f"copy {s} to {d}", entries=entries)

    # -- reading -------------------------------------------------------------------------
    def _view(self, a: Address) -> tuple[str, treeobj.View]:
        """The commit a.ref names and its files; PathNotFoundError if nothing is at a.path
        (reads only the trees on the path)."""
        cid, commit = self.resolve(a)
        view = self.backend.view(a.repo, commit)
        if a.path and view.kind(a.path) is None:
            raise no_such_path(a.repo, a.ref, a.path)
        return cid, view

    def _entries(self, a: Address) -> tuple[str, treeobj.View, dict[str, FileEntry]]:
        """The files at or under a.path, keyed by their full path."""
        cid, view = self._view(a)
        return cid, view, view.under(a.path)

    def ls(self, addr: str | Address, recursive: bool = False) -> list[dict]:
        """Entries under an address: {"name", "type": "file"|"directory", "size"}. Reads the
        trees on the path only (and every tree below when `recursive`)."""
        a = _as_address(addr)
        _, view = self._view(a)
        return view.listing(a.path, recursive)

    def open(self, addr: str | Address) -> FileReader:
        a = _as_address(addr)
        _, view = self._view(a)
        entry = view.get(a.path)
        if entry is None:
            if view.kind(a.path) == "directory":
                raise IsADirectoryError(f"{a} is a folder: open a file in it (see `cdcstore ls {a}`)")
            raise no_such_path(a.repo, a.ref, a.path)
        m, locations = self.backend.get_manifest_located(entry.manifest, a.repo)  # a server: one round trip
        return FileReader(self.backend, m, str(a), a.repo, locations=locations)

    def cat(self, addr: str | Address) -> bytes:
        with self.open(addr) as f:
            return f.read()

    def pull(self, addr: str | Address, local: str,
             progress: Callable[[int], None] | None = None,
             include: Iterable[str] = (), exclude: Iterable[str] = ()) -> "PullResult":
        """Write a file or folder of a revision to local disk, atomically per file.

        A local file that already has the same content is left alone. LOCAL ending
        in '/' (or an existing folder) receives a single file by its name. Every
        target must stay inside LOCAL (no '..', absolute paths or symlinked folders
        leading out), and an existing symlink, FIFO or device is refused, never replaced.
        `include`/`exclude` globs pick files of a folder by their path below it.
        """
        t0, c0 = time.perf_counter(), self.counters()
        a = _as_address(addr)
        cid, view, found = self._entries(a)
        done = pull_files(self.backend, a.repo, a.path, found, view.get(a.path) is not None, local, progress,
                          include, exclude)
        return PullResult(**done, seconds=time.perf_counter() - t0, commit=cid, **self._wire(c0))

    def _wire(self, before: dict) -> dict:
        now = self.counters()
        return {k: now[k] - before[k] for k in ("sent_bytes", "received_bytes", "requests")}

    # -- housekeeping ------------------------------------------------------------------------
    def stats(self, addr: str | Address | None = None) -> dict:
        """Store totals, or what one revision holds and what it added over its parent.

        For a revision: `bytes` is its logical size, `new_bytes` the raw bytes of
        chunks it has that its parent lacks, `stored_bytes` their records' size in packs
        (compressed, without pack framing: what a push of them reports as `stored_bytes`).
        For the store: `bytes` sums the branch heads, `new_bytes` is the raw size of
        every unique chunk kept, `stored_bytes` the size of their records and `pack_bytes`
        the bytes of all pack files (records, headers, indexes, trailers); `history_bytes`
        sums every version branches and tags reach (`versions` of them), and `dedup_ratio`
        is that over the pack bytes: what keeping all of history costs against full copies.
        A server token limited to some repos sees only what they reach: the chunks' totals
        (`stored_bytes` is then their stored size), and `hidden` names what it may not see
        (`packs`, `pack_bytes`: packs are shared with other repos).
        """
        be = self.backend
        t0 = time.perf_counter()
        totals = be.totals()
        out: dict = {"store": self.location, "repos": len(be.repos()), **totals}
        if addr is not None:
            a = _as_address(addr)
            cid, view, found = self._entries(a)
            commit = be.get_commit(a.repo, cid)
            chunks = self._chunk_sizes(found.values(), a.repo)
            parent = {}
            if commit.parent:
                pview = be.view(a.repo, be.get_commit(a.repo, commit.parent))
                parent = self._chunk_sizes(pview.under(a.path).values(), a.repo)
            new = [c for c in chunks if c not in parent]
            out.update({"commit": cid, "files": len(found), "bytes": sum(f.size for f in found.values()),
                        "unique_bytes": sum(chunks.values()), "new_bytes": sum(chunks[c] for c in new),
                        "stored_bytes": sum(e.stored_len for _, e in be.locate(new, a.repo).values())})
        else:
            heads = [(r, c) for r in be.repos() for c in set(be.branches(r).values())]
            files = bytes_ = 0
            for repo, cid in heads:
                view = be.view(repo, be.get_commit(repo, cid))
                files += view.file_count()
                bytes_ += view.size()
            versions = history = 0
            for r in be.repos():  # every version the store keeps: what storing each in full would take
                seen: set[str] = set()
                forgotten = self.history.forgotten(r) or set()
                for head in set(be.branches(r).values()) | set(be.tags(r).values()):
                    for cid, c in be.log(r, head):
                        if cid in seen:
                            break
                        seen.add(cid)
                        if cid in forgotten:
                            continue  # history only: its files are not kept
                        try:
                            history += be.view(r, c).size()
                        except CdcError:
                            if not self.history.was_forgotten(r, cid):
                                raise
                            forgotten.add(cid)
                versions += len(seen - forgotten)
            # a token limited to some repos sees the chunks they reach, not the store's packs
            hidden = [k for k in ("packs", "pack_bytes") if k not in totals]
            stored = totals["chunk_stored_bytes"] if hidden else totals["pack_bytes"]
            out.update({"commit": None, "files": files, "bytes": bytes_,
                        "new_bytes": totals["chunk_raw_bytes"], "stored_bytes": totals["chunk_stored_bytes"],
                        "versions": versions, "history_bytes": history,
                        "dedup_ratio": history / stored if stored else 0.0})
            if hidden:
                out["hidden"] = hidden
        out["seconds"] = time.perf_counter() - t0
        return out

    def _chunk_sizes(self, entries, repo: str) -> dict[bytes, int]:
        sizes: dict[bytes, int] = {}
        for f in entries:
            m = self.backend.get_manifest(f.manifest, repo)
            sizes.update(zip(m.chunk_ids, m.lengths))
        return sizes


def _merge_entries(entries) -> dict[str, FileEntry]:
    """One {path: FileEntry} from a dict or a list of dicts (one per worker); a path
    given two different entries is refused."""
    parts = [entries] if isinstance(entries, dict) else list(entries)
    merged: dict[str, FileEntry] = {}
    for part in parts:
        if not isinstance(part, dict):
            raise InvalidAddressError(f"entries must be dicts {{path: FileEntry}} as Store.upload returns, "
                                      f"not {type(part).__name__}")
        for path, e in part.items():
            if not isinstance(e, FileEntry) or not ids.is_hex_id(str(e.manifest)) or \
                    not isinstance(e.size, int) or e.size < 0:
                raise InvalidAddressError(f"entry for {path!r} is not a FileEntry(manifest id, size) as "
                                          f"Store.upload returns: {e!r}")
            key = normalize_path(path)
            if not key:
                raise InvalidAddressError("an entry names the repo root: give each file a path")
            if merged.get(key, e) != e:
                raise InvalidAddressError(f"two workers uploaded different files to {key!r}: "
                                          f"give each worker its own paths")
            merged[key] = e
    if not merged:
        raise InvalidAddressError("no entries to commit: upload files first (Store.upload)")
    return merged

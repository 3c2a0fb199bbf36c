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
from typing import Callable, Iterable, Sequence

import platformdirs

from . import settings
from .core import filemap
from .core import ids, treeobj
from .core.address import DEFAULT_BRANCH, Address, check_name, normalize_path
from .core.commit import MAX_AUTHOR, Commit, FileEntry
from .core.errors import InvalidAddressError, PathNotFoundError
from .core.manifest import Manifest
from .engine.commits import Commits, TransferResult, check_author, wire_since
from .engine.groups import GroupCommits  # noqa: F401 (the faces' group commit: publish.py, fs.py)
from .engine.history import History, as_address as _as_address
from .engine.ingest import IngestOptions, Prehashed
from .engine.prechunk import Prechunk
from .engine.pull import PULL_LOCATE_CHUNKS, check_replaceable, pull_files  # noqa: F401 (check_replaceable: fs.py's)
from .engine.stats import stats as stats_of
from .storage import memo  # meta: the process's heads and objects (fs.py uses it through here)
from .storage.backend import Backend
from .storage.cache import ChunkCache, parse_size  # noqa: F401 (the cache's public names)
from .storage.maintenance import DEFAULT_GRACE, DEFAULT_MAX_UNUSED, DEFAULT_REPACK_DEAD
from .storage.reader import FileReader, PositionedFile, filesystem_made, handed_to_arrow  # noqa: F401 (fs.py's, sources')
from .storage.roles import Located
from .storage.repository import LocalStore, is_object_url, no_such_path, open_repository


ENV_STORE = settings.STORE.name


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


def is_url(location: str) -> bool:
    """True for an http(s):// server URL; False for a folder or an object store URL
    (s3://, memory://); any other `scheme://` is refused."""
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", location)
    if m and m.group(1).lower() not in ("http", "https", "s3", "memory"):
        raise InvalidAddressError(f"unsupported store scheme {m.group(1)}://: give a folder path, "
                                  f"an object store URL (s3://BUCKET/PREFIX), or a server URL "
                                  f"starting with http:// or https://")
    return bool(m) and not is_object_url(location)


def _open(location: str | None, token: str | None, create: bool | None, cache, transport: dict):
    """(backend, cache, created) for a `Store` over `location`: a server or a bucket read through the
    machine's dedup cache (None when off or when it cannot be opened: warned about once), or a
    directory; `created`: this call made the store (the default one, on first use)."""
    path = location or default_store_path()
    from .storage.cache import CachedBackend, open_cache

    if is_url(path):
        from .remote.client.store import RemoteStore

        remote = RemoteStore(path, token, **transport)
        c = open_cache(cache) if cache is not False and cache is not None else None
        return (remote, None, False) if c is None else \
            (CachedBackend(remote, c, remote.t.token, owns_cache=c.owned), c, False)
    if create is None:  # the default store is created on first use
        create = location is None and not settings.STORE.is_set()
    if is_object_url(path):
        backend = open_repository(path, create=bool(create))
        c = open_cache(cache) if path.startswith("s3://") and cache is not False and cache is not None else None
        if c is None:
            return backend, None, False
        return CachedBackend(backend, c, None, owns_cache=c.owned), c, False  # shared as a server's reads share it
    created = bool(create) and not os.path.exists(os.path.join(path, "cdcstore.json"))
    if created:
        LocalStore.init(path, exist_ok=True)
    return LocalStore(path), None, created


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
        self.author = check_author(author) if author is not None else None
        self.backend, self._cache, self.created = _open(location, token, create, cache, transport)
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
        keeps of it (heads, manifests: storage/memo.py)."""
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

    def delete_branch(self, repo: str, name: str, force: bool = False) -> str:
        """Remove a branch; the default branch (`main`) only with `force`. Returns the commit it named."""
        return self.history.delete_branch(repo, name, force)

    # -- writing (engine/commits.py) ------------------------------------------------------
    @property
    def commits(self) -> Commits:
        """The write path of this store (`engine.commits.Commits`): ingest, check, commit, land."""
        return Commits(self.backend, self.location, lambda: self.author or default_author())

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
        cut = len(filemap.prefix_of(a.path))
        keep = (lambda p: filemap.selected(p[cut:], include, exclude)) if include or exclude else None
        if keep:  # globs match the path below DEST; --delete removes only what they select
            pairs = [(f, p) for f, p in pairs if keep(p)]
        return self.commits.push(a, pairs, message, delete=delete, keep=keep, stat_cache=stat_cache,
                                 options=options, progress=progress, author=author)

    def commit_files(self, repo: str, branch: str, pairs: list[tuple[str, str]], message: str = "",
                     **kw) -> TransferResult:
        """One commit on `branch` of `repo`: add (local file, path in repo) pairs and
        remove the paths in `remove` (each must exist); with `remove_under`, also
        remove every file under that prefix that is not being added. `entries` sets
        paths to stored files (manifests already in the store: a copy reads no data).
        Returns the landed commit (a rebased one if another writer moved the branch).
        `parent` bases the change on that commit instead of the branch head (a branch that does
        not exist yet is made from it). `known` maps
        paths of `pairs` to the entries the stat cache vouches for: one whose manifest the
        store holds is used without reading the file.

        A commit refused because a chunk this machine's index listed is gone from the store
        (`MissingChunksError`: a gc elsewhere deleted its pack) is pushed again once, every file
        read: the refusal made the index forget that pack, so the chunks are sent this time."""
        return self.commits.commit_files(repo, branch, pairs, message, **kw)

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

    # -- many writers, one commit --------------------------------------------------------------
    def upload(self, sources: Iterable[str] | str, dest: str | Address, *, options: IngestOptions | None = None,
               progress: Callable[[int], None] | None = None,
               on_skip: Callable[[str, str], None] | None = None,
               prehashed: Prehashed | None = None) -> dict[str, FileEntry]:
        """Store local files (chunks, then manifests) WITHOUT committing them: returns
        {path in the repo: FileEntry}, small picklable records that `commit_entries`
        publishes later, in any process. Paths are planned as for `push` (DEST's revision
        is ignored). Uploaded but never committed data is invisible to readers.
        `prehashed` (one source only): what `prechunk(...).finish()` gave for these very bytes."""
        a = _as_address(dest)
        check_name("repo", a.repo)
        if isinstance(sources, str):
            sources = [sources]
        pairs = plan_sources(sources, a.path, isinstance(dest, str) and dest.endswith("/"), on_skip)
        if prehashed is not None and len(pairs) != 1:
            raise InvalidAddressError(f"prehashed chunks are of one file, not of {len(pairs)}: upload it alone")
        return self.commits.upload(pairs, options, progress, {pairs[0][1]: prehashed} if prehashed else None)

    def prechunk(self, path: str = "upload") -> Prechunk:
        """A file that arrives in order (a multipart upload's parts): `append` each piece,
        `advance` to chunk, hash and store what is final of it so far, then `finish` and
        `upload(pre.path, ..., prehashed=...)`: only chunks cut otherwise are hashed then
        (engine/prechunk.py). `close` it after."""
        return Prechunk(self.backend, key=path)

    def commit_entries(self, dest: str | Address, entries: dict[str, FileEntry] | Iterable[dict[str, FileEntry]],
                       message: str = "", *, parent: str | None = None, remove: Iterable[str] = (),
                       remove_under: str | None = None) -> TransferResult:
        """ONE commit on DEST's branch setting every path of `entries` (from `upload`,
        one dict or a list of them, e.g. one per worker) to its stored file; `remove`
        and `remove_under` as in `commit_files`. Every entry is checked first: its
        manifest must be in this store and its size must match (a server checks it too).
        With `parent` (a commit id), the change is made against that commit and lands
        on the branch only if the branch's newer commits touch other paths (else
        ConflictError); a branch that does not exist yet is made from `parent`. By default
        it is made against the branch head."""
        a = _as_address(dest)
        merged = _merge_entries(entries)
        self.commits.check_entries(a.repo, merged)
        return self.commit_files(a.repo, a.ref, [], message or f"commit {len(merged)} uploaded files",
                                 remove=remove, remove_under=remove_under, entries=merged, parent=parent)

    # -- job journals: upload first, commit once (storage/staging.py, writers.py) ------------------
    def journal(self):
        """The journal role where the store is: its objects (a directory, a bucket) or a server's
        job routes (protocol 1.5). Methods: open, add, batches, close (repo, job id)."""
        return self.commits.journal()

    def stage(self, repo: str, job: str, pairs: Sequence[tuple[str, str]] = (), *,
              entries: dict[str, FileEntry] | None = None, remove: Iterable[str] = (),
              options: IngestOptions | None = None) -> dict[str, FileEntry]:
        """Upload (local file, path) pairs and add them, with `entries` (stored files) and
        `remove` (paths), to job `job` of `repo` as ONE journal entry object; no commit.
        The entry is written inside the push session, so gc never sees the manifests
        unprotected (young while uploading, named by a live job after). Returns the entries."""
        return self.commits.stage(repo, job, pairs, entries, remove, options)

    def land(self, dest: str | Address, job: str, message: str = "", *, parent: str | None = None,
             exclusive: Iterable[str] = ()) -> "TransferResult | None":
        """Land job `job` on DEST's branch as ONE commit (made against `parent`, rebased onto newer
        commits that touch other paths) and close the job; None when it holds nothing. The job
        is closed whether it lands or fails. Two different entries for one path are refused."""
        return self.commits.land(_as_address(dest), job, message, parent, exclusive)

    def remove(self, addr: str | Address, recursive: bool = False, message: str = "") -> TransferResult:
        """A commit without a file, or (recursive) without a folder."""
        return self.commits.remove(_as_address(addr), recursive, message)

    def copy(self, src: str | Address, dst: str | Address, message: str = "") -> TransferResult:
        """A commit on DST's branch holding SRC's file (or folder) at DST, made from
        SRC's manifests: no data is read or written. DST may be in another repo."""
        return self.commits.copy(_as_address(src), _as_address(dst), message)

    # -- reading -------------------------------------------------------------------------
    def ls(self, addr: str | Address, recursive: bool = False) -> list[dict]:
        """Entries under an address: {"name", "type": "file"|"directory", "size"}. Reads the
        trees on the path only (and every tree below when `recursive`)."""
        a = _as_address(addr)
        _, view = self.history.at(a)
        return view.listing(a.path, recursive)

    def open(self, addr: str | Address, *, readahead: bool = True) -> FileReader:
        """A file object for a file of a revision. `readahead=False`: it fetches only the bytes
        read (for a caller that reads exactly the ranges it needs, such as a stream's `Warmer`),
        never ahead of a run of back-to-back reads."""
        a = _as_address(addr)
        return self.open_entry(a.repo, self._file_entry(a), str(a), readahead=readahead)

    def open_many(self, addrs: Sequence[str | Address], tail: int = 0) -> list[FileReader]:
        """`open` of each address, in order. On a server their manifests, and where their chunks
        are, come together (a request per 1,024 files, not one each); with `tail`, and a chunk
        cache, so do the chunks of each file's last `tail` bytes (verified, into the cache): reading
        every file's end (a Parquet footer: the stream asks `tail` 8, the chunk that holds it) then
        costs no request."""
        found = [(a, self._file_entry(a)) for a in map(_as_address, addrs)]
        located: dict[str, dict[str, tuple[Manifest, Located]]] = {}
        for repo in dict.fromkeys(a.repo for a, _ in found):
            names = [e.manifest for a, e in found if a.repo == repo]
            located[repo] = self.backend.get_manifests_located(names, repo, tail)
        readers = []
        for a, e in found:
            m, locations = located[a.repo][e.manifest]
            readers.append(FileReader(self.backend, m, str(a), a.repo, locations=locations))
        return readers

    def _file_entry(self, a: Address) -> FileEntry:
        """The file entry at address `a` (IsADirectoryError for a folder, else PathNotFoundError)."""
        _, view = self.history.at(a)
        entry = view.get(a.path)
        if entry is None:
            if view.kind(a.path) == "directory":
                raise IsADirectoryError(f"{a} is a folder: open a file in it (see `cdcstore ls {a}`)")
            raise no_such_path(a.repo, a.ref, a.path)
        return entry

    def open_entry(self, repo: str, entry: FileEntry, label: str = "", *, readahead: bool = True) -> FileReader:
        """A file object for a file entry of a commit of `repo` (from `view(...).get(path)`): its
        manifest and where its chunks are, in one round trip on a server. `readahead`: as in `open`."""
        m, locations = self.backend.get_manifest_located(entry.manifest, repo)
        if not readahead:
            return FileReader(self.backend, m, label, repo, locations=locations, readahead_bytes=0)
        return FileReader(self.backend, m, label, repo, locations=locations)

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
        cid, view, found = self.history.files(a)
        done = pull_files(self.backend, a.repo, a.path, found, view.get(a.path) is not None, local, progress,
                          include, exclude)
        return PullResult(**done, seconds=time.perf_counter() - t0, commit=cid, **wire_since(self.backend, c0))

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
        return stats_of(self.backend, self.location, addr)


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

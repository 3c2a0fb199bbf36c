"""`cdc://` as an fsspec filesystem, so pandas, pyarrow, duckdb, dask and datasets read it.

    fs = fsspec.filesystem("cdc", store="http://host:8470", token="...")
    pd.read_parquet("cdc://imagenet@v3/train/part-0.parquet", storage_options={"store": ...})

Paths are `REPO[@REV]/PATH`. A branch resolves to a commit once per filesystem
instance and the commit's listing is kept (commits are immutable), so listing,
`info`, `glob` and `find` cost no further requests; a pickled instance carries the
resolved commits to its workers. A branch is resolved again after `head_ttl`
seconds (default 5, as the process's heads: storage/memo.py; commit ids and tags never
expire), so a long-lived instance sees new pushes; a write through this process is
seen at once, and heads are kept per store (a server restarted over another store on
the same URL is not taken for the old one). Writes (`open("wb"/"xb")`, `put`, `pipe`), `copy`, `mv` and `rm` are
commits; `put` of a folder is one commit, and inside `fs.transaction` everything
becomes one commit per branch. A commit that touches other paths than a
concurrent writer's lands on top of it (rebased); only overlapping paths conflict.
With `stage={"repo@branch": JOB_ID}` (from `writers.deferred_commit`), writes to that
branch are uploaded and added to the job's journal instead of committed, so many
processes' writes land as one commit at the end (a transaction there adds ONE entry).
"""
from __future__ import annotations
import contextlib

import io
import os
import tempfile
import time
import warnings
from typing import TYPE_CHECKING

from fsspec import AbstractFileSystem
from fsspec.transaction import Transaction

from . import runtime
from .api import GroupCommits, Store, check_replaceable, filesystem_made, memo
from .core import filemap
from .core.address import SCHEME, Address, check_write_target, parse
from .core.commit import FileEntry
from .core.errors import InvalidAddressError

if TYPE_CHECKING:
    import collections


class CdcTransaction(Transaction):
    """Deferred writes of a transaction become one commit per (repo, branch)."""

    fs: CdcFileSystem | None  # fsspec's (None once complete)
    files: collections.deque[CdcWriteFile | _Pending]

    def complete(self, commit: bool = True) -> None:
        fs = self.fs
        if fs is None:
            raise AttributeError("the transaction is complete already: it has no filesystem")
        files, self.files = list(self.files), type(self.files)()
        try:
            if commit:
                fs._commit_writes(files)
        finally:
            for f in files:
                f.discard()
            fs._intrans = False
            fs._transaction = None
            self.fs = None


WRITE_PREFIX = "cdcstore-write-"  # + "<pid>-": a file being written, removable once that pid is gone
_SWEPT = runtime.Local()


def _sweep_write_temps() -> bool:
    runtime.clean_dead_temps(tempfile.gettempdir(),
                     lambda n: n[len(WRITE_PREFIX):].split("-", 1)[0] if n.startswith(WRITE_PREFIX) else "")
    return True


class CdcWriteFile(io.RawIOBase):
    """A file being written: bytes go to a local temp file; `close` commits it
    (or hands it to the open transaction)."""

    def __init__(self, fs: "CdcFileSystem", path: str, autocommit: bool = True, exclusive: bool = False):
        super().__init__()
        self.fs = fs
        self.path = path
        self.exclusive = exclusive  # "xb": fail if the path exists when the commit is made
        self.autocommit = autocommit  # False inside a transaction (fsspec registers the file)
        self.address = fs._address(path)
        if not self.address.path:
            raise IsADirectoryError(f"{SCHEME}{path} names a repo, not a file")
        check_write_target(self.address.ref)  # before any byte is written
        _SWEPT.get(_sweep_write_temps)  # once per process: temp files of writers that were killed
        fd, self.tmp = tempfile.mkstemp(prefix=f"{WRITE_PREFIX}{os.getpid()}-")
        self._f = os.fdopen(fd, "wb")

    def writable(self) -> bool:
        return True

    def __exit__(self, exc_type, *rest) -> None:
        if exc_type is not None:  # an error inside `with`: nothing is committed
            self.autocommit = False
            self.fs._forget_pending(self)
            try:
                self.close()
            finally:
                self.discard()
            return
        self.close()

    def write(self, data) -> int:
        return self._f.write(data)

    def close(self) -> None:
        if self.closed:
            return
        self._f.close()
        super().close()
        if self.autocommit:
            try:
                self.fs._commit_writes([self])
            finally:
                self.discard()

    def commit(self) -> None:
        self.fs._commit_writes([self])

    def __del__(self) -> None:
        """Dropped without `close` (e.g. after an exception, outside `with`): nothing is
        committed, whatever was written; only `close` or `with` commits."""
        if getattr(self, "_f", None) is None or self.closed:
            return
        self.autocommit = False
        try:
            self.fs._forget_pending(self)
            self._f.close()
            super().close()
        finally:
            self.discard()
        warnings.warn(f"{SCHEME}{self.path} was not closed: its writes were discarded (close it, or use "
                      f"`with`, to commit)", ResourceWarning, stacklevel=2)

    def discard(self) -> None:
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


class _Pending:
    """A change other than a written file, deferred to a transaction's commit:
    paths to remove, or paths to set to stored files (a copy)."""

    def __init__(self, address: Address, remove=(), entries=None):
        self.address = address
        self.remove = list(remove)
        self.entries = dict(entries or {})

    def discard(self) -> None:
        pass


class CdcFileSystem(AbstractFileSystem):
    protocol = "cdc"
    root_marker = ""
    transaction_type = CdcTransaction

    def __init__(self, store: str | None = None, token: str | None = None, cache=True,
                 resolved: dict | None = None, head_ttl: float = 5.0, stage: dict | None = None, **kwargs):
        super().__init__(store=store, token=token, cache=cache, resolved=resolved, head_ttl=head_ttl,
                         stage=stage, **kwargs)
        self._stage = dict(stage or {})  # "repo@branch" -> the job whose journal its writes go to (writers.py)
        self._args = dict(location=store, token=token, cache=cache)
        self.head_ttl = head_ttl
        self._given = dict(resolved or {})  # heads resolved by the instance this one was pickled from
        self._get_root: tuple[str, str] | None = None  # a recursive get's destination: (absolute, real)
        self._store = runtime.Local()  # this process's Store (nothing network-bound survives a fork)
        filesystem_made()  # the exit hook then looks for pyarrow's wrappers of it
        self._heads: dict[tuple[str, str], str] = dict(resolved or {})  # (repo, rev) -> commit id, for pickling
        self._asked: dict[tuple[str, str], float] = {}  # (repo, branch) -> when this instance last asked the store
        self._views: dict = {}  # (repo, commit id) -> (Commit, treeobj.View): derived from immutable commits

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def store(self) -> Store:
        return self._store.get(lambda: Store(**self._args))

    def __reduce__(self):
        """Pickle with the commits resolved so far, so workers need not resolve again."""
        kwargs = dict(self.storage_options, resolved=dict(self._heads))
        return _rebuild, (type(self), self.storage_args, kwargs)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith(SCHEME):
            path = path[len(SCHEME):]
        elif path.startswith("cdc:"):
            path = path[4:]
        return path.strip("/")

    @staticmethod
    def _form(path) -> str:
        """What the caller wrote before `REPO`: "cdc://" (or "cdc:"), a leading "/", or nothing.
        Listings (`ls`, `find`, `glob`, `walk`, `info`) name paths in the form they were asked
        in, so a tool that checks results against its base (pyarrow's "outside base dir") works
        with either form; every method accepts both."""
        if not isinstance(path, str):
            return ""
        head = SCHEME if path.startswith(SCHEME) else "cdc:" if path.startswith("cdc:") else ""
        rest = path[len(head):]
        return head + rest[:len(rest) - len(rest.lstrip("/"))]

    @staticmethod
    def _in_form(form: str, out):
        """Names (a list, or a {name: info} dict) of a stripped listing, in the caller's form."""
        if not form:
            return out
        if isinstance(out, dict):
            return {form + k: dict(v, name=form + v["name"]) if "name" in v else v for k, v in out.items()}
        return [form + n for n in out]

    def _address(self, path: str) -> Address:
        return parse(self._strip_protocol(path))

    def _head_key(self, a: Address) -> tuple:
        """The process's key of a head (storage/memo.py): the store's identity, the token, the rev."""
        ident = self.store.identity
        return memo.identity(ident), memo.scope(ident, self._args["token"]), a.repo, a.ref

    def _commit_id(self, a: Address) -> str:
        """The commit a.ref names: commit ids and tags as kept for good; a branch as this instance
        asked the store for it less than `head_ttl` ago (a write through this process drops it at
        once; a new instance, one fsspec hands out again, and `invalidate_cache()` ask again),
        else the store's answer."""
        key, rev = self._head_key(a), (a.repo, a.ref)
        heads = memo.heads()
        got = heads.get(key, self.head_ttl)
        if got is not None and got[1] == "branch" and time.monotonic() - self._asked.get(rev, -1e18) > self.head_ttl:
            got = None  # another instance's answer, or one from before invalidate_cache(): ask
        if got is None and rev in self._given:  # a worker: the head its parent read
            cid = self._given.pop(rev)
            heads.put(key, cid, "commit" if len(a.ref) >= 4 and cid.startswith(a.ref) else "branch")
            got = (cid, "given")
            self._asked[rev] = time.monotonic()  # the parent's answer stands for this instance's
        if got is None:
            got = self.store.resolve_ref(a.repo, a.ref)
            heads.put(key, *got)
            self._asked[rev] = time.monotonic()
        self._heads[rev] = got[0]
        return got[0]

    def _view_of(self, a: Address):
        """(commit, its files as trees) of what a.ref names (trees read on demand, kept)."""
        cid = self._commit_id(a)
        got = self._views.get((a.repo, cid))
        if got is None:
            if len(self._views) >= 64:
                with contextlib.suppress(StopIteration, RuntimeError):  # another thread got there first
                    self._views.pop(next(iter(self._views)), None)
            commit = self.store.get_commit(a.repo, cid)
            got = self._views[(a.repo, cid)] = (commit, self.store.view(a.repo, commit))
        return got

    def invalidate_cache(self, path=None) -> None:
        """Forget resolved branches: the next call asks the store (a commit another process landed
        is seen; commit ids and tags stay: they never move)."""
        self._asked.clear()
        self._heads.clear()
        super().invalidate_cache(path)

    @classmethod
    def _check_instance_cache(cls, token):
        """fsspec hands a cached instance out again for the same arguments: to its caller it is a
        new filesystem, so its branches are asked again (fsspec's hook)."""
        # the metaclass's (fsspec.spec._Cached: fsspec is untyped, so mypy sees `type`)
        inst = type(cls)._check_instance_cache(cls, token)  # type: ignore[attr-defined]
        if inst is not None:
            inst._asked.clear()
        return inst

    def _name(self, a: Address, path: str) -> str:
        rev = f"@{a.rev}" if a.rev else ""
        return f"{a.repo}{rev}/{path}" if path else f"{a.repo}{rev}"

    # -- reading ----------------------------------------------------------------------------
    def ls(self, path, detail=True, **kwargs):
        form, path = self._form(path), self._strip_protocol(path)
        if not path:
            repos = self.store.repos()
            out = [{"name": form + r, "size": 0, "type": "directory"} for r in repos]
            return out if detail else [e["name"] for e in out]
        a = parse(path)
        commit, view = self._view_of(a)
        if view.kind(a.path) is None:
            raise FileNotFoundError(f"{SCHEME}{path}")
        out = [dict(e, name=form + self._name(a, e["name"]), mtime=commit.time) for e in view.listing(a.path)]
        return out if detail else [e["name"] for e in out]

    def info(self, path, **kwargs):
        form, path = self._form(path), self._strip_protocol(path)
        if not path:
            return {"name": form, "size": 0, "type": "directory"}
        a = parse(path)
        commit, view = self._view_of(a)
        kind = view.kind(a.path)
        if kind is None:
            raise FileNotFoundError(f"{SCHEME}{path}")
        out = {"name": form + self._name(a, a.path), "size": view.size(a.path), "type": kind, "mtime": commit.time}
        if kind == "file":  # what caches keyed by URL compare (HF `datasets` downloads): the file's content
            out["ETag"] = view.get(a.path).manifest
        return out

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        out = super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        return self._in_form(self._form(path), out)

    def glob(self, path, maxdepth=None, **kwargs):
        out = super().glob(path, maxdepth=maxdepth, **kwargs)
        return self._in_form(self._form(path), out)

    def walk(self, path, maxdepth=None, topdown=True, on_error="omit", **kwargs):
        form = self._form(path)
        for root, dirs, files in super().walk(path, maxdepth=maxdepth, topdown=topdown, on_error=on_error,
                                              **kwargs):
            if form and isinstance(dirs, dict):  # detail=True: the infos' names too
                dirs = {k: dict(v, name=form + v["name"]) for k, v in dirs.items()}
                files = {k: dict(v, name=form + v["name"]) for k, v in files.items()}
            yield form + root, dirs, files

    def modified(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    def _open(self, path, mode="rb", autocommit=True, **kwargs):
        if mode in ("wb", "xb"):
            if mode == "xb" and self.exists(path):
                raise FileExistsError(f"{SCHEME}{self._strip_protocol(path)} exists (mode 'xb')")
            return CdcWriteFile(self, path, autocommit, exclusive=mode == "xb")
        if mode != "rb":
            raise ValueError(f"cdc:// opens files with mode 'rb', 'wb' or 'xb', not {mode!r}; "
                             f"a stored file cannot be appended to or changed in place")
        a = self._address(path)
        _, view = self._view_of(a)  # read the commit this instance resolved, not a newer one
        entry = view.get(a.path)
        if entry is None:
            if self.info(path)["type"] == "directory":
                raise IsADirectoryError(f"{SCHEME}{path} is a folder")
            raise FileNotFoundError(f"{SCHEME}{path}")
        ident = self.store.identity  # manifests are immutable: kept by the process (storage/memo.py)
        m = memo.objects().remembered((memo.scope(ident, self._args["token"]), "fs-manifest", a.repo, entry.manifest),
                                      lambda: self.store.manifest(a.repo, entry.manifest))
        return self.store.reader(a.repo, m, f"{SCHEME}{path}")

    def cat_file(self, path, start=None, end=None, **kwargs):
        with self._open(path) as f:
            size = f.size
            start = 0 if start is None else (start + size if start < 0 else start)
            end = size if end is None else (end + size if end < 0 else min(end, size))
            return f.pread(start, max(0, end - start)) if end > start else b""

    # -- writing ----------------------------------------------------------------------------
    def _commit_writes(self, files: list) -> None:
        """One commit per (repo, branch) for a batch of written files and pending
        removals and copies."""
        groups: dict[tuple[str, str], tuple[list, list, dict, list]] = {}
        for f in files:
            a = f.address
            pairs, remove, entries, exclusive = groups.setdefault((a.repo, a.ref), ([], [], {}, []))
            if isinstance(f, _Pending):
                remove.extend(f.remove)
                entries.update(f.entries)
            else:
                pairs.append((f.tmp, a.path))
                if f.exclusive:
                    exclusive.append(a.path)
        for (repo, branch), (pairs, remove, entries, exclusive) in groups.items():
            self._check_absent(repo, branch, exclusive)
            job = self._stage.get(f"{repo}@{branch}")
            if job is not None:  # a deferred commit (writers.py): upload, then ONE journal entry; no commit
                self.store.stage(repo, job, pairs, entries=entries, remove=remove)
                continue
            touched = [p for _, p in pairs] + list(entries) + remove
            names = ", ".join(touched[:3]) + (" ..." if len(touched) > 3 else "")
            verb = "write" if pairs or entries else "remove"
            if pairs:  # stored first (chunks, then manifests); then committed with the writes in flight
                entries = {**self.store.commits.upload(pairs, None, None), **entries}
            self._groups().commit(repo, branch, entries, remove, f"{verb} {names}", None,
                                  {p: None for p in exclusive} or None)
            memo.wrote(memo.identity(self.store.identity), repo, branch)
        self.invalidate_cache()

    def get(self, rpath, lpath, recursive=False, **kwargs):
        """Like fsspec's; a recursive get never writes through a symlinked folder that
        leads out of `lpath` (see `get_file`)."""
        root = os.fspath(lpath) if isinstance(lpath, (str, os.PathLike)) else None
        self._get_root = (os.path.abspath(root), os.path.realpath(root)) if root and recursive else None
        try:
            return super().get(rpath, lpath, recursive=recursive, **kwargs)
        finally:
            self._get_root = None

    def get_file(self, rpath, lpath, callback=None, outfile=None, **kwargs):
        """Like fsspec's, but the store path is validated (no '..'), an existing symlink,
        FIFO or device at `lpath` is refused, never written through, and in a recursive
        `get` a path below the destination must resolve inside it (its folder, and itself
        when it is a symlink: a symlinked folder leading out is named as such)."""
        if outfile is None and not isinstance(lpath, io.IOBase):
            self._address(rpath)  # raises on '..' and NUL
            target = os.fspath(lpath)
            if self._get_root is not None and os.path.abspath(target) != self._get_root[0]:
                # below the destination (the destination itself is what the caller named)
                root = self._get_root[1].rstrip(os.sep) + os.sep
                parent = os.path.realpath(os.path.dirname(os.path.abspath(target)))
                real = os.path.realpath(target) if os.path.islink(target) else parent + os.sep
                if not (parent + os.sep).startswith(root) or not (real + os.sep).startswith(root):
                    raise InvalidAddressError(f"{target!r} would be written through a symlink out of "
                                              f"{self._get_root[1]!r}: refusing; remove that symlink or get "
                                              f"elsewhere")
            check_replaceable(target)
        return super().get_file(rpath, lpath, callback=callback, outfile=outfile, **kwargs)

    def _groups(self) -> GroupCommits:
        """This process's group committer for the store (`engine.groups`): writes from many threads
        to one branch (zarr's, a thread pool's `put_file`s) land together while a commit is made."""
        return runtime.per_process(("fs-groups", self.store.identity, self._args["token"]),
                                   lambda: GroupCommits(lambda author: self.store))

    def _check_absent(self, repo: str, branch: str, paths: list[str]) -> None:
        """Mode "xb": the paths must not exist on the branch now."""
        if not paths:
            return
        head = self.store.branches(repo).get(branch) if repo in self.store.repos() else None
        view = self.store.view(repo, self.store.get_commit(repo, head)) if head else None
        taken = [p for p in paths if view is not None and view.get(p) is not None]
        if taken:
            raise FileExistsError(f"{SCHEME}{repo}@{branch}/{taken[0]} exists (mode 'xb'): nothing was written")

    def _forget_pending(self, f) -> None:
        if self._intrans and self.transaction is not None and f in self.transaction.files:
            self.transaction.files.remove(f)

    def _defer(self, pending: _Pending) -> None:
        """Part of the open transaction, or a commit now."""
        if self._intrans:
            self.transaction.files.append(pending)
        else:
            self._commit_writes([pending])

    def put(self, lpath, rpath, recursive=False, **kwargs):
        """Upload files; a folder (recursive=True) becomes one commit per branch."""
        if self._intrans:
            return super().put(lpath, rpath, recursive=recursive, **kwargs)
        with self.transaction:
            return super().put(lpath, rpath, recursive=recursive, **kwargs)

    def put_file(self, lpath, rpath, **kwargs):
        if os.path.isdir(lpath):
            return  # folders are implicit
        with open(lpath, "rb") as src, self.open(rpath, "wb") as f:
            while block := src.read(1 << 20):
                f.write(block)

    def cp_file(self, path1, path2, **kwargs):
        """A commit that points PATH2 at PATH1's stored file: no data is copied."""
        src, dst = self._address(path1), self._address(path2)
        _, view = self._view_of(src)
        entry = view.get(src.path)
        if entry is None:
            raise FileNotFoundError(f"{SCHEME}{self._strip_protocol(path1)}")
        if not dst.path:
            raise IsADirectoryError(f"{SCHEME}{self._strip_protocol(path2)} names a repo, not a file")
        self._defer(_Pending(dst, entries={dst.path: FileEntry(entry.manifest, entry.size, entry.bundle)}))

    def copy(self, path1, path2, recursive=False, maxdepth=None, on_error=None, **kwargs):
        """One commit per destination branch, made from stored manifests."""
        if self._intrans:
            return super().copy(path1, path2, recursive=recursive, maxdepth=maxdepth, on_error=on_error, **kwargs)
        with self.transaction:
            return super().copy(path1, path2, recursive=recursive, maxdepth=maxdepth, on_error=on_error, **kwargs)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """Copy (from manifests) and remove, as one commit when both are on one branch."""
        if self._intrans:
            self.copy(path1, path2, recursive=recursive, maxdepth=maxdepth)
            return self.rm(path1, recursive=recursive)
        with self.transaction:
            self.copy(path1, path2, recursive=recursive, maxdepth=maxdepth)
            self.rm(path1, recursive=recursive)

    def rm(self, path, recursive=False, maxdepth=None):
        paths = path if isinstance(path, list) else [path]
        groups: dict[tuple[str, str], tuple[Address, list[str]]] = {}
        for p in paths:
            a = self._address(p)
            _, view = self._view_of(a)
            victims = list(view.under(a.path))
            if view.get(a.path) is None:
                if not victims:
                    raise FileNotFoundError(f"{SCHEME}{p}")
                if not recursive:
                    raise IsADirectoryError(f"{SCHEME}{p} is a folder: pass recursive=True")
            groups.setdefault((a.repo, a.ref), (a, []))[1].extend(victims)
        for a, victims in groups.values():
            self._defer(_Pending(a, remove=sorted(set(victims))))

    def rm_file(self, path):
        self.rm(path)

    def mkdir(self, path, create_parents=True, **kwargs):
        pass  # folders exist when files do

    def makedirs(self, path, exist_ok=False):
        pass


def _rebuild(cls, args, kwargs):
    return cls(*args, **kwargs)


class S3Gateway:
    """The settings each engine's own S3 reader needs for a `cdcstore serve --s3-port` gateway
    (docs/gateway.md, docs/engines.md): the endpoint, and as credentials a token's name and the
    token (none: an open loopback server, which takes any signature; the engines still sign).

        gw = S3Gateway("http://host:8471", "trainer", TOKEN)
        pl.scan_parquet("s3://imagenet/v3/train/*.parquet", storage_options=gw.polars())
        pd.read_parquet("imagenet/v3/train", filesystem=gw.pyarrow())      # pyarrow's C++ S3 client
        dd.read_parquet("s3://imagenet/v3/train/", storage_options=gw.s3fs())
        con.sql(gw.duckdb_secret())                                          # where httpfs loads

    Keys are `REPO/REV/PATH` (bucket = repo; path-style addressing, which every call here sets)."""

    def __init__(self, endpoint: str, key: str | None = None, secret: str | None = None,
                 region: str = "us-east-1"):
        scheme, sep, hostport = endpoint.rstrip("/").partition("://")
        if not sep or scheme not in ("http", "https") or not hostport or "/" in hostport:
            raise ValueError(f"gateway endpoint {endpoint!r}: give http(s)://HOST:PORT (the --s3-port)")
        if (key is None) != (secret is None):
            raise ValueError("give both the token's name (key) and the token (secret), or neither")
        self.endpoint, self.scheme, self.hostport = f"{scheme}://{hostport}", scheme, hostport
        self.key: str = key if key is not None else "cdcstore"
        self.secret: str = secret if secret is not None else "open-server"
        self.region = region

    def polars(self) -> dict[str, str]:
        """`storage_options` for polars' native reader and writer (its object store)."""
        return {"aws_access_key_id": self.key, "aws_secret_access_key": self.secret, "aws_region": self.region,
                "aws_endpoint_url": self.endpoint, "aws_allow_http": str(self.scheme == "http").lower(),
                "aws_virtual_hosted_style_request": "false"}

    def s3fs(self) -> dict:
        """`storage_options` for fsspec's s3fs (pandas, dask, HF datasets on `s3://`); a new
        instance each time (`skip_instance_cache`), so no listing is kept across reads."""
        return {"key": self.key, "secret": self.secret, "endpoint_url": self.endpoint, "skip_instance_cache": True,
                "client_kwargs": {"region_name": self.region},
                "config_kwargs": {"s3": {"addressing_style": "path"}}}

    def pyarrow(self):
        """A `pyarrow.fs.S3FileSystem` on the gateway (paths without `s3://`: `REPO/REV/PATH`);
        its reads run in C++ with the GIL released (pyarrow, pandas `filesystem=`, Ray, duckdb
        over an Arrow dataset)."""
        from pyarrow import fs as pafs
        return pafs.S3FileSystem(access_key=self.key, secret_key=self.secret, region=self.region,
                                 endpoint_override=self.hostport, scheme=self.scheme, force_virtual_addressing=False)

    def duckdb_secret(self, name: str = "cdcstore") -> str:
        """DuckDB's `CREATE SECRET` statement for its httpfs extension (which must load)."""
        def q(s: str) -> str:
            return "'" + s.replace("'", "''") + "'"
        return (f"CREATE OR REPLACE SECRET {name} (TYPE s3, KEY_ID {q(self.key)}, SECRET {q(self.secret)}, "
                f"REGION {q(self.region)}, ENDPOINT {q(self.hostport)}, URL_STYLE 'path', "
                f"USE_SSL {str(self.scheme == 'https').lower()})")

"""`cdc://` as an fsspec filesystem, so pandas, pyarrow, duckdb, dask and datasets read it.

    fs = fsspec.filesystem("cdc", store="http://host:8470", token="...")
    pd.read_parquet("cdc://imagenet@v3/train/part-0.parquet", storage_options={"store": ...})

Paths are `REPO[@REV]/PATH`. A branch resolves to a commit once per filesystem
instance and the commit's listing is kept (commits are immutable), so listing,
`info`, `glob` and `find` cost no further requests; a pickled instance carries the
resolved commits to its workers. Writes (`open("wb")`, `put`, `pipe`) and `rm` are
commits; inside `fs.transaction` they become one commit per branch.
"""
from __future__ import annotations

import io
import os
import tempfile

from fsspec import AbstractFileSystem
from fsspec.transaction import Transaction

from .address import SCHEME, Address, check_write_target, parse
from .api import Store, _check_replaceable
from .commit import Commit
from .manifest import Manifest
from .reader import FileReader


class CdcTransaction(Transaction):
    """Deferred writes of a transaction become one commit per (repo, branch)."""

    def complete(self, commit: bool = True) -> None:
        fs = self.fs
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


class CdcWriteFile(io.RawIOBase):
    """A file being written: bytes go to a local temp file; `close` commits it
    (or hands it to the open transaction)."""

    def __init__(self, fs: "CdcFileSystem", path: str, autocommit: bool = True):
        super().__init__()
        self.fs = fs
        self.path = path
        self.autocommit = autocommit  # False inside a transaction (fsspec registers the file)
        self.address = fs._address(path)
        if not self.address.path:
            raise IsADirectoryError(f"{SCHEME}{path} names a repo, not a file")
        check_write_target(self.address.ref)  # before any byte is written
        fd, self.tmp = tempfile.mkstemp(prefix="cdcstore-write-")
        self._f = os.fdopen(fd, "wb")

    def writable(self) -> bool:
        return True

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

    def discard(self) -> None:
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


class CdcFileSystem(AbstractFileSystem):
    protocol = "cdc"
    root_marker = ""
    transaction_type = CdcTransaction

    def __init__(self, store: str | None = None, token: str | None = None, cache=True,
                 resolved: dict | None = None, **kwargs):
        super().__init__(store=store, token=token, cache=cache, resolved=resolved, **kwargs)
        self._args = dict(location=store, token=token, cache=cache)
        self._store: Store | None = None
        self._pid = None
        self._heads: dict[tuple[str, str], str] = dict(resolved or {})  # (repo, rev) -> commit id
        self._commits: dict[tuple[str, str], Commit] = {}
        self._manifests: dict[str, Manifest] = {}  # the last 256 opened (immutable)

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def store(self) -> Store:
        if self._store is None or self._pid != os.getpid():  # nothing network-bound survives a fork
            self._store = Store(**self._args)
            self._pid = os.getpid()
        return self._store

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

    def _address(self, path: str) -> Address:
        return parse(self._strip_protocol(path))

    def _commit_of(self, a: Address) -> tuple[str, Commit]:
        key = (a.repo, a.ref)
        cid = self._heads.get(key)
        if cid is None:
            cid = self._heads[key] = self.store.backend.resolve(a.repo, a.ref)
        commit = self._commits.get((a.repo, cid))
        if commit is None:
            commit = self._commits[(a.repo, cid)] = self.store.backend.get_commit(a.repo, cid)
        return cid, commit

    def invalidate_cache(self, path=None) -> None:
        """Forget resolved branches (a new commit moves them)."""
        self._heads = {k: v for k, v in self._heads.items() if k[1] == v}  # keep pinned commit ids
        super().invalidate_cache(path)

    def _name(self, a: Address, path: str) -> str:
        rev = f"@{a.rev}" if a.rev else ""
        return f"{a.repo}{rev}/{path}" if path else f"{a.repo}{rev}"

    # -- reading ----------------------------------------------------------------------------
    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        if not path:
            repos = self.store.backend.repos()
            out = [{"name": r, "size": 0, "type": "directory"} for r in repos]
            return out if detail else [e["name"] for e in out]
        a = parse(path)
        _, commit = self._commit_of(a)
        mtime = commit.time
        if a.path in commit.files:
            out = [{"name": self._name(a, a.path), "size": commit.files[a.path].size, "type": "file",
                    "mtime": mtime}]
            return out if detail else [out[0]["name"]]
        prefix = a.path + "/" if a.path else ""
        entries: dict[str, dict] = {}
        for p, f in commit.files.items():
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):]
            if "/" in rest:
                d = prefix + rest.split("/", 1)[0]
                e = entries.setdefault(d, {"name": self._name(a, d), "size": 0, "type": "directory",
                                           "mtime": mtime})
                e["size"] += f.size
            else:
                entries[p] = {"name": self._name(a, p), "size": f.size, "type": "file", "mtime": mtime}
        if not entries and a.path:
            raise FileNotFoundError(f"{SCHEME}{path}")
        out = [entries[k] for k in sorted(entries)]
        return out if detail else [e["name"] for e in out]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        if not path:
            return {"name": "", "size": 0, "type": "directory"}
        a = parse(path)
        _, commit = self._commit_of(a)
        if a.path in commit.files:
            return {"name": self._name(a, a.path), "size": commit.files[a.path].size, "type": "file",
                    "mtime": commit.time}
        prefix = a.path + "/" if a.path else ""
        size = sum(f.size for p, f in commit.files.items() if p.startswith(prefix))
        if a.path and not any(p.startswith(prefix) for p in commit.files):
            raise FileNotFoundError(f"{SCHEME}{path}")
        return {"name": self._name(a, a.path), "size": size, "type": "directory", "mtime": commit.time}

    def modified(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    def _open(self, path, mode="rb", autocommit=True, **kwargs):
        if "w" in mode:
            return CdcWriteFile(self, path, autocommit)
        if mode != "rb":
            raise ValueError(f"cdc:// opens files with mode 'rb' or 'wb', not {mode!r}")
        a = self._address(path)
        _, commit = self._commit_of(a)  # read the commit this instance resolved, not a newer one
        entry = commit.files.get(a.path)
        if entry is None:
            if self.info(path)["type"] == "directory":
                raise IsADirectoryError(f"{SCHEME}{path} is a folder")
            raise FileNotFoundError(f"{SCHEME}{path}")
        m = self._manifests.get(entry.manifest)
        if m is None:
            m = self.store.backend.get_manifest(entry.manifest, a.repo)
            if len(self._manifests) >= 256:
                self._manifests.pop(next(iter(self._manifests)))
            self._manifests[entry.manifest] = m
        return FileReader(self.store.backend, m, f"{SCHEME}{path}", a.repo)

    def cat_file(self, path, start=None, end=None, **kwargs):
        with self._open(path) as f:
            size = f.size
            start = 0 if start is None else (start + size if start < 0 else start)
            end = size if end is None else (end + size if end < 0 else min(end, size))
            return f.pread(start, max(0, end - start)) if end > start else b""

    # -- writing ----------------------------------------------------------------------------
    def _commit_writes(self, files: list) -> None:
        """One commit per (repo, branch) for a batch of written files."""
        groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for f in files:
            a = f.address
            groups.setdefault((a.repo, a.ref), []).append((f.tmp, a.path))
        for (repo, branch), pairs in groups.items():
            names = ", ".join(p for _, p in pairs[:3]) + (" ..." if len(pairs) > 3 else "")
            self.store.commit_files(repo, branch, pairs, f"write {names}")
            self._heads.pop((repo, branch), None)
        self.invalidate_cache()

    def get_file(self, rpath, lpath, callback=None, outfile=None, **kwargs):
        """Like fsspec's, but the store path is validated (no '..') and an existing
        symlink, FIFO or device at `lpath` is refused, never written through."""
        if outfile is None and not isinstance(lpath, io.IOBase):
            self._address(rpath)  # raises on '..' and NUL
            _check_replaceable(os.fspath(lpath))
        return super().get_file(rpath, lpath, callback=callback, outfile=outfile, **kwargs)

    def put_file(self, lpath, rpath, **kwargs):
        if os.path.isdir(lpath):
            return  # folders are implicit
        with open(lpath, "rb") as src, self.open(rpath, "wb") as f:
            while block := src.read(1 << 20):
                f.write(block)

    def rm(self, path, recursive=False, maxdepth=None):
        paths = path if isinstance(path, list) else [path]
        groups: dict[tuple[str, str], list[str]] = {}
        for p in paths:
            a = self._address(p)
            _, commit = self._commit_of(a)
            if a.path in commit.files:
                victims = [a.path]
            else:
                prefix = a.path + "/" if a.path else ""
                victims = [q for q in commit.files if q.startswith(prefix)]
                if not victims:
                    raise FileNotFoundError(f"{SCHEME}{p}")
                if not recursive:
                    raise IsADirectoryError(f"{SCHEME}{p} is a folder: pass recursive=True")
            groups.setdefault((a.repo, a.ref), []).extend(victims)
        for (repo, branch), victims in groups.items():
            self.store.commit_files(repo, branch, [], f"remove {len(victims)} files", remove=victims)
            self._heads.pop((repo, branch), None)
        self.invalidate_cache()

    def rm_file(self, path):
        self.rm(path)

    def mkdir(self, path, create_parents=True, **kwargs):
        pass  # folders exist when files do

    def makedirs(self, path, exist_ok=False):
        pass


def _rebuild(cls, args, kwargs):
    return cls(*args, **kwargs)


"""Objects as files in a local directory (store format v1's layout, docs/format.md).

A put writes `tmp/<pid>-<random>.tmp`, fsyncs it, then links it to its name (a link
fails if the name exists: create-only without a lock) and fsyncs the directory, so a
writer killed at any point leaves at most a temp file, never a partial object.
Conditional puts take an flock on `.cas.lock` (one per store: ref moves are rare),
compare the current contents' xxh3-128 (the token) and rename a synced temp file over
the object. Ranges are preads. Names under `tmp/` are reserved for temp files.
"""
from __future__ import annotations

import builtins
import contextlib
import errno
import os
import secrets
import stat
from typing import Iterable, Iterator

from .. import runtime

from ..core import ids
from ..core.errors import CorruptionError
from .objects import (AlreadyExists, Capabilities, Conflict, Data, InvalidName, NotFound, ObjectInfo,
                      ObjectStore, StorageError, StorageFull, check_folder_prefix, check_object_name,
                      check_prefix, check_range, _COMPONENT)

TMP = "tmp"
_FULL = (errno.ENOSPC, errno.EDQUOT)
_BLOCK = 4 << 20


IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 1024  # buffers per writev


def write_all(fd: int, pieces: Iterable[Data], at: int | None = None) -> None:
    """Write `pieces` (bytes-like) one after another, `IOV_MAX` per system call and no copy:
    `os.writev` at the file's position, or `os.pwritev` from offset `at`. A short write goes on
    from where it stopped."""
    pending = list(pieces)
    while pending:
        batch = pending[:IOV_MAX]
        n = os.writev(fd, batch) if at is None else os.pwritev(fd, batch, at)
        if n <= 0 and any(len(b) for b in batch):
            raise OSError(errno.EIO, "a write wrote nothing")
        if at is not None:
            at += n
        k = 0
        while k < len(batch) and n >= len(batch[k]):
            n -= len(batch[k])
            k += 1
        pending = pending[k:]
        if n:
            pending[0] = memoryview(pending[0])[n:]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_regular(path: str) -> int:
    """A read descriptor of a regular file; CorruptionError for a FIFO, a device (also through
    a symlink, e.g. to /dev/zero) or a socket in an object's place: never a read that hangs
    or never ends. O_NONBLOCK: opening a FIFO does not wait for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):  # a folder in an object's place: no such object
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        raise CorruptionError(f"{path} is not a regular file (a FIFO, device or socket named like an object): "
                              f"remove it")
    return fd


@contextlib.contextmanager
def _os_errors(what: str, reading: bool = False) -> Iterator[None]:
    """Translate OS errors by errno into the backend's typed errors (on a read, a
    folder or a file in the way of a name means no such object)."""
    try:
        yield
    except FileNotFoundError:
        raise NotFound(f"{what}: not found") from None
    except OSError as e:
        if isinstance(e, StorageError):
            raise
        if reading and e.errno in (errno.ENOTDIR, errno.EISDIR):
            raise NotFound(f"{what}: not found (a folder or file is in the way)") from None
        if e.errno in _FULL:
            raise StorageFull(f"{what}: the disk is full ({e.strerror}): free space and try again") from None
        if e.errno in (errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
            raise InvalidName(f"{what}: a name is used both as an object and as a folder on a local "
                              f"disk ({e.strerror}): choose names that do not nest in each other") from None
        raise


class LocalObjects(ObjectStore):
    """A directory of objects. The directory must exist."""

    capabilities = Capabilities(supports_ranges=True, atomic_conditional_put=True, local_path=True)

    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        if not os.path.isdir(self.root):
            raise NotFound(f"no directory {self.root}: create it first")
        self.url = self.root
        self._tmpdir = os.path.join(self.root, TMP)
        os.makedirs(self._tmpdir, exist_ok=True)

    # -- paths ------------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        check_object_name(name)
        if name == TMP or name.startswith(TMP + "/"):
            raise InvalidName(f"object name {name!r} is under {TMP}/, which holds temp files: choose another name")
        return os.path.join(self.root, *name.split("/"))

    def local_path(self, name: str) -> str:
        return self._path(name)

    def tmp_path(self) -> str:
        """A fresh temp file name in this store's tmp/ (same file system: put_file links it)."""
        return os.path.join(self._tmpdir, f"{os.getpid()}-{secrets.token_hex(8)}.tmp")

    def _write_tmp(self, data: Data) -> str:
        tmp = self.tmp_path()
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return tmp

    def _makedirs(self, parent: str) -> None:
        """Create `parent` and fsync each new folder's own parent (new entries are durable)."""
        if os.path.isdir(parent):
            return
        self._makedirs(os.path.dirname(parent))
        with contextlib.suppress(FileExistsError):
            os.mkdir(parent)
        fsync_dir(os.path.dirname(parent))

    def clean_tmp(self) -> int:
        """Remove temp files of processes that are gone; returns how many."""
        return runtime.clean_dead_temps(self._tmpdir)

    # -- writes -----------------------------------------------------------------------------
    def put(self, name: str, data: Data, *, exist_ok: bool = False) -> bool:
        path = self._path(name)
        with _os_errors(f"cannot write object {name!r} in {self.root}"):
            if exist_ok and os.path.exists(path):
                return False
            tmp = self._write_tmp(data)
            try:
                return self._link(tmp, name, path, exist_ok)
            finally:
                os.unlink(tmp)

    def put_file(self, name: str, path: str, *, exist_ok: bool = False) -> bool:
        """Zero copy: fsync the file and link it to the name (create-only); a file on
        another file system is copied instead (write a file from `tmp_path()`)."""
        final = self._path(name)
        with _os_errors(f"cannot write object {name!r} in {self.root}"):
            if exist_ok and os.path.exists(final):
                return False
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                return self._link(path, name, final, exist_ok)
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise
                return super().put_file(name, path, exist_ok=exist_ok)

    def _link(self, synced: str, name: str, final: str, exist_ok: bool) -> bool:
        """Link a synced file to the object's path, create-only, and make the entry durable."""
        self._makedirs(os.path.dirname(final))
        try:
            os.link(synced, final)  # atomic, and fails if the name is taken
        except FileExistsError:
            if os.path.isdir(final):
                raise
            if exist_ok:
                return False
            raise AlreadyExists(f"object {name!r} already exists in {self.root}: objects are written once") from None
        fsync_dir(os.path.dirname(final))
        return True

    def _cas_lock(self) -> contextlib.AbstractContextManager[None]:
        return runtime.file_lock(os.path.join(self.root, ".cas.lock"))  # a dot file: never an object

    def put_if_absent(self, name: str, data: Data) -> str:
        try:
            self.put(name, data)
        except AlreadyExists:
            raise Conflict(f"object {name!r} was created by another writer: read it and try again") from None
        return ids.weak_hexdigest(data)

    def touch(self, name: str) -> None:
        with _os_errors(f"cannot touch object {name!r} in {self.root}"):
            os.utime(self._path(name))

    def put_if_match(self, name: str, data: Data, token: str) -> str:
        path = self._path(name)
        with _os_errors(f"cannot write object {name!r} in {self.root}"), self._cas_lock():
            try:
                current = self._read(path)
            except FileNotFoundError:
                current = None
            if current is None or ids.weak_hexdigest(current) != token:
                raise Conflict(f"object {name!r} changed since it was read (or is gone): read it and try again")
            tmp = self._write_tmp(data)
            try:
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            fsync_dir(os.path.dirname(path))
        return ids.weak_hexdigest(data)

    def delete(self, name: str) -> None:
        path = self._path(name)
        with _os_errors(f"cannot delete object {name!r} in {self.root}"), self._cas_lock():
            try:  # under the lock: a compare-and-swap never brings a deleted ref back
                os.unlink(path)
            except FileNotFoundError:
                return
            fsync_dir(os.path.dirname(path))

    # -- reads ------------------------------------------------------------------------------
    @staticmethod
    def _read(path: str) -> bytes:
        with open(open_regular(path), "rb") as f:
            return f.read()

    def get(self, name: str) -> bytes:
        path = self._path(name)
        with _os_errors(f"object {name!r} in {self.root}", reading=True):
            return self._read(path)

    def get_with_token(self, name: str) -> tuple[bytes, str]:
        data = self.get(name)
        return data, ids.weak_hexdigest(data)

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        path = self._path(name)
        with _os_errors(f"object {name!r} in {self.root}", reading=True):
            fd = open_regular(path)
            try:
                parts, got = [], 0
                while got < length:  # pread may return less than asked before the end
                    part = os.pread(fd, min(length - got, _BLOCK), offset + got)
                    if not part:
                        break
                    parts.append(part)
                    got += len(part)
            finally:
                os.close(fd)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def exists(self, name: str) -> bool:
        return os.path.isfile(self._path(name))

    def stat(self, name: str) -> ObjectInfo:
        """Size and token; the token hashes the whole file (use local_path for a size only)."""
        path = self._path(name)
        with _os_errors(f"object {name!r} in {self.root}", reading=True):
            h = ids.weak_hasher()
            size = 0
            with open(open_regular(path), "rb") as f:
                for block in iter(lambda: f.read(_BLOCK), b""):
                    h.update(block)
                    size += len(block)
            return ObjectInfo(name, size, h.hexdigest())

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Walk only the folder that holds `prefix`, in name order (a folder sorts as
        its name plus '/', as its objects' names do)."""
        check_prefix(prefix)
        folder, _, _ = prefix.rpartition("/")
        yield from self._walk(folder, prefix)

    def folders(self, prefix: str = "") -> builtins.list[str]:  # `list` here is the method above
        """Sub-folders that hold at least one object (as on S3, an empty folder is none)."""
        check_folder_prefix(prefix)
        base = os.path.join(self.root, *prefix.rstrip("/").split("/")) if prefix else self.root
        try:
            entries = [e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [n for n in sorted(entries) if not n.startswith(".") and not (not prefix and n == TMP)
                and (next(self.list(f"{prefix}{n}/"), None) is not None if _COMPONENT.fullmatch(n)
                     else _holds_files(os.path.join(base, n)))]  # a stray folder: listed, as S3 would

    def _walk(self, folder: str, prefix: str) -> Iterator[ObjectInfo]:
        base = os.path.join(self.root, *folder.split("/")) if folder else self.root
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return
        keyed = []
        for e in entries:
            name = f"{folder}/{e.name}" if folder else e.name
            if e.name.startswith(".") or name == TMP:
                continue
            is_dir = e.is_dir(follow_symlinks=False)
            key = name + "/" if is_dir else name
            if key.startswith(prefix) or (is_dir and prefix.startswith(key)):
                keyed.append((key, name, is_dir, e))
        for key, name, is_dir, e in sorted(keyed):
            if is_dir:
                yield from self._walk(name, prefix)
            else:
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat(follow_symlinks=False)
                    yield ObjectInfo(name, st.st_size, None, st.st_mtime)


def _holds_files(path: str) -> bool:
    """Whether a folder holds a file at any depth (a stray folder whose name no object has)."""
    return any(files for _, _, files in os.walk(path))

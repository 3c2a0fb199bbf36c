"""`cdcstore mount`: a revision of a repo as a read-only folder, so every tool reads it (FUSE:
libfuse 3 through mfusepy).

    cdcstore mount cdc://imagenet@v3/ /mnt/imagenet          # a tag or commit: fixed
    cdcstore mount cdc://imagenet/train /mnt/train --refresh 30   # a branch: follows its head

Listings, sizes and times come from the commit's trees (each read once, kept: trees are
immutable), so `ls -l` and `stat` ask the store nothing after the first visit. A huge folder
(a split tree) lists page by page: each buffer the kernel asks reads only the parts it fills,
and a lookup of one name reads only the parts on its hash's path. A file read goes
through the one read core (`Store.open`: every byte verified against its chunk id, the machine's
chunk cache shared with every other reader, read-ahead for sequential reads, exact ranges for a
Parquet footer). A commit id or tag never changes, so the kernel keeps what it read (page cache,
attributes and names for an hour); a branch is resolved again every `refresh` seconds: a file
opened before the branch moved reads its old version to the end, a file opened after reads the
new one; the kernel keeps names and attributes no longer than `refresh`, and no file bytes (its
page cache belongs to a path, not to a version: a branch's files are read with direct I/O).

Errors reach the reader as errno values: ENOENT for a path that is not there, EIO when the store
fails (a damaged chunk, a server that is gone or answers after its timeout), never a hung mount.
Extended attributes `user.cdc.commit`, `user.cdc.address` and, on files, `user.cdc.manifest` name
what a path is. docs/mount.md.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

from . import runtime
from .api import Store
from .core.address import Address, parse
from .core.commit import Commit, FileEntry
from .core.errors import CdcError, PathNotFoundError, RevisionNotFoundError
from .core.treeobj import Folder, Tree, View

log = logging.getLogger("cdcstore.mount")

FIXED_TIMEOUT = 3600.0  # seconds the kernel keeps names and attributes of a fixed revision
DEFAULT_REFRESH = 30.0  # seconds between resolutions of a mounted branch
MAX_READ = 1 << 20  # bytes one read request of the kernel may ask (its default is 128 KiB)
READ_AHEAD = 8 << 20  # bytes the kernel reads ahead of a sequential reader
XATTRS = ("user.cdc.commit", "user.cdc.address", "user.cdc.manifest")


class MountError(CdcError):
    """A mount that cannot be made or ended (the message names the fix)."""


@dataclass(frozen=True)
class Snapshot:
    """One commit as the mount shows it."""

    commit_id: str
    commit: Commit
    view: View
    mtime: float  # the commit's time: every entry's mtime


class Revision:
    """What a mount shows: a fixed commit (a commit id or tag), or a branch's head, resolved again
    every `refresh` seconds (by the first call after the time is up; the old snapshot is served
    meanwhile, never a half-made one)."""

    def __init__(self, store: Store, addr: Address, refresh: float = DEFAULT_REFRESH):
        self.store, self.addr, self.refresh = store, addr, refresh
        rev = addr.ref
        _, kind = store.resolve_ref(addr.repo, rev)
        self.fixed = kind != "branch"
        self._lock = threading.Lock()
        self._snapshot = self._resolve()
        self._checked = time.monotonic()
        if self.addr.path and self._snapshot.view.kind(self.addr.path) != "directory":
            raise MountError(f"{addr} is {'a file' if self._snapshot.view.kind(addr.path) else 'not there'}: "
                             f"mount a folder (`cdcstore ls cdc://{addr.repo}@{rev}/` lists what there is)")

    def _resolve(self) -> Snapshot:
        cid, commit = self.store.resolve(self.addr)
        return Snapshot(cid, commit, self.store.view(self.addr.repo, commit), float(commit.time))

    def now(self) -> Snapshot:
        """The snapshot to answer with: a branch's head as of at most `refresh` seconds ago."""
        if self.fixed or time.monotonic() - self._checked < self.refresh:
            return self._snapshot
        with self._lock:
            if time.monotonic() - self._checked >= self.refresh:
                try:
                    snap = self._resolve()
                    if snap.commit_id != self._snapshot.commit_id:
                        log.info("cdc://%s@%s moved to %s", self.addr.repo, self.addr.ref, snap.commit_id)
                    self._snapshot = snap
                except (CdcError, OSError) as e:  # the store is away: the last snapshot stays, said once
                    log.warning("cdcstore mount: cannot resolve cdc://%s@%s (%s); showing %s",
                                self.addr.repo, self.addr.ref, e, self._snapshot.commit_id[:12])
                self._checked = time.monotonic()
        return self._snapshot

    def full(self, path: str) -> str:
        """The repo path of a path under the mount point ("/a/b" -> "PATH/a/b")."""
        rel = path.strip("/")
        base = self.addr.path.strip("/")
        return f"{base}/{rel}".strip("/") if base else rel


class _Handle:
    """An open file: its reader (of the version that was current when it was opened)."""

    def __init__(self, reader, entry: FileEntry, snap: Snapshot, path: str):
        self.reader, self.entry, self.snap, self.path = reader, entry, snap, path


class _Dir:
    """An open folder: its tree id in the snapshot it was opened in."""

    def __init__(self, snap: Snapshot, tid: str):
        self.snap, self.tid = snap, tid


class CdcMount:
    """The FUSE operations over a `Revision` (mfusepy's high-level API, raw file info so that a
    fixed revision's files are kept in the kernel's page cache)."""

    use_ns = True

    def __init__(self, revision: Revision):
        self.rev = revision
        self._handles: dict[int, _Handle] = {}
        self._dirs: dict[int, _Dir] = {}
        self._next = 1
        self._lock = threading.Lock()
        self._uid, self._gid = os.getuid(), os.getgid()

    def init_with_config(self, conn: Any, config: Any) -> None:
        """Reads of up to `MAX_READ` bytes, and the kernel's read-ahead up to `READ_AHEAD` (it asks
        the following ranges while earlier ones are answered, on the mount's threads)."""
        if conn is not None:
            conn.max_read = MAX_READ
            conn.max_write = MAX_READ  # (the kernel sizes every request by it: FUSE_MAX_PAGES)
            conn.max_readahead = READ_AHEAD

    # -- names and attributes: from the trees ------------------------------------------------------
    def _entry(self, path: str) -> tuple[Snapshot, str, str, Any]:
        snap = self.rev.now()
        full = self.rev.full(path)
        kind = snap.view.kind(full)
        if kind is None:
            raise _errno(errno.ENOENT)
        return snap, full, kind, snap.view.get(full) if kind == "file" else None

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        snap, full, kind, entry = _guarded(lambda: self._entry(path))
        ns = int(snap.mtime * 1e9)
        common = {"st_uid": self._uid, "st_gid": self._gid, "st_atime": ns, "st_mtime": ns, "st_ctime": ns}
        if kind == "directory":
            return {**common, "st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2, "st_size": 0}
        return {**common, "st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": entry.size,
                "st_blocks": -(-entry.size // 512), "st_blksize": 1 << 20}

    # -- listings: page by page, through the parts of a split folder ------------------------------
    def opendir(self, path: str) -> int:
        """A handle on the folder's tree in the current snapshot: its listing pages through that one
        tree (a branch that moves meanwhile does not mix two versions into one listing)."""
        def opened() -> _Dir:
            snap = self.rev.now()
            full = self.rev.full(path)
            tid = snap.view.folder_id(full)  # reads the parts on the path only
            if tid is None:
                raise _errno(errno.ENOTDIR if snap.view.kind(full) == "file" else errno.ENOENT)
            return _Dir(snap, tid)
        folder = _guarded(opened)
        with self._lock:
            fh, self._next = self._next, self._next + 1
            self._dirs[fh] = folder
        return fh

    def readdir_with_offset(self, path: str, offset: int, fh: int) -> Iterator[tuple[str, dict[str, int], int]]:
        """The folder's entries from position `offset` on, each with the position after it (the
        kernel asks one buffer at a time and resumes at the last position it took): ".", "..",
        then the entries part by part in the split tree's slot order, each page's names sorted.
        A position is found from the slots' entry counts, so a request reads only the split nodes
        above its first page and the parts it walks into (libfuse stops the walk when its buffer is
        full; `_pages` says which parts are read together)."""
        folder = self._dirs.get(fh)
        if folder is None:
            raise _errno(errno.EBADF)
        return _entries(folder.snap.view, folder.tid, offset)

    def releasedir(self, path: str, fh: int) -> int:
        with self._lock:
            self._dirs.pop(fh, None)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        snap = self.rev.now()
        size = _guarded(lambda: snap.view.size(self.rev.full("")))
        return {"f_bsize": 1 << 20, "f_frsize": 1 << 20, "f_blocks": -(-size // (1 << 20)), "f_bfree": 0,
                "f_bavail": 0, "f_files": snap.view.file_count(self.rev.full("")), "f_ffree": 0, "f_namemax": 255}

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        snap, full, kind, entry = _guarded(lambda: self._entry(path))
        if name == "user.cdc.commit":
            return snap.commit_id.encode()
        if name == "user.cdc.address":
            return f"cdc://{self.rev.addr.repo}@{snap.commit_id}/{full}".encode()
        if name == "user.cdc.manifest" and entry is not None:
            return entry.manifest.encode()
        raise _errno(errno.ENODATA)

    def listxattr(self, path: str) -> list[str]:
        _, _, kind, _ = _guarded(lambda: self._entry(path))
        return list(XATTRS if kind == "file" else XATTRS[:2])

    # -- files: read through the one read core ------------------------------------------------------
    def open(self, path: str, fi: Any) -> int:
        if fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC):
            raise _errno(errno.EROFS)

        def opened() -> _Handle:
            snap, full, kind, entry = self._entry(path)
            if kind != "file":
                raise _errno(errno.EISDIR)
            reader = self.rev.store.open_entry(self.rev.addr.repo, entry,
                                               f"cdc://{self.rev.addr.repo}@{snap.commit_id}/{full}")
            return _Handle(reader, entry, snap, full)
        handle = _guarded(opened)
        with self._lock:
            fh, self._next = self._next, self._next + 1
            self._handles[fh] = handle
        fi.fh = fh
        if self.rev.fixed:  # a fixed revision's bytes never change: the kernel keeps what it read
            fi.keep_cache = 1
        else:  # a branch: a path's bytes change when it moves, and the page cache is the path's, not
            fi.direct_io = 1  # the version's: each open file reads its own version, through our cache
        return 0

    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        handle = self._handles.get(fi.fh)
        if handle is None:
            raise _errno(errno.EBADF)
        if offset >= handle.entry.size:
            return b""
        return _guarded(lambda: handle.reader.pread(offset, min(size, handle.entry.size - offset)))

    def release(self, path: str, fi: Any) -> int:
        with self._lock:
            handle = self._handles.pop(fi.fh, None)
        if handle is not None:
            handle.reader.close()
        return 0

    def access(self, path: str, amode: int) -> int:
        _guarded(lambda: self._entry(path))
        if amode & os.W_OK:
            raise _errno(errno.EROFS)
        return 0


DIR_MODE = {"st_mode": stat.S_IFDIR | 0o555}  # a listing gives each entry's type (d_type): `ls -R`,
FILE_MODE = {"st_mode": stat.S_IFREG | 0o444}  # `find` and scandir's is_dir() need no stat of each


def _entries(view: View, tid: str, offset: int) -> Iterator[tuple[str, dict[str, int], int]]:
    """(name, type, position after it) of the folder `tid` from position `offset` on: 0 is ".", 1
    "..", 2 on the entries in `_pages` order. Reads parts only as the walk reaches them."""
    at = offset
    for dot in (".", "..")[at:]:
        at += 1
        yield dot, DIR_MODE, at
    pages = _pages(view, tid, at - 2)
    while True:
        got = _guarded(lambda: next(pages, None))
        if got is None:
            return
        page, skip = got
        for name in sorted(page.entries)[skip:]:
            at += 1
            yield name, DIR_MODE if isinstance(page.entries[name], Folder) else FILE_MODE, at


def _pages(view: View, tid: str, skip: int) -> Iterator[tuple[Tree, int]]:
    """The pages of folder `tid` in slot order (a page folder: itself), starting at the one that
    holds entry number `skip`, with how many of its entries come before that one. The start is
    found through the slots' entry counts, reading only the split nodes above it; entering a
    split node reads its parts still to walk together (`View.preload`: one request to a server),
    so a whole listing costs a request per split node, not one per page."""
    node = view.node(tid)
    above: list[tuple[Tree, list[str]]] = []  # split nodes on the way down, with the slots left to walk
    while node.slots is not None:
        digits = sorted(node.slots)
        for i, d in enumerate(digits):
            if skip < node.slots[d].entries:
                break
            skip -= node.slots[d].entries
        else:
            return  # past the end
        node = _enter(view, node, digits[i:], above)
    if skip >= len(node.entries):
        return  # past the end of a folder that is one page
    yield node, skip
    while above:
        parent, left = above.pop()
        if left:
            node = _enter(view, parent, left, above)
            while node.slots is not None:  # down to its first page
                node = _enter(view, node, sorted(node.slots), above)
            yield node, 0


def _enter(view: View, node: Tree, digits: list[str], above: list[tuple[Tree, list[str]]]) -> Tree:
    """The part of split node `node` in slot `digits[0]`, the slots after it left in `above` to walk
    next (all of them read together now: they are what the walk reads next)."""
    assert node.slots is not None
    view.preload(node.slots[d].tree for d in digits)  # (those read already are not read again)
    above.append((node, digits[1:]))
    return view.part(node, digits[0])


def _errno(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def _guarded(work):
    """`work()`, its failures as the errno a reader gets: ENOENT for what is not there, EIO for the
    store failing (logged once each, with what failed)."""
    try:
        return work()
    except OSError as e:
        if e.errno is not None and not isinstance(e, CdcError):
            raise
        log.warning("cdcstore mount: %s", e)
        raise _errno(errno.EIO) from None
    except (PathNotFoundError, RevisionNotFoundError):
        raise _errno(errno.ENOENT) from None
    except CdcError as e:
        log.warning("cdcstore mount: %s", e)
        raise _errno(errno.EIO) from None
    except Exception:  # a bug here must not take the mount down: the reader gets EIO, the log the trace
        log.exception("cdcstore mount: internal error")
        raise _errno(errno.EIO) from None


def _fuse():
    try:
        import mfusepy
    except ImportError:
        raise MountError("mounting needs mfusepy: pip install 'cdcstore[mount]' (and libfuse 3: "
                         "apt-get install fuse3)") from None
    except OSError as e:  # mfusepy loads libfuse when imported
        raise MountError(f"mounting needs libfuse 3 ({e}): apt-get install fuse3") from None
    return mfusepy


def check_mountpoint(mountpoint: str) -> str:
    path = os.path.abspath(os.path.expanduser(mountpoint))
    if not os.path.isdir(path):
        raise MountError(f"{mountpoint} is not a folder: create it first (mkdir -p {mountpoint})")
    if os.path.ismount(path):
        raise MountError(f"{mountpoint} is a mount point already: `cdcstore unmount {mountpoint}` first")
    if os.listdir(path):
        raise MountError(f"{mountpoint} is not empty: mount on an empty folder")
    return path


def mount(addr: str, mountpoint: str, store: Store, *, refresh: float = DEFAULT_REFRESH,
          ready: threading.Event | None = None) -> None:
    """Mount revision `addr` (cdc://REPO[@REV]/[PATH]) of `store` on the empty folder `mountpoint`
    and serve it until it is unmounted (`unmount`, `fusermount3 -u`) or the process is told to stop
    (SIGINT, SIGTERM: it unmounts on the way out). `ready` is set once the folder shows the revision."""
    a = parse(addr)
    path = check_mountpoint(mountpoint)
    fuse = _fuse()
    if refresh <= 0:
        raise MountError(f"--refresh {refresh}: give a number of seconds above 0")
    revision = Revision(store, a, refresh)
    timeout = FIXED_TIMEOUT if revision.fixed else refresh
    runtime.thread(_watch_ready, path, ready, name="mount-ready")
    try:
        fuse.FUSE(CdcMount(revision), path, raw_fi=True, foreground=True, ro=True, nothreads=False,
                  fsname=f"cdc://{a.repo}@{revision.now().commit_id[:12]}", subtype="cdcstore",
                  default_permissions=True, entry_timeout=timeout, attr_timeout=timeout,
                  negative_timeout=timeout, max_threads=16, max_read=MAX_READ)
    except RuntimeError as e:  # libfuse's status (its own message went to stderr before it)
        raise MountError(f"libfuse refused to mount {mountpoint} (status {e}): is /dev/fuse there and "
                         f"fusermount3 installed (apt-get install fuse3)?") from None


def raise_read_ahead(path: str, kib: int = READ_AHEAD >> 10) -> int | None:
    """Set the kernel's read-ahead of the FUSE connection mounted at `path` to `kib` KiB, where this
    process may (root: /sys/class/bdi/MAJOR:MINOR/read_ahead_kb); the KiB it is then, or None where
    it cannot be set. libfuse's `max_readahead` only lowers it: the kernel starts a FUSE connection at
    128 KiB, so a sequential read asks 128 KiB at a time; at 8 MiB it asks `MAX_READ` (1 MiB), and the
    read core lands each request with no window (reads of 256 KiB and more).

    (Replies are bytes the read core made, copied into libfuse's buffer by mfusepy. Landing the
    read in that buffer itself was tried and reverted: the read core may still hold views of a
    read's buffer after it returns (the chunk cache writes a server's chunks from them, in the
    background), and libfuse frees its buffer at once: a use after free under load.)"""
    try:
        dev = os.stat(path).st_dev
        knob = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        with open(knob, "w") as f:
            f.write(str(kib))
        with open(knob) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _watch_ready(path: str, ready: threading.Event | None) -> None:
    """Once `path` is mounted: its read-ahead raised where this process may, then `ready` set."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not os.path.ismount(path):
        time.sleep(0.02)
    if os.path.ismount(path):
        kib = raise_read_ahead(path)
        log.info("read-ahead %s", f"{kib} KiB" if kib is not None else "left at the kernel's (not permitted here)")
    if ready is not None:
        ready.set()


def unmount(mountpoint: str, lazy: bool = False) -> None:
    """Unmount a cdcstore mount (works when its process or its store is gone: `lazy` detaches a
    mount that a reader still holds open)."""
    import shutil
    import subprocess

    path = os.path.abspath(os.path.expanduser(mountpoint))
    if not os.path.ismount(path):
        raise MountError(f"{mountpoint} is not mounted")
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise MountError("fusermount3 is missing: apt-get install fuse3")
    got = subprocess.run([tool, "-u", *(["-z"] if lazy else []), path], capture_output=True, text=True)
    if got.returncode != 0:
        raise MountError(f"cannot unmount {mountpoint}: {got.stderr.strip() or 'fusermount failed'}"
                         + ("" if lazy else " (a reader still in it? `cdcstore unmount --lazy`)"))

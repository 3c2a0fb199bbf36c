"""A pull: files of a revision written to local disk, atomically per file, read from a store's
`ChunkSource` and `MetadataStore` roles (a local file that already has the content is left alone;
one that differs seeds the read with the chunks it still has, unless the store's packs are local
files: `reads_runs`)."""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Callable, Iterable

from .. import runtime
from ..core import filemap
from ..core import ids
from ..core.chunker import DEFAULT_PARAMS
from ..core.commit import FileEntry
from ..core.errors import AccessDeniedError, CorruptionError, InvalidAddressError
from ..core.ids import digest
from ..core.manifest import Manifest
from ..core.pack import CODEC_RAW, PackEntry, decode_chunk
from ..storage.backend import Backend, BackendCapabilities
from ..storage.overlay import Held, Overlay
from ..storage.roles import Raw
from ..storage.reader import FileReader
from .ingest import FileChunks

PULL_LOCATE_CHUNKS = 262144  # chunks a folder pull locates up front (~16 GiB of 64 KiB chunks, ~10 MB of answer)


def pull_files(store: Backend, repo: str, path: str, found: dict[str, FileEntry], single: bool, local: str,
               progress: Callable[[int], None] | None = None, include: Iterable[str] = (),
               exclude: Iterable[str] = ()) -> dict:
    """Write `found` (the files at or under `path` of a revision of `repo`; `single`: `path` is a
    file) under `local` (see `Store.pull`); {"files", "bytes", "written_files", "written_bytes"}."""
    if single:
        name = _commit_parts(path, path)[-1]
        into = local.endswith(("/", os.sep)) or os.path.isdir(local)
        root, plan = (local, [(path, [name])]) if into else (os.path.dirname(local) or ".", [(path, None)])
    else:
        cut = len(filemap.prefix_of(path))
        root, plan = local, [(p, _commit_parts(p[cut:], p)) for p in found
                             if filemap.selected(p[cut:], include, exclude)]
    total = written = written_files = 0
    targets = [(p, local if parts is None else _safe_target(root, parts, p)) for p, parts in plan]
    for _, target in targets:
        check_replaceable(target)
    for folder in {os.path.dirname(os.path.abspath(t)) for _, t in targets}:  # a killed pull's .part files
        runtime.clean_dead_temps(folder, _part_pid)
    manifests = _manifests(store, repo, [found[p].manifest for p, _ in plan])
    located: dict = {}  # a server locates the chunks of all the files together
    if len(plan) > 1 and not store.capabilities.local_reads:
        located = _locate_all(store, repo, list(manifests.values()))
    for p, target in targets:
        m = manifests[found[p].manifest]
        total += m.size
        if _same_content(target, m):
            if progress:
                progress(m.size)
            continue
        written += m.size
        written_files += 1
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        _write_file(store, repo, p, m, target, progress, located)
    return {"files": len(plan), "bytes": total, "written_files": written_files, "written_bytes": written}


def _manifests(store: Backend, repo: str, names: list[str]) -> dict[str, Manifest]:
    """Manifests by name, fetched several at once (each verified against its name)."""
    names = list(dict.fromkeys(names))
    if len(names) < 2 or store.capabilities.local_reads:
        return {n: store.get_manifest(n, repo) for n in names}
    return dict(zip(names, runtime.pool("io", 8).map(lambda n: store.get_manifest(n, repo), names)))


def _locate_all(store: Backend, repo: str, manifests: list[Manifest]) -> dict:
    """Where the chunks of all these files live, in as few requests as the wire allows
    (up to `PULL_LOCATE_CHUNKS` chunks; a larger pull locates file by file)."""
    wanted = list(dict.fromkeys(c for m in manifests for c in m.chunk_ids))
    if len(wanted) > PULL_LOCATE_CHUNKS:
        return {}
    return store.locate(wanted, repo)


def _write_file(store: Backend, repo: str, path: str, m: Manifest, target: str, progress,
                located: dict | None = None) -> None:
    """Reassemble one file into a temp file beside `target`, verify, rename."""
    tmp = f"{target}.cdcstore-{os.getpid()}.part"
    h = ids.weak_hasher()  # compared with the manifest's whole-file xxh3-128
    try:
        source = store
        if os.path.isfile(target) and not store.capabilities.reads_runs:  # reuse what the old copy has
            source, located = LocalSeed(store, target), None
        with FileReader(source, m, path, repo, sequential=True, readahead_bytes=64 << 20,
                        batch_bytes=8 << 20, locations=located) as src, open(tmp, "wb") as out:
            while pieces := src.read_pieces(16 * 1024 * 1024):
                for p in pieces:  # chunk-sized writes: this kernel is slow on writes over ~4 MiB
                    h.update(p)
                    out.write(p)
                if progress:
                    progress(sum(len(p) for p in pieces))
        if h.digest() != m.file_hash:
            raise CorruptionError(f"{path}: reassembled file does not match its hash; "
                                  f"run `cdcstore check`")
        os.replace(tmp, target)
    except OSError as e:
        _drop(tmp)
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and e.filename in (tmp, target):
            folder = os.path.dirname(os.path.abspath(target))
            why = "is on a read-only file system" if e.errno == errno.EROFS else "is not writable by you"
            raise AccessDeniedError(f"cannot write {os.path.basename(target)} into {folder}: the folder {why}; "
                                    f"pull into a folder you can write (cdcstore pull SRC OTHER_FOLDER)") from None
        raise
    except BaseException:
        _drop(tmp)
        raise


def _drop(tmp: str) -> None:
    if os.path.exists(tmp):
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _commit_parts(rel: str, path: str) -> list[str]:
    """The '/'-separated parts of a path read from a commit, refusing any that could
    leave the destination ('..', '.', empty, absolute, backslashes, NUL)."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
        raise CorruptionError(f"the commit holds an unsafe path {path!r} that would write outside "
                              f"the destination: refusing to pull it (the store or server is damaged or hostile)")
    return parts


def _safe_target(root: str, parts: list[str], path: str) -> str:
    """root/parts..., refused when an existing folder on the way resolves outside root
    (a symlinked parent); folders still missing are created inside it later."""
    real_root = os.path.realpath(root)
    d = root
    for part in parts[:-1]:
        d = os.path.join(d, part)
        if not os.path.lexists(d):
            break  # the rest is created inside root
        real = os.path.realpath(d)
        if not real.startswith(real_root.rstrip(os.sep) + os.sep):
            raise InvalidAddressError(f"{path!r} would be written through {d!r}, a symlink out of {root!r}: "
                                      f"refusing; remove that symlink or pull elsewhere")
    return os.path.join(root, *parts)


def check_replaceable(target: str) -> None:
    """Refuse to replace a symlink, FIFO, device or socket with a regular file."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise InvalidAddressError(f"{target!r}: a parent of it is a file: pull elsewhere") from None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return
    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
        "a device or socket"
    raise InvalidAddressError(f"{target!r} is {kind}: pull never replaces or writes through it; "
                              f"pull to a regular path (or use `cdcstore cat` to write to stdout or a pipe)")


def _same_content(path: str, m) -> bool:
    try:
        if os.path.getsize(path) != m.size:
            return False
    except OSError:
        return False
    h = ids.weak_hasher()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.digest() == m.file_hash


def _part_pid(name: str) -> str | None:
    """The pid in the name of a pull's temp file (`<file>.cdcstore-<pid>.part`), else None."""
    if not name.endswith(".part") or ".cdcstore-" not in name:
        return None
    return name[:-len(".part")].rsplit(".cdcstore-", 1)[1]


class LocalSeed(Overlay):
    """An overlay that takes chunks from an older local copy of a file when it has them
    (chunked with the same rule; located at `Held.LOCAL_FILE`) and asks the backend it wraps
    for the rest - how a pull of v2 over v1 fetches only what changed."""

    # a pull locates the whole file at once: one batched ask for what the old copy lacks
    capabilities = BackendCapabilities(local_reads=True)

    def __init__(self, backend: Backend, path: str, params=None):
        super().__init__(backend)
        self._path = path
        self._have: dict[bytes, PackEntry] = {}
        offset = 0
        with open(path, "rb") as f:
            for _, chunks in FileChunks(f, params or DEFAULT_PARAMS):  # the rule a push uses
                for c in chunks:
                    cid = digest(c)
                    self._have.setdefault(cid, PackEntry(cid, offset, len(c), len(c), CODEC_RAW))
                    offset += len(c)

    def locate(self, chunk_ids, repo=None):
        ids = list(chunk_ids)
        out: dict[bytes, tuple[str | Held, PackEntry]] = {
            c: (Held.LOCAL_FILE, self._have[c]) for c in ids if c in self._have}
        rest = [c for c in ids if c not in out]
        if rest:
            out.update(self.inner.locate(rest, repo))
        return out

    def read_chunks(self, items, repo=None, stored=None) -> dict[bytes, Raw]:
        """The chunks the old copy has read from it, the rest from the backend (`stored`, the
        role's: a seed keeps no stored bytes, so it fills none)."""
        mine = [e for p, e in items if p is Held.LOCAL_FILE]
        out = dict(self.inner.read_chunks([(p, e) for p, e in items if p is not Held.LOCAL_FILE], repo)) \
            if len(mine) < len(items) else {}
        if mine:
            with open(self._path, "rb") as f:
                for e in mine:
                    data = os.pread(f.fileno(), e.stored_len, e.offset)
                    out[e.chunk_id] = decode_chunk(data, e.codec, e.raw_len, e.chunk_id)
        return out

"""Multipart uploads of the S3 gateway, staged in the store until they complete (docs/gateway.md).

An upload is a job folder of `staging.py` (its id is a job id, 32 hex digits), so that it lives
where the store lives (a directory, a bucket every replica sees) and gc treats it as a job:

    staging/<repo>/<upload>/job                  the marker: written at create, touched by each part
    staging/<repo>/<upload>/u-upload             {"key": "BRANCH/PATH", "initiated": t, "owner": ...}
    staging/<repo>/<upload>/p-<00001>-<md5 hex>  one part's bytes, as the client sent them

Nothing of an upload is visible in any revision until CompleteMultipartUpload has chunked the
parts as a push chunks a file and landed the commit; then the folder is deleted (the marker first,
as a job closes). An upload nobody completes or aborts is a dead job for gc: its marker goes stale
(no part for `max(grace, SESSION_STALE)`) and gc deletes the folder, parts included.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..core.errors import NotFoundError
from . import staging
from .objects import NotFound
from .staging import ObjectHost

META = "u-upload"
PART_PREFIX = "p-"
MAX_PART_NUMBER = 10000  # as S3
_PART = re.compile(r"^p-(\d{5})-([0-9a-f]{32})$")
COPY_BLOCK = 8 << 20


class NoSuchUpload(NotFoundError):
    """The upload was completed, aborted, reclaimed by gc, or never created."""
    code = "no_such_upload"


@dataclass(frozen=True)
class Part:
    number: int
    md5: str  # hex
    size: int
    mtime: float | None
    name: str  # the object's name

    @property
    def etag(self) -> str:
        return f'"{self.md5}"'


class Source(NamedTuple):
    """A staged part as a file on disk (a directory store): its number and object name, and
    what tells that file from a replacement (`engine.prechunk` trusts chunks by it)."""
    number: int
    name: str
    inode: int
    size: int
    mtime_ns: int

    @property
    def identity(self) -> tuple[int, int, int]:
        return self.inode, self.size, self.mtime_ns


def part_file(store: ObjectHost, part: Part) -> tuple[str, Source]:
    """Where a staged part is a file here (a directory store), and its `Source` as it is now;
    NoSuchUpload when it is gone or the store keeps no files here."""
    path = store.objects.local_path(part.name) if store.objects.capabilities.local_path else None
    try:
        if path is None:
            raise FileNotFoundError(part.name)
        return path, source_of(part.number, part.name, path)
    except FileNotFoundError:
        raise NoSuchUpload(f"part {part.number} is gone (the upload ended meanwhile) or is no file here") from None


def source_of(number: int, name: str, path: str) -> Source:
    """The `Source` of part `number` (object `name`) as the file at `path` is now."""
    return Source(number, name, *file_identity(os.stat(path)))


def file_identity(st: os.stat_result) -> tuple[int, int, int]:
    """What tells one file from its replacement: (inode, size, mtime in ns)."""
    return st.st_ino, st.st_size, st.st_mtime_ns


def _meta_name(repo: str, upload: str) -> str:
    return staging.folder(repo, upload) + META


def create(store: ObjectHost, repo: str, key: str, owner: str | None) -> str:
    """A new upload of `key` (REV/PATH) in `repo`; its id."""
    upload = secrets.token_hex(16)
    staging.open_job(store, repo, upload)
    doc = {"key": key, "initiated": time.time(), "owner": owner}
    store.objects.put(_meta_name(repo, upload), json.dumps(doc).encode())
    if owner is not None:
        staging.claim(store, repo, upload, owner)
    return upload


def info(store: ObjectHost, repo: str, upload: str) -> dict[str, Any]:
    """The upload's record; NoSuchUpload when it is over (or the id names a journal job)."""
    try:
        staging.check_job(upload)
    except ValueError:
        raise NoSuchUpload(f"upload id {upload[:80]!r} is not one this gateway gives (32 hex digits)") from None
    if not staging.is_open(store, repo, upload):
        raise NoSuchUpload(f"upload {upload} of repo {repo!r} is over (completed, aborted or reclaimed by gc) "
                           f"or was never created")
    try:
        record: dict[str, Any] = json.loads(bytes(store.objects.get(_meta_name(repo, upload))))  # as stored: JSON
        return record
    except NotFound:
        raise NoSuchUpload(f"upload {upload} of repo {repo!r} is no multipart upload") from None


def put_part(store: ObjectHost, repo: str, upload: str, number: int, path: str, md5: str) -> Part:
    """Stage one part from a finished file (linked in place where the store is a directory).
    A part sent again under the same number replaces the one before (as S3)."""
    base = staging.folder(repo, upload)
    name = f"{base}{PART_PREFIX}{number:05d}-{md5}"
    store.objects.put_file(name, path, exist_ok=True)
    store.objects.touch(name)  # the newest part of a number wins, also when its bytes are the same
    if not staging.is_open(store, repo, upload):  # aborted or completed meanwhile: leave nothing behind
        _delete(store, name)
        raise NoSuchUpload(f"upload {upload} of repo {repo!r} ended while its part {number} arrived")
    for p in parts(store, repo, upload, all_versions=True):
        if p.number == number and p.name != name:
            _delete(store, p.name)
    staging.open_job(store, repo, upload)  # the heartbeat: an upload that receives parts is alive
    size = store.objects.stat(name).size
    return Part(number, md5, size, time.time(), name)


def _delete(store: ObjectHost, name: str) -> None:
    try:
        store.objects.delete(name)
    except NotFound:
        pass


def parts(store: ObjectHost, repo: str, upload: str, all_versions: bool = False) -> list[Part]:
    """The upload's parts by number (the newest of a number unless `all_versions`)."""
    base = staging.folder(repo, upload)
    found: dict[int, Part] = {}
    every = []
    for i in store.objects.list(base):
        m = _PART.match(i.name[len(base):])
        if not m:
            continue
        p = Part(int(m[1]), m[2], i.size, i.mtime, i.name)
        every.append(p)
        old = found.get(p.number)
        if old is None or (p.mtime or 0) >= (old.mtime or 0):
            found[p.number] = p
    return sorted(every if all_versions else found.values(), key=lambda p: (p.number, p.mtime or 0))


def uploads(store: ObjectHost, repo: str) -> list[tuple[str, dict[str, Any]]]:
    """(upload id, record) of the repo's open uploads, from one listing of its staging folder."""
    prefix = f"{staging.STAGING}{repo}/"
    found: dict[str, set[str]] = {}
    for i in store.objects.list(prefix):
        rest = i.name[len(prefix):].split("/")
        if len(rest) == 2:
            found.setdefault(rest[0], set()).add(rest[1])
    out = []
    for upload, leaves in found.items():
        if META in leaves and staging.MARKER in leaves:
            try:
                out.append((upload, json.loads(bytes(store.objects.get(prefix + upload + "/" + META)))))
            except (NotFound, ValueError):
                continue
    return out


def assemble(store: ObjectHost, chosen: list[Part], out_path: str) -> int:
    """Write the chosen parts, in order, into the file `out_path`; its size."""
    total = 0
    with open(out_path, "wb") as out:
        for p in chosen:
            local = store.objects.local_path(p.name) if store.objects.capabilities.local_path else None
            if local is not None:
                try:
                    with open(local, "rb") as f:
                        n = copy_into(f.fileno(), out.fileno(), p.size, total)
                except FileNotFoundError:
                    raise NoSuchUpload(f"part {p.number} is gone (the upload ended meanwhile)") from None
            else:  # a block at a time: a part is never held whole
                n = 0
                try:
                    while n < p.size:
                        data = store.objects.get_range(p.name, n, min(COPY_BLOCK, p.size - n))
                        if not len(data):
                            break
                        out.write(data)
                        n += len(data)
                except NotFound:
                    raise NoSuchUpload(f"part {p.number} is gone (the upload ended meanwhile)") from None
            if n != p.size:
                raise NoSuchUpload(f"part {p.number} changed while it was read: complete the upload again")
            total += n
    return total


def copy_into(src: int, dst: int, size: int, at: int) -> int:
    """Copy `size` bytes from the start of file `src` to offset `at` of file `dst`: in the kernel
    where it can (copy_file_range), else by reads; the bytes copied (fewer: `src` was shorter)."""
    done = 0
    while done < size:
        try:
            n = os.copy_file_range(src, dst, min(COPY_BLOCK, size - done), done, at + done)
        except OSError:
            block = os.pread(src, min(COPY_BLOCK, size - done), done)
            n = os.pwrite(dst, block, at + done) if block else 0
        if n <= 0:
            break
        done += n
    return done


def abort(store: ObjectHost, repo: str, upload: str) -> int:
    """End the upload: the marker first (a part arriving late removes itself), then the rest."""
    return staging.close(store, repo, upload)

"""Job journals: uploaded files waiting for ONE commit (many writers, one commit).

A job (a `deferred_commit` block, an fsspec transaction) is a folder of small objects:

    staging/<repo>/<job>/job          the job marker: written when the job opens, touched hourly
    staging/<repo>/<job>/e-<hash>     a batch of entries (JSON, named by the hash of its bytes)
    staging/<repo>/<job>/o-<owner>    (on a server) a token that opened or wrote to the job: its
                                      journal space counts the job's objects (`usage`)

Each writer that closes a file stores its chunks and manifest as a push does, then writes ONE
entry object: {"format": 1, "entries": [{"path", "manifest", "size"[, "bundle"]} | {"path", "remove": true}]}
("bundle": the manifest bundle holding the manifest, a hint; older readers ignore it).
No commit per file: the driver lists the journal once at the end, merges, and lands one commit.
A task run twice writes the same bytes, so the same object: a retry never doubles a file.

Closing a job (landed or failed) deletes the marker FIRST, then the entries. A writer adds its
entry and THEN checks the marker: if the marker is gone it deletes its own entry and fails. So a
writer still running after its job failed leaves nothing behind: either the closer's listing saw
its entry, or its entry came after the marker was gone and it sees that itself.

gc (`storage.maintenance`): the manifests a live job names are roots; a job whose marker is older
than the grace window and SESSION_STALE (a killed driver: the heartbeat stopped), and entries and
owner records with no marker older than the grace window, are deleted.
"""
from __future__ import annotations

import json
import re
from typing import Callable, Iterable, Protocol, TypedDict

from ..core import ids
from ..core.address import check_name, normalize_path
from ..core.commit import FileEntry
from ..core.errors import CorruptionError, InvalidAddressError, NotFoundError
from .objects import NotFound, ObjectInfo, ObjectStore

STAGING = "staging/"
MARKER = "job"
ENTRY_PREFIX = "e-"
OWNER_PREFIX = "o-"
MIN_CHARGE = 256  # bytes an object counts for at least in a token's journal space (an empty marker too)
JOURNAL_VERSION = 1
JOB_ID = re.compile(r"^[0-9a-f]{32}$")
MAX_ENTRIES_PER_OBJECT = 100_000


class ObjectHost(Protocol):
    """What a job's journal is kept in: a store's objects (a `Repository`'s)."""

    @property
    def objects(self) -> ObjectStore: ...


class JobClosedError(NotFoundError):
    """The job is over (landed, failed, or never opened): a late write is refused."""
    code = "job_closed"


def check_job(job: str) -> str:
    if not isinstance(job, str) or not JOB_ID.match(job):
        raise InvalidAddressError(f"a job id is 32 lowercase hex digits (secrets.token_hex(16)), not {job!r}")
    return job


def folder(repo: str, job: str) -> str:
    return f"{STAGING}{check_name('repo', repo)}/{check_job(job)}/"


def encode(entries: dict[str, FileEntry | None]) -> bytes:
    """A batch of entries (None: remove the path) as its canonical bytes."""
    rows = []
    for path, e in sorted(entries.items()):
        p = normalize_path(path)
        if not p:
            raise InvalidAddressError("an entry names the repo root: give each file a path")
        if e is None:
            rows.append({"path": p, "remove": True})
        else:
            _check_entry(p, e)
            rows.append({"path": p, "manifest": e.manifest, "size": e.size}
                        | ({"bundle": e.bundle} if e.bundle is not None else {}))
    return json.dumps({"format": JOURNAL_VERSION, "entries": rows}, sort_keys=True, separators=(",", ":")).encode()


def _check_entry(path: str, e: object) -> None:
    if not isinstance(e, FileEntry) or not ids.is_hex_id(str(e.manifest)) or \
            not isinstance(e.size, int) or isinstance(e.size, bool) or e.size < 0:
        raise InvalidAddressError(f"entry for {path!r} is not a FileEntry(manifest id, size): {e!r}")


def decode(data: bytes, what: str = "journal entry") -> list[tuple[str, FileEntry | None]]:
    """(path, entry or None for a removal) rows of an entry object, fully validated."""
    try:
        doc = json.loads(bytes(data))
        if not isinstance(doc, dict) or doc.get("format") != JOURNAL_VERSION or not isinstance(doc.get("entries"), list):
            raise ValueError(f"not a format-{JOURNAL_VERSION} journal entry")
        out: list[tuple[str, FileEntry | None]] = []
        for row in doc["entries"]:
            path = normalize_path(row["path"])
            if not path:
                raise ValueError("an entry names the repo root")
            if row.get("remove") is True:
                out.append((path, None))
            else:
                b = row.get("bundle")
                e = FileEntry(row["manifest"], row["size"], b if isinstance(b, str) and ids.is_new_hex_id(b) else None)
                _check_entry(path, e)
                out.append((path, e))
        return out
    except (ValueError, KeyError, TypeError, InvalidAddressError) as err:
        raise CorruptionError(f"{what} is damaged: {err}") from None


def merge(batches: Iterable[Iterable[tuple[str, FileEntry | None]]]) -> tuple[dict[str, FileEntry], list[str]]:
    """(path -> entry, paths removed) of a job's batches. The same entry twice (a retried task)
    counts once; two different ones for one path are refused, naming it."""
    seen: dict[str, FileEntry | None] = {}
    for rows in batches:
        for path, e in rows:
            if path in seen and seen[path] != e:
                a, b = seen[path], e
                what: Callable[[FileEntry | None], str]
                what = lambda x: "removed it" if x is None else f"wrote {x.size} bytes (manifest {x.manifest})"
                raise InvalidAddressError(f"two tasks of this job disagree on {path!r}: one {what(a)}, another "
                                          f"{what(b)}; give each task its own paths (nothing was committed)")
            seen[path] = e
    return {p: e for p, e in seen.items() if e is not None}, sorted(p for p, e in seen.items() if e is None)


# -- a job's journal in a repository's objects (a directory, a bucket, a server's own store) --------
def claim(store: ObjectHost, repo: str, job: str, owner: str) -> None:
    """Record that `owner` (a token's hash) opened or wrote to the job: its space counts it."""
    store.objects.put(f"{folder(repo, job)}{OWNER_PREFIX}{owner}", b"", exist_ok=True)


def charge(size: int | None) -> int:
    """What an object of `size` bytes counts for in a token's journal space."""
    return max(size or 0, MIN_CHARGE)


def usage(store: ObjectHost) -> dict[str, int]:
    """owner -> the bytes (`charge`) of the jobs it claimed, from one listing of staging/."""
    return usage_and_jobs(store)[0]


def usage_and_jobs(store: ObjectHost) -> tuple[dict[str, int], dict[str, int]]:
    """owner -> the bytes (`charge`) of the jobs it claimed, and owner -> how many jobs (journal
    jobs and multipart uploads), from one listing of staging/."""
    jobs: dict[str, list[tuple[str, int]]] = {}
    for info in store.objects.list(STAGING):
        base, _, leaf = info.name.rpartition("/")
        jobs.setdefault(base, []).append((leaf, info.size))
    out: dict[str, int] = {}
    count: dict[str, int] = {}
    for objects in jobs.values():
        total = sum(charge(size) for _, size in objects)
        for leaf, _ in objects:
            if leaf.startswith(OWNER_PREFIX):
                owner = leaf[len(OWNER_PREFIX):]
                out[owner] = out.get(owner, 0) + total
                count[owner] = count.get(owner, 0) + 1
    return out, count


def open_job(store: ObjectHost, repo: str, job: str) -> None:
    """Write (or touch: a heartbeat) the job marker."""
    name = folder(repo, job) + MARKER
    if not store.objects.put(name, b"{}", exist_ok=True):
        store.objects.touch(name)


def add(store: ObjectHost, repo: str, job: str, entries: dict[str, FileEntry | None]) -> str:
    """Store one batch of entries; JobClosedError (and nothing left) when the job is over."""
    data = encode(entries)
    base = folder(repo, job)
    name = f"{base}{ENTRY_PREFIX}{ids.hexdigest(data)}"
    store.objects.put(name, data, exist_ok=True)
    if not store.objects.exists(base + MARKER):  # after the write: see the module doc
        try:
            store.objects.delete(name)
        except NotFound:
            pass
        raise JobClosedError(f"job {job} of repo {repo!r} is over (landed or failed) or was never opened: "
                             f"this write was not kept; run the job again")
    return name


def batches(store: ObjectHost, repo: str, job: str) -> list[list[tuple[str, FileEntry | None]]]:
    """Every batch of the job: one listing, then the entry objects read a few at a time."""
    from .. import runtime

    base = folder(repo, job)
    names = [i.name for i in store.objects.list(base) if i.name[len(base):].startswith(ENTRY_PREFIX)]

    def read(name: str) -> list[tuple[str, FileEntry | None]]:
        data = bytes(store.objects.get(name))
        if ids.hexdigest(data) != name.rsplit(ENTRY_PREFIX, 1)[1]:
            raise CorruptionError(f"journal entry {name} does not match its name (damaged)")
        return decode(data, f"journal entry {name}")

    if len(names) <= 4:
        return [read(n) for n in names]
    return list(runtime.pool("io", 8).map(read, names))


def is_open(store: ObjectHost, repo: str, job: str) -> bool:
    return store.objects.exists(folder(repo, job) + MARKER)


def close(store: ObjectHost, repo: str, job: str) -> int:
    """End the job: the marker first (late writers see it gone), then every entry; their count."""
    base = folder(repo, job)
    try:
        store.objects.delete(base + MARKER)
    except NotFound:
        pass
    n = 0
    for info in list(store.objects.list(base)):
        try:
            store.objects.delete(info.name)
            n += 1
        except NotFound:
            pass
    return n


# -- gc ---------------------------------------------------------------------------------------------
class _JobObjects(TypedDict):
    """A job folder's objects, as `gc_plan` sorts them."""

    marker: ObjectInfo | None
    entries: list[ObjectInfo]
    owners: list[ObjectInfo]
    other: list[ObjectInfo]


def gc_plan(store: ObjectHost, now: float, grace: float, stale: float) -> tuple[set[str], list[str]]:
    """(manifests that live jobs name: roots, staging objects to delete). A job is live while
    its marker is younger than max(grace, stale) (the driver's heartbeat touches it hourly); an
    entry with no marker (a late write, a closer killed half way) is deleted once past grace."""
    jobs: dict[str, _JobObjects] = {}
    for info in store.objects.list(STAGING):
        parts = info.name[len(STAGING):].split("/")
        if len(parts) != 3:
            continue
        job = jobs.setdefault(f"{STAGING}{parts[0]}/{parts[1]}/",
                              {"marker": None, "entries": [], "owners": [], "other": []})
        if parts[2] == MARKER:
            job["marker"] = info
        elif parts[2].startswith(ENTRY_PREFIX):
            job["entries"].append(info)
        elif parts[2].startswith(OWNER_PREFIX):
            job["owners"].append(info)
        else:  # what else a job folder holds: an S3 multipart upload's record and parts (uploads.py)
            job["other"].append(info)

    def older(info: ObjectInfo, window: float) -> bool:
        return info.mtime is not None and now - info.mtime >= window

    roots: set[str] = set()
    doomed: list[str] = []
    for base, job in jobs.items():
        marker = job["marker"]
        if marker is not None and not older(marker, max(grace, stale)):
            for info in job["entries"]:
                try:
                    rows = decode(bytes(store.objects.get(info.name)), info.name)
                except (NotFound, CorruptionError):
                    continue
                roots.update(e.manifest for _, e in rows if e is not None)
            continue
        if marker is not None:
            doomed.append(marker.name)
        doomed.extend(i.name for i in job["entries"] + job["owners"] + job["other"]
                      if marker is not None or older(i, grace))
    return roots, doomed


class Journal:
    """The journal role over a repository (a directory, a bucket): the functions above."""

    def __init__(self, store: ObjectHost):
        self.store = store

    def open(self, repo: str, job: str) -> None:
        open_job(self.store, repo, job)

    def add(self, repo: str, job: str, entries: dict[str, FileEntry | None]) -> None:
        add(self.store, repo, job, entries)

    def batches(self, repo: str, job: str) -> list[list[tuple[str, FileEntry | None]]]:
        return batches(self.store, repo, job)

    def close(self, repo: str, job: str) -> None:
        close(self.store, repo, job)

"""Garbage collection of a repository: mark, plan, execute (after restic's prune).

- mark: every commit that a branch or tag reaches, every manifest those commits name, every
  chunk those manifests name. That is what stays.
- plan (pure over the listing and the index): packs none of whose chunks are live, manifests and
  commits nothing reaches, rebase records of gone commits. Objects younger than the grace window
  are never in the plan: a push in flight may be about to name them.
- execute: index rows first (a chunk that is about to go must stop being found by presence
  queries), then objects. A crash between any two steps leaves a consistent store: an object whose
  rows are gone is garbage the next run removes; nothing reachable is ever touched.

Racing pushes: a push writes a session object (`sessions/<id>`) before its first presence query
and removes it when its commit has landed (or failed). gc writes `gc/<id>` first, then lists
sessions: while any session is open, or was open when gc started, gc deletes nothing (its plan is
reported, not run). A push lists `gc/` after writing its session and waits while a gc runs. Both
write before they read, so at least one of the two sees the other. A session older than both the
grace window and 6 hours belongs to a push that died and is ignored; so is a gc marker older than 6
hours (a killed gc). The grace window also spares what a server's clients upload: a server's push
is a series of requests, protected by the window alone (and a manifest naming a chunk that is gone
is refused there, never stored).
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import time

from ..core import ids
from ..core.errors import CdcError, InvalidAddressError
from ..core.pack import ENTRY, HEADER, TRAILER, WRITE_BUFFER, PackWriter, decode_chunk
from .objects import StorageError
from .repository import Repository, commit_name, manifest_name, pack_name

DEFAULT_GRACE = 24 * 3600.0  # seconds an object is spared after it was written
DEFAULT_REPACK_DEAD = 0.5  # a pack more than half dead (by bytes) is rewritten with its live chunks
GC_STALE = 6 * 3600.0  # a gc marker this old belongs to a gc that was killed: pushes ignore it
SESSION_STALE = 6 * 3600.0  # a push session this old (and older than the grace window) died
SESSIONS = "sessions/"
GC_MARKERS = "gc/"


@dataclasses.dataclass
class GcPlan:
    """What a gc run would delete, and what it keeps."""

    packs: list[tuple[str, int]]  # (name, size) of packs with no live chunk
    manifests: list[str]
    commits: list[tuple[str, str]]  # (repo, commit id)
    repack: list[tuple[str, int, list]] = dataclasses.field(default_factory=list)  # (name, size, live entries)
    live_chunks: int = 0
    live_packs: int = 0
    spared_young: int = 0  # unreachable objects inside the grace window
    open_sessions: int = 0  # pushes in flight: nothing is deleted while any is open

    @property
    def bytes_freed(self) -> int:
        """Pack bytes gone after the run: whole dead packs, and the dead part of repacked ones."""
        return sum(size for _, size in self.packs) + sum(size - _repacked_size(live) for _, size, live in self.repack)

    def to_dict(self) -> dict:
        return {"delete_packs": len(self.packs), "repack_packs": len(self.repack), "bytes_freed": self.bytes_freed,
                "delete_manifests": len(self.manifests), "delete_commits": len(self.commits),
                "live_chunks": self.live_chunks, "live_packs": self.live_packs,
                "spared_young": self.spared_young, "open_sessions": self.open_sessions}


def _repacked_size(live: list) -> int:
    """Bytes of a pack holding just these chunks (header, records, index, trailer)."""
    return HEADER.size + sum(e.stored_len for e in live) + ENTRY.size * len(live) + TRAILER.size


def mark(repo: Repository) -> tuple[set[tuple[str, str]], set[str], set[bytes]]:
    """(live commits as (repo, id), live manifest names, live chunk ids)."""
    commits: set[tuple[str, str]] = set()
    manifests: set[str] = set()
    chunks: set[bytes] = set()
    for name in repo.repos():
        forgotten = repo.forgotten(name)
        for head in set(repo.refs(name).values()):
            cid: str | None = head
            while cid and (name, cid) not in commits:
                commits.add((name, cid))  # forgotten commits stay as history; their files go
                c = repo.get_commit(name, cid)  # a damaged reachable commit stops gc (CorruptionError)
                for fe in () if cid in forgotten else c.files.values():
                    if fe.manifest not in manifests:
                        manifests.add(fe.manifest)
                        chunks.update(repo.get_manifest(fe.manifest).chunk_ids)
                cid = c.parent
    return commits, manifests, chunks


def plan(repo: Repository, grace: float = DEFAULT_GRACE, now: float | None = None,
         repack_dead: float = DEFAULT_REPACK_DEAD) -> GcPlan:
    """What gc would delete now (nothing is changed). A pack more than `repack_dead` dead (by
    bytes) is rewritten with only its live chunks."""
    now = time.time() if now is None else now
    repo.recover()  # durable packs a killed push left unindexed are counted as what they are
    live_commits, live_manifests, live_chunks = mark(repo)
    young = 0

    def old(info) -> bool:
        nonlocal young
        if info.mtime is not None and now - info.mtime >= grace:
            return True
        young += 1
        return False

    rows = repo.index.rows()
    live_in: dict[str, list] = {}
    for cid, (pack, e) in rows.items():
        if cid in live_chunks:
            live_in.setdefault(pack, []).append(e)
    packs, repack = [], []
    for info in repo.objects.list("packs/"):
        base = info.name.rsplit("/", 1)[-1]
        if not (base.endswith(".pack") and len(base) == 37):
            continue
        name = base[:-5]
        live = live_in.get(name, [])
        if not live and old(info):
            packs.append((name, info.size))
        elif live and _repacked_size(live) < (1 - repack_dead) * info.size and old(info):
            repack.append((name, info.size, sorted(live, key=lambda e: e.offset)))
    manifests = [info.name.rsplit("/", 1)[-1] for info in repo.objects.list("manifests/")
                 if info.name.rsplit("/", 1)[-1] not in live_manifests and old(info)]
    commits = []
    for name in repo.objects.folders("repos/"):
        for info in repo.objects.list(f"repos/{name}/commits/"):
            cid = info.name.rsplit("/", 1)[-1].removesuffix(".json")
            if (name, cid) not in live_commits and old(info):
                commits.append((name, cid))
    return GcPlan(packs, manifests, commits, repack, live_chunks=len(live_chunks), live_packs=len(live_in),
                  spared_young=young)


def open_sessions(repo: Repository, grace: float, now: float | None = None) -> int:
    """Pushes in flight on this repository (sessions that have not died)."""
    now = time.time() if now is None else now
    return sum(1 for i in repo.objects.list(SESSIONS) if not old_session(i, now, grace))


def old_session(info, now: float, grace: float) -> bool:
    """A session older than the grace window and than SESSION_STALE belongs to a push that died."""
    return info.mtime is not None and now - info.mtime >= max(grace, SESSION_STALE)


def gc(repo: Repository, grace: float = DEFAULT_GRACE, dry_run: bool = False,
       repack_dead: float = DEFAULT_REPACK_DEAD) -> dict:
    """Mark, plan, and (unless `dry_run`, and while no push is in flight) delete."""
    marker = f"{GC_MARKERS}{int(time.time())}-{secrets.token_hex(6)}"
    if not dry_run:
        repo.objects.put(marker, b"", exist_ok=True)
    try:
        # sessions are counted before the mark: a push that ends after this count landed its commit
        # before the mark sees it, and a push that starts after it sees our marker and waits
        pushes = open_sessions(repo, grace)
        p = plan(repo, grace, repack_dead=repack_dead)
        p.open_sessions = pushes
        out = {"dry_run": dry_run, **p.to_dict(), "deleted": False}
        if dry_run or pushes:
            return out
        execute(repo, p)
        out["deleted"] = True
        return out
    finally:
        if not dry_run:
            repo.objects.delete(marker)


def execute(repo: Repository, p: GcPlan) -> None:
    """Delete what the plan names: index rows first, then the objects. Sparse packs are
    rewritten first: the new pack is durable and indexed before the old one goes."""
    for name, _, live in p.repack:
        _repack(repo, name, live)
    for name, _ in p.packs:
        repo.index.drop_pack(name)  # no presence query finds its chunks any more
        repo.objects.delete(pack_name(name))
    for m in p.manifests:
        repo.objects.delete(manifest_name(m))
    for r, cid in p.commits:
        repo.objects.delete(commit_name(r, cid))
        for info in list(repo.objects.list(f"repos/{r}/applied/{cid}")):
            repo.objects.delete(info.name)


def _repack(repo: Repository, name: str, live: list) -> None:
    """Copy a pack's live chunks (verified, stored bytes as they are) into a new pack, make it
    durable, move the index rows to it in one transaction, then delete the old pack. A crash
    before the move leaves an unindexed copy (garbage); after it, an old pack with no rows."""
    tmp = repo.tmp_path()
    with open(tmp, "wb", buffering=WRITE_BUFFER) as f:
        w = PackWriter(f)
        for e in live:
            stored = repo.read_stored(name, e.offset, e.stored_len)
            decode_chunk(stored, e.codec, e.raw_len, e.chunk_id)  # never copy a damaged chunk
            w.add(e.chunk_id, e.codec, stored, e.raw_len)
        new = w.finish()
        size = w.size
        f.flush()
        entries = list(w.entries)
    if new == name:  # nothing dead after all: the same bytes
        os.unlink(tmp)
        return
    repo.objects.put_file(pack_name(new), tmp, exist_ok=True)
    os.unlink(tmp)
    repo.index.replace_pack(name, new, size, entries)
    repo.objects.delete(pack_name(name))


class PushSession:
    """The marker of a push in flight (see the module docstring); a context manager."""

    WAIT = 0.1  # seconds between looks at a running gc

    def __init__(self, repo: Repository, timeout: float = 600.0):
        self.repo, self.timeout = repo, timeout
        self.name = f"{SESSIONS}{os.getpid()}-{secrets.token_hex(8)}"

    def __enter__(self) -> "PushSession":
        self.repo.objects.put(self.name, ids.hexdigest(self.name.encode()).encode(), exist_ok=True)
        deadline = time.monotonic() + self.timeout
        while self._gc_running():
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise CdcError(f"a gc has been running on {self.repo.location} for over {self.timeout:.0f} s: "
                               f"try the push again later (or remove a stale gc/ marker of a killed gc)")
            time.sleep(self.WAIT)
        return self

    def _gc_running(self) -> bool:
        now = time.time()
        return any(i.mtime is None or now - i.mtime < GC_STALE for i in self.repo.objects.list(GC_MARKERS))

    def __exit__(self, *exc) -> None:
        try:
            self.repo.objects.delete(self.name)
        except (StorageError, OSError):  # the push itself is done; a stale marker expires (SESSION_STALE)
            pass


def forget_plan(history: dict[str, list[tuple[str, float]]], tags: dict[str, str], keep_last: int | None = None,
                keep_within: float | None = None, keep_tags: bool = False, now: float | None = None) -> list[str]:
    """Commits to forget (pure): `history` maps each branch to its commits (id, time), newest
    first. A commit is kept when a rule keeps it on any branch: among the branch's `keep_last`
    newest, younger than `keep_within` seconds, tagged (`keep_tags`), or a branch head."""
    now = time.time() if now is None else now
    keep: set[str] = set(tags.values()) if keep_tags else set()
    seen: set[str] = set()
    for commits in history.values():
        for i, (cid, when) in enumerate(commits):
            seen.add(cid)
            if i == 0 or (keep_last is not None and i < keep_last) or \
                    (keep_within is not None and now - when < keep_within):
                keep.add(cid)
    return sorted(seen - keep)


def forget(repo: Repository, name: str, keep_last: int | None = None, keep_within: float | None = None,
           keep_tags: bool = False, dry_run: bool = False) -> dict:
    """Apply a retention policy to a repo's history; `gc` then frees what only forgotten commits used."""
    if keep_last is None and keep_within is None:
        raise InvalidAddressError("forget needs a policy: --keep-last N and/or --keep-within DURATION")
    if keep_last is not None and keep_last < 1:
        raise InvalidAddressError(f"--keep-last must be 1 or more (a branch head is always kept), not {keep_last}")
    history = {b: [(cid, c.time) for cid, c in repo.log(name, head)] for b, head in repo.branches(name).items()}
    doomed = [c for c in forget_plan(history, repo.tags(name), keep_last, keep_within, keep_tags)
              if c not in repo.forgotten(name)]
    if not dry_run:
        repo.forget(name, doomed)
    kept = {cid for commits in history.values() for cid, _ in commits} - set(doomed) - repo.forgotten(name)
    return {"repo": name, "forget": doomed, "kept": len(kept), "dry_run": dry_run}

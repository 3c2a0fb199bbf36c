"""Garbage collection of a repository: mark, plan, execute (after restic's prune).

- mark: every commit that a branch or tag reaches, every tree those commits name (each
  shared subtree walked once), every manifest those trees (or format 1 commits) name, every
  chunk those manifests name. That is what stays.
- plan (over the listing and the index): packs none of whose chunks are live, trees, manifests and
  commits nothing reaches, rebase records of gone commits. Objects younger than the grace window
  are never in the plan: a push in flight may be about to name them; except what forgotten commits
  reach and nothing wrote since those commits landed (`forgotten_reach`): it was committed, so it is
  no upload in flight (a push deduplicating against it now is covered as for old garbage: sessions,
  and `require_stored` at its commit). A young manifest is a root
  (its chunks stay): an `upload` committed later, or a push, may name chunks of old garbage; a
  manifest stored again is made young again (`ObjectStore.touch`). A young tree is a root too
  (its subtrees and manifests stay): a commit about to land names it. The manifests a live job
  journal names (`staging.py`: a `deferred_commit` still running) are roots too, whatever their age.
  A pack with a copy recorded damaged (`check`, a read) is rewritten whatever its age and dead
  share, with the chunks still read from it (`_sound_rest`), or deleted when none is.
- manifest bundles (storage/bundles.py) go with the manifests: one holding any live manifest
  stays whole; one holding none goes past the grace window; a young one's manifests are roots.
- execute: sparse packs rewritten first; dead jobs' journals; then commits, trees, manifests
  and bundles, packs
  (what points before what it points to; a pack's index rows before its object, so presence queries stop finding its
  chunks). A crash between any two steps leaves a consistent store: an object whose rows are gone
  is garbage the next run removes; nothing reachable is ever touched.

Racing pushes: a push writes a session object (`sessions/<id>`) before its first presence query
and removes it when its commit has landed (or failed). gc marks first with no marker, so pushes
land while it walks the store (issue 42: a push waited out whole marks). Then it writes `gc/<id>`,
lists sessions and waits up to DRAIN seconds for those in flight to land; while any is still open
gc deletes nothing (its plan is reported, not run). Under the marker it marks again what landed
since its first mark (`mark(repo, live)`: the walk stops at commits walked before), so a push that
deduplicated against garbage the first mark judged dead keeps it. A push lists `gc/` after writing
its session and waits while a marker stands (the second mark, the plan and the deletes). Both
write before they read, so at least one of the two sees the other. A session older than both the
grace window and 6 hours belongs to a push that died and is ignored (a running push's heartbeat
touches its marker hourly), and so does one whose process on this host is gone; so is a gc marker
older than 6 hours or whose process on this host is gone (a killed gc). A server keeps a session for each client's push (`remote/server/admin.py`);
the grace window (with a floor on a server) also spares what clients that open no session upload.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, AbstractSet, Callable, ContextManager, Iterable, Iterator, Protocol, TypedDict

from .. import runtime
from ..core import ids
from ..core import treeobj
from ..core.address import DEFAULT_BRANCH
from ..core.commit import Commit
from ..core.errors import BusyError, CdcError, CorruptionError, InvalidAddressError, NotFoundError
from ..core.manifest import Manifest
from ..core.pack import ENTRY, HEADER, LEGACY_ENTRY, LEGACY_PACK_VERSION, PACK_VERSION, TRAILER, WRITE_BUFFER, \
    PackEntry, PackWriter, decode_chunk
from . import bundles, reach, staging
from .index import ChunkIndex
from .names import bundle_name, locations_name, manifest_name, pack_name, pack_of, tree_name
from .objects import ObjectInfo, ObjectStore, StorageError
from .refs import DELETED, Refs, commit_name, landing_name, ref_name

if TYPE_CHECKING:
    from .metadata import Metadata
    from .packs import Packs

DEFAULT_GRACE = 24 * 3600.0  # seconds an object is spared after it was written
DEFAULT_REPACK_DEAD = 0.5  # a pack more than half dead (by bytes) is rewritten with its live chunks
DEFAULT_MAX_UNUSED = 0.05  # then packs are rewritten, most dead first, until dead bytes are <= 5% of live
GC_STALE = 6 * 3600.0  # a gc marker this old belongs to a gc that was killed: pushes ignore it
SESSION_STALE = 6 * 3600.0  # a push session this old (and older than the grace window) died
SERVER_LEASE = 600.0  # a session a server keeps for a client (sessions/srv-*) died this long after its last refresh
SERVER_REFRESH = 60.0  # seconds between a client's refreshes of its server-side session
SESSIONS = "sessions/"
GC_MARKERS = "gc/"
DRAIN = 2.0  # seconds gc waits, its marker up, for pushes in flight to land before it gives up deleting


class UpkeepHost(Protocol):
    """What upkeep (gc, forget, push sessions; check and rebuild-index) asks of the store it
    works on, in this process: `repository.Repository` (which runs these commands for
    `admin`, so they know it by this protocol, not by import)."""

    objects: ObjectStore
    location: str

    @property
    def index(self) -> ChunkIndex: ...

    @property
    def packs(self) -> Packs: ...

    @property
    def metadata(self) -> Metadata: ...

    @property
    def ref_store(self) -> Refs: ...

    def repos(self) -> list[str]: ...

    def has_repo(self, repo: str) -> bool: ...

    def branches(self, repo: str) -> dict[str, str]: ...

    def tags(self, repo: str) -> dict[str, str]: ...

    def forgotten(self, repo: str) -> set[str]: ...

    def log(self, repo: str, rev: str) -> Iterator[tuple[str, Commit]]: ...

    def view(self, repo: str, commit: Commit) -> treeobj.View: ...

    def get_commit(self, repo: str, commit_id: str) -> Commit: ...

    def get_tree(self, name: str, repo: str | None = None) -> treeobj.Tree: ...

    def get_manifest(self, name: str, repo: str | None = None) -> Manifest: ...

    def bundle_run(self) -> ContextManager[object]:
        """A context in which each manifest bundle is read once (check, gc and a push run in one)."""

    def tmp_path(self) -> str: ...


@dataclasses.dataclass
class GcPlan:
    """What a gc run would delete, and what it keeps."""

    packs: list[tuple[str, int]]  # (name, size) of packs with no live chunk
    manifests: list[str]
    commits: list[tuple[str, str]]  # (repo, commit id)
    trees: list[str] = dataclasses.field(default_factory=list)
    # (name, size, live entries)
    repack: list[tuple[str, int, list[PackEntry]]] = dataclasses.field(default_factory=list)
    bundles: list[str] = dataclasses.field(default_factory=list)  # manifest bundles none of whose manifests is live
    live_chunks: int = 0
    live_packs: int = 0
    spared_young: int = 0  # unreachable objects inside the grace window
    spared_bytes: int = 0  # bytes of the packs among them
    spared_until: float | None = None  # when the last of them leaves the grace window (epoch seconds)
    open_sessions: int = 0  # pushes in flight: nothing is deleted while any is open
    staging: list[str] = dataclasses.field(default_factory=list)  # journal objects of dead jobs (staging.py)

    @property
    def bytes_freed(self) -> int:
        """Pack bytes gone after the run: whole dead packs, and the dead part of repacked ones."""
        return sum(size for _, size in self.packs) + sum(size - _repacked_size(live) for _, size, live in self.repack)

    def to_dict(self) -> dict[str, object]:
        return {"delete_packs": len(self.packs), "repack_packs": len(self.repack), "bytes_freed": self.bytes_freed,
                "delete_manifests": len(self.manifests), "delete_bundles": len(self.bundles),
                "delete_trees": len(self.trees),
                "delete_commits": len(self.commits),
                "live_chunks": self.live_chunks, "live_packs": self.live_packs,
                "spared_young": self.spared_young, "spared_bytes": self.spared_bytes,
                "spared_until": self.spared_until, "open_sessions": self.open_sessions,
                "delete_staging": len(self.staging)}


def _repacked_size(live: list[PackEntry]) -> int:
    """Bytes of a pack holding just these chunks (header, records, index, trailer)."""
    entry = LEGACY_ENTRY if live and ids.is_legacy(live[0].chunk_id) else ENTRY
    return HEADER.size + sum(e.stored_len for e in live) + entry.size * len(live) + TRAILER.size


@dataclasses.dataclass
class Live:
    """What gc keeps: commits as (repo, id), tree ids, manifest names, chunk ids; `forgotten`: the
    commits among them that the walk found forgotten (history only, `reach.kept`)."""

    commits: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    forgotten: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    trees: set[reach.TreeKey] = dataclasses.field(default_factory=set)
    manifests: set[str] = dataclasses.field(default_factory=set)
    chunks: set[bytes] = dataclasses.field(default_factory=set)
    # repo -> commits walked (a later mark stops there)
    walked: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    bundles: set[str] = dataclasses.field(default_factory=set)  # bundles live file entries name (their pointers)

    def add_tree(self, repo: UpkeepHost, view: treeobj.View, root: str) -> None:
        """A tree and everything below it (a subtree marked before is not walked again)."""
        self.add(repo, reach.subtree(view, root, trees=self.trees))  # a missing or damaged live tree stops gc

    def add(self, repo: UpkeepHost, found: Iterable[reach.Found]) -> None:
        """What a walk (`reach.walk`, `reach.subtree`) found: files' manifests with their chunks."""
        for f in found:
            if f.kind == "file" and f.bundle is not None:
                self.bundles.add(f.bundle)
            if f.kind == "file" and f.name not in self.manifests:
                self.manifests.add(f.name)
                self.chunks.update(repo.get_manifest(f.name).chunk_ids)


def mark(repo: UpkeepHost, live: Live | None = None) -> Live:
    """What every branch and tag reaches (`reach.walk`): commits, trees, manifests, chunks.
    A listing that contradicts what the store says of itself stops it (`_check_listing`).
    Given the `live` of an earlier mark, only what landed since is walked (commits walked
    before stop the walk; trees marked before are skipped): gc's second mark, under its marker,
    costs what pushes landed while the first one ran."""
    live = Live() if live is None else live
    listed = repo.repos()
    _check_listing(repo, listed)
    for name in listed:
        heads = _heads(repo, name)
        if not heads:
            _check_no_refs(repo, name)
        walked: set[str] = live.walked.setdefault(name, set())
        while heads:
            try:
                _mark_history(repo, name, heads, live, walked)
                break
            except NotFoundError:  # a delete (repo, branch) under the mark, or a missing commit
                now = _heads(repo, name)
                if now == heads:
                    raise  # a commit its refs still reach is missing: damage stops gc
                heads = now  # what reaches nothing now is not live (a push would have held gc off)
    return live


def _deleting(repo: UpkeepHost, name: str) -> bool:
    """Whether a delete-repo of `name` is under way or was killed (its tombstone comes first)."""
    return next(iter(repo.objects.list(f"{DELETED}{name}/")), None) is not None


def _refused(location: str, why: str) -> CorruptionError:
    return CorruptionError(f"gc deleted nothing: {why}. The listing of {location} contradicts the store (an "
                           f"endpoint that lists incompletely, or refs that were lost): run `cdcstore check`; "
                           f"restore the refs (`cdcstore branch REPO main COMMIT`) or run `cdcstore delete-repo "
                           f"REPO`, then gc again")


def _check_no_refs(repo: UpkeepHost, name: str) -> None:
    """A repo that holds commits but lists no branch or tag: a repo's last branch is never
    deleted, so only a delete-repo (tombstone first, then refs, then commits) leaves one. Else
    the listing hides its refs (issue 31: gc then deleted every pack), and gc stops."""
    if _deleting(repo, name) or _never_landed(repo, name):
        return
    direct = repo.objects.exists(ref_name(name, "branch", DEFAULT_BRANCH))
    raise _refused(repo.location, f"the listing shows commits of repo {name!r} but no branch or tag"
                   + (f", and a direct read finds its branch {DEFAULT_BRANCH!r}" if direct else
                      " (a repo's last branch is never deleted), and no delete-repo of it is under way"))


def _never_landed(repo: UpkeepHost, name: str) -> bool:
    """Whether every commit of a ref-less repo is a root commit whose landing marker is still there
    (`Refs.commit`): its first push was killed before its branch named it, so no ref was lost and
    nothing of it was ever acknowledged. Its objects are unreachable uploads (the grace window)."""
    folder, marks = f"repos/{name}/commits/", f"repos/{name}/landing/"
    commits = {i.name[len(folder):].removesuffix(".json") for i in repo.objects.list(folder)}
    landing = {i.name[len(marks):] for i in repo.objects.list(marks)}
    return bool(commits) and commits <= landing


def _check_listing(repo: UpkeepHost, listed: list[str]) -> None:
    """Repos this machine's index records reach for (a server's access records) that the
    listing lacks, with no delete-repo under way: the listing hides them, and gc stops."""
    hidden = sorted(r for r in repo.index.granted_repos() - set(listed) if not _deleting(repo, r))
    if hidden:
        raise _refused(repo.location, f"this machine's index records repos {', '.join(map(repr, hidden[:5]))} "
                                      f"that the listing does not show, and no delete-repo of them is under way")


def _heads(repo: UpkeepHost, name: str) -> set[str]:
    """The commits a repo's branches and tags name, read from the ref objects themselves (a
    repo whose commits are gone but whose refs remain is damaged, not deleted)."""
    return {c for kind in ("branch", "tag") for c in repo.ref_store._read_refs(name, kind).values()}


def _mark_history(repo: UpkeepHost, name: str, heads: set[str], live: Live, walked: set[str]) -> None:
    """Forgotten commits stay as history (their commit objects are live); their files go."""
    def found() -> Iterator[reach.Found]:
        for f in reach.walk(repo, name, {h: h for h in heads}, stop=walked, trees=live.trees):
            if f.kind == "commit":  # a damaged reachable commit stops gc (CorruptionError)
                live.commits.add((name, f.name))
                if not f.kept:
                    live.forgotten.add((name, f.name))
                walked.add(f.name)
            yield f
    live.add(repo, found())


@dataclasses.dataclass
class Forgotten:
    """What forgotten commits reach, each object with the latest landing time (the commit
    object's mtime, on the store's own clock) of a forgotten commit that reaches it."""

    trees: dict[str, float] = dataclasses.field(default_factory=dict)
    manifests: dict[str, float] = dataclasses.field(default_factory=dict)
    chunks: dict[bytes, float] = dataclasses.field(default_factory=dict)


def forgotten_reach(repo: UpkeepHost, live: Live) -> Forgotten:
    """The trees, manifests and chunks that forgotten commits (still in a ref's history)
    reach and the live set does not. Such an object was uploaded and committed: it is no
    upload in flight, so gc need not wait out the grace window for it, unless it was written
    again after that commit landed (a manifest stored again is touched: a new upload).

    The commits are those mark's walk found forgotten (`live.forgotten`, by `reach.kept`); what
    each reaches is `reach.subtree` of its tree, less what is live."""
    out = Forgotten()
    by_repo: dict[str, list[str]] = {}
    for name, cid in live.forgotten:
        by_repo.setdefault(name, []).append(cid)
    for name, gone in sorted(by_repo.items()):
        landed = {i.name.rsplit("/", 1)[-1].removesuffix(".json"): i.mtime
                  for i in repo.objects.list(f"repos/{name}/commits/") if i.mtime is not None}
        # newest landing first: an object shared by several forgotten commits gets the latest time
        todo = sorted(((landed[c], c) for c in gone if landed.get(c) is not None), reverse=True)
        views: list[tuple[float, treeobj.View]] = []
        for when, cid in todo:
            with contextlib.suppress(CdcError, StorageError, OSError):  # what an earlier gc freed
                views.append((when, repo.view(name, repo.get_commit(name, cid))))
        _add_reach(repo, live, out, views)
    return out


def deleted_reach(repo: UpkeepHost, live: Live, out: Forgotten, since: float) -> None:
    """Add to `out` what the commits of repos deleted after `since` (their tombstones list each
    commit's root tree and landing time, `Refs.delete_repo`) reached and the live set does not:
    committed, so no upload in flight, as for forgotten commits. Tombstones older than the grace
    window (`since`) are not read: what they reached is past it anyway."""
    roots: list[tuple[float, str]] = []
    for info in repo.objects.list(DELETED):
        if info.mtime is None or info.mtime < since or not info.size:
            continue
        try:  # read at most the bound: a tombstone is no memory bomb
            body = repo.objects.get_range(info.name, 0, min(info.size, MAX_TOMBSTONE_BYTES))
        except (StorageError, OSError):
            continue
        for line in bytes(body).decode("utf-8", "replace").splitlines():
            try:
                doc = json.loads(line)
                if ids.is_hex_id(doc["tree"]):
                    roots.append((float(doc["landed"]), doc["tree"]))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by the bound, or not ours: nothing freed early by it
    roots.sort(reverse=True)
    _add_reach(repo, live, out, [(when, treeobj.View(repo.metadata.read_tree, tree)) for when, tree in roots])


def _add_reach(repo: UpkeepHost, live: Live, out: Forgotten, views: list[tuple[float, treeobj.View]]) -> None:
    """Add to `out` what these (landing time, view) commits reach and `live` does not, each object
    with the time of the first (newest) commit that reaches it: trees, manifests, their chunks. A
    subtree is walked once; a tree an earlier gc freed is skipped with what is below it."""
    walked = set(live.trees)  # live trees, and those an earlier commit here walked, are skipped
    for when, view in views:
        with contextlib.suppress(CdcError, StorageError, OSError):  # what an earlier gc freed
            for f in reach.subtree(view, view.root, trees=walked, problem=_freed):
                if f.kind == "tree":
                    out.trees.setdefault(f.name, when)
                elif f.name not in live.manifests and f.name not in out.manifests:
                    out.manifests[f.name] = when
                    try:
                        chunk_ids = repo.get_manifest(f.name).chunk_ids
                    except (CdcError, StorageError, OSError):
                        continue
                    for c in chunk_ids:
                        if c not in live.chunks:
                            out.chunks.setdefault(c, when)

MAX_TOMBSTONE_BYTES = 64 << 20  # a tombstone's commit list read at most this far (~500,000 commits)


class _Spared(TypedDict):
    """What `plan` spared inside the grace window: pack bytes, and the latest write time."""

    bytes: int
    latest: float | None


class _Old(Protocol):
    """`plan`'s test of an object: past the grace window, or reached by a forgotten commit
    that landed after it was last written (`reached`)."""

    def __call__(self, info: ObjectInfo, reached: float | None = None, /) -> bool: ...


#: A pack `plan` keeps as it is, for now: (name, size, live entries, its listing, reached).
_Kept = tuple[str, int, list[PackEntry], ObjectInfo, float | None]


def _freed(kind: str, ref: str, where: str, error: Exception) -> None:
    """A tree of a forgotten commit that cannot be read: an earlier gc freed it (what is below
    it is skipped)."""


def plan(repo: UpkeepHost, grace: float = DEFAULT_GRACE, now: float | None = None,
         repack_dead: float = DEFAULT_REPACK_DEAD, max_unused: float | None = DEFAULT_MAX_UNUSED,
         live: Live | None = None) -> GcPlan:
    """What gc would delete now (nothing is changed). A pack more than `repack_dead` dead (by
    bytes) is rewritten with only its live chunks; then, while the dead bytes left in packs are
    over `max_unused` of the live ones, the most dead packs are rewritten too (None: never).
    `live`: an earlier mark, brought up to date here (`mark`)."""
    now = time.time() if now is None else now
    repo.packs.recover(whole=True)  # durable packs a killed push left unindexed (or a bounded index let go) are counted
    live = mark(repo, live)
    forgotten = forgotten_reach(repo, live)  # before young roots add to `live`: what only they reach
    deleted_reach(repo, live, forgotten, now - grace)
    live_commits, live_manifests, live_chunks = live.commits, live.manifests, live.chunks
    # the manifests of jobs still running (a deferred commit's journal) are roots; dead jobs' journals go
    staged, doomed_staging = staging.gc_plan(repo, now, grace, SESSION_STALE)
    for m in staged - live_manifests:
        try:
            live_chunks.update(repo.get_manifest(m).chunk_ids)
        except (StorageError, OSError, CdcError):
            continue  # never stored, or already gone: nothing of it to keep
        live_manifests.add(m)
    young = 0
    spared: _Spared = {"bytes": 0, "latest": None}

    def old(info: ObjectInfo, reached: float | None = None) -> bool:
        """Past the grace window, or reached by a forgotten commit that landed after it
        was last written (`reached`: that commit's mtime): either way no upload in flight."""
        nonlocal young
        if info.mtime is not None and (now - info.mtime >= grace or reached is not None and info.mtime <= reached):
            return True
        young += 1
        if info.name.startswith("packs/"):
            spared["bytes"] += info.size or 0
        if info.mtime is not None:
            spared["latest"] = max(spared["latest"] or info.mtime, info.mtime)
        return False

    trees = []
    young_trees = []
    for info in repo.objects.list("trees/"):
        t = info.name.rsplit("/", 1)[-1]
        if t in live.trees:
            continue
        if old(info, forgotten.trees.get(t)):
            trees.append(t)
        else:  # a young tree is a root: the commit that names it may land after this mark
            young_trees.append(t)
    for t in young_trees:
        with contextlib.suppress(CorruptionError):  # gone or damaged since the listing: nothing to keep
            live.add_tree(repo, treeobj.View(repo.get_tree, t), t)
    trees = [t for t in trees if t not in live.trees]
    manifests = []
    for info in repo.objects.list("manifests/"):
        m = info.name.rsplit("/", 1)[-1]
        if m in live_manifests:
            continue
        if old(info, forgotten.manifests.get(m)):
            manifests.append(m)
        else:  # a young manifest is a root: an upload whose commit comes later (or a push in flight)
            live_chunks.update(repo.get_manifest(m).chunk_ids)
    bundles = _plan_bundles(repo, live_manifests, live_chunks, forgotten, old, live.bundles)
    live_in: dict[str, list[PackEntry]] = {}
    reached_at: dict[str, float | None] = {}  # pack -> when a forgotten commit last vouched for all its dead chunks
    for pack, e in repo.index.all_rows():  # every copy: a pack holding a live chunk's other copy is live too
        if e.chunk_id in live_chunks:
            live_in.setdefault(pack, []).append(e)
        else:
            when = forgotten.chunks.get(e.chunk_id)
            before = reached_at.get(pack, when)
            reached_at[pack] = None if when is None or before is None else min(when, before)
    packs, repack, kept = [], [], []
    damaged = {pack for pack, _ in repo.index.damaged()}
    indexed, bad = repo.index.packs(), repo.index.bad_packs()
    for info in repo.objects.list("packs/"):
        name = pack_of(info.name)
        if name is None:  # not named as a pack is: not ours to delete (check reports it)
            continue
        if name not in indexed and name not in bad:  # its footer unread (listed after the mark, or let go
            continue  # by another process's bounded index): what it holds is unknown, so it stays
        live_entries = sorted(live_in.get(name, []), key=lambda e: e.offset)
        reached = reached_at.get(name)
        if name in damaged:  # whatever its age and dead share: the damage goes, sound chunks move
            keep = _sound_rest(repo, name, info, live_entries, now - grace)
            if keep:
                repack.append((name, info.size, keep))
            else:
                packs.append((name, info.size))
        elif not live_entries:
            if old(info, reached):
                packs.append((name, info.size))
        elif _repacked_size(live_entries) < (1 - repack_dead) * info.size and old(info, reached):
            repack.append((name, info.size, live_entries))
        else:
            kept.append((name, info.size, live_entries, info, reached))
    if max_unused is not None:
        repack += _repack_until(kept, max_unused, old)
    commits = []
    for name in repo.repos():  # a folder no repo may be named is not ours (check reports it)
        for info in repo.objects.list(f"repos/{name}/commits/"):
            cid = info.name.rsplit("/", 1)[-1].removesuffix(".json")
            if (name, cid) not in live_commits and old(info):
                commits.append((name, cid))
    return GcPlan(packs, manifests, commits, trees, repack, bundles=bundles, live_chunks=len(live_chunks), live_packs=len(live_in),
                  spared_young=young, staging=doomed_staging, spared_bytes=spared["bytes"],
                  spared_until=None if spared["latest"] is None else spared["latest"] + grace)


def _plan_bundles(repo: UpkeepHost, live_manifests: set[str], live_chunks: set[bytes], forgotten: Forgotten,
                  old: _Old, named: AbstractSet[str] = frozenset()) -> list[str]:
    """The manifest bundles to delete: those holding no live manifest, past the grace window (or
    holding only what forgotten commits reached and landed after them). A young bundle's
    manifests are roots, as a young manifest is. A damaged one (junk a co-tenant left under
    bundles/, a forgery) goes past the grace window unless a live file entry names it (`named`:
    then check reports it and the files it held); one that cannot be read now is kept. A bundle
    with one live manifest is kept whole."""
    doomed = []
    for bid, info in bundles.listing(repo.objects):
        try:
            entries = repo.metadata.read_bundle(bid)
        except CorruptionError:
            if bid not in named and old(info):
                doomed.append(bid)
            continue
        except (StorageError, OSError):
            continue
        if not entries or any(n in live_manifests for n in entries):
            continue
        when = [forgotten.manifests.get(n) for n in entries]
        if old(info, None if None in when else min(t for t in when if t is not None)):
            doomed.append(bid)
        else:
            for data, _ in entries.values():
                live_chunks.update(Manifest.decode(data, f"manifest of bundle {bid}").chunk_ids)
    return doomed


def _sound_rest(repo: UpkeepHost, name: str, info: ObjectInfo, live: list[PackEntry],
                before: float) -> list[PackEntry]:
    """What of a pack with known damaged copies moves to a new pack: the chunks read from it
    (another pack's copy is read instead of a dropped or shadowed one); of an old pack only the
    live ones, of a young one every such chunk (an upload in flight may name it)."""
    read_here = repo.index.pack_chunks(name, 0, info.size)
    if info.mtime is not None and info.mtime <= before:
        ids_live = {e.chunk_id for e in live}
        read_here = [e for e in read_here if e.chunk_id in ids_live]
    return read_here


def _repack_until(kept: list[_Kept], max_unused: float, old: _Old) -> list[tuple[str, int, list[PackEntry]]]:
    """More packs to rewrite, most dead first, until the dead bytes left in kept packs are at
    most `max_unused` of their live bytes (thin garbage spread over many packs adds up; each
    byte rewritten buys the most space this way). Young packs are never taken."""
    dead = {name: size - _repacked_size(live) for name, size, live, _, _ in kept}
    unused = sum(dead.values())
    budget = max_unused * sum(_repacked_size(live) for _, _, live, _, _ in kept)
    more = []
    for name, size, live, info, reached in sorted(kept, key=lambda k: dead[k[0]] / k[1], reverse=True):
        if unused <= budget or dead[name] <= 0:
            break
        if old(info, reached):
            more.append((name, size, live))
            unused -= dead[name]
    return more


def open_sessions(repo: UpkeepHost, grace: float, now: float | None = None) -> int:
    """Pushes in flight on this repository (sessions that have not died). A session of a process
    of this host that no longer runs died with it (a killed push): it is removed, as restic
    removes the stale locks of its own host, so a crash does not hold gc off for hours."""
    now = time.time() if now is None else now
    count = 0
    for info in repo.objects.list(SESSIONS):
        if old_session(info, now, grace):
            continue
        if _dead_here(repo, info.name):
            with contextlib.suppress(StorageError, OSError):
                repo.objects.delete(info.name)
            continue
        count += 1
    return count


def drain_sessions(repo: UpkeepHost, grace: float, wait: float | None = None) -> int:
    """Pushes in flight once gc's marker is up (new ones wait on it), after waiting up to `wait`
    seconds (DRAIN) for them to land: 0 lets gc delete."""
    deadline = time.monotonic() + (DRAIN if wait is None else wait)
    while True:
        count = open_sessions(repo, grace)
        if not count or time.monotonic() >= deadline:
            return count
        time.sleep(0.05)


def _dead_here(repo: UpkeepHost, name: str) -> bool:
    """Whether a session or gc marker names a process of this host that is gone."""
    try:
        doc = json.loads(bytes(repo.objects.get(name)))
        host, pid = doc["host"], doc["pid"]
    except (StorageError, OSError, ValueError, KeyError, TypeError):
        return False  # gone already, or an older marker: counted as open until it is stale
    if host != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def old_session(info: ObjectInfo, now: float, grace: float) -> bool:
    """A session older than the grace window and than SESSION_STALE belongs to a push that died.
    A session a server keeps for a client (`srv-`: no process of this host to look for) is a lease:
    its client refreshes it every SERVER_REFRESH seconds, so one not refreshed for SERVER_LEASE died
    with its client or its replica (a late commit of a push that only stalled is still refused by
    the store-side check of `Repository.commit`, never acknowledged on deleted data)."""
    if info.mtime is None:
        return False
    if info.name.rsplit("/", 1)[-1].startswith("srv-"):
        return now - info.mtime >= SERVER_LEASE
    return now - info.mtime >= max(grace, SESSION_STALE)


def gc(repo: UpkeepHost, grace: float = DEFAULT_GRACE, dry_run: bool = False,
       repack_dead: float = DEFAULT_REPACK_DEAD, max_unused: float | None = DEFAULT_MAX_UNUSED) -> dict[str, object]:
    """Mark, plan, and (unless `dry_run`, and while no push is in flight) delete; each manifest
    bundle is read once (`bundle_run`)."""
    with repo.bundle_run():
        return _gc(repo, grace, dry_run, repack_dead, max_unused)


def _gc(repo: UpkeepHost, grace: float, dry_run: bool, repack_dead: float,
        max_unused: float | None) -> dict[str, object]:
    if not (isinstance(grace, (int, float)) and grace >= 0):
        raise InvalidAddressError(f"the grace window is seconds, 0 or more, not {grace!r}")
    if not (isinstance(repack_dead, (int, float)) and 0 <= repack_dead < 1):
        raise InvalidAddressError(f"repack_dead is the dead share of a pack that gets it rewritten, "
                                  f"0 to below 1, not {repack_dead!r}")
    if max_unused is not None and not (isinstance(max_unused, (int, float)) and max_unused >= 0):
        raise InvalidAddressError(f"max_unused is the dead bytes left in packs as a share of the live ones, "
                                  f"0 or more (0.1 = 10%), or None to never repack for it; not {max_unused!r}")
    if dry_run:
        p = plan(repo, grace, repack_dead=repack_dead, max_unused=max_unused)
        p.open_sessions = open_sessions(repo, grace)
        return {"dry_run": True, **p.to_dict(), "deleted": False}
    # the long mark runs with no marker: pushes land meanwhile (they waited on it: issue 42)
    live = mark(repo)
    marker = f"{GC_MARKERS}{int(time.time())}-{secrets.token_hex(6)}"
    # who runs it: a push ignores the marker of a gc whose process on this host is gone
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    repo.objects.put(marker, json.dumps(owner).encode(), exist_ok=True)
    try:
        # sessions are counted after the marker: a push that starts after it waits, one in flight
        # is waited for (DRAIN) or holds the deletion off; what pushes landed during the first
        # mark, or while draining, the second mark (`plan`) walks before anything is planned
        pushes = drain_sessions(repo, grace)
        p = plan(repo, grace, repack_dead=repack_dead, max_unused=max_unused, live=live)
        p.open_sessions = pushes
        out = {"dry_run": dry_run, **p.to_dict(), "deleted": False}
        if pushes:
            return out
        execute(repo, p)
        out["deleted"] = True
        out["anchored_packs"] = repo.packs.anchors.write_all_anchors()  # an old bucket store: once, index now whole
        return out
    finally:
        repo.objects.delete(marker)


def execute(repo: UpkeepHost, p: GcPlan) -> None:
    """Delete what the plan names: index rows first, then the objects. Sparse packs are
    rewritten first: the new pack is durable and indexed before the old one goes."""
    for name, _, live in p.repack:
        _repack(repo, name, live)
    for name in p.staging:  # dead jobs' journals name manifests: they go before manifests do
        with contextlib.suppress(StorageError, OSError):
            repo.objects.delete(name)
    # what points goes before what it points to: a crash leaves no commit naming a gone manifest
    # and no manifest naming a gone chunk (an upload committed later finds its manifest or not)
    for r, cid in p.commits:
        repo.objects.delete(commit_name(r, cid))
        for info in list(repo.objects.list(f"repos/{r}/applied/{cid}")):
            repo.objects.delete(info.name)
        repo.objects.delete(landing_name(r, cid))  # a never-landed root commit's marker, after it (if any)
    for t in p.trees:  # parents before children need no order: no live tree names a dead one
        repo.objects.delete(tree_name(t))
    for m in p.manifests:
        repo.objects.delete(locations_name(m))  # a hint first: a crash leaves no record without its manifest
        repo.objects.delete(manifest_name(m))
    for b in p.bundles:
        repo.objects.delete(bundle_name(b))
    for name, _ in p.packs:
        repo.index.drop_pack(name)  # no presence query finds its chunks any more
        repo.objects.delete(pack_name(name))
    if p.packs or p.repack:
        repo.packs.anchors.sweep_anchors()  # hints last: an anchor left behind by a crash is only a miss


def _repack(repo: UpkeepHost, name: str, live: list[PackEntry]) -> None:
    """Copy a pack's live chunks (verified, stored bytes as they are) into a new pack, make it
    durable, move the index rows to it in one transaction, then delete the old pack. A crash
    before the move leaves an unindexed copy (garbage); after it, an old pack with no rows."""
    tmp = repo.tmp_path()
    with open(tmp, "wb", buffering=WRITE_BUFFER) as f:
        # a v1 pack's chunks keep their 16-byte ids, so they go to a v1 pack (named as v1 was)
        w = PackWriter(f, LEGACY_PACK_VERSION if live and ids.is_legacy(live[0].chunk_id) else PACK_VERSION)
        for e in live:
            stored = repo.packs.read_stored(name, e.offset, e.stored_len)
            raw = decode_chunk(stored, e.codec, e.raw_len, e.chunk_id)  # never copy a damaged chunk
            w.add(e.chunk_id, e.codec, stored, e.raw_len, ids.checksum(raw))
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
    """The marker of a push in flight (see the module docstring); a context manager. While it is
    open a heartbeat touches it every `REFRESH` seconds, so a push longer than SESSION_STALE is
    never taken for a dead one. A server opens, refreshes and closes one by name for each of its
    clients' pushes (`remote.admin`), so any replica can refresh or close it."""

    WAIT = 0.1  # seconds between looks at a running gc
    REFRESH = 3600.0  # seconds between heartbeats (well under SESSION_STALE)

    def __init__(self, repo: UpkeepHost, timeout: float = 600.0, name: str | None = None, heartbeat: bool = True):
        self.repo, self.timeout, self.heartbeat = repo, timeout, heartbeat
        self.local = name is None  # this process pushes (a server's session belongs to its client)
        self.name = f"{SESSIONS}{name or f'{os.getpid()}-{secrets.token_hex(8)}'}"
        self._stop: Callable[[], None] | None = None

    def __enter__(self) -> "PushSession":
        owner = {"host": socket.gethostname(), "pid": os.getpid() if self.local else None, "started": time.time()}
        self.repo.objects.put(self.name, json.dumps(owner).encode(), exist_ok=True)
        deadline = time.monotonic() + self.timeout
        while self._gc_running():
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise BusyError(f"a gc has been running on {self.repo.location} for over {self.timeout:.0f} s: "
                                f"try the push again later (or remove a stale gc/ marker of a killed gc)")
            time.sleep(self.WAIT)
        if self.heartbeat:
            self._stop = runtime.every(self.REFRESH, self.refresh, "session")
        return self

    def refresh(self) -> None:
        """Make the marker young again (a push still running)."""
        self.repo.objects.touch(self.name)

    def _gc_running(self) -> bool:
        """Whether a gc runs: a marker younger than GC_STALE whose process is not known to be
        gone. The marker of a gc killed on this host (its pid no longer runs) is removed, as
        a killed push's session is: a SIGKILLed gc holds no push off for hours."""
        now = time.time()
        running = False
        for info in self.repo.objects.list(GC_MARKERS):
            if info.mtime is not None and now - info.mtime >= GC_STALE:
                continue
            if _dead_here(self.repo, info.name):
                with contextlib.suppress(StorageError, OSError):
                    self.repo.objects.delete(info.name)
                continue
            running = True
        return running

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._stop()
        try:
            self.repo.objects.delete(self.name)
        except (StorageError, OSError):  # the push itself is done; a stale marker expires (SESSION_STALE)
            pass


def forget_plan(history: dict[str, list[tuple[str, float]]], tags: dict[str, str], keep_last: int | None = None,
                keep_within: float | None = None, now: float | None = None) -> list[str]:
    """Commits to forget (pure): `history` maps each branch to its commits (id, time), newest
    first. A commit is kept when a rule keeps it on any branch: among the branch's `keep_last`
    newest, younger than `keep_within` seconds, or a branch head; and a tagged commit always
    (a tag names its bytes forever, as in git: delete the tag to let its commit go)."""
    now = time.time() if now is None else now
    keep: set[str] = set(tags.values())
    seen: set[str] = set()
    for commits in history.values():
        for i, (cid, when) in enumerate(commits):
            seen.add(cid)
            if i == 0 or (keep_last is not None and i < keep_last) or \
                    (keep_within is not None and now - when < keep_within):
                keep.add(cid)
    return sorted(seen - keep)


def forget(repo: UpkeepHost, name: str, keep_last: int | None = None, keep_within: float | None = None,
           keep_tags: bool = True, dry_run: bool = False) -> dict[str, object]:
    """Apply a retention policy to a repo's history; `gc` then frees what only forgotten commits used.
    Tagged commits are always kept (`keep_tags` is accepted from older clients and changes nothing)."""
    if keep_last is None and keep_within is None:
        raise InvalidAddressError("forget needs a policy: --keep-last N and/or --keep-within DURATION")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
        raise InvalidAddressError(f"--keep-last must be 1 or more (a branch head is always kept), not {keep_last}")
    if keep_within is not None and not (isinstance(keep_within, (int, float)) and not isinstance(keep_within, bool)
                                        and 0 <= keep_within < float("inf")):
        raise InvalidAddressError(f"--keep-within is a duration in seconds, 0 or more (e.g. 30d = 2592000), "
                                  f"not {keep_within!r}")
    history = {b: [(cid, c.time) for cid, c in repo.log(name, head)] for b, head in repo.branches(name).items()}
    tags = repo.tags(name)
    doomed = [c for c in forget_plan(history, tags, keep_last, keep_within) if c not in repo.forgotten(name)]
    untagged = forget_plan(history, {}, keep_last, keep_within)
    if not dry_run:
        repo.ref_store.forget(name, doomed)
    kept = {cid for commits in history.values() for cid, _ in commits} - set(doomed) - repo.forgotten(name)
    tagged = sorted({t for t, c in tags.items() if c in set(untagged) and c not in repo.forgotten(name)})
    return {"repo": name, "forget": doomed, "kept": len(kept), "kept_tagged": tagged, "dry_run": dry_run}

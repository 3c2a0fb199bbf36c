"""What the S3 gateway's writes (remote/gateway_write.py) ask of the write path: the same `Store`
calls a push makes, over the server's own repository (docs/gateway.md, "Writes").

`cdcstore serve` hands a `Publisher` to the gateway (the remote layer cannot import the faces
above it): a file the gateway received is stored as `Store.upload` stores a pushed file (chunked
by the one chunker, Parquet page-aware, only new chunks packed, the manifest after its chunks are
durable, all inside a push session so a gc deletes nothing under it), and committed as
`Store.commit_files` commits (a tag refused, a commit rebased over newer ones that touch other
paths). A write that loses a race on the same path is made again on the new head: the last
writer wins, as on S3.

Group commit: writes to one branch by one author that arrive while a commit of that branch is
being made wait for it, then land together as ONE commit (as a database's group commit does). A
lone writer waits for nothing; under concurrency (s3fs, zarr, a client's 10 threads) the commit
count follows the commits the branch can take, not the writes. Each write is acknowledged only
once the commit holding it landed; a conditional write (If-None-Match: *, If-Match) is checked
against the head the group lands on with the writes before it in the group applied, so exactly
one of several create-only writes of a key wins, as without groups.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable

from .api import Store
from .core.address import DEFAULT_BRANCH, Address
from .core.commit import FileEntry, check_author
from .core.errors import ConflictError, NotFoundError, PathNotFoundError

RETRIES = 8  # commits made again when another writer changed the same paths first
GROUP_MAX = 256  # writes one group commit carries at most


@dataclass
class _Write:
    """One write waiting in a group: what it changes, its conditions, and its outcome."""
    entries: dict
    removed: list
    message: str
    expect: dict | None
    done: threading.Event = field(default_factory=threading.Event)
    result: str | None = None
    error: BaseException | None = None


class Publisher:
    """The write path over one repository (the server's)."""

    def __init__(self, repository):
        self._repository = repository
        self._lock = threading.Lock()
        self._queues: dict[tuple, list[_Write]] = {}  # (repo, branch, author) -> writes waiting
        self._leading: set[tuple] = set()  # groups whose commit is being made now

    def _store(self, author: str | None = None) -> Store:
        store = Store.over(self._repository)
        if author is not None:
            store.author = check_author(author)
        return store

    def upload(self, repo: str, path: str, local: str) -> FileEntry:
        """Store a local file's chunks and manifest as a push does; nothing is committed."""
        entries = self._store().upload([local], Address(repo, None, path))
        return entries[path]

    def existing(self, repo: str, branch: str, paths: Iterable[str]) -> list[str]:
        """Those of `paths` that are files on the branch's head (the default branch's for a new branch)."""
        store = self._store()
        try:
            _, commit = store.resolve(Address(repo, branch, ""))
        except NotFoundError:  # no such repo or branch yet: nothing to remove
            return []
        view = store.view(repo, commit)
        return [p for p in paths if view.get(p) is not None]

    def commit(self, repo: str, branch: str, entries: dict[str, FileEntry], removed: Iterable[str],
               message: str, author: str, expect: dict[str, str | None] | None = None) -> str | None:
        """Land a write on `branch`: set `entries`, remove those of `removed` that exist; the id of
        the commit that holds it (None when it changed nothing). With other writes of the branch by
        `author` in flight, in one group commit (see the module doc). `expect`: path -> the manifest
        id the head must hold there, or None for no file (S3's If-Match / If-None-Match: *);
        FileExistsError otherwise."""
        key, me = (repo, branch, author), _Write(dict(entries), list(removed), message, expect)
        with self._lock:
            self._queues.setdefault(key, []).append(me)
            lead = key not in self._leading
            if lead:
                self._leading.add(key)
        if lead:
            self._lead(key)
        me.done.wait()  # landed by this thread or by the group's leader
        if me.error is not None:
            raise me.error
        return me.result

    def _lead(self, key: tuple) -> None:
        """Land `key`'s queued writes, a group at a time, until none is left; then give up the lead."""
        repo, branch, author = key
        while True:
            with self._lock:
                queue = self._queues.get(key, [])
                group, rest = queue[:GROUP_MAX], queue[GROUP_MAX:]
                if rest:
                    self._queues[key] = rest
                else:
                    self._queues.pop(key, None)
                if not group:
                    self._leading.discard(key)
                    return
            self._land_group(repo, branch, author, group)

    def _land_group(self, repo: str, branch: str, author: str, group: list[_Write]) -> None:
        """Land `group` as one commit; each write's outcome set, then its writer woken."""
        try:
            self._commit_group(repo, branch, author, group)
        except BaseException as e:  # noqa: BLE001 - handed to every writer of the group without an outcome
            for w in group:
                if w.result is None and w.error is None:
                    w.error = e
        finally:
            for w in group:
                w.done.set()

    def _commit_group(self, repo: str, branch: str, author: str, group: list[_Write]) -> None:
        """One commit of the group's writes, in arrival order: a later write to a path wins; a write
        whose condition fails (on the head, with the group's earlier writes applied) gets
        FileExistsError and is left out. Made again on the new head when another writer changed
        the same paths first (a race on a path is a conflict, then a new check)."""
        store = self._store(author)
        for attempt in range(RETRIES):
            # checked on the head the commit is made on: a writer landing in between makes it a
            # rebase, and a rebase over the same path a conflict (then a new check)
            base, view = self._head(store, repo, branch)
            now: dict[str, str | None] = {}  # path -> its manifest after the group's writes so far
            entries: dict[str, FileEntry] = {}
            removed: set[str] = set()
            landing: list[_Write] = []
            for w in group:
                w.error = _unmet(w.expect, now, view, branch)
                if w.error is not None:
                    continue
                landing.append(w)
                for p, e in w.entries.items():
                    entries[p], now[p] = e, e.manifest
                    removed.discard(p)
                for p in w.removed:
                    entries.pop(p, None)
                    now[p] = None
                    removed.add(p)
            gone = sorted(p for p in removed if view is not None and view.get(p) is not None)
            if not entries and not gone:
                return  # nothing changes (each outcome: None, or its unmet condition)
            message = landing[0].message if len(landing) == 1 else (
                f"{len(landing)} writes: {'; '.join(w.message for w in landing[:3])}"
                f"{' ...' if len(landing) > 3 else ''}")
            try:
                pinned = base and any(w.expect for w in landing)  # conditions hold on the head they were checked on
                result = store.commit_files(repo, branch, [], message, entries=entries, remove=gone,
                                            **({"parent": base} if pinned else {}))
            except (ConflictError, PathNotFoundError):
                if attempt == RETRIES - 1:
                    raise
                continue
            for w in landing:
                w.result = result.commit if result.changed else None
            return

    @staticmethod
    def _head(store: Store, repo: str, branch: str):
        """(commit id, view) a group is checked and made on: the branch's head, or for a branch not
        made yet the default branch's head it will be made from (issue 43: a create-only write on a
        new branch was checked against no files); (None, None) when there is none."""
        for rev in (branch, DEFAULT_BRANCH):
            try:
                _, commit = store.resolve(Address(repo, rev, ""))
                return commit.id, store.view(repo, commit)
            except NotFoundError:
                continue
        return None, None

    def create(self, repo: str, author: str) -> str:
        """A new repo: an empty first commit on the default branch (S3 CreateBucket)."""
        return self._store(author).commit_files(repo, DEFAULT_BRANCH, [], "create repo (S3 CreateBucket)").commit

    def stage(self, repo: str, job: str, entries: dict[str, FileEntry], removed: Iterable[str]) -> None:
        """Add stored files (and removals) to job `job`'s journal (opened if new): no commit."""
        store = self._store()
        store.journal().open(repo, job)
        store.stage(repo, job, entries=entries, remove=list(removed))

    def land(self, repo: str, branch: str, job: str, message: str, author: str) -> str | None:
        """Land job `job` on `branch` as one commit and close it; the commit id (None: empty job)."""
        result = self._store(author).land(Address(repo, branch, ""), job, message)
        return None if result is None else result.commit


def _unmet(expect: dict | None, now: dict, view, branch: str) -> FileExistsError | None:
    """A write's unmet condition (path -> the manifest id it needs there, None for no file) on
    `view` with `now`'s paths (the group's earlier writes) laid over it; None when all hold."""
    for path, want in (expect or {}).items():
        if path in now:
            have = now[path]
        else:
            entry = view.get(path) if view is not None else None
            have = entry.manifest if entry is not None else None
        if have != want:
            return FileExistsError(f"{path!r} is {'there' if have is not None else 'absent'} on {branch!r}, "
                                   f"not as the write's condition says")
    return None

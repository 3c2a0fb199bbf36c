"""Group commit: writes to one branch by one author that arrive while a commit of that branch is
being made wait for it, then land together as ONE commit, as a database's group commit does.

A lone writer waits for nothing; under concurrency (s3fs and zarr through the S3 gateway, a
client's threads through `cdc://`) the commit count follows the commits the branch can take,
not the writes. Each write is acknowledged only once the commit holding it landed, so nothing
acknowledged is lost and nothing unacknowledged is visible. A conditional write (S3's
If-None-Match: * and If-Match; `cdc://`'s "xb") is checked against the head the group lands on
with the group's earlier writes applied, so of several create-only writes of one key exactly one
wins, as without groups. Used by `publish.Publisher` (the gateway) and `fs.CdcFileSystem`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .. import runtime
from ..core.address import DEFAULT_BRANCH, Address
from ..core.errors import ConflictError, NotFoundError, PathNotFoundError

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


class GroupCommits:
    """Writes grouped per (repo, branch, author), committed through `store_for(author)`: a `Store`
    (its `resolve`, `view` and `commit_files`) whose commits are by that author (None: its own)."""

    def __init__(self, store_for: Callable):
        self._store_for = store_for
        self._lock = threading.Lock()
        self._queues: dict[tuple, list[_Write]] = {}  # (repo, branch, author) -> writes waiting
        self._leading: set[tuple] = set()  # groups whose commit is being made now

    def commit(self, repo: str, branch: str, entries: dict, removed: Iterable[str], message: str,
               author: str | None, expect: dict[str, str | None] | None = None) -> str | None:
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
            self._lead(key, me)
        me.done.wait()  # landed by this thread or by the group's leader
        if me.error is not None:
            raise me.error
        return me.result

    def _lead(self, key: tuple, me: _Write | None) -> None:
        """Land `key`'s queued writes a group at a time. Once `me` (the leader's own write) has
        landed, writes still queued get a leader thread of their own: a writer is answered as
        soon as its commit landed, never kept serving others."""
        repo, branch, author = key
        while True:
            with self._lock:
                queue = self._queues.get(key, [])
                if not queue:
                    self._leading.discard(key)
                    return
                if me is not None and me.done.is_set():  # ours landed: the lead passes on
                    runtime.thread(self._lead, key, None, name="group-commit")
                    return
                group, rest = queue[:GROUP_MAX], queue[GROUP_MAX:]
                if rest:
                    self._queues[key] = rest
                else:
                    self._queues.pop(key, None)
            self._land_group(repo, branch, author, group)

    def _head(self, repo: str, branch: str):
        """(commit id, view) the writes are checked and made on: the branch's head, or for a branch
        not made yet the default branch's head it will be made from (issue 43: a create-only write
        on a new branch was checked against no files); (None, None) when there is none."""
        store = self._store_for(None)
        for rev in (branch, DEFAULT_BRANCH):
            try:
                _, commit = store.resolve(Address(repo, rev, ""))
                return commit.id, store.view(repo, commit)
            except NotFoundError:
                continue
        return None, None

    def _land(self, repo: str, branch: str, author: str | None, entries: dict, gone: list, message: str,
              parent: str | None):
        return self._store_for(author).commit_files(repo, branch, [], message, entries=entries, remove=gone,
                                                    **({"parent": parent} if parent else {}))

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
        for attempt in range(RETRIES):
            # checked on the head the commit is made on: a writer landing in between makes it a
            # rebase, and a rebase over the same path a conflict (then a new check)
            base, view = self._head(repo, branch)
            now: dict[str, str | None] = {}  # path -> its manifest after the group's writes so far
            entries: dict = {}
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
                pinned = base if any(w.expect for w in landing) else None  # conditions hold on the head they were checked on
                result = self._land(repo, branch, author, entries, gone, message, pinned)
            except (ConflictError, PathNotFoundError):
                if attempt == RETRIES - 1:
                    raise
                continue
            for w in landing:
                w.result = result.commit if result.changed else None
            return


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

"""Many writers, one commit, through `cdc://` (dask, Ray, pyarrow in many processes).

    from cdcstore.writers import deferred_commit
    with deferred_commit("cdc://ds@main/", store="http://host:8470") as dc:
        df.to_parquet("cdc://ds@main/out/", storage_options=dc.storage_options)   # any scheduler
    print(dc.result.commit)  # here, and not before: ONE new commit on ds@main with every file

Inside the block, every `cdc://` write made with these storage options, in any process
or machine, commits to a private staging branch `BRANCH.stage-XXXXXXXX` forked from the
branch head (concurrent writers' commits there rebase onto each other). On a clean exit
the staging branch's changes land on BRANCH as one commit, made against the head seen at
entry (newer commits that touch other paths are kept; overlapping ones conflict), and the
staging branch is deleted. On an error (a worker killed, a task failed) BRANCH does not
move and the staging branch is deleted: readers of BRANCH never see part of the write,
and running the job again lands it. Readers of BRANCH never see the staging branch's
files; a driver killed inside the block leaves the staging branch behind
(`cdcstore branch -d`), never a half-written BRANCH. (In a repo that did not exist
before, a block that lands nothing leaves the repo with only its empty staging branch,
since a repo keeps its last branch.)

`Store.upload` and `Store.commit_entries` are the same idea without fsspec: workers
upload and return small entries, the driver commits them once.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from .api import Store, TransferResult
from .core.address import SCHEME, check_write_target, parse
from .core import treeobj
from .core.errors import InvalidAddressError

STAGE_INFIX = ".stage-"


def stage_branch(branch: str) -> str:
    """A fresh staging branch name for a deferred commit to `branch`."""
    return f"{branch}{STAGE_INFIX}{secrets.token_hex(4)}g"  # the 'g': never read as a commit id


@dataclass
class DeferredCommit:
    """A deferred commit to `dest`'s branch (see the module doc); use `deferred_commit`."""

    dest: str
    store: str | None = None
    token: str | None = None
    cache: object = False
    message: str = ""
    result: TransferResult | None = None  # the landed commit, after a clean exit
    stage: str = ""
    _base: str | None = None  # the branch head at entry (None: the branch is new)
    _stage_base: str = ""
    _extra: dict = field(default_factory=dict)

    @property
    def storage_options(self) -> dict:
        """fsspec options for `cdc://` that route this branch's writes to the staging branch."""
        a = parse(self.dest[len(SCHEME):] if self.dest.startswith(SCHEME) else self.dest)
        return {"store": self.store, "token": self.token, "cache": self.cache,
                "stage": {f"{a.repo}@{a.ref}": self.stage}, **self._extra}

    def _store(self) -> Store:
        return Store(self.store, token=self.token, cache=self.cache)

    def __enter__(self) -> "DeferredCommit":
        a = parse(self.dest[len(SCHEME):] if self.dest.startswith(SCHEME) else self.dest)
        check_write_target(a.ref)
        self.stage = stage_branch(a.ref)
        with self._store() as s:
            self._base = s.branches(a.repo).get(a.ref) if a.repo in s.repos() else None
            if self._base is not None:
                s.create_branch(a.repo, self.stage, self._base)
                self._stage_base = self._base
            else:  # a new branch (or repo): the staging branch starts where a push would
                self._stage_base = s.commit_files(a.repo, self.stage, [], "staging").commit
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        a = parse(self.dest[len(SCHEME):] if self.dest.startswith(SCHEME) else self.dest)
        with self._store() as s:
            try:
                if exc_type is None:
                    self.result = self._land(s, a.repo, a.ref)
            finally:
                if list(s.branches(a.repo)) != [self.stage]:  # a repo keeps its last branch (no files)
                    s.delete_branch(a.repo, self.stage)

    def _land(self, s: Store, repo: str, branch: str) -> TransferResult | None:
        """The staging branch's changes as one commit on `branch` (None: nothing written)."""
        base = s.view(repo, s.get_commit(repo, self._stage_base))
        head = s.view(repo, s.get_commit(repo, s.branches(repo)[self.stage]))
        changed, removed = treeobj.changes(base, head)  # reads only the folders that differ
        if not changed and not removed:
            return None
        names = sorted(changed) or sorted(removed)
        message = self.message or f"write {len(changed)} files: {', '.join(names[:3])}" + \
            (" ..." if len(names) > 3 else "")
        return s.commit_files(repo, branch, [], message, remove=sorted(removed), entries=changed,
                              parent=self._base)


def deferred_commit(dest: str, store: str | None = None, *, token: str | None = None, cache=False,
                    message: str = "", **options) -> DeferredCommit:
    """A context manager whose `storage_options` make every `cdc://` write to DEST's
    branch, from any process, join ONE commit made at the block's clean exit (see the
    module doc); `.result` is that commit's TransferResult. `options` go to the
    filesystem too."""
    if not isinstance(dest, str) or not dest:
        raise InvalidAddressError("deferred_commit needs a destination like cdc://REPO@BRANCH/")
    d = DeferredCommit(dest, store, token, cache, message)
    d._extra = dict(options)
    return d

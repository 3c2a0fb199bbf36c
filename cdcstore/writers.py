"""Many writers, one commit, through `cdc://` (dask, Ray, pyarrow in many processes).

    from cdcstore.writers import deferred_commit
    with deferred_commit("cdc://ds@main/", store="http://host:8470") as dc:
        df.to_parquet("cdc://ds@main/out/", storage_options=dc.storage_options)   # any scheduler
    print(dc.result.commit)  # here, and not before: ONE new commit on ds@main with every file

Upload first, commit once. Entering the block opens a *job* in the store (a journal:
`storage/staging.py`, through a server its job routes). Inside it, every `cdc://` write
made with these storage options, in any process or machine, uploads its file (chunks, then
manifest) and adds ONE small entry object (path -> manifest, size) to the job's journal: no
commit per file, O(1) objects per file. At a clean exit the driver lists the journal once,
merges the entries (a retried task's identical entry counts once; two different entries for
one path are an error), lands ONE commit made against the head seen at entry (newer commits
that touch other paths are kept; overlapping ones conflict), and closes the job. On an error
(a worker killed, a task failed) nothing lands and the job is closed: readers of BRANCH never
see part of the write, and running the job again lands it. A writer still running after the
job closed has its late entry refused and removed. A driver killed inside the block leaves a
journal whose heartbeat stops; gc deletes it after the grace window (`storage/maintenance.py`).

`Store.upload` and `Store.commit_entries` are the same idea without fsspec: workers
upload and return small entries, the driver commits them once.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from . import runtime
from .api import Store, TransferResult
from .core.address import SCHEME, check_write_target, parse
from .core.errors import InvalidAddressError

if TYPE_CHECKING:
    from .api import ChunkCache

HEARTBEAT = 3600.0  # seconds between touches of a job's marker (well under the stale window)


def new_job() -> str:
    """A fresh job id (32 hex digits)."""
    return secrets.token_hex(16)


@dataclass
class DeferredCommit:
    """A deferred commit to `dest`'s branch (see the module doc); use `deferred_commit`."""

    dest: str
    store: str | None = None
    token: str | None = None
    cache: ChunkCache | str | bool = False
    message: str = ""
    result: TransferResult | None = None  # the landed commit, after a clean exit
    job: str = ""
    _base: str | None = None  # the branch head at entry (None: the branch is new)
    _extra: dict = field(default_factory=dict)
    _stop: Callable[[], None] | None = field(default=None, init=False, repr=False, compare=False)  # the heartbeat's

    def _address(self):
        return parse(self.dest[len(SCHEME):] if self.dest.startswith(SCHEME) else self.dest)

    @property
    def storage_options(self) -> dict:
        """fsspec options for `cdc://` that route this branch's writes to the job's journal."""
        a = self._address()
        return {"store": self.store, "token": self.token, "cache": self.cache,
                "stage": {f"{a.repo}@{a.ref}": self.job}, **self._extra}

    def _store(self) -> Store:
        return Store(self.store, token=self.token, cache=self.cache)

    def __enter__(self) -> "DeferredCommit":
        a = self._address()
        check_write_target(a.ref)
        self.job = new_job()
        with self._store() as s:
            self._base = s.branches(a.repo).get(a.ref) if a.repo in s.repos() else None
            s.journal().open(a.repo, self.job)
        self._stop = runtime.every(HEARTBEAT, self._beat, name="job")
        return self

    def _beat(self) -> None:
        """Touch the job's marker (every HEARTBEAT seconds): gc keeps a live job's files."""
        with self._store() as s:
            s.journal().open(self._address().repo, self.job)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._stop is not None:
            self._stop()
        a = self._address()
        with self._store() as s:
            if exc_type is None:  # land closes the job, landed or not
                self.result = s.land(f"{a.repo}@{a.ref}", self.job, self.message, parent=self._base)
            else:
                s.journal().close(a.repo, self.job)


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

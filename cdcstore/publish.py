"""What the S3 gateway's writes (remote/gateway/writes.py) ask of the write path: the same `Store`
calls a push makes, over the server's own repository (docs/gateway.md, "Writes").

`cdcstore serve` hands a `Publisher` to the gateway (the remote layer cannot import the faces
above it): a file the gateway received is stored as `Store.upload` stores a pushed file (chunked
by the one chunker, Parquet page-aware, only new chunks packed, the manifest after its chunks are
durable, all inside a push session so a gc deletes nothing under it), and committed as
`Store.commit_files` commits (a tag refused, a commit rebased over newer ones that touch other
paths). A write that loses a race on the same path is made again on the new head: the last
writer wins, as on S3.

Writes to one branch by one author that arrive while a commit of it is being made land together
as one commit (`engine.groups.GroupCommits`).
"""
from __future__ import annotations

from typing import Iterable

from .api import GroupCommits, Prechunk, Prehashed, Store
from .core.address import DEFAULT_BRANCH, Address
from .core.commit import FileEntry, check_author

class Publisher:
    """The write path over one repository (the server's)."""

    def __init__(self, repository):
        self._repository = repository
        self._groups = GroupCommits(self._store)

    def _store(self, author: str | None = None) -> Store:
        store = Store.over(self._repository)
        if author is not None:
            store.author = check_author(author)
        return store

    def upload(self, repo: str, path: str, local: str, prehashed: Prehashed | None = None) -> FileEntry:
        """Store a local file's chunks and manifest as a push does; nothing is committed.
        `prehashed`: its chunks this process already hashed and stored from the same bytes
        (`engine.prechunk`, a multipart upload chunked as its parts arrived)."""
        entries = self._store().upload([local], Address(repo, None, path), prehashed=prehashed)
        return entries[path]

    def prechunk(self, path: str) -> Prechunk:
        """A growing file to chunk a multipart upload of `path` in as its parts arrive
        (`engine.prechunk`); `upload` it with `prehashed` from its `finish`."""
        return self._store().prechunk(path)

    def commit(self, repo: str, branch: str, entries: dict[str, FileEntry], removed: Iterable[str],
               message: str, author: str, expect: dict[str, str | None] | None = None) -> str | None:
        """Land a write on `branch`: set `entries`, remove those of `removed` that exist; the id of
        the commit that holds it (None when it changed nothing). With other writes of the branch by
        `author` in flight, in one group commit (`engine.groups`). `expect`: path -> the manifest
        id the head must hold there, or None for no file (S3's If-Match / If-None-Match: *);
        FileExistsError otherwise."""
        return self._groups.commit(repo, branch, entries, removed, message, author, expect)

    def create(self, repo: str, author: str) -> str | None:
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

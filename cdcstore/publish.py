"""What the S3 gateway's writes (remote/gateway_write.py) ask of the write path: the same `Store`
calls a push makes, over the server's own repository (docs/gateway.md, "Writes").

`cdcstore serve` hands a `Publisher` to the gateway (the remote layer cannot import the faces
above it): a file the gateway received is stored as `Store.upload` stores a pushed file (chunked
by the one chunker, Parquet page-aware, only new chunks packed, the manifest after its chunks are
durable, all inside a push session so a gc deletes nothing under it), and committed as
`Store.commit_files` commits (a tag refused, a commit rebased over newer ones that touch other
paths). A write that loses a race on the same path is made again on the new head: the last
writer wins, as on S3.
"""
from __future__ import annotations

from typing import Iterable

from .api import Store
from .core.address import DEFAULT_BRANCH, Address
from .core.commit import FileEntry, check_author
from .core.errors import ConflictError, NotFoundError, PathNotFoundError

RETRIES = 8  # commits made again when another writer changed the same paths first


class Publisher:
    """The write path over one repository (the server's)."""

    def __init__(self, repository):
        self._repository = repository

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
        """One commit on `branch` setting `entries` and removing those of `removed` that exist; the
        landed commit id (None when nothing changed). Made again on the new head when another
        writer changed the same paths first. `expect`: path -> the manifest id the head must hold
        there, or None for no file (S3's If-Match / If-None-Match: *); FileExistsError otherwise,
        checked against each head a commit is made on (a race on the path is a conflict, then a
        new check)."""
        removed = list(removed)
        store = self._store(author)
        for attempt in range(RETRIES):
            # the commit is made on the head the conditions were checked on: a writer landing in
            # between makes it a rebase, and a rebase over the same path a conflict (then a new check)
            base = self._check_expected(store, repo, branch, expect) if expect else None
            gone = self.existing(repo, branch, removed) if removed else []
            if not entries and not gone:
                return None
            try:
                result = store.commit_files(repo, branch, [], message, entries=dict(entries), remove=gone,
                                            **({"parent": base} if base else {}))
            except (ConflictError, PathNotFoundError):
                if attempt == RETRIES - 1:
                    raise
                continue
            return result.commit if result.changed else None
        return None

    @staticmethod
    def _check_expected(store: Store, repo: str, branch: str, expect: dict[str, str | None]) -> str | None:
        """The head `expect` holds on: the branch's, or for a branch not made yet the default
        branch's head it will be made from (issue 43: a create-only write on a new branch was
        checked against no files and landed over an inherited one); None when there is none.
        FileExistsError when it does not hold."""
        commit = view = None
        for rev in (branch, DEFAULT_BRANCH):
            try:
                _, commit = store.resolve(Address(repo, rev, ""))
                view = store.view(repo, commit)
                break
            except NotFoundError:
                continue
        for path, want in expect.items():
            entry = view.get(path) if view is not None else None
            if (entry.manifest if entry is not None else None) != want:
                raise FileExistsError(f"{path!r} is {'there' if entry is not None else 'absent'} on {branch!r}, "
                                      f"not as the write's condition says")
        return commit.id if commit is not None else None

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

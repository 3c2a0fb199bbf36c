"""The whole store the faces see: `Backend`, the composition of the roles of `roles.py`.

A `Backend` is a store, local or remote: chunks and packs (`ChunkSource`, `ChunkSink`),
manifests, trees and commits (`MetadataStore`), repos, branches and tags (`RefStore`), and
sessions, journals and maintenance (`Upkeep`). `repository.Repository` implements it over any object store (a directory,
S3, memory); `remote.client.RemoteStore` over HTTP; `cache.CachedBackend` in front of
another backend.
"""
from __future__ import annotations

import abc
from concurrent.futures import Future
from typing import Any, Iterable, Iterator

from .. import runtime
from ..core import treeobj
from ..core.commit import Commit, FileEntry
from ..core.manifest import Manifest
from ..core.pack import PackEntry
from .roles import BackendCapabilities, ChunkSink, ChunkSource, MetadataStore, Raw, RefStore, Upkeep


ZERO_COUNTERS = {"requests": 0, "sent_bytes": 0, "received_bytes": 0}


class Backend(ChunkSource, ChunkSink, MetadataStore, RefStore, Upkeep, abc.ABC):
    """A whole store, local or remote: the composition of the roles of `roles.py` (what `Store`
    holds; the writer, the reader and the rest each rely on the narrowest role they use).

    Chunk ids are 32-byte BLAKE3 digests (16-byte xxh3 in format-v1 data) and hex strings name packs, manifests and
    commits. Implementations keep the write order of invariant 2. What differs
    between implementations is declared in `capabilities` (docs/architecture.md,
    "Backends and capabilities").
    """

    location: str
    capabilities: BackendCapabilities = BackendCapabilities()

    @property
    def identity(self) -> str:
        """What tells this store from any other a machine reaches (caches are keyed by it):
        the location, with the endpoint for a bucket."""
        return self.location

    def counters(self) -> dict[str, int]:
        """Requests and bytes on the wire so far (zeros unless `counts_requests`)."""
        return dict(ZERO_COUNTERS)

    def cache_counters(self) -> dict[str, int]:
        """Chunk reads a local cache served (`cache_hits`) and did not (`cache_misses`)."""
        return {"cache_hits": 0, "cache_misses": 0}

    def uncached(self) -> "Backend":
        """The backend without any local cache in front (answers as of now)."""
        return self

    # chunks and packs (ChunkSource, ChunkSink: the rest have default bodies there)
    @abc.abstractmethod
    def present(self, chunk_ids: list[bytes]) -> set[bytes]: ...

    @abc.abstractmethod
    def begin_push(self) -> None: ...
    @abc.abstractmethod
    def tmp_path(self) -> str: ...
    @abc.abstractmethod
    def add_pack(self, tmp: str, name: str, entries: list[PackEntry]) -> Future[Any] | None:
        """Store a finished pack; returns None when it is durable on return, or a future
        that completes when it is (a background upload)."""

    @abc.abstractmethod
    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> dict[bytes, tuple[str, PackEntry]]: ...
    @abc.abstractmethod
    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> Raw: ...

    # manifests, commits (MetadataStore), branches and tags (RefStore)
    @abc.abstractmethod
    def put_manifests(self, manifests: list[Manifest]) -> list[str]: ...
    @abc.abstractmethod
    def get_manifest(self, name: str, repo: str | None = None) -> Manifest: ...
    @abc.abstractmethod
    def commit(self, commit: Commit, branch: str, expected: str | None) -> str:
        """Store `commit` as given (make it with `make_commit`: format 2, its trees stored) and
        move `branch` from `expected` to it (compare-and-swap); ConflictError if the branch
        moved. Returns the commit id (a rebased copy's, format 2, if the branch had moved)."""
    @abc.abstractmethod
    def get_commit(self, repo: str, commit_id: str) -> Commit: ...

    # trees (format 2 commits name a root tree; docs/format.md): get_tree, put_trees in MetadataStore
    def bound(self, repo: str, commit: Commit) -> Commit:
        """`commit` whose `files` (the whole map, for callers that want it) reads its trees here."""
        if commit.tree is not None:
            commit.bind(lambda: self.view(repo, commit).files())
        return commit

    def get_trees(self, names: list[str], repo: str | None = None) -> list[treeobj.Tree]:
        """`get_tree` of each name, in order (on 8 threads; a remote store asks for them in one
        request)."""
        if len(names) <= 1:
            return [self.get_tree(n, repo) for n in names]
        return list(runtime.pool("trees", 8).map(lambda n: self.get_tree(n, repo), names))

    def view(self, repo: str, commit: Commit) -> treeobj.View:
        """A commit's files, read folder by folder: the one way to read them, for both formats
        (a format 1 commit's flat map is built into trees in memory)."""
        load = lambda tid: self.get_tree(tid, repo)  # noqa: E731
        if commit.tree is None:
            return treeobj.View.of_files(commit.files, load)
        return treeobj.View(load, commit.tree, load_many=lambda tids: self.get_trees(tids, repo))

    def make_commit(self, repo: str, parent: str | None, message: str, time: float,
                    changed: dict[str, FileEntry], removed: Iterable[str] = (), base: Commit | None = None,
                    author: str | None = None) -> Commit:
        """A commit of `parent` (whose commit is `base`, read if not given) with `changed` set
        and `removed` taken out, by `author` (format 3; format 2 without one); stores the new
        trees (only those on changed paths, and a format 1 parent's once). Raises
        treeobj.Clash for a file/folder clash."""
        if base is None and parent is not None:
            base = self.get_commit(repo, parent)
        root, nodes = treeobj.apply(self.view(repo, base) if base else None, changed, removed)
        self.put_trees(nodes)
        return Commit(repo, parent, message, time, None, root, author)

    def as_format2(self, commit: Commit) -> Commit:
        """`commit` as format 2: a format 1 commit's trees are built and stored (all of them:
        callers should make commits with `make_commit`, whose cost follows the change)."""
        if commit.tree is not None:
            return commit
        commit.validate()
        root, nodes = treeobj.build(commit.files)
        self.put_trees(nodes)
        return Commit(commit.repo, commit.parent, commit.message, commit.time, None, root)
    def resolve(self, repo: str, rev: str) -> str:
        return self.resolve_ref(repo, rev)[0]

    @abc.abstractmethod
    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        """(commit id, "commit" | "branch" | "tag") of a revision (see docs/format.md)."""
    @abc.abstractmethod
    def branches(self, repo: str) -> dict[str, str]: ...
    @abc.abstractmethod
    def tags(self, repo: str) -> dict[str, str]: ...
    @abc.abstractmethod
    def create_tag(self, repo: str, name: str, commit_id: str) -> None:
        """A new tag; RefExistsError if the name is taken by a tag or a branch."""
    @abc.abstractmethod
    def delete_tag(self, repo: str, name: str) -> str: ...
    @abc.abstractmethod
    def create_branch(self, repo: str, name: str, commit_id: str) -> None: ...
    @abc.abstractmethod
    def delete_branch(self, repo: str, name: str) -> str:
        """Remove a branch (never the last one of a repo); returns the commit it named."""
    @abc.abstractmethod
    def has_repo(self, repo: str) -> bool: ...
    @abc.abstractmethod
    def repos(self) -> list[str]: ...
    @abc.abstractmethod
    def totals(self) -> dict[str, int]: ...

    def log(self, repo: str, rev: str) -> Iterator[tuple[str, Commit]]:
        cid: str | None = self.resolve(repo, rev)
        while cid:
            c = self.get_commit(repo, cid)
            yield cid, c
            cid = c.parent

    def close(self) -> None:
        pass

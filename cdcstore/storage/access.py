"""Access records: what a server lets each token read on a shared store (docs/protocol.md
"Trust model"; docs/architecture.md "Replicas"). Only a server keeps them: a local commit
(a directory, or a bucket without a server) records nothing.

Two kinds, both in the chunk index's tables (a rebuildable cache):
- what a repo reaches (`repo_objects`, `repo_chunks`): derived from its landed commits
  (`reach.walk`, so a forgotten commit grants nothing), granted when a commit lands through the
  server and re-derived from the refs on a miss (another replica or writer landed it);
- what a token uploaded or proved (`token_chunks`): each acknowledged upload or proof is also
  written to a content-named object `grants/<owner>/<hash of the ids>` that every replica reads.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Protocol

from .. import runtime
from ..core import ids, treeobj
from ..core.address import check_name
from ..core.commit import Commit
from ..core.errors import CdcError, InvalidAddressError
from ..core.manifest import Manifest
from . import reach
from .index import ChunkIndex
from .manifest_file import ManifestFile, ManifestHost
from .objects import NotFound, ObjectStore
from .refs import Added, Refs
from .repository import DELETED



class Recorded(reach.Graph, ManifestHost, Protocol):
    """What access records need of a store (a `Repository` is one): with what `ManifestFile`
    reads manifests through, its index and its refs (`ref_store`: refs, delete_repo)."""

    objects: ObjectStore

    @property
    def index(self) -> ChunkIndex: ...

    @property
    def ref_store(self) -> Refs: ...

    def has_repo(self, repo: str) -> bool: ...

    def get_manifest(self, name: str, repo: str | None = None) -> Manifest: ...

    def get_tree(self, name: str, repo: str | None = None) -> treeobj.Tree: ...

    def commit(self, commit: Commit, branch: str, expected: str | None,
               landed: Callable[[Commit, Added], object] | None = None) -> str: ...


PARENTS_KEPT = 1 << 16  # entries of trees granted by `grant_if_headed` that lend them their grant


class AccessRecords:
    """The server's access records over `store`: grants of repos and of tokens, and the
    queries a scoped token's requests make of them."""

    def __init__(self, store: Recorded):
        self.store = store
        self._lock = runtime.Lock(reentrant=True)
        self._granted: dict[str, set[str]] = {}  # repo -> commits whose whole history's reach is recorded
        self._token_grants: dict[str, set[str]] = {}  # owner -> grant objects this process read
        self._parents: dict[tuple[str, str, str], str] = {}  # (repo, kind, name) -> a granted tree naming it

    @property
    def index(self) -> ChunkIndex:
        return self.store.index

    # -- what a repo reaches -----------------------------------------------------------------------
    def commit(self, commit: Commit, branch: str, expected: str | None) -> str:
        """`store.commit`, then (only once the branch has moved to it) grant the repo what the
        landed commit adds: a compare-and-swap that fails grants nothing."""
        return self.store.commit(commit, branch, expected, landed=self._grant)

    def _grant(self, commit: Commit, added: Added) -> None:
        """Record that the commit's repo reaches these trees, manifests and chunks."""
        trees, names, chunk_ids = added
        self.index.grant(commit.repo, "tree", trees)
        self.index.grant(commit.repo, "manifest", names)
        self.index.grant_chunks("repo_chunks", commit.repo, chunk_ids)

    def refresh(self, repo: str) -> int:
        """Grant what `repo`'s landed commits reach, for commits this process has not granted
        yet: another replica (or a writer on another machine) may have landed them. Walks each
        branch and tag back to a commit whose whole history it granted (`reach.walk`, each kept
        commit measured against its nearest kept ancestor); returns how many commits it walked.
        Called on a reach miss, never on the hot path."""
        check_name("repo", repo)
        if not self.store.has_repo(repo):
            return 0
        with self._lock:
            done = self._granted.setdefault(repo, set())
            walked: list[str] = []
            pending: tuple[set[str], set[str]] = (set(), set())

            def flush() -> None:  # one commit's additions at a time: memory follows one commit
                trees, names = pending
                if not trees and not names:
                    return
                chunk_ids: set[bytes] = set()
                for n in names:
                    for part in ManifestFile(self.store, n).scan():
                        chunk_ids.update(part)
                self.index.grant(repo, "tree", trees)
                self.index.grant(repo, "manifest", names)
                self.index.grant_chunks("repo_chunks", repo, chunk_ids)
                trees.clear()
                names.clear()

            for f in reach.walk(self.store, repo, self.store.ref_store.refs(repo), stop=done, diff=True):
                if f.kind == "commit":
                    flush()
                    walked.append(f.name)
                elif f.kind == "tree":
                    pending[0].add(f.name)
                else:
                    pending[1].add(f.name)
            flush()
            done.update(walked)  # only now is each walked commit's whole history granted
        return len(walked)

    def grant_if_headed(self, repo: str, name: str, kind: str = "manifest") -> bool:
        """Grant `repo` one manifest (and its chunks) or one tree if a commit that a branch or
        tag of `repo` names now reaches it: what a first read of a current file or folder
        needs, at the cost of the refs and their trees, not of the whole history (`refresh`)."""
        check_name("repo", repo)
        parent = self._parents.get((repo, kind, name))
        if parent is not None and self.index.reaches(repo, "tree", parent):  # what a reached tree names
            self._grant_one(repo, name, kind)  # is reached: a read walking down costs its path
            return True
        if not self.store.has_repo(repo):
            return False
        heads = {c: c for c in self.store.ref_store.refs(repo).values()}
        wanted = "tree" if kind == "tree" else "file"
        for f in reach.walk(self.store, repo, heads, history=False):
            if f.kind == wanted and f.name == name:
                self._grant_one(repo, name, kind)
                return True
        return False

    def _grant_one(self, repo: str, name: str, kind: str) -> None:
        """Grant `repo` one manifest (and its chunks) or one tree, and remember what the tree names."""
        self.index.grant(repo, kind, [name])
        if kind == "manifest":
            self.index.grant_chunks("repo_chunks", repo, self.store.get_manifest(name).chunk_ids)
            return
        try:
            named = {(repo, kind, child): name for kind, child in self.store.get_tree(name, repo).named()}
        except CdcError:  # damaged or gone: its read reports it
            return
        with self._lock:
            if len(self._parents) + len(named) > PARENTS_KEPT:
                self._parents.clear()  # a cache: a miss walks the refs' trees again
            self._parents.update(named)

    def reaches(self, repo: str, kind: str, name: str) -> bool:
        """Whether `repo` is recorded as reaching manifest (or tree) `name`."""
        return self.index.reaches(repo, kind, name)

    def reached(self, chunk_ids: Iterable[bytes], repos: list[str], owner: str | None) -> set[bytes]:
        """The chunks among `chunk_ids` that one of `repos` reaches or token `owner` uploaded."""
        return self.index.reached(chunk_ids, repos, owner)

    def visible(self, chunk_ids: Iterable[bytes], repos: list[str], owner: str | None) -> set[bytes]:
        """`reached`, among the chunks the index holds: what a scoped token may learn of."""
        return self.index.visible(chunk_ids, repos, owner)

    def totals(self, repos: list[str]) -> dict[str, int]:
        """Chunk totals over what `repos` reach (their landed commits granted first)."""
        for r in repos:
            with contextlib.suppress(InvalidAddressError):
                self.refresh(r)
        return self.index.reach_totals(repos)

    # -- deleted repos -----------------------------------------------------------------------------
    def delete_repo(self, repo: str, dry_run: bool = False) -> dict[str, object]:
        """`store.ref_store.delete_repo` (which drops the index's records of the repo and leaves a
        tombstone for other replicas), and this process's memory of the repo's grants."""
        out = self.store.ref_store.delete_repo(repo, dry_run)
        if not dry_run:
            self.drop(repo)
        return out

    def drop(self, repo: str) -> None:
        """Forget what a deleted repo reached: a new repo of that name (and its tokens) starts
        with nothing, neither the old totals nor the old chunks."""
        with self._lock:
            self._granted.pop(repo, None)
            self.index.drop_repo(repo)

    def drop_deleted(self) -> list[str]:
        """Drop the records of repos deleted since (through another replica or machine): a
        tombstone `deleted/<repo>/<time>-<random>` this index has not seen, or a recorded repo
        that no longer exists. Returns the repos whose records were dropped."""
        seen = self.index.tombstones()
        fresh = [i.name for i in self.store.objects.list(DELETED) if i.name not in seen]
        gone = {n.split("/")[1] for n in fresh if n.count("/") == 2}
        for r in self.index.granted_repos() - gone:
            with contextlib.suppress(InvalidAddressError):
                if self.store.has_repo(r):
                    continue
            gone.add(r)
        for r in sorted(gone):
            self.drop(r)
        self.index.add_tombstones(fresh)
        return sorted(gone)

    # -- what a token uploaded or proved -----------------------------------------------------------
    def record_upload(self, owner: str, chunk_ids: Iterable[bytes]) -> None:
        """Record that token `owner` (a hash of the token) may use these chunks, locally and
        in a content-named object `grants/<owner>/<hash of the ids>` that every replica can
        read (written before the upload or proof is acknowledged)."""
        wanted = sorted(set(chunk_ids))
        if not wanted:
            return
        if any(len(c) != ids.ID_BYTES for c in wanted):  # a grant's name says its ids' width
            raise ValueError(f"token grants hold {ids.ID_BYTES}-byte chunk ids only")
        body = b"".join(wanted)
        check_name("owner", owner)
        self.store.objects.put(f"grants/{owner}/{ids.hexdigest(body)}", body, exist_ok=True)
        self.index.grant_chunks("token_chunks", owner, wanted)

    def refresh_uploads(self, owner: str) -> int:
        """Import the grant objects of token `owner` that this process has not read yet
        (uploads and proofs made through another replica); returns how many."""
        check_name("owner", owner)
        added = 0
        with self._lock:
            seen = self._token_grants.setdefault(owner, set())
            for info in self.store.objects.list(f"grants/{owner}/"):
                if info.name in seen:
                    continue
                with contextlib.suppress(NotFound, FileNotFoundError):
                    body = bytes(self.store.objects.get(info.name))
                    name = info.name.rsplit("/", 1)[-1]
                    width = ids.LEGACY_ID_BYTES if ids.is_legacy(name) else ids.ID_BYTES  # v1 grants: 16
                    if ids.is_hex_id(name) and ids.matches(body, name) and len(body) % width == 0:
                        self.index.grant_chunks("token_chunks", owner,
                                                [body[i:i + width] for i in range(0, len(body), width)])
                        added += 1
                seen.add(info.name)
        return added

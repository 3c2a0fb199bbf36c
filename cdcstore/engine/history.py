"""Revisions and refs for the faces: what `Store.log`, `diff`, `branches`, `tags` and the ref
commands answer, over a store's `MetadataStore` and `RefStore` roles (storage/roles.py)."""
from __future__ import annotations

from typing import Iterator

from ..core import filemap
from ..core import treeobj
from ..core.address import DEFAULT_BRANCH, Address, check_name, check_ref_name, normalize_path, parse
from ..core.commit import Commit, FileEntry
from ..core.errors import CdcError, InvalidAddressError
from ..storage.backend import Backend
from ..storage.repository import no_such_path


def as_address(addr: str | Address) -> Address:
    return addr if isinstance(addr, Address) else parse(addr)


def _pairs(history: Iterator) -> Iterator:
    """Each item of an iterator with the one after it (None after the last)."""
    it = iter(history)
    prev = next(it, None)
    while prev is not None:
        nxt = next(it, None)
        yield prev, nxt
        prev = nxt


class History:
    """A store's revisions and refs: commits back from a revision, what changed between two,
    branches and tags (made at a revision resolved as of now, never from a cache)."""

    def __init__(self, store: Backend):
        self.store = store

    def resolve(self, addr: str | Address) -> tuple[str, Commit]:
        a = as_address(addr)
        cid = self.store.resolve(a.repo, a.ref)
        return cid, self.store.get_commit(a.repo, cid)

    def at(self, a: Address) -> tuple[str, treeobj.View]:
        """The commit a.ref names and its files; PathNotFoundError if nothing is at a.path
        (reads only the trees on the path)."""
        cid, commit = self.resolve(a)
        view = self.store.view(a.repo, commit)
        if a.path and view.kind(a.path) is None:
            raise no_such_path(a.repo, a.ref, a.path)
        return cid, view

    def files(self, a: Address) -> tuple[str, treeobj.View, dict[str, FileEntry]]:
        """The commit a.ref names, its files, and those at or under a.path, keyed by their full path."""
        cid, view = self.at(a)
        return cid, view, view.under(a.path)

    def log(self, repo: str, rev: str = DEFAULT_BRANCH, limit: int | None = None,
            path: str | None = None) -> list[dict]:
        """Commits from `rev` back to the first, newest first; at most `limit`. With `path`,
        only the commits that changed the file or folder at `path`."""
        if limit is not None and limit < 0:
            raise InvalidAddressError(f"log limit must be 0 or more, not {limit}")
        path = normalize_path(path) if path else None
        out: list[dict] = []
        history = self.store.log(check_name("repo", repo), rev)
        forgotten = self.forgotten(repo)
        for (cid, c), older in _pairs(history):
            if limit is not None and len(out) >= limit:
                break
            gone = forgotten is not None and cid in forgotten
            view = self.store.view(repo, c)
            entry = {"commit": cid, "parent": c.parent, "message": c.message, "time": c.time, "author": c.author,
                     "files": None, "bytes": None, "forgotten": gone}
            if gone:  # its files are freed (or about to be): history only
                if path is None:
                    out.append(entry)
                continue
            try:
                if path is not None:  # the same file or folder has the same entry (a folder: its tree's id)
                    before = self.store.view(repo, older[1]).entry(path) if older and older[0] not in (
                        forgotten or ()) else None
                    if view.entry(path) == before:
                        continue
                entry.update(files=view.file_count(), bytes=view.size())
            except CdcError:
                if forgotten is not None or not self.was_forgotten(repo, cid):
                    raise
                entry["forgotten"] = True  # a server's store: found when its files are gone
                if path is not None:
                    continue
            out.append(entry)
        return out

    def replaced_paths(self, repo: str, commit: str, paths: list[str]) -> set[str]:
        """Which of `paths` the parent of `commit` already held (files a push replaced)."""
        c = self.store.get_commit(repo, commit)
        if not c.parent:
            return set()
        view = self.store.view(repo, self.store.get_commit(repo, c.parent))
        return {p for p in paths if isinstance(view.entry(p), FileEntry)}

    def forgotten(self, repo: str) -> set[str] | None:
        """The forgotten commits of `repo` (`forget`), or None where the backend cannot list
        them (a server before the route: a commit is then known forgotten once its files are gone)."""
        return self.store.uncached().forgotten(repo)

    def was_forgotten(self, repo: str, cid: str) -> bool:
        try:
            self.store.resolve_ref(repo, cid)
            return False
        except CdcError as e:
            return "was forgotten" in str(e)

    def diff(self, old: str | Address, new: str | Address) -> list[dict]:
        """Files added, removed and changed from revision `old` to `new` (addresses; a path
        narrows both), each with its bytes and `new_bytes`: the bytes of its chunks that `old`
        does not hold anywhere (what storing `new` after `old` costs for that file)."""
        a, b = as_address(old), as_address(new)
        _, ca = self.resolve(a)
        _, cb = self.resolve(b)
        before = self.store.view(a.repo, ca).under(a.path)
        after = self.store.view(b.repo, cb).under(b.path)
        added, removed, changed = filemap.diff(before, after)
        held: set[bytes] = set()
        for f in before.values():
            held.update(self.store.get_manifest(f.manifest, a.repo).chunk_ids)
        out = [{"path": p, "change": "removed", "bytes": before[p].size, "new_bytes": 0} for p in removed]
        for kind, paths in (("added", added), ("changed", changed)):
            for p in paths:
                m = self.store.get_manifest(after[p].manifest, b.repo)
                seen: set[bytes] = set()
                new_bytes = 0
                for i, c in enumerate(m.chunk_ids):
                    if c not in held and c not in seen:
                        seen.add(c)
                        new_bytes += m.lengths[i]
                out.append({"path": p, "change": kind, "bytes": m.size, "new_bytes": new_bytes})
        return sorted(out, key=lambda e: e["path"])

    def branches(self, repo: str) -> dict[str, str]:
        return self.store.branches(check_name("repo", repo))

    def tags(self, repo: str) -> dict[str, str]:
        return self.store.tags(check_name("repo", repo))

    def resolve_now(self, repo: str, rev: str) -> str:
        """The commit `rev` names on the store now (never a cached branch head)."""
        return self.store.uncached().resolve(check_name("repo", repo), rev)

    def create_ref(self, kind: str, repo: str, name: str, rev: str) -> str:
        check_ref_name(kind, name)
        cid = self.resolve_now(repo, rev)
        (self.store.create_tag if kind == "tag" else self.store.create_branch)(repo, name, cid)
        return cid

    def delete_tag(self, repo: str, name: str) -> str:
        return self.store.delete_tag(check_name("repo", repo), check_name("tag", name))

    def delete_branch(self, repo: str, name: str, force: bool = False) -> str:
        """Remove a branch. The default branch only with `force`: an address without a revision
        (`cdc://REPO/path`) reads it, and would fail while the repo's other branches live on."""
        check_name("repo", repo), check_name("branch", name)
        if name == DEFAULT_BRANCH and not force:
            raise InvalidAddressError(
                f"{name!r} is the default branch of repo {repo!r}: addresses without a revision "
                f"(cdc://{repo}/...) read it. Delete it anyway with --force (force=True), or make "
                f"another branch the one you read by naming it (cdc://{repo}@BRANCH/...)")
        return self.store.delete_branch(repo, name)

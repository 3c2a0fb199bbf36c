"""A server's repos, branches and tags, and the commit that moves a branch: `RemoteRefs`.

It plays `roles.RefStore` for a `client.RemoteStore` (which offers its methods as its own), over
the routes of docs/protocol.md. Heads are never kept here: every resolve asks the server (the
callers that may serve them briefly are the chunk cache and the filesystem, storage/memo.py),
and a write through this process drops the heads it moved at once (`memo.wrote`). A commit the
server rebased onto a moved head is checked to hold this commit's changes, by its author.
"""
from __future__ import annotations

import json

from ...core import ids, treeobj
from ...core.commit import Commit
from ...core.errors import CdcError, CorruptionError, NotFoundError, RepoNotFoundError
from ...core.wire import url_repo
from ...storage import memo


class RemoteRefs:
    """The refs of the store behind one `client.RemoteStore` (its requests, scope and views)."""

    def __init__(self, store):
        self._store = store  # client.RemoteStore: its requests, `scope`, `view`, `get_commit`

    def _json(self, method: str, path: str, **kw) -> dict:
        return self._store._json(method, path, **kw)

    def _wrote(self, repo: str, rev: str) -> None:
        """The one invalidation rule (storage/memo.py): this write moved `rev`'s heads."""
        memo.wrote(memo.identity(self._store.location), repo, rev)

    def commit(self, commit: Commit, branch: str, expected: str | None) -> str:
        """Send `commit`. A server with tokens records the token's name as its author (the
        answer's "author"): the commit it stores is ours with that author, rebased or not."""
        sent = commit  # stored as given: `make_commit` makes format 2 and 3 commits
        if self._store.legacy_trees and commit.tree is not None:  # a server before protocol 1.5 takes format 1 only
            sent = Commit(commit.repo, commit.parent, commit.message, commit.time,
                          self._store.view(commit.repo, commit).files())
        try:
            answer = self._post_commit(sent, branch, expected)
        except CdcError as e:
            if sent.author is None or "commit format 3" not in str(e):
                raise
            sent = Commit(sent.repo, sent.parent, sent.message, sent.time, None, sent.tree)  # a server
            answer = self._post_commit(sent, branch, expected)  # before authors: format 2, no author
        cid, author = answer["commit"], answer.get("author")
        if isinstance(author, str) and author != sent.author:
            try:  # a format 1 commit is stored as format 3 with that author (its trees built there)
                sent = sent.with_author(author) if sent.tree is not None else sent
            except ValueError as e:
                raise CorruptionError(f"server answered an invalid author: {e}") from None
        if cid != sent.id:
            self._check_rebased(sent, cid, author if isinstance(author, str) else sent.author)
        self._wrote(commit.repo, branch)
        return cid

    def _post_commit(self, sent: Commit, branch: str, expected: str | None) -> dict:
        doc = {"commit": sent.encode().decode(), "branch": branch, "expected": expected}
        return self._json("POST", f"/repos/{url_repo(sent.repo)}/commits", body=json.dumps(doc).encode(),
                          headers={"Content-Type": "application/json"})

    def _check_rebased(self, commit: Commit, landed: str, author: str | None) -> None:
        """The server rebased `commit` onto a moved head (or stored a format 1 commit as format
        3): the landed commit must hold our change set, by `author`, and nothing of ours may
        be lost (only the changed paths are read)."""
        if not ids.is_hex_id(landed):
            raise CorruptionError(f"server answered an invalid commit id {landed!r}")
        store = self._store
        got = store.get_commit(commit.repo, landed)
        base = store.view(commit.repo, store.get_commit(commit.repo, commit.parent)) if commit.parent else None
        changed, removed = treeobj.changes(base, store.view(commit.repo, commit))
        view = store.view(commit.repo, got)
        if (got.message != commit.message or got.author != author
                or any(view.get(p) != f for p, f in changed.items())
                or any(view.get(p) is not None for p in removed)):
            raise CorruptionError(f"server landed commit {landed} that does not hold this commit's changes")

    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        """Asks the server every time (heads are kept by the callers that may serve them stale:
        the chunk cache, the filesystem; storage/memo.py); the answer is noted for them."""
        scope = self._store.scope
        if ids.is_hex_id(rev) and memo.objects().has((scope, "commit", repo, rev.lower())):  # a pinned commit seen
            return rev.lower(), "commit"
        doc = self._json("GET", f"/repos/{url_repo(repo)}/resolve/{rev}")
        cid, kind = doc["commit"], doc.get("kind", "branch")
        if not ids.is_hex_id(cid) or (kind == "commit" and not cid.startswith(rev.lower())):
            raise CorruptionError(f"the server resolved {rev!r} to {cid!r}, which is not that commit")
        memo.count("heads_server")
        memo.heads().put((memo.identity(self._store.location), scope, repo, rev), cid, kind)
        return cid, kind

    def branches(self, repo: str) -> dict[str, str]:
        return self._json("GET", f"/repos/{url_repo(repo)}/branches")["branches"]

    def forgotten(self, repo: str) -> set[str] | None:
        """The repo's forgotten commits; None from a server without the route (before it)."""
        try:
            doc = self._json("GET", f"/repos/{url_repo(repo)}/forgotten")
        except RepoNotFoundError:
            raise
        except NotFoundError as e:
            if "no repo" in str(e) or getattr(e, "code", "") == "repo_not_found":
                raise
            return None
        return {c for c in doc.get("forgotten", []) if isinstance(c, str)}

    def tags(self, repo: str) -> dict[str, str]:
        return self._json("GET", f"/repos/{url_repo(repo)}/tags")["tags"]

    def _create_ref(self, repo: str, kinds: str, name: str, commit_id: str) -> None:
        body = json.dumps({"name": name, "commit": commit_id}).encode()
        self._json("POST", f"/repos/{url_repo(repo)}/{kinds}", body=body, headers={"Content-Type": "application/json"})

    def create_tag(self, repo: str, name: str, commit_id: str) -> None:
        self._create_ref(repo, "tags", name, commit_id)
        self._wrote(repo, name)

    def create_branch(self, repo: str, name: str, commit_id: str) -> None:
        self._create_ref(repo, "branches", name, commit_id)
        self._wrote(repo, name)

    def delete_tag(self, repo: str, name: str) -> str:
        cid = self._json("DELETE", f"/repos/{url_repo(repo)}/tags/{name}")["commit"]
        self._wrote(repo, name)
        return cid

    def delete_branch(self, repo: str, name: str) -> str:
        cid = self._json("DELETE", f"/repos/{url_repo(repo)}/branches/{name}")["commit"]
        self._wrote(repo, name)
        return cid

    def has_repo(self, repo: str) -> bool:
        try:
            self.branches(repo)
            return True
        except RepoNotFoundError:
            return False

    def repos(self) -> list[str]:
        return self._json("GET", "/repos")["repos"]

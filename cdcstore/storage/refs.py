"""Refs: repos, branches and tags over an object store, moved by compare-and-swap.

The `repos/` part of the store format (docs/format.md):

    repos/<repo>/commits/<id>.json         commits (stored by the repository: `commit_name`)
    repos/<repo>/branches/<branch>         the commit id a branch points at
    repos/<repo>/tags/<tag>                the commit id a tag names (never rewritten)
    repos/<repo>/forgotten/<id>            a commit `forget` dropped (empty)
    repos/<repo>/applied/<id>.<landed>     a rebased commit's copy (empty; see `update_branch`)
    deleted/<repo>/<time>-<random>         tombstones of delete-repo (replicas drop its reach)

`Refs` plays the `roles.RefStore` role for a `repository.Repository` (which delegates to it):
it reads and writes refs, resolves revisions, and lands a commit on a branch by a conditional
put, rebasing it onto a moved head when the paths do not overlap. What it needs of the
repository (commits, views, new trees, what a commit adds) is the small `RefHost` protocol.
"""
from __future__ import annotations

import contextlib
import json
import secrets
import time
from typing import Callable, ContextManager, Iterable, Iterator, Protocol

from ..core import ids, treeobj
from ..core.address import check_name, check_ref_name, check_write_target, is_commit_like
from ..core.commit import Commit, FileEntry
from ..core.errors import (CdcError, ConflictError, CorruptionError, InvalidAddressError, RefExistsError,
                           RepoNotFoundError, RevisionNotFoundError)
from .objects import Conflict, NotFound, ObjectInfo, ObjectStore

DELETED = "deleted/"  # deleted/<repo>/<time>-<random>: tombstones of delete-repo (replicas drop its reach)

#: What a commit adds to its parent: (tree ids, manifest names, chunk ids) (`RefHost.new_reach`).
Added = tuple[set[str], set[str], set[bytes]]


def valid_name(kind: str, name: str) -> bool:
    try:
        check_name(kind, name)
        return True
    except InvalidAddressError:
        return False


def commit_name(repo: str, cid: str) -> str:
    return f"repos/{repo}/commits/{cid}.json"


def landing_name(repo: str, cid: str) -> str:
    """A root commit's marker while its branch does not name it yet (`Refs.commit`)."""
    return f"repos/{repo}/landing/{cid}"


def forgotten_name(repo: str, cid: str) -> str:
    return f"repos/{repo}/forgotten/{cid}"


def ref_name(repo: str, kind: str, name: str) -> str:
    return f"repos/{repo}/{'branches' if kind == 'branch' else 'tags'}/{name}"


class RefHost(Protocol):
    """What `Refs` asks of the repository it serves (read at each call: `objects` may be
    replaced, e.g. by a test's counting store)."""

    objects: ObjectStore
    location: str

    def get_commit(self, repo: str, commit_id: str) -> Commit: ...

    def put_commit(self, commit: Commit) -> str: ...

    def view(self, repo: str, commit: Commit) -> treeobj.View: ...

    def make_commit(self, repo: str, parent: str | None, message: str, time: float, changed: dict[str, FileEntry],
                    removed: Iterable[str] = (), base: Commit | None = None, author: str | None = None) -> Commit: ...

    def new_reach(self, commit: Commit) -> Added:
        """The trees, manifests and chunk ids `commit` adds to its parent."""

    def require_stored(self, chunk_ids: Iterable[bytes]) -> None:
        """MissingChunksError unless every chunk is in a pack the store holds now."""

    def dropped_repo(self, repo: str, tombstone: str) -> None:
        """A repo was deleted here (its tombstone written): local records of it go."""


class Refs:
    """Repos, branches, tags and forgotten commits of one store; `commit` and `update_branch`
    move a branch by compare-and-swap (`roles.RefStore`)."""

    def __init__(self, host: RefHost):
        self._host = host

    @property
    def objects(self) -> ObjectStore:
        return self._host.objects

    @property
    def location(self) -> str:
        return self._host.location

    def repos(self) -> list[str]:
        """Repos that hold a commit (one delimiter listing, then one per repo); a folder whose
        name no repo may have (a stray object) is none (`check` reports it)."""
        return [r for r in self.objects.folders("repos/") if valid_name("repo", r) and self.has_repo(r)]

    def ref_names(self, repo: str) -> list[str]:
        """Names of a folder's branches and tags (tags as "tag:NAME"), read or not."""
        out = []
        for kind, prefix in (("branch", ""), ("tag", "tag:")):
            folder = ref_name(repo, kind, "")
            out += [prefix + i.name[len(folder):] for i in self.objects.list(folder)]
        return out

    def has_repo(self, repo: str) -> bool:
        check_name("repo", repo)
        return "commits" in self.objects.folders(f"repos/{repo}/")

    def require_repo(self, repo: str) -> None:
        if not self.has_repo(repo):
            known = ", ".join(self.repos()) or "none yet"
            raise RepoNotFoundError(f"no repo {repo!r} in store {self.location} (repos: {known}); "
                                    f"push to cdc://{repo}/ to create it")

    def ensure_repo(self, repo: str) -> None:
        check_name("repo", repo)

    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        """(commit id, kind) of a revision: 4+ hex digits are a commit id or a unique
        prefix of one ("commit"); any other name is a branch or a tag, never both."""
        self.require_repo(repo)
        if is_commit_like(rev):
            prefix = rev.lower()
            matches = [i.name.rsplit("/", 1)[1][:-5] for i in self.objects.list(f"repos/{repo}/commits/{prefix}")
                       if i.name.endswith(".json")]
            found = pick_commit(repo, rev, matches), "commit"
        else:
            check_name("revision", rev)
            branch, tag = (self._read_ref(repo, kind, rev)[0] if valid_name(kind, rev) else None
                           for kind in ("branch", "tag"))  # two reads, whatever the number of refs
            found = resolve_name(repo, rev, branch, tag, lambda: self.ref_names(repo))
        if found[1] != "branch" and self.objects.exists(forgotten_name(repo, found[0])):  # heads never are
            raise RevisionNotFoundError(f"commit {found[0]} of repo {repo!r} was forgotten (`cdcstore forget`): "
                                        f"its files are gone; see `cdcstore log {repo}` for what is kept")
        return found

    def delete_repo(self, repo: str, dry_run: bool = False) -> dict[str, object]:
        """Remove a repo: its branches and tags first (from then on nothing reaches its data),
        then its commits and records. gc frees the packs and manifests only it used."""
        self.require_repo(repo)
        infos = list(self.objects.list(f"repos/{repo}/"))
        names = [i.name for i in infos]
        refs = [n for n in names if n.split("/")[2] in ("branches", "tags")]
        out = {"repo": repo, "refs": len(refs), "commits": sum(1 for n in names if n.split("/")[2] == "commits"),
               "objects": len(names), "dry_run": dry_run}
        if not dry_run:
            # a tombstone first: every replica drops the repo's reach when it sees it; it lists what
            # the commits landed (root tree, time), so gc frees what only they reached without
            # waiting out the grace window (`maintenance.deleted_reach`)
            tombstone = f"{DELETED}{repo}/{time.time_ns()}-{secrets.token_hex(4)}"
            self.objects.put(tombstone, self._landed(repo, infos), exist_ok=True)
            for n in refs + [n for n in names if n not in refs]:
                self.objects.delete(n)
            self._host.dropped_repo(repo, tombstone)
        return out

    def _landed(self, repo: str, infos: Iterable[ObjectInfo]) -> bytes:
        """A tombstone's body: a JSON line {"tree", "landed"} for each commit of the repo that
        names a root tree (commit format 2 and 3), `landed` its object's mtime."""
        folder = f"repos/{repo}/commits/"
        lines = []
        for i in infos:
            if i.name.startswith(folder) and i.name.endswith(".json") and i.mtime is not None:
                with contextlib.suppress(CdcError, NotFound, ValueError):
                    tree = self._host.get_commit(repo, i.name[len(folder):-len(".json")]).tree
                    if tree is not None:
                        lines.append(json.dumps({"tree": tree, "landed": i.mtime}, sort_keys=True))
        return "".join(line + "\n" for line in lines).encode()

    def forgotten(self, repo: str) -> set[str]:
        """Commits of `repo` that `forget` dropped: kept as history, their files are not."""
        folder = f"repos/{repo}/forgotten/"
        return {i.name[len(folder):] for i in self.objects.list(folder)}

    def forget(self, repo: str, commit_ids: Iterable[str]) -> None:
        """Mark commits forgotten (gc then frees the data only they use); heads are refused."""
        heads = set(self.branches(repo).values())
        for cid in commit_ids:
            if cid in heads:
                raise InvalidAddressError(f"commit {cid} is the head of a branch of repo {repo!r}: "
                                          f"a branch head is never forgotten")
            self._host.get_commit(repo, cid)
            self.objects.put(forgotten_name(repo, cid), b"", exist_ok=True)

    def _read_ref(self, repo: str, kind: str, name: str) -> tuple[str | None, str | None]:
        """(commit id, version token) of a ref, (None, None) when absent."""
        try:
            data, token = self.objects.get_with_token(ref_name(repo, kind, name))
        except NotFound:
            return None, None
        cid = bytes(data[:200]).decode("utf-8", "replace").strip()
        if not ids.is_hex_id(cid):
            raise CorruptionError(f"{kind} {name!r} of repo {repo!r} is damaged (it holds no commit id): "
                                  f"delete it or write the right commit id into {ref_name(repo, kind, name)}")
        return cid, token

    def _read_refs(self, repo: str, kind: str, damaged: list[CorruptionError] | None = None) -> dict[str, str]:
        """Every branch (or tag) of a repo. A damaged one raises CorruptionError, or with
        `damaged` is skipped and its error appended; names no ref may have are skipped."""
        out: dict[str, str] = {}
        folder = ref_name(repo, kind, "")
        for info in self.objects.list(folder):
            name = info.name[len(folder):]
            if "/" in name or not valid_name(kind, name):
                continue
            try:
                cid, _ = self._read_ref(repo, kind, name)
            except CorruptionError as e:
                if damaged is None:
                    raise
                damaged.append(e)
                continue
            if cid is not None:
                out[name] = cid
        return out

    def branches(self, repo: str) -> dict[str, str]:
        self.require_repo(repo)
        return self._read_refs(repo, "branch")

    def tags(self, repo: str) -> dict[str, str]:
        self.require_repo(repo)
        return self._read_refs(repo, "tag")

    def refs(self, repo: str, damaged: list[CorruptionError] | None = None) -> dict[str, str]:
        """Branches and tags of a repo (name -> commit id); tags as "tag:NAME". A damaged
        ref raises CorruptionError, or with `damaged` is skipped and its error appended."""
        self.require_repo(repo)
        return {**self._read_refs(repo, "branch", damaged),
                **{f"tag:{n}": c for n, c in self._read_refs(repo, "tag", damaged).items()}}

    def create_ref(self, repo: str, kind: str, name: str, commit_id: str) -> None:
        """Create branch or tag `name` at `commit_id` (a conditional create); refuses a
        name that is already a branch or a tag, and a commit the repo lacks."""
        check_ref_name(kind, name)
        self._host.get_commit(repo, commit_id)  # must exist (and be intact) in this repo
        if self.objects.exists(forgotten_name(repo, commit_id)):  # it reaches nothing (reach.kept): gc frees it
            raise RevisionNotFoundError(f"commit {commit_id} of repo {repo!r} was forgotten (`cdcstore forget`): "
                                        f"a {kind} there would name files gc frees; create it at a kept commit "
                                        f"(see `cdcstore log {repo}`)")
        for other in ("branch", "tag"):
            if self.objects.exists(ref_name(repo, other, name)):
                raise self._ref_exists(repo, other, kind, name)
        try:
            self.objects.put_if_absent(ref_name(repo, kind, name), (commit_id + "\n").encode())
        except Conflict:
            raise self._ref_exists(repo, kind, kind, name) from None

    @staticmethod
    def _ref_exists(repo: str, other: str, kind: str, name: str) -> RefExistsError:
        return RefExistsError(f"{other} {name!r} already exists in repo {repo!r}: choose another {kind} name"
                              + ("; tags are never moved" if other == "tag" else ""))

    def create_tag(self, repo: str, name: str, commit_id: str) -> None:
        self.create_ref(repo, "tag", name, commit_id)

    def create_branch(self, repo: str, name: str, commit_id: str) -> None:
        self.create_ref(repo, "branch", name, commit_id)

    def delete_ref(self, repo: str, kind: str, name: str) -> str:
        """Remove a branch or tag (never the repo's last branch); returns its commit id."""
        check_name(kind, name)
        self.require_repo(repo)
        refs = self._read_refs(repo, kind)
        if name not in refs:
            raise RevisionNotFoundError(f"no {kind} {name!r} in repo {repo!r} "
                                        f"({kind}s: {', '.join(refs) or 'none'})")
        if kind == "branch" and len(refs) == 1:
            raise InvalidAddressError(f"branch {name!r} is the only branch of repo {repo!r}: "
                                      f"create another branch before deleting it")
        self.objects.delete(ref_name(repo, kind, name))
        return refs[name]

    def delete_tag(self, repo: str, name: str) -> str:
        return self.delete_ref(repo, "tag", name)

    def delete_branch(self, repo: str, name: str) -> str:
        return self.delete_ref(repo, "branch", name)

    def commit(self, commit: Commit, branch: str, expected: str | None,
               landed: Callable[[Commit, Added], object] | None = None) -> str:
        """Store `commit` and move `branch` to it (`update_branch`). `landed(commit, added)`, if
        given, runs once the branch has moved, with what the commit adds to its parent (trees,
        manifests, chunk ids): a server's access records (access.py); a local commit has none."""
        check_name("repo", commit.repo)
        if commit.parent is not None and not self.objects.exists(commit_name(commit.repo, commit.parent)):
            raise InvalidAddressError(f"commit parent {commit.parent} is not a commit of repo {commit.repo!r}: "
                                      f"base the commit on the branch head")
        added = self._host.new_reach(commit)
        self._host.require_stored(added[2])  # the truth, not this machine's index, acknowledges a commit
        # a root commit (a repo's first) is marked until a branch names it: a push killed in between
        # leaves a repo of commits and no ref, which gc then knows was never landed (not refs lost)
        pending = landing_name(commit.repo, commit.id) if commit.parent is None else None
        if pending is not None:
            self.objects.put(pending, b"", exist_ok=True)
        cid = self._host.put_commit(commit)
        out = self.update_branch(commit.repo, branch, expected, cid, commit,
                                 landed=None if landed is None else lambda c: landed(c, added))
        if pending is not None:
            with contextlib.suppress(CdcError, NotFound, OSError):  # a marker left names a commit that landed
                self.objects.delete(pending)
        return out

    def update_branch(self, repo: str, branch: str, expected: str | None, new: str,
                      commit: Commit | None = None, landed: Callable[[Commit], object] | None = None) -> str:
        """Move `branch` from `expected` (None: must not exist) to `new` by a conditional
        put; returns the commit the branch now points at. `landed(commit)` runs once the
        branch has moved to the commit that lands (never for a refused put: a reader that
        sees the branch first and misses a grant re-derives it from the refs).

        If another writer moved the branch first and `commit` (the commit named `new`)
        touches no path that the branch's new history touched, a rebased copy of it
        lands on the moved head instead (see docs/architecture.md); a lost race on the
        put reads the branch again and repeats this. Otherwise ConflictError, naming the
        overlapping paths; nothing changes then.
        """
        check_write_target(branch)
        check_name("repo", repo)
        target = new
        while True:
            if self.objects.exists(ref_name(repo, "tag", branch)):
                raise InvalidAddressError(f"{branch!r} is a tag of repo {repo!r}: a tag is immutable: "
                                          f"push to a branch")
            current, token = self._read_ref(repo, "branch", branch)
            target = new
            if current != expected:
                if commit is None or current is None:
                    raise ConflictError(
                        f"branch {branch!r} of repo {repo!r} moved to {current or 'nothing'} while this push "
                        f"was based on {expected or 'no commit'}: run the push again (stored chunks are reused)")
                target, fresh = self._rebase(commit, branch, current)
                if not fresh:  # this very commit landed before (a retried request)
                    return target
            data = (target + "\n").encode()
            try:
                if token is None:
                    self.objects.put_if_absent(ref_name(repo, "branch", branch), data)
                else:
                    self.objects.put_if_match(ref_name(repo, "branch", branch), data, token)
            except Conflict:  # another writer moved it between our read and our put
                if commit is None:
                    raise ConflictError(f"branch {branch!r} of repo {repo!r} moved while it was being "
                                        f"updated: run the command again") from None
                if self._read_ref(repo, "branch", branch)[0] != target:
                    continue  # a refused put grants nothing: read the branch again
            # landed (or our own put landed and its answer was lost, a retry): only now is it
            # granted, so a compare-and-swap that fails never gives the repo any reach
            if landed is not None:
                landed(self._host.get_commit(repo, target))
            return target

    def _applied(self, repo: str, original: str) -> set[str]:
        """The ids under which `original` was rebased before (by any attempt)."""
        out: set[str] = set()
        prefix = f"repos/{repo}/applied/{original}"
        for info in self.objects.list(prefix):
            rest = info.name[len(prefix):]
            if rest.startswith(".") and ids.is_hex_id(rest[1:]):
                out.add(rest[1:])
            elif rest == "":  # written by cdcstore before rebases were lock-free: holds the id
                with _suppress_not_found():
                    out.add(bytes(self.objects.get(info.name)).decode().strip())
        return out

    def _history(self, repo: str, head: str, base: str | None) -> Iterator[tuple[str, Commit]]:
        """Commits from `head` back to (not including) `base`; ConflictError if `base`
        is not an ancestor of `head`."""
        cid: str | None = head
        while cid != base:
            if cid is None:
                raise ConflictError(f"commit {base} is not in the history of {head} in repo {repo!r}: "
                                    f"the branch was reset; run the push again")
            c = self._host.get_commit(repo, cid)
            yield cid, c
            cid = c.parent

    def _rebase(self, commit: Commit, branch: str, head: str) -> tuple[str, bool]:
        """Land `commit` on `head`. Returns (the rebased commit's id, True), or (the
        landed id, False) when `commit` or a rebased copy of it is already in the history
        since its parent (a retried request). Raises ConflictError on overlapping paths."""
        repo, cid = commit.repo, commit.id
        recorded = self._applied(repo, cid)
        theirs: set[str] = set()

        def view(c: str | None) -> treeobj.View | None:
            return self._host.view(repo, self._host.get_commit(repo, c)) if c else None

        for hid, h in self._history(repo, head, commit.parent):
            if hid == cid or hid in recorded:
                return hid, False
            theirs |= treeobj.touched(view(h.parent), self._host.view(repo, h))
        ours = treeobj.changes(view(commit.parent), self._host.view(repo, commit))
        overlap = sorted((set(ours[0]) | ours[1]) & theirs)
        if not overlap:
            try:
                landed_commit = self._host.make_commit(repo, head, commit.message, commit.time, *ours,
                                                 author=commit.author)
            except treeobj.Clash as e:
                overlap = e.paths
        if overlap:
            shown = ", ".join(overlap[:5]) + (f" and {len(overlap) - 5} more" if len(overlap) > 5 else "")
            raise ConflictError(f"branch {branch!r} of repo {repo!r} moved to {head} and another writer changed "
                                f"the same paths: {shown}; pull the branch and run the push again")
        landed = self._host.put_commit(landed_commit)
        # recorded before the branch moves, so that a retry finds the copy in the history
        self.objects.put(f"repos/{repo}/applied/{cid}.{landed}", b"", exist_ok=True)
        return landed, True


def pick_commit(repo: str, rev: str, matches: list[str]) -> str:
    """The one commit id a hex prefix names; an error for none or several."""
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise RevisionNotFoundError(f"revision {rev!r} is ambiguous in repo {repo!r} "
                                    f"({len(matches)} commits match): give more digits")
    raise RevisionNotFoundError(f"no commit {rev!r} in repo {repo!r} (4 or more hex digits name a "
                                f"commit id or a prefix of one; see `cdcstore log {repo}`)")


def resolve_name(repo: str, rev: str, branch: str | None, tag: str | None,
                 branches: Iterable[str] | Callable[[], Iterable[str]]) -> tuple[str, str]:
    """(commit id, kind) of a name that is a branch or a tag; an error if both or neither."""
    if branch and tag:
        raise RevisionNotFoundError(f"revision {rev!r} is ambiguous in repo {repo!r}: it is both a branch "
                                    f"and a tag; delete one of them")
    if branch:
        return branch, "branch"
    if tag:
        return tag, "tag"
    refs = list(branches() if callable(branches) else branches)

    def listed(names: list[str]) -> str:
        return ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "") or "none"

    heads = listed([n for n in refs if not n.startswith("tag:")])
    tags = listed([n[4:] for n in refs if n.startswith("tag:")])
    raise RevisionNotFoundError(f"no branch or tag {rev!r} in repo {repo!r} (branches: {heads}; tags: {tags}); "
                                f"a commit id prefix needs at least 4 hex digits")


def _suppress_not_found() -> ContextManager[None]:
    return contextlib.suppress(NotFound, FileNotFoundError)

"""What a repo's refs reach: the one walk behind gc's mark, `check`, `rebuild-index` and the
server's access records (`access.py`).

The rule for forgotten commits (`forget`) is here and nowhere else: a forgotten commit stays in
the history (the walk reaches its commit object, which gc keeps, and goes on to its parent) but
it reaches no tree, manifest or chunk, not even as the head of a tag. What a kept commit adds is
measured against its nearest kept ancestor, never a forgotten one: a file that a forgotten
commit brought in and a kept one still names is reached through the kept one. gc frees what
only forgotten commits reach early (`maintenance.forgotten_reach`): it takes them from its mark's
walk (`Found.kept`) and their trees from `subtree`. No new ref may name a forgotten commit
(`Refs.create_ref`).

The walk reads through a `Graph` (a `Repository` is one) and yields `Found` items: each commit,
then, for a kept one, its trees and files. What it cannot read goes to `problem(kind, ref, where,
error)`, or is raised when no `problem` is given (damage stops gc).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Container, Iterator, Mapping, Protocol

from ..core import treeobj
from ..core.commit import Commit
from ..core.errors import CdcError


class Graph(Protocol):
    """What the walk reads: a repo's forgotten commits, its commits and their trees."""

    def forgotten(self, repo: str) -> set[str]: ...

    def get_commit(self, repo: str, commit_id: str) -> Commit: ...

    def view(self, repo: str, commit: Commit) -> treeobj.View: ...


@dataclasses.dataclass(frozen=True)
class Found:
    """One thing the refs reach."""

    kind: str  # "commit", "tree" (a stored tree) or "file"
    name: str  # the commit id, tree id or manifest name
    ref: str  # the branch or tag ("tag:NAME") whose history reached it first
    path: str = ""  # a tree's or file's path in its commit
    kept: bool = True  # a commit: False when forgotten (history only: it reaches nothing)
    commit: Commit | None = None  # a commit: the commit itself
    bundle: str | None = None  # a file: the manifest bundle its entry names (a hint), if any


Problem = Callable[[str, str, str, Exception], None]  # (kind, ref, commit id or path, error)
#: A tree as `subtree` records it in `trees`: its id, or (ref, id, path) `by_path`; a tree no one
#: stored (a format 1 commit's) as ("unstored", that key).
TreeKey = str | tuple[str, str, str] | tuple[str, str | tuple[str, str, str]]


def kept(commit_id: str, forgotten: Container[str]) -> bool:
    """Whether a commit in the history reaches its files: the forgotten-commit rule."""
    return commit_id not in forgotten


def walk(graph: Graph, repo: str, heads: Mapping[str, str], *, history: bool = True,
         stop: Container[str] = (), trees: set[TreeKey] | None = None, by_path: bool = False,
         diff: bool = False, problem: Problem | None = None) -> Iterator[Found]:
    """What `heads` (ref -> commit id) of `repo` reach, each commit once, newest first.

    `history`: the heads' ancestors too (else the heads alone). `stop`: commits whose history is
    covered already (not walked). `trees`: tree ids walked before, skipped with what is below
    them, and added to as the walk goes (shared by several walks: a subtree is walked once);
    with `by_path` a tree is walked again under another path or ref (its files' labels differ).
    `diff`: each kept commit yields only the trees and files it adds to its nearest kept ancestor
    (the cost follows the change: for records kept up to date commit by commit)."""
    forgotten = graph.forgotten(repo)
    seen: set[str] = set()
    walked: set[TreeKey] = set() if trees is None else trees
    read: dict[str, Commit] = {}

    def commit_of(cid: str) -> Commit:
        if cid not in read:
            read[cid] = graph.get_commit(repo, cid)
        return read[cid]

    for ref, head in heads.items():
        cid: str | None = head
        while cid and cid not in seen and cid not in stop:
            seen.add(cid)
            try:
                commit = commit_of(cid)
            except CdcError as e:
                if problem is None:
                    raise
                problem("commit", ref, cid, e)
                break
            keep = kept(cid, forgotten)
            yield Found("commit", cid, ref, kept=keep, commit=commit)
            if keep:
                view = graph.view(repo, commit)
                if diff:
                    yield from _added(graph, repo, view, _base(graph, repo, commit, commit_of, forgotten), ref, problem)
                else:
                    yield from subtree(view, view.root, ref, walked, by_path, problem)
            if not history:
                break
            read.pop(cid, None)
            cid = commit.parent


def subtree(view: treeobj.View, root: str, ref: str = "", trees: set[TreeKey] | None = None, by_path: bool = False,
            problem: Problem | None = None, prefix: str = "") -> Iterator[Found]:
    """A tree and what is below it: ("tree", id, path) for each stored tree not in `trees` and
    ("file", manifest, path) for each file in them. A tree that cannot be read goes to
    `problem` (its files are skipped), or is raised."""
    trees = set() if trees is None else trees
    stack = [(root, prefix)]
    key: TreeKey
    while stack:
        tid, path = stack.pop()
        stored = tid not in view.unstored  # a format 1 commit's trees live in memory: named by no one
        key = (ref, tid, path) if by_path else tid
        key = key if stored else ("unstored", key)  # never taken for a stored tree of the same id
        if key in trees:
            continue
        trees.add(key)
        try:
            node = view.node(tid)
        except CdcError as err:
            if problem is None:
                raise
            problem("tree", ref, path, err)
            continue
        if stored:
            yield Found("tree", tid, ref, path)
        if node.split:  # a wide folder's parts: the same folder, the same path
            stack.extend((t, path) for t in node.children())
            continue
        for name, e in node.entries.items():
            p = f"{path}/{name}" if path else name
            if isinstance(e, treeobj.Folder):
                stack.append((e.tree, p))
            else:
                yield Found("file", e.manifest, ref, p, bundle=e.bundle)


def _base(graph: Graph, repo: str, commit: Commit, commit_of: Callable[[str], Commit],
          forgotten: Container[str]) -> treeobj.View | None:
    """The view of `commit`'s nearest kept ancestor, what its additions are measured against
    (None: measure against nothing; also for a format 1 ancestor, whose trees nobody named)."""
    pid = commit.parent
    while pid:
        try:
            parent = commit_of(pid)
        except CdcError:
            return None
        if kept(pid, forgotten):
            return graph.view(repo, parent) if parent.tree is not None else None
        pid = parent.parent
    return None


def _added(graph: Graph, repo: str, view: treeobj.View, base: treeobj.View | None, ref: str,
           problem: Problem | None) -> Iterator[Found]:
    """The stored trees and the files of `view` that `base` lacks on their paths."""
    trees: set[str] = set()
    try:
        changed, _ = treeobj.changes(base, view, trees)
    except CdcError as e:
        if problem is None:
            raise
        problem("tree", ref, "", e)
        return
    for tid in trees - set(view.unstored):
        yield Found("tree", tid, ref)
    for path, entry in changed.items():
        yield Found("file", entry.manifest, ref, path, bundle=entry.bundle)

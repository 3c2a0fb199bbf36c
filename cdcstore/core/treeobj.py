"""Tree objects (format 2): one folder of a commit, named by the hash of its bytes.

    {"entries": {NAME: {"manifest": id, "size": n}                       a file
                 NAME: {"files": k, "size": n, "tree": id}, ...},       a folder: its tree,
     "format": 2, "type": "tree"}                                         files and bytes below

Encoded as compact JSON with sorted keys (the same folder always has the same bytes
and so the same id). A folder entry is never empty; the root tree may be. A commit
of format 2 names its root tree; unchanged folders keep their ids, so a commit writes
only the trees on the paths it changed, and reading one folder reads only the trees
on its path.

`View` reads a commit's tree through a loader (id -> Tree): the one API through
which callers list, look up, walk and diff a commit's files. `apply` makes a new
root from a view and a change set; `changes` diffs two views, descending only into
folders whose ids differ. All pure: the loader does the I/O.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from . import ids
from .commit import FileEntry, _check_entry
from .errors import CdcError, CorruptionError, InvalidAddressError

TREE_VERSION = 2
MAX_DEPTH = 255  # folders in a path: deeper trees are refused (and never walked: no deep recursion)


@dataclass(frozen=True)
class Folder:
    """A tree entry naming a subtree: its id, and the files and bytes under it."""
    tree: str
    size: int
    files: int


Entry = FileEntry | Folder


def _check_name(name) -> None:
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\x00" in name:
        raise ValueError(f"invalid tree entry name {name!r}: one path part, without '/'")


@dataclass(frozen=True)
class Tree:
    """One folder: name -> FileEntry | Folder."""
    entries: Mapping[str, Entry]

    def validate(self) -> "Tree":
        for name, e in self.entries.items():
            _check_name(name)
            if isinstance(e, Folder):
                if not (isinstance(e.tree, str) and ids.is_hex_id(e.tree)):
                    raise ValueError(f"folder {name!r}: tree must be a hex id")
                for what, n in (("size", e.size), ("files", e.files)):
                    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or n >= 2 ** 63:
                        raise ValueError(f"folder {name!r}: {what} must be a non-negative integer")
                if e.files < 1:
                    raise ValueError(f"folder {name!r} is empty: a folder holds at least one file")
            else:
                _check_entry(name, e)
        return self

    def encode(self) -> bytes:
        self.validate()
        doc = {"format": TREE_VERSION, "type": "tree", "entries": {
            n: ({"tree": e.tree, "size": e.size, "files": e.files} if isinstance(e, Folder)
                else {"manifest": e.manifest, "size": e.size}) for n, e in self.entries.items()}}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @property
    def id(self) -> str:
        return ids.hexdigest(self.encode())

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries.values())

    @property
    def file_count(self) -> int:
        return sum(e.files if isinstance(e, Folder) else 1 for e in self.entries.values())

    @classmethod
    def decode(cls, data: bytes, name: str = "tree") -> "Tree":
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            if doc.get("type") != "tree" or doc.get("format") != TREE_VERSION:
                raise CorruptionError(f"{name} has tree format {doc.get('format')!r}; "
                                      f"this cdcstore reads {TREE_VERSION}")
            if not isinstance(doc["entries"], dict):
                raise ValueError("entries must be an object")
            entries: dict[str, Entry] = {}
            for n, e in doc["entries"].items():
                if not isinstance(e, dict):
                    raise ValueError(f"entry {n!r} is not an object")
                entries[n] = (Folder(e["tree"], e["size"], e["files"]) if "tree" in e
                              else FileEntry(e["manifest"], e["size"]))
            return cls(entries).validate()
        except CorruptionError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, CdcError) as e:
            raise CorruptionError(f"{name} is not a valid tree: {e}") from None


EMPTY = Tree({})


def build(files: Mapping[str, FileEntry]) -> tuple[str, dict[str, Tree]]:
    """The trees of a flat file map (a format 1 commit): (root id, id -> Tree), every node."""
    nested: dict = {}
    for path, f in files.items():
        *parts, leaf = path.split("/")
        d = nested
        for p in parts:
            d = d.setdefault(p, {})
            if not isinstance(d, dict):
                raise ValueError(f"{path!r}: a part of it is a file")
        if leaf in d:
            raise ValueError(f"{path!r} is both a file and a folder")
        d[leaf] = f
    nodes: dict[str, Tree] = {}

    def make(d: dict) -> Tree:
        entries: dict[str, Entry] = {}
        for name in sorted(d):
            v = d[name]
            if isinstance(v, dict):
                sub = make(v)
                sid = sub.id
                nodes[sid] = sub
                entries[name] = Folder(sid, sub.size, sub.file_count)
            else:
                entries[name] = v
        return Tree(entries)

    root = make(nested)
    rid = root.id
    nodes[rid] = root
    return rid, nodes


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


class View:
    """A commit's files as trees, read node by node through `load` (memoized).

    `nodes` may hold trees not in any store (a format 1 commit's, built in memory):
    `apply` returns those it keeps, so that they are stored with the new commit."""

    def __init__(self, load: Callable[[str], Tree], root: str, nodes: dict[str, Tree] | None = None):
        self._load, self.root = load, root
        self.unstored: dict[str, Tree] = dict(nodes or {})
        self._memo: dict[str, Tree] = dict(self.unstored)

    @classmethod
    def of_files(cls, files: Mapping[str, FileEntry], load: Callable[[str], Tree] | None = None) -> "View":
        rid, nodes = build(files)
        return cls(load or _no_load, rid, nodes)

    def node(self, tid: str) -> Tree:
        t = self._memo.get(tid)
        if t is None:
            t = self._memo[tid] = self._load(tid)
        return t

    # -- looking up ---------------------------------------------------------------------
    def folder(self, path: str) -> Tree | None:
        """The tree of the folder at `path` ('' the root), None if no folder is there."""
        t = self.node(self.root)
        for part in path.split("/") if path else ():
            e = t.entries.get(part)
            if not isinstance(e, Folder):
                return None
            t = self.node(e.tree)
        return t

    def entry(self, path: str) -> Entry | None:
        """The file or folder entry at `path` (None for nothing; the root is no entry)."""
        if not path:
            return None
        parent, _, name = path.rpartition("/")
        t = self.folder(parent)
        return None if t is None else t.entries.get(name)

    def get(self, path: str) -> FileEntry | None:
        e = self.entry(path)
        return e if isinstance(e, FileEntry) else None

    def kind(self, path: str) -> str | None:
        """'file', 'directory' (the root always is one) or None when nothing is there."""
        if not path:
            return "directory"
        e = self.entry(path)
        return None if e is None else "file" if isinstance(e, FileEntry) else "directory"

    def size(self, path: str = "") -> int:
        """Bytes of the file at `path`, or of every file under the folder."""
        if not path:
            return self.node(self.root).size
        e = self.entry(path)
        return 0 if e is None else e.size

    def file_count(self, path: str = "") -> int:
        if not path:
            return self.node(self.root).file_count
        e = self.entry(path)
        return 0 if e is None else e.files if isinstance(e, Folder) else 1

    def walk(self, path: str = "") -> Iterator[tuple[str, FileEntry]]:
        """(full path, entry) of every file under the folder `path` (or the file itself), sorted."""
        if not path:
            yield from self._walk(self.root, "")
            return
        e = self.entry(path)
        if isinstance(e, FileEntry):
            yield path, e
        elif e is not None:
            yield from self._walk(e.tree, path)

    def _walk(self, tid: str, prefix: str) -> Iterator[tuple[str, FileEntry]]:
        _check_depth(prefix)
        for name, e in self.node(tid).entries.items():
            p = _join(prefix, name)
            if isinstance(e, Folder):
                yield from self._walk(e.tree, p)
            else:
                yield p, e

    def under(self, path: str = "") -> dict[str, FileEntry]:
        """The file at `path`, or every file under the folder `path`, by full path."""
        return dict(self.walk(path))

    def files(self) -> dict[str, FileEntry]:
        return self.under("")

    def listing(self, path: str, recursive: bool = False) -> list[dict]:
        """Entries directly under `path` (every file under it when `recursive`), sorted by name:
        {"name": full path, "type": "file" | "directory", "size": bytes (a folder's: all below)}.
        A file path lists the file itself; reads only the trees on the path (all below if recursive)."""
        e = self.entry(path)
        if isinstance(e, FileEntry):
            return [{"name": path, "type": "file", "size": e.size}]
        if recursive:
            return [{"name": p, "type": "file", "size": f.size} for p, f in sorted(self.walk(path))]
        t = self.folder(path)
        if t is None:
            return []
        return [{"name": _join(path, n), "type": "directory" if isinstance(x, Folder) else "file", "size": x.size}
                for n, x in sorted(t.entries.items())]

    def tree_ids(self) -> Iterator[str]:
        """Every tree id this commit reaches (each once)."""
        seen: set[str] = set()
        stack = [self.root]
        while stack:
            tid = stack.pop()
            if tid in seen:
                continue
            seen.add(tid)
            yield tid
            stack.extend(e.tree for e in self.node(tid).entries.values() if isinstance(e, Folder))


def _check_depth(prefix: str) -> None:
    if prefix.count("/") >= MAX_DEPTH:
        raise CorruptionError(f"tree at {prefix[:80]!r}... is more than {MAX_DEPTH} folders deep")


def _no_load(tid: str) -> Tree:
    raise CorruptionError(f"tree {tid} is not in this commit")


# -- change sets ---------------------------------------------------------------------------------
def changes(old: View | None, new: View, trees: set | None = None,
            check: Callable[[str, Tree, Folder | None], None] | None = None
            ) -> tuple[dict[str, FileEntry], set[str]]:
    """What turns `old` into `new`: (paths added or changed -> entry, paths removed). Descends
    only into folders whose tree ids differ: the cost follows the change. `trees`, if given,
    receives the ids of `new`'s trees that `old` lacks on those paths; `check(path, tree,
    entry)` sees each of them with the folder entry naming it (None for the root)."""
    changed: dict[str, FileEntry] = {}
    removed: set[str] = set()
    _diff(old, old.root if old else None, new, new.root, "", changed, removed, trees, check, None)
    return changed, removed


def _diff(a: View | None, aid: str | None, b: View, bid: str | None, prefix: str,
          changed: dict, removed: set, trees: set | None = None, check=None, folder=None) -> None:
    if aid == bid:
        return
    _check_depth(prefix)
    ea = a.node(aid).entries if aid else {}
    eb = b.node(bid).entries if bid else {}
    if bid is not None:
        if trees is not None:
            trees.add(bid)
        if check is not None:
            check(prefix, b.node(bid), folder)
    for name in ea.keys() | eb.keys():
        x, y = ea.get(name), eb.get(name)
        if x == y:
            continue
        p = _join(prefix, name)
        xf, yf = isinstance(x, Folder), isinstance(y, Folder)
        if xf or yf:
            _diff(a, x.tree if xf else None, b, y.tree if yf else None, p, changed, removed,
                  trees, check, y if yf else None)
        if x is not None and not xf:
            if y is None or yf:
                removed.add(p)
        if y is not None and not yf:
            changed[p] = y


def touched(old: View | None, new: View) -> set[str]:
    changed, removed = changes(old, new)
    return set(changed) | removed


class Clash(ValueError):
    """A change set that would make a path both a file and a folder (`paths` names them)."""

    def __init__(self, paths: list[str]):
        super().__init__(f"{paths[0]!r} is both a file and a folder")
        self.paths = paths


def apply(base: View | None, changed: Mapping[str, FileEntry], removed=(),
          load: Callable[[str], Tree] | None = None) -> tuple[str, dict[str, Tree]]:
    """The root of `base` with `changed` set and `removed` taken out (a removed path that is
    not a file is ignored): (new root id, trees to store). Only the folders on changed paths
    get new trees; the rest keep their ids. Trees of `base` that are not stored yet (a format
    1 base) and that the new root keeps are among those returned. Raises Clash when a path
    would be both a file and a folder."""
    view = base or View(load or _no_load, EMPTY.id, {EMPTY.id: EMPTY})
    edits: dict = {}  # nested by path part; the key "" holds the op on the path itself
    for path, f in [(p, None) for p in removed] + list(changed.items()):
        if path.count("/") >= MAX_DEPTH:
            raise InvalidAddressError(f"{path[:80]!r}... is more than {MAX_DEPTH} folders deep: use a shallower path")
        d = edits
        for p in path.split("/"):
            d = d.setdefault(p, {})
        d[""] = f  # FileEntry: set, None: remove
    out: dict[str, Tree] = {}
    clashes: list[str] = []

    def rewrite(tid: str | None, ed: dict, prefix: str) -> Tree:
        entries = dict(view.node(tid).entries) if tid else {}
        for name, v in ed.items():
            p = _join(prefix, name)
            leaf = v.get("", _MISSING)
            subs = {k: x for k, x in v.items() if k != ""}
            cur = entries.get(name)
            if leaf is None and isinstance(cur, FileEntry):
                del entries[name]
                cur = None
            if subs:
                if isinstance(cur, FileEntry):
                    if any(_adds(subs)):
                        clashes.append(p)
                else:
                    sub = rewrite(cur.tree if cur else None, subs, p)
                    if sub.entries:
                        sid = sub.id
                        out[sid] = sub
                        entries[name] = Folder(sid, sub.size, sub.file_count)
                    else:
                        entries.pop(name, None)
            if isinstance(leaf, FileEntry):
                if isinstance(entries.get(name), Folder):
                    clashes.append(p)
                else:
                    entries[name] = leaf
        return Tree(dict(sorted(entries.items())))

    root = rewrite(view.root, edits, "")
    if clashes:
        raise Clash(sorted(clashes))
    rid = root.id
    out[rid] = root
    if view.unstored:  # a format 1 base: its kept trees are stored with the new root
        stack = [rid]
        seen = set()
        while stack:
            tid = stack.pop()
            if tid in seen:
                continue
            seen.add(tid)
            t = out.get(tid) or view.unstored.get(tid)
            if t is None:
                continue
            out[tid] = t
            stack.extend(e.tree for e in t.entries.values() if isinstance(e, Folder))
    return rid, out


_MISSING = object()


def _adds(ed: dict) -> Iterator[bool]:
    for k, v in ed.items():
        if k == "":
            if v is not None:
                yield True
        else:
            yield from _adds(v)

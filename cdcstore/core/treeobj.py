"""Tree objects: one folder of a commit, named by the hash of its bytes.

A page (tree format 2) lists entries:

    {"entries": {NAME: {"manifest": id, "size": n[, "bundle": id]}        a file
                 NAME: {"files": k, "size": n, "tree": id}, ...},       a folder: its tree,
     "format": 2, "type": "tree"}                                         files and bytes below

A file's "bundle" (optional) names the manifest bundle holding its manifest: a hint where to
find it (core/bundle.py), not part of what the file is.

A folder of more than LEAF_MAX entries is split by the BLAKE3 of its names, one octal
digit (3 bits) a level (a hash trie): a split node (tree format 3) names up to 8 parts,
each a page or a split node one digit deeper:

    {"format": 3, "type": "tree", "prefix": P,
     "slots": {D: {"entries": e, "files": k, "size": n, "tree": id}, ...}}

The part in slot D holds the entries whose name digits (`name_digits`) start with P + D. The shape is
a function of the entries alone (a part of LEAF_MAX entries or fewer is a page, a
larger one splits), so the same folder always has the same bytes and the same id, and
a folder of LEAF_MAX entries or fewer is the format-2 page it always was. Encoded as
compact JSON with sorted keys. A folder entry is never empty; the root tree may be.
A commit names its root tree; unchanged folders and parts keep their ids, so a commit
writes only the nodes on the paths it changed (a bounded page and O(log n) split nodes
of a wide folder, not the whole folder), and looking up one path reads only those.

`View` reads a commit's tree through a loader (id -> Tree): the one API through
which callers list, look up, walk and diff a commit's files. `apply` makes a new
root from a view and a change set; `changes` diffs two views, descending only into
folders whose ids differ. All pure: the loader does the I/O.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeAlias

from . import ids
from .commit import FileEntry, _check_entry
from .errors import CdcError, CorruptionError, InvalidAddressError

TREE_VERSION = 2  # a page; a split node is SPLIT_VERSION
SPLIT_VERSION = 3
CONTENT_PAGE_VERSION = 4  # a page whose folder entries carry content ids
CONTENT_SPLIT_VERSION = 5  # a split node whose slots carry content ids
READ_VERSIONS = (TREE_VERSION, SPLIT_VERSION, CONTENT_PAGE_VERSION, CONTENT_SPLIT_VERSION)
LEAF_MAX = 48  # entries a page holds: more, and the folder (or part) splits by its names' hashes
DIGITS = "01234567"  # a split node's slots: one octal digit of the name hash a level
HASH_DIGITS = 85  # octal digits of a name hash (its top 255 bits): a prefix is shorter
MAX_DEPTH = 255  # folders in a path: deeper trees are refused (and never walked: no deep recursion)


@dataclass(frozen=True)
class Folder:
    """A tree entry naming a subtree: its id, the files and bytes under it, and (tree format 4)
    its content id (`content_id`), None where the subtree was written without one."""
    tree: str
    size: int
    files: int
    content: str | None = None


Entry = FileEntry | Folder
#: folders nested by path part, a file at each leaf (`build`)
_Nested: TypeAlias = "dict[str, _Nested | FileEntry]"
#: an edit of one name of a folder (`_edit`): its current entry or None -> its new entry or None
_Step: TypeAlias = Callable[[Entry | None], Entry | None]


def file_doc(e: FileEntry) -> dict[str, str | int]:
    """A file entry as a page holds it."""
    doc: dict[str, str | int] = {"manifest": e.manifest, "size": e.size}
    if e.bundle is not None:
        doc["bundle"] = e.bundle
    return doc


def _check_name(name: object) -> None:
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\x00" in name:
        raise ValueError(f"invalid tree entry name {name!r}: one path part, without '/'")
    try:  # JSON's \ud800 escapes decode to lone surrogates, which no key or file name can hold
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"invalid tree entry name {name!r}: not UTF-8 (a lone surrogate)") from None


@dataclass(frozen=True)
class Slot:
    """A split node's part: its tree, and the entries, files and bytes in it."""
    tree: str
    entries: int
    files: int
    size: int
    content: str | None = None  # the part's content id (tree format 5)


def name_digits(name: str) -> str:
    """Where a name goes in a split folder: the top 255 bits of the BLAKE3-256 of its UTF-8
    bytes as 85 octal digits (digit k picks the slot at depth k)."""
    return format(int.from_bytes(ids.digest(name.encode()), "big") >> 1, "085o")


def _count(what: str, n: object, least: int = 0) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < least or n >= 2 ** 63:
        raise ValueError(f"{what} must be an integer of at least {least}")


@dataclass(frozen=True)
class Tree:
    """One node of a folder: a page (name -> FileEntry | Folder) or, when `slots` is set,
    a split node (hash digit -> Slot) covering the names whose hashes start with `prefix`."""
    entries: Mapping[str, Entry]
    slots: Mapping[str, Slot] | None = None
    prefix: str = ""

    @property
    def split(self) -> bool:
        return self.slots is not None

    def validate(self) -> "Tree":
        if self.slots is not None:  # split
            if self.entries:
                raise ValueError("a split node holds slots, not entries")
            if len(self.prefix) >= HASH_DIGITS or any(c not in DIGITS for c in self.prefix):
                raise ValueError(f"split prefix {self.prefix[:90]!r} is not octal digits shorter than a name hash")
            for d, sl in self.slots.items():
                if not (isinstance(d, str) and len(d) == 1 and d in DIGITS):
                    raise ValueError(f"slot {d!r} is not one octal digit")
                if not (isinstance(sl.tree, str) and ids.is_hex_id(sl.tree)):
                    raise ValueError(f"slot {d!r}: tree must be a hex id")
                if sl.content is not None and not (isinstance(sl.content, str) and ids.is_hex_id(sl.content)):
                    raise ValueError(f"slot {d!r}: content must be a hex id")
                _count(f"slot {d!r} entries", sl.entries, 1)
                _count(f"slot {d!r} files", sl.files, 1)
                _count(f"slot {d!r} size", sl.size)
            if self.entry_count <= LEAF_MAX:
                raise ValueError(f"a split node of {self.entry_count} entries: "
                                 f"{LEAF_MAX} or fewer are one page")
            return self
        for name, e in self.entries.items():
            _check_name(name)
            if isinstance(e, Folder):
                if not (isinstance(e.tree, str) and ids.is_hex_id(e.tree)):
                    raise ValueError(f"folder {name!r}: tree must be a hex id")
                if e.content is not None and not (isinstance(e.content, str) and ids.is_hex_id(e.content)):
                    raise ValueError(f"folder {name!r}: content must be a hex id")
                _count(f"folder {name!r} size", e.size)
                _count(f"folder {name!r} files", e.files)
                if e.files < 1:
                    raise ValueError(f"folder {name!r} is empty: a folder holds at least one file")
            else:
                _check_entry(name, e)
        return self

    def encode(self) -> bytes:
        self.validate()
        if self.slots is not None:  # split
            doc = {"format": CONTENT_SPLIT_VERSION if self._carries_content() else SPLIT_VERSION,
                   "type": "tree", "prefix": self.prefix,
                   "slots": {d: _with_content({"tree": sl.tree, "entries": sl.entries, "files": sl.files,
                                               "size": sl.size}, sl.content) for d, sl in self.slots.items()}}
        else:
            doc = {"format": CONTENT_PAGE_VERSION if self._carries_content() else TREE_VERSION,
                   "type": "tree", "entries": {
                       n: (_with_content({"tree": e.tree, "size": e.size, "files": e.files}, e.content)
                           if isinstance(e, Folder) else file_doc(e)) for n, e in self.entries.items()}}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    def _carries_content(self) -> bool:
        parts: Iterable[Slot | Folder] = self.slots.values() if self.slots is not None \
            else (e for e in self.entries.values() if isinstance(e, Folder))
        return any(p.content is not None for p in parts)

    @property
    def content(self) -> str | None:
        """This node's content id: what the folder (or part) holds - names, manifests, sizes and
        the content ids below - without the trees' ids or bundle hints, so a machine computes it
        from its own files and compares it with the store's (`same_files`). None when a folder or
        part below was written without one (a tree from before format 4)."""
        doc: dict[str, object]
        if self.slots is not None:  # split
            if any(sl.content is None for sl in self.slots.values()):
                return None
            doc = {"type": "content", "prefix": self.prefix,
                   "slots": {d: sl.content for d, sl in self.slots.items()}}
        else:
            entries: dict[str, dict[str, str | int]] = {}
            for n, e in self.entries.items():
                if isinstance(e, Folder):
                    if e.content is None:
                        return None
                    entries[n] = {"content": e.content}
                else:
                    entries[n] = {"manifest": e.manifest, "size": e.size}
            doc = {"type": "content", "entries": entries}
        return ids.hexdigest(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())

    @property
    def id(self) -> str:
        return ids.hexdigest(self.encode())

    @property
    def size(self) -> int:
        parts: Iterable[Slot | Entry] = self.slots.values() if self.slots is not None else self.entries.values()
        return sum(e.size for e in parts)

    @property
    def file_count(self) -> int:
        if self.slots is not None:  # split
            return sum(sl.files for sl in self.slots.values())
        return sum(e.files if isinstance(e, Folder) else 1 for e in self.entries.values())

    @property
    def entry_count(self) -> int:
        """Entries of the folder (part) this node holds, at any depth of the split."""
        return sum(sl.entries for sl in self.slots.values()) if self.slots is not None else len(self.entries)

    def children(self) -> Iterator[str]:
        """The trees this node names: its folders' trees, or its parts."""
        if self.slots is not None:  # split
            yield from (sl.tree for sl in self.slots.values())
        else:
            yield from (e.tree for e in self.entries.values() if isinstance(e, Folder))

    def named(self) -> Iterator[tuple[str, str]]:
        """("tree", id) and ("manifest", id) of each object this node names."""
        yield from (("tree", t) for t in self.children())
        if not self.split:
            yield from (("manifest", e.manifest) for e in self.entries.values() if isinstance(e, FileEntry))

    def bundled(self) -> Iterator[tuple[str, str]]:
        """(manifest, bundle) of each file entry that names its manifest's bundle."""
        if not self.split:
            yield from ((e.manifest, e.bundle) for e in self.entries.values()
                        if isinstance(e, FileEntry) and e.bundle is not None)

    @classmethod
    def decode(cls, data: bytes, name: str = "tree") -> "Tree":
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            fmt = doc.get("format")
            if doc.get("type") != "tree" or fmt not in READ_VERSIONS or isinstance(fmt, bool):
                raise CorruptionError(f"{name} has tree format {fmt!r}; this cdcstore reads "
                                      f"{', '.join(map(str, READ_VERSIONS))}: upgrade cdcstore")
            content = fmt in (CONTENT_PAGE_VERSION, CONTENT_SPLIT_VERSION)  # content ids allowed (and one at least)
            if fmt in (SPLIT_VERSION, CONTENT_SPLIT_VERSION):
                if not isinstance(doc["slots"], dict) or not isinstance(doc["prefix"], str):
                    raise ValueError("slots must be an object and prefix a string")
                slots = {}
                for d, e in doc["slots"].items():
                    if not isinstance(e, dict):
                        raise ValueError(f"slot {d!r} is not an object")
                    slots[d] = Slot(e["tree"], e["entries"], e["files"], e["size"], _content(e, content))
                t = cls({}, dict(sorted(slots.items())), doc["prefix"])
            else:
                if not isinstance(doc["entries"], dict):
                    raise ValueError("entries must be an object")
                entries: dict[str, Entry] = {}
                for n, e in doc["entries"].items():
                    if not isinstance(e, dict):
                        raise ValueError(f"entry {n!r} is not an object")
                    entries[n] = (Folder(e["tree"], e["size"], e["files"], _content(e, content)) if "tree" in e
                                  else FileEntry(e["manifest"], e["size"], e.get("bundle")))
                t = cls(entries)
            if content != t._carries_content():
                raise ValueError(f"tree format {fmt} with{'out' if content else ''} content ids")
            return t.validate()
        except CorruptionError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, CdcError) as e:
            raise CorruptionError(f"{name} is not a valid tree: {e}") from None


def _with_content(doc: dict[str, str | int], content: str | None) -> dict[str, str | int]:
    if content is not None:
        doc["content"] = content
    return doc


def _content(e: dict[str, Any], allowed: bool) -> str | None:
    if "content" in e and not allowed:
        raise ValueError("a content id in a tree of format 2 or 3")
    content: str | None = e.get("content")  # decoded JSON: `Tree.validate` checks it
    return content


def check_content(what: str, claimed: str | None, node: Tree) -> None:
    """That a folder entry's or a slot's content id (if it has one) is its node's."""
    if claimed is not None and node.content != claimed:
        raise CorruptionError(f"{what} claims content {claimed[:16]}..., its tree holds "
                              f"{(node.content or 'none')[:16]}...")


def check_part(parent: Tree, digit: str, part: Tree) -> None:
    """That `part`, read for slot `digit` of split node `parent`, is what the slot says:
    its counts, its content id, and its names (or its prefix) under the slot's hash prefix."""
    if parent.slots is None:  # as indexing None would
        raise TypeError(f"part {digit!r} of a page: only a split node has parts")
    sl, prefix = parent.slots[digit], parent.prefix + digit
    what = f"part {prefix!r} of a split folder"
    if (part.entry_count, part.file_count, part.size) != (sl.entries, sl.files, sl.size):
        raise CorruptionError(f"{what} holds {part.entry_count} entries, {part.file_count} files and "
                              f"{part.size} bytes; its slot says {sl.entries}, {sl.files} and {sl.size}")
    check_content(what, sl.content, part)
    if part.split:
        if part.prefix != prefix:
            raise CorruptionError(f"{what} is a split node of prefix {part.prefix!r}")
    else:
        if len(part.entries) > LEAF_MAX:
            raise CorruptionError(f"{what} is a page of {len(part.entries)} entries (at most {LEAF_MAX})")
        for n in part.entries:
            if not name_digits(n).startswith(prefix):
                raise CorruptionError(f"{what} holds {n!r}, whose hash is not under it")


EMPTY = Tree({})


def folder_nodes(entries: Mapping[str, Entry], out: dict[str, Tree], prefix: str = "",
                 hashes: dict[str, str] | None = None) -> Tree:
    """The node of a folder (or of its part under hash `prefix`) holding `entries`: a page
    when they are LEAF_MAX or fewer, else a split node; the parts below it go to `out`."""
    if len(entries) <= LEAF_MAX:
        return Tree(dict(sorted(entries.items())))
    hashes = {} if hashes is None else hashes
    groups: dict[str, dict[str, Entry]] = {}
    at = len(prefix)
    for n, e in entries.items():
        h = hashes.get(n) or hashes.setdefault(n, name_digits(n))
        groups.setdefault(h[at], {})[n] = e
    slots = {}
    for d in sorted(groups):
        part = folder_nodes(groups[d], out, prefix + d, hashes)
        pid = part.id
        out[pid] = part
        slots[d] = slot_of(pid, part)
    return Tree({}, slots, prefix)


def slot_of(tid: str, part: Tree) -> Slot:
    """The slot naming `part` (stored as `tid`)."""
    return Slot(tid, part.entry_count, part.file_count, part.size, part.content)


def folder_of(tid: str, sub: Tree) -> Folder:
    """The folder entry naming the folder node `sub` (stored as `tid`)."""
    return Folder(tid, sub.size, sub.file_count, sub.content)


def build(files: Mapping[str, FileEntry]) -> tuple[str, dict[str, Tree]]:
    """The trees of a flat file map (a format 1 commit): (root id, id -> Tree), every node."""
    nested: _Nested = {}
    d: _Nested | FileEntry
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

    def make(d: _Nested) -> Tree:
        entries: dict[str, Entry] = {}
        for name in sorted(d):
            v = d[name]
            if isinstance(v, dict):
                sub = make(v)
                sid = sub.id
                nodes[sid] = sub
                entries[name] = folder_of(sid, sub)
            else:
                entries[name] = v
        return folder_nodes(entries, nodes)

    root = make(nested)
    rid = root.id
    nodes[rid] = root
    return rid, nodes


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


class View:
    """A commit's files as trees, read node by node through `load` (memoized).

    `nodes` may hold trees not in any store (a format 1 commit's, built in memory):
    `apply` returns those it keeps, so that they are stored with the new commit.
    `load_many(ids) -> trees`, if given, reads the parts of one level of a split folder
    together (a listing of a wide folder waits on its depth, not on its part count)."""

    def __init__(self, load: Callable[[str], Tree], root: str, nodes: dict[str, Tree] | None = None,
                 load_many: Callable[[list[str]], list[Tree]] | None = None):
        self._load, self.root, self._load_many = load, root, load_many
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

    def preload(self, tids: Iterable[str]) -> None:
        """Read the trees `tids` not read yet together (one `load_many` call: one request to a
        server), so that `node` and `part` find them; without `load_many`, nothing (each is
        read when asked). A paging reader's read-ahead: a split node's next parts."""
        want = [t for t in dict.fromkeys(tids) if t not in self._memo]
        if self._load_many is not None and len(want) > 1:
            self._memo.update(zip(want, self._load_many(want)))

    def part(self, parent: Tree, digit: str) -> Tree:
        """Slot `digit` of split node `parent`, checked against the slot (`check_part`)."""
        if parent.slots is None:  # as indexing None would
            raise TypeError(f"part {digit!r} of a page: only a split node has parts")
        t = self.node(parent.slots[digit].tree)
        check_part(parent, digit, t)
        return t

    def contents(self, tid: str, seen: Callable[[str, Tree], None] | None = None) -> Tree:
        """The folder whose node is `tid` as one page of all its entries, sorted (a split
        folder's parts read, checked and passed to `seen(id, node)`)."""
        t = self.node(tid)
        if t.slots is None:  # a page
            return t
        entries: dict[str, Entry] = {}
        level = [(t, t.slots)]  # split nodes, with their slots
        while level:  # level by level: each level's parts read together when `load_many` can
            want = [sl.tree for _, slots in level for sl in slots.values() if sl.tree not in self._memo]
            if self._load_many is not None and len(want) > 1:
                self._memo.update(zip(want, self._load_many(want)))
            below = []
            for n, slots in level:
                for d, sl in slots.items():
                    p = self.part(n, d)
                    if seen is not None:
                        seen(sl.tree, p)
                    if p.slots is not None:  # split
                        below.append((p, p.slots))
                    else:
                        entries.update(p.entries)
            level = below
        return Tree(dict(sorted(entries.items())))

    def lookup(self, tid: str, name: str) -> Entry | None:
        """The entry `name` of the folder whose node is `tid`: reads the parts on its hash's path."""
        t, h = self.node(tid), None
        while t.slots is not None:  # split
            h = h or name_digits(name)
            d = h[len(t.prefix)]
            if d not in t.slots:
                return None
            t = self.part(t, d)
        return t.entries.get(name)

    # -- looking up ---------------------------------------------------------------------
    def folder_id(self, path: str) -> str | None:
        """The tree id of the folder at `path` ('' the root), None if no folder is there."""
        tid = self.root
        for part in path.split("/") if path else ():
            e = self.lookup(tid, part)
            if not isinstance(e, Folder):
                return None
            tid = e.tree
        return tid

    def folder(self, path: str) -> Tree | None:
        """The folder at `path` ('' the root) as one page of its entries, None if no folder is there."""
        tid = self.folder_id(path)
        return None if tid is None else self.contents(tid)

    def entry(self, path: str) -> Entry | None:
        """The file or folder entry at `path` (None for nothing; the root is no entry)."""
        if not path:
            return None
        parent, _, name = path.rpartition("/")
        tid = self.folder_id(parent)
        return None if tid is None else self.lookup(tid, name)

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
        for name, e in self.contents(tid).entries.items():
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

    def listing(self, path: str, recursive: bool = False) -> list[dict[str, Any]]:
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
        """Every tree id this commit reaches (each once): folders' nodes and their parts."""
        seen: set[str] = set()
        stack = [self.root]
        while stack:
            tid = stack.pop()
            if tid in seen:
                continue
            seen.add(tid)
            yield tid
            stack.extend(self.node(tid).children())


def _check_depth(prefix: str) -> None:
    if prefix.count("/") >= MAX_DEPTH:
        raise CorruptionError(f"tree at {prefix[:80]!r}... is more than {MAX_DEPTH} folders deep")


def _no_load(tid: str) -> Tree:
    raise CorruptionError(f"tree {tid} is not in this commit")


# -- change sets ---------------------------------------------------------------------------------
def changes(old: View | None, new: View, trees: set[str] | None = None,
            check: Callable[[str, Tree, Folder | Slot | None], None] | None = None
            ) -> tuple[dict[str, FileEntry], set[str]]:
    """What turns `old` into `new`: (paths added or changed -> entry, paths removed). Descends
    only into folders (and parts of split folders) whose tree ids differ: the cost follows the
    change. `trees`, if given, receives the ids of `new`'s trees that `old` lacks on those
    paths; `check(path, tree, entry)` sees each of them with the folder entry or slot naming
    it (None for the root)."""
    changed: dict[str, FileEntry] = {}
    removed: set[str] = set()
    _diff(old, old.root if old else None, new, new.root, "", changed, removed, trees, check, None)
    return changed, removed


def _diff(a: View | None, aid: str | None, b: View, bid: str | None, prefix: str,
          changed: dict[str, FileEntry], removed: set[str], trees: set[str] | None = None,
          check: Callable[[str, Tree, Folder | Slot | None], None] | None = None,
          folder: Folder | Slot | None = None) -> None:
    if aid == bid:
        return
    _check_depth(prefix)
    na = a.node(aid) if a is not None and aid else None  # (`a` is None only when `aid` is: `changes`)
    nb = b.node(bid) if bid else None

    def seen(tid: str, t: Tree, entry: Folder | Slot | None = None) -> None:
        if trees is not None:
            trees.add(tid)
        if check is not None:
            check(prefix, t, entry)

    if bid and nb is not None:  # (nb is read only for a bid)
        seen(bid, nb, folder)
    if a is not None and na is not None and nb is not None and na.slots is not None and nb.slots is not None \
            and na.prefix == nb.prefix:  # both split
        for d in sorted(na.slots.keys() | nb.slots.keys()):  # parts of one folder: compared part by part
            sx, sy = na.slots.get(d), nb.slots.get(d)
            if sx == sy:
                continue
            if sx is not None:
                a.part(na, d)
            if sy is not None:
                b.part(nb, d)
            _diff(a, sx.tree if sx else None, b, sy.tree if sy else None, prefix, changed, removed,
                  trees, check, sy)
        return
    ea = a.contents(aid).entries if a is not None and aid else {}  # (as na is not None)
    eb = b.contents(bid, lambda tid, t: seen(tid, t, None)).entries if bid else {}  # (as nb is not None)
    for name in ea.keys() | eb.keys():
        x, y = ea.get(name), eb.get(name)
        if x == y:
            continue
        p = _join(prefix, name)
        xf, yf = isinstance(x, Folder), isinstance(y, Folder)
        if xf or yf:
            _diff(a, x.tree if isinstance(x, Folder) else None, b, y.tree if isinstance(y, Folder) else None, p,
                  changed, removed, trees, check, y if isinstance(y, Folder) else None)
        if x is not None and not xf:
            if y is None or yf:
                removed.add(p)
        if y is not None and not isinstance(y, Folder):
            changed[p] = y


def same_files(old: View, new: View, extra_under: str | None = None) -> tuple[set[str], set[str]]:
    """(paths of `new`'s files that `old` holds with the same manifest and size, paths of
    `old`'s files under the folder `extra_under` that `new` lacks; none when it is None),
    reading `old` only where content ids differ (or `old` has none: a tree from before
    format 4). A folder or part whose content id `new` shares holds the same files and is
    not read: a Merkle descent. `new` is typically a machine's own files (`View.of_files`):
    then a push finds what changed by reading the trees on the changed paths only."""
    same: set[str] = set()
    extra: set[str] = set()
    _same(old, old.root, old.node(old.root).content, new, new.root, "", same, extra, extra_under)
    return same, extra


def _under(path: str, folder: str | None) -> bool:
    return folder is not None and (not folder or path == folder or path.startswith(folder + "/"))


def _same(a: View, aid: str, acontent: str | None, b: View, bid: str, prefix: str,
          same: set[str], extra: set[str], within: str | None) -> None:
    _check_depth(prefix)
    nb = b.node(bid)
    if acontent is not None and acontent == nb.content:
        same.update(p for p, _ in b._walk(bid, prefix))
        return
    na = a.node(aid)
    if na.slots is not None and nb.slots is not None and na.prefix == nb.prefix:  # both split
        for d, sx in na.slots.items():
            sy = nb.slots.get(d)
            if sy is not None and sx.content is not None and sx.content == sy.content:
                same.update(p for p, _ in b._walk(sy.tree, prefix))  # the part is not read
            elif sy is not None:
                a.part(na, d)
                _same(a, sx.tree, sx.content, b, sy.tree, prefix, same, extra, within)
            elif _under(prefix, within):
                a.part(na, d)
                extra.update(p for p, _ in a._walk(sx.tree, prefix))
        return
    ea, eb = a.contents(aid).entries, b.contents(bid).entries
    for name, x in ea.items():
        p, y = _join(prefix, name), eb.get(name)
        if isinstance(x, Folder) and isinstance(y, Folder):
            if within is not None and (_under(p, within) or _under(within, p)):
                _same(a, x.tree, x.content, b, y.tree, p, same, extra, within)
            else:
                _same(a, x.tree, x.content, b, y.tree, p, same, set(), None)
        elif isinstance(x, FileEntry) and isinstance(y, FileEntry) and (x.manifest, x.size) == (y.manifest, y.size):
            same.add(p)
        elif _under(p, within) and (y is None or isinstance(x, Folder) != isinstance(y, Folder)):
            # old's alone, or a file where new has a folder (or the reverse)
            extra.update(q for q, _ in a._walk(x.tree, p)) if isinstance(x, Folder) else extra.add(p)


def touched(old: View | None, new: View) -> set[str]:
    changed, removed = changes(old, new)
    return set(changed) | removed


class Clash(ValueError):
    """A change set that would make a path both a file and a folder (`paths` names them)."""

    def __init__(self, paths: list[str]):
        super().__init__(f"{paths[0]!r} is both a file and a folder")
        self.paths = paths


def _edit(view: View, tid: str | None, prefix: str, steps: Mapping[str, _Step], out: dict[str, Tree]) -> Tree:
    """The node of a folder (part) `tid` under hash `prefix` with `steps` (name -> f(current
    entry or None) -> new entry or None) applied; new nodes below it go to `out`. Reads only
    the parts the names hash to, and a split part's siblings when it shrinks to a page."""
    t = view.node(tid) if tid else EMPTY
    if t.slots is None:  # a page
        entries = dict(t.entries)
        for name, step in steps.items():
            new = step(entries.get(name))
            if new is None:
                entries.pop(name, None)
            else:
                entries[name] = new
        return folder_nodes(entries, out, prefix)
    groups: dict[str, dict[str, _Step]] = {}
    for name, step in steps.items():
        groups.setdefault(name_digits(name)[len(prefix)], {})[name] = step
    slots = dict(t.slots)
    for d, group in sorted(groups.items()):
        if d in slots:
            view.part(t, d)
        part = _edit(view, slots[d].tree if d in slots else None, prefix + d, group, out)
        if part.entry_count == 0:
            slots.pop(d, None)
        else:
            pid = part.id
            out[pid] = part
            slots[d] = slot_of(pid, part)
    if sum(sl.entries for sl in slots.values()) > LEAF_MAX:
        return Tree({}, dict(sorted(slots.items())), prefix)
    entries = {}  # shrunk to a page: its parts gathered (at most LEAF_MAX entries)
    stack = [sl.tree for sl in slots.values()]
    while stack:
        tid = stack.pop()
        n = out.get(tid) or view.node(tid)  # a part written by this edit is not stored yet
        if n.slots is not None:  # split
            stack.extend(sl.tree for sl in n.slots.values())
        else:
            entries.update(n.entries)
    return Tree(dict(sorted(entries.items())))


def apply(base: View | None, changed: Mapping[str, FileEntry], removed: Iterable[str] = (),
          load: Callable[[str], Tree] | None = None) -> tuple[str, dict[str, Tree]]:
    """The root of `base` with `changed` set and `removed` taken out (a removed path that is
    not a file is ignored): (new root id, trees to store). Only the folders on changed paths
    get new nodes (in a split folder, only the parts the changed names hash to); the rest keep
    their ids. Trees of `base` that are not stored yet (a format 1 base) and that the new
    root keeps are among those returned. Raises Clash when a path would be both a file and a
    folder."""
    view = base or View(load or _no_load, EMPTY.id, {EMPTY.id: EMPTY})
    edits: dict[str, Any] = {}  # nested by path part; the key "" holds the op on the path itself
    for path, f in [(p, None) for p in removed] + list(changed.items()):
        if path.count("/") >= MAX_DEPTH:
            raise InvalidAddressError(f"{path[:80]!r}... is more than {MAX_DEPTH} folders deep: use a shallower path")
        d = edits
        for p in path.split("/"):
            d = d.setdefault(p, {})
        d[""] = f  # FileEntry: set, None: remove
    out: dict[str, Tree] = {}
    clashes: list[str] = []

    def step(p: str, v: dict[str, Any], cur: Entry | None) -> Entry | None:
        leaf = v.get("", _MISSING)
        subs = {k: x for k, x in v.items() if k != ""}
        if leaf is None and isinstance(cur, FileEntry):
            cur = None
        if subs:
            if isinstance(cur, FileEntry):
                if any(_adds(subs)):
                    clashes.append(p)
            else:
                sub = rewrite(cur.tree if cur else None, subs, p)
                if sub.entry_count:
                    sid = sub.id
                    out[sid] = sub
                    cur = folder_of(sid, sub)
                else:
                    cur = None
        if isinstance(leaf, FileEntry):
            if isinstance(cur, Folder):
                clashes.append(p)
            elif not (leaf == cur and leaf.bundle is None):  # the same file: its bundle hint is kept
                cur = leaf
        return cur

    def rewrite(tid: str | None, ed: dict[str, Any], prefix: str) -> Tree:
        steps = {name: (lambda cur, p=_join(prefix, name), v=v: step(p, v, cur)) for name, v in ed.items()}
        return _edit(view, tid, "", steps, out)

    root = rewrite(view.root, edits, "")
    if clashes:
        raise Clash(sorted(clashes))
    rid = root.id
    out[rid] = root
    if view.unstored:  # a format 1 base: its kept trees are stored with the new root
        stack = [rid]
        seen: set[str] = set()
        while stack:
            tid = stack.pop()
            if tid in seen:
                continue
            seen.add(tid)
            t = out.get(tid) or view.unstored.get(tid)
            if t is None:
                continue
            out[tid] = t
            stack.extend(t.children())
    return rid, out


_MISSING = object()


def _adds(ed: dict[str, Any]) -> Iterator[bool]:
    for k, v in ed.items():
        if k == "":
            if v is not None:
                yield True
        else:
            yield from _adds(v)

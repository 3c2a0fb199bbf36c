"""Commits: a repo revision as JSON, named by the hash of its bytes (`ids.hexdigest`:
BLAKE3-256; commits written before id format v2 keep their xxh3-128 names).

Format 3 (written by this cdcstore) is format 2 plus who committed it:

    {"author": ..., "format": 3, "repo": ..., "parent": id | null, "message": ...,
     "time": epoch seconds, "tree": root tree id}

`author` is one line of at most 256 characters: a server's token name on a push to a server
with tokens (the server sets it), else what the writer says (`--author`, git's user, the OS
user). Format 2 (still read, and written for a commit without an author) names the root tree
of the revision's files (`treeobj.Tree`: a page a folder, a wide folder split into pages and split nodes):

    {"format": 2, "repo": ..., "parent": id | null, "message": ..., "time": epoch seconds,
     "tree": root tree id}

Format 1 (still read everywhere) holds the whole flat file map:

    {"format": 1, "repo": ..., "parent": id | null, "message": ..., "time": epoch seconds,
     "files": {path: {"manifest": id, "size": n}, ...}}

A `Commit` has `tree` set (formats 2 and 3) or `files` (format 1), never both; read its files
through `Backend.view` (one API for both formats).

Encoded as compact JSON with sorted keys so that the same commit always has the
same bytes and therefore the same id. `Commit.validate` checks every field; it
runs when a commit is encoded, decoded (a tampered store or a hostile server)
and received by the server, so no invalid commit is written or trusted.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from . import ids
from .address import check_name, normalize_path
from .errors import CdcError, CorruptionError

COMMIT_VERSION = 3  # what new commits are written as (2 when the commit has no author)
READ_VERSIONS = (1, 2, 3)
MAX_AUTHOR = 256  # characters
MAX_MESSAGE = 64 * 1024  # characters
MAX_TIME = 32503680000.0  # 3000-01-01 UTC, in epoch seconds
MAX_SIZE = 2 ** 53  # file sizes stay exact in every JSON reader


@dataclass(frozen=True)
class FileEntry:
    """A file of a commit: its manifest and size. `bundle` names the manifest bundle that holds
    the manifest (core/bundle.py), a hint for finding it: not part of what the file is (two
    entries of one manifest and size are equal whatever their bundles)."""
    manifest: str
    size: int
    bundle: str | None = field(default=None, compare=False)


@dataclass
class Commit:
    repo: str
    parent: str | None
    message: str
    time: float
    flat: dict[str, FileEntry] | None = None  # format 1: the whole file map
    tree: str | None = None  # formats 2 and 3: the root tree's id
    author: str | None = None  # format 3: who committed (see the module docstring)

    def __post_init__(self) -> None:
        if self.flat is None and self.tree is None:
            self.flat = {}
        # format 2: made by the backend the commit came from
        self._load_files: Callable[[], dict[str, FileEntry]] | None = None

    @property
    def files(self) -> dict[str, FileEntry]:
        """Every file of the commit by path (a format 2 commit reads all its trees once: to
        list, look up or walk part of it, use `Backend.view` / `Store.view`, which read only
        the trees on the path)."""
        if self.flat is not None:
            return self.flat
        if self._load_files is None:
            raise CdcError(f"commit names tree {self.tree}: read its files through Store.view (or Backend.view)")
        files = self._load_files()
        self._load_files = lambda: files
        return files

    def __getstate__(self) -> dict[str, Any]:  # the loader stays with the process that made it
        return {k: v for k, v in self.__dict__.items() if k != "_load_files"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _load_files=None)

    def bind(self, load_files: Callable[[], dict[str, FileEntry]]) -> "Commit":
        """Let `files` of a format 2 commit read its trees with `load_files()` (a backend's view)."""
        self._load_files = load_files
        return self

    @property
    def format(self) -> int:
        return 1 if self.tree is None else 2 if self.author is None else 3

    def with_author(self, author: str) -> "Commit":
        """This commit (formats 2 and 3) with `author` instead (a new id)."""
        return Commit(self.repo, self.parent, self.message, self.time, None, self.tree, author).validate()

    def validate(self) -> "Commit":
        """Check every field; raises ValueError naming the first bad one."""
        check_name("repo", self.repo)
        if self.parent is not None and not (isinstance(self.parent, str) and ids.is_hex_id(self.parent)):
            raise ValueError(f"parent {self.parent!r} is not a commit id (64 lowercase hex digits, "
                             f"32 for format v1) or null")
        if not isinstance(self.message, str) or len(self.message) > MAX_MESSAGE:
            raise ValueError(f"message must be a string of at most {MAX_MESSAGE} characters")
        if (not isinstance(self.time, (int, float)) or isinstance(self.time, bool)
                or not math.isfinite(self.time) or not 0 <= self.time <= MAX_TIME):
            raise ValueError(f"time {self.time!r} is not epoch seconds between 0 and {MAX_TIME:.0f} (year 3000)")
        if self.author is not None:
            check_author(self.author)
            if self.tree is None:
                raise ValueError("a commit with an author names a tree (format 3), not files")
        if self.tree is not None:
            if self.flat is not None:
                raise ValueError("a commit names a tree (format 2) or holds files (format 1), not both")
            if not (isinstance(self.tree, str) and ids.is_hex_id(self.tree)):
                raise ValueError(f"tree {self.tree!r} is not a tree id (lowercase hex digits)")
            return self
        if not isinstance(self.files, dict):
            raise ValueError("files must be an object of path -> {manifest, size}")
        for path, f in self.files.items():
            _check_path(path)
            _check_entry(path, f)
        _check_tree(self.files)
        return self

    def encode(self) -> bytes:
        self.validate()
        doc = {"format": self.format, "repo": self.repo, "parent": self.parent,
               "message": self.message, "time": self.time}
        if self.author is not None:
            doc["author"] = self.author
        if self.tree is not None:
            doc["tree"] = self.tree
        else:
            doc["files"] = {p: {"manifest": f.manifest, "size": f.size} for p, f in self.files.items()}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @property
    def id(self) -> str:
        return ids.hexdigest(self.encode())

    @classmethod
    def decode(cls, data: bytes, name: str = "commit") -> "Commit":
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            if doc.get("format") not in READ_VERSIONS or isinstance(doc.get("format"), bool):
                raise CorruptionError(f"{name} has commit format {doc.get('format')!r}; "
                                      f"this cdcstore reads formats 1 to 3: upgrade cdcstore")
            if doc["format"] == 1 and "author" in doc:
                raise ValueError("a format 1 commit has no author")
            if doc["format"] in (2, 3):
                if "files" in doc:
                    raise ValueError(f"a format {doc['format']} commit names a tree, not files")
                if (doc["format"] == 3) != ("author" in doc):
                    raise ValueError("a format 3 commit has an author, and only format 3 has one")
                return cls(doc["repo"], doc["parent"], doc["message"], doc["time"], None, doc["tree"],
                           doc.get("author")).validate()
            if not isinstance(doc["files"], dict):
                raise ValueError("files must be an object of path -> {manifest, size}")
            files = {p: FileEntry(f["manifest"], f["size"]) for p, f in doc["files"].items()}
            return cls(doc["repo"], doc["parent"], doc["message"], doc["time"], files).validate()
        except CorruptionError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, CdcError) as e:
            raise CorruptionError(f"{name} is not a valid commit: {e}") from None



def check_author(author: object) -> str:
    """An author is one line of 1 to MAX_AUTHOR characters, without control characters."""
    if (not isinstance(author, str) or not author.strip() or len(author) > MAX_AUTHOR
            or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in author)):
        raise ValueError(f"author {str(author)[:80]!r} must be one line of 1 to {MAX_AUTHOR} characters "
                         f"without control characters, e.g. 'Ada Lovelace <ada@example.org>'")
    return author


def _check_path(path: str) -> None:
    ok = isinstance(path, str) and path != ""
    try:
        ok = ok and normalize_path(path) == path
    except CdcError:
        ok = False
    if not ok:
        raise ValueError(f"invalid file path {path!r}: use relative '/'-separated paths "
                         f"without '.', '..' or empty parts")
    if path.count("/") >= 255:  # treeobj.MAX_DEPTH
        raise ValueError(f"file path {path[:80]!r}... is more than 255 folders deep")


def _check_entry(path: str, f: object) -> None:
    if not isinstance(f, FileEntry) or not (isinstance(f.manifest, str) and ids.is_hex_id(f.manifest)):
        raise ValueError(f"file {path!r}: manifest must be 64 lowercase hex digits (32 for format v1)")
    if not isinstance(f.size, int) or isinstance(f.size, bool) or not 0 <= f.size < MAX_SIZE:
        raise ValueError(f"file {path!r}: size must be an integer between 0 and 2**53")
    if f.bundle is not None and not (isinstance(f.bundle, str) and ids.is_new_hex_id(f.bundle)):
        raise ValueError(f"file {path!r}: bundle must be 64 lowercase hex digits")


def _check_tree(files: dict[str, FileEntry]) -> None:
    """No path may be both a file and a folder (`a` and `a/b`)."""
    clash = sorted(tree_clashes(files))
    if clash:
        raise ValueError(f"{clash[0]!r} is both a file and a folder")


# -- rebase of disjoint commits (pure) ------------------------------------------------------
def changes(old: dict[str, FileEntry], new: dict[str, FileEntry]) -> tuple[dict[str, FileEntry], set[str]]:
    """What turns `old` into `new`: (paths added or changed -> entry, paths removed)."""
    changed = {p: f for p, f in new.items() if old.get(p) != f}
    return changed, set(old) - set(new)


def touched(old: dict[str, FileEntry], new: dict[str, FileEntry]) -> set[str]:
    changed, removed = changes(old, new)
    return set(changed) | removed


def tree_clashes(files: dict[str, FileEntry]) -> set[str]:
    """Paths that would be both a file and a folder."""
    folders: set[str] = set()
    for p in files:
        parts = p.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return folders.intersection(files)


def rebase_files(ours: tuple[dict[str, FileEntry], set[str]], theirs: set[str],
                 head: dict[str, FileEntry]) -> tuple[dict[str, FileEntry] | None, list[str]]:
    """Apply our change set to `head`, whose history since our base touched `theirs`.

    Returns (files, []) or (None, overlapping paths) when both sides touched a path
    or the result would make a path both a file and a folder."""
    changed, removed = ours
    overlap = sorted((set(changed) | removed) & theirs)
    if overlap:
        return None, overlap
    files = {p: f for p, f in head.items() if p not in removed}
    files.update(changed)
    clash = sorted(tree_clashes(files))
    if clash:
        return None, clash
    return dict(sorted(files.items())), []

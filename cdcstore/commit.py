"""Commits (format v1): a repo revision as JSON, named by its xxh3-128.

    {"format": 1, "repo": ..., "parent": id | null, "message": ..., "time": epoch seconds,
     "files": {path: {"manifest": id, "size": n}, ...}}

Encoded as compact JSON with sorted keys so that the same commit always has the
same bytes and therefore the same id.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from . import ids
from .errors import CorruptionError

COMMIT_VERSION = 1


@dataclass(frozen=True)
class FileEntry:
    manifest: str
    size: int


@dataclass
class Commit:
    repo: str
    parent: str | None
    message: str
    time: float
    files: dict[str, FileEntry] = field(default_factory=dict)

    def encode(self) -> bytes:
        doc = {
            "format": COMMIT_VERSION,
            "repo": self.repo,
            "parent": self.parent,
            "message": self.message,
            "time": self.time,
            "files": {p: {"manifest": f.manifest, "size": f.size} for p, f in self.files.items()},
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @property
    def id(self) -> str:
        return ids.hexdigest(self.encode())

    @classmethod
    def decode(cls, data: bytes, name: str = "commit") -> "Commit":
        try:
            doc = json.loads(data)
            if doc.get("format") != COMMIT_VERSION:
                raise CorruptionError(f"{name} has commit format {doc.get('format')}; this cdcstore reads {COMMIT_VERSION}")
            files = {p: FileEntry(f["manifest"], int(f["size"])) for p, f in doc["files"].items()}
            return cls(doc["repo"], doc["parent"], doc["message"], float(doc["time"]), files)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptionError(f"{name} is not a valid commit: {e}") from None

    def total_size(self) -> int:
        return sum(f.size for f in self.files.values())


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
    folders = set()
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

"""Operations on a flat map of files {path: FileEntry} (pure logic): globs for push and
pull, a diff of two maps, listings of a map.

A commit's files are read through `treeobj.View` (`Backend.view`), which reads only the
trees on a path; these helpers work on the part of a commit a caller already holds as a
map (`View.under`), and on format 1 commits' maps.
"""
from __future__ import annotations

import fnmatch
from typing import Iterable, Mapping

from .commit import FileEntry


def prefix_of(path: str) -> str:
    """The key prefix of everything under `path` ('' for the root)."""
    return path + "/" if path else ""


def under(files: Mapping[str, FileEntry], path: str) -> dict[str, FileEntry]:
    """The file at `path`, or every file under the folder `path`, by full path."""
    if path in files:
        return {path: files[path]}
    prefix = prefix_of(path)
    return {p: f for p, f in files.items() if p.startswith(prefix)}


def diff(old: Mapping[str, FileEntry], new: Mapping[str, FileEntry]) -> tuple[list[str], list[str], list[str]]:
    """(added, removed, changed) paths from `old` to `new`, each sorted; a file whose manifest
    is the same (the same bytes) is unchanged."""
    added = sorted(p for p in new if p not in old)
    removed = sorted(p for p in old if p not in new)
    changed = sorted(p for p in new if p in old and new[p].manifest != old[p].manifest)
    return added, removed, changed


def matches(rel: str, patterns: Iterable[str]) -> bool:
    """Whether a path (relative to what is pushed or pulled) matches one of the glob patterns: a
    pattern with a '/' matches the whole relative path, one without matches any name in it
    (`*.tmp` excludes tmp files at any depth, `cache` a folder named cache anywhere)."""
    parts = rel.split("/")
    for pat in patterns:
        if "/" in pat.strip("/"):
            if fnmatch.fnmatchcase(rel, pat.strip("/")) or fnmatch.fnmatchcase(rel, pat.strip("/") + "/*"):
                return True
        elif any(fnmatch.fnmatchcase(part, pat.strip("/")) for part in parts):
            return True
    return False


def selected(rel: str, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> bool:
    """--include/--exclude: kept when it matches an include (or there are none) and no exclude."""
    include, exclude = list(include), list(exclude)
    return (not include or matches(rel, include)) and not matches(rel, exclude)

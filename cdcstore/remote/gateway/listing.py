"""The S3 gateway's listings (remote/gateway/reads.py): a folder's keys in S3 key order, a page at a time.

A folder's entries are sorted once and kept by its tree id (immutable: named by its bytes), so a
page of a wide folder is a binary search and the page, not a sort of the whole folder (issue 42: a
20,000-entry folder sorted on every page took 1.3 s a page; 2 M entries would take ~28 hours to
list). These are listings, never manifests: files are read through the one read core.
"""
from __future__ import annotations

import bisect
import collections
from typing import Iterator

from ... import runtime
from ...core.treeobj import Folder

SORTED_KEPT = 1 << 20  # folder entries kept sorted in key order (by tree id), for listing pages


class SortedFolders:
    """Folders' entries in S3 key order, kept by tree id (immutable: named by their bytes), at
    most SORTED_KEPT entries in all, least recently used out first: a page of a wide folder's
    listing is a binary search and the page, not a sort of the whole folder (issue 42: a
    20,000-entry folder sorted on every page, 1.3 s a page)."""

    def __init__(self, most: int = SORTED_KEPT):
        self.most = most
        self._kept: collections.OrderedDict[str, tuple[list[str], list[tuple]]] = collections.OrderedDict()
        self._count = 0
        self._lock = runtime.Lock()

    def get(self, view, tid: str) -> tuple[list[str], list[tuple[str, str, object]]]:
        """(key parts, (key part, name, entry)) of a folder, sorted: a folder's part ends with '/'."""
        with self._lock:
            got = self._kept.get(tid)
            if got is not None:
                self._kept.move_to_end(tid)
                return got
        items = sorted((name + ("/" if isinstance(e, Folder) else ""), name, e)
                       for name, e in view.contents(tid).entries.items())
        got = ([part for part, _, _ in items], items)
        with self._lock:
            if tid not in self._kept and len(items) <= self.most:
                self._kept[tid] = got
                self._count += len(items)
                while self._count > self.most:
                    self._count -= len(self._kept.popitem(last=False)[1][1])
        return got


SORTED = SortedFolders()


def before(key_prefix: str, after: str) -> bool:
    """Whether every key that starts with `key_prefix` sorts at or before `after`."""
    return key_prefix <= after and not after.startswith(key_prefix)


def _first(parts: list[str], items: list[tuple], base: str, name_prefix: str, after: str) -> int | None:
    """Where a folder's listing starts: the first entry whose keys may sort after `after` and
    whose name starts with `name_prefix` (None: no key of the folder sorts after `after`)."""
    i = 0
    if after.startswith(base):
        rel = after[len(base):]
        i = bisect.bisect_right(parts, rel)
        if i and isinstance(items[i - 1][2], Folder) and rel.startswith(parts[i - 1]):
            i -= 1  # `after` lies inside this folder: its later keys come next
    elif after > base:
        return None  # every key under `base` sorts before `after`
    return max(i, bisect.bisect_left(parts, name_prefix)) if name_prefix else i


def tree_keys(view, tid: str, base: str, name_prefix: str, recurse: bool, after: str) -> Iterator[tuple]:
    """("file", key, entry) and ("prefix", key, None) under a folder (its tree id), in key order,
    after `after`."""
    parts, items = SORTED.get(view, tid)
    start = _first(parts, items, base, name_prefix, after)
    if start is None:
        return
    for k in range(start, len(items)):
        part, name, e = items[k]
        if not name.startswith(name_prefix):
            break  # the names with a prefix lie together, in key order
        key = base + part
        if isinstance(e, Folder):
            if before(key, after):
                continue
            if recurse:
                yield from tree_keys(view, e.tree, key, "", True, after)
            elif key > after:
                yield "prefix", key, None
        elif key > after:
            yield "file", key, e

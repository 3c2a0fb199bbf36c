"""Issue 42 item 4: a gateway listing page costs O(page). Each page of a wide folder sorted the
whole folder (about 25 us an entry a page: a 20,000-entry folder 1.3 s a page, a 2 M-entry one
about 28 hours to list). The folder's sorted entries are kept by tree id and a page starts by a
binary search. Pure: `tree_keys` over a real split tree, every page against a plain sort."""
import hashlib

import pytest

from cdcstore.core import treeobj
from cdcstore.core.commit import FileEntry
from cdcstore.remote.gateway import listing

WIDE = 5_000


def _m(i: int) -> str:
    return hashlib.blake2b(str(i).encode(), digest_size=32).hexdigest()


@pytest.fixture
def view():
    files = {f"wide/f{i:05d}.bin": FileEntry(_m(i), i) for i in range(WIDE)}
    files.update({f"wide/sub{i}/x.bin": FileEntry(_m(-i), 1) for i in range(3)})
    files.update({"wide/f00042.bin.d/y": FileEntry(_m(-9), 2), "top.txt": FileEntry(_m(-7), 3)})
    root, nodes = treeobj.build(files)
    v = treeobj.View(nodes.__getitem__, root)
    return v, files


def _all(view, folder: str, name_prefix: str, recurse: bool, after: str = "") -> list[str]:
    base = "main/" + (folder + "/" if folder else "")
    return [k for _, k, _ in listing.tree_keys(view, view.folder_id(folder), base, name_prefix, recurse, after)]


def _reference(files, folder: str, name_prefix: str, recurse: bool, after: str) -> list[str]:
    base = (folder + "/" if folder else "")
    keys = set()
    for p in files:
        if not p.startswith(base + name_prefix):
            continue
        rest = p[len(base):]
        if recurse or "/" not in rest:
            keys.add("main/" + p)
        else:
            keys.add("main/" + base + rest.split("/", 1)[0] + "/")
    return sorted(k for k in keys if k > after)


@pytest.mark.parametrize("prefix,recurse", [("", False), ("", True), ("f0004", False), ("f00042", True),
                                            ("sub", False), ("zz", False)])
def test_pages_of_a_wide_folder_match_a_plain_sort(view, prefix, recurse):
    v, files = view
    want = _reference(files, "wide", prefix, recurse, "")
    assert _all(v, "wide", prefix, recurse) == want
    for after in [want[len(want) // 3], want[-1], "main/wide/f00042.bin.d/", "main/wide/f00042.bin.d/a",
                  "main/wide/sub1/", "main/wide/sub1/x.bin", "main/a", "main/zzz", "main/wide/"] if want else ["main/"]:
        assert _all(v, "wide", prefix, recurse, after) == _reference(files, "wide", prefix, recurse, after), after


def test_a_wide_folder_is_sorted_once_for_all_its_pages(view, monkeypatch):
    v, files = view
    monkeypatch.setattr(listing, "SORTED", listing.SortedFolders())
    calls = []
    real = v.contents
    monkeypatch.setattr(v, "contents", lambda tid, *a: (calls.append(tid), real(tid, *a))[1])
    after, pages = "", 0
    while True:
        page = []
        for _, k, _ in listing.tree_keys(v, v.folder_id("wide"), "main/wide/", "", False, after):
            page.append(k)
            if len(page) == 100:
                break
        if not page:
            break
        after, pages = page[-1], pages + 1
    assert pages == (WIDE + 4) // 100 + 1
    assert calls.count(v.folder_id("wide")) == 1  # one sort for every page

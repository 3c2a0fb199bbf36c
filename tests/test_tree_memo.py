"""Issue 42: the decoded-tree memo is shared by the threads of a server (the web view's pool of 8,
the gateway): past its bound, two threads evicting at once made one raise KeyError, and the store
and log pages answered HTTP 500 past 4,096 trees. A small bound here, many threads, every tree read."""
import concurrent.futures
import sys

import pytest

from cdcstore import Store
from cdcstore.storage import metadata

FOLDERS = 120


@pytest.fixture
def wide(tmp_path):
    src = tmp_path / "src"
    for d in range(FOLDERS):
        (src / f"d{d:03d}").mkdir(parents=True)
        (src / f"d{d:03d}" / "f.txt").write_text(f"folder {d}\n")
    url = str(tmp_path / "store")
    with Store.init(url) as s:
        s.push([str(src)], "cdc://ds/")
    return url


def test_trees_read_by_eight_threads_past_the_memo_bound(wide, monkeypatch):
    monkeypatch.setattr(metadata, "TREE_MEMO", 8)
    with Store(wide) as s:
        def walk(k: int) -> int:
            n = 0
            for d in range(FOLDERS):
                d = (d * 7 + k) % FOLDERS
                assert s.cat(f"cdc://ds/d{d:03d}/f.txt") == f"folder {d}\n".encode()
                n += 1
            return n
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert sum(pool.map(walk, range(32))) == 32 * FOLDERS


def test_the_tree_memo_under_eight_threads_past_its_bound(wide, monkeypatch):
    """White box, the race itself: every thread asks for trees the memo just evicted."""
    monkeypatch.setattr(metadata, "TREE_MEMO", 4)
    monkeypatch.setattr(sys, "getswitchinterval", sys.getswitchinterval)
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        with Store(wide) as s:
            md = s.backend.uncached().metadata
            names = sorted(md.tree_names())
            assert len(names) > FOLDERS

            def ask(k: int) -> int:
                return sum(md.get_tree(names[(i * 13 + k) % len(names)]) is not None for i in range(3000))
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                assert sum(pool.map(ask, range(16))) == 16 * 3000
            assert len(md._trees) <= 4
    finally:
        sys.setswitchinterval(0.005)

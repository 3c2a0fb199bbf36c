"""Issue 42 item 3: the web view's store and log pages cost what a page shows once the history
was walked: every view walked the whole history again, reading every commit object (82-106 s a
store page over 2,000 commits under 50 parallel views, growing faster than the history). The
commits are kept decoded; a warm page reads none. A real directory store; `Browser` is what the
pages call."""
import concurrent.futures

from cdcstore import Store
from cdcstore.remote.web.data import Browser
from cdcstore.storage.repository import open_repository

COMMITS = 120


def test_warm_store_and_log_pages_read_no_commit_again(tmp_path):
    src = tmp_path / "f.txt"
    with Store.init(str(tmp_path / "s")) as s:
        for i in range(COMMITS):
            src.write_text(f"version {i}\n" * (i + 1))
            s.push([str(src)], f"cdc://ds/v{i % 7}.txt", message=f"v{i}")
    repo = open_repository(str(tmp_path / "s"))
    reads = []
    real = repo.get_commit
    repo.get_commit = lambda r, c: (reads.append(c), real(r, c))[1]
    browse = Browser(repo)
    branch, series = browse.series("ds")
    assert branch == "main" and len(series) == COMMITS
    assert series[-1]["whole"] == sum(s["logical"] for s in series) and series[-1]["stored"] > 0
    cold = len(reads)
    assert cold >= COMMITS
    reads.clear()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # many views at once, warm
        pages = list(pool.map(lambda _: browse.series("ds"), range(16)))
        logs = list(pool.map(lambda k: browse.log("ds", "main", k * 10, 10), range(12)))
    assert all(p == (branch, series) for p in pages)
    assert [e["commit"] for k in range(12) for e in logs[k][0]] == [s["commit"] for s in series[::-1]]
    assert len(reads) == 0, len(reads)  # never the history again

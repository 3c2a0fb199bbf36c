"""One walk from the refs (storage/reach.py), one rule for forgotten commits: gc's mark,
`check`, `rebuild-index` and a server's access records see the same live set."""
import os

import pytest

from cdcstore import Store
from cdcstore.storage import check, maintenance, reach
from cdcstore.storage.access import AccessRecords
from cdcstore.storage.repository import LocalStore, Repository


def _dir(tmp_path, name: str, files: dict[str, bytes]) -> str:
    d = tmp_path / name
    d.mkdir()
    for n, data in files.items():
        (d / n).write_bytes(data)
    return str(d)


@pytest.fixture
def history(store, tmp_path):
    """Repo ds: c0 {a, b0}, c1 {a, b1, c1}, c2 {a, b1, c2}, c3 {a, b1, c2, d}; tag `old` at c0;
    c0 and c1 forgotten. b1 came in with a forgotten commit and kept ones still name it. Repo
    other shares a.bin."""
    blobs = {k: os.urandom(3000) for k in ("a", "b0", "b1", "c1", "c2", "d", "o")}
    versions = [{"a.bin": "a", "b.bin": "b0"}, {"a.bin": "a", "b.bin": "b1", "c.bin": "c1"},
                {"a.bin": "a", "b.bin": "b1", "c.bin": "c2"}, {"a.bin": "a", "b.bin": "b1", "c.bin": "c2", "d.bin": "d"}]
    cids = [store.push([_dir(tmp_path, f"v{i}", {n: blobs[k] for n, k in v.items()})], "cdc://ds/").commit
            for i, v in enumerate(versions)]
    store.push([_dir(tmp_path, "o", {"a.bin": blobs["a"], "o.bin": blobs["o"]})], "cdc://other/")
    be = LocalStore(store.location)
    be.create_tag("ds", "old", cids[0])
    be.ref_store.forget("ds", cids[:2])
    names = {}  # blob key -> manifest name
    for cid, v in zip(cids, versions):
        view = be.view("ds", be.get_commit("ds", cid))
        names.update({k: view.get(n).manifest for n, k in v.items()})
    return be, cids, names


def _rows(index, kind: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for repo, name in index.conn.execute("SELECT repo, name FROM repo_objects WHERE kind = ?", (kind,)):
        out.setdefault(repo, set()).add(name)
    return out


def _chunks(index) -> set[bytes]:
    return {c for (c,) in index.conn.execute("SELECT id FROM repo_chunks")}


def test_gc_check_rebuild_and_access_records_share_one_live_set(history, tmp_path):
    be, cids, names = history
    live = maintenance.mark(be)
    want = {names[k] for k in ("a", "b1", "c2", "d")}
    assert want <= live.manifests and not live.manifests & {names["b0"], names["c1"]}
    assert {("ds", c) for c in cids} <= live.commits  # forgotten commits stay as history

    # a server's records, derived from the refs by a fresh replica (its own empty index)
    fresh = Repository(be.objects, str(tmp_path / "fresh.sqlite"), be.location)
    access = AccessRecords(fresh)
    assert access.refresh("ds") == 4 and access.refresh("other") == 1
    assert access.refresh("ds") == 0  # its whole history is recorded now
    granted = _rows(fresh.index, "manifest")
    assert set().union(*granted.values()) == live.manifests
    assert granted["ds"] == want  # b1 through the kept c2, though c1 (forgotten) brought it in
    assert set().union(*_rows(fresh.index, "tree").values()) == live.trees
    assert _chunks(fresh.index) == live.chunks

    # rebuild-index derives the same records; check walks the same files
    check.rebuild_index(be)
    assert _rows(be.index, "manifest") == granted and _rows(be.index, "tree") == _rows(fresh.index, "tree")
    assert _chunks(be.index) == live.chunks
    found: list = []
    assert set(check._check_reachable(be, found, set())) == live.chunks and found == []


def test_a_tag_at_a_forgotten_commit_grants_nothing(history, tmp_path):
    """The head of tag `old` is forgotten: its files are not live, so a first read of them
    through a server (`grant_if_headed`) is not granted either."""
    be, _, names = history
    access = AccessRecords(Repository(be.objects, str(tmp_path / "fresh.sqlite"), be.location))
    assert not access.grant_if_headed("ds", names["b0"])
    assert access.grant_if_headed("ds", names["d"])
    assert access.reaches("ds", "manifest", names["d"]) and not access.reaches("ds", "manifest", names["b0"])


def test_walk_yields_commits_then_their_reach(history):
    be, cids, names = history
    found = list(reach.walk(be, "ds", {"main": cids[3]}))
    commits = [f for f in found if f.kind == "commit"]
    assert [f.name for f in commits] == cids[::-1] and [f.kept for f in commits] == [True, True, False, False]
    files = {f.name for f in found if f.kind == "file"}
    assert files == {names[k] for k in ("a", "b1", "c2", "d")}
    # measured against the nearest kept ancestor: c2 adds b1 (its parent c1 is forgotten), c3 adds d
    added = [(f.kind, f.name) for f in reach.walk(be, "ds", {"main": cids[3]}, diff=True) if f.kind != "tree"]
    assert added[:2] == [("commit", cids[3]), ("file", names["d"])]
    assert {n for k, n in added[3:] if k == "file"} == {names[k] for k in ("a", "b1", "c2")}


def test_a_damaged_tree_is_a_problem_for_check_and_stops_gc(history):
    be, cids, _ = history
    head = be.get_commit("ds", cids[3])
    path = be.objects.local_path(f"trees/{head.tree[:2]}/{head.tree}")
    os.unlink(path)
    be.metadata._trees.clear()
    problems = check.check(be)["problems"]
    assert any(head.tree in p and "cdc://ds@main" in p for p in problems)
    with pytest.raises(Exception, match=head.tree):
        maintenance.mark(be)


def test_a_local_commit_keeps_no_access_records(tmp_path):
    """A local commit (no server) records no grants; a server's records are derived later."""
    s = Store.init(str(tmp_path / "store"))
    s.push([_dir(tmp_path, "d", {"f.bin": os.urandom(5000)})], "cdc://r/")
    be = LocalStore(s.location)
    assert _rows(be.index, "manifest") == {} and _chunks(be.index) == set()
    assert AccessRecords(be).refresh("r") == 1 and len(_rows(be.index, "manifest")["r"]) == 1
    s.close()

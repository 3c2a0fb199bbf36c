"""Forgotten commits: history only. A new branch or tag cannot name one (gc frees its files, so the
ref would name files that are gone), and gc's early freeing of what only forgotten commits reach
(`maintenance.forgotten_reach`) follows reach.py's walk and rule."""
import os

import pytest

from cdcstore import Store
from cdcstore.core.errors import RevisionNotFoundError
from cdcstore.storage import maintenance, reach
from cdcstore.storage.repository import LocalStore


def _push(store, tmp_path, name: str, files: dict[str, bytes]) -> str:
    d = tmp_path / name
    d.mkdir()
    for n, data in files.items():
        (d / n).write_bytes(data)
    return store.push([str(d)], "cdc://ds/", delete=True).commit  # the folder as it is: old.bin goes


@pytest.fixture
def forgotten(store, tmp_path):
    """ds: c0 {a, old}, c1 {a, new}; c0 forgotten."""
    a, old, new = (os.urandom(40_000) for _ in range(3))
    c0 = _push(store, tmp_path, "v0", {"a.bin": a, "old.bin": old})
    c1 = _push(store, tmp_path, "v1", {"a.bin": a, "new.bin": new})
    assert store.forget("ds", keep_last=1)["forget"] == [c0]
    return store, c0, c1, old


def test_a_branch_or_tag_at_a_forgotten_commit_is_refused(forgotten):
    store, c0, c1, old = forgotten
    be = LocalStore(store.location)
    for make in (store.create_branch, store.tag, be.create_branch, be.create_tag):  # the backend's own too
        with pytest.raises(RevisionNotFoundError, match=f"commit {c0[:12]}.* was forgotten"):
            make("ds", "back", c0)
    with pytest.raises(RevisionNotFoundError, match="a branch there would name files gc frees.*kept commit"):
        be.create_branch("ds", "back", c0)
    assert store.branches("ds") == {"main": c1} and store.tags("ds") == {}
    store.gc(grace=0)
    assert store.check(read_data=True)["problems"] == []
    store.create_branch("ds", "fine", c1)  # a kept commit can still be branched
    assert store.branches("ds")["fine"] == c1


def test_a_branch_at_a_forgotten_commit_is_refused_through_a_server(server, tmp_path):
    """A client that names the commit id itself (the route takes one) is refused too."""
    store = Store(server.url, cache=False)
    a, old, new = (os.urandom(40_000) for _ in range(3))
    c0 = _push(store, tmp_path, "v0", {"a.bin": a, "old.bin": old})
    c1 = _push(store, tmp_path, "v1", {"a.bin": a, "new.bin": new})
    LocalStore(str(tmp_path / "srv")).ref_store.forget("ds", [c0])
    with pytest.raises(RevisionNotFoundError, match="was forgotten"):
        store.backend.uncached().create_branch("ds", "back", c0)
    assert store.branches("ds") == {"main": c1}
    store.close()


def test_forgotten_reach_is_what_forgotten_commits_add_past_the_live_set(forgotten):
    store, c0, c1, old = forgotten
    be = LocalStore(store.location)
    live = maintenance.mark(be)
    gone = maintenance.forgotten_reach(be, live)
    view0 = be.view("ds", be.get_commit("ds", c0))
    only_old = view0.get("old.bin").manifest
    assert set(gone.manifests) == {only_old}  # a.bin is live through c1
    assert set(gone.chunks) == set(be.get_manifest(only_old).chunk_ids) - live.chunks
    assert set(gone.trees) == {view0.root}
    assert not set(gone.trees) & live.trees and not set(gone.manifests) & live.manifests
    # every object has the forgotten commit's landing time
    when = {i.name.rsplit("/", 1)[-1].removesuffix(".json"): i.mtime for i in be.objects.list("repos/ds/commits/")}
    assert set(gone.manifests.values()) | set(gone.trees.values()) == {when[c0]}
    assert not reach.kept(c0, be.forgotten("ds")) and reach.kept(c1, be.forgotten("ds"))
    # after gc freed them, a second plan finds nothing more to free early and does not fail
    store.gc(grace=0)
    again = maintenance.forgotten_reach(be, maintenance.mark(be))
    assert set(again.manifests) <= {only_old} and store.check()["problems"] == []


@pytest.mark.parametrize("where", ["local", "server"])
def test_forget_never_drops_a_tagged_release(tmp_path, where, server):
    """Issue 33, case 1: `forget --keep-last 2 --prune` without --keep-tags forgot and pruned the
    commits of tags v1-v3: `ls @v1` failed and store-wide `stats` exited 1. A tagged commit is kept
    like a branch head by the retention policy (git never drops one), and the output says which
    commits only tags kept. (A commit named explicitly to the storage layer may still be
    forgotten: a tag there then grants nothing, test_reach.py.)"""
    from click.testing import CliRunner
    from cdcstore.cli import cli

    location = server.url if where == "server" else str(tmp_path / "store")
    s = Store(location, cache=False) if where == "server" else Store.init(location)
    versions = {}
    for i in range(6):
        data = os.urandom(200_000)
        commit = _push(s, tmp_path, f"v{i}", {"d.bin": data})
        versions[i] = (commit, data)
        if i < 3:
            s.tag("ds", f"v{i + 1}")
    out = CliRunner().invoke(cli, ["forget", "ds", "--keep-last", "2", "--prune", "--store", location])
    assert out.exit_code == 0, out.output
    assert "only because tagged: v1, v2, v3" in out.output
    for i in range(3):
        assert s.cat(f"cdc://ds@v{i + 1}/d.bin") == versions[i][1]
    assert s.cat("cdc://ds/d.bin") == versions[5][1]
    from cdcstore.core.errors import NotFoundError
    with pytest.raises(NotFoundError):  # the untagged commit after v3 was forgotten and pruned
        s.cat(f"cdc://ds@{versions[3][0]}/d.bin")
    assert CliRunner().invoke(cli, ["stats", "--store", location]).exit_code == 0
    s.close()

"""Tenant isolation on a shared store: what a repo's grants may reach."""
import pytest

from cdcstore import ConflictError
from cdcstore.commit import Commit


def test_refused_commit_grants_nothing(store, tmp_path):
    """A commit refused by the compare-and-swap must not record any reach for its repo."""
    src = tmp_path / "b"
    src.mkdir()
    (src / "secret.bin").write_bytes(b"B's secret " * 1000)
    store.push([str(src)], "cdc://b/")
    be = store.backend
    commit_b = be.get_commit("b", be.resolve("b", "main"))
    names = {f.manifest for f in commit_b.files.values()}
    be.ensure_repo("a")
    hostile = Commit("a", None, "", 0.0, commit_b.files)
    with pytest.raises(ConflictError):
        be.commit(hostile, "main", "0" * 32)
    assert not any(be.index.reaches("a", "manifest", n) for n in names)
    packs = {p for p, _ in be.index.locate(
        {c for n in names for c in be.get_manifest(n).chunk_ids}).values()}
    assert packs and not any(be.index.reaches("a", "pack", p) for p in packs)


@pytest.mark.parametrize("parent", ["../../x", "..", "commits", "zz" * 16, "0" * 32, "garbage"])
def test_commit_parent_must_be_a_commit_id_of_this_repo(server, parent):
    """A parent is never used as a path: folders, traversal and garbage give one 400, no 500 or oracle."""
    import json
    import urllib.error
    import urllib.request
    # raw JSON: Commit.encode refuses such a parent, a hostile client does not
    body = json.dumps({"format": 1, "repo": "r", "parent": parent, "message": "", "time": 0.0, "files": {}})
    req = urllib.request.Request(server.url + "/v1/repos/r/commits", method="POST",
                                 data=json.dumps({"commit": body, "branch": "main", "expected": None}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    text = e.value.read().decode()
    assert server.store not in text and "parent" in text


def test_error_bodies_hide_server_paths_and_other_repos(server, tmp_path):
    """A 404 for an unknown repo names neither the store's folder nor the repos of other tenants."""
    import urllib.error
    import urllib.request
    from cdcstore import Store
    src = tmp_path / "b"
    src.mkdir()
    (src / "x.txt").write_bytes(b"x")
    Store(server.store).push([str(src)], "cdc://tenant-b-secret-name/")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + "/v1/repos/nope/branches", timeout=10)
    text = e.value.read().decode()
    assert e.value.code == 404 and "nope" in text
    assert str(tmp_path) not in text and "tenant-b-secret-name" not in text


def test_locate_through_another_repo_reveals_nothing(server, tmp_path):
    """Repo A's locate answers nothing about a chunk that only repo B reaches."""
    import urllib.request
    from cdcstore import Store
    for repo, data in (("b", b"B's secret " * 1000), ("a", b"A's own data")):
        src = tmp_path / repo
        src.mkdir()
        (src / "f.bin").write_bytes(data)
        Store(server.store).push([str(src)], f"cdc://{repo}/")
    be = Store(server.store).backend
    b = be.get_commit("b", be.resolve("b", "main"))
    chunk = be.get_manifest(b.files["f.bin"].manifest).chunk_ids[0]

    def locate(repo):
        req = urllib.request.Request(f"{server.url}/v1/repos/{repo}/locate", data=chunk, method="POST")
        return urllib.request.urlopen(req, timeout=10).read()
    assert chunk in locate("b") and chunk not in locate("a")

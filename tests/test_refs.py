"""storage/refs.py: `Refs` needs of its repository only what `RefHost` declares.

Refs run over a host that answers only the `RefHost` members (anything else raises), so a
reach past the protocol into the repository fails here; the branch moves by compare-and-swap
and the rebase of a commit whose parent moved are driven through that narrow host.
"""
import os

import pytest

from cdcstore import Store
from cdcstore.core.errors import ConflictError, RefExistsError, RevisionNotFoundError
from cdcstore.storage.refs import RefHost, Refs
from cdcstore.storage.repository import LocalStore

ALLOWED = {n for n in vars(RefHost) if not n.startswith("_")} | set(RefHost.__annotations__)


class OnlyHost:
    """The repository seen through `RefHost` alone."""

    def __init__(self, repo):
        self._repo = repo
        self.asked: set[str] = set()

    def __getattr__(self, name):
        if name not in ALLOWED:
            raise AttributeError(f"Refs asked its host for {name!r}, which RefHost does not declare")
        self.asked.add(name)
        return getattr(self._repo, name)


@pytest.fixture
def repo(tmp_path):
    root = str(tmp_path / "s")
    LocalStore.init(root)
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(20_000))
    r = LocalStore(root)
    Store.over(r).push([str(src)], "cdc://ds/a.bin")
    yield r
    r.close()


def test_refs_run_on_the_ref_host_alone(repo):
    host = OnlyHost(repo)
    refs = Refs(host)
    assert refs.repos() == ["ds"]
    head = refs.branches("ds")["main"]
    assert refs.resolve_ref("ds", "main") == (head, "branch")
    assert refs.resolve_ref("ds", head[:8]) == (head, "commit")
    refs.create_ref("ds", "tag", "v1", head)
    with pytest.raises(RefExistsError, match="tag 'v1' already exists"):
        refs.create_ref("ds", "branch", "v1", head)
    assert refs.refs("ds") == {"main": head, "tag:v1": head}
    assert refs.delete_ref("ds", "tag", "v1") == head
    with pytest.raises(RevisionNotFoundError, match="no branch or tag 'v1'"):
        refs.resolve_ref("ds", "v1")

    # two commits on the same head touching other paths: the second lands rebased
    entry = repo.view("ds", repo.get_commit("ds", head)).files()["a.bin"]
    ours = repo.make_commit("ds", head, "b", 1.0, {"b.bin": entry})
    theirs = repo.make_commit("ds", head, "c", 2.0, {"c.bin": entry})
    first = refs.commit(ours, "main", head)
    second = refs.commit(theirs, "main", head)
    assert second not in (first, theirs.id)  # a rebased copy on the moved head
    landed = repo.get_commit("ds", second)
    assert landed.parent == first
    assert set(repo.view("ds", landed).files()) == {"a.bin", "b.bin", "c.bin"}
    assert refs.commit(theirs, "main", head) == second  # a retry finds its copy: no second rebase
    # the same path changed by both: a conflict naming it, the branch left where it was
    clash = repo.make_commit("ds", head, "d", 3.0, {"b.bin": entry, "d.bin": entry})
    with pytest.raises(ConflictError, match="same paths: b.bin"):
        refs.commit(clash, "main", head)
    assert refs.branches("ds")["main"] == second
    assert {"get_commit", "put_commit", "view", "make_commit", "new_reach", "require_stored"} <= host.asked


def test_the_repository_delegates_to_its_refs(repo):
    head = repo.branches("ds")["main"]
    repo.create_branch("ds", "dev", head)
    assert repo.ref_store.branches("ds") == {"main": head, "dev": head}
    assert repo.delete_branch("ds", "dev") == head
    report = repo.ref_store.delete_repo("ds")
    assert report["refs"] == 1 and not report["dry_run"]
    assert repo.repos() == [] and not repo.has_repo("ds")

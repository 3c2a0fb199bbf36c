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

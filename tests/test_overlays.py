"""Overlays (storage/overlay.py): the read cache and the local seed wrap a backend and delegate by
default; chunks they hold are located at a `Held` place, never at a fake pack name."""
import pytest

from cdcstore import Store
from cdcstore.engine.pull import LocalSeed
from cdcstore.storage.backend import Backend
from cdcstore.storage.cache import CachedBackend, ChunkCache
from cdcstore.core import ids
from cdcstore.storage.overlay import Held, Overlay
from cdcstore.storage.repository import LocalStore
from conftest import golden_input


def _pushed(tmp_path, data: bytes) -> tuple[LocalStore, str, str]:
    """A directory store holding `data` as r/f.bin: (store, commit id, path of the file)."""
    LocalStore.init(str(tmp_path / "store"))
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    with Store(str(tmp_path / "store")) as s:
        cid = s.push([str(src)], "cdc://r/").commit
    return LocalStore(str(tmp_path / "store")), cid, str(src)


class Counting(Overlay):
    """An overlay that changes one call (`branches`) and counts what reaches the inner one."""

    def __init__(self, inner):
        super().__init__(Recorder(inner))

    def branches(self, repo):
        return {"mine": "0" * 64}


class Recorder:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.inner, name)


def test_an_overlay_passes_every_call_through_unless_it_overrides_it(tmp_path):
    store, cid, _ = _pushed(tmp_path, b"hello overlays")
    o = Counting(store)
    assert o.resolve_ref("r", "main") == (cid, "branch")
    assert o.get_commit("r", cid).id == cid
    assert o.repos() == ["r"] and o.has_repo("r")
    assert o.branches("r") == {"mine": "0" * 64}  # the one call it writes out
    assert "branches" not in o.inner.calls
    assert {"resolve_ref", "get_commit", "repos", "has_repo"} <= set(o.inner.calls)
    assert o.unwrap() is o.inner and o.uncached() is store  # the inner one's own `uncached`
    assert o.location == store.location and o.identity == store.identity
    assert o.capabilities == store.capabilities
    # composed calls run on the overlay, so its answers are the ones used
    assert [c for c, _ in o.log("r", "main")] == [cid]


# the calls `Overlay` passes through to `inner` (written out there, one method each)
DELEGATED = {n for n, f in vars(Overlay).items() if callable(f) and not n.startswith("_")} - {"unwrap"}


def test_every_abstract_call_of_a_backend_is_delegated():
    assert set(Backend.__abstractmethods__) <= DELEGATED
    assert not Overlay.__abstractmethods__


@pytest.mark.parametrize("cls, own", [
    (CachedBackend, {"locate", "read_chunks", "read_chunks_into", "read_chunk", "get_manifest",
                     "get_manifest_located", "get_tree", "put_trees", "get_commit", "resolve_ref", "commit", "create_tag",
                     "delete_tag", "create_branch", "delete_branch", "close", "cache_counters"}),
    (LocalSeed, {"locate", "read_chunks"}),
])
def test_overlays_write_out_only_what_they_change(cls, own):
    """No hand-written pass-throughs: the Backend calls an overlay defines are the ones it changes."""
    defined = {n for n in vars(cls) if n in DELEGATED}
    assert defined == own & set(DELEGATED)
    assert issubclass(cls, Overlay)


def test_cached_chunks_are_located_in_the_cache_not_in_a_pack(server, tmp_path):
    data = golden_input(400_000)
    (tmp_path / "f.bin").write_bytes(data)
    with Store(server.url, cache=False) as w:
        cid = w.push([str(tmp_path / "f.bin")], "cdc://r/").commit
    cache = ChunkCache(str(tmp_path / "c.sqlite"))
    with Store(server.url, cache=cache) as s:
        be = s.backend
        entry = be.view("r", be.get_commit("r", cid)).get("f.bin")
        m = be.get_manifest(entry.manifest, "r")
        before = be.locate(m.chunk_ids, "r")
        assert all(isinstance(p, str) and not isinstance(p, Held) for p, _ in before.values())  # the server's packs
        assert s.cat(f"cdc://r@{cid}/f.bin") == data
        cache.wait()
        after = be.locate(m.chunk_ids, "r")
        assert {p for p, _ in after.values()} == {Held.CACHE}
        # a str (typed as a location), but never a pack name: those are hex digits
        assert Held.CACHE != "cache" and not any(ids.is_hex_id(h.value) for h in Held)
        got = be.read_chunks(list(after.values()), "r")
        assert b"".join(got[c] for c in m.chunk_ids) == data
        assert be.unwrap() is be.uncached()  # the remote store itself


def test_a_local_seed_takes_the_old_copys_chunks_and_asks_for_the_rest(tmp_path):
    old = golden_input(600_000)
    new = bytearray(old)
    new[300_000:300_004] = b"v2v2"
    store, _, path = _pushed(tmp_path, bytes(new))
    (tmp_path / "old.bin").write_bytes(old)
    seed = LocalSeed(store, str(tmp_path / "old.bin"))
    commit = store.get_commit("r", store.resolve("r", "main"))
    m = store.get_manifest(store.view("r", commit).get("f.bin").manifest, "r")
    located = seed.locate(m.chunk_ids, "r")
    kinds = [p for p, _ in located.values()]
    assert kinds.count(Held.LOCAL_FILE) >= len(kinds) - 2  # all but the edited chunk(s)
    assert any(isinstance(p, str) for p in kinds)  # the edit comes from a pack of the store
    got = seed.read_chunks(list(located.values()), "r")
    assert b"".join(got[c] for c in m.chunk_ids) == bytes(new)
    assert seed.capabilities.local_reads and not seed.capabilities.reads_into
    assert seed.unwrap() is store

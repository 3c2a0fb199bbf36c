"""Metadata caching in one place (storage/memo.py): heads keyed by the store's identity, one
invalidation rule, and counters that say which layer answered."""
import fsspec
import pytest

from cdcstore import Store
from cdcstore.storage import memo
from cdcstore.testing import ServedStore


def _push(url: str, tmp_path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    with Store(url, cache=False) as s:
        return s.push([str(p)], "cdc://r/x").commit


def test_a_second_store_on_the_same_port_never_reads_the_first_ones_heads(tmp_path):
    """Store A served on a port, read through a cached fs and a Store with a chunk cache;
    then store B on the same port: both read B's head at once (within every TTL), and the
    fsspec instance (cached by URL) is the same object throughout."""
    cache = str(tmp_path / "cache.sqlite")
    a = ServedStore(tmp_path, name="a").start()
    try:
        _push(a.url, tmp_path, "one", b"store A")
        fs = fsspec.filesystem("cdc", store=a.url, cache=cache)
        assert fs.cat("cdc://r/x") == b"store A"
        with Store(a.url, cache=cache) as s:
            assert s.cat("cdc://r/x") == b"store A"
    finally:
        a.stop()
    b = ServedStore(tmp_path, name="b", port=a.port).start()
    try:
        head_b = _push(b.url, tmp_path, "two", b"store B, another one")
        again = fsspec.filesystem("cdc", store=b.url, cache=cache)
        assert again is fs  # fsspec's instance cache: no workaround clears it
        assert again.cat("cdc://r/x") == b"store B, another one"
        with Store(b.url, cache=cache) as s:  # the machine's heads table: keyed by store, not URL
            assert s.resolve("cdc://r/")[0] == head_b
            assert s.cat("cdc://r/x") == b"store B, another one"
    finally:
        b.stop()


def test_the_server_names_its_store_on_every_answer(tmp_path):
    """Each answer carries the store's id; a store made before ids (no `store-id` object) gets
    one, and it is stable across restarts."""
    import urllib.request

    a = ServedStore(tmp_path, name="a").start()
    try:
        with urllib.request.urlopen(a.url + "/v1/health") as r:
            first = r.headers["X-Cdc-Store"]
    finally:
        a.stop()
    a2 = ServedStore(tmp_path, name="a").start()  # store a again, as it is
    try:
        with urllib.request.urlopen(a2.url + "/v1/health") as r:
            assert r.headers["X-Cdc-Store"] == first
    finally:
        a2.stop()
    b = ServedStore(tmp_path, name="b").start()
    try:
        with urllib.request.urlopen(b.url + "/v1/health") as r:
            assert r.headers["X-Cdc-Store"] not in (None, "", first)
    finally:
        b.stop()


def test_a_write_through_this_process_invalidates_heads_at_once(server, tmp_path):
    """One rule: a commit through this process is seen by its next resolve (fs and Store, any
    TTL); the counters say which layer answered."""
    _push(server.url, tmp_path, "one", b"v1")
    fs = fsspec.filesystem("cdc", store=server.url, cache=False, head_ttl=3600)
    assert fs.cat("cdc://r/x") == b"v1"
    before = memo.counters()
    assert fs.cat("cdc://r/x") == b"v1"
    after = memo.counters()
    assert after["heads_memory"] > before["heads_memory"]  # served from this process's heads
    assert after["heads_server"] == before["heads_server"]
    _push(server.url, tmp_path, "two", b"v2")  # another Store of this process writes
    assert fs.cat("cdc://r/x") == b"v2"
    assert memo.counters()["heads_server"] > after["heads_server"]


def test_immutable_objects_are_kept_once_per_process(server, tmp_path):
    """A commit read by one Store (no chunk cache) is answered from memory for another Store of
    the same server and token: the counters show a memory hit, no request."""
    cid = _push(server.url, tmp_path, "one", b"v1")
    with Store(server.url, cache=False) as s:
        s.get_commit("r", cid)
    with Store(server.url, cache=False) as s2:
        before, hits = s2.counters()["requests"], memo.counters()["objects_memory"]
        s2.get_commit("r", cid)
        assert s2.counters()["requests"] == before
        assert memo.counters()["objects_memory"] > hits


def test_heads_expire_after_their_ttl():
    h = memo.Heads()
    key = ("store#1", "scope", "r", "main")
    h.put(key, "a" * 64, "branch")
    assert h.get(key, ttl=60) == ("a" * 64, "branch")
    assert h.get(key, ttl=0) is None
    h.put(key, "b" * 64, "tag")
    assert h.get(key, ttl=0) == ("b" * 64, "tag")  # tags never move
    h.forget_branch("store#1", "r", "main")
    assert h.get(key, ttl=60) is None


def test_a_new_store_id_behind_a_url_drops_its_heads():
    h = memo.Heads()
    loc = "http://127.0.0.1:1"
    memo.saw_store(loc, "1" * 32)
    key = (memo.identity(loc), "s", "r", "main")
    assert key[0] == f"{loc}#{'1' * 32}"
    h.put(key, "a" * 64, "branch")
    memo.saw_store(loc, "2" * 32)
    assert memo.identity(loc) == f"{loc}#{'2' * 32}"
    assert h.get((memo.identity(loc), "s", "r", "main"), ttl=60) is None
    with pytest.raises(ValueError, match="store id"):
        memo.saw_store(loc, "not an id\n")

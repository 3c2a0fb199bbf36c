"""Stateless server replicas: several `cdcstore serve` over one bucket, no state shared outside it.

Each replica keeps its own index cache (its own XDG_CACHE_HOME); whatever one replica stored,
landed or granted, the other finds in the bucket. A client given both URLs fails over.
"""
import concurrent.futures
import json
import os
import secrets
import threading
import time

import pytest

from cdcstore import ConflictError, Store
from cdcstore.core import ids
from cdcstore.core.commit import Commit, FileEntry
from cdcstore.core.manifest import Manifest
from cdcstore.core.pack import CODEC_RAW, PackWriter
from cdcstore.remote.client.store import RemoteStore
from conftest import S3_BUCKET, golden_input
from server_util import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRITE, OTHER = "tok-ds-" + "a" * 16, "tok-other-" + "b" * 16


@pytest.fixture
def replicas(s3_env, tmp_path, monkeypatch):
    """Two replicas over a fresh store prefix, each with its own index cache; yields (a, b, url)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "test-machine"))
    url = f"s3://{S3_BUCKET}/replicas-{secrets.token_hex(4)}"
    Store.init(url).close()
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({WRITE: {"scope": "write", "repos": ["ds"]},
                                  OTHER: {"scope": "write", "repos": ["other"]}}))
    servers = []
    for name in "ab":
        env = {**os.environ, **s3_env, "PYTHONPATH": ROOT, "XDG_CACHE_HOME": str(tmp_path / f"replica-{name}")}
        servers.append(ServerProcess(url, "--tokens", str(tokens), env=env))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both start up at once (~1-2 s each)
        list(pool.map(ServerProcess.start, servers))
    try:
        yield servers[0], servers[1], url
    finally:
        for s in servers:
            s.stop()


def _files(folder, **named):
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in named.items():
        (folder / name).write_bytes(data)
    return str(folder)


def _client(url, token=WRITE, **kw):
    return Store(url, token=token, cache=False, **kw)


def test_scoped_token_reads_through_the_other_replica(replicas, tmp_path):
    a, b, url = replicas
    data = golden_input(1 << 20)
    with _client(a.url) as s:
        s.push([_files(tmp_path / "v1", **{"a.bin": data})], "cdc://ds/")
    with _client(b.url) as s:  # landed through a, read through b: b learns the grants from the bucket
        assert s.cat("cdc://ds/a.bin") == data
        again = s.push([_files(tmp_path / "v1b", **{"a.bin": data})], "cdc://ds/copy/")
        assert s.cat("cdc://ds/copy/a.bin") == data
    assert again.new_bytes == 0  # b saw a's packs once it recovered them at the first miss
    with _client(b.url, token=OTHER) as s:  # another tenant still sees nothing of ds
        with pytest.raises(Exception, match="no access|403"):
            s.cat("cdc://ds/a.bin")


def _upload_file(remote, data: bytes):
    """Upload `data` as one chunk in one pack plus its manifest (no commit); its FileEntry."""
    cid = ids.digest(data)
    tmp = remote.tmp_path()
    with open(tmp, "wb") as f:
        w = PackWriter(f)
        w.add(cid, CODEC_RAW, data, len(data))
        name = w.finish()
    remote.add_pack(tmp, name, w.entries)
    remote.flush()
    m = Manifest([cid], [len(data)], len(data), ids.weak_hasher().digest())
    return FileEntry(remote.put_manifests([m])[0], len(data))


def test_uploads_through_one_replica_commit_through_the_other(replicas, tmp_path):
    """A scoped token's uploads are granted through the bucket: a pack and a manifest sent to
    a, the commit that names them sent to b (what a failover in the middle of a push does)."""
    a, b, url = replicas
    data = golden_input(300_000)
    with _client(a.url) as sa, _client(b.url) as sb:
        head = sa.push([_files(tmp_path / "v0", **{"x.bin": b"0" * 1000})], "cdc://ds/").commit
        base = sb.backend.get_commit("ds", head)
        entry = _upload_file(sa.backend, data)  # a records the upload; b has never seen it
        new = Commit("ds", head, "via b", base.time + 5, {**base.files, "y.bin": entry})
        landed = sb.backend.commit(new, "main", head)  # format 1: stored as format 3 by the token's author
        assert sb.resolve_ref("ds", "main")[0] == landed
        assert sb.cat("cdc://ds/y.bin") == data
    with _client(b.url, token=OTHER) as so:  # another token cannot name those chunks
        bad = Commit("other", None, "steal", base.time + 6, {"y.bin": entry})
        with pytest.raises(Exception, match="neither uploaded nor may"):
            so.backend.commit(bad, "main", None)


def test_pushes_through_both_replicas_at_once(replicas, tmp_path):
    a, b, url = replicas
    srcs = {n: _files(tmp_path / n, **{"f.bin": golden_input(200_000 + i)}) for i, n in enumerate("ab")}
    acked, errors = [], []
    with _client(a.url) as s:  # the repo exists before the race
        s.push([_files(tmp_path / "v0", **{"shared.bin": b"0" * 100})], "cdc://ds/")

    def writer(name, server):
        with _client(server.url) as s:
            for i in range(4):
                try:
                    acked.append((name, i, s.push([srcs[name]], f"cdc://ds/{name}/{i}/").commit))
                except Exception as e:  # disjoint paths: nothing may fail
                    errors.append(e)
                try:  # overlapping paths: land, or conflict cleanly
                    d = _files(tmp_path / f"s{name}{i}", **{"shared.bin": f"{name}{i}".encode() * 50})
                    acked.append(("shared", f"{name}{i}", s.push([d], "cdc://ds/").commit))
                except ConflictError:
                    pass
                except Exception as e:
                    errors.append(e)

    threads = [threading.Thread(target=writer, args=(n, srv)) for n, srv in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len([x for x in acked if x[0] != "shared"]) == 8
    with Store(url) as direct:  # the bucket's store, from a third index cache
        names = {e["name"] for e in direct.ls("cdc://ds/", recursive=True)}
        assert {f"{n}/{i}/f.bin" for n in "ab" for i in range(4)} <= names
        history = {c["commit"] for c in direct.log("ds")}
        for _, _, cid in acked:  # every acknowledged commit is in the history (maybe rebased: a descendant)
            assert direct.backend.get_commit("ds", cid)
        assert len(history) >= 1 + 8
        assert direct.check()["problems"] == []
    with _client(b.url) as s:
        for n in "ab":
            assert s.cat(f"cdc://ds/{n}/3/f.bin") == golden_input(200_000 + "ab".index(n))


def test_a_stale_commit_through_the_other_replica_conflicts_cleanly(replicas, tmp_path):
    a, b, url = replicas
    with _client(a.url) as sa, _client(b.url) as sb:
        head = sa.push([_files(tmp_path / "v0", **{"x.bin": b"0" * 1000})], "cdc://ds/").commit
        v1 = sa.push([_files(tmp_path / "v1", **{"x.bin": b"1" * 1000})], "cdc://ds/").commit
        mine = sa.backend.get_commit("ds", v1)
        stale = Commit("ds", head, "a stale writer", mine.time + 1, dict(mine.files))
        with pytest.raises(ConflictError, match="same paths: x.bin"):
            sb.backend.commit(stale, "main", head)
        assert sb.resolve_ref("ds", "main")[0] == v1  # nothing moved


def test_a_commit_retried_on_the_other_replica_lands_once(replicas, tmp_path):
    """The answer to a commit is lost (the replica died after the branch moved): the client
    sends it again to the other replica, which finds it in the history."""
    a, b, url = replicas
    with _client(a.url) as sa, _client(b.url) as sb:
        sa.push([_files(tmp_path / "v0", **{"x.bin": b"0" * 1000})], "cdc://ds/")
        r = sa.push([_files(tmp_path / "v1", **{"y.bin": b"1" * 1000})], "cdc://ds/more/")
        c1 = sa.backend.get_commit("ds", r.commit)
        again = Commit("ds", r.commit, "retried", c1.time + 1, {**c1.files, "z.bin": c1.files["more/y.bin"]})
        first = sa.backend.commit(again, "main", r.commit)
        assert sb.backend.commit(again, "main", r.commit) == first  # the retry: same commit, once
        log = [c["commit"] for c in sb.log("ds")]
        assert log.count(first) == 1 and len(log) == 3


def test_a_replica_killed_mid_push_the_client_fails_over(replicas, tmp_path):
    a, b, url = replicas
    big = os.urandom(24 << 20)
    src = _files(tmp_path / "big", **{"f.bin": big, "g.bin": big[: 8 << 20][::-1]})
    with _client(a.url) as s:
        kept = s.push([_files(tmp_path / "v0", **{"keep.bin": golden_input(100_000)})], "cdc://ds/").commit
    done: dict = {}

    def push():
        try:
            with _client(f"{a.url},{b.url}") as s:
                done["commit"] = s.push([src], "cdc://ds/big/").commit
                done["base"] = s.backend.t.base
        except Exception as e:
            done["error"] = e

    t = threading.Thread(target=push)
    t.start()
    deadline = time.time() + 20
    while "chunks/query" not in a.log_text() and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    a.kill()  # SIGKILL, mid-push
    t.join(60)
    assert "error" not in done, done.get("error")
    assert done["base"] == b.url  # the client went on with the other replica
    with _client(b.url) as s:
        assert s.cat("cdc://ds/big/f.bin") == big
        assert s.cat(f"cdc://ds@{kept}/keep.bin") == golden_input(100_000)
        assert any(c["commit"] == done["commit"] for c in s.log("ds"))
    with Store(url) as direct:
        assert direct.check()["problems"] == []


def test_replica_urls_are_checked():
    with pytest.raises(Exception, match="several replicas"):
        RemoteStore("http://127.0.0.1:1,ftp://x")

"""Cryptographic chunk ids (issue 17): new data is named by BLAKE3-256, a server takes no
id it has not recomputed and no new 16-byte (xxh3) id, and a format-v1 store still reads."""
import io
import json
import os
import shutil

import pytest

from cdcstore import Store
from cdcstore.core import ids
from cdcstore.core.manifest import Manifest
from cdcstore.core.pack import CODEC_RAW, PackWriter, decode_chunk, read_verified
from cdcstore.storage.repository import LocalStore
from conftest import golden_input, raw_call as _call
from server_util import ServerProcess

TOKENS = {"tok-evil": {"scope": "write", "repos": ["evil"]}, "tok-prod": {"scope": "write", "repos": ["prod"]}}
V1_STORE = os.path.join(os.path.dirname(__file__), "data", "v1store")
ID32 = {"X-Cdc-Id-Bytes": "32"}




def _pack(chunks, version=2, ids_for=None):
    """A pack of raw chunks; `ids_for` gives each chunk the id of other bytes (a lie)."""
    buf = io.BytesIO()
    w = PackWriter(buf, version)
    digest = ids.digest if version == 2 else ids.legacy_digest
    for i, c in enumerate(chunks):
        w.add(digest(ids_for[i] if ids_for else c), CODEC_RAW, c, len(c))
    return w.finish(), buf.getvalue()


pytestmark = pytest.mark.served(tokens=TOKENS)  # the `server` of every test here


def test_a_token_cannot_plant_bytes_under_another_chunks_id(server, tmp_path):
    """evil uploads chunk A under the id of B (which prod will push later): refused, because the
    server recomputes BLAKE3 of every chunk; v1 (xxh3) packs, manifests and 16-byte presence or
    proof queries are refused for new data, so an xxh3 collision buys nothing either."""
    api = server.url + "/v1"
    a, b = b"evil bytes A " * 500, golden_input(200_000)
    name, body = _pack([a], ids_for=[b])  # entry id = blake3(B), bytes = A; named by its bytes' BLAKE3
    status, answer = _call(f"{api}/packs/{name}", "tok-evil", "PUT", body)
    assert status == 422 and b"does not match its id" in answer, answer
    # a format-v1 pack: by its xxh3 name, or renamed by the BLAKE3 of its bytes
    v1_name, v1_body = _pack([a], version=1, ids_for=[b])
    status, answer = _call(f"{api}/packs/{v1_name}", "tok-evil", "PUT", v1_body)
    assert status == 400 and b"xxh3" in answer and b"Upgrade the client" in answer, answer
    v1_body = _pack([a], version=1)[1]  # honest v1 ids, but named by its BLAKE3
    status, answer = _call(f"{api}/packs/{ids.hexdigest(v1_body)}", "tok-evil", "PUT", v1_body)
    assert status == 400 and b"format v1" in answer, answer
    # dedup and proofs with 16-byte ids: refused (no header means 16, as old clients sent)
    for headers in ({}, {"X-Cdc-Id-Bytes": "16"}):
        status, answer = _call(f"{api}/chunks/query", "tok-evil", "POST", ids.legacy_digest(b), headers)
        assert status == 400 and b"xxh3" in answer, answer
        status, answer = _call(f"{api}/chunks/prove", "tok-evil", "POST", bytes(16 + 32), headers)
        assert status == 400 and b"xxh3" in answer, answer
    status, answer = _call(f"{api}/chunks/query", "tok-evil", "POST", ids.digest(b), {"X-Cdc-Id-Bytes": "20"})
    assert status == 400 and b"X-Cdc-Id-Bytes" in answer
    assert _call(f"{api}/chunks/query", "tok-evil", "POST", ids.digest(b), ID32) == (200, b"\x00")
    # a v1 manifest (naming xxh3 ids) is refused too
    from cdcstore.core.wire import encode_blobs
    m1 = Manifest([ids.legacy_digest(b)], [len(b)], len(b), ids.legacy_digest(b), version=1)
    status, answer = _call(f"{api}/manifests", "tok-evil", "POST", encode_blobs([m1.encode()]))
    assert status == 400 and b"format-v1" in answer, answer
    assert LocalStore(server.store).totals()["chunks"] == 0  # nothing of evil's was stored

    # prod pushes B: stored (not deduplicated against anything), read back as B
    src = tmp_path / "prod"
    src.mkdir()
    (src / "b.bin").write_bytes(b)
    with Store(server.url, token="tok-prod", cache=False) as prod:
        r = prod.push([str(src)], "cdc://prod/")
        assert r.new_bytes == len(b)
        assert prod.cat("cdc://prod/b.bin") == b
    # every stored chunk's id is the BLAKE3-256 of its raw bytes; every name is 64 hex digits
    srv = LocalStore(server.store)
    for pack in srv.index.packs():
        assert ids.is_new_hex_id(pack)
        with open(srv.packs.pack_path(pack), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            assert ids.hexdigest(f.read()) == pack
            for e in read_verified(f, size):
                f.seek(e.offset)
                raw = decode_chunk(f.read(e.stored_len), e.codec, e.raw_len, e.chunk_id)
                assert e.chunk_id == ids.digest(raw) and e.check == ids.checksum(raw)
    head = srv.resolve("prod", "main")
    assert ids.is_new_hex_id(head) and ids.matches(srv.get_commit("prod", head).encode(), head)
    manifest = srv.get_commit("prod", head).files["b.bin"].manifest
    assert ids.is_new_hex_id(manifest) and srv.get_manifest(manifest).version == 2


def _v1_sources(root):
    (root / "sub").mkdir(parents=True)
    files = {"a.bin": golden_input(300_000), "sub/b.txt": b"hello v1 store\n" * 2000 + b"tail\n", "empty.txt": b""}
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    return files


def test_a_format_v1_store_reads_back_byte_for_byte_and_takes_new_pushes(tmp_path):
    """tests/data/v1store was written by the format-v1 code (xxh3-128 everywhere)."""
    root = tmp_path / "store"
    shutil.copytree(V1_STORE, root)
    files = _v1_sources(tmp_path / "src")
    with Store(str(root)) as s:
        log = s.log("ds")
        assert [c["message"] for c in log] == ["v1 second", "v1 first"]
        assert all(len(c["commit"]) == 32 for c in log)  # v1 names: 32 hex digits
        for rel, data in files.items():
            assert s.cat(f"cdc://ds/{rel}") == data
        assert s.cat("cdc://ds@old/sub/b.txt") == files["sub/b.txt"]
        assert s.check(read_data=True)["problems"] == []
        out = tmp_path / "pulled"
        s.pull("cdc://ds/", str(out))
        assert all((out / rel).read_bytes() == data for rel, data in files.items())
        # the first push after the upgrade stores its chunks again under BLAKE3 ids (no dedup
        # against v1 chunks), once; the next push deduplicates
        r = s.push([str(tmp_path / "src")], "cdc://ds2/")
        assert r.new_bytes == sum(map(len, files.values()))
        again = s.push([str(tmp_path / "src")], "cdc://ds3/")
        assert again.new_bytes == 0
        head = LocalStore(str(root)).resolve("ds2", "main")
        assert len(head) == 64
        assert s.cat("cdc://ds2/a.bin") == files["a.bin"] and s.cat("cdc://ds/a.bin") == files["a.bin"]
        assert s.check(read_data=True)["problems"] == []
    repo = LocalStore(str(root))
    assert {len(p) for p in repo.index.packs()} == {32, 64}


def test_a_v1_store_served_reads_through_the_client(tmp_path):
    """An upgraded server serves format-v1 data (16-byte locate) to a new client."""
    root = tmp_path / "store"
    shutil.copytree(V1_STORE, root)
    files = _v1_sources(tmp_path / "src")
    srv = ServerProcess(str(root)).start()
    try:
        with Store(srv.url, cache=False) as s:
            for rel, data in files.items():
                assert s.cat(f"cdc://ds/{rel}") == data
            r = s.push([str(tmp_path / "src")], "cdc://new/")  # new data: BLAKE3 ids over the wire
            assert r.new_bytes == sum(map(len, files.values()))
            assert s.cat("cdc://new/a.bin") == files["a.bin"]
    finally:
        srv.stop()


def test_local_reads_check_pack_checksums_not_blake3(store, tmp_path, monkeypatch):
    """A store's reads of its own v2 packs check each chunk's xxh3-64 checksum (the index keeps
    it): no BLAKE3 on the local read path, and damage is still caught."""
    data = os.urandom(3_000_000)  # incompressible: raw chunks, read straight into the result
    (tmp_path / "f.bin").write_bytes(data)
    store.push([str(tmp_path / "f.bin")], "cdc://r/f.bin")
    repo = LocalStore(store.location)
    rows = repo.index.rows()
    assert rows and all(e.check is not None for _, e in rows.values())
    with Store(store.location) as s:
        hashed = []
        real = ids.digest
        with monkeypatch.context() as m:
            m.setattr(ids, "digest", lambda b: hashed.append(len(b)) or real(b))
            assert s.cat("cdc://r/f.bin") == data
        assert sum(hashed) < 10_000  # the commit and the manifest only: no chunk was BLAKE3-hashed
    pack, e = next(iter(rows.values()))
    with open(repo.packs.pack_path(pack), "r+b") as f:
        f.seek(e.offset + 10)
        b = f.read(1)
        f.seek(e.offset + 10)
        f.write(bytes([b[0] ^ 1]))
    from cdcstore import CorruptionError
    with Store(store.location) as s, pytest.raises(CorruptionError, match="checksum differs"):
        s.cat("cdc://r/f.bin")


def test_check_finds_an_index_checksum_that_differs_from_the_pack(store, tmp_path):
    """Local reads trust the index's copy of each checksum: `check` compares it with the pack's."""
    import sqlite3
    (tmp_path / "f.bin").write_bytes(os.urandom(500_000))
    store.push([str(tmp_path / "f.bin")], "cdc://r/f.bin")
    assert store.check()["problems"] == []
    conn = sqlite3.connect(os.path.join(store.location, "index.sqlite"))
    with conn:
        conn.execute("UPDATE chunks SET xsum = xsum + 1 WHERE id = (SELECT id FROM chunks LIMIT 1)")
    conn.close()
    problems = store.check()["problems"]
    assert any("do not match its footer" in p for p in problems)  # the row is dropped
    store.rebuild_index()
    assert store.check(read_data=True)["problems"] == []
    assert store.cat("cdc://r/f.bin") == (tmp_path / "f.bin").read_bytes()


def test_gc_repacks_a_v1_pack_as_v1(tmp_path):
    """A repack of a format-v1 pack keeps its chunks' 16-byte ids, so it writes a v1 pack."""
    from cdcstore.core.pack import LEGACY_PACK_VERSION, pack_version
    root = tmp_path / "store"
    shutil.copytree(V1_STORE, root)
    files = _v1_sources(tmp_path / "src")
    with Store(str(root)) as s:
        s.delete_tag("ds", "old")
        s.forget("ds", keep_last=1)
        r = s.gc(grace=0, repack_dead=0.0)
        assert r["repack_packs"] >= 1, r
        for rel, data in files.items():
            assert s.cat(f"cdc://ds/{rel}") == data
        assert s.check(read_data=True)["problems"] == []
    repo = LocalStore(str(root))
    packs = repo.index.packs()
    assert packs and all(len(p) == 32 for p in packs)
    for p in packs:
        with open(repo.packs.pack_path(p), "rb") as f:
            assert pack_version(f) == LEGACY_PACK_VERSION
            f.seek(0)
            assert ids.matches(f.read(), p)

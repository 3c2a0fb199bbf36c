"""Opening a file through a server gets its manifest and its chunks' locations in one request
(protocol 1.2, `GET manifests/{name}?locations=1`): one round trip fewer per cold file; a
server before 1.2 answers the manifest alone; the answer reveals nothing `locate` would not."""
import http.client
import json

import pytest

from cdcstore import CorruptionError, Store
from cdcstore.core.chunker import ChunkParams
from cdcstore.engine.ingest import IngestOptions
from cdcstore.core import wire
from cdcstore.remote.client.store import RemoteStore
from cdcstore.storage import memo
from cdcstore.storage.cache import CachedBackend
from cdcstore.storage.repository import LocalStore
from conftest import golden_input
from server_util import ServerProcess

DATA = golden_input(3_000_000) + b"z" * 200_000


def _push(url: str, tmp_path, addr: str = "cdc://d/f.bin", token=None) -> str:
    (tmp_path / "f.bin").write_bytes(DATA)
    with Store(url, token=token, cache=False) as s:
        r = s.push([str(tmp_path / "f.bin")], addr, options=IngestOptions(params=ChunkParams(16384, 65536, 262144)))
    return r.commit


@pytest.mark.parametrize("cache", [False, True])
def test_a_cold_read_needs_one_request_fewer(server, tmp_path, monkeypatch, cache):
    addr = f"cdc://d@{_push(server.url, tmp_path)}/f.bin"
    runs = iter(range(10))

    def cold_read() -> int:
        memo.clear()  # a cold process: no commit or manifest kept from the read before
        with Store(server.url, cache=str(tmp_path / f"c{next(runs)}.sqlite") if cache else False) as s:
            before = s.counters()["requests"]
            assert s.cat(addr) == DATA
            with s.open(addr) as f:  # the manifest is known now: no request for it, locations as before
                assert f.pread(1_000_000, 2_000_000) == DATA[1_000_000:3_000_000]
            return s.counters()["requests"] - before

    located = cold_read()
    monkeypatch.delattr(RemoteStore, "get_manifest_located")  # a client before 1.2: manifest, then locate
    monkeypatch.delattr(CachedBackend, "get_manifest_located")
    assert located == cold_read() - 1


def test_an_answer_without_locations_is_a_plain_manifest():
    """A server before 1.2 ignores the query and sends the manifest: no locations, no error."""
    plain = b"CDCMANI\x00" + bytes(40)
    assert wire.decode_located(plain) == (plain, {})


@pytest.mark.parametrize("body", [wire.LOCATED_MAGIC + b"\x01",  # cut in the length
                                  wire.LOCATED_MAGIC + (100).to_bytes(4, "little") + b"x" * 99,  # cut manifest
                                  wire.LOCATED_MAGIC + (1).to_bytes(4, "little") + b"x" + b"y" * 55])  # cut location
def test_a_damaged_answer_is_a_corruption_error(body):
    with pytest.raises(CorruptionError, match="truncated|wrong length"):
        wire.decode_located(body)


def test_locations_come_only_with_a_manifest_the_token_may_read(tmp_path):
    tokens = {"w-all": {"scope": "write", "repos": ["*"]}, "r-a": {"scope": "read", "repos": ["a"]}}
    (tmp_path / "tokens.json").write_text(json.dumps(tokens))
    LocalStore.init(str(tmp_path / "srv"))
    srv = ServerProcess(str(tmp_path / "srv"), "--tokens", str(tmp_path / "tokens.json")).start()
    try:
        _push(srv.url, tmp_path, "cdc://b/f.bin", token="w-all")
        (tmp_path / "a.bin").write_bytes(b"repo a's own file")
        with Store(srv.url, token="w-all", cache=False) as s:
            s.push([str(tmp_path / "a.bin")], "cdc://a/a.bin")
            name = s.backend.get_commit("b", s.backend.resolve("b", "main")).files["f.bin"].manifest

        def get(path):
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            c.request("GET", path, headers={"Authorization": "Bearer r-a"})
            r = c.getresponse()
            return r.status, r.read()

        assert get(f"/v1/repos/b/manifests/{name}?locations=1")[0] == 403  # not its repo
        status, body = get(f"/v1/repos/a/manifests/{name}?locations=1")  # its repo, b's manifest
        assert status == 404 and wire.LOCATED_MAGIC not in body
        with Store(srv.url, token="r-a", cache=False) as s:
            assert s.cat("cdc://a/a.bin") == b"repo a's own file"
    finally:
        srv.stop()


def test_a_large_file_comes_with_the_locations_where_reads_start(server, tmp_path):
    """Over 2 x 512 chunks: the answer locates the first and last 512 (a scan, a Parquet footer);
    a read elsewhere locates its own block, as before; bytes are exact everywhere."""
    data = golden_input(7_000_000)
    (tmp_path / "big.bin").write_bytes(data)
    with Store(server.url, cache=False) as s:
        commit = s.push([str(tmp_path / "big.bin")], "cdc://d/big.bin",
                        options=IngestOptions(params=ChunkParams(1024, 4096, 16384))).commit
    addr = f"cdc://d@{commit}/big.bin"
    with Store(server.url, cache=False) as s:
        m, found = s.backend.get_manifest_located(s.backend.get_commit("d", commit).files["big.bin"].manifest, "d")
        assert len(m.chunk_ids) > 2 * wire.LOCATED_ENDS
        assert set(found) == set(m.chunk_ids[:wire.LOCATED_ENDS] + m.chunk_ids[-wire.LOCATED_ENDS:])
    memo.clear()  # a fresh process: the manifest is not kept from the Store before
    with Store(server.url, cache=False) as s:
        with s.open(addr) as f:
            n0 = s.counters()["requests"]
            assert f.pread(len(data) - 8, 8) == data[-8:] and f.pread(0, 100) == data[:100]
            n1 = s.counters()["requests"]
            assert n1 - n0 == 2  # two ranges, no locate
            mid = len(data) // 2
            assert f.pread(mid, 5000) == data[mid:mid + 5000]
            assert s.counters()["requests"] - n1 >= 2  # a locate of its block, then its range
            assert f.read() == data

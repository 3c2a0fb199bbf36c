"""One read core (issue 30): every face reads a file's bytes through `storage.reader.FileReader`.

Pinned here: the gateway and the stream hold no locate, relocate, chunk read or manifest cache of
their own; a file is planned in segments, so a read costs a segment's plan whatever the file's
size; a decoded manifest costs about its own bytes; and a server whose gateway is asked for one
byte of each of three files with 1.8 M-entry manifests (the largest a store takes) stays small.
"""
import ast
import os
import pickle
import random
import tracemalloc

import boto3
import numpy as np
import pytest
from botocore import UNSIGNED
from botocore.config import Config

import cdcstore
from cdcstore import Store
from cdcstore.core.address import parse
from cdcstore.core.commit import FileEntry
from cdcstore.core.manifest import ChunkIds, Manifest
from cdcstore.storage import fileplan
from cdcstore.storage.repository import LocalStore
from cdcstore.testing import free_port
from server_util import ServerProcess

ROOT = os.path.dirname(cdcstore.__file__)
READ_CALLS = {"locate", "read_chunks", "read_chunks_into", "read_run_into", "read_stored", "read_chunk"}


def _calls_and_catches(path: str) -> tuple[set, set]:
    tree = ast.parse(open(path).read())
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and ast.unparse(n.func.value) != "order"}  # an epoch order's `locate` is of positions, not chunks
    caught = {ast.unparse(n.type) for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler) and n.type is not None}
    return calls, caught


@pytest.mark.parametrize("module", ["remote/gateway/reads.py", "streaming/sources.py", "streaming/dataset.py"])
def test_faces_read_through_the_core_only(module):
    calls, caught = _calls_and_catches(os.path.join(ROOT, module))
    assert not calls & READ_CALLS, f"{module} reads chunks itself: {sorted(calls & READ_CALLS)}"
    assert not any("PackMissingError" in c for c in caught), f"{module} relocates itself"
    if module == "remote/gateway/reads.py":
        src = open(os.path.join(ROOT, module)).read()
        assert "OrderedDict" not in src and "_manifests" not in src  # no manifest cache of its own
        assert "FileReader(" in src


def _store_with_file(tmp_path, size: int, seed: int = 5) -> tuple[str, bytes]:
    rng = np.random.default_rng(seed)
    data = rng.bytes(size // 2) + bytes(size - size // 2)  # half raw chunks, half compressed ones
    (tmp_path / "f.bin").write_bytes(data)
    LocalStore.init(str(tmp_path / "st"))
    with Store(str(tmp_path / "st")) as s:
        s.push([str(tmp_path / "f.bin")], "cdc://r/f.bin")
    return str(tmp_path / "st"), data


def test_a_file_planned_in_segments_reads_every_range_right(tmp_path, monkeypatch):
    monkeypatch.setattr(fileplan, "PLAN_CHUNKS", 7)  # segments of 7 chunks: many segment edges
    monkeypatch.setattr(fileplan, "PLAN_SEGMENTS_KEPT", 2)
    store, data = _store_with_file(tmp_path, 6 << 20)
    rnd = random.Random(1)
    with Store(store) as s:
        with s.open("cdc://r/f.bin") as f:
            assert len(f._m.chunk_ids) > 40
            assert f.read() == data  # runs across every segment edge
            for _ in range(200):
                lo = rnd.randrange(len(data))
                n = rnd.choice([1, 100, 70_000, 300_000, 2 << 20])
                assert f.pread(lo, n) == data[lo:lo + n]
            assert len(f._plan._segs) <= 2
            f.seek(0)
            got = b"".join(iter(lambda: f.read(65536), b""))  # the window path
            assert got == data


def test_a_decoded_manifest_costs_about_its_bytes():
    n = 500_000
    ids = [i.to_bytes(4, "little") * 8 for i in range(n)]
    m = Manifest(ids, [1000] * n, 1000 * n, bytes(16))
    raw = m.encode()
    del ids, m
    tracemalloc.start()
    d = Manifest.decode(raw)
    _ = d.ends
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert held < 1.5 * len(raw), f"a decoded manifest of {len(raw)} bytes holds {held}"
    assert isinstance(d.chunk_ids, ChunkIds) and d.encode() is raw
    assert d.chunk_ids[7] == (7).to_bytes(4, "little") * 8 and d.chunk_ids[-1] == (n - 1).to_bytes(4, "little") * 8
    assert d.chunk_ids[3:6] == [i.to_bytes(4, "little") * 8 for i in range(3, 6)]
    assert d.lengths[5] == 1000 and d.ends[-1] == 1000 * n
    again = pickle.loads(pickle.dumps(d))
    assert again == d and list(again.chunk_ids[:3]) == list(d.chunk_ids[:3])
    assert d == Manifest(list(d.chunk_ids), list(d.lengths), d.size, d.file_hash)  # equals a list-built one


def _rss_mib(pid: int) -> dict:
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
    return {k: int(fields[k].split()[0]) // 1024 for k in ("VmRSS", "VmHWM")}


def test_huge_manifests_through_the_gateway_keep_the_server_small(tmp_path):
    """A writer commits three files that each repeat one 4 KiB chunk 1.8 M times (manifests of 64 MB, the largest a store takes). One-byte range reads of each,
    twice: the server decoded 64 of them whole into lists and kept them (peak 1,208 MiB here
    before); now it plans a segment and a decoded manifest costs its bytes."""
    payload = np.random.default_rng(1).bytes(4096)
    (tmp_path / "one.bin").write_bytes(payload)
    LocalStore.init(str(tmp_path / "st"))
    n = 1_800_000
    with Store(str(tmp_path / "st")) as s:
        s.push([str(tmp_path / "one.bin")], "cdc://bomb/one.bin")
        one = s.backend.get_manifest(s.history.at(parse("cdc://bomb/one.bin"))[1].get("one.bin").manifest)
        entries = {}
        for k in range(3):
            m = Manifest(list(one.chunk_ids) * (n + k), list(one.lengths) * (n + k), 4096 * (n + k), one.file_hash)
            entries[f"big{k}.bin"] = FileEntry(s.backend.put_manifests([m])[0], m.size)
            del m
        s.commit_entries("cdc://bomb/", entries)
    port = free_port()
    with ServerProcess(str(tmp_path / "st"), "--s3-port", str(port)).start() as srv:
        anon = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                            config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}))
        for _ in range(2):
            for k in range(3):
                got = anon.get_object(Bucket="bomb", Key=f"main/big{k}.bin", Range="bytes=5000-5009")["Body"].read()
                assert got == payload[5000 - 4096:5010 - 4096]
        tail = anon.get_object(Bucket="bomb", Key="main/big2.bin", Range="bytes=-3")["Body"].read()
        assert tail == payload[-3:]
        rss = _rss_mib(srv.proc.pid)
    assert rss["VmHWM"] < 400, f"server peak RSS {rss['VmHWM']} MiB after three huge manifests"


def _peak_of(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("where", ["local", "server"])
def test_readinto_lands_raw_chunks_in_the_callers_buffer(tmp_path, where):
    """One copy: an 8 MiB readinto of raw chunks allocates no 8 MiB of its own (before: a new
    buffer, then a copy into the caller's); small sequential readintos copy from the reader's
    window, which is kept, not allocated per fill."""
    data = np.random.default_rng(9).bytes(24 << 20)  # incompressible: raw chunks
    (tmp_path / "f.bin").write_bytes(data)
    LocalStore.init(str(tmp_path / "st"))
    with Store(str(tmp_path / "st")) as s:
        s.push([str(tmp_path / "f.bin")], "cdc://r/f.bin")
    srv = ServerProcess(str(tmp_path / "st")).start() if where == "server" else None
    try:
        with Store(srv.url if srv else str(tmp_path / "st"), cache=False) as s, s.open("cdc://r/f.bin") as f:
            buf = bytearray(8 << 20)
            f.seek(1 << 20)
            assert f.readinto(buf) == len(buf) and buf == data[1 << 20:9 << 20]  # warm: located, connected
            f.seek(9 << 20 | 12345)
            peak = _peak_of(lambda: f.readinto(buf))
            assert buf == data[(9 << 20) + 12345:(17 << 20) + 12345]
            assert peak < (1 << 20), f"an 8 MiB readinto allocated {peak} bytes"
            small = bytearray(65536)
            f.seek(3)
            got = bytearray()
            for _ in range(200):  # 12.5 MiB in 64 KiB pieces, several window fills
                n = f.readinto(small)
                got += small[:n]
            assert got == data[3:3 + 200 * 65536]
            if where == "local":
                peak = _peak_of(lambda: [f.readinto(small) for _ in range(100)])
                assert peak < (1 << 20), f"64 KiB readintos allocated {peak} bytes (a window per fill?)"
    finally:
        if srv:
            srv.stop()
    with Store(str(tmp_path / "st")) as s, s.open("cdc://r/f.bin") as f:  # the end of the file
        f.seek(len(data) - 5000)
        tail = bytearray(10000)
        assert f.readinto(tail) == 5000 and tail[:5000] == data[-5000:]
        assert f.readinto(tail) == 0

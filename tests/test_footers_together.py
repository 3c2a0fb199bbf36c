"""A revision's Parquet footers fetched together (issue 45, item 3): `POST manifests/located`
(protocol 2.3) answers many files' manifests, their chunks' locations and the chunks of their
last bytes in one request, so constructing a `StreamingDataset` over a server costs the same few
requests for 2 files as for 12, cold. Every byte of that answer is checked against its manifest,
itself checked against its name: a server that sends wrong footer bytes is caught."""
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web

from cdcstore import Store
from cdcstore.core import wire
from cdcstore.core.errors import CorruptionError
from cdcstore.storage import memo
from cdcstore.stream import StreamingDataset
from conftest import raw_call
from test_lying_server import LyingProxy

FILES = {"a": 2, "b": 12}
ROWS = 20_000  # per file, in two row groups: a file of about 200 KB, its footer a chunk of its own


@pytest.fixture(scope="module")
def pushed(module_server, tmp_path_factory):
    """Folders a/ (2 files) and b/ (12 files) of repo ds, and another repo's file: (url, local folders)."""
    root = tmp_path_factory.mktemp("footers")
    folders = {}
    for name, n in FILES.items():
        folders[name] = root / name
        folders[name].mkdir()
        for i in range(n):
            rng = np.random.default_rng(100 * len(name) + i)
            t = pa.table({"id": np.arange(i * ROWS, (i + 1) * ROWS), "x": rng.random(ROWS),
                          "s": [f"s{k % 97}" for k in range(ROWS)]})
            pq.write_table(t, folders[name] / f"part-{i:03d}.parquet", row_group_size=ROWS // 2)
    (root / "other.bin").write_bytes(b"another repo's file " * 5000)
    with Store(module_server.url, cache=False) as s:
        for name in FILES:
            s.push([str(folders[name])], f"cdc://ds/{name}/")
        s.push([str(root / "other.bin")], "cdc://other/other.bin")
    return module_server.url, folders


def cold(url: str, source: str, cache, monkeypatch) -> StreamingDataset:
    """A dataset built as a new machine builds it: nothing kept in this process, a new chunk cache."""
    memo.clear()
    monkeypatch.setenv("CDCSTORE_CACHE", str(cache))
    return StreamingDataset(source, batch_size=4096, format="arrow", store=url)


def test_construction_costs_a_few_requests_whatever_the_number_of_files(pushed, tmp_path, monkeypatch):
    url, folders = pushed
    requests = {}
    for name in FILES:
        ds = cold(url, f"cdc://ds/{name}/", tmp_path / f"machine-{name}.sqlite", monkeypatch)
        requests[name] = ds.store.counters()["requests"]
        local = [pq.read_metadata(p) for p in sorted(folders[name].iterdir())]
        assert [md.num_rows for md in ds.source.footers] == [ROWS] * FILES[name]
        assert all(ours.equals(theirs) for ours, theirs in zip(ds.source.footers, local))
        rows = pa.concat_tables(pa.Table.from_batches([b]) for b in ds)
        assert rows.column("id").to_pylist() == list(range(FILES[name] * ROWS))
    # resolve, commit, root tree, folder tree, and the manifests with their footers: one request
    assert requests["a"] == requests["b"] <= 5, requests
    again = cold(url, "cdc://ds/b/", tmp_path / "machine-b.sqlite", monkeypatch)  # a new process, same machine
    # the branch's head, and the files' ends located at once (the stream never read their first chunk,
    # the 4-byte magic, which a reader of the end locates with the rest of its block): not one a file
    assert again.store.counters()["requests"] <= 2
    assert all(x.equals(y) for x, y in zip(again.source.footers, ds.source.footers))
    half = cold(url, "cdc://ds/b/", tmp_path / "footers-only.sqlite", monkeypatch)
    half.store.close()  # a machine that holds the manifests and footers only (it never streamed)
    known = cold(url, "cdc://ds/b/", tmp_path / "footers-only.sqlite", monkeypatch)
    assert known.store.counters()["requests"] <= 2  # the head, and the files' ends located at once


def _forward(proxy, request, body, change):
    """The upstream's answer to a `manifests/located` request, passed through `change(entries)`."""
    async def answer():
        async with proxy.session.post(proxy.upstream + request.path_qs, data=body,
                                      headers={"Content-Type": "application/json"}) as r:
            data = await r.read()
        asked = len(json.loads(body)["manifests"])
        entries = [(bytes(a), bytes(b)) for a, b in wire.decode_located_many(data, asked)]
        return web.Response(status=200, body=wire.encode_located_many(change(entries)))
    return answer() if request.path.endswith("/manifests/located") else None


def _flip_tail(entries):
    located, tail = entries[-1]
    return entries[:-1] + [(located, tail[:-20] + bytes([tail[-20] ^ 1]) + tail[-19:])]


def _short_tail(entries):
    located, tail = entries[0]
    return [(located, tail[1:])] + entries[1:]


def _other_manifest(entries):
    return [entries[1], *entries[1:]]


@pytest.mark.parametrize("change, says", [(_flip_tail, "does not match its id"),
                                          (_short_tail, "as the end of manifest"),
                                          (_other_manifest, "does not match its name")])
def test_a_server_that_sends_wrong_footer_bytes_is_caught(pushed, tmp_path, monkeypatch, change, says):
    url, _ = pushed
    with LyingProxy(url, lambda p, r, b: _forward(p, r, b, change)) as proxy:
        with pytest.raises(CorruptionError, match=says):
            cold(proxy.url, "cdc://ds/b/", tmp_path / "cache.sqlite", monkeypatch)


def test_a_server_before_the_route_is_read_one_file_at_a_time(pushed, tmp_path, monkeypatch):
    url, folders = pushed

    def older(proxy, request, body):  # the router's own 404, as a server before protocol 2.3 answers
        return web.Response(status=404, text="Not Found") if request.path.endswith("/manifests/located") else None
    with LyingProxy(url, older) as proxy:
        ds = cold(proxy.url, "cdc://ds/b/", tmp_path / "cache.sqlite", monkeypatch)
        assert ds.store.counters()["requests"] > FILES["b"]  # a manifest each, and its footer
        local = [pq.read_metadata(p) for p in sorted(folders["b"].iterdir())]
        assert all(ours.equals(theirs) for ours, theirs in zip(ds.source.footers, local))


def test_an_error_worth_a_retry_goes_through_the_full_client(pushed, tmp_path, monkeypatch):
    url, folders = pushed
    busy = []

    def once_busy(proxy, request, body):  # the first ask of the footers: 503, as a server in a gc answers
        if request.path.endswith("/manifests/located") and not busy:
            busy.append(request.path)
            return web.json_response({"error": "busy", "status": 503, "code": "busy"}, status=503,
                                     headers={"Retry-After": "0"})
        return None
    with LyingProxy(url, once_busy) as proxy:
        ds = cold(proxy.url, "cdc://ds/a/", tmp_path / "cache.sqlite", monkeypatch)
    assert busy and [md.num_rows for md in ds.source.footers] == [ROWS] * FILES["a"]


CHILD = """
import sys
from cdcstore.stream import StreamingDataset
ds = StreamingDataset(sys.argv[1], batch_size=4096, format="arrow", store=sys.argv[2])
rows = sum(b.num_rows for b in ds)
print(rows, ds.store.counters()["requests"], "aiohttp" in sys.modules)
"""


def test_a_stream_over_http_never_imports_aiohttp(pushed, tmp_path):
    url, _ = pushed
    env = dict(os.environ, CDCSTORE_CACHE=str(tmp_path / "cache.sqlite"))
    out = subprocess.run([sys.executable, "-c", CHILD, "cdc://ds/a/", url], env=env, capture_output=True,
                         text=True, timeout=60)
    rows, requests, imported = out.stdout.split()
    assert (int(rows), imported) == (FILES["a"] * ROWS, "False"), out.stderr[-2000:]
    assert int(requests) > 5  # it read: every request went through the client's own path


def test_the_route_answers_only_what_the_repo_reaches(pushed):
    url, _ = pushed
    with Store(url, cache=False) as s:
        _, commit = s.resolve("cdc://other@main/other.bin")
        theirs = s.view("other", commit).get("other.bin").manifest
        _, commit = s.resolve("cdc://ds@main/a/")
        ours = s.view("ds", commit).get("a/part-000.parquet").manifest
    call = f"{url}/v1/repos/ds/manifests/located"
    status, body = raw_call(call, None, "POST", json.dumps({"manifests": [theirs, ours], "tail": 8}).encode())
    assert status == 200
    (hidden, nothing), (located, tail) = wire.decode_located_many(body, 2)
    assert (bytes(hidden), bytes(nothing)) == (b"", b"")  # another repo's manifest: as if absent
    assert bytes(located).startswith(wire.LOCATED_MAGIC) and bytes(tail).endswith(b"PAR1")
    for bad in ({"manifests": []}, {"manifests": [ours], "tail": wire.MAX_TAIL + 1},
                {"manifests": ["x" * 64]}, {"manifests": [ours] * (wire.LOCATED_PER_GET + 1)}):
        assert raw_call(call, None, "POST", json.dumps(bad).encode())[0] == 400


# the answer's format (version 1), pinned: two entries, the second not served
GOLDEN = ("4344434d4c4f43530100000002000000"  # magic CDCMLOCS, version 1, 2 entries
          "03000000" "616263" "02000000" "7879"  # located body "abc", tail "xy"
          "00000000" "00000000")  # not served: nothing, no tail


def test_golden_located_many():
    body = wire.encode_located_many([(b"abc", b"xy"), (b"", b"")])
    assert body.hex() == GOLDEN
    assert [(bytes(a), bytes(b)) for a, b in wire.decode_located_many(bytes.fromhex(GOLDEN), 2)] == \
        [(b"abc", b"xy"), (b"", b"")]
    for broken, says in [(body[:-1], "truncated"), (body + b"\0", "past its last entry"),
                         (b"CDCMLOCX" + body[8:], "magic"), (body[:8] + b"\2" + body[9:], "format 2"),
                         (body[:12] + b"\0" + body[13:], "0 entries")]:
        with pytest.raises(CorruptionError, match=says):
            wire.decode_located_many(broken, 2)
    with pytest.raises(CorruptionError, match="2 entries for 1 asked"):
        wire.decode_located_many(body, 1)

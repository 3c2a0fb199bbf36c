"""Multipart uploads chunked as their parts arrive (engine/prechunk.py, remote/gateway/multipart.py;
docs/gateway.md "Multipart uploads"), against a real `cdcstore serve --s3-port` on loopback and boto3.

Whatever order parts come in, whatever is sent again, aborted or killed: what lands is the file the
parts make, stored exactly as a push stores it (the same manifest: the GET ETag), and nothing of an
upload that does not complete is visible. Rounds are made small (`prechunk_round_bytes`) so that a
few 5 MiB parts exercise what a 200 MB upload does."""
import glob
import os
import time

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.engine.ingest import IngestOptions, manifest_of
from cdcstore.engine.prechunk import Prechunk
from cdcstore.storage.uploads import source_of
from cdcstore.testing import ServedStore

MiB = 1 << 20
PART = 5 * MiB
LIMITS = ("--limit", f"prechunk_round_bytes={MiB}")


def _parquet(path, rows: int, seed: int) -> bytes:
    """Real-shaped Parquet as plain pyarrow writes it (snappy, dictionary strings, several row groups)."""
    rng = np.random.default_rng(seed)
    t = pa.table({"id": np.arange(rows, dtype=np.int64), "x": rng.random(rows), "n": rng.integers(0, 1 << 40, rows),
                  "carrier": pa.array([f"c{i % 17}" for i in range(rows)]),
                  "note": pa.array([f"row {i} {rng.integers(0, 1 << 30)}" for i in range(rows)])})
    pq.write_table(t, path, row_group_size=rows // 4)
    return open(path, "rb").read()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("mpa")
    return d / "f.parquet", _parquet(d / "f.parquet", 520_000, 3)


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    root = tmp_path_factory.mktemp("mpa-gw")
    with Store.init(str(root / "srv")) as s:
        s.commit_files("ds", "main", [], "create")
    srv = ServedStore(root, *LIMITS, gateway=True).start()
    yield srv
    srv.stop()


def _s3(url):
    return boto3.client("s3", endpoint_url=url, aws_access_key_id="any", aws_secret_access_key="any",
                        region_name="us-east-1")


def _send(s3, key, pieces, order):
    """Parts `pieces` (1-based numbers -> bytes) sent in `order`; the Complete's answer."""
    up = s3.create_multipart_upload(Bucket="ds", Key=key)["UploadId"]
    tags = {}
    for n in order:
        tags[n] = s3.upload_part(Bucket="ds", Key=key, UploadId=up, PartNumber=n, Body=pieces[n])["ETag"]
    return up, tags


def _complete(s3, key, up, tags):
    r = s3.complete_multipart_upload(Bucket="ds", Key=key, UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": tags[n]} for n in sorted(tags)]})
    return int(r["ResponseMetadata"]["HTTPHeaders"].get("x-cdc-chunked-ahead", -1))


def _pieces(blob: bytes) -> dict[int, bytes]:
    return {i + 1: blob[o:o + PART] for i, o in enumerate(range(0, len(blob), PART))}


def _pushed_tag(gw, s3, path, key):
    """The ETag (manifest id) of the same file pushed by cdcstore next to it; pushing stores nothing."""
    with Store(gw.store) as s:
        before = s.stats()["stored_bytes"]
        r = s.push([str(path)], f"cdc://ds/{key}", message="push")
        assert r.new_bytes == 0 and s.stats()["stored_bytes"] == before
    return s3.head_object(Bucket="ds", Key=f"main/{key}")["ETag"]


def _packed(gw) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(gw.store, "packs", "*", "*.pack")))


def _wait_packed(gw, at_least: int, timeout: float = 60) -> None:
    """Until the server's packs grew by `at_least` bytes: chunking ahead runs on a thread of low
    priority, which on a busy machine may lag the parts (Complete then does the rest itself)."""
    end = time.monotonic() + timeout
    while _packed(gw) < at_least and time.monotonic() < end:
        time.sleep(0.05)


def test_parts_out_of_order_are_chunked_ahead_and_land_as_a_push_stores_them(gw, data):
    path, blob = data
    pieces = _pieces(blob)
    assert len(pieces) >= 3
    s3 = _s3(gw.s3)
    before = _packed(gw)
    order = [2, 1] + list(range(3, len(pieces) + 1))  # part 2 waits for part 1, then both go at once
    up, tags = _send(s3, "main/a/f.parquet", pieces, order)
    _wait_packed(gw, before + len(blob) // 2)  # (snappy pages: about all of it stored raw)
    ahead = _complete(s3, "main/a/f.parquet", up, tags)
    assert s3.get_object(Bucket="ds", Key="main/a/f.parquet")["Body"].read() == blob
    assert s3.head_object(Bucket="ds", Key="main/a/f.parquet")["ETag"] == _pushed_tag(gw, s3, path, "a/g.parquet")
    # all but the last part was in order before Complete: most of the file was hashed ahead
    assert ahead >= 0.6 * len(blob), (ahead, len(blob))
    assert not [n for n in os.listdir(os.path.join(gw.store, "tmp")) if n.endswith(".tmp")]  # the growing file went


def test_a_part_sent_again_with_other_bytes_after_it_was_chunked_ahead(gw, data, tmp_path):
    """Part 2 is replaced after the parts were chunked ahead: what lands is the new bytes, never
    a chunk of the old ones (the growing file past part 1 is dropped)."""
    _, blob = data
    pieces = _pieces(blob)
    s3 = _s3(gw.s3)
    up, tags = _send(s3, "main/b/f.bin", pieces, sorted(pieces))
    new2 = bytes(reversed(pieces[2]))
    tags[2] = s3.upload_part(Bucket="ds", Key="main/b/f.bin", UploadId=up, PartNumber=2, Body=new2)["ETag"]
    ahead = _complete(s3, "main/b/f.bin", up, tags)
    want = pieces[1] + new2 + b"".join(pieces[n] for n in sorted(pieces) if n > 2)
    assert s3.get_object(Bucket="ds", Key="main/b/f.bin")["Body"].read() == want
    assert ahead <= len(pieces[1])
    (tmp_path / "want.bin").write_bytes(want)
    assert s3.head_object(Bucket="ds", Key="main/b/f.bin")["ETag"] == _pushed_tag(gw, s3, tmp_path / "want.bin",
                                                                                  "b/g.bin")


def test_a_subset_of_parts_and_an_abort(gw, data):
    """Complete may name fewer parts than were sent (here 1 and 3 of 3): chunks hashed over
    part 2 are not used. An aborted upload leaves no growing file and nothing visible."""
    _, blob = data
    pieces = _pieces(blob)
    s3 = _s3(gw.s3)
    up, tags = _send(s3, "main/c/f.bin", pieces, sorted(pieces))
    last = max(pieces)
    chosen = {1: tags[1], last: tags[last]}
    ahead = _complete(s3, "main/c/f.bin", up, chosen)
    assert s3.get_object(Bucket="ds", Key="main/c/f.bin")["Body"].read() == pieces[1] + pieces[last]
    assert ahead <= len(pieces[1])
    up, tags = _send(s3, "main/c/gone.bin", pieces, sorted(pieces))
    s3.abort_multipart_upload(Bucket="ds", Key="main/c/gone.bin", UploadId=up)
    names = [o["Key"] for o in s3.list_objects_v2(Bucket="ds", Prefix="main/c/")["Contents"]]
    assert names == ["main/c/f.bin"]
    assert not [n for n in os.listdir(os.path.join(gw.store, "tmp")) if n.endswith(".tmp")]


def test_a_server_killed_after_chunking_ahead_loses_nothing_and_gc_reclaims_the_guesses(tmp_path, data):
    """Parts staged and chunked ahead, then the server is killed: nothing is visible; a new
    server completes the upload (all chunked at Complete); gc then leaves the store clean."""
    path, blob = data
    pieces = _pieces(blob)
    with Store.init(str(tmp_path / "srv")) as s:
        s.commit_files("ds", "main", [], "create")
    srv = ServedStore(tmp_path, *LIMITS, gateway=True).start()
    try:
        up, tags = _send(_s3(srv.s3), "main/k.parquet", pieces, sorted(pieces))
    finally:
        srv.kill()
        srv.stop()
    with Store(str(tmp_path / "srv")) as s:
        assert [e["name"] for e in s.ls("cdc://ds/")] == []
    srv = ServedStore(tmp_path, *LIMITS, gateway=True).start()
    try:
        s3 = _s3(srv.s3)
        assert _complete(s3, "main/k.parquet", up, tags) == 0  # a new server knows nothing ahead
        assert s3.get_object(Bucket="ds", Key="main/k.parquet")["Body"].read() == blob
    finally:
        srv.stop()
    with Store(str(tmp_path / "srv")) as s:
        s.gc(grace=0, max_unused=0)  # every pack that holds a guess the file did not use is rewritten
        assert s.check()["problems"] == []
        assert s.cat("cdc://ds/k.parquet") == blob
        after = s.stats()["stored_bytes"]
    with Store.init(str(tmp_path / "fresh")) as fresh:  # what the file alone costs
        fresh.push([str(path)], "cdc://ds/k.parquet", message="push")
        alone = fresh.stats()["stored_bytes"]
    assert after <= alone * 1.02 + 4096, (after, alone)


def test_prechunk_guesses_are_the_true_chunks_of_real_parquet(tmp_path, data):
    """Chunked ahead in 5 MiB parts, a real-shaped Parquet file's page groups are guessed as the
    whole file gets them for most of its bytes, and never wrongly: a guess is a chunk's exact id."""
    path, blob = data
    with Store.init(str(tmp_path / "s")) as s:
        pre = Prechunk(s.commits.backend)
        try:
            for n, piece in _pieces(blob).items():
                p = tmp_path / f"p{n}"
                p.write_bytes(piece)
                assert pre.append(str(p), source_of(n, p.name, str(p)))
                pre.advance(MiB)
            guessed = pre.finish()
            assert pre.mode == "parquet-pages"
        finally:
            pre.close()
    m = manifest_of(str(path), IngestOptions())
    at, same = 0, 0
    for cid, length in zip(m.chunk_ids, m.lengths):
        g = guessed.get(at)
        if g is not None and g[0] == length:
            assert g[1] == cid
            same += length
        at += length
    assert same >= 0.6 * len(blob), (same, len(blob))

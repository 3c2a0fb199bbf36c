"""Trust by origin (docs/protocol.md): bytes from a bucket are checked against the chunk's BLAKE3
id before a caller sees them or a push deduplicates against them.

The co-tenant of issue 30: with write access to the bucket, it puts a well-formed pack holding a
public file's chunk ids over other bytes (named by the hash of its own bytes, its footer's xxh3-64
checksums matching them), plus the anchors that name it. Before, a victim's push deduplicated
against it (exit 0, new_bytes 0) and `cat` returned 4 MiB of 0xEE with exit 0.
"""
import io
import os
import secrets

import pytest

from cdcstore import Store
from cdcstore.core import anchors, ids
from cdcstore.core.chunker import DEFAULT_PARAMS
from cdcstore.core.pack import CODEC_RAW, PackWriter
from cdcstore.engine.ingest import FileChunks
from cdcstore.storage.repository import pack_name
from cdcstore.testing import free_port
from conftest import S3_BUCKET, golden_input
from server_util import ServerProcess

import boto3  # noqa: E402 - in the test extra
from botocore import UNSIGNED  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402


def _forge(prefix: str, path: str) -> str:
    """As the co-tenant would: a pack of the file's chunk ids (cut as a push cuts them) over
    0xEE bytes, and anchors naming it for its anchor chunks and its first chunk. Its name."""
    with open(path, "rb") as f:
        chunks = [bytes(c) for _, cs in FileChunks(f, DEFAULT_PARAMS) for c in cs]
    buf = io.BytesIO()
    w = PackWriter(buf)
    for c in chunks:
        garbage = b"\xee" * len(c)
        w.add(ids.digest(c), CODEC_RAW, garbage, len(c), ids.checksum(garbage))
    name = w.finish()
    s3 = boto3.client("s3")
    s3.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/{pack_name(name)}", Body=buf.getvalue())
    cids = [ids.digest(c) for c in chunks]
    for cid in dict.fromkeys([cids[0]] + [c for c in cids if anchors.is_anchor(c)]):
        s3.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/{anchors.name(cid, name)}", Body=b"")
    return name


@pytest.fixture
def bucket(s3_env, tmp_path, monkeypatch):
    """A new store in the test bucket (made on machine A), the public file, and its forgery."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-a"))
    prefix = f"store-{secrets.token_hex(4)}"
    url = f"s3://{S3_BUCKET}/{prefix}"
    Store.init(url).close()
    data = golden_input(4 << 20)
    src = tmp_path / "public"
    src.mkdir()
    (src / "f.bin").write_bytes(data)
    forged = _forge(prefix, str(src / "f.bin"))
    return url, str(src / "f.bin"), data, forged


def _machine(tmp_path, monkeypatch, name: str) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / name))


def test_a_push_does_not_dedup_against_a_forged_pack_and_no_read_returns_its_bytes(bucket, tmp_path, monkeypatch):
    url, path, data, forged = bucket
    _machine(tmp_path, monkeypatch, "machine-b")  # the victim, fresh
    with Store(url) as s:
        r = s.push([path], "cdc://ds/f.bin")
        assert r.new_bytes == len(data)  # every forged chunk failed its id: all uploaded
        assert s.cat("cdc://ds/f.bin") == data
        with s.open("cdc://ds/f.bin") as f:
            f.seek(1 << 20)
            assert f.read(100_000) == data[1 << 20:(1 << 20) + 100_000]
    _machine(tmp_path, monkeypatch, "machine-c")  # another machine, fresh
    with Store(url) as s:
        for _ in range(2):  # a first read that met the forgery must not let the second pass it
            assert s.cat("cdc://ds/f.bin") == data
        problems = s.check(read_data=True)["problems"]
        assert any(forged in p for p in problems), problems  # check names the forged pack


def test_a_second_machine_that_indexed_the_forgery_first_never_returns_it(bucket, tmp_path, monkeypatch):
    """Machine C lists the bucket (rebuild-index) while the forgery is the only copy, then the
    victim pushes: C's reads go to the forged rows first; they fail their ids, never pass."""
    url, path, data, forged = bucket
    _machine(tmp_path, monkeypatch, "machine-c")
    with Store(url) as s:
        s.rebuild_index()
    _machine(tmp_path, monkeypatch, "machine-b")
    with Store(url) as s:
        assert s.push([path], "cdc://ds/f.bin").new_bytes == len(data)
    _machine(tmp_path, monkeypatch, "machine-c")
    with Store(url) as s:
        got = []
        for _ in range(3):
            try:
                got.append(s.cat("cdc://ds/f.bin"))
            except Exception as e:  # noqa: BLE001 - a failed read is allowed; a forged byte is not
                got.append(e)
        assert all(g == data for g in got if isinstance(g, bytes)), "a forged byte was returned"
        assert got[-1] == data  # the damaged rows were dropped: the good copy is read


def test_through_a_server_and_its_gateway_no_forged_byte(bucket, tmp_path, monkeypatch):
    url, path, data, forged = bucket
    _machine(tmp_path, monkeypatch, "server")
    port = free_port()
    srv = ServerProcess(url, "--s3-port", str(port)).start()
    try:
        with Store(srv.url, cache=False) as s:
            r = s.push([path], "cdc://ds/f.bin")
            assert r.new_bytes == len(data)
            assert s.cat("cdc://ds/f.bin") == data
        anon = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                            config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}))
        for _ in range(2):
            try:
                body = anon.get_object(Bucket="ds", Key="main/f.bin")["Body"].read()
            except ClientError as e:
                assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 500
                continue
            assert body == data
        part = anon.get_object(Bucket="ds", Key="main/f.bin", Range="bytes=2000000-2000999")["Body"].read()
        assert part == data[2_000_000:2_001_000]
    finally:
        srv.stop()

"""The package's conformance suite for a `Backend` (cdcstore.testing.backend.BackendTests) over every
built-in one: a local directory (LocalStore), a Repository over memory:// and over s3:// (moto's
real S3 HTTP server), a RemoteStore against a real `cdcstore serve` subprocess over a directory,
the same behind a CachedBackend with a fresh ChunkCache, and a RemoteStore against a server over
s3://; then differences the suite found, pinned for the built-in ones.

Each test of the suite runs over every implementation through the `case` fixture. The servers and the
S3 server start once per session; each test works in its own repo (and, on S3, its own
prefix), so tests never see each other's refs. Where the implementations differ, the
difference is written down in docs/architecture.md ("Backends and capabilities")."""
from __future__ import annotations

import concurrent.futures
import os
import secrets
import time
from typing import Callable
from unittest import mock

import pytest

from cdcstore.core import ids
from cdcstore.core.pack import PackWriter, encode_chunk
from cdcstore.storage.cache import CachedBackend, ChunkCache
from cdcstore.testing.backend import BackendTests, Case, base_commit, commit, put_file, unique
from cdcstore.storage.repository import LocalStore, open_repository, pack_name
from cdcstore.remote.client.store import RemoteStore
from conftest import S3_BUCKET, flip_byte
from server_util import ServedStore, ServerProcess

KINDS = ["local", "memory", "s3", "remote", "cached", "remote-s3"]
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def _flip_file(path: str, offset: int) -> None:
    flip_byte(path, offset, 0xFF)


def _s3_client(endpoint: str):
    import boto3
    return boto3.client("s3", endpoint_url=endpoint, **{k.lower(): v for k, v in S3_ENV.items()
                                                         if k != "AWS_REGION"}, region_name="us-east-1")


def _flip_s3(endpoint: str, prefix: str) -> Callable[[str, int], None]:
    def flip(pack: str, offset: int) -> None:
        key = f"{prefix}/{pack_name(pack)}"
        client = _s3_client(endpoint)
        data = bytearray(client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read())
        data[offset] ^= 0xFF
        client.put_object(Bucket=S3_BUCKET, Key=key, Body=bytes(data))
    return flip


@pytest.fixture(scope="session")
def dir_server(tmp_path_factory):
    """One `cdcstore serve` over a directory store for the whole session: (server, the store's path)."""
    with ServedStore(tmp_path_factory.mktemp("conformance")) as srv:
        yield srv, srv.store


@pytest.fixture(scope="session")
def s3_server(s3_endpoint, tmp_path_factory):
    """One `cdcstore serve --store s3://...` for the whole session (its index in its own cache dir)."""
    prefix = f"srv-{secrets.token_hex(4)}"
    env = {**S3_ENV, "AWS_ENDPOINT_URL": s3_endpoint,
           "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("s3-server-cache"))}
    with mock.patch.dict(os.environ, env):
        url = f"s3://{S3_BUCKET}/{prefix}"
        open_repository(url, create=True).close()
        srv = ServerProcess(url).start()
    yield srv, prefix
    srv.stop()


class TestBuiltInBackends(BackendTests):
    """The suite over each built-in backend."""

    @pytest.fixture(params=KINDS)
    def case(self, request, tmp_path, monkeypatch):
        kind = request.param
        repo = f"r{secrets.token_hex(4)}"
        if kind == "local":
            root = str(tmp_path / "store")
            b = LocalStore.init(root)
            c = Case(kind, b, repo, root, lambda p, o: _flip_file(b.packs.pack_path(p), o))
        elif kind == "memory":
            b = open_repository("memory://", create=True)

            def flip(p, o):
                data = bytearray(b.objects._objects[pack_name(p)])
                data[o] ^= 0xFF
                b.objects._objects[pack_name(p)] = bytes(data)
            c = Case(kind, b, repo, "", flip)
        elif kind == "s3":
            endpoint = request.getfixturevalue("s3_endpoint")
            for k, v in {**S3_ENV, "AWS_ENDPOINT_URL": endpoint}.items():
                monkeypatch.setenv(k, v)
            prefix = f"t-{secrets.token_hex(6)}"
            url = f"s3://{S3_BUCKET}/{prefix}"
            c = Case(kind, open_repository(url, create=True), repo, url, _flip_s3(endpoint, prefix))
        elif kind in ("remote", "cached"):
            srv, root = request.getfixturevalue("dir_server")
            b = RemoteStore(srv.url)
            if kind == "cached":
                b = CachedBackend(b, ChunkCache(str(tmp_path / "cache.sqlite")))
            c = Case(kind, b, repo, srv.url, lambda p, o: _flip_file(LocalStore(root).packs.pack_path(p), o))
        else:
            srv, prefix = request.getfixturevalue("s3_server")
            endpoint = request.getfixturevalue("s3_endpoint")
            c = Case(kind, RemoteStore(srv.url), repo, srv.url, _flip_s3(endpoint, prefix))
        c.expect = {"local_reads": kind in ("local", "memory", "s3"),
                    "counts_requests": kind in ("remote", "cached", "remote-s3", "s3")}  # s3: a bucket's wire
        c.keeps_resolved_tags = kind == "cached"
        yield c
        c.backend.close()


# -- differences found by the suite, pinned ---------------------------------------------------
def test_cached_head_is_never_older_than_a_commit_it_saw(dir_server, tmp_path):
    """Two commits through one CachedBackend whose answers come back out of order (the
    first one's answer is slow): the head this machine then resolves is the newest one,
    not the commit whose answer came last."""
    srv, _ = dir_server

    class SlowAnswer(RemoteStore):
        def commit(self, c, branch, expected):
            cid = super().commit(c, branch, expected)
            if c.message == "slow":
                time.sleep(0.8)  # landed; the answer is late
            return cid

    b = CachedBackend(SlowAnswer(srv.url), ChunkCache(str(tmp_path / "cache.sqlite")))
    case = Case("cached", b, f"r{secrets.token_hex(4)}", srv.url, lambda p, o: None)
    try:
        c0 = base_commit(case)
        base = b.get_commit(case.repo, c0).files
        na, nb = put_file(b, unique())[0], put_file(b, unique())[0]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(commit, b, case.repo, c0, {"a": na}, message="slow", base=base)
            time.sleep(0.4)
            fast = commit(b, case.repo, c0, {"b": nb}, message="fast", base=base)  # rebased onto the slow one
            first = slow.result()
        assert b.get_commit(case.repo, fast).parent == first
        assert b.resolve_ref(case.repo, "main") == (fast, "branch")
    finally:
        b.close()


def test_flush_waits_for_uploads_that_another_thread_flushes(dir_server):
    """Two threads push through one RemoteStore (fsspec writers do): while one thread's
    flush waits for every upload, another thread's flush must still wait for its own
    packs, not return at once because the first took them."""
    import asyncio
    srv, _ = dir_server

    class SlowUpload(RemoteStore):
        async def _upload(self, tmp, name):
            await asyncio.sleep(0.6)
            await super()._upload(tmp, name)

    b = SlowUpload(srv.url)
    try:
        chunks = [unique(2000) for _ in range(2)]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            tmp = b.tmp_path()
            with open(tmp, "wb") as f:
                w = PackWriter(f)
                for raw in chunks:
                    cid = ids.digest(raw)
                    w.add(cid, *encode_chunk(raw, cid), len(raw))
                name = w.finish()
            b.add_pack(tmp, name, w.entries)
            other = pool.submit(b.flush)  # another thread flushes first
            time.sleep(0.1)
            b.flush()
            assert b.present([ids.digest(c) for c in chunks]) == {ids.digest(c) for c in chunks}
            other.result()
    finally:
        b.close()

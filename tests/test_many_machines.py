"""Many machines, one truth: a machine's index of a bucket is a cache, never what a push or a
read is acknowledged on. Two XDG cache dirs stand for two machines; moto's server is the bucket.
"""
import concurrent.futures
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import time

import boto3
import pytest

from cdcstore import Store
from cdcstore.core import anchors
from cdcstore.core.commit import Commit, FileEntry
from cdcstore.core.errors import MissingChunksError
from cdcstore.storage.repository import open_repository
from conftest import S3_BUCKET, CountingObjects


class Machine:
    """A store opened with its own user cache dir: its own chunk index of the bucket."""

    def __init__(self, url, cache_dir, monkeypatch):
        self.url, self.cache_dir, self._mp = url, str(cache_dir), monkeypatch

    def __enter__(self):
        self._mp.setenv("XDG_CACHE_HOME", self.cache_dir)
        return self

    def __exit__(self, *exc):
        return False

    def store(self) -> Store:
        with self:
            return Store(self.url)

    def repository(self):
        with self:
            return open_repository(self.url)


def _file(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def _sparse_pack_files(tmp_path):
    """A folder of a 300 kB file to keep and a 1.5 MB one to drop: pushed together, one pack
    holds both, and once the second is dropped gc rewrites that pack (a repack)."""
    keep = os.urandom(300_000)
    folder = tmp_path / "both"
    folder.mkdir()
    (folder / "keep.bin").write_bytes(keep)
    (folder / "drop.bin").write_bytes(os.urandom(1_500_000))
    return keep, folder


@pytest.fixture
def bucket_url(s3_env):
    url = f"s3://{S3_BUCKET}/machines-{secrets.token_hex(4)}"
    Store.init(url).close()
    return url


def test_gc_on_one_machine_never_leaves_another_machines_push_unreadable(bucket_url, tmp_path, monkeypatch):
    """A pushes X; B pushes Y (B's index now lists A's pack); A deletes its repo and runs gc with
    no grace; B pushes X: before, `new_bytes: 0` and an unreadable commit."""
    a = Machine(bucket_url, tmp_path / "machine-a", monkeypatch)
    b = Machine(bucket_url, tmp_path / "machine-b", monkeypatch)
    x, y = os.urandom(700_000), os.urandom(300_000)
    sa = a.store()
    sa.push([_file(tmp_path, "x.bin", x)], "cdc://alpha/x.bin")
    sb = b.store()
    sb.push([_file(tmp_path, "y.bin", y)], "cdc://beta/y.bin")
    sa.delete_repo("alpha")
    assert sa.gc(grace=0)["deleted"]
    again = sb.push([_file(tmp_path, "x2.bin", x)], "cdc://beta/x.bin")
    assert again.new_bytes == len(x)  # B's index was a cache: the pack was gone, so X was sent again
    assert sb.cat("cdc://beta/x.bin") == x
    fresh = Machine(bucket_url, tmp_path / "machine-c", monkeypatch).store()
    assert fresh.cat("cdc://beta/x.bin") == x
    assert fresh.check(read_data=True)["problems"] == []


def test_a_commit_naming_chunks_of_a_gone_pack_is_refused(bucket_url, tmp_path, monkeypatch):
    """The backstop: whatever the index says, a commit lands only if every new chunk is in a pack
    the store holds now (checked in the store, pack by pack), and nothing moves otherwise."""
    a = Machine(bucket_url, tmp_path / "machine-a", monkeypatch)
    b = Machine(bucket_url, tmp_path / "machine-b", monkeypatch)
    x = os.urandom(500_000)
    a.store().push([_file(tmp_path, "x.bin", x)], "cdc://alpha/x.bin")
    rb = b.repository()
    rb.packs.recover()  # B now lists A's pack
    sa = a.store()
    ra = a.repository()
    head = ra.resolve_ref("alpha", "main")[0]
    m = ra.get_manifest(ra.get_commit("alpha", head).files["x.bin"].manifest)
    sa.delete_repo("alpha")
    sa.gc(grace=0)
    rb.put_manifests([m])
    commit = Commit("beta", None, "stale", 0.0, {"x.bin": FileEntry(m.name(), len(x))})
    with pytest.raises(MissingChunksError, match="push again"):
        rb.commit(commit, "main", None)
    assert not rb.has_repo("beta") or "main" not in rb.branches("beta")
    # the gone pack was forgotten: the same machine's next push sends the chunks
    sb = b.store()
    r = sb.push([_file(tmp_path, "x2.bin", x)], "cdc://beta/x.bin")
    assert r.new_bytes == len(x) and sb.cat("cdc://beta/x.bin") == x


def test_a_bucket_made_again_under_the_same_name_is_another_store(bucket_url, tmp_path, monkeypatch, s3_env):
    """A leftover index of a deleted bucket (a test service restarted) must not make the new
    store's pushes `new 0 B` and unreadable."""
    m = Machine(bucket_url, tmp_path / "machine", monkeypatch)
    x = os.urandom(400_000)
    s = m.store()
    s.push([_file(tmp_path, "x.bin", x)], "cdc://ds/x.bin")
    s.close()
    prefix = bucket_url.split("/", 3)[3]
    s3 = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            s3.delete_object(Bucket=S3_BUCKET, Key=o["Key"])
    with m:
        Store.init(bucket_url).close()
    s = m.store()
    r = s.push([_file(tmp_path, "x2.bin", x)], "cdc://ds/x.bin")
    assert r.new_bytes == len(x)
    assert s.cat("cdc://ds/x.bin") == x


def test_two_s3_services_with_one_bucket_name_keep_two_indexes(s3_env, tmp_path, monkeypatch):
    """Same `s3://bucket/prefix` on two endpoints (a second moto in its own process: in-process
    moto servers share one state): one machine keeps two caches, and a push to the second
    service sends its chunks (before: `new 0 B`, unreadable there)."""
    port = _free_port()
    other = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint2 = f"http://127.0.0.1:{port}"
        client2 = boto3.client("s3", endpoint_url=endpoint2, aws_access_key_id="testing",
                               aws_secret_access_key="testing", region_name="us-east-1")
        deadline = time.monotonic() + 30
        while True:
            try:
                client2.create_bucket(Bucket=S3_BUCKET)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        url = f"s3://{S3_BUCKET}/same-name-{secrets.token_hex(4)}"
        x = os.urandom(300_000)
        m = Machine(url, tmp_path / "machine", monkeypatch)
        results = []
        for endpoint in (s3_env["AWS_ENDPOINT_URL"], endpoint2):
            monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
            with m:
                Store.init(url).close()
            s = m.store()
            results.append(s.push([_file(tmp_path, "x.bin", x)], "cdc://ds/x.bin").new_bytes)
            assert s.cat("cdc://ds/x.bin") == x
            s.close()
        assert results == [len(x), len(x)]
    finally:
        other.terminate()
        other.wait(10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_repack_on_one_machine_never_breaks_reads_on_another(bucket_url, tmp_path, monkeypatch):
    """B has located a file (its index lists the old pack); A's gc rewrites that pack; B's reads
    go on, in this process and after a restart (before: "pack ... is missing")."""
    a = Machine(bucket_url, tmp_path / "machine-a", monkeypatch)
    b = Machine(bucket_url, tmp_path / "machine-b", monkeypatch)
    keep, folder = _sparse_pack_files(tmp_path)
    sa = a.store()
    sa.push([str(folder)], "cdc://ds@exp/")  # one pack holds both files
    sa.push([str(folder / "keep.bin")], "cdc://ds/keep.bin")
    sb = b.store()
    assert sb.cat("cdc://ds/keep.bin") == keep  # B's index now maps keep's chunks to the old pack
    sa.delete_branch("ds", "exp")
    assert sa.gc(grace=0)["repack_packs"] == 1
    assert sb.cat("cdc://ds/keep.bin") == keep
    assert b.store().cat("cdc://ds/keep.bin") == keep  # "after a restart"


# -- through replicas: two `cdcstore serve` over one bucket, each with its own index cache ---------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRITE, READ, ADMIN = "tok-w-" + "a" * 16, "tok-r-" + "b" * 16, "tok-admin-" + "c" * 16


@pytest.fixture
def replicas(bucket_url, s3_env, tmp_path):
    from server_util import ServerProcess

    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({WRITE: {"scope": "write", "repos": ["*"]},
                                  READ: {"scope": "read", "repos": ["ds"]},
                                  ADMIN: {"scope": "admin", "repos": ["*"]}}))
    servers = []
    for name in "ab":
        env = {**os.environ, **s3_env, "PYTHONPATH": ROOT, "XDG_CACHE_HOME": str(tmp_path / f"replica-{name}")}
        servers.append(ServerProcess(bucket_url, "--tokens", str(tokens), "--min-gc-grace", "0", env=env).start())
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def _remote(server, token=WRITE):
    return Store(server.url, token=token, cache=False)


def test_admin_gc_through_one_replica_never_leaves_a_push_through_the_other_unreadable(replicas, tmp_path):
    a, b = replicas
    x, y = os.urandom(600_000), os.urandom(200_000)
    _remote(a).push([_file(tmp_path, "x.bin", x)], "cdc://alpha/x.bin")
    _remote(b).push([_file(tmp_path, "y.bin", y)], "cdc://beta/y.bin")
    assert _remote(b).cat("cdc://alpha/x.bin") == x  # replica b has indexed alpha's pack
    admin = _remote(a, ADMIN)
    admin.delete_repo("alpha")
    assert admin.gc(grace=0)["deleted"]
    r = _remote(b).push([_file(tmp_path, "x2.bin", x)], "cdc://beta/x.bin")
    assert r.new_bytes == len(x)
    assert _remote(b).cat("cdc://beta/x.bin") == x and _remote(a).cat("cdc://beta/x.bin") == x


def test_a_repack_through_one_replica_never_breaks_reads_through_the_other(replicas, tmp_path):
    a, b = replicas
    keep, folder = _sparse_pack_files(tmp_path)
    _remote(a).push([str(folder)], "cdc://ds@exp/")
    _remote(a).push([str(folder / "keep.bin")], "cdc://ds/keep.bin")
    assert _remote(b, READ).cat("cdc://ds/keep.bin") == keep  # b's index lists the old pack
    _remote(a).delete_branch("ds", "exp")
    assert _remote(a, ADMIN).gc(grace=0)["repack_packs"] == 1
    assert _remote(b, READ).cat("cdc://ds/keep.bin") == keep
    b.stop()
    b.start()  # "also after B restarts"
    assert _remote(b, READ).cat("cdc://ds/keep.bin") == keep


def test_a_fresh_replica_answers_concurrent_first_reads(bucket_url, s3_env, tmp_path):
    """8 readers at once at a replica that has never seen the repo: each gets the file (before:
    5 of 8 got 404 "no manifest": a request that waited while another granted got 0 grants)."""
    from server_util import ServerProcess

    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({WRITE: {"scope": "write", "repos": ["*"]}, READ: {"scope": "read", "repos": ["ds"]}}))
    x = os.urandom(200_000)
    Store(bucket_url).push([_file(tmp_path, "x.bin", x)], "cdc://ds/x.bin")
    for c in range(20):  # history, so that granting takes a while
        Store(bucket_url).push([_file(tmp_path, f"h{c}.bin", os.urandom(1000))], f"cdc://ds/h/{c}.bin")
    env = {**os.environ, **s3_env, "PYTHONPATH": ROOT, "XDG_CACHE_HOME": str(tmp_path / "fresh-replica")}
    with ServerProcess(bucket_url, "--tokens", str(tokens), env=env) as fresh:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda _: _remote(fresh, READ).cat("cdc://ds/x.bin"), range(8)))
    assert got == [x] * 8


@pytest.mark.parametrize("pushes", [2, 12])
def test_a_new_machine_reads_a_file_without_listing_the_bucket(bucket_url, tmp_path, monkeypatch, pushes):
    """Opening one file on a new machine costs the same with 2 or 12 packs in the bucket: the
    manifest's location record says where its chunks are (before: every pack's footer was read)."""
    writer = Machine(bucket_url, tmp_path / "writer", monkeypatch).store()
    files = {}
    for i in range(pushes):
        files[i] = os.urandom(200_000 + i)
        writer.push([_file(tmp_path, f"f{i}.bin", files[i])], f"cdc://ds/f{i}.bin")
    fresh = Machine(bucket_url, tmp_path / f"reader-{pushes}", monkeypatch).store()
    repo = fresh.backend.uncached()  # behind the machine's chunk cache
    counting = CountingObjects(repo.objects)
    repo.objects = counting
    assert fresh.cat("cdc://ds/f1.bin") == files[1]
    # resolving the branch lists refs (branches, tags); the file is one ranged read: no pack listing, no footer
    assert counting.calls["list"] <= 2 and counting.by_folder[("get_range", "packs")] == 1, counting.by_folder
    assert sum(counting.calls.values()) <= 12, counting.calls
    assert repo.index.totals()["packs"] == 0  # no pack footer was read
    assert fresh.cat("cdc://ds/f1.bin") == files[1]  # again: from the machine's chunk cache
    assert counting.by_folder[("get_range", "packs")] == 1 and fresh.cache_counters()["cache_hits"] > 0


def test_a_location_record_made_stale_by_a_repack_falls_back(bucket_url, tmp_path, monkeypatch):
    a = Machine(bucket_url, tmp_path / "machine-a", monkeypatch)
    keep = random.Random(21).randbytes(1 << 20)  # 1 MiB: its first chunk is an anchor
    folder = tmp_path / "both"
    folder.mkdir()
    (folder / "keep.bin").write_bytes(keep)
    (folder / "drop.bin").write_bytes(os.urandom(3 << 20))
    sa = a.store()
    sa.push([str(folder)], "cdc://ds@exp/")
    sa.push([str(folder / "keep.bin")], "cdc://ds/keep.bin")
    sa.delete_branch("ds", "exp")
    assert sa.gc(grace=0)["repack_packs"] == 1
    fresh = Machine(bucket_url, tmp_path / "machine-new", monkeypatch).store()
    repo = fresh.backend.uncached()
    listed = []
    inner_list = repo.objects.list
    repo.objects.list = lambda prefix="": listed.append(prefix) or inner_list(prefix)
    assert fresh.cat("cdc://ds/keep.bin") == keep  # the record names the old pack
    assert not [p for p in listed if p.startswith("packs")], listed  # the gc re-pointed the anchors


def test_committing_a_file_whose_chunks_a_gc_deleted_is_a_clear_error(bucket_url, tmp_path, monkeypatch):
    """`commit_entries` of an uploaded file whose only copy gc deleted meanwhile (on another
    machine, older than the grace window): refused, naming the fix; the branch does not move."""
    a = Machine(bucket_url, tmp_path / "machine-a", monkeypatch)
    b = Machine(bucket_url, tmp_path / "machine-b", monkeypatch)
    x = os.urandom(300_000)
    sb = b.store()
    entries = sb.upload([_file(tmp_path, "x.bin", x)], "cdc://ds/")
    sb.push([_file(tmp_path, "y.bin", b"y" * 1000)], "cdc://ds/y.bin")
    rb = b.repository()
    m = rb.get_manifest(entries["x.bin"].manifest)
    a.store().gc(grace=0)  # nothing names the upload yet: its pack and manifest go
    rb.put_manifests([m])  # the manifest is back (as a retried upload would put it); its chunks are not
    with pytest.raises(MissingChunksError, match="push again"):
        sb.commit_entries("cdc://ds/", [entries])
    assert sorted(e["name"] for e in b.store().ls("cdc://ds/")) == ["y.bin"]


def _edited(data: bytes, at: int, size: int) -> bytes:
    return data[:at] + random.Random(at).randbytes(size) + data[at + size:]


@pytest.mark.parametrize("others", [2, 12])
def test_a_new_machine_pushes_an_edit_reading_only_what_it_shares(bucket_url, tmp_path, monkeypatch, others):
    """Dedup on push needs no index of every chunk: a machine that never saw the bucket pushes a
    1% edit of a stored 16 MB file and sends about 1%, with the same requests whether the bucket
    holds 2 or 12 other packs (the store's anchors lead it to the packs it shares; before, the
    push read every pack's footer first)."""
    writer = Machine(bucket_url, tmp_path / "writer", monkeypatch).store()
    base = random.Random(7).randbytes(16 << 20)
    writer.push([_file(tmp_path, "base.bin", base)], "cdc://ds/base.bin")
    for i in range(others):
        writer.push([_file(tmp_path, f"o{i}.bin", os.urandom(100_000))], f"cdc://ds/o{i}.bin")
    edit = _edited(base, 8 << 20, 160_000)
    fresh = Machine(bucket_url, tmp_path / f"editor-{others}", monkeypatch).store()
    repo = fresh.backend.uncached()
    counting = CountingObjects(repo.objects)
    repo.objects = counting
    r = fresh.push([_file(tmp_path, "edit.bin", edit)], "cdc://ds/base.bin")
    assert r.new_bytes < 800_000, r  # the edit and the chunks around it, not 16 MB
    # the footer of the one pack it shares, and its shared chunks read once to check their ids:
    # another machine wrote that pack (trust by origin, docs/protocol.md)
    assert counting.calls["get_range"] <= 5, counting.calls
    assert counting.calls["list"] <= 5, counting.calls  # refs and sessions: never the packs
    assert repo.index.totals()["packs"] <= 3  # the shared pack and its own new one(s)
    assert sum(counting.calls.values()) < 80, counting.calls
    assert fresh.cat("cdc://ds/base.bin") == edit


def test_an_anchor_naming_a_pack_gc_deleted_is_a_miss(bucket_url, tmp_path, monkeypatch):
    """A gc deletes the anchors of the packs it deleted; one that names a gone pack anyway
    (a gc killed before its sweep) is a miss: the push sends the bytes, never points at nothing,
    and names its own pack in a new anchor."""
    a = Machine(bucket_url, tmp_path / "machine-a", monkeypatch)
    x = random.Random(3).randbytes(4 << 20)
    sa = a.store()
    sa.push([_file(tmp_path, "x.bin", x)], "cdc://alpha/x.bin")
    ra = a.repository()
    names_before = [i.name for i in ra.objects.list("anchors/")]
    assert names_before, "a 4 MB file has chunks whose ids are anchors"
    sa.delete_repo("alpha")
    assert sa.gc(grace=0)["deleted"]
    assert not list(ra.objects.list("anchors/"))  # gone with their pack
    for n in names_before:  # as if the gc had been killed before its sweep
        ra.objects.put(n, b"", exist_ok=True)
    b = Machine(bucket_url, tmp_path / "machine-b", monkeypatch).store()
    r = b.push([_file(tmp_path, "x2.bin", x)], "cdc://beta/x.bin")
    assert r.new_bytes == len(x)
    assert b.cat("cdc://beta/x.bin") == x
    assert b.check(read_data=True)["problems"] == []
    packs = {i.name.rsplit("/", 1)[-1][:-5] for i in ra.objects.list("packs/")}
    now = [anchors.parse(i.name) for i in ra.objects.list("anchors/")]
    assert {cid for cid, p in now if p in packs} >= {anchors.parse(n)[0] for n in names_before}  # B's copies



def test_an_old_bucket_store_gets_its_anchors_at_a_gc(bucket_url, tmp_path, monkeypatch):
    """A bucket store written before anchors (no `anchored` object): a push on a new machine
    brings its index up to the listing as before, so dedup holds; the next gc writes every
    pack's anchors and marks the store, after which a new machine reads no listing of packs."""
    a = Machine(bucket_url, tmp_path / "machine-a", monkeypatch)
    ra = a.repository()
    ra.objects.delete("anchored")
    for info in list(ra.objects.list("anchors/")):
        ra.objects.delete(info.name)
    base = random.Random(11).randbytes(8 << 20)
    sa = a.store()
    sa.push([_file(tmp_path, "base.bin", base)], "cdc://ds/base.bin")
    for info in list(ra.objects.list("anchors/")):  # as an old cdcstore wrote it: no anchors
        ra.objects.delete(info.name)
    assert not ra.objects.exists("anchored")
    b = Machine(bucket_url, tmp_path / "machine-b", monkeypatch).store()
    r = b.push([_file(tmp_path, "e1.bin", _edited(base, 1 << 20, 50_000))], "cdc://ds/base.bin")
    assert r.new_bytes < 600_000  # dedup held: the listing was read, as before anchors
    out = sa.gc(grace=0)
    assert out["anchored_packs"] >= 2 and ra.objects.exists("anchored")
    assert list(ra.objects.list("anchors/"))
    c = Machine(bucket_url, tmp_path / "machine-c", monkeypatch).store()
    repo = c.backend.uncached()
    counting = CountingObjects(repo.objects)
    repo.objects = counting
    r = c.push([_file(tmp_path, "e2.bin", _edited(base, 5 << 20, 50_000))], "cdc://ds/base.bin")
    assert r.new_bytes < 600_000
    assert counting.calls["get_range"] <= 8, counting.calls  # footers of the packs it shares, no more

"""Issue 32 item 3: manifest bundles. A bucket store's push of many small files writes their
manifests and location records as a few bundles (bundles/ab/<id>), not two objects a file, and
every path that reads a manifest finds it: by the pointer in its tree entry, by its name alone
(a scan of the bundles), on other machines (fresh cache dirs), after gc; a damaged or forged
bundle never yields a wrong manifest. moto is the bucket; two cache dirs stand for two machines."""
import hashlib
import os
import pickle
import secrets
import subprocess
import sys

import boto3
import pytest

from cdcstore import Store
from cdcstore.core import bundle, ids
from cdcstore.core.commit import FileEntry
from cdcstore.core.errors import CorruptionError
from cdcstore.core.manifest import Manifest
from cdcstore.storage import staging
from cdcstore.storage.repository import open_repository
from conftest import S3_BUCKET


# -- the format ------------------------------------------------------------------------------------
def _manifest(seed: bytes) -> bytes:
    c = hashlib.blake2b(seed, digest_size=32).digest()
    return Manifest([c, c], [100, 50], 150, b"\x07" * 16).encode()


def _items():
    m1, m2 = _manifest(b"one"), _manifest(b"two")
    return [(ids.hexdigest(m1), m1, b"REC1"), (ids.hexdigest(m2), m2, b"")]


def test_golden_bundle():
    """Bundle format v1 (docs/format.md "Manifest bundle"): pinned bytes, in name order whatever
    the input order; each manifest and its record come back."""
    items = _items()
    data = bundle.encode(items)
    assert data == bundle.encode(list(reversed(items)))
    assert data[:8] == b"CDCBNDL\x00" and int.from_bytes(data[8:12], "little") == 1
    assert int.from_bytes(data[12:16], "little") == 2
    assert len(data) == 24 + 2 * 40 + sum(len(m) + len(r) for _, m, r in items)
    assert hashlib.sha256(data).hexdigest() == "7c8996830406e5a7678c1a439254de819f61af021b78603a49c00619e6c6bded"
    assert bundle.decode(data) == {n: (m, r) for n, m, r in items}


def test_damaged_or_forged_bundles_are_refused():
    items = _items()
    data = bundle.encode(items)
    n0 = sorted(items)[0][0]
    forged = bytearray(data)
    forged[24 + 2 * 40 + 60] ^= 1  # a byte of the first manifest: no longer the manifest its name says
    cases = [data[:-1], data[:20], b"X" + data[1:], data[:8] + b"\x02" + data[9:], bytes(forged),
             data + b"\x00",
             data[:24] + data[64:104] + data[24:64] + data[104:]]  # the directory out of order
    for bad in cases:
        with pytest.raises(CorruptionError):
            bundle.decode(bad)
    with pytest.raises(CorruptionError, match=f"manifest {n0} does not match its name"):
        bundle.decode(bytes(forged))
    with pytest.raises(ValueError):
        bundle.encode([])
    with pytest.raises(ValueError):
        bundle.encode([items[0], items[0]])


def test_plan_bounds_bundles():
    m = _manifest(b"x")
    many = [(f"{i:064x}", m, b"") for i in range(bundle.MAX_ENTRIES * 2 + 5)]
    groups = bundle.plan(many)
    assert [len(g) for g in groups] == [bundle.MAX_ENTRIES, bundle.MAX_ENTRIES, 5]
    big = b"\x00" * (bundle.MAX_MANIFEST)
    groups = bundle.plan([(f"{i:064x}", big, b"") for i in range(130)])
    assert [len(g) for g in groups] == [15] * 8 + [10]  # 1 MiB a bundle at most
    assert all(len(bundle.encode(g)) <= bundle.MAX_BYTES for g in groups)
    assert not bundle.fits(b"\x00" * (bundle.MAX_MANIFEST + 1))


def test_a_journal_entry_keeps_the_bundle_pointer():
    e = FileEntry("ab" * 32, 10, "cd" * 32)
    (path, back), = staging.decode(staging.encode({"a.txt": e}))
    assert back == e and back.bundle == "cd" * 32
    assert FileEntry("ab" * 32, 10) == e  # the pointer is a hint, not what the file is


# -- a bucket ---------------------------------------------------------------------------------------
class Machine:
    def __init__(self, url, cache_dir, monkeypatch):
        self.url, self.cache_dir, self._mp = url, str(cache_dir), monkeypatch

    def store(self) -> Store:
        self._mp.setenv("XDG_CACHE_HOME", self.cache_dir)
        return Store(self.url)

    def repository(self):
        self._mp.setenv("XDG_CACHE_HOME", self.cache_dir)
        return open_repository(self.url)

    def run(self, code: str, *args) -> bytes:
        env = dict(os.environ, XDG_CACHE_HOME=self.cache_dir)
        return subprocess.run([sys.executable, "-c", code, self.url, *args], check=True, env=env,
                              capture_output=True).stdout


@pytest.fixture
def bucket(s3_env):
    prefix = f"bundles-{secrets.token_hex(4)}"
    url = f"s3://{S3_BUCKET}/{prefix}"
    Store.init(url).close()
    return url, prefix


def _keys(prefix: str, sub: str) -> list[str]:
    s3 = boto3.client("s3")
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=f"{prefix}/{sub}"):
        out += [o["Key"] for o in page.get("Contents", [])]
    return out


def _small_files(root, n: int, tag: str = "") -> dict[str, bytes]:
    files = {}
    for i in range(n):
        rel = f"d{i // 100:02d}/f{i:04d}.bin"
        files[rel] = os.urandom(200 + i % 50) + tag.encode()
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(files[rel])
    return files


def _pushed(url, tmp_path, monkeypatch, n: int) -> dict[str, bytes]:
    """n small files pushed to cdc://ds/ by machine "a"."""
    src = tmp_path / "src"
    files = _small_files(src, n)
    with Machine(url, tmp_path / "a", monkeypatch).store() as s:
        s.push([str(src)], "cdc://ds/")
    return files


def test_a_push_of_many_small_files_writes_bundles_and_another_machine_reads_them(bucket, tmp_path, monkeypatch):
    url, prefix = bucket
    files = _pushed(url, tmp_path, monkeypatch, 1_500)
    assert _keys(prefix, "manifests/") == [] and _keys(prefix, "locations/") == []
    assert len(_keys(prefix, "bundles/")) == 2  # 1,024 + 476
    b = Machine(url, tmp_path / "b", monkeypatch)
    got = pickle.loads(b.run("import sys, pickle; from cdcstore import Store\n"
                             "with Store(sys.argv[1]) as s: sys.stdout.buffer.write(pickle.dumps("
                             "{p: s.cat('cdc://ds/' + p) for p in sys.argv[2:]}))", *sorted(files)[::97]))
    assert got == {p: files[p] for p in sorted(files)[::97]}
    with b.store() as s:  # a whole folder, and every tree entry names its bundle
        view = s.backend.view("ds", s.backend.get_commit("ds", s.backend.branches("ds")["main"]))
        entries = dict(view.walk(""))
        assert len(entries) == 1_500 and all(e.bundle is not None for e in entries.values())
        assert {p: s.cat(f"cdc://ds/{p}") for p in sorted(files)[:120]} == {p: files[p] for p in sorted(files)[:120]}
        assert s.check(read_data=True)["problems"] == []


def test_a_manifest_asked_for_by_name_alone_is_found_in_its_bundle(bucket, tmp_path, monkeypatch):
    """A name that came without its tree (a commit's entries from elsewhere, gc's journals):
    found by a look through the store's bundles, on a machine that read no tree."""
    url, _ = bucket
    src = tmp_path / "src"
    _small_files(src, 30)
    with Machine(url, tmp_path / "a", monkeypatch).store() as s:
        s.push([str(src)], "cdc://ds/")
        view = s.backend.view("ds", s.backend.get_commit("ds", s.backend.branches("ds")["main"]))
        names = [e.manifest for _, e in view.walk("")]
    fresh = Machine(url, tmp_path / "b", monkeypatch).repository()
    assert fresh.bundle_of(names[0]) is None
    assert fresh.get_manifest(names[0]).size > 0
    assert fresh.manifests_present("ds", names + ["ef" * 32]) == set(names)
    assert not fresh.metadata.has_manifest("ef" * 32)
    with pytest.raises(CorruptionError, match="missing"):
        fresh.get_manifest("ef" * 32)


def test_upload_then_commit_entries_elsewhere_carries_the_pointers(bucket, tmp_path, monkeypatch):
    """The dask path: workers upload (their entries name the bundle), the driver commits on
    another machine; it reads the bundle once, and a third machine reads the files."""
    url, prefix = bucket
    src = tmp_path / "src"
    files = _small_files(src, 40)
    up = pickle.loads(Machine(url, tmp_path / "w", monkeypatch).run(
        "import sys, pickle; from cdcstore import Store\n"
        "with Store(sys.argv[1]) as s: sys.stdout.buffer.write(pickle.dumps(s.upload([sys.argv[2]], 'cdc://ds/')))",
        str(src)))
    assert len({e.bundle for e in up.values()}) == 1 and None not in {e.bundle for e in up.values()}
    with Machine(url, tmp_path / "driver", monkeypatch).store() as s:
        s.commit_entries("cdc://ds/", up, message="uploaded")
    with Machine(url, tmp_path / "reader", monkeypatch).store() as s:
        assert {p: s.cat(f"cdc://ds/{p}") for p in files} == files
    assert _keys(prefix, "manifests/") == []


def test_gc_keeps_live_bundles_and_drops_dead_ones(bucket, tmp_path, monkeypatch):
    url, prefix = bucket
    keep, drop = tmp_path / "keep", tmp_path / "drop"
    kept = _small_files(keep, 50, "k")
    _small_files(drop, 50, "d")
    a = Machine(url, tmp_path / "a", monkeypatch)
    with a.store() as s:
        s.push([str(keep)], "cdc://alpha/")
        s.push([str(drop)], "cdc://beta/")
        assert len(_keys(prefix, "bundles/")) == 2
        s.delete_repo("beta")
        # inside the default grace window, yet freed: only the deleted repo's commits reached it, so it
        # was committed, no upload in flight (issue 44: the tombstone lists those commits' trees)
        young = s.gc()
        assert young["deleted"] and young["delete_bundles"] == 1 and len(_keys(prefix, "bundles/")) == 1
        again = s.gc(grace=0)
        assert again["deleted"] and again["delete_bundles"] == 0
    assert len(_keys(prefix, "bundles/")) == 1
    with Machine(url, tmp_path / "b", monkeypatch).store() as s:
        assert {p: s.cat(f"cdc://alpha/{p}") for p in kept} == kept
        assert s.check(read_data=True)["problems"] == []


def test_a_young_unreferenced_bundle_keeps_its_chunks(bucket, tmp_path, monkeypatch):
    """An upload not yet committed (a bundle no tree names) is a root for the grace window: gc
    keeps it and its chunks, and the commit that lands later reads."""
    url, _ = bucket
    src = tmp_path / "src"
    files = _small_files(src, 20)
    with Machine(url, tmp_path / "a", monkeypatch).store() as s:
        up = s.upload([str(src)], "cdc://ds/")
        plan = s.gc(grace=3600, dry_run=True)
        assert plan["delete_bundles"] == 0 and plan["delete_packs"] == 0 and plan["spared_young"] >= 1
        s.commit_entries("cdc://ds/", up)
    with Machine(url, tmp_path / "b", monkeypatch).store() as s:
        assert {p: s.cat(f"cdc://ds/{p}") for p in files} == files


def test_a_damaged_bundle_is_an_error_naming_it_never_a_wrong_file(bucket, tmp_path, monkeypatch):
    url, prefix = bucket
    files = _pushed(url, tmp_path, monkeypatch, 10)
    key, = _keys(prefix, "bundles/")
    s3 = boto3.client("s3")
    data = bytearray(s3.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read())
    data[200] ^= 1
    s3.put_object(Bucket=S3_BUCKET, Key=key, Body=bytes(data))
    with Machine(url, tmp_path / "b", monkeypatch).store() as s:
        with pytest.raises(CorruptionError, match="bundle .*damaged"):
            s.cat(f"cdc://ds/{sorted(files)[0]}")
        problems = s.check()["problems"]
        assert problems and any("bundle" in str(p) for p in problems)


def test_a_forged_bundle_from_a_cotenant_is_never_served(bucket, tmp_path, monkeypatch):
    """A co-tenant of the bucket writes a well-formed bundle, named by its own hash, that holds
    a manifest under another manifest's name: the name check refuses it, and the true manifest
    (its own bundle) is what a reader gets."""
    url, prefix = bucket
    src = tmp_path / "src"
    files = _small_files(src, 5)
    with Machine(url, tmp_path / "a", monkeypatch).store() as s:
        s.push([str(src)], "cdc://ds/")
        view = s.backend.view("ds", s.backend.get_commit("ds", s.backend.branches("ds")["main"]))
        victim = next(e.manifest for _, e in view.walk(""))
    fake = _manifest(b"forged")
    body = bytearray(bundle.encode([(victim, _manifest(b"placeholder-of-same-len"), b"")]))
    off = 24 + 40
    body[off:off + len(fake)] = fake  # same length: the directory still fits; the name no longer does
    bid = ids.hexdigest(bytes(body))
    boto3.client("s3").put_object(Bucket=S3_BUCKET, Key=f"{prefix}/bundles/{bid[:2]}/{bid}", Body=bytes(body))
    fresh = Machine(url, tmp_path / "b", monkeypatch).repository()
    fresh.learn_bundles([(victim, bid)])  # a caller's entry pointing at the forgery
    m = fresh.get_manifest(victim)  # the forgery is refused; the true one is found by a scan
    assert ids.hexdigest(m.encode()) == victim
    with Machine(url, tmp_path / "c", monkeypatch).store() as s:
        assert {p: s.cat(f"cdc://ds/{p}") for p in files} == files


def test_a_push_through_a_server_over_a_bucket_names_the_servers_bundles(bucket, tmp_path, monkeypatch):
    """A server over a bucket stores small manifests in bundles and names them in its answer
    (protocol 2.2): the client's tree entries carry them, so a machine reading the bucket
    directly takes each manifest from its bundle without looking through them all."""
    import json

    from cdcstore.testing import ServerProcess

    url, prefix = bucket
    token = "tok-bundles-" + "c" * 16
    (tmp_path / "tokens.json").write_text(json.dumps({token: {"scope": "write", "repos": ["ds"]}}))
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "server")}
    server = ServerProcess(url, "--tokens", str(tmp_path / "tokens.json"), env=env).start()
    try:
        src = tmp_path / "src"
        files = _small_files(src, 60)
        with Store(server.url, token=token, cache=False) as s:
            s.push([str(src)], "cdc://ds/")
            assert s.cat(f"cdc://ds/{sorted(files)[0]}") == files[sorted(files)[0]]
    finally:
        server.stop()
    assert _keys(prefix, "manifests/") == [] and len(_keys(prefix, "bundles/")) == 1
    with Machine(url, tmp_path / "direct", monkeypatch).store() as s:
        view = s.backend.view("ds", s.backend.get_commit("ds", s.backend.branches("ds")["main"]))
        assert all(e.bundle is not None for _, e in view.walk(""))
        assert {p: s.cat(f"cdc://ds/{p}") for p in files} == files


def test_a_wrong_pointer_after_a_look_through_the_bundles_is_recovered_from(bucket, tmp_path, monkeypatch):
    """A caller's entry names the wrong bundle for a manifest this process already found by a
    look through the bundles: the wrong pointer is dropped and the manifest is found again."""
    url, _ = bucket
    _pushed(url, tmp_path, monkeypatch, 5)
    with Machine(url, tmp_path / "a", monkeypatch).store() as s:
        view = s.backend.view("ds", s.backend.get_commit("ds", s.backend.branches("ds")["main"]))
        name = next(e.manifest for _, e in view.walk(""))
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.bin").write_bytes(os.urandom(300))
    with Machine(url, tmp_path / "a", monkeypatch).store() as s:
        s.push([str(other)], "cdc://elsewhere/")
        wrong = next(e.bundle for _, e in s.backend.view("elsewhere", s.backend.get_commit(
            "elsewhere", s.backend.branches("elsewhere")["main"])).walk(""))
    fresh = Machine(url, tmp_path / "b", monkeypatch).repository()
    assert fresh.manifests_present("ds", [name]) == {name}  # found by a look through them all
    fresh.learn_bundles([(name, wrong)])
    fresh.metadata._manifests.clear()
    assert ids.hexdigest(fresh.get_manifest(name).encode()) == name


def test_check_reports_a_damaged_bundle_no_file_names_and_gc_removes_it(bucket, tmp_path, monkeypatch):
    """Junk a co-tenant puts under bundles/ (issue 43 case 6: 300 objects, 1,804 GETs by check, kept
    by gc forever): check names each once, reading each once; gc removes those no live file entry
    names, past the grace window. A damaged bundle that live entries name is kept (check names it
    and the files it held)."""
    url, prefix = bucket
    _pushed(url, tmp_path, monkeypatch, 3)
    s3 = boto3.client("s3")
    live = [k.rsplit("/", 1)[-1] for k in _keys(prefix, "bundles/")]
    junk = [secrets.token_hex(32) for _ in range(12)]
    for bid in junk:
        s3.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/bundles/{bid[:2]}/{bid}", Body=b"CDCBNDL\x00junk")
    with Machine(url, tmp_path / "a", monkeypatch).store() as s:
        problems = s.check()["problems"]
        assert len(problems) == len(junk) and all(any(f"bundles/{b[:2]}/{b}" in p for p in problems) for b in junk)
        assert s.gc(grace=3600)["delete_bundles"] == 0  # young: kept (a co-tenant's upload in flight?)
        assert s.gc(grace=0)["delete_bundles"] == len(junk)
        assert s.check()["problems"] == []
        assert sorted(k.rsplit("/", 1)[-1] for k in _keys(prefix, "bundles/")) == sorted(live)
    (bid,) = live  # a live bundle damaged: damage stops gc (nothing deleted); check names it and the files
    s3.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/bundles/{bid[:2]}/{bid}", Body=b"CDCBNDL\x00damaged")
    with Machine(url, tmp_path / "c", monkeypatch).store() as s:
        with pytest.raises(CorruptionError):
            s.gc(grace=0)
        assert bid in [k.rsplit("/", 1)[-1] for k in _keys(prefix, "bundles/")]
        problems = s.check()["problems"]
        assert any(f"manifest bundle {bid}" in p for p in problems)
        assert any("affects" in p for p in problems)


def test_a_huge_object_among_the_bundles_is_refused_without_reading_it_whole(bucket, tmp_path, monkeypatch):
    """A co-tenant puts 8 MiB under bundles/: a look through the bundles reads at most
    bundle.MAX_BYTES + 1 of it, passes over it, and check names it."""
    url, prefix = bucket
    files = _pushed(url, tmp_path, monkeypatch, 3)
    bid = "cd" * 32
    boto3.client("s3").put_object(Bucket=S3_BUCKET, Key=f"{prefix}/bundles/cd/{bid}", Body=os.urandom(8 << 20))
    fresh = Machine(url, tmp_path / "b", monkeypatch).repository()
    before = fresh.objects.counters()["received_bytes"]
    names = fresh.manifests_present("ds", [ids.hexdigest(_manifest(b"absent"))])
    received = fresh.objects.counters()["received_bytes"] - before
    assert names == set() and received <= 2 * (bundle.MAX_BYTES + 1)  # not the 8 MiB
    with Machine(url, tmp_path / "c", monkeypatch).store() as s:
        assert {p: s.cat(f"cdc://ds/{p}") for p in files} == files
        assert any(f"manifest bundle {bid} is over" in p for p in s.check()["problems"])

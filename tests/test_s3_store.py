"""A whole store on S3-compatible object storage: moto's S3 server on loopback, real clients.

Packs, manifests and commits are written once; branches move by conditional writes; the
sqlite index is a local cache any machine rebuilds from the bucket.
"""
import os
import secrets
import signal
import subprocess
import sys
import time

import fsspec
import pytest

from cdcstore import ConflictError, Store
from conftest import S3_BUCKET, golden_input

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def s3_url(s3_env, tmp_path, monkeypatch):
    """A fresh store prefix in the test bucket; this machine's index cache under tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-a"))
    url = f"s3://{S3_BUCKET}/store-{secrets.token_hex(4)}"
    Store.init(url).close()
    return url


def _files(folder, **named):
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in named.items():
        (folder / name).write_bytes(data)
    return str(folder)


def test_push_read_and_dedup_on_s3(s3_url, tmp_path):
    data = golden_input(3 << 20)
    v1 = _files(tmp_path / "v1", **{"a.bin": data, "b.bin": data[:500_000]})
    with Store(s3_url) as s:
        r1 = s.push([v1], "cdc://ds/")
        edited = bytearray(data)
        edited[1_000_000:1_000_100] = b"x" * 100
        v2 = _files(tmp_path / "v2", **{"a.bin": bytes(edited), "b.bin": data[:500_000]})
        r2 = s.push([v2], "cdc://ds/")
        assert r2.new_bytes < r1.new_bytes / 10  # the edit stores about its chunks, no more
        assert s.cat(f"cdc://ds@{r1.commit}/a.bin") == data
        assert s.cat("cdc://ds/a.bin") == bytes(edited)
        with s.open("cdc://ds/a.bin") as f:  # ranged reads
            f.seek(2_000_000)
            assert f.read(1000) == data[2_000_000:2_001_000]
        assert s.check(read_data=True)["problems"] == []
    # every object is written once: packs and manifests are content-named, never replaced
    fs = fsspec.filesystem("cdc", store=s3_url)
    assert fs.cat("cdc://ds/b.bin") == data[:500_000]


def test_a_new_machine_rebuilds_its_index_from_the_bucket(s3_url, tmp_path, monkeypatch):
    data = golden_input(2 << 20)
    with Store(s3_url) as s:
        s.push([_files(tmp_path / "v1", **{"a.bin": data})], "cdc://ds/")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))  # no index here yet
    with Store(s3_url) as s:
        assert s.cat("cdc://ds/a.bin") == data
        again = s.push([_files(tmp_path / "v1b", **{"a.bin": data})], "cdc://ds/copy/")
        assert again.new_bytes == 0  # it knows every chunk the bucket holds
        r = s.rebuild_index()
        assert r["packs"] >= 1 and r["bad_packs"] == []


WRITER = """
import sys
from cdcstore import Store
with Store(sys.argv[1]) as s:
    print("ready", flush=True)
    for i in range(int(sys.argv[4])):
        r = s.push([sys.argv[2]], f"cdc://ds/{sys.argv[3]}/{i}.bin")
        print(r.commit, flush=True)
"""


def _writer(url, src, name, rounds, env):
    return subprocess.Popen([sys.executable, "-c", WRITER, url, src, name, str(rounds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_two_processes_commit_at_once_and_lose_nothing(s3_url, tmp_path, s3_env):
    env = {**os.environ, **s3_env, "PYTHONPATH": ROOT}
    a = _files(tmp_path / "a", **{"f.bin": golden_input(300_000)})
    b = _files(tmp_path / "b", **{"f.bin": golden_input(300_001)})
    procs = [_writer(s3_url, a, "a", 5, env), _writer(s3_url, b, "b", 5, env)]
    acked = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        acked += out.split()[1:]
    assert len(acked) == 10
    with Store(s3_url) as s:
        files = {e["name"] for e in s.ls("cdc://ds/", recursive=True)}
        assert files == {f"{w}/{i}.bin/f.bin" for w in "ab" for i in range(5)}  # disjoint paths all landed
        history = {c["commit"] for c in s.log("ds")}
        assert len(history) == 10
        assert s.check()["problems"] == []


def test_overlapping_writes_conflict_cleanly(s3_url, tmp_path):
    from cdcstore.core.commit import Commit
    from cdcstore.storage.repository import open_repository

    with Store(s3_url) as s:
        head = s.push([_files(tmp_path / "v0", **{"x.bin": b"0" * 1000})], "cdc://ds/").commit
        v1 = s.push([_files(tmp_path / "v1", **{"x.bin": b"1" * 1000})], "cdc://ds/").commit
    repo = open_repository(s3_url)
    mine = repo.get_commit("ds", v1)
    # a writer on another machine that started from `head` and changed the same path
    stale = Commit("ds", head, "a stale writer", mine.time + 1, dict(mine.files))
    with pytest.raises(ConflictError, match="same paths: x.bin"):
        repo.commit(stale, "main", head)
    assert repo.resolve("ds", "main") == v1  # nothing moved
    repo.close()


def test_a_writer_killed_mid_push_loses_nothing_acknowledged(s3_url, tmp_path, s3_env):
    env = {**os.environ, **s3_env, "PYTHONPATH": ROOT}
    small = _files(tmp_path / "small", **{"f.bin": golden_input(200_000)})
    with Store(s3_url) as s:
        first = s.push([small], "cdc://ds/keep/").commit
    # 16 MiB (was 48): the push still takes ~0.3 s after "ready" on a quiet machine, so both kills
    # land in it; check(read_data=True) below costs a ranged GET per chunk, each of which moto
    # answers by copying the whole pack: 48 MiB made that check alone ~30-60 s
    big = _files(tmp_path / "big", **{"f.bin": os.urandom(16 << 20)})
    killed = 0
    for delay in (0.05, 0.2):
        p = _writer(s3_url, big, f"big{delay}", 1, env)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        killed += p.wait(timeout=30) == -signal.SIGKILL
    assert killed >= 1  # at least one push died before it finished
    with Store(s3_url) as s:
        assert s.check()["problems"] == []
        assert s.cat(f"cdc://ds@{first}/keep/f.bin") == golden_input(200_000)
        again = s.push([big], "cdc://ds/big/")  # the next push reuses what the killed one stored
        assert s.cat("cdc://ds/big/f.bin") == open(os.path.join(big, "f.bin"), "rb").read()
        assert again.commit
        assert s.check(read_data=True)["problems"] == []


def test_a_server_over_a_bucket(s3_url, tmp_path, s3_env):
    from server_util import ServerProcess

    srv = ServerProcess(s3_url).start()
    try:
        data = golden_input(1 << 20)
        with Store(srv.url, cache=False) as s:
            s.push([_files(tmp_path / "v1", **{"a.bin": data})], "cdc://ds/")
            assert s.cat("cdc://ds/a.bin") == data
        with Store(s3_url) as direct:  # what the server wrote is the bucket's store
            assert direct.cat("cdc://ds/a.bin") == data
    finally:
        srv.stop()

"""Fault injection: a store whose Nth write fails, for every N along a push, a commit and a gc.

After each fault: `check --read-data` is clean, every acknowledged commit reads back byte for
byte, and the next push succeeds (reusing what the failed one stored). Workers are SIGKILLed at
30 random points of push, commit, gc and repack; CDCSTORE_LONG_FAULTS=1 makes it 50."""
import os

import pytest

from cdcstore import Store
from cdcstore.core.errors import CdcError
from cdcstore.storage.local import LocalObjects
from cdcstore.storage.maintenance import gc
from cdcstore.storage.objects import StorageError
from cdcstore.storage.repository import LocalStore, Repository
from cdcstore.testing import FaultProxy

MUTATIONS = ("put", "put_file", "put_if_absent", "put_if_match", "delete", "touch")
LONG = os.environ.get("CDCSTORE_LONG_FAULTS") == "1"  # more random SIGKILL points (50, not 30)
KILLS = 50 if LONG else 30


class Injected(StorageError):
    code = "injected"


class FaultyObjects(LocalObjects):
    """A directory whose `fail_at`-th mutation (put, conditional put, delete) fails before it
    happens, as a full disk or a lost connection would; `count` counts them."""

    def __init__(self, root: str, fail_at: int | None = None):
        super().__init__(root)
        self.fail_at, self.count = fail_at, 0

    def _tick(self, what: str, name: str) -> None:
        self.count += 1
        if self.count == self.fail_at:
            raise Injected(f"injected fault at mutation {self.count}: {what} {name}")


for _m in MUTATIONS:
    def _wrap(method):
        def wrapped(self, name, *a, **kw):
            self._tick(method.__name__, name)
            return method(self, name, *a, **kw)
        wrapped.__name__ = method.__name__
        return wrapped
    setattr(FaultyObjects, _m, _wrap(getattr(LocalObjects, _m)))


def faulty_store(root: str, fail_at: int | None) -> tuple[Store, FaultyObjects]:
    objects = FaultyObjects(root, fail_at)
    repo = Repository(objects, os.path.join(root, "index.sqlite"), root)
    return Store.over(repo), objects


def _files(folder, n=3, size=200_000, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = __import__("random").Random(seed)
    out = {}
    for i in range(n):
        data = rng.randbytes(size + i * 1000)
        (folder / f"f{i}.bin").write_bytes(data)
        out[f"f{i}.bin"] = data
    return out


def _verify(root, acked: dict[str, dict[str, bytes]]) -> None:
    s = Store(root)
    assert s.check(read_data=True)["problems"] == []
    for cid, files in acked.items():
        for name, data in files.items():
            assert s.cat(f"cdc://ds@{cid}/{name}") == data
    s.close()


def _count(tmp_path, action) -> int:
    root = str(tmp_path / "count")
    LocalStore.init(root)
    s, objects = faulty_store(root, None)
    action(s, tmp_path / "count-data")
    return objects.count


def test_a_fault_at_every_write_of_a_push_and_commit(tmp_path):
    def push_twice(s, data_dir):
        v1 = _files(data_dir / "v1", seed=1)
        r1 = s.push([str(data_dir / "v1")], "cdc://ds/")
        v2 = _files(data_dir / "v2", seed=2)
        r2 = s.push([str(data_dir / "v2")], "cdc://ds/more/")
        return {r1.commit: v1, r2.commit: {f"more/{k}": v for k, v in v2.items()}}

    total = _count(tmp_path, push_twice)
    assert total >= 8  # packs, manifests, commits, branch moves, session markers
    faults = 0
    for n in range(1, total + 1):
        root = str(tmp_path / f"s{n}")
        LocalStore.init(root)
        s, _ = faulty_store(root, n)
        acked: dict = {}
        data = tmp_path / f"d{n}"
        v1, v2 = _files(data / "v1", seed=1), _files(data / "v2", seed=2)
        try:
            acked[s.push([str(data / "v1")], "cdc://ds/").commit] = v1
            acked[s.push([str(data / "v2")], "cdc://ds/more/").commit] = {f"more/{k}": v for k, v in v2.items()}
        except (Injected, CdcError, OSError):
            faults += 1
        else:
            assert len(acked) == 2  # only a fault in removing a finished push's session marker, or a
            # landed root commit's landing marker (`Refs.commit`), is absorbed
        _verify(root, acked)
        again = Store(root).push([str(data / "v2")], "cdc://ds/more/")  # the next push lands
        assert again.commit and Store(root).cat("cdc://ds/more/f0.bin") == (data / "v2" / "f0.bin").read_bytes()
    assert faults >= total - 3  # every other fault surfaced as an error, none was swallowed
    print(f"push/commit: {total} faults injected, {faults} surfaced")


def test_a_fault_at_every_write_of_a_gc(tmp_path):
    def setup(root, data_dir):
        s = Store(root)
        keep = _files(data_dir / "keep", seed=3)
        cid = s.push([str(data_dir / "keep")], "cdc://ds/").commit
        _files(data_dir / "drop", seed=4)
        s.push([str(data_dir / "drop")], "cdc://ds@exp/")
        both = _files(data_dir / "both", n=1, size=100_000, seed=5)  # one pack, then half of it dropped
        _files(data_dir / "both", n=3, size=600_000, seed=6)
        s.push([str(data_dir / "both")], "cdc://ds@exp2/")
        cid = s.push([str(data_dir / "both" / "f0.bin")], "cdc://ds/kept/f0.bin").commit
        s.delete_branch("ds", "exp")
        s.delete_branch("ds", "exp2")
        s.close()
        return {cid: {**keep, "kept/f0.bin": (data_dir / "both" / "f0.bin").read_bytes()}}

    root = str(tmp_path / "count")
    LocalStore.init(root)
    setup(root, tmp_path / "count-data")
    objects = FaultyObjects(root)
    gc(Repository(objects, os.path.join(root, "index.sqlite"), root), grace=0)
    total = objects.count
    assert total >= 4
    print(f"gc: {total} faults injected")
    for n in range(1, total + 1):
        root = str(tmp_path / f"g{n}")
        LocalStore.init(root)
        acked = setup(root, tmp_path / f"gd{n}")
        with pytest.raises(Injected):
            gc(Repository(FaultyObjects(root, n), os.path.join(root, "index.sqlite"), root), grace=0)
        _verify(root, acked)
        assert gc(LocalStore(root), grace=0)["deleted"] in (True, False)  # the next gc runs
        _verify(root, acked)


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs (the test machine runs as root, as CI does here)."""
    import subprocess as sp

    mnt = tmp_path / "disk"
    mnt.mkdir()
    sp.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], check=True)
    yield str(mnt)
    sp.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_loses_nothing_and_the_store_stays_usable(small_disk, tmp_path):
    root = os.path.join(small_disk, "store")
    LocalStore.init(root)
    s = Store(root)
    first = _files(tmp_path / "v1", n=2, size=4 << 20, seed=5)
    cid = s.push([str(tmp_path / "v1")], "cdc://ds/").commit
    big = _files(tmp_path / "big", n=4, size=8 << 20, seed=6)  # 32 MiB: cannot fit
    with pytest.raises(OSError):
        s.push([str(tmp_path / "big")], "cdc://ds/big/")
    assert os.listdir(os.path.join(root, "tmp")) == []  # no temp file left behind
    _verify(root, {cid: first})
    # space freed (here: the big push's leftovers, which gc removes once unreferenced): pushes work again
    gc(LocalStore(root), grace=0)
    small = _files(tmp_path / "v2", n=1, size=1 << 20, seed=7)
    cid2 = Store(root).push([str(tmp_path / "v2")], "cdc://ds/v2/").commit
    _verify(root, {cid: first, cid2: {f"v2/{k}": v for k, v in small.items()}})
    assert len(big) == 4


KILLED_WORKER = """
import os, random, sys
from cdcstore import Store
from cdcstore.storage.maintenance import gc
from cdcstore.storage.repository import LocalStore
root, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
s = Store(root)
for i in range(1000):
    d = os.path.join(root + "-data", f"{seed}-{i}")
    os.makedirs(os.path.join(d, "both"), exist_ok=True)
    keep, drop = rng.randbytes(rng.randint(50_000, 300_000)), rng.randbytes(rng.randint(50_000, 300_000))
    for name, data in (("keep.bin", keep), ("drop.bin", drop)):
        with open(os.path.join(d, "both", name), "wb") as f:
            f.write(data)
    tmp = f"tmp{seed}-{i}"
    s.push([os.path.join(d, "both")], f"cdc://ds@{tmp}/{seed}/{i}/")  # one pack: keep + drop
    r = s.push([os.path.join(d, "both", "keep.bin")], f"cdc://ds/{seed}/{i}/keep.bin")  # dedups keep
    print(r.commit, f"{seed}/{i}/keep.bin", keep.hex()[:16], flush=True)  # acknowledged and reachable
    s.delete_branch("ds", tmp)  # the pack is now part dead: gc repacks it
    gc(LocalStore(root), grace=0, repack_dead=0.2)
"""


def test_sigkill_at_random_points_of_push_commit_gc_and_repack(tmp_path):
    import random
    import signal
    import time

    from forker import Forker

    root = str(tmp_path / "store")
    LocalStore.init(root)
    _files(tmp_path / "base", n=1, size=1000)
    Store(root).push([str(tmp_path / "base")], "cdc://ds/")
    rng = random.Random(11)
    acked, died = [], []
    kills = 0
    # each worker is forked from a process that has imported cdcstore already, so that every kill
    # lands in the work (an iteration is ~0.15-0.3 s: 0.6 s spans all of push, commit, gc and
    # repack) and no time goes to importing (the worker used to start a fresh interpreter)
    with Forker(tmp_path, preload=("cdcstore", "cdcstore.storage.maintenance")) as fk:
        for seed in range(KILLS):
            p = fk.run([root, str(seed)], code=KILLED_WORKER)
            time.sleep(rng.random() * 0.6)  # somewhere in a push, commit, gc or repack
            p.send_signal(signal.SIGKILL)
            if p.wait() == -signal.SIGKILL:
                kills += 1
            else:
                died.append((seed, p.returncode, p.stderr()[-2000:]))
            acked += [line.split() for line in p.stdout().splitlines() if line.strip()]
    assert kills >= KILLS * 0.9 and not [d for d in died if d[1] != 0], died  # a worker that failed says why
    s = Store(root)
    report = s.check(read_data=True)
    assert report["problems"] == [], report
    for commit, path, head in acked:
        assert s.cat(f"cdc://ds@{commit}/{path}").hex()[:16] == head
    r = gc(LocalStore(root), grace=0, repack_dead=0.2)  # what the kills left is garbage a gc removes
    assert r["deleted"] and s.check(read_data=True)["problems"] == []
    for commit, path, head in acked:
        assert s.cat(f"cdc://ds@{commit}/{path}").hex()[:16] == head
    print(f"sigkill: {kills} kills, {len(acked)} acknowledged commits all read back")


def test_a_server_that_drops_connections_mid_body_loses_nothing(tmp_path, server):
    """Pushes and reads through a proxy that cuts its first 15 connections somewhere mid-stream: every push
    either lands whole or fails cleanly, what was acknowledged reads back, `check --read-data`
    is clean and the next push sends only what never landed."""
    proxy = FaultProxy(server.port, cuts=15, seed=5)  # cuts each of its first 15 connections once
    acked, failed = {}, 0
    try:
        with Store(proxy.url, cache=False, backoff=0.02) as s:
            for i in range(6):
                files = _files(tmp_path / f"v{i}", n=3, size=700_000, seed=100 + i)
                try:
                    cid = s.push([str(tmp_path / f"v{i}")], f"cdc://ds/v{i}/").commit
                except CdcError:
                    failed += 1
                    continue
                acked[cid] = {f"v{i}/{k}": v for k, v in files.items()}
                last = i
            for cid, files in acked.items():
                for path, data in files.items():
                    assert s.cat(f"cdc://ds@{cid}/{path}") == data
    finally:
        proxy.close()
    assert proxy.cut >= 5 and len(acked) >= 3, (proxy.cut, proxy.connections, len(acked), failed)
    with Store(server.url) as direct:
        assert direct.check(read_data=True)["problems"] == []
        for cid, files in acked.items():
            for path, data in files.items():
                assert direct.cat(f"cdc://ds@{cid}/{path}") == data
        again = direct.push([str(tmp_path / f"v{last}")], "cdc://ds/again/")
        assert again.new_bytes == 0  # what landed is reused, not sent again
    print(f"cut {proxy.cut} of {proxy.connections} connections; {len(acked)} pushes acknowledged, {failed} failed")


KILLED_FIRST_PUSH = """
import os, signal, sys
from cdcstore import Store
from cdcstore.storage import refs
def killed(self, *a, **k):  # the moment between the commit object and the branch that names it
    os.kill(os.getpid(), signal.SIGKILL)
refs.Refs.update_branch = killed
Store(sys.argv[1]).push([sys.argv[2]], "cdc://newrepo/a.bin", message="never lands")
"""


@pytest.mark.parametrize("location", ["dir", "bucket"])
def test_a_first_push_killed_before_its_branch_leaves_gc_working(location, tmp_path, request):
    """A repo's first push SIGKILLed after its commit object and before its branch: the repo held
    commits and no ref, and every gc after refused ("the listing shows commits of repo ... but no
    branch or tag": issue 43's case 7, refs lost under kills). Nothing was acknowledged, so nothing
    was lost: the root commit's landing marker says so, gc runs, and the repo can be pushed again."""
    import subprocess
    import sys
    if location == "bucket":
        request.getfixturevalue("s3_env")
        from conftest import S3_BUCKET
        import secrets
        url = f"s3://{S3_BUCKET}/killed-{secrets.token_hex(4)}"
    else:
        url = str(tmp_path / "store")
    s = Store.init(url)
    (tmp_path / "a.bin").write_bytes(os.urandom(100_000))
    s.push([str(tmp_path / "a.bin")], "cdc://other/a.bin")  # another repo, with a branch
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", KILLED_FIRST_PUSH, url, str(tmp_path / "a.bin")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr[-2000:]
    objects = Store(url).backend.uncached().objects
    assert list(objects.list("repos/newrepo/commits/")) and not list(objects.list("repos/newrepo/branches/"))
    out = Store(url).gc()  # before: CorruptionError, gc deleted nothing
    assert "delete_packs" in out
    assert Store(url).push([str(tmp_path / "a.bin")], "cdc://newrepo/a.bin").commit
    assert Store(url).cat("cdc://newrepo/a.bin") == (tmp_path / "a.bin").read_bytes()
    assert Store(url).gc()["delete_packs"] == 0 and Store(url).check()["problems"] == []
    Store(url).gc(grace=0)  # the never-landed commit goes, and its marker after it
    assert list(objects.list("repos/newrepo/landing/")) == []

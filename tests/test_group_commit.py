"""Group commit (issue 46): writes to one branch that arrive while a commit of it is being made land
together as one commit, each acknowledged only once that commit landed; conditional writes keep their
exact meaning inside a group. Real repositories (a directory store), real threads, the S3 gateway's
write path (`publish.Publisher`) and boto3 through a real `cdcstore serve`."""
import os
import threading
import time

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from cdcstore import Store
from cdcstore.engine.groups import GroupCommits
from cdcstore.publish import Publisher
from cdcstore.storage.repository import LocalStore, open_repository
from cdcstore.testing import ServerProcess, free_port


def _entry(store: Store, tmp_path, name: str, data: bytes):
    path = tmp_path / f"src-{name.replace('/', '_')}"
    path.write_bytes(data)
    return store.upload([str(path)], f"cdc://r/{name}")[name]


@pytest.fixture
def held(tmp_path, monkeypatch):
    """A Publisher over a new store whose first group commit waits until released: writes arriving
    meanwhile queue, so the next group holds them all (what a slow commit does under load)."""
    root = str(tmp_path / "s")
    LocalStore.init(root)
    Store(root).push([str(_seed(tmp_path))], "cdc://r/seed.bin")
    pub = Publisher(open_repository(root))
    gate, entered = threading.Event(), threading.Event()
    real = GroupCommits._commit_group
    first = [True]

    def slow(self, *a, **kw):
        if first[0]:
            first[0] = False
            entered.set()
            gate.wait(30)
        return real(self, *a, **kw)

    monkeypatch.setattr(GroupCommits, "_commit_group", slow)
    return root, pub, gate, entered


@pytest.fixture
def lake(tmp_path):
    """(store root, boto3 client with a pool of 16) of a real `cdcstore serve --s3-port` on a new
    directory store, open on loopback, with a bucket `lake`."""
    root = str(tmp_path / "srv")
    LocalStore.init(root)
    port = free_port()
    srv = ServerProcess(root, "--s3-port", str(port)).start()
    try:
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="x",
                          aws_secret_access_key="x", region_name="us-east-1",
                          config=Config(max_pool_connections=16, retries={"max_attempts": 1}))
        s3.create_bucket(Bucket="lake")
        yield root, s3
    finally:
        srv.stop()


def _seed(tmp_path):
    p = tmp_path / "seed.bin"
    p.write_bytes(b"seed")
    return p


def _queued(pub, n: int) -> None:
    """Until `n` writes wait in the branch's queue (behind the held commit)."""
    for _ in range(3000):
        if len(pub._groups._queues.get(("r", "main", "w"), [])) >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"{n} writes never queued")


def _run(fn, *args):
    out = {}

    def go():
        try:
            out["ok"] = fn(*args)
        except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
            out["err"] = e
    t = threading.Thread(target=go)
    t.start()
    return t, out


def test_writes_during_a_commit_land_as_one_group_each_acknowledged_after_it(held, tmp_path):
    root, pub, gate, entered = held
    s = Store(root)
    first = _run(pub.commit, "r", "main", {"a0.bin": _entry(s, tmp_path, "a0.bin", b"0")}, [], "PUT a0", "w")
    assert entered.wait(30)
    rest = [_run(pub.commit, "r", "main", {f"a{i}.bin": _entry(s, tmp_path, f"a{i}.bin", b"%d" % i)}, [],
                 f"PUT a{i}", "w") for i in range(1, 9)]
    _queued(pub, 8)  # the eight wait behind the held commit
    assert all("ok" not in out and "err" not in out for _, out in rest)  # none acknowledged before landing
    gate.set()
    for t, _ in [first, *rest]:
        t.join(60)
    ids = {out["ok"] for _, out in rest}
    assert len(ids) == 1 and first[1]["ok"] not in ids  # one commit for the eight, acknowledged with its id
    log = Store(root).log("r", "main")
    assert len(log) == 3 and log[0]["message"].startswith("8 writes: PUT a1")
    assert [Store(root).cat(f"cdc://r/a{i}.bin") for i in range(9)] == [b"%d" % i for i in range(9)]


def test_create_only_writes_in_one_group_have_one_winner(held, tmp_path):
    """Four create-only writes of one key and a plain write, all in one group: exactly one creator
    wins (the first to arrive in the group), the others get FileExistsError (412 at the gateway), the plain
    write lands, and a create-only write of a key the head holds fails too."""
    root, pub, gate, entered = held
    s = Store(root)
    first = _run(pub.commit, "r", "main", {"x.bin": _entry(s, tmp_path, "x.bin", b"x")}, [], "PUT x", "w")
    assert entered.wait(30)
    racers = [_run(pub.commit, "r", "main", {"k.bin": _entry(s, tmp_path, f"k{i}", b"k%d" % i)}, [],
                   f"PUT k {i}", "w", {"k.bin": None}) for i in range(4)]
    plain = _run(pub.commit, "r", "main", {"p.bin": _entry(s, tmp_path, "p.bin", b"p")}, [], "PUT p", "w")
    seed = _run(pub.commit, "r", "main", {"seed.bin": _entry(s, tmp_path, "seed2", b"no")}, [], "PUT seed", "w",
                {"seed.bin": None})
    _queued(pub, 6)
    gate.set()
    for t, _ in [first, *racers, plain, seed]:
        t.join(60)
    won = [i for i, (_, out) in enumerate(racers) if "ok" in out]
    assert len(won) == 1, [out for _, out in racers]
    assert all(isinstance(out["err"], FileExistsError) for i, (_, out) in enumerate(racers) if i != won[0])
    assert isinstance(seed[1]["err"], FileExistsError) and plain[1]["ok"] == racers[won[0]][1]["ok"]
    after = Store(root)
    assert after.cat("cdc://r/k.bin") == b"k%d" % won[0] and after.cat("cdc://r/p.bin") == b"p"
    assert after.cat("cdc://r/seed.bin") == b"seed"


def test_concurrent_puts_through_the_gateway_take_fewer_commits(lake):
    """32 PUTs from 8 threads of one client through a real server's S3 gateway: every one answered
    200 and read back; the branch took fewer commits than writes (one a PUT before)."""
    root, s3 = lake
    blobs = {f"main/z/c{i:02d}": os.urandom(2000 + i) for i in range(32)}
    errors = []

    def put(keys):
        for k in keys:
            try:
                s3.put_object(Bucket="lake", Key=k, Body=blobs[k])
            except ClientError as e:
                errors.append(e)
    threads = [threading.Thread(target=put, args=(list(blobs)[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    with Store(root) as st:
        for k, v in blobs.items():
            assert st.cat(f"cdc://lake/{k.split('/', 1)[1]}") == v
        commits = len(st.log("lake", "main")) - 1  # less the bucket's creation
    print(f"32 PUTs from 8 threads: {commits} commits")
    assert commits < 32


def test_a_job_lands_by_a_marker_that_is_no_file(lake):
    """A write session through the gateway without a file left in the data: writes under
    BRANCH@JOB/ are staged (nothing visible), and a PUT of BRANCH@JOB/.cdc-land lands them as ONE
    commit; `.cdc-land` itself is not stored (`_SUCCESS`, the other marker, stays in the data)."""
    root, s3 = lake
    for name in ("a.bin", "b.bin"):
        s3.put_object(Bucket="lake", Key=f"main@run1/arr/{name}", Body=name.encode())
    assert "Contents" not in s3.list_objects_v2(Bucket="lake", Prefix="main/")  # nothing visible yet
    r = s3.put_object(Bucket="lake", Key="main@run1/.cdc-land", Body=b"")
    landed = r["ResponseMetadata"]["HTTPHeaders"].get("x-cdc-commit")
    empty = s3.put_object(Bucket="lake", Key="main@nothing/.cdc-land", Body=b"")  # an empty job: no commit
    assert "x-cdc-commit" not in empty["ResponseMetadata"]["HTTPHeaders"]
    with Store(root) as st:
        assert sorted(e["name"] for e in st.ls("cdc://lake/", recursive=True)) == ["arr/a.bin", "arr/b.bin"]
        log = st.log("lake", "main")
        assert len(log) == 2 and log[0]["commit"] == landed  # the bucket's creation, then the job
        assert st.cat("cdc://lake/arr/b.bin") == b"b.bin"

"""Parallel writers that all land: disjoint commits are rebased onto a moved head,
overlapping ones conflict naming the paths, and a retried commit is recognised."""
import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest
from aiohttp import web, ClientSession

from cdcstore import Store
from cdcstore.core.commit import FileEntry, changes, rebase_files
from cdcstore.core.errors import ConflictError

ROUNDS_LOCAL = 20
ROUNDS_REMOTE = 20


def E(m):
    return FileEntry(m * 32, 1)


def test_rebase_files_pure():
    base = {"a/1": E("a"), "b/1": E("b")}
    ours = changes(base, {**base, "a/2": E("c")})
    head = {**base, "b/2": E("d")}
    files, overlap = rebase_files(ours, {"b/2"}, head)
    assert overlap == [] and files == {"a/1": E("a"), "a/2": E("c"), "b/1": E("b"), "b/2": E("d")}
    ours = changes(base, {"a/1": E("e")})  # changes a/1, removes b/1
    assert rebase_files(ours, {"b/1"}, base) == (None, ["b/1"])
    ours = changes(base, {**base, "x": E("f")})
    assert rebase_files(ours, {"x/y"}, {**base, "x/y": E("f")}) == (None, ["x"])  # file/folder clash


def _push(store, src, dest):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.Popen([sys.executable, "-m", "cdcstore", "push", src, dest, "--store", store],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _rounds(tmp_path, location, rounds):
    """`rounds` rounds of 3 `cdcstore push` processes at once; the processes are forked from a
    Python that has imported cdcstore (tests/forker.py), so they start together in ~10 ms instead
    of ~0.5 s of interpreter start and import each: the rounds race harder and cost less."""
    from forker import Forker

    src = []
    for w in range(3):
        d = tmp_path / f"src{w}"
        d.mkdir()
        src.append(d)
    t0 = time.perf_counter()
    with Forker(tmp_path) as fk:
        for r in range(rounds):
            for w, d in enumerate(src):
                (d / f"f{r}.bin").write_bytes(os.urandom(2000) + f"{r}-{w}".encode())
            procs = [fk.run(["push", str(d / f"f{r}.bin"), f"cdc://ds/w{w}/", "--store", location],
                            module="cdcstore") for w, d in enumerate(src)]
            for p in procs:
                assert p.wait() == 0, p.stderr()
    seconds = time.perf_counter() - t0
    with Store(location, cache=False) as s:
        files = {e["name"] for e in s.ls("cdc://ds/", recursive=True)}
    assert files == {f"w{w}/f{r}.bin" for w in range(3) for r in range(rounds)}
    print(f"{rounds} rounds x 3 parallel pushes to {location[:4]}: {seconds:.1f} s")


def test_parallel_cli_pushes_local(tmp_path, store):
    _rounds(tmp_path, store.location, ROUNDS_LOCAL)


def test_parallel_cli_pushes_remote(tmp_path, server):
    _rounds(tmp_path, server.url, ROUNDS_REMOTE)


def test_same_path_conflict_names_path(tmp_path, store):
    srcs = []
    for w in range(3):
        f = tmp_path / f"same{w}.bin"
        f.write_bytes(os.urandom(3000))
        srcs.append(str(f))
    store.push(srcs[0], "cdc://ds/x.bin")
    procs = [_push(store.location, s, "cdc://ds/x.bin") for s in srcs]
    results = [(p.wait(60), p.communicate()[1].decode()) for p in procs]
    losers = [err for rc, err in results if rc != 0]
    assert all("x.bin" in err and "Traceback" not in err for err in losers), losers
    assert len(losers) <= 2


class _DropFirstCommitAnswer:
    """A loopback proxy that forwards every request but drops the answer to the
    first commit POST (the server handled it; the client never hears)."""

    def __init__(self, target: str, before_commit=None):
        self.target = target
        self.before_commit = before_commit  # run before forwarding the first commit POST
        self.dropped = 0
        self.commit_posts = 0
        self.started = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self.started.wait(10)

    def _run(self):
        self.loop = asyncio.new_event_loop()
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self.started.set()
        self.loop.run_forever()

    async def handle(self, request):
        body = await request.read()
        is_commit = request.method == "POST" and request.path.endswith("/commits")
        if is_commit and not self.commit_posts and self.before_commit:
            await asyncio.get_running_loop().run_in_executor(None, self.before_commit)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with ClientSession() as s:
            async with s.request(request.method, self.target + request.path_qs, data=body, headers=headers) as r:
                payload = await r.read()
                status, ctype = r.status, r.headers.get("Content-Type")
        if is_commit:
            self.commit_posts += 1
            if not self.dropped:
                self.dropped += 1
                request.transport.close()  # the answer is lost
                return web.Response(status=500)
        return web.Response(body=payload, status=status, headers={"Content-Type": ctype} if ctype else None)


@pytest.mark.parametrize("moved", [False, True])
def test_lost_commit_answer_is_recognised(tmp_path, server, moved):
    with Store(server.url, cache=False) as direct:
        (tmp_path / "base.bin").write_bytes(b"base" * 100)
        direct.push(str(tmp_path / "base.bin"), "cdc://ds/base.bin")
        (tmp_path / "other.bin").write_bytes(b"other" * 100)

        def other_writer():  # moves the head under our commit: it is rebased, then the answer lost
            direct.push(str(tmp_path / "other.bin"), "cdc://ds/other/o.bin")

        proxy = _DropFirstCommitAnswer(server.url, other_writer if moved else None)
        (tmp_path / "mine.bin").write_bytes(os.urandom(5000))
        with Store(proxy.url, cache=False, backoff=0.05) as s:
            res = s.push(str(tmp_path / "mine.bin"), "cdc://ds/mine/m.bin")
        assert proxy.dropped == 1 and proxy.commit_posts == 2
        log = direct.log("ds")
        assert res.commit == log[0]["commit"]
        assert len(log) == (3 if moved else 2)  # one landed commit, not two
        assert log[0]["parent"] == log[1]["commit"]
        names = {e["name"] for e in direct.ls("cdc://ds/", recursive=True)}
        assert "mine/m.bin" in names


def test_pyarrow_write_dataset_partitions_all_land(server):
    import fsspec
    import pyarrow as pa
    import pyarrow.dataset as ds

    fs = fsspec.filesystem("cdc", store=server.url, cache=False, skip_instance_cache=True)
    table = pa.table({"part": [i % 4 for i in range(400)], "x": list(range(400))})
    ds.write_dataset(table, "repo/ds", filesystem=fs, format="parquet",
                     partitioning=ds.partitioning(pa.schema([("part", pa.int64())]), flavor="hive"),
                     use_threads=True)
    with Store(server.url, cache=False) as s:
        names = [e["name"] for e in s.ls("cdc://repo/ds/", recursive=True)]
    assert len(names) == 4 and {n.split("/")[1] for n in names} == {f"part={i}" for i in range(4)}


def test_dask_to_parquet_processes_all_land(server):
    dask = pytest.importorskip("dask")
    dd = pytest.importorskip("dask.dataframe")
    import pandas as pd

    df = dd.from_pandas(pd.DataFrame({"x": range(600)}), npartitions=6)
    with dask.config.set(scheduler="processes", num_workers=2):
        df.to_parquet("cdc://repo/x", storage_options={"store": server.url, "cache": False},
                      write_metadata_file=False)
    with Store(server.url, cache=False) as s:
        names = [e["name"] for e in s.ls("cdc://repo/x/", recursive=True)]
    assert len(names) == 6, names
    back = dd.read_parquet("cdc://repo/x", storage_options={"store": server.url, "cache": False}).compute()
    assert sorted(back["x"]) == list(range(600))


def _fs(location, **kw):
    import fsspec

    return fsspec.filesystem("cdc", store=location, cache=False, skip_instance_cache=True, **kw)


def test_fs_put_folder_is_one_commit(tmp_path, store):
    d = tmp_path / "up"
    (d / "sub").mkdir(parents=True)
    for i in range(4):
        (d / "sub" / f"{i}.txt").write_bytes(b"x%d" % i)
    (d / "top.txt").write_bytes(b"top")
    fs = _fs(store.location)
    fs.put(str(d) + "/", "ds/up", recursive=True)
    assert len(store.log("ds")) == 1
    assert len(store.ls("cdc://ds/up/", recursive=True)) == 5


def test_fs_copy_and_mv_reuse_manifests(store):
    fs = _fs(store.location)
    fs.pipe("ds/a/one.bin", os.urandom(4000))
    fs.pipe("ds/a/two.bin", os.urandom(4000))
    before = store.stats()["pack_bytes"]
    fs.copy("ds/a", "ds/b", recursive=True)
    assert len(store.log("ds")) == 3  # one commit for the folder copy
    fs.mv("ds/a/one.bin", "ds/c/one.bin")
    assert len(store.log("ds")) == 4  # copy + remove is one commit
    fs.invalidate_cache()
    assert fs.cat("ds/b/one.bin") == fs.cat("ds/c/one.bin") and not fs.exists("ds/a/one.bin")
    assert store.stats()["pack_bytes"] == before  # no data written


def test_fs_open_xb_and_discard_on_error(store):
    fs = _fs(store.location)
    with fs.open("ds/new.bin", "xb") as f:
        f.write(b"first")
    with pytest.raises(FileExistsError):
        fs.open("ds/new.bin", "xb")
    with pytest.raises(RuntimeError):
        with fs.open("ds/partial.bin", "wb") as f:
            f.write(b"half")
            raise RuntimeError("boom")
    fs.invalidate_cache()
    assert not fs.exists("ds/partial.bin") and len(store.log("ds")) == 1


def test_fs_rm_inside_transaction_is_one_commit(store):
    fs = _fs(store.location)
    fs.pipe("ds/old.bin", b"old")
    with fs.transaction:
        fs.rm("ds/old.bin")
        with fs.open("ds/new.bin", "wb") as f:
            f.write(b"new")
        assert fs.exists("ds/old.bin")  # nothing committed yet
    log = store.log("ds")
    assert len(log) == 2
    assert [e["name"] for e in store.ls("cdc://ds/")] == ["new.bin"]


def test_fs_branch_head_refreshes_after_ttl(store, tmp_path):
    fs = _fs(store.location, head_ttl=0.2)
    fs.pipe("ds/v.txt", b"v1")
    assert fs.cat("ds/v.txt") == b"v1"
    (tmp_path / "v.txt").write_bytes(b"v2")
    store.push(str(tmp_path / "v.txt"), "cdc://ds/v.txt")  # another writer
    pinned = store.log("ds")[1]["commit"]
    assert fs.cat(f"ds@{pinned}/v.txt") == b"v1"
    time.sleep(0.3)
    assert fs.cat("ds/v.txt") == b"v2"
    assert fs.cat(f"ds@{pinned}/v.txt") == b"v1"


def test_fs_not_implemented_has_message(store):
    fs = _fs(store.location)
    for name in ("cp_file", "mv", "copy", "put"):
        assert getattr(type(fs), name) is not getattr(__import__("fsspec").AbstractFileSystem, name)
    with pytest.raises(ValueError, match="mode"):
        fs.open("ds/x", "ab")


def test_push_sessions_sharing_one_remote_store_wait_for_their_own_packs(server, tmp_path):
    """Threads pushing through one Store (as fs and pyarrow's write_dataset do): a session's
    manifests never go out before its packs, even when another session flushed meanwhile."""
    import concurrent.futures as cf

    files = []
    for i in range(6):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(os.urandom(3 << 20))
        files.append(p)
    with Store(server.url, cache=False) as s:
        for rnd in range(4):
            with cf.ThreadPoolExecutor(6) as pool:
                futs = [pool.submit(s.push, [str(p)], f"cdc://r/{rnd}/{p.name}") for p in files]
                for f in futs:
                    f.result()  # a lost race raises RemoteError 409 "chunks ... not on the server"
        assert len(s.ls("cdc://r/", recursive=True)) == 24


def test_threads_pushing_through_one_remote_store_all_land(tmp_path, server):
    """Sessions in threads sharing one RemoteStore each wait for their OWN pack uploads
    (a backend-wide flush emptied by another thread let a manifest go out before its
    packs: "409: N chunks named by the manifests are not on the server")."""
    from concurrent.futures import ThreadPoolExecutor

    from cdcstore.engine.ingest import IngestOptions

    opts = IngestOptions(max_pack_bytes=64 << 10, workers=1)
    files = []
    for i in range(16):
        f = tmp_path / f"f{i}.bin"
        f.write_bytes(os.urandom((i % 4 + 1) * 40_000))
        files.append(f)
    with Store(server.url, cache=False) as s:
        def one(i):
            return s.upload(str(files[i]), f"cdc://ds/t/f{i}.bin", options=opts)

        for r in range(6):
            for f in files:  # new bytes each round: every session uploads packs
                f.write_bytes(os.urandom(len(f.read_bytes())))
            with ThreadPoolExecutor(16) as pool:
                parts = list(pool.map(one, range(16)))
            s.commit_entries("cdc://ds/", parts)
        assert {e["name"] for e in s.ls("cdc://ds/t/")} == {f"t/f{i}.bin" for i in range(16)}
        assert all(s.cat(f"cdc://ds/t/f{i}.bin") == files[i].read_bytes() for i in range(16))

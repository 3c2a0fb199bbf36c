"""`cdcstore mount` (issue 48): a revision as a read-only folder, through the real CLI, real libfuse 3
and the real kernel. Every tool reads it as a folder: os, cmp-style byte checks, pyarrow by path.

The session installs Debian's fuse3 with apt-get when fusermount3 is missing (as the browser tests
do with chromium); where that cannot run, the tests fail saying why, never skip."""
import errno
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import mount
from cdcstore.api import Store
from cdcstore.core import treeobj
from cdcstore.core.commit import FileEntry
from cdcstore.testing import ServedStore

CLI = [sys.executable, "-m", "cdcstore"]


@pytest.fixture(scope="session", autouse=True)
def fuse3():
    """fusermount3 and /dev/fuse (apt-get install fuse3 where fusermount3 is missing)."""
    if shutil.which("fusermount3") is None:
        apt = shutil.which("apt-get")
        if apt is None or os.geteuid() != 0:
            pytest.fail("the mount tests need fusermount3: `apt-get install -y fuse3` (as root; this machine "
                        f"has {'no apt-get' if apt is None else 'no root'})")
        got = subprocess.run([apt, "install", "-y", "--no-install-recommends", "fuse3"], capture_output=True,
                             text=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if got.returncode != 0:
            pytest.fail(f"apt-get install fuse3 failed: {got.stderr[-400:]}")
    if not os.path.exists("/dev/fuse"):
        pytest.fail("the mount tests need /dev/fuse (a FUSE-capable kernel; in a container: --device /dev/fuse)")


def cli(*args, env=None, check=True):
    got = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)
    if check and got.returncode != 0:
        raise AssertionError(f"cdcstore {' '.join(args)}: {got.stderr}")
    return got


class Mounted:
    """`cdcstore mount ... --background` on a fresh folder; unmounted (lazily, if need be) at the end."""

    def __init__(self, tmp_path, addr, store, *extra, env=None, name="mnt"):
        self.path = tmp_path / name
        self.path.mkdir()
        self.log = tmp_path / f".{name}.cdcstore-mount.log"
        cli("mount", addr, str(self.path), "--store", store, "--background", "-q", *extra, env=env)
        assert os.path.ismount(self.path)

    def pid(self) -> int:
        out = subprocess.run(["pgrep", "-f", f"cdcstore mount .* {self.path} "], capture_output=True, text=True)
        return int(out.stdout.split()[0])

    def close(self):
        if os.path.ismount(self.path):
            got = cli("unmount", str(self.path), check=False)
            if got.returncode != 0:
                cli("unmount", "--lazy", str(self.path))
        deadline = time.monotonic() + 20
        while os.path.ismount(self.path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.ismount(self.path)


@pytest.fixture
def data(tmp_path):
    src = tmp_path / "data"
    (src / "sub" / "deep").mkdir(parents=True)
    n = 50_000
    pq.write_table(pa.table({"id": list(range(n)), "x": [i * 0.5 for i in range(n)],
                             "s": [f"row-{i % 977}" for i in range(n)]}), src / "sub" / "t.parquet",
                   row_group_size=10_000)
    (src / "a.bin").write_bytes(os.urandom(3_000_000))
    (src / "sub" / "deep" / "small.txt").write_text("hello\n")
    (src / "empty.txt").write_bytes(b"")
    store = str(tmp_path / "store")
    s = Store.init(store)
    cid = s.push([str(src) + "/"], "cdc://ds/", message="v1").commit
    s.tag("ds", "v1")
    s.close()
    return src, store, cid


def test_a_tag_mounts_as_a_folder_every_tool_reads(tmp_path, data):
    src, store, cid = data
    m = Mounted(tmp_path, "cdc://ds@v1/", store)
    try:
        root = m.path
        assert sorted(os.listdir(root)) == ["a.bin", "empty.txt", "sub"]
        assert sorted(os.listdir(root / "sub")) == ["deep", "t.parquet"]
        for rel in ("a.bin", "sub/t.parquet", "sub/deep/small.txt", "empty.txt"):
            st = os.stat(root / rel)
            assert st.st_size == os.path.getsize(src / rel)
            assert (root / rel).read_bytes() == (src / rel).read_bytes(), rel
        assert os.stat(root / "sub").st_mode & 0o170000 == 0o040000
        # exact random reads: pyarrow reads the footer and one column by path
        t = pq.read_table(root / "sub" / "t.parquet", columns=["s"])
        assert t.column("s").to_pylist() == pq.read_table(src / "sub" / "t.parquet", columns=["s"]).column("s").to_pylist()
        with open(root / "a.bin", "rb") as f:
            f.seek(2_999_000)
            assert f.read(5000) == (src / "a.bin").read_bytes()[2_999_000:]
        # the connection's read-ahead is raised where the mount may (root): requests of 1 MiB
        dev = os.stat(root).st_dev
        knob = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        if os.access(knob, os.W_OK):
            assert int(open(knob).read()) == mount.READ_AHEAD >> 10
        # extended attributes name the commit and the file's manifest
        assert os.getxattr(root / "a.bin", "user.cdc.commit").decode() == cid
        assert os.getxattr(root / "sub/t.parquet", "user.cdc.address").decode() == f"cdc://ds@{cid}/sub/t.parquet"
        with Store(store) as s:
            entry = s.view("ds", s.get_commit("ds", cid)).get("a.bin")
        assert os.getxattr(root / "a.bin", "user.cdc.manifest").decode() == entry.manifest
        assert set(os.listxattr(root / "a.bin")) == {"user.cdc.commit", "user.cdc.address", "user.cdc.manifest"}
        # read-only, and what is not there is ENOENT
        with pytest.raises(OSError) as e:
            open(root / "a.bin", "r+b")
        assert e.value.errno in (errno.EROFS, errno.EACCES)
        with pytest.raises(OSError) as e:
            (root / "new.txt").write_text("x")
        assert e.value.errno in (errno.EROFS, errno.EACCES)
        assert not os.path.exists(root / "missing.bin")
        # many threads at once
        import concurrent.futures
        want = (src / "a.bin").read_bytes()

        def piece(i):
            with open(root / "a.bin", "rb") as f:
                f.seek(i * 100_003)
                return f.read(100_003) == want[i * 100_003:(i + 1) * 100_003]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert all(pool.map(piece, range(29)))
    finally:
        m.close()


def test_a_subfolder_mounts_and_a_file_or_a_missing_path_is_refused_clearly(tmp_path, data):
    _, store, _ = data
    m = Mounted(tmp_path, "cdc://ds@v1/sub", store)
    try:
        assert sorted(os.listdir(m.path)) == ["deep", "t.parquet"]
        assert (m.path / "deep" / "small.txt").read_text() == "hello\n"
    finally:
        m.close()
    target = tmp_path / "other"
    target.mkdir()
    got = cli("mount", "cdc://ds@v1/a.bin", str(target), "--store", store, "--background", check=False)
    assert got.returncode == 1 and "mount a folder" in got.stderr
    got = cli("mount", "cdc://ds@nope/", str(target), "--store", store, "--background", check=False)
    assert got.returncode == 1 and "nope" in got.stderr
    (target / "x").write_text("x")
    got = cli("mount", "cdc://ds@v1/", str(target), "--store", store, "--background", check=False)
    assert got.returncode == 1 and "not empty" in got.stderr
    got = cli("unmount", str(target), check=False)
    assert got.returncode == 1 and "not mounted" in got.stderr


def test_a_branch_mount_follows_its_head_and_an_open_file_keeps_its_version(tmp_path, data):
    src, store, _ = data
    m = Mounted(tmp_path, "cdc://ds/", store, "--refresh", "0.5")
    try:
        before = (src / "a.bin").read_bytes()
        held = open(m.path / "a.bin", "rb")
        assert held.read(1000) == before[:1000]
        after = os.urandom(2_000_000)
        (src / "a.bin").write_bytes(after)
        (src / "added.txt").write_text("new\n")
        with Store(store) as s:
            s.push([str(src) + "/"], "cdc://ds/", message="v2")
        deadline = time.monotonic() + 10
        while "added.txt" not in os.listdir(m.path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (m.path / "added.txt").read_text() == "new\n"
        assert (m.path / "a.bin").read_bytes() == after
        assert held.read() == before[1000:]  # opened before the move: its own version to the end
        held.close()
    finally:
        m.close()


def test_a_damaged_chunk_is_eio_never_wrong_bytes(tmp_path, data):
    src, store, _ = data
    packs = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(store, "packs")) for f in fs]
    with Store(store) as s:
        cid = s.resolve("cdc://ds@v1/")[0]
    for p in packs:  # flip a byte in the middle of every pack (chunk bytes, not a footer)
        with open(p, "r+b") as f:
            size = os.path.getsize(p)
            f.seek(size // 3)
            b = f.read(1)
            f.seek(size // 3)
            f.write(bytes([b[0] ^ 0xFF]))
    m = Mounted(tmp_path, f"cdc://ds@{cid}/", store)
    try:
        with pytest.raises(OSError) as e:
            (m.path / "a.bin").read_bytes()
        assert e.value.errno == errno.EIO
        assert "does not match" in m.log.read_text() or "damaged" in m.log.read_text().lower() \
            or "corrupt" in m.log.read_text().lower()
    finally:
        m.close()


def test_a_dead_server_is_eio_in_bounded_time_and_the_mount_still_unmounts(tmp_path, data):
    src, _, _ = data
    srv = ServedStore(tmp_path / "served").start()
    try:
        with Store(srv.url, cache=False) as s:
            s.push([str(src) + "/"], "cdc://ds/", message="v1")
            s.tag("ds", "v1")
        env = {**os.environ, "CDCSTORE_TIMEOUT": "2", "CDCSTORE_CACHE": str(tmp_path / "cache.sqlite")}
        m = Mounted(tmp_path, "cdc://ds@v1/", srv.url, env=env)
        assert (m.path / "sub" / "deep" / "small.txt").read_text() == "hello\n"
        srv.kill()
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            (m.path / "a.bin").read_bytes()
        assert e.value.errno == errno.EIO
        assert time.monotonic() - t0 < 90
        assert sorted(os.listdir(m.path)) == ["a.bin", "empty.txt", "sub"]  # names come from the trees read
        m.close()  # unmounts with the store gone
    finally:
        srv.stop()


def test_ctrl_c_unmounts_a_foreground_mount(tmp_path, data):
    _, store, _ = data
    mnt = tmp_path / "fg"
    mnt.mkdir()
    proc = subprocess.Popen([*CLI, "mount", "cdc://ds@v1/", str(mnt), "--store", store, "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        assert os.listdir(mnt)
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        assert not os.path.ismount(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)])


def test_engines_with_readers_of_their_own_read_the_mount_by_path(tmp_path, data):
    """DuckDB and polars read Parquet with their own native readers (no fsspec): through the mount,
    by path, the same rows as the source."""
    import duckdb
    import polars as pl

    src, store, _ = data
    m = Mounted(tmp_path, "cdc://ds@v1/", store)
    try:
        mounted, local = str(m.path / "sub" / "t.parquet"), str(src / "sub" / "t.parquet")
        q = "SELECT count(*), sum(id), count(DISTINCT s) FROM read_parquet('{}')"
        assert duckdb.sql(q.format(mounted)).fetchall() == duckdb.sql(q.format(local)).fetchall()
        assert pl.read_parquet(mounted, columns=["x"]).equals(pl.read_parquet(local, columns=["x"]))
        assert pl.scan_parquet(str(m.path / "sub" / "*.parquet")).select(pl.len()).collect().item() == 50_000
    finally:
        m.close()


def test_table_formats_read_through_the_mount_with_their_own_readers(tmp_path):
    """delta-rs and Lance, which take no fsspec filesystem, read tables pushed to a store through a
    mounted tag by path: a Delta table of two versions (its log and time travel), and a Lance
    dataset (its manifests and fragments, memory-mapped)."""
    import deltalake
    import lance

    src = tmp_path / "tables"
    src.mkdir()
    t1 = pa.table({"id": list(range(1000)), "v": [i * 2 for i in range(1000)]})
    t2 = pa.table({"id": list(range(1000, 1500)), "v": [0] * 500})
    deltalake.write_deltalake(str(src / "delta"), t1)
    deltalake.write_deltalake(str(src / "delta"), t2, mode="append")
    lance.write_dataset(t1, str(src / "lance"))
    store = str(tmp_path / "store")
    with Store.init(store) as s:
        s.push([str(src) + "/"], "cdc://lake/", message="tables")
        s.tag("lake", "v1")
    m = Mounted(tmp_path, "cdc://lake@v1/", store)
    try:
        dt = deltalake.DeltaTable(str(m.path / "delta"))
        assert dt.version() == 1
        assert dt.to_pyarrow_table().sort_by("id").equals(pa.concat_tables([t1, t2]).sort_by("id"))
        assert deltalake.DeltaTable(str(m.path / "delta"), version=0).to_pyarrow_table().sort_by("id").equals(t1)
        assert lance.dataset(str(m.path / "lance")).to_table().sort_by("id").equals(t1)
    finally:
        m.close()


# -- a huge folder lists page by page (issue 48 item 4) --------------------------------------------
WIDE = 20_000
HOSTILE = ["with space.txt", "ünïcödé-名前.txt", "-rf", "*?[x]", "'q\"", " lead", "trail ", "...", ".hidden",
           "\u200bzw"]


@pytest.fixture
def wide(tmp_path):
    """A store (tmp_path/srv, for a ServedStore) whose folder `big` holds 20,000 entries, a split
    tree of some 800 nodes: five tiny files uploaded once and committed under every name in one
    commit (1 s; a push of 20,000 files takes 10), three subfolders and names a shell trips on.
    Returns (store, {path: entry}, the commit's time, its tree count, the trees from the root to
    big/f12345.txt's page)."""
    up = tmp_path / "up"
    up.mkdir()
    for k in range(5):
        (up / f"u{k}.txt").write_bytes(b"x" * (7 * k + 1))
    store = str(tmp_path / "srv")
    with Store.init(store) as s:
        files = list(s.upload([str(up) + "/"], "cdc://ds/u/").values())
        names = [f"f{i:05d}.txt" for i in range(WIDE - len(HOSTILE) - 3)] + HOSTILE
        entries = {f"big/{n}": files[i % 5] for i, n in enumerate(names)}
        entries.update({f"big/sub{i}/x.txt": files[1] for i in range(3)})
        s.commit_entries("cdc://ds/", entries, "wide")
        s.tag("ds", "v1")
        _, commit = s.resolve("cdc://ds@v1/")
        view = s.view("ds", commit)
        trees = sum(1 for _ in view.tree_ids())
        node, path = view.node(view.folder_id("big")), 2  # the root, big
        while node.slots is not None:
            node, path = view.node(node.slots[treeobj.name_digits("f12345.txt")[len(node.prefix)]].tree), path + 1
    return store, entries, commit.time, trees, path


def _tree_requests(srv) -> int:
    """Requests for trees the server has answered (a mount with a fresh machine cache asks for each
    tree it reads once): GET .../trees/ID, and POST .../trees/get (a batch)."""
    return len(re.findall(r'"(?:GET /\S*/trees/[0-9a-f]+|POST /\S*/trees/get) ', srv.log_text()))


def test_a_huge_folder_lists_page_by_page_and_a_lookup_reads_only_its_part(tmp_path, wide):
    """Through a server (each tree read is a request, counted in its log): a stat of one name in a
    folder of 20,000 reads only the split nodes and the page on its hash's path; a scandir stopped
    after 100 entries reads a few parts of the ~800; a whole listing gives every name once, exactly
    as stored, with its type, and attributes are those of the tree. `ls -R` of it, warm: timed."""
    store, entries, mtime, trees, path = wide
    names = {p.split("/")[1] for p in entries}
    with ServedStore(tmp_path) as srv:
        env = {**os.environ, "CDCSTORE_CACHE": str(tmp_path / "mount-cache.sqlite")}
        m = Mounted(tmp_path, "cdc://ds@v1/", srv.url, env=env)
        big = m.path / "big"
        try:
            at = _tree_requests(srv)
            st = os.stat(big / "f12345.txt")
            one = _tree_requests(srv) - at
            assert st.st_size == entries["big/f12345.txt"].size and st.st_mtime_ns == int(mtime * 1e9)
            assert 1 <= one <= path, (one, path)  # big's split nodes on the name's path and its page

            at = _tree_requests(srv)
            with os.scandir(big) as it:
                first = [e.name for _, e in zip(range(100), it)]
            early = _tree_requests(srv) - at
            assert len(set(first)) == 100 and set(first) <= names
            assert early <= trees // 25, (early, trees)  # a few parts, not the folder's ~800

            listed = os.listdir(big)
            whole = _tree_requests(srv) - at
            assert len(listed) == WIDE and set(listed) == names  # each name once, as stored
            assert {e.name for e in os.scandir(big) if e.is_dir(follow_symlinks=False)} == {"sub0", "sub1", "sub2"}
            for name in HOSTILE + [f"f{i:05d}.txt" for i in range(0, WIDE - 20, 997)]:
                st = os.stat(big / name)
                assert (st.st_size, st.st_mtime_ns, st.st_mode) == (entries[f"big/{name}"].size, int(mtime * 1e9),
                                                                    0o100444), name
            assert (big / "sub1" / "x.txt").read_bytes() == b"x" * 8

            seconds = []
            for _ in range(3):
                t0 = time.perf_counter()
                out = subprocess.run(["ls", "-R", str(m.path)], capture_output=True, text=True, check=True).stdout
                seconds.append(time.perf_counter() - t0)
            assert {n for n in names if not n.startswith(".")} <= set(out.splitlines())  # (ls hides dot names)
            print(f"folder of {WIDE}: stat of one name {one} tree requests (path {path}), scandir of 100 {early}, "
                  f"whole listing {whole} (of {trees} trees); ls -R {seconds[0]:.3f} s, warm {min(seconds[1:]):.3f} s")
        finally:
            m.close()


def test_every_position_of_a_split_folder_resumes_where_it_should():
    """The kernel resumes a listing at any position it was given: from each position, the entries
    are the whole listing's from there, and a position reads only the split nodes above it and
    the pages it needs."""
    files = {f"w/f{i:04d}": FileEntry(f"{i:064x}", i) for i in range(3000)}
    files.update({f"w/d{i}/x": FileEntry(f"{i + 9999:064x}", 1) for i in range(4)})
    root, nodes = treeobj.build(files)
    loads = []
    view = treeobj.View(lambda tid: loads.append(tid) or nodes[tid], root)
    tid = view.folder_id("w")
    whole = list(mount._entries(view, tid, 0))
    assert [n for n, _, _ in whole[:2]] == [".", ".."] and [at for _, _, at in whole] == list(range(1, 3007))
    assert sorted(n for n, _, _ in whole[2:]) == sorted(p.split("/")[1] for p in files)
    assert {n for n, mode, _ in whole if mode["st_mode"] & 0o040000} == {".", "..", "d0", "d1", "d2", "d3"}
    for at in range(len(whole) + 2):
        assert list(itertools.islice(mount._entries(view, tid, at), 3)) == whole[at:at + 3], at
    fresh = []
    view = treeobj.View(lambda tid: fresh.append(tid) or nodes[tid], root)
    later = list(itertools.islice(mount._entries(view, view.folder_id("w"), 2000), 30))
    assert later == whole[2000:2030]
    assert len(fresh) <= 1 + 5 + 2, len(fresh)  # the root, w's split nodes above, a page or two
    # with a batch loader (a server's), entering a split node reads the parts it will walk together
    batches = []
    view = treeobj.View(nodes.__getitem__, root,
                        load_many=lambda tids: batches.append(tids) or [nodes[t] for t in tids])
    assert list(mount._entries(view, view.folder_id("w"), 0)) == whole
    splits = sum(1 for t in nodes.values() if t.slots is not None)  # w's split nodes (the root is a page)
    assert len(batches) <= splits and sum(map(len, batches)) < len(nodes), (len(batches), splits)
    print(f"3,004 entries, {len(nodes)} trees: a whole listing in {len(batches)} batches ({splits} split nodes)")

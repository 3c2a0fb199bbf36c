"""One conformance suite for every object backend (cdcstore.storage): local directory,
in-memory, and S3 against moto's real S3 HTTP server on 127.0.0.1 (started once per
session). Each test runs over every backend through the `objects` fixture; `make`
builds another client of the same storage (another process or machine, in effect)."""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import pickle
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from cdcstore.storage import (AlreadyExists, Capabilities, Conflict, InvalidName, NotFound, ObjectStore,
                              StorageError, Unavailable, open_objects)
from cdcstore.storage import objects as objmod

BACKENDS = ["local", "memory", "s3-obstore", "s3-s3fs"]  # S3: both clients s3.py may pick
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "cdcstore-conformance"


@pytest.fixture
def make(request, tmp_path, monkeypatch):
    """A factory of clients of one fresh storage (each call: a new client, same objects)."""
    kind = request.param
    if kind == "local":
        root = tmp_path / "objects"
        root.mkdir()
        return lambda: open_objects(str(root))
    if kind == "memory":
        store = open_objects("memory://")
        return lambda: store
    endpoint = request.getfixturevalue("s3_endpoint")
    for k, v in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_REGION": "us-east-1", "CDCSTORE_S3_CLIENT": kind[3:]}.items():
        monkeypatch.setenv(k, v)
    url = f"s3://{BUCKET}/t-{secrets.token_hex(6)}"
    return lambda: open_objects(url)


@pytest.fixture
def objects(make) -> ObjectStore:
    s = make()
    yield s
    s.close()


def pytest_generate_tests(metafunc):
    if "make" in metafunc.fixturenames:
        kinds = getattr(metafunc.function, "backends", BACKENDS)
        metafunc.parametrize("make", kinds, indirect=True)


def only(*kinds):
    def mark(fn):
        fn.backends = list(kinds)
        return fn
    return mark


def blob(n: int, seed: int = 0) -> bytes:
    return bytes((i * 131 + seed) % 251 for i in range(n))


# -- basics -----------------------------------------------------------------------------------
def test_capabilities_are_declared(objects):
    caps = objects.capabilities
    assert isinstance(caps, Capabilities)
    with pytest.raises(Exception):
        caps.supports_ranges = False  # frozen
    objects.put("a/x", b"abc")
    path = objects.local_path("a/x")
    if caps.local_path:
        with open(path, "rb") as f:
            assert f.read() == b"abc"
    else:
        assert path is None


def test_put_get_stat_and_zero_bytes(objects):
    data = blob(10_000, 7)
    assert objects.put("packs/ab/one.pack", data) is True
    assert bytes(objects.get("packs/ab/one.pack")) == data
    info = objects.stat("packs/ab/one.pack")
    assert (info.name, info.size) == ("packs/ab/one.pack", len(data)) and info.token
    got, token = objects.get_with_token("packs/ab/one.pack")
    assert bytes(got) == data and token == info.token
    assert objects.put("empty", b"") is True
    assert bytes(objects.get("empty")) == b""
    assert objects.stat("empty").size == 0
    assert bytes(objects.get_range("empty", 0, 10)) == b""
    assert objects.exists("empty") and not objects.exists("nothing")


def test_put_is_create_only(objects):
    objects.put("m/x", b"first")
    with pytest.raises(AlreadyExists, match="already exists") as e:
        objects.put("m/x", b"second")
    assert isinstance(e.value, FileExistsError) and e.value.code == "already_exists"
    assert objects.put("m/x", b"first", exist_ok=True) is False  # content-named: fine
    assert bytes(objects.get("m/x")) == b"first"


def test_put_file(objects, tmp_path):
    """A finished file becomes an object (a local store links it: zero copy)."""
    data = blob(300_000, 11)
    src = objects.tmp_path() if hasattr(objects, "tmp_path") else str(tmp_path / "pack.tmp")
    with open(src, "wb") as f:
        f.write(data)
    assert objects.put_file("packs/cd/f.pack", src) is True
    if objects.capabilities.local_path:
        assert os.stat(objects.local_path("packs/cd/f.pack")).st_ino == os.stat(src).st_ino
    os.unlink(src)  # the caller removes its file: the object stays
    assert bytes(objects.get("packs/cd/f.pack")) == data
    other = tmp_path / "other.tmp"
    other.write_bytes(b"different")
    with pytest.raises(AlreadyExists):
        objects.put_file("packs/cd/f.pack", str(other))
    assert objects.put_file("packs/cd/f.pack", str(other), exist_ok=True) is False
    assert bytes(objects.get("packs/cd/f.pack")) == data
    import tempfile
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # another file system (where it is): copied
    with tempfile.NamedTemporaryFile(dir=shm) as far:
        far.write(b"far away")
        far.flush()
        assert objects.put_file("elsewhere", far.name) is True
    assert bytes(objects.get("elsewhere")) == b"far away"


def test_ranges_past_the_end_and_zero_length(objects):
    data = blob(1000, 3)
    objects.put("r", data)
    assert bytes(objects.get_range("r", 0, 10)) == data[:10]
    assert bytes(objects.get_range("r", 500, 1)) == data[500:501]
    assert bytes(objects.get_range("r", 990, 100)) == data[990:]  # short read at the end
    assert bytes(objects.get_range("r", 999, 1)) == data[999:]
    assert bytes(objects.get_range("r", 1000, 5)) == b""
    assert bytes(objects.get_range("r", 5000, 5)) == b""
    assert bytes(objects.get_range("r", 10, 0)) == b""
    for bad in ((-1, 5), (0, -1), (1.5, 2)):
        with pytest.raises(ValueError, match="byte range"):
            objects.get_range("r", *bad)


def test_a_missing_object_is_not_found_everywhere(objects):
    for call in (lambda: objects.get("no/such"), lambda: objects.get_with_token("no/such"),
                 lambda: objects.stat("no/such"), lambda: objects.get_range("no/such", 0, 10),
                 lambda: objects.get_range("no/such", 0, 0)):
        with pytest.raises(NotFound) as e:
            call()
        assert isinstance(e.value, FileNotFoundError) and e.value.code == "not_found"
        assert "no/such" in str(e.value)
    objects.put("dir/obj", b"x")
    with pytest.raises(NotFound):
        objects.get("dir")  # a folder on disk is not an object


def test_delete(objects):
    objects.put("d/x", b"1")
    objects.delete("d/x")
    with pytest.raises(NotFound):
        objects.get("d/x")
    objects.delete("d/x")  # absent: no error (deletes are retried)
    assert objects.put("d/x", b"2") is True
    assert bytes(objects.get("d/x")) == b"2"
    assert [i.name for i in objects.list("d")] == ["d/x"]


@pytest.mark.parametrize("name", ["", "/abs", "trail/", "a//b", "..", "../up", "a/../b", "a/./b", ".hidden",
                                  "a/.git", "sp ace", "tab\tx", "new\nline", "back\\slash", "ümlaut", "q?x",
                                  "star*", "x" * 256, "/".join(["abcd"] * 300), None, b"bytes"])
def test_odd_names_are_refused_clearly(objects, name):
    for call in (lambda: objects.put(name, b"x"), lambda: objects.get(name), lambda: objects.stat(name),
                 lambda: objects.put_if_absent(name, b"x"), lambda: objects.delete(name)):
        with pytest.raises(InvalidName, match="object name") as e:
            call()
        assert isinstance(e.value, ValueError) and e.value.code == "invalid_name"
    assert list(objects.list("")) == []


def test_bad_listing_prefix_is_refused(objects):
    for prefix in ("/a", "a//", "sp ace", "../", None):
        with pytest.raises(InvalidName, match="prefix"):
            list(objects.list(prefix))


def test_list_is_sorted_by_name_and_a_string_prefix(objects):
    names = ["a-c", "a.x", "a/b", "a/c/d", "ab", "b", "packs/0f/z.pack", "packs/ab/1.pack", "packs/ab/2.pack"]
    for i, n in enumerate(reversed(names)):
        objects.put(n, b"x" * i)
    listed = list(objects.list(""))
    assert [i.name for i in listed] == sorted(names)
    sizes = {n: i for i, n in enumerate(reversed(names))}
    assert all(i.size == sizes[i.name] for i in listed)
    assert [i.name for i in objects.list("a")] == ["a-c", "a.x", "a/b", "a/c/d", "ab"]
    assert [i.name for i in objects.list("a/")] == ["a/b", "a/c/d"]
    assert [i.name for i in objects.list("a/c")] == ["a/c/d"]
    assert [i.name for i in objects.list("packs/ab/")] == ["packs/ab/1.pack", "packs/ab/2.pack"]
    assert [i.name for i in objects.list("packs/a")] == ["packs/ab/1.pack", "packs/ab/2.pack"]
    assert [i.name for i in objects.list("zz")] == [] and [i.name for i in objects.list("b")] == ["b"]


def test_folders_are_the_next_name_component(objects):
    for n in ("repos/b/commits/1.json", "repos/a/branches/main", "repos/a/commits/2.json", "repos/c.txt",
              "repos-x/y", "top"):
        objects.put(n, b"x")
    assert objects.folders("repos/") == ["a", "b"]
    assert objects.folders("repos/a/") == ["branches", "commits"]
    assert objects.folders("") == ["repos", "repos-x"]
    assert objects.folders("repos/a/branches/") == [] and objects.folders("nothing/") == []
    with pytest.raises(InvalidName, match="end with '/'"):
        objects.folders("repos")


def test_listing_thousands_of_keys_pages(objects, monkeypatch, request):
    from cdcstore.storage import s3
    # obstore always asks 1000 keys a page: 1100 keys make it turn a page. s3fs asks s3.PAGE, so a
    # small PAGE gives it as many pages with fewer keys (its puts to moto cost ~15 ms each):
    # 300 keys / 40 a page, as 1500 / 200 before (8 pages for k/, 2 for k/3/)
    few = request.node.callspec.params["make"] == "s3-s3fs"
    monkeypatch.setattr(s3, "PAGE", 40)  # several pages against the server
    names = [f"k/{i % 7}/{i:05d}" for i in range(300 if few else 1100)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: objects.put(n, n.encode()), names))
    got = [i.name for i in objects.list("k/")]
    assert got == sorted(names)
    assert [i.name for i in objects.list("k/3/")] == sorted(n for n in names if n.startswith("k/3/"))
    assert objects.folders("k/") == [str(i) for i in range(7)]


# -- conditional writes -------------------------------------------------------------------------
def test_conditional_put_tokens(objects):
    t1 = objects.put_if_absent("refs/main", b"c1")
    assert t1 == objects.stat("refs/main").token == objects.get_with_token("refs/main")[1]
    with pytest.raises(Conflict) as e:
        objects.put_if_absent("refs/main", b"c2")
    assert isinstance(e.value, FileExistsError) and e.value.code == "conflict"
    t2 = objects.put_if_match("refs/main", b"c2", t1)
    assert t2 != t1 and bytes(objects.get("refs/main")) == b"c2"
    with pytest.raises(Conflict):
        objects.put_if_match("refs/main", b"c3", t1)  # stale token
    assert bytes(objects.get("refs/main")) == b"c2"
    with pytest.raises(Conflict):
        objects.put_if_match("refs/none", b"c3", t2)  # gone
    with pytest.raises(NotFound):
        objects.get("refs/none")


def test_racing_put_if_absent_has_one_winner_per_key(make):
    """16 clients x 20 keys, all at once: exactly one create wins each key, and the
    object holds the winner's bytes."""
    keys = [f"race/{k:02d}" for k in range(20)]
    clients = [make() for _ in range(16)]
    barrier = threading.Barrier(16)

    def run(i):
        barrier.wait()
        won = []
        for k in keys:
            try:
                clients[i].put_if_absent(k, f"{k}:{i}".encode())
                won.append(k)
            except Conflict:
                pass
        return i, won

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, range(16)))
    winners = {k: [i for i, won in results if k in won] for k in keys}
    assert all(len(w) == 1 for w in winners.values()), winners
    check = make()
    for k, (i,) in winners.items():
        assert bytes(check.get(k)) == f"{k}:{i}".encode()


def test_racing_put_if_match_loses_no_update(make):
    """8 clients increment one counter 6 times each by read, compare-and-swap, retry."""
    make().put_if_absent("counter", b"0")
    barrier = threading.Barrier(8)

    def run(_):
        s = make()
        barrier.wait()
        conflicts = 0
        for _ in range(6):
            while True:
                data, token = s.get_with_token("counter")
                try:
                    s.put_if_match("counter", str(int(bytes(data)) + 1).encode(), token)
                    break
                except Conflict:
                    conflicts += 1
        return conflicts

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(run, range(8)))
    assert bytes(make().get("counter")) == b"48"


_INCREMENTER = textwrap.dedent("""
    import sys
    from cdcstore.storage import Conflict, open_objects
    s = open_objects(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(int(sys.argv[2])):
        while True:
            data, token = s.get_with_token("counter")
            try:
                s.put_if_match("counter", str(int(bytes(data)) + 1).encode(), token)
                break
            except Conflict:
                pass
""")


@only("local", "s3-obstore", "s3-s3fs")
def test_processes_racing_put_if_match_lose_no_update(objects):
    """3 processes increment one counter 8 times each, released at once."""
    objects.put_if_absent("counter", b"0")
    procs = [subprocess.Popen([sys.executable, "-c", _INCREMENTER, objects.url, "8"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
             for _ in range(3)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    assert bytes(objects.get("counter")) == b"24"


# -- processes: killed writers, fork, pickling ------------------------------------------------------
_PUTTER = textwrap.dedent("""
    import sys
    from cdcstore.storage import open_objects
    s = open_objects(sys.argv[1])
    data = b"\\xab" * (int(sys.argv[3]) << 20)
    print("ready", flush=True)
    s.put(sys.argv[2], data)
    print("done", flush=True)
""")


@only("local", "s3-obstore", "s3-s3fs")
def test_a_put_killed_midway_leaves_no_partial_object(objects):
    """SIGKILL a process in the middle of a large put: the name is absent or complete,
    never partial; a local store's leftover temp file is cleaned away."""
    tmpdir = getattr(objects, "_tmpdir", None)  # local: kill once the temp file grows
    size_mb = 200 if tmpdir else 48
    proc = subprocess.Popen([sys.executable, "-c", _PUTTER, objects.url, "big/obj", str(size_mb)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 20
    while tmpdir and time.monotonic() < deadline and not _growing_file(objects.root):
        time.sleep(0.001)
    if not tmpdir:
        time.sleep(0.05)  # s3: into the upload
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    try:
        data = bytes(objects.get("big/obj"))
        assert data == b"\xab" * (size_mb << 20)  # the put finished before the kill: whole
    except NotFound:
        assert [i.name for i in objects.list("big")] == []
    if tmpdir:
        assert objects.clean_tmp() >= 0
        assert [n for n in os.listdir(tmpdir) if n.endswith(".tmp")] == []


def _growing_file(root: str) -> bool:
    """Whether the writer has begun writing bytes to some file under `root`."""
    return any(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if f != ".cas.lock")


def _child_read(store, name, q):
    try:
        q.put((bytes(store.get(name)), getattr(getattr(store, "client", None), "kind", None)))
    except BaseException as e:  # report, never hang
        q.put(repr(e))


@only("local", "s3-obstore", "s3-s3fs")
def test_works_in_a_forked_child(objects):
    """A client used before fork() works in the child (DataLoader workers fork)."""
    objects.put("f/x", b"fork-me")
    assert bytes(objects.get("f/x")) == b"fork-me"  # the parent's client is live
    parent_kind = getattr(getattr(objects, "client", None), "kind", None)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_read, args=(objects, "f/x", q))
    p.start()
    try:
        data, kind = q.get(timeout=30)
        assert data == b"fork-me"
        assert kind == (parent_kind and "s3fs")  # a child of an obstore user falls back to s3fs
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()


@only("local", "s3-obstore", "s3-s3fs")
def test_pickles_to_a_working_client(objects):
    objects.put("p/x", b"pickled")
    clone = pickle.loads(pickle.dumps(objects))
    assert bytes(clone.get("p/x")) == b"pickled" and clone.url == objects.url


# -- errors -------------------------------------------------------------------------------------------
def test_error_codes_are_distinct_and_typed():
    codes = objmod.ERRORS_BY_CODE
    assert len(codes) == 8 and all(issubclass(c, StorageError) for c in codes.values())
    assert issubclass(Unavailable, ConnectionError) and Unavailable.transient
    assert issubclass(NotFound, FileNotFoundError) and issubclass(Conflict, FileExistsError)


@pytest.mark.parametrize("client", ["obstore", "s3fs"])
def test_an_unreachable_s3_endpoint_is_unavailable(monkeypatch, client):
    __import__(client)  # both clients are test dependencies: a missing one fails, never skips
    monkeypatch.setenv("CDCSTORE_S3_CLIENT", client)
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    from cdcstore.storage.s3 import S3Objects
    s = S3Objects("s3://bucket/p", retries=1, connect_timeout=2)
    assert s.client.kind == client
    t = time.monotonic()
    with pytest.raises(Unavailable, match="AWS_ENDPOINT_URL"):
        s.get("x")
    assert time.monotonic() - t < 20


def test_s3_urls_are_checked():
    from cdcstore.storage.s3 import parse_url
    assert parse_url("s3://b/p/q/") == ("b", "p/q/")
    assert parse_url("s3://b") == ("b", "")
    for bad in ("s3:///p", "s3://b/sp ace", "http://b/p"):
        with pytest.raises(InvalidName):
            parse_url(bad)


def test_racing_puts_of_one_content_named_object_write_it_once(make):
    """16 clients put the same content-named object at once with exist_ok: all succeed,
    exactly one of them wrote it."""
    clients = [make() for _ in range(16)]
    barrier = threading.Barrier(16)
    data = blob(100_000, 5)

    def run(i):
        barrier.wait()
        return clients[i].put("packs/ab/same.pack", data, exist_ok=True)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        wrote = list(pool.map(run, range(16)))
    assert wrote.count(True) == 1
    assert bytes(make().get("packs/ab/same.pack")) == data


def test_local_objects_read_a_v1_store(tmp_path):
    """The local backend over a store that LocalStore wrote (store format v1): its packs,
    manifests, commits and branch are objects under the names docs/format.md gives, each
    named by the xxh3-128 of its bytes; the store's temp folder is not listed."""
    from cdcstore import Store
    from cdcstore.core import ids
    from cdcstore.storage.local import LocalObjects
    store = Store.init(str(tmp_path / "store"))
    f = tmp_path / "data.bin"
    f.write_bytes(blob(300_000, 9))
    store.push([str(f)], "cdc://ds/")
    store.close()
    objects = LocalObjects(str(tmp_path / "store"))
    names = [i.name for i in objects.list("")]
    assert "cdcstore.json" in names and not [n for n in names if n.startswith("tmp/")]
    packs = [n for n in names if n.startswith("packs/")]
    manifests = [n for n in names if n.startswith("manifests/")]
    commits = [i.name for i in objects.list("repos/ds/commits/")]
    assert packs and manifests and len(commits) == 1
    for n in packs + manifests + commits:
        stem = n.rsplit("/", 1)[1].split(".")[0]
        assert ids.hexdigest(bytes(objects.get(n))) == stem
    head = bytes(objects.get("repos/ds/branches/main")).decode().strip()
    assert commits == [f"repos/ds/commits/{head}.json"]
    pack = objects.stat(packs[0])
    assert bytes(objects.get_range(packs[0], 0, 8)) == b"CDCPACK\0"
    assert bytes(objects.get_range(packs[0], pack.size - 8, 100)) == b"CDCPEND\0"


@pytest.mark.parametrize("client", ["obstore", "s3fs"])
def test_a_missing_bucket_is_named(s3_endpoint, monkeypatch, client):
    __import__(client)  # both clients are test dependencies: a missing one fails, never skips
    for k, v in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    from cdcstore.storage.s3 import S3Objects
    s = S3Objects("s3://no-such-bucket/p", client=client, retries=1)
    for call in (lambda: s.put("a", b"x"), lambda: s.put_if_absent("a", b"x")):
        with pytest.raises(NotFound, match="bucket 'no-such-bucket' does not exist"):
            call()


def test_local_os_errors_are_translated_by_errno():
    import errno
    from cdcstore.storage import StorageFull
    from cdcstore.storage.local import _os_errors
    with pytest.raises(StorageFull, match="disk is full"):
        with _os_errors("writing x"):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(NotFound):
        with _os_errors("reading x", reading=True):
            raise OSError(errno.EISDIR, "Is a directory")
    with pytest.raises(InvalidName, match="nest"):
        with _os_errors("writing x"):
            raise OSError(errno.ENOTDIR, "Not a directory")


def test_list_gives_each_object_its_write_time(objects):
    """gc's grace window measures an object's age from the listing (mtime), on every backend."""
    before = time.time()
    objects.put("age/a", b"x")
    (info,) = list(objects.list("age/"))
    assert info.mtime is not None and before - 5 <= info.mtime <= time.time() + 5


def test_touch_makes_an_object_young_and_keeps_its_bytes(objects):
    """A content-named object stored again must count as new for gc's grace window."""
    objects.put("age/t", b"same bytes")
    (m0,) = [i.mtime for i in objects.list("age/")]
    time.sleep(1.1)  # S3 keeps write times to the second
    objects.touch("age/t")
    (m1,) = [i.mtime for i in objects.list("age/")]
    assert m1 > m0 and bytes(objects.get("age/t")) == b"same bytes"
    with pytest.raises(NotFound):
        objects.touch("age/missing")

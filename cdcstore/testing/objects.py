"""The conformance suite of an `ObjectStore` (cdcstore.storage: the objects every store is made
of): names, create-only puts, ranges, listing, conditional writes racing from threads and
processes, killed writers, fork and pickling. A third-party object store subclasses
`ObjectStoreTests` and overrides its `make` fixture, a factory of clients of one fresh storage
(each call a new client of the same objects: another process or machine, in effect):

    from cdcstore.testing.objects import ObjectStoreTests

    class TestMyObjects(ObjectStoreTests):
        processes = True  # other processes reach it by `cdcstore.storage.open_objects(objects.url)`

        @pytest.fixture
        def make(self, tmp_path):
            return lambda: MyObjects(...)

cdcstore's own tests run it over every built-in object store (tests/test_objects_conformance.py);
docs/backends.md says more. Importing this module imports pytest.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Iterator

import pytest

from ..storage import AlreadyExists, Capabilities, Conflict, InvalidName, NotFound, ObjectStore
from . import in_threads

__all__ = ["ObjectStoreTests", "blob", "uses_processes"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where cdcstore is


def uses_processes(fn):
    """A test that reaches the storage from other processes (by its url, forked or pickled)."""
    fn.uses_processes = True
    return fn


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


_PUTTER = textwrap.dedent("""
    import sys
    from cdcstore.storage import open_objects
    s = open_objects(sys.argv[1])
    data = b"\\xab" * (int(sys.argv[3]) << 20)
    print("ready", flush=True)
    s.put(sys.argv[2], data)
    print("done", flush=True)
""")


def _growing_file(root: str) -> bool:
    """Whether the writer has begun writing bytes to some file under `root`."""
    return any(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if f != ".cas.lock")


def _child_read(store, name, q):
    try:
        q.put((bytes(store.get(name)), getattr(getattr(store, "client", None), "kind", None)))
    except BaseException as e:  # report, never hang
        q.put(repr(e))


def blob(n: int, seed: int = 0) -> bytes:
    return bytes((i * 131 + seed) % 251 for i in range(n))


class ObjectStoreTests:
    """Every test takes the `objects` fixture (a client) or `make` (a factory of clients of the
    same storage); override `make`. `processes`: other processes can reach the storage (by
    `open_objects(objects.url)` in a child, fork, pickle); when False those tests skip."""

    processes = True

    @pytest.fixture
    def make(self):
        raise NotImplementedError("override the `make` fixture: a factory of clients of one fresh storage")

    @pytest.fixture
    def objects(self, make) -> Iterator[ObjectStore]:
        s = make()
        yield s
        s.close()

    def require_processes(self) -> None:
        if not self.processes:
            pytest.skip("this object store is not reachable from other processes (processes = False)")

    def check_forked_client(self, parent_kind, child_kind) -> None:
        """What a forked child's client is (`objects.client.kind`, when it has one): no rule by default."""

    def test_capabilities_are_declared(self, objects):
        caps = objects.capabilities
        assert isinstance(caps, Capabilities)
        with pytest.raises(Exception):
            caps.supports_ranges = False  # type: ignore[misc]  # frozen: the write must fail
        objects.put("a/x", b"abc")
        path = objects.local_path("a/x")
        if caps.local_path:
            with open(path, "rb") as f:
                assert f.read() == b"abc"
        else:
            assert path is None

    def test_put_get_stat_and_zero_bytes(self, objects):
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

    def test_put_is_create_only(self, objects):
        objects.put("m/x", b"first")
        with pytest.raises(AlreadyExists, match="already exists") as e:
            objects.put("m/x", b"second")
        assert isinstance(e.value, FileExistsError) and e.value.code == "already_exists"
        assert objects.put("m/x", b"first", exist_ok=True) is False  # content-named: fine
        assert bytes(objects.get("m/x")) == b"first"

    def test_put_file(self, objects, tmp_path):
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

    def test_ranges_past_the_end_and_zero_length(self, objects):
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

    def test_a_missing_object_is_not_found_everywhere(self, objects):
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

    def test_delete(self, objects):
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
    def test_odd_names_are_refused_clearly(self, objects, name):
        for call in (lambda: objects.put(name, b"x"), lambda: objects.get(name), lambda: objects.stat(name),
                     lambda: objects.put_if_absent(name, b"x"), lambda: objects.delete(name)):
            with pytest.raises(InvalidName, match="object name") as e:
                call()
            assert isinstance(e.value, ValueError) and e.value.code == "invalid_name"
        assert list(objects.list("")) == []

    def test_bad_listing_prefix_is_refused(self, objects):
        for prefix in ("/a", "a//", "sp ace", "../", None):
            with pytest.raises(InvalidName, match="prefix"):
                list(objects.list(prefix))

    def test_list_is_sorted_by_name_and_a_string_prefix(self, objects):
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

    def test_folders_are_the_next_name_component(self, objects):
        for n in ("repos/b/commits/1.json", "repos/a/branches/main", "repos/a/commits/2.json", "repos/c.txt",
                  "repos-x/y", "top"):
            objects.put(n, b"x")
        assert objects.folders("repos/") == ["a", "b"]
        assert objects.folders("repos/a/") == ["branches", "commits"]
        assert objects.folders("") == ["repos", "repos-x"]
        assert objects.folders("repos/a/branches/") == [] and objects.folders("nothing/") == []
        with pytest.raises(InvalidName, match="end with '/'"):
            objects.folders("repos")

    def test_conditional_put_tokens(self, objects):
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

    def test_racing_put_if_absent_has_one_winner_per_key(self, make):
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

        results = in_threads(run, 16)
        winners = {k: [i for i, won in results if k in won] for k in keys}
        assert all(len(w) == 1 for w in winners.values()), winners
        check = make()
        for k, (i,) in winners.items():
            assert bytes(check.get(k)) == f"{k}:{i}".encode()

    def test_racing_put_if_match_loses_no_update(self, make):
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

        in_threads(run, 8)
        assert bytes(make().get("counter")) == b"48"

    @uses_processes
    def test_processes_racing_put_if_match_lose_no_update(self, objects):
        """3 processes increment one counter 8 times each, released at once."""
        self.require_processes()
        objects.put_if_absent("counter", b"0")
        procs = [subprocess.Popen([sys.executable, "-c", _INCREMENTER, objects.url, "8"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
                 for _ in range(3)]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        assert [p.wait(60) for p in procs] == [0, 0, 0]
        assert bytes(objects.get("counter")) == b"24"

    @uses_processes
    def test_a_put_killed_midway_leaves_no_partial_object(self, objects):
        """SIGKILL a process in the middle of a large put: the name is absent or complete,
        never partial; a local store's leftover temp file is cleaned away."""
        self.require_processes()
        tmpdir = getattr(objects, "_tmpdir", None)  # local: kill once the temp file grows
        size_mb = 200 if tmpdir else 48
        proc = subprocess.Popen([sys.executable, "-c", _PUTTER, objects.url, "big/obj", str(size_mb)],
                                stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
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

    @uses_processes
    def test_works_in_a_forked_child(self, objects):
        """A client used before fork() works in the child (DataLoader workers fork)."""
        self.require_processes()
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
            self.check_forked_client(parent_kind, kind)
        finally:
            p.join(10)
            if p.is_alive():
                p.kill()

    @uses_processes
    def test_pickles_to_a_working_client(self, objects):
        self.require_processes()
        objects.put("p/x", b"pickled")
        clone = pickle.loads(pickle.dumps(objects))
        assert bytes(clone.get("p/x")) == b"pickled" and clone.url == objects.url

    def test_racing_puts_of_one_content_named_object_write_it_once(self, make):
        """16 clients put the same content-named object at once with exist_ok: all succeed,
        exactly one of them wrote it."""
        clients = [make() for _ in range(16)]
        barrier = threading.Barrier(16)
        data = blob(100_000, 5)

        def run(i):
            barrier.wait()
            return clients[i].put("packs/ab/same.pack", data, exist_ok=True)

        wrote = in_threads(run, 16)
        assert wrote.count(True) == 1
        assert bytes(make().get("packs/ab/same.pack")) == data

    def test_list_gives_each_object_its_write_time(self, objects):
        """gc's grace window measures an object's age from the listing (mtime), on every backend."""
        before = time.time()
        objects.put("age/a", b"x")
        (info,) = list(objects.list("age/"))
        assert info.mtime is not None and before - 5 <= info.mtime <= time.time() + 5

    def test_touch_makes_an_object_young_and_keeps_its_bytes(self, objects):
        """A content-named object stored again must count as new for gc's grace window."""
        objects.put("age/t", b"same bytes")
        (m0,) = [i.mtime for i in objects.list("age/")]
        time.sleep(1.1)  # S3 keeps write times to the second
        objects.touch("age/t")
        (m1,) = [i.mtime for i in objects.list("age/")]
        assert m1 > m0 and bytes(objects.get("age/t")) == b"same bytes"
        with pytest.raises(NotFound):
            objects.touch("age/missing")

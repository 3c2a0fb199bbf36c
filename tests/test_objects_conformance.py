"""The package's conformance suite for an object store (cdcstore.testing.objects.ObjectStoreTests)
over every built-in one: local directory, in-memory, and S3 against moto's real S3 HTTP server on
127.0.0.1 (started once per session), with both S3 clients; then what only the built-in ones
promise (errors, S3 urls and paging, a v1 store's layout). Each suite test runs over every
backend through the `objects` fixture; `make` builds another client of the same storage (another
process or machine, in effect)."""
from __future__ import annotations

import concurrent.futures
import secrets
import time

import pytest

from cdcstore.storage import Conflict, InvalidName, NotFound, StorageError, Unavailable, open_objects
from cdcstore.storage import objects as objmod
from cdcstore.testing.objects import ObjectStoreTests, blob

BACKENDS = ["local", "memory", "s3-obstore", "s3-s3fs"]  # S3: both clients s3.py may pick
BUCKET = "cdcstore-conformance"


def pytest_generate_tests(metafunc):
    """Every backend for each test of the suite; those that use processes skip memory:// (one
    process's memory)."""
    if "make" in metafunc.fixturenames and metafunc.cls is TestBuiltInObjectStores:
        kinds = [k for k in BACKENDS if k != "memory" or not getattr(metafunc.function, "uses_processes", False)]
        metafunc.parametrize("make", kinds, indirect=True)


class TestBuiltInObjectStores(ObjectStoreTests):
    """The suite over each built-in object store."""

    @pytest.fixture
    def make(self, request, tmp_path, monkeypatch):
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
        for k, v in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                     "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                     "CDCSTORE_S3_CLIENT": kind[3:]}.items():
            monkeypatch.setenv(k, v)
        url = f"s3://{BUCKET}/t-{secrets.token_hex(6)}"
        return lambda: open_objects(url)

    def check_forked_client(self, parent_kind, child_kind) -> None:
        assert child_kind == (parent_kind and "s3fs")  # a child of an obstore user falls back to s3fs

    def test_listing_thousands_of_keys_pages(self, objects, monkeypatch, request):
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


class TestAsAThirdPartyWouldUseIt(ObjectStoreTests):
    """The suite subclassed as docs/backends.md says, outside this file's parametrization: one
    fixture, and `processes = False` for storage that lives in one process (those tests skip)."""

    processes = False

    @pytest.fixture
    def make(self):
        store = open_objects("memory://")
        return lambda: store

    def test_the_process_tests_skip(self):
        with pytest.raises(pytest.skip.Exception, match="processes = False"):
            self.require_processes()


# -- errors -------------------------------------------------------------------------------------------
def test_error_codes_are_distinct_and_typed():
    codes = objmod.ERRORS_BY_CODE
    assert len(codes) == 9 and all(issubclass(c, StorageError) for c in codes.values())
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
        with pytest.raises(objmod.NoBucket, match="bucket 'no-such-bucket' does not exist"):
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

import collections
import compileall
import os
import sys
import urllib.error
import urllib.request

import pytest
import xxhash

sys.path.insert(0, os.path.dirname(__file__))

from cdcstore import Store  # noqa: E402
from cdcstore.testing import ServedStore, StallingProxy  # noqa: E402


def _compile_for_children() -> None:
    """Byte-compile the package under test once per session. Hundreds of tests start Python
    children (`python -m cdcstore ...`, workers, servers); with PYTHONDONTWRITEBYTECODE set
    (as on the CI machine) each child compiled all of cdcstore from source again, ~0.2 s a
    start. A child still reads .pyc files that exist; a stale one (source edited since) is
    ignored by Python, so this never runs old code."""
    import cdcstore
    compileall.compile_dir(os.path.dirname(cdcstore.__file__), quiet=2)


_compile_for_children()


class CountingObjects:
    """An object store that counts the calls made to the one it wraps (a decorator, as restic's):
    `calls` by method, `by_folder` by (method, first segment of the object's name)."""

    def __init__(self, inner):
        self._inner, self.calls, self.by_folder = inner, collections.Counter(), collections.Counter()

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def counted(*a, **kw):
            self.calls[name] += 1
            if a and isinstance(a[0], str):
                self.by_folder[(name, a[0].split("/", 1)[0])] += 1
            return attr(*a, **kw)
        return counted


def pack_file(store_root: str, pack: str) -> str:
    """Where a directory store keeps pack `pack`."""
    return os.path.join(store_root, "packs", pack[:2], pack + ".pack")


def flip_byte(path: str, at: int, mask: int = 0x40) -> None:
    """Damage one byte of a file in place (XOR `mask`): what a damage test does to a pack."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


def golden_input(n: int) -> bytes:
    """Deterministic pseudo-random bytes, defined by xxh3-128 of a counter."""
    return b"".join(xxhash.xxh3_128_digest(i.to_bytes(8, "little")) for i in range((n + 15) // 16))[:n]


@pytest.fixture
def store(tmp_path):
    s = Store.init(str(tmp_path / "store"))
    yield s
    s.close()


def _served(request) -> tuple[tuple, dict]:
    """(args, keywords) of `ServedStore` for a served-store fixture: the closest `served` marker's
    (the test's, its class's or its module's `pytestmark`), or none."""
    marker = request.node.get_closest_marker("served")
    return (tuple(marker.args), dict(marker.kwargs)) if marker else ((), {})


@pytest.fixture
def server(request, tmp_path):
    """A real `cdcstore serve` on a free loopback port, over a fresh directory store
    (`tmp_path/srv`; cdcstore.testing.ServedStore). A test, its class or its module picks the
    server's options with a marker, e.g. `@pytest.mark.served("--min-gc-grace", "0", tokens=TOKENS)`
    (ServedStore's arguments after the folder: serve options, `tokens`, `gateway`, `env`)."""
    args, options = _served(request)
    with ServedStore(tmp_path, *args, **options) as srv:
        yield srv


@pytest.fixture(scope="module")
def module_server(request, tmp_path_factory):
    """As `server`, one for all the tests of a module (in a folder of its own; the module's
    `served` marker picks its options): for tests that share the data a module fixture pushed."""
    args, options = _served(request)
    with ServedStore(tmp_path_factory.mktemp("served"), *args, **options) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _isolated_default_store(tmp_path, monkeypatch):
    """Never touch the user's real default store from tests."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for var in ("CDCSTORE_STORE", "CDCSTORE_CACHE", "CDCSTORE_CACHE_SIZE", "CDCSTORE_TOKEN"):
        monkeypatch.delenv(var, raising=False)


S3_BUCKET = "cdcstore-conformance"


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server (a real S3 HTTP API) on a free loopback port, with one bucket; its URL."""
    import boto3
    from moto import server as moto_server

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=S3_BUCKET)
    yield url
    server.stop()


class Seen(list):
    """Requests (method, path) a counting proxy passed on, and `down`: their answers' body lengths."""

    def __init__(self):
        super().__init__()
        self.down: list[int] = []

    def clear(self) -> None:
        super().clear()
        self.down.clear()


@pytest.fixture
def counted_bucket(s3_endpoint, s3_env, tmp_path, monkeypatch):
    """moto behind a loopback proxy that records every request (method, path) it passes on; the
    AWS variables point at the proxy, and this test's machine cache is `tmp_path/writer`.
    Yields (proxy url, the list of requests seen); `seen.down` holds the body length of each
    answer passed on (bytes down), and `seen.clear()` empties both."""
    proxy = StallingProxy(s3_endpoint)
    seen = Seen()
    proxy.rule = lambda method, path: seen.append((method, path))  # None: passed on as it is
    proxy.rewrite = lambda method, path, data: (seen.down.append(len(data)), data)[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "writer"))
    yield proxy.url, seen
    proxy.close()


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch):
    """The standard AWS variables pointing at the test's S3 server (children inherit them)."""
    env = {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def push_parquet(url: str, root, tables, row_group_size: int, address: str = "cdc://ds/data/"):
    """`tables` written as `root/data/part-{i}.parquet` and pushed to `address` of the store at
    `url` (the engine tests, over `module_server`); the data folder."""
    import pyarrow.parquet as pq

    data = root / "data"
    data.mkdir()
    for i, t in enumerate(tables):
        pq.write_table(t, data / f"part-{i}.parquet", row_group_size=row_group_size)
    with Store(url, cache=False) as s:
        s.push([str(data)], address)
    return data


def assert_fetched_only_columns(cache: str, data, columns: list[int], files: int) -> None:
    """A projection fetched (into the chunk cache file `cache`, shared by an engine's workers) about
    the bytes of its `columns` (indexes) in the Parquet files of folder `data`, not the wide rest."""
    import pyarrow.parquet as pq

    from cdcstore.api import ChunkCache

    fetched = ChunkCache(cache).stats()["raw_bytes"]
    whole = sum(os.path.getsize(data / f) for f in os.listdir(data))
    wanted = sum(md.row_group(r).column(c).total_compressed_size
                 for f in os.listdir(data) for md in [pq.read_metadata(data / f)]
                 for r in range(md.num_row_groups) for c in columns)
    assert 0 < fetched < wanted * 1.5 + files * 2 * 256 * 1024  # chunk granularity
    assert fetched < 0.5 * whole  # the wide columns were never fetched


def raw_call(url, token, method="GET", data=None, headers=None):
    """(status, body) of one raw HTTP request with a bearer token (hostile and tenant tests)."""
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def short_writes(real, limit: int, buffers: int):
    """`real` (os.writev or os.pwritev) made to write at most `limit` bytes of at most `buffers`
    buffers a call: a short write, every time."""
    def write(fd, bufs, *at):
        out, left = [], limit
        for b in list(bufs)[:buffers]:
            take = memoryview(b)[:left]
            out.append(take)
            left -= len(take)
            if not left:
                break
        return real(fd, out, *at)
    return write



# -- the fast tier -------------------------------------------------------------------------------
# A module that starts a server, moto, Spark, Ray, dask, a browser or a subprocess is marked `heavy`:
# `pytest -m "not heavy"` runs the rest, the fast tier a change is tried with first (docs/testing.md).
# A module is heavy when one of its tests uses a fixture that starts one (directly or through
# another fixture: pytest's closure of fixtures) or when its text names a starter.
HEAVY_FIXTURES = ("server", "module_server", "s3_endpoint")
HEAVY_WORDS = ("ServerProcess", "ServedStore", "seeded_gateway", "s3_endpoint", "moto", "pyspark", "import ray",
               "dask", "selenium", "subprocess")


def pytest_configure(config):
    config.addinivalue_line("markers", "heavy: the module starts a server, moto, Spark, Ray, dask, a browser or a "
                                       "subprocess; `pytest -m 'not heavy'` is the fast tier (docs/testing.md)")
    config.addinivalue_line("markers", "served(*args, tokens=None, gateway=False, env=None): the options of the "
                                       "`server` (and `module_server`) fixture's cdcstore.testing.ServedStore")


def pytest_collection_modifyitems(config, items):
    heavy: dict[str, bool] = {}
    for item in items:
        path = str(item.path)
        if path not in heavy:
            with open(path) as f:
                text = f.read()
            heavy[path] = any(w in text for w in HEAVY_WORDS)
        heavy[path] = heavy[path] or any(f in getattr(item, "fixturenames", ()) for f in HEAVY_FIXTURES)
    for item in items:
        if heavy[str(item.path)]:
            item.add_marker(pytest.mark.heavy)

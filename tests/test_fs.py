"""Real clients through the cdc:// fsspec filesystem, against a real server on loopback."""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import fsspec
from cdcstore import Store
from cdcstore.fs import CdcFileSystem

ROWS = 200_000


def table() -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table({
        "id": np.arange(ROWS),
        "score": rng.random(ROWS),
        "label": rng.integers(0, 10, ROWS),
        "blob": pa.array([f"{i:08d}" * 12 for i in range(ROWS)]),  # a wide column nobody reads
    })


@pytest.fixture(scope="module")
def pushed(module_server, tmp_path_factory):
    """(the module's server, the table, the data folder): `ds/data/` holds t.parquet and small.parquet."""
    data = tmp_path_factory.mktemp("fs") / "data"
    data.mkdir()
    t = table()
    pq.write_table(t, data / "t.parquet", row_group_size=50_000)
    pq.write_table(t.slice(0, 1000), data / "small.parquet")
    with Store(module_server.url, cache=False) as s:
        s.push([str(data)], "cdc://ds/data/")
    return module_server, t, data


def opts(server, **kw):
    return {"store": server.url, **kw}


def test_registered_and_lists(pushed):
    server, t, data = pushed
    fs = fsspec.filesystem("cdc", store=server.url)
    assert isinstance(fs, CdcFileSystem)
    assert fs.ls("ds", detail=False) == ["ds/data"]
    info = fs.info("cdc://ds/data/t.parquet")
    assert info["type"] == "file" and info["size"] == (data / "t.parquet").stat().st_size and info["mtime"] > 0
    assert fs.exists("ds/data/small.parquet") and not fs.exists("ds/data/nope.parquet")
    assert sorted(fs.glob("ds/**/*.parquet")) == ["ds/data/small.parquet", "ds/data/t.parquet"]
    assert fs.find("ds") == ["ds/data/small.parquet", "ds/data/t.parquet"]
    raw = (data / "t.parquet").read_bytes()
    assert fs.cat_file("ds/data/t.parquet", 100, 200) == raw[100:200]
    assert fs.cat_ranges(["ds/data/t.parquet"] * 2, [0, 1000], [4, 1010]) == [raw[:4], raw[1000:1010]]
    local = pushed[2].parent / "got.parquet"
    fs.get("ds/data/t.parquet", str(local))
    assert local.read_bytes() == raw


def test_pandas_read_parquet(pushed):
    import pandas as pd

    server, t, _ = pushed
    df = pd.read_parquet("cdc://ds/data/t.parquet", storage_options=opts(server), columns=["id", "score"])
    assert len(df) == ROWS and df["score"].sum() == pytest.approx(pc.sum(t["score"]).as_py())


def test_pyarrow_dataset_fetches_only_the_needed_ranges(pushed):
    import pyarrow.dataset as ds
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    server, t, data = pushed
    fs = CdcFileSystem(store=server.url, cache=False)
    dataset = ds.dataset("ds/data/t.parquet", filesystem=PyFileSystem(FSSpecHandler(fs)), format="parquet")
    before = fs.store.counters()["received_bytes"]
    got = dataset.to_table(columns=["score"], filter=pc.field("id") < 1000)
    received = fs.store.counters()["received_bytes"] - before
    assert got.num_rows == 1000
    assert got["score"].to_pylist() == t["score"][:1000].to_pylist()
    md = pq.ParquetFile(data / "t.parquet").metadata
    needed = sum(md.row_group(r).column(c).total_compressed_size for r in range(md.num_row_groups)
                 for c in (0, 1))  # id (for the filter) and score, at most every row group
    file_size = (data / "t.parquet").stat().st_size
    assert received < needed * 1.5 + 2 * 256 * 1024  # chunk granularity around each column chunk
    assert received < 0.35 * file_size  # the wide column was never fetched


def test_duckdb_through_fsspec(pushed):
    import duckdb

    server, t, _ = pushed
    con = duckdb.connect()
    con.register_filesystem(CdcFileSystem(store=server.url))
    n, s = con.execute("SELECT count(*), sum(label) FROM read_parquet('cdc://ds/data/t.parquet')").fetchall()[0]
    assert n == ROWS and s == pc.sum(t["label"]).as_py()


def test_dask_on_a_local_cluster(pushed):
    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    server, t, _ = pushed
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster):
        df = dd.read_parquet("cdc://ds/data/t.parquet", storage_options=opts(server), columns=["label"])
        assert int(df["label"].sum().compute()) == pc.sum(t["label"]).as_py()


def test_hugging_face_datasets_streaming(pushed):
    from datasets import load_dataset

    server, t, _ = pushed
    stream = load_dataset("parquet", data_files="cdc://ds/data/small.parquet", split="train", streaming=True,
                          storage_options=opts(server))
    rows = list(stream)
    assert len(rows) == 1000 and rows[5]["id"] == 5 and rows[5]["blob"] == t["blob"][5].as_py()


def test_writes_transactions_rm_and_pickle(pushed, tmp_path):
    import pickle

    server, _, _ = pushed
    fs = CdcFileSystem(store=server.url)
    fs.pipe("w/one.txt", b"one")
    with fs.open("w/two.txt", "wb") as f:
        f.write(b"two")
    commits = len(fs.store.log("w"))
    with fs.transaction:
        fs.pipe("w/t/a.txt", b"a")
        fs.pipe("w/t/b.txt", b"b")
        local = tmp_path / "c.txt"
        local.write_bytes(b"c")
        fs.put(str(local), "w/t/c.txt")
    assert len(fs.store.log("w")) == commits + 1  # the whole transaction is one commit
    assert fs.cat("w/t/c.txt") == b"c" and fs.ls("w/t", detail=False) == ["w/t/a.txt", "w/t/b.txt", "w/t/c.txt"]
    fs.rm("w/t", recursive=True)
    assert fs.ls("w", detail=False) == ["w/one.txt", "w/two.txt"]
    with pytest.raises(FileNotFoundError):
        fs.rm("w/zzz")
    clone = pickle.loads(pickle.dumps(fs))
    assert clone._heads and clone.cat("w/one.txt") == b"one"


def _read_label_sum(fs):
    with fs.open("ds/data/t.parquet") as f:
        return pc.sum(pq.read_table(f, columns=["label"])["label"]).as_py()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_fork_and_spawn(pushed, method):
    import multiprocessing

    server, t, _ = pushed
    fs = CdcFileSystem(store=server.url)
    expect = _read_label_sum(fs)  # the parent has a live event loop thread and session before forking
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(2) as pool:
        assert pool.map(_read_label_sum, [fs, fs, fs]) == [expect] * 3


def test_pickles_with_a_cache_object(pushed, tmp_path):
    import pickle

    from cdcstore.storage.cache import ChunkCache

    server, t, _ = pushed
    fs = CdcFileSystem(store=server.url, cache=ChunkCache(str(tmp_path / "c.sqlite"), max_bytes="1G"))
    clone = pickle.loads(pickle.dumps(fs))
    assert clone.cat_file("ds/data/small.parquet", 0, 4) == b"PAR1"
    assert clone.store.cache.max_bytes == 1024**3


def test_hf_datasets_sees_a_moved_branch_when_loaded_by_commit(tmp_path, store):
    """HF `datasets` caches downloads by URL (use_etag=False): a branch URL loaded again after the
    branch moved gave the old rows (docs/engines.md). Loaded by the commit the branch names, the new
    rows come; `info` gives each file's content as its ETag for caches that do compare one."""
    import datasets
    opts = {"store": store.location}
    fs = CdcFileSystem(**opts)
    rows = {}
    for n in (3, 5):
        pq.write_table(pa.table({"a": list(range(n))}), tmp_path / "x.parquet")
        store.push([str(tmp_path / "x.parquet")], "cdc://hf/x.parquet")
        rev, _ = store.resolve("cdc://hf@main/")
        d = datasets.load_dataset("parquet", data_files=f"cdc://hf@{rev}/x.parquet", storage_options=opts,
                                  split="train", cache_dir=str(tmp_path / "hf"))
        rows[n] = (len(d), fs.info("cdc://hf/x.parquet")["ETag"])
    assert rows[3][0] == 3 and rows[5][0] == 5 and rows[3][1] != rows[5][1]

"""polars over `cdc://` by the documented routes (docs/engines.md), against a real server: a folder
of files read lazily through pyarrow's dataset, a list of opened files through polars' own
reader, exact rows and content against the source files, the column chunks a projection needs
and no more, and writes: one file is one commit, many files in `fs.transaction` are ONE commit,
and a block that raises lands none. (polars' native reader and writer take only their own URL
schemes: the first test pins that, so the docs change when polars does.)"""
import functools

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from cdcstore.fs import CdcFileSystem
from conftest import push_parquet

import polars as pl  # noqa: E402 - in the test extra

FILES, ROWS, GROUP = 3, 20_000, 5_000
URL = "cdc://ds/data/"


@functools.lru_cache(maxsize=None)
def source_table(i: int) -> pa.Table:
    rng = np.random.default_rng(i)
    ids = np.arange(i * ROWS, (i + 1) * ROWS)
    return pa.table({"id": ids, "score": rng.random(ROWS),
                     "name": pa.array([f"row-{k}" for k in ids], pa.large_string()),
                     "blob": pa.array([rng.bytes(24).hex() for _ in ids])})  # a wide column a projection skips


def expected(columns=None) -> "pl.DataFrame":
    t = pa.concat_tables([source_table(i) for i in range(FILES)])
    return pl.from_arrow(t.select(columns) if columns else t)


@pytest.fixture(scope="module")
def pushed(module_server, tmp_path_factory):
    """(the module's server, the data folder): the source tables as Parquet files under `URL`."""
    data = push_parquet(module_server.url, tmp_path_factory.mktemp("polars_cdc"),
                        [source_table(i) for i in range(FILES)], GROUP, URL)
    return module_server, data


def commits(fs: CdcFileSystem) -> int:
    return len(fs.store.log("ds"))


def test_the_native_reader_takes_only_its_own_schemes(pushed):
    server, _ = pushed
    with pytest.raises(Exception):
        pl.scan_parquet(URL + "part-0.parquet", storage_options={"store": server.url}).collect()


def test_a_folder_lazily_through_a_pyarrow_dataset(pushed):
    server, data = pushed
    fs = CdcFileSystem(store=server.url, cache=False)
    lazy = pl.scan_pyarrow_dataset(ds.dataset(URL, filesystem=fs, format="parquet"))
    df = lazy.collect().sort("id")
    assert df.height == FILES * ROWS
    assert df.equals(expected())  # every row, every value

    before = fs.store.counters()["received_bytes"]
    got = lazy.select("id", "score").collect().sort("id")
    fetched = fs.store.counters()["received_bytes"] - before
    assert got.equals(expected(["id", "score"]))
    wanted = sum(md.row_group(r).column(c).total_compressed_size
                 for i in range(FILES) for md in [pq.read_metadata(data / f"part-{i}.parquet")]
                 for r in range(md.num_row_groups) for c in (0, 1))
    assert 0 < fetched < wanted * 1.5 + FILES * 2 * 256 * 1024  # chunk granularity; the blobs never fetched


def test_opened_files_through_polars_own_reader(pushed):
    server, _ = pushed
    fs = CdcFileSystem(store=server.url, cache=False)
    files = [fs.open(p) for p in sorted(fs.find(URL))]
    try:
        df = pl.scan_parquet(files).collect()
    finally:
        for f in files:
            f.close()
    assert df.height == FILES * ROWS
    assert df.equals(expected())


def test_writes_one_commit_per_file_or_per_transaction(pushed):
    server, _ = pushed
    fs = CdcFileSystem(store=server.url, cache=False)
    df = expected()
    n = commits(fs)
    with fs.open("cdc://ds@main/one/all.parquet", "wb") as f:
        df.write_parquet(f)
    assert commits(fs) == n + 1
    with fs.transaction:  # three files, ONE commit
        for i, part in enumerate(df.slice(k * ROWS, ROWS) for k in range(FILES)):
            with fs.open(f"cdc://ds@main/many/part-{i}.parquet", "wb") as f:
                part.write_parquet(f)
    assert commits(fs) == n + 2
    fs.invalidate_cache()
    back = pl.scan_pyarrow_dataset(ds.dataset("cdc://ds/many/", filesystem=fs, format="parquet")).collect()
    assert back.sort("id").equals(df)
    assert pl.read_parquet(fs.open("cdc://ds/one/all.parquet").read()).equals(df)


def test_a_write_that_raises_lands_nothing(pushed):
    server, _ = pushed
    fs = CdcFileSystem(store=server.url, cache=False)
    n = commits(fs)
    with pytest.raises(RuntimeError, match="a writer dies"):
        with fs.transaction:
            with fs.open("cdc://ds@main/failed/part-0.parquet", "wb") as f:
                expected().write_parquet(f)
            raise RuntimeError("a writer dies")
    assert commits(fs) == n
    fs.invalidate_cache()
    assert not fs.exists("cdc://ds/failed/part-0.parquet")

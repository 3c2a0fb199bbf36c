"""polars over cdc://: the recipes README.md gives, against a real server, reading only
the column chunks a projection needs. (polars' native reader knows only its own URL
schemes, so `pl.read_parquet("cdc://...")` without `use_pyarrow` looks for a local file.)"""
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.fs import CdcFileSystem

pl = pytest.importorskip("polars")
ROWS = 200_000
URL = "cdc://ds/data/t.parquet"


@pytest.fixture(scope="module")
def pushed(module_server, tmp_path_factory):
    """(the module's server, the table, its local file): `ds/data/t.parquet`."""
    data = tmp_path_factory.mktemp("polars") / "data"
    data.mkdir()
    t = pa.table({"id": np.arange(ROWS), "score": np.random.default_rng(7).random(ROWS),
                  "blob": pa.array([f"{i:08d}" * 12 for i in range(ROWS)])})  # a wide column nobody reads
    pq.write_table(t, data / "t.parquet", row_group_size=50_000)
    with Store(module_server.url, cache=False) as s:
        s.push([str(data)], "cdc://ds/data/")
    return module_server, t, data / "t.parquet"


def received(fs: CdcFileSystem, read) -> tuple:
    before = fs.store.counters()["received_bytes"]
    out = read()
    return out, fs.store.counters()["received_bytes"] - before


def column_bytes(path, columns) -> int:
    md = pq.ParquetFile(path).metadata
    return sum(md.row_group(r).column(c).total_compressed_size
               for r in range(md.num_row_groups) for c in columns)


def assert_projected(got: int, path, columns) -> None:
    assert got > 0  # counted on this instance: the read went over the wire
    assert got < column_bytes(path, columns) * 1.5 + 2 * 256 * 1024  # chunk granularity
    assert got < 0.5 * path.stat().st_size  # the wide column was never fetched


def test_read_parquet_url_through_pyarrow(pushed):
    server, t, path = pushed
    fs = CdcFileSystem(store=server.url, cache=False)  # the instance storage_options resolve to
    df, got = received(fs, lambda: pl.read_parquet(URL, columns=["score"], use_pyarrow=True,
                                                   storage_options={"store": server.url, "cache": False}))
    assert df["score"].to_list() == t["score"].to_pylist()
    assert_projected(got, path, [1])


def test_scan_pyarrow_dataset_pushes_projection_and_filter(pushed):
    server, t, path = pushed
    fs = CdcFileSystem(store=server.url, cache=False)
    lazy = pl.scan_pyarrow_dataset(ds.dataset("ds/data/t.parquet", filesystem=fs, format="parquet"))
    df, got = received(fs, lambda: lazy.filter(pl.col("id") < 1000).select("score").collect())
    assert df["score"].to_list() == t["score"][:1000].to_pylist()
    assert_projected(got, path, [0, 1])
    assert got < column_bytes(path, [0, 1]) // 2  # row-group statistics: only the first row group


def test_scan_parquet_on_a_file_object(pushed):
    server, t, path = pushed
    fs = CdcFileSystem(store=server.url, cache=False)
    with fs.open(URL) as f:
        df, got = received(fs, lambda: pl.scan_parquet(f).select("score").collect())
    assert df["score"].to_list() == t["score"].to_pylist()
    assert_projected(got, path, [1])

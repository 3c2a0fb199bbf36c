"""`cdc://` paths in both forms a tool may hand an fsspec filesystem (`cdc://repo@rev/path` and
`repo@rev/path`), through pyarrow, duckdb and polars against a real server; and how the
fsspec writers land ONE commit (docs/fsspec.md's recipe, run as written)."""
import os
import re

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import polars as pl
import pytest

from cdcstore import Store
from cdcstore.fs import CdcFileSystem
from cdcstore.storage.repository import LocalStore

FORMS = ["cdc://", ""]
DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "fsspec.md")


@pytest.fixture(scope="module")
def pushed(module_server, tmp_path_factory):
    """The module's server, with `ds@v2/train/`: two hive partitions and a file at the top."""
    train = tmp_path_factory.mktemp("forms") / "train"
    for k in (0, 1):
        (train / f"k={k}").mkdir(parents=True)
        pq.write_table(pa.table({"v": np.arange(k * 100, k * 100 + 100)}), train / f"k={k}" / "part-0.parquet")
    with Store(module_server.url, cache=False) as s:
        s.push([str(train)], "cdc://ds/train/")
        s.tag("ds", "v2")
        s.push([str(train)], "cdc://ds/later/")  # main moves on; v2 stays
    return module_server


@pytest.fixture
def fs(pushed):
    f = CdcFileSystem(store=pushed.url, cache=False)
    yield f
    f.store.close()


def test_listings_name_paths_in_the_form_asked(fs):
    for form in FORMS:
        base = f"{form}ds@v2/train"
        files = [f"{base}/k=0/part-0.parquet", f"{base}/k=1/part-0.parquet"]
        assert fs.find(base) == files and fs.find(base + "/") == files
        found = fs.find(base, withdirs=True, detail=True)
        assert sorted(found) == sorted([base, f"{base}/k=0", f"{base}/k=1", *files])  # fsspec: the base too
        assert all(info["name"] == name for name, info in found.items())
        assert fs.glob(f"{base}/*/*.parquet") == files
        assert fs.ls(base, detail=False) == [f"{base}/k=0", f"{base}/k=1"]
        assert fs.info(files[0])["name"] == files[0] and fs.info(files[0])["type"] == "file"
        assert [root for root, _, _ in fs.walk(base)] == [base, f"{base}/k=0", f"{base}/k=1"]
        assert fs.ls(form, detail=False) == [f"{form}ds"]
        # and every name a listing gave opens, in either form
        assert pq.read_table(fs.open(files[1]))["v"].to_pylist() == list(range(100, 200))
        assert fs.cat_file(files[0], 0, 4) == b"PAR1" and fs.exists(files[0]) and fs.isdir(f"{base}/k=0")


def test_pyarrow_takes_either_form_and_duckdb_the_url(fs):
    """pyarrow checks that every listed name lies under its base: a `cdc://` base failed with
    "GetFileInfo() yielded path 'ds@v2/train/...', which is outside base dir 'cdc://ds@v2/train/'".
    duckdb picks a filesystem by the URL's protocol, so it takes the `cdc://` form (a plain
    `ds@v2/...` is a local path to it)."""
    for form in FORMS:
        url = f"{form}ds@v2/train/"
        t = ds.dataset(url, filesystem=fs, format="parquet", partitioning="hive").to_table()
        assert sorted(t["v"].to_pylist()) == list(range(200)) and sorted(set(t["k"].to_pylist())) == [0, 1]
        assert pq.read_table(url, filesystem=fs).num_rows == 200
        one = ds.dataset(url, filesystem=fs, partitioning="hive").to_table(filter=ds.field("k") == 1)
        assert sorted(one["v"].to_pylist()) == list(range(100, 200))
    con = duckdb.connect()
    con.register_filesystem(fs)
    got = con.sql("SELECT count(*), sum(v), count(DISTINCT k) FROM "
                  "read_parquet('cdc://ds@v2/train/**/*.parquet', hive_partitioning = true)").fetchall()
    assert got == [(200, sum(range(200)), 2)]


def test_polars_reads_through_pyarrow_or_fsspec_files(fs, pushed):
    """polars' native reader knows only its own URL schemes (`pl.scan_parquet("cdc://...")` looks
    for a local file). What works, as docs/fsspec.md gives it: a pyarrow dataset over the `cdc://`
    URL (a folder, lazy, filters pushed down), a file URL with `use_pyarrow=True` and
    `storage_options`, or files opened on the fs."""
    lazy = pl.scan_pyarrow_dataset(ds.dataset("cdc://ds@v2/train/", filesystem=fs, partitioning="hive"))
    before = fs.store.counters()["received_bytes"]
    df = lazy.filter(pl.col("k") == 1).select("v").collect()
    assert sorted(df["v"].to_list()) == list(range(100, 200))
    one_file = fs.info("cdc://ds@v2/train/k=1/part-0.parquet")["size"]
    assert 0 < fs.store.counters()["received_bytes"] - before <= one_file + 64 * 1024  # k=0 never read

    url = "cdc://ds@v2/train/k=0/part-0.parquet"
    df = pl.read_parquet(url, use_pyarrow=True, storage_options={"store": pushed.url, "cache": False})
    assert df["v"].to_list() == list(range(100))
    files = fs.find("cdc://ds@v2/train/")
    df = pl.scan_parquet([fs.open(f) for f in files]).select(pl.col("v").sum()).collect()
    assert df.item() == sum(range(200))


# -- one commit for many files (docs/fsspec.md, "One commit for many files") ----------------------
def doc_recipe() -> str:
    """The python block under docs/fsspec.md's "One commit for many files" heading."""
    text = open(DOC).read()
    section = text.split("## One commit for many files", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def commits(store_path: str, repo: str) -> int:
    with Store(store_path) as s:
        return len(s.log(repo, limit=1000)) if repo in s.repos() else 0


def test_fsspec_writers_land_one_commit_as_documented(tmp_path):
    """docs/fsspec.md's recipe, run as written: pyarrow's write_dataset inside `fs.transaction`
    is one commit (alone, one a file); so is dask's threaded scheduler, which finds the same
    filesystem instance (same `storage_options`)."""
    import dask
    import dask.dataframe as dd
    import fsspec
    import pandas as pd

    LocalStore.init(str(tmp_path / "s"))
    fs = CdcFileSystem(store=str(tmp_path / "s"))
    table = pa.table({"label": np.arange(1000) % 4, "v": np.arange(1000)})
    ns = {"fs": fs, "table": table}
    exec(compile(doc_recipe(), DOC, "exec"), ns)  # the recipe as the docs give it
    assert commits(str(tmp_path / "s"), "imagenet") == 1
    back = ns["back"]  # the recipe reads its dataset back through the same cdc:// URL
    assert back.num_rows == 1000 and sorted(back["v"].to_pylist()) == list(range(1000))
    assert len(fs.find("cdc://imagenet@main/v4/")) == 4  # four files, one commit

    # outside a transaction the files land as they close, several at once in a group commit (up to
    # one commit each): what the docs warn about
    ds.write_dataset(table, "cdc://imagenet@main/v5/", filesystem=fs, format="parquet",
                     partitioning=["label"], partitioning_flavor="hive")
    assert 1 + 1 <= commits(str(tmp_path / "s"), "imagenet") <= 1 + 4
    assert len(fs.find("cdc://imagenet@main/v5/")) == 4

    opts = {"store": str(tmp_path / "s")}
    ddf = dd.from_pandas(pd.DataFrame({"v": range(600)}), npartitions=6)
    fs = fsspec.filesystem("cdc", **opts)
    with dask.config.set(scheduler="threads"):
        with fs.transaction:
            ddf.to_parquet("cdc://r@main/one/", storage_options=opts, write_metadata_file=False)
        assert commits(str(tmp_path / "s"), "r") == 1
        ddf.to_parquet("cdc://r@main/many/", storage_options=opts, write_metadata_file=False)
    assert 1 + 1 <= commits(str(tmp_path / "s"), "r") <= 1 + 6
    assert sorted(dd.read_parquet("cdc://r/one/", storage_options=opts).compute()["v"]) == list(range(600))


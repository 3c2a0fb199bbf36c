"""S3 gateway benchmark: pyarrow's S3FileSystem and polars' native s3:// reader through
`cdcstore serve --s3-port` (remote/gateway/reads.py) against the same engines on the local files.

    python bench/gateway.py [--size-mb 100] [--parts 6] [--part-mb 8] [--repeat 3] [--data-dir /tmp/cdcbench-gw]

Data (bench/data.py, zstd Parquet with pyarrow's content-defined chunking): one file of at
least --size-mb MB (row groups of make_table, build_parquet) and a folder of --parts files of
about --part-mb MB each. Both pushed into a fresh directory store (cdc://bench/), served by a
real `python -m cdcstore serve --tokens FILE --s3-port PORT` on loopback; the clients sign
with SigV4 (access key id: the token's name, secret: the token).

Sides (medians of --repeat repetitions, order rotated per repetition; MB = 1e6 bytes of file):
  pyarrow file      pq.read_table(path, filesystem=local | S3FileSystem)
  pyarrow dataset   pyarrow.dataset.dataset(folder, format="parquet", filesystem=...).to_table()
  polars file       pl.read_parquet(local path) | pl.scan_parquet("s3://...", storage_options).collect()
  polars dataset    pl.scan_parquet(folder/*.parquet [, storage_options]).collect()
Figures: rows/s and MB/s per side, gateway / local per engine, and requests per file opened
(the gateway's lines of the server's access log during one read, over the files read).
Results are checked against the local read (row count and equality) once, outside the timings.
Everything is in the page cache and on loopback: this compares software paths.
The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from data import build_parquet, make_table, write_parquet  # noqa: E402

TOKEN = "bench-token-" + "b" * 24


def gateway_lines(log_path: str) -> int:
    """Access-log lines of S3 requests (the native API's paths start with /v1/)."""
    with open(log_path, errors="replace") as f:
        return sum(1 for line in f if "cdcstore.access" in line and '"GET /v1/' not in line
                   and ('"GET /' in line or '"HEAD /' in line))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=100)
    ap.add_argument("--parts", type=int, default=6)
    ap.add_argument("--part-mb", type=float, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data-dir", default="/tmp/cdcbench-gw")
    args = ap.parse_args()

    import polars as pl
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    from cdcstore import Store
    from cdcstore.storage.repository import LocalStore
    from cdcstore.testing import ServerProcess, free_port

    fig = harness.start("gateway")
    fig["code"] = harness.code_version()
    run = harness.run_dir(args.data_dir, "run")
    try:
        data = os.path.join(run, "data")
        os.makedirs(os.path.join(data, "parts"))
        big = os.path.join(data, "big.parquet")
        fig["big"] = build_parquet(big, args.size_mb * 1e6, seed=300)
        rows_per_part = int(args.part_mb * 1e6 / 120)
        for i in range(args.parts):
            write_parquet(make_table(400 + i, rows_per_part, id0=i * rows_per_part),
                          os.path.join(data, "parts", f"part-{i:03d}.parquet"))
        parts = sorted(os.path.join(data, "parts", n) for n in os.listdir(os.path.join(data, "parts")))
        part_bytes = sum(os.path.getsize(p) for p in parts)
        LocalStore.init(os.path.join(run, "srv"))
        with Store(os.path.join(run, "srv")) as s:
            s.push([big, os.path.join(data, "parts")], "cdc://bench/", message="bench")
        tokens = os.path.join(run, "tokens.json")
        with open(tokens, "w") as f:
            json.dump({TOKEN: {"scope": "read", "repos": ["*"], "name": "bench"}}, f)
        port = free_port()
        srv = ServerProcess(os.path.join(run, "srv"), "--tokens", tokens, "--s3-port", str(port)).start()
        endpoint = f"127.0.0.1:{port}"
        s3 = pafs.S3FileSystem(access_key="bench", secret_key=TOKEN, endpoint_override=endpoint, scheme="http",
                               region="us-east-1")
        opts = {"aws_access_key_id": "bench", "aws_secret_access_key": TOKEN, "aws_endpoint_url": f"http://{endpoint}",
                "aws_region": "us-east-1", "aws_allow_http": "true"}
        sides = {
            "pyarrow_file_local": (lambda: pq.read_table(big), os.path.getsize(big), 1),
            "pyarrow_file_gateway": (lambda: pq.read_table("bench/main/big.parquet", filesystem=s3),
                                     os.path.getsize(big), 1),
            "pyarrow_dataset_local": (lambda: ds.dataset(os.path.join(data, "parts"), format="parquet").to_table(),
                                      part_bytes, len(parts)),
            "pyarrow_dataset_gateway": (lambda: ds.dataset("bench/main/parts", format="parquet",
                                                           filesystem=s3).to_table(), part_bytes, len(parts)),
            "polars_file_local": (lambda: pl.read_parquet(big), os.path.getsize(big), 1),
            "polars_file_gateway": (lambda: pl.scan_parquet("s3://bench/main/big.parquet",
                                                            storage_options=opts).collect(), os.path.getsize(big), 1),
            "polars_dataset_local": (lambda: pl.scan_parquet(os.path.join(data, "parts", "*.parquet")).collect(),
                                     part_bytes, len(parts)),
            "polars_dataset_gateway": (lambda: pl.scan_parquet("s3://bench/main/parts/*.parquet",
                                                               storage_options=opts).collect(),
                                       part_bytes, len(parts)),
        }
        # checked once, outside the timings; requests per file opened counted on this pass
        out: dict = {}
        for name, (read, size, files) in sides.items():
            before = gateway_lines(srv.log_path)
            t = read()
            time.sleep(0.3)  # the access log line is written after the answer
            got = (gateway_lines(srv.log_path) - before) / files
            local = sides[name.replace("gateway", "local")][0]() if name.endswith("gateway") else t
            rows = t.num_rows if hasattr(t, "num_rows") else t.height
            if name.endswith("gateway"):
                if not t.equals(local):
                    raise SystemExit(f"{name}: the gateway's table differs from the local one")
                out[name] = {"requests_per_file": got}
            else:
                out[name] = {}
            out[name].update(rows=rows, bytes=size, files=files)
        times: dict = {name: [] for name in sides}
        for _, name in harness.rounds(list(sides), args.repeat):
            t0 = time.perf_counter()
            sides[name][0]()
            times[name].append(time.perf_counter() - t0)
        for name, ts in times.items():
            sec = harness.med(ts)
            out[name].update(seconds=sec, rows_per_s=out[name]["rows"] / sec, mb_per_s=out[name]["bytes"] / 1e6 / sec)
            print(f"{name:26s} {sec:7.3f} s  {out[name]['rows'] / sec:12,.0f} rows/s  "
                  f"{out[name]['bytes'] / 1e6 / sec:7.0f} MB/s"
                  + (f"  {out[name]['requests_per_file']:.1f} requests/file" if "requests_per_file" in out[name]
                     else ""))
        srv.stop()
        fig["sides"] = out
        goals = []
        for engine in ("pyarrow_file", "pyarrow_dataset", "polars_file", "polars_dataset"):
            r = harness.ratio(out[f"{engine}_gateway"]["rows_per_s"], out[f"{engine}_local"]["rows_per_s"])
            goals.append(harness.Goal(f"{engine}_gateway_over_local", r, None, "reported"))
            goals.append(harness.Goal(f"{engine}_requests_per_file", out[f"{engine}_gateway"]["requests_per_file"],
                                      None, "reported"))
        for g in goals:
            print(g.line())
        harness.finish(fig, goals)
    finally:
        shutil.rmtree(run, ignore_errors=True)


if __name__ == "__main__":
    main()

"""A push from a new machine (a CI runner): one edited Parquet file in a folder of many, pushed with a
fresh cache into a bucket store that holds the folder (issue 42).

    python bench/cold_push.py [--files 40] [--rows 1200000] [--repeat 3] [--data-dir DIR]

moto's S3 server (a child) behind the request-counting proxy of bench/scale.py; every push and
upload runs in a child process with its own XDG_CACHE_HOME (a new machine). The folder is real
Parquet written by plain pyarrow (an int64 id, a float64 and a string column; one row group of
at most 1 M rows per file). Version 2 is version 1 with 1% of one file's rows changed in one place
(plain pyarrow writes it again). Each run makes a store of its own, machine A pushes version 1 into
it, and a NEW machine pushes version 2's whole folder: every run is the same operation.

Measured for each side (medians of --repeat runs, each on a fresh machine):
  ours          `Store.push([folder], "cdc://lake/data/")`: requests, bytes down, bytes up, seconds,
                new bytes (what it deduplicated)
  peer_file     boto3 `upload_file` of the edited file alone (what a user who knows what changed
                sends without dedup)
  peer_folder   boto3 `upload_file` of every file of the folder (a sync from a fresh checkout:
                new mtimes, so every file is sent)
The goal (issue 42): bytes down <= 1% of the store. Before trust by history (issue 30's rule alone)
the push read back every chunk it deduplicated against: 1.67 GB down for 1.94 GB in the issue's
run. Last line: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import Goal, code_version, finish, med, run_dir, start  # noqa: E402
from scale import AWS, BUCKET, Counter, Machines, Moto, Proxy, du  # noqa: E402

UPLOAD = """
import json, os, sys, time, boto3
paths = sys.argv[2:]
s3 = boto3.client("s3")
t0 = time.perf_counter()
for p in paths:
    s3.upload_file(p, sys.argv[1], "peer/" + os.path.basename(p))
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def write_folder(folder: str, files: int, rows: int) -> int:
    import pyarrow.parquet as pq
    os.makedirs(folder)
    for i in range(files):
        pq.write_table(table(i, rows), os.path.join(folder, f"part-{i:03d}.parquet"))
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def table(seed: int, rows: int):
    import pyarrow as pa
    import pyarrow.compute as pc
    ids = pa.array(range(seed * 100_000_000, seed * 100_000_000 + rows), pa.int64())
    x = pc.random(rows, initializer=seed)
    codes = pc.floor(pc.multiply(pc.random(rows, initializer=seed + 7), 1e6)).cast(pa.int64())
    tag = pc.binary_join_element_wise("t", codes.cast(pa.string()), "")
    return pa.table({"id": ids, "x": x, "tag": tag})


def edit(folder: str, i: int, rows: int) -> None:
    """1% of file i's rows changed in one place, the file written again by plain pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    t = table(i, rows)
    x = t.column("x").to_numpy().copy()
    lo, hi = rows // 2, rows // 2 + rows // 100
    x[lo:hi] = -1.0
    pq.write_table(t.set_column(1, "x", pa.array(x)), os.path.join(folder, f"part-{i:03d}.parquet"))


def child(machines: Machines, counter: Counter, argv: list[str]) -> dict:
    home, env = machines.new()
    with counter.window() as w:
        p = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=7200)
    if p.returncode:
        raise RuntimeError(f"{argv[:3]} failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    r = w.result
    out.update(requests=r["requests"], bytes_down=r["bytes_out"], bytes_up=r["bytes_in"],
               pack_gets=r["by_kind"].get("GET packs", 0), tree_gets=r["by_kind"].get("GET trees", 0),
               cache_bytes=du(os.path.join(env["XDG_CACHE_HOME"], "cdcstore")))
    shutil.rmtree(home, ignore_errors=True)
    return out


def packs_bytes(moto_url: str, prefix: str) -> int:
    import boto3
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    return sum(o["Size"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
               for o in page.get("Contents", []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--rows", type=int, default=1_200_000, help="rows a file (~48 MB at 1.2 M)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data-dir", default="/tmp/cdcbench-coldpush")
    a = ap.parse_args()
    fig = start("cold_push") | {"code": code_version(), "files": a.files, "rows": a.rows, "repeat": a.repeat}
    root = run_dir(a.data_dir, "cold")
    moto = Moto().start()
    proxy = Proxy(moto.url).start()
    try:
        counter = Counter(proxy)
        machines = Machines(root, proxy.url)
        folder = os.path.join(root, "data")
        t0 = time.perf_counter()
        fig["folder_bytes"] = write_folder(folder, a.files, a.rows)
        print(f"{a.files} Parquet files, {fig['folder_bytes'] / 1e6:.0f} MB, written in {time.perf_counter() - t0:.0f} s")
        env = {**machines.base, "AWS_ENDPOINT_URL": proxy.url}
        scale = os.path.join(HERE, "scale.py")
        edited = a.files // 2
        v2 = os.path.join(root, "data-v2")  # version 2: one file edited, the others the same files (links)
        os.makedirs(v2)
        for f in os.listdir(folder):
            if f != f"part-{edited:03d}.parquet":
                os.link(os.path.join(folder, f), os.path.join(v2, f))
        edit(v2, edited, a.rows)
        edited_path = os.path.join(v2, f"part-{edited:03d}.parquet")
        fig["edited_bytes"] = os.path.getsize(edited_path)
        runs = {"ours": [], "peer_file": [], "peer_folder": []}
        files = sorted(os.path.join(v2, f) for f in os.listdir(v2))
        for rep in range(a.repeat):
            # each run: a store of its own holding version 1 (pushed by machine A), then a new machine
            # pushes version 2: every run is the same operation, none dedups against an earlier run
            location = f"s3://{BUCKET}/lake{rep}"
            subprocess.run([sys.executable, "-m", "cdcstore", "init", "--store", location], check=True, env=env,
                           capture_output=True)
            first = child(machines, counter, [scale, "--_op", "push", location, f"{folder}|cdc://lake/data/"])
            fig.setdefault("first_push", first)
            store = packs_bytes(moto.url, f"lake{rep}/packs/")
            fig.setdefault("store_bytes", store)
            print(f"run {rep + 1}: first push {first['seconds']:.1f} s, {first['requests']} requests, "
                  f"store {store / 1e6:.0f} MB")
            sides = [("ours", [scale, "--_op", "push", location, f"{v2}|cdc://lake/data/"]),
                     ("peer_file", ["-c", UPLOAD, BUCKET, edited_path]),
                     ("peer_folder", ["-c", UPLOAD, BUCKET, *files])]
            for name, argv in sides[rep % 3:] + sides[:rep % 3]:  # sides alternated
                runs[name].append(child(machines, counter, argv))
        for name, rs in runs.items():
            fig[name] = {k: med([r[k] for r in rs]) for k in rs[0] if isinstance(rs[0][k], (int, float))}
            fig[name]["runs"] = rs
        ours = fig["ours"]
        store = fig["store_bytes"]
        print(f"\nnew machine, one edited file of {fig['edited_bytes'] / 1e6:.1f} MB in {a.files} files "
              f"({fig['folder_bytes'] / 1e6:.0f} MB; store {store / 1e6:.0f} MB), medians of {a.repeat}:")
        for name in runs:
            r = fig[name]
            print(f"  {name:12s} {r['seconds']:7.2f} s  {r['requests']:6.0f} requests  "
                  f"{r['bytes_down'] / 1e6:9.3f} MB down  {r['bytes_up'] / 1e6:9.2f} MB up"
                  + (f"  new {r['new_bytes'] / 1e6:.2f} MB" if "new_bytes" in r else ""))
        fig["down_share_of_store"] = ours["bytes_down"] / store
        fig["seconds_vs_peer_file"] = ours["seconds"] / fig["peer_file"]["seconds"]
        fig["seconds_vs_peer_folder"] = ours["seconds"] / fig["peer_folder"]["seconds"]
        fig["up_vs_peer_file"] = ours["bytes_up"] / fig["peer_file"]["bytes_up"]
        print(f"  bytes down / store = {fig['down_share_of_store']:.4%}; time vs peer_file "
              f"{fig['seconds_vs_peer_file']:.2f}x, vs peer_folder {fig['seconds_vs_peer_folder']:.2f}x; "
              f"bytes up vs peer_file {fig['up_vs_peer_file']:.2f}x")
        goals = [Goal("down_share_of_store", fig["down_share_of_store"], 0.01, "<="),
                 Goal("seconds_vs_peer_folder", fig["seconds_vs_peer_folder"], None, "reported")]
        for g in goals:
            print(g.line())
    finally:
        proxy.stop()
        moto.stop()
        shutil.rmtree(root, ignore_errors=True)
    finish(fig, goals)


if __name__ == "__main__":
    main()

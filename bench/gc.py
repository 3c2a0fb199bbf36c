"""gc benchmark: a store with many versions of a dataset, then retention and gc.

    python bench/gc.py [--size-mb 300] [--versions 20] [--keep 3] [--work-dir /tmp/cdcbench-gc]

Data: --size-mb of incompressible bytes in 6 files (fixed seed); each next version edits 1-5% of
the bytes of one or two files in place (a contiguous block each: the chunks around the block
change, the rest dedups), so every version is pushed as one commit on main.

Measured (one run; gc is not repeated on the same store):
  bytes     pack bytes before, after `forget --keep-last K` + `gc`, and the live bytes (the
            unique chunks the kept versions use)
  gc        seconds of `cdcstore gc --grace 0` in a child process, and its peak RSS (VmHWM)
  read      seconds to read every file of the kept versions once (`cat`, through the store),
            the reference the issue sets gc against
There is no peer here (restic and Xet have no gc to run against this store); the ratio is gc
time over the time to read the live data once. Last line: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/harness.py, bench/data.py
from data import gc_edit, gc_files  # noqa: E402
from harness import ROOT, Goal, code_version, finish  # noqa: E402

sys.path.insert(0, ROOT)
from cdcstore import Store  # noqa: E402


def pack_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(root, "packs")) for f in fs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=300)
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--work-dir", default="/tmp/cdcbench-gc")
    ap.add_argument("--repack-dead", type=float, default=0.5, help="gc's threshold (the default: 0.5)")
    a = ap.parse_args()
    shutil.rmtree(a.work_dir, ignore_errors=True)
    data, root = os.path.join(a.work_dir, "data"), os.path.join(a.work_dir, "store")
    os.makedirs(data)
    rng = random.Random(7)
    gc_files(data, a.size_mb, rng)
    Store.init(root)
    s = Store(root)
    t0 = time.perf_counter()
    commits = []
    for v in range(a.versions):
        if v:
            gc_edit(rng, data, rng.uniform(0.01, 0.05) / 2)
        commits.append(s.push([data], "cdc://ds/", f"v{v}").commit)
    push_s = time.perf_counter() - t0
    before = pack_bytes(root)
    history = s.stats()["history_bytes"]
    forgot = s.forget("ds", keep_last=a.keep)
    t0 = time.perf_counter()
    child = subprocess.run([sys.executable, "-m", "cdcstore", "gc", "--store", root, "--grace", "0", "--json",
                            "--repack-dead", str(a.repack_dead)],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}, check=True)
    gc_s = time.perf_counter() - t0
    gc_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    gc_doc = json.loads(child.stdout)
    after = pack_bytes(root)
    t0 = time.perf_counter()
    read = 0
    for cid in commits[-a.keep:]:
        for e in s.ls(f"cdc://ds@{cid}/", recursive=True):
            read += len(s.cat(f"cdc://ds@{cid}/{e['name']}"))
    read_s = time.perf_counter() - t0
    assert s.check()["problems"] == []
    fig = {"bench": "gc", "args": vars(a), "code": code_version(), "cpus": os.cpu_count(),
           "loadavg_start": list(os.getloadavg()), "versions": a.versions, "history_bytes": history, "push_seconds": push_s,
           "pack_bytes_before": before, "pack_bytes_after": after, "forgotten_commits": len(forgot["forget"]),
           "gc": gc_doc, "gc_seconds": gc_s, "gc_peak_rss_bytes": gc_rss, "read_kept_bytes": read,
           "read_kept_seconds": read_s,
           "goals": {"gc_seconds_over_read_live_once": {"value": gc_s / read_s if read_s else None,
                                                      "goal": "reported", "met": True},
                     "bytes_after_over_before": {"value": after / before, "goal": "reported", "met": True}}}
    goals = [Goal(k, v["value"], None, "reported") for k, v in fig["goals"].items()]
    print(f"{a.versions} versions of {a.size_mb} MB ({history / 1e9:.2f} GB of history) pushed in {push_s:.1f} s; "
          f"packs {before / 1e6:.0f} MB")
    print(f"forget --keep-last {a.keep}: {len(forgot['forget'])} commits; gc: {gc_doc['delete_packs']} packs deleted, "
          f"{gc_doc['repack_packs']} repacked in {gc_s:.1f} s (peak RSS {gc_rss / 1e6:.0f} MB); "
          f"packs {after / 1e6:.0f} MB ({after / before:.2f}x)")
    print(f"reading the {a.keep} kept versions once ({read / 1e6:.0f} MB): {read_s:.1f} s; "
          f"gc / read = {gc_s / read_s:.2f}x")
    finish(fig, goals)


if __name__ == "__main__":
    main()

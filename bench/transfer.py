"""Transfer benchmark: cdcstore push and pull over HTTP on loopback, against fsspec + a static server.

    python bench/transfer.py [--size-mb 300] [--repeat 3] [--data-dir /tmp/cdcbench-transfer]

Data
----
Generated once (cached under --data-dir, keyed by size): a Parquet dataset "v1" of
at least --size-mb MB in 6 files (columns: id, ts, user_id int64; value, price
float64; category, uuid, text string - text is 3-40 words per row drawn from a
skewed vocabulary of 30,000 made-up words, uuid is random hex, so the files do not
compress to nothing), zstd, written by pyarrow with use_content_defined_chunking=True.
Numbers come from numpy with fixed seeds, so every run sees the same bytes. "v2" is
an edited copy:

  part-000  a contiguous block of 1% of its rows gets new value/price/text
  part-001  2% more rows appended at the end
  extra     one new small file (about 0.5% of the dataset)
  the other files are unchanged (hard links to the v1 files)

Each repetition (fresh server store, fresh local directories)
------------------------------------------------------------
A real `python -m cdcstore serve` subprocess on a free loopback port
(bench/servers.py's ServerProcess) over a store made by LocalStore.init, and a
plain aiohttp static file server (`web.static` over the v2 folder) in another
subprocess on another free loopback port (bench/servers.py's StaticServer). The
client runs in this process (Store(url); one fresh Store per operation).

  push v1   Store(url).push([v1/], "cdc://bench/")                     timed
  local v1  Store(dir).push([v1/], "cdc://bench/") into a new local store, timed (PushResult.seconds;
            the peer of push v1: the two alternate which goes first)
  push v2   Store(url).push([v2/], "cdc://bench/")  (dedups against v1) timed
  pull v1   Store(url).pull("cdc://bench@<v1 commit>/", warm/)         timed
  pull v2   Store(url).pull("cdc://bench/", warm/)  into the dir holding v1, timed
  cold      Store(url).pull("cdc://bench/", cold/)  into an empty dir, timed
  fsspec    fsspec.filesystem("http").get([file urls], fsspec/) from the static server
            into an empty dir, timed (all files in one get() call, which fetches them
            concurrently; 5 MiB reads)
  fsspec 1-by-1  the same, one file at a time with get_file (for information: our pull
            also goes file by file), timed
  (the three cold downloads rotate which goes first.) Every downloaded tree is compared
  with the v2 folder byte for byte on the first repetition, outside the timings.

Figures
-------
1. push v2 on the wire / new bytes: (sent_bytes + received_bytes) of the v2 push over
   its new_bytes (raw bytes of chunks the server lacked). Goal <= 1.05.
2. pull v2 into a client holding v1: received_bytes of that pull over v2's new_bytes
   (no goal; `pull` skips identical local files but downloads a changed file whole -
   the local chunk cache is a later issue - so this is what it costs today).
3. cold full download of v2: throughput of our pull over fsspec's (same bytes, same
   run, both servers on loopback serving files that are warm in the page cache; the
   page cache cannot be dropped here). Goal >= 1.0. The figure is the ratio of the median
   throughputs; the per-repetition ratios and the ratio against fsspec one file at a
   time are shown too.
4. push v1 over HTTP against the same push into a local store: local seconds / HTTP seconds.
   Goal >= 0.9.
5. requests per GB (1e9 logical bytes): v1 push, cold pull of v2 (and the others).
Timed figures are medians over --repeat repetitions; byte and request counts are
deterministic (checked across repetitions; wire bytes may differ by a few bytes because
a commit's JSON holds its float timestamp - the first repetition's counts are quoted).
MB = 1e6 bytes.

The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import re
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # bench/harness.py, data.py, servers.py
from data import list_files, transfer_dataset as make_dataset, transfer_root as data_root, tree_bytes  # noqa: E402
from harness import Goal, code_version, finish, loadavg_text, med, rotated, run_dir, start  # noqa: E402
from servers import ServerProcess, StaticServer  # noqa: E402

REPO = "bench"
DEST = f"cdc://{REPO}/"
GOAL_PUSH_WIRE_OVER_NEW = 1.05
GOAL_COLD_OURS_OVER_FSSPEC = 1.0
GOAL_PUSH_HTTP_OVER_LOCAL = 0.9  # push v1 over HTTP at >= 0.9x the throughput of the same push into a local store
FSSPEC_CHUNK = 5 * 2 ** 20
BYTE_SLACK = 16  # wire bytes may differ this much between repetitions (timestamps in commit JSON)


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------

def same_tree(a: str, b: str) -> str | None:
    """None if both trees hold the same files with the same bytes, else what differs."""
    fa, fb = list_files(a), list_files(b)
    if fa != fb:
        return f"file lists differ: {sorted(set(fa) ^ set(fb))}"
    for p in fa:
        if not filecmp.cmp(os.path.join(a, p), os.path.join(b, p), shallow=False):
            return f"{p} differs"
    return None


# ---------------------------------------------------------------------------------------------
# one repetition
# ---------------------------------------------------------------------------------------------

def wire(r) -> dict:
    """Figures of a PushResult or PullResult (a pull has no new_* or chunk counts: 0)."""
    keys = ("seconds", "files", "bytes", "new_bytes", "stored_bytes", "sent_bytes", "received_bytes",
            "requests", "chunks", "new_chunks")
    return {k: getattr(r, k, 0) for k in keys}


def fsspec_get(url: str, files: list[str], dest: str) -> float:
    import fsspec
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    os.makedirs(dest, exist_ok=True)
    t0 = time.perf_counter()
    fs.get([f"{url}/{p}" for p in files], [os.path.join(dest, p) for p in files], chunk_size=FSSPEC_CHUNK)
    dt = time.perf_counter() - t0
    del fs
    return dt


def fsspec_get_sequential(url: str, files: list[str], dest: str) -> float:
    """For information: one file at a time (get_file), as our pull goes file by file."""
    import fsspec
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    os.makedirs(dest, exist_ok=True)
    t0 = time.perf_counter()
    for p in files:
        fs.get_file(f"{url}/{p}", os.path.join(dest, p), chunk_size=FSSPEC_CHUNK)
    dt = time.perf_counter() - t0
    del fs
    return dt


def one_rep(rep: int, work: str, v1: str, v2: str, verify: bool) -> dict:
    from cdcstore.api import Store
    from cdcstore.storage.repository import LocalStore

    rdir = os.path.join(work, f"rep{rep}")
    shutil.rmtree(rdir, ignore_errors=True)
    os.makedirs(rdir)
    store_dir = os.path.join(rdir, "server-store")
    LocalStore.init(store_dir)
    v2_files = list_files(v2)
    srv = ServerProcess(store_dir).start()
    static = StaticServer(v2, v2_files[0]).start()
    out: dict = {}
    try:
        os.sync()  # earlier writes (previous repetition, data generation) stay out of the timed regions

        def run(fn):  # no local dedup cache: this measures what crosses the wire (bench/fs.py measures the cache)
            with Store(srv.url, cache=False) as s:
                return fn(s)

        local = os.path.join(rdir, "local-store")  # the peer of push v1 over HTTP: the same push into a local store
        for side in rotated(["http", "local"], rep):
            os.sync()
            if side == "local":
                with Store(local, create=True) as s:
                    out["push_v1_local_seconds"] = s.push([v1], DEST, message="v1").seconds
            else:
                r1 = run(lambda s: s.push([v1], DEST, message="v1"))
                out["push_v1"] = wire(r1)
        r2 = run(lambda s: s.push([v2], DEST, message="v2"))
        out["push_v2"] = wire(r2)
        warm = os.path.join(rdir, "warm")
        out["pull_v1"] = wire(run(lambda s: s.pull(f"cdc://{REPO}@{r1.commit}/", warm)))
        os.sync()
        out["pull_v2_over_v1"] = wire(run(lambda s: s.pull(DEST, warm)))

        cold, fsd, fsq = (os.path.join(rdir, d) for d in ("cold", "fsspec", "fsspec-seq"))
        os.makedirs(cold)
        sides = ["ours", "fsspec", "fsspec_seq"]
        order = rotated(sides, rep)
        out["cold_order"] = order
        for side in order:
            os.sync()
            if side == "ours":
                out["pull_v2_cold"] = wire(run(lambda s: s.pull(DEST, cold)))
            elif side == "fsspec":
                out["fsspec_seconds"] = fsspec_get(static.url, v2_files, fsd)
            else:
                out["fsspec_seq_seconds"] = fsspec_get_sequential(static.url, v2_files, fsq)
        if verify:
            errs = {name: same_tree(v2, d) for name, d in (("warm", warm), ("cold", cold), ("fsspec", fsd),
                                                           ("fsspec-seq", fsq))}
            out["verify"] = {k: v or "ok" for k, v in errs.items()}
        out["fsspec_bytes"] = tree_bytes(fsd)
        out["fsspec_seq_bytes"] = tree_bytes(fsq)
        out["server_store_bytes"] = sum(os.path.getsize(os.path.join(store_dir, p))
                                        for p in list_files(store_dir))
    finally:
        static.stop()
        srv.stop()
        out["server_status"] = status_counts(srv.log_text())
    shutil.rmtree(rdir, ignore_errors=True)
    return out


def status_counts(log: str) -> dict:
    """HTTP statuses in the server's access log (a 429 or 5xx would mean retries inflated the counts)."""
    counts: dict = {}
    for m in re.finditer(r'cdcstore\.access \S+ "[^"]*" (\d{3}) ', log):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return dict(sorted(counts.items()))


# ---------------------------------------------------------------------------------------------
# reporting
# ---------------------------------------------------------------------------------------------

COUNT_KEYS = ("files", "bytes", "new_bytes", "stored_bytes", "sent_bytes", "received_bytes", "requests",
              "chunks", "new_chunks")
OPS = ("push_v1", "push_v2", "pull_v1", "pull_v2_over_v1", "pull_v2_cold")


def summarize(reps: list[dict], info: dict) -> dict:
    fig: dict = {"data": info, "repeat": len(reps), "ops": {}}
    varying = []
    for op in OPS:
        first = reps[0][op]
        counts = {k: first[k] for k in COUNT_KEYS}
        for k in COUNT_KEYS:
            vals = [r[op][k] for r in reps]
            # commits carry a float timestamp, so their JSON (sent by a push, read by a pull) may
            # differ by a byte or two between repetitions; anything more is worth a warning
            slack = BYTE_SLACK if k in ("sent_bytes", "received_bytes") else 0
            if max(vals) - min(vals) > slack:
                varying.append(f"{op}.{k}: {vals}")
        secs = [r[op]["seconds"] for r in reps]
        m = med(secs)
        fig["ops"][op] = {**counts, "seconds": m, "times_s": secs,
                          "mb_s": counts["bytes"] / m / 1e6 if m else None,
                          "requests_per_gb": counts["requests"] / (counts["bytes"] / 1e9) if counts["bytes"] else None,
                          "wire_bytes": counts["sent_bytes"] + counts["received_bytes"]}
    fs_secs = [r["fsspec_seconds"] for r in reps]
    fb = reps[0]["fsspec_bytes"]
    fig["ops"]["fsspec_cold"] = {"bytes": fb, "seconds": med(fs_secs), "times_s": fs_secs,
                                 "mb_s": fb / med(fs_secs) / 1e6}
    fq_secs = [r["fsspec_seq_seconds"] for r in reps]
    fig["ops"]["fsspec_cold_sequential"] = {"bytes": fb, "seconds": med(fq_secs), "times_s": fq_secs,
                                            "mb_s": fb / med(fq_secs) / 1e6}
    local = [r["push_v1_local_seconds"] for r in reps]
    fig["ops"]["push_v1_local"] = {"bytes": reps[0]["push_v1"]["bytes"], "seconds": med(local), "times_s": local,
                                   "mb_s": reps[0]["push_v1"]["bytes"] / med(local) / 1e6}
    fig["server_status_per_rep"] = [r["server_status"] for r in reps]  # from the server's access log
    fig["counts_vary_between_reps"] = varying
    O = fig["ops"]
    p2, w2, c2 = O["push_v2"], O["pull_v2_over_v1"], O["pull_v2_cold"]
    new = p2["new_bytes"]
    per_rep_ratio = [r["fsspec_seconds"] / r["pull_v2_cold"]["seconds"] for r in reps]
    fig["figures"] = {
        "push_v2_wire_over_new_bytes": p2["wire_bytes"] / new if new else None,
        "push_v2_sent_over_new_bytes": p2["sent_bytes"] / new if new else None,
        "push_v2_sent_over_stored_bytes": p2["sent_bytes"] / p2["stored_bytes"] if p2["stored_bytes"] else None,
        "pull_v2_over_v1_received_over_new_bytes": w2["received_bytes"] / new if new else None,
        "pull_v2_over_v1_wire_over_new_bytes": w2["wire_bytes"] / new if new else None,
        "cold_throughput_ours_over_fsspec": O["fsspec_cold"]["seconds"] / c2["seconds"],
        "cold_throughput_ours_over_fsspec_per_rep": per_rep_ratio,
        "cold_throughput_ours_over_fsspec_per_rep_median": med(per_rep_ratio),
        "cold_throughput_ours_over_fsspec_sequential": O["fsspec_cold_sequential"]["seconds"] / c2["seconds"],
        "cold_received_over_bytes": c2["received_bytes"] / c2["bytes"],
        "push_v1_http_over_local": O["push_v1_local"]["seconds"] / O["push_v1"]["seconds"],
        "requests_per_gb_push_v1": O["push_v1"]["requests_per_gb"],
        "requests_per_gb_push_v2": O["push_v2"]["requests_per_gb"],
        "requests_per_gb_pull_v1": O["pull_v1"]["requests_per_gb"],
        "requests_per_gb_pull_v2_cold": c2["requests_per_gb"],
        "requests_per_gb_pull_v2_over_v1": w2["requests_per_gb"],
    }
    F = fig["figures"]
    fig["goals_list"] = [
        Goal("push_v2_wire_over_new_bytes", F["push_v2_wire_over_new_bytes"], GOAL_PUSH_WIRE_OVER_NEW, "<="),
        Goal("cold_throughput_ours_over_fsspec", F["cold_throughput_ours_over_fsspec"], GOAL_COLD_OURS_OVER_FSSPEC,
             ">="),
        Goal("push_v1_http_over_local", F["push_v1_http_over_local"], GOAL_PUSH_HTTP_OVER_LOCAL, ">="),
    ]
    fig["goals"] = {g.name: {"goal": g.text, "met": bool(g.met)} for g in fig["goals_list"]}
    return fig


def mb(x: float) -> str:
    return f"{x / 1e6:,.2f} MB"


def report(fig: dict) -> None:
    O, F, G = fig["ops"], fig["figures"], fig["goals"]
    n = fig["repeat"]
    print(f"\nresults (times: median of {n}; byte and request counts are deterministic; MB = 1e6 bytes)")
    print(f"  {'operation':<22} {'files':>5} {'bytes':>12} {'new bytes':>12} {'sent':>12} {'received':>12} "
          f"{'requests':>8} {'req/GB':>7} {'median s':>9} {'MB/s':>7}")
    for op in OPS:
        o = O[op]
        print(f"  {op:<22} {o['files']:>5} {mb(o['bytes']):>12} {mb(o['new_bytes']):>12} {mb(o['sent_bytes']):>12} "
              f"{mb(o['received_bytes']):>12} {o['requests']:>8} {o['requests_per_gb']:>7.0f} {o['seconds']:>9.2f} "
              f"{o['mb_s']:>7.1f}")
    f = O["fsspec_cold"]
    for label, key in (("fsspec get (all files)", "fsspec_cold"), ("fsspec get_file 1-by-1", "fsspec_cold_sequential")):
        f = O[key]
        print(f"  {label:<22} {fig['data']['v2_files']:>5} {mb(f['bytes']):>12} {'':>12} "
              f"{'':>12} {'':>12} {'':>8} {'':>7} {f['seconds']:>9.2f} {f['mb_s']:>7.1f}")
    f = O["fsspec_cold"]
    print("  (push 'new bytes' = raw bytes of chunks the server lacked; pull 'new bytes' = bytes of the files "
          "that had to be written)")
    p2 = O["push_v2"]
    print("\nfigures")
    print(f"  1. push v2: wire {mb(p2['wire_bytes'])} (sent {mb(p2['sent_bytes'])} + received "
          f"{mb(p2['received_bytes'])}) / new bytes {mb(p2['new_bytes'])} = {F['push_v2_wire_over_new_bytes']:.4f} "
          f"(goal {G['push_v2_wire_over_new_bytes']['goal']}: "
          f"{'met' if G['push_v2_wire_over_new_bytes']['met'] else 'NOT met'}); "
          f"stored (packs) {mb(p2['stored_bytes'])}, sent/stored {F['push_v2_sent_over_stored_bytes']:.4f}")
    w = O["pull_v2_over_v1"]
    print(f"  2. pull v2 into a client holding v1: received {mb(w['received_bytes'])} / v2 new bytes "
          f"{mb(p2['new_bytes'])} = {F['pull_v2_over_v1_received_over_new_bytes']:.2f}x "
          f"({w['requests']} requests; files rewritten: {mb(w['new_bytes'])} of {mb(w['bytes'])}); no goal - "
          f"pull skips identical local files but fetches each changed file whole")
    c = O["pull_v2_cold"]
    per = ", ".join(f"{x:.2f}" for x in F["cold_throughput_ours_over_fsspec_per_rep"])
    print(f"  3. cold full download of v2 ({mb(c['bytes'])}): ours {c['mb_s']:.1f} MB/s vs fsspec+static "
          f"{f['mb_s']:.1f} MB/s -> ours/fsspec = {F['cold_throughput_ours_over_fsspec']:.2f}x "
          f"(per repetition: {per}; median of those {F['cold_throughput_ours_over_fsspec_per_rep_median']:.2f}) "
          f"(goal {G['cold_throughput_ours_over_fsspec']['goal']}: "
          f"{'met' if G['cold_throughput_ours_over_fsspec']['met'] else 'NOT met'}); for information, against "
          f"fsspec one file at a time ({O['fsspec_cold_sequential']['mb_s']:.1f} MB/s): "
          f"{F['cold_throughput_ours_over_fsspec_sequential']:.2f}x; ours received "
          f"{mb(c['received_bytes'])} on the wire ({F['cold_received_over_bytes']:.3f} of the file bytes). "
          f"Server-side data is warm in the page cache for both (dropping it is not possible here)")
    g = next(g for g in fig["goals_list"] if g.name == "push_v1_http_over_local")
    print(f"  4. push v1 over HTTP {O['push_v1']['mb_s']:.1f} MB/s vs into a local store {O['push_v1_local']['mb_s']:.1f} "
          f"MB/s -> http/local = {F['push_v1_http_over_local']:.2f}x (goal {g.text}: {'met' if g.met else 'NOT met'})")
    print(f"  5. requests per GB: push v1 {F['requests_per_gb_push_v1']:.0f}, push v2 {F['requests_per_gb_push_v2']:.0f}, "
          f"pull v1 {F['requests_per_gb_pull_v1']:.0f}, cold pull v2 {F['requests_per_gb_pull_v2_cold']:.0f}, "
          f"pull v2 over v1 {F['requests_per_gb_pull_v2_over_v1']:.0f} (per GB of logical bytes)")
    if fig["counts_vary_between_reps"]:
        print("  WARNING: counts differ between repetitions: " + "; ".join(fig["counts_vary_between_reps"]))


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=300, help="size of the v1 dataset in MB (default 300)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions; medians are quoted (default 3)")
    ap.add_argument("--data-dir", default="/tmp/cdcbench-transfer",
                    help="generated data and per-repetition stores (default /tmp/cdcbench-transfer)")
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip the byte-for-byte check of the pulled trees (first repetition)")
    args = ap.parse_args()
    opening = start("transfer")  # the load average before the run

    import aiohttp
    import fsspec
    import pyarrow
    print(f"transfer benchmark: cdcstore push/pull over HTTP on loopback vs fsspec HTTPFileSystem + aiohttp "
          f"static server; {args.repeat} repetitions, medians quoted; python {platform.python_version()}, "
          f"{os.cpu_count()} cpus, aiohttp {aiohttp.__version__}, fsspec {fsspec.__version__}, pyarrow "
          f"{pyarrow.__version__}; data under {args.data_dir}; load average at start {loadavg_text()}")
    t0 = time.perf_counter()
    cached = os.path.exists(os.path.join(data_root(args.data_dir, args.size_mb), "DONE.json"))
    v1, v2, info = make_dataset(args.data_dir, args.size_mb)
    info = dict(info, v1_bytes=tree_bytes(v1), v2_bytes=tree_bytes(v2), v1_files=len(list_files(v1)),
                v2_files=len(list_files(v2)))
    print(f"data: v1 {mb(info['v1_bytes'])} in {info['v1_files']} files, v2 {mb(info['v2_bytes'])} in "
          f"{info['v2_files']} files (part-000 rows {info['v2_part000_updated_rows']} updated, "
          f"{info['v2_part001_appended_rows']:,} rows appended to part-001, new extra.parquet); "
          f"ready in {time.perf_counter() - t0:.1f} s{' (cached from an earlier run)' if cached else ''}")

    work = run_dir(args.data_dir, "run")
    reps = []
    errors = []
    for rep in range(args.repeat):
        t0 = time.perf_counter()
        try:
            r = one_rep(rep, work, v1, v2, args.verify and rep == 0)
        except Exception as e:
            print(f"  rep {rep + 1}/{args.repeat} FAILED: {type(e).__name__}: {e}")
            print(json.dumps({"error": f"{type(e).__name__}: {e}", "rep": rep, "data": info}))
            return 1
        reps.append(r)
        if "verify" in r:
            bad = {k: v for k, v in r["verify"].items() if v != "ok"}
            if bad:
                errors.append(f"rep {rep}: pulled trees differ from v2: {bad}")
            print("  checked: " + ", ".join(f"{k} {v}" for k, v in r["verify"].items()) +
                  " (pulled trees against the v2 folder, byte for byte)")
        # (one 404 per repetition is expected: the first push asks for the branches of a repo
        # that does not exist yet)
        odd = {k: v for k, v in r["server_status"].items() if k == "429" or k[0] == "5"}
        if odd:
            errors.append(f"rep {rep}: the server answered {odd} (retries may inflate request and byte counts)")
        for k in ("fsspec_bytes", "fsspec_seq_bytes"):
            if r[k] != info["v2_bytes"]:
                errors.append(f"rep {rep}: {k}: fsspec downloaded {r[k]} bytes, expected {info['v2_bytes']}")
        print(f"  rep {rep + 1}/{args.repeat} ({time.perf_counter() - t0:.0f} s): "
              f"push v1 {r['push_v1']['seconds']:.2f} s, push v2 {r['push_v2']['seconds']:.2f} s, "
              f"pull v1 {r['pull_v1']['seconds']:.2f} s, pull v2 over v1 {r['pull_v2_over_v1']['seconds']:.2f} s, "
              f"cold pull v2 {r['pull_v2_cold']['seconds']:.2f} s, fsspec {r['fsspec_seconds']:.2f} s, "
              f"fsspec 1-by-1 {r['fsspec_seq_seconds']:.2f} s "
              f"(order {'/'.join(r['cold_order'])})")

    shutil.rmtree(work, ignore_errors=True)
    fig = {**opening, **summarize(reps, info)}
    fig["errors"] = errors
    fig["code"] = code_version()
    fig["versions"] = {"python": platform.python_version(), "aiohttp": aiohttp.__version__,
                       "fsspec": fsspec.__version__, "pyarrow": pyarrow.__version__, "cpus": os.cpu_count()}
    report(fig)
    for e in errors:
        print(f"  ERROR: {e}")
    finish(fig, fig.pop("goals_list"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

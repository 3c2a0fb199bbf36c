"""Parquet edit dedup benchmark: new bytes of an edited table against its base version.

    python bench/dedup.py [--size-mb 120] [--data-dir /tmp/cdcbench-dedup] [--repeat 3]

Data
----
One generated table (columns: id, ts, user_id int64; value, price float64;
category, text string - the text is 3-40 words per row drawn from a skewed
vocabulary of 30,000 made-up words, so it compresses like prose rather than to
nothing), with enough rows that the base file written by plain pyarrow is about
--size-mb MB on disk (default 120; the spec asks for >= 100). Numbers are
generated with numpy from fixed seeds, so every run sees the same bytes.

Two writers, both zstd (the codec is fixed to the same value for both so that the
comparison is about layout, not about compression; --compression changes it):

  plain    pyarrow.parquet.write_table(t, path, use_content_defined_chunking=True,
           row_group_size=R, compression=...), R = ceil(rows / 9.5) fixed rows, so the
           base has 10 row groups, the last one about half full (as is typical: a row
           count that is an exact multiple of R would make appends land in a fresh row
           group, which real files rarely see)
  cdcw     cdcstore.parquet.write_table(t, path, row_group_bytes=B, compression=...)
           (Arrow CDC pages + content-defined row groups + page index), B = the base
           table's Arrow memory / 12, so the base has several (>= 8 expected) groups

Scenarios (each an edit of the base table, written again by the same writer):

  identical     the base file itself uploaded again (and, for information, whether
                re-writing the same table gives byte-identical files)
  append_1pct   1% new rows appended at the end
  insert_100    100 new rows inserted near the middle (not on a row-group boundary)
  delete_1pct   a contiguous 1% of the rows deleted near the middle
  update_0.1pct 0.1% of the cells of `value` (float) and, independently, 0.1% of the
                cells of `text` replaced, at random rows scattered through the file
  add_column    a new float64 column `score` appended
  drop_column   column `user_id` dropped
  rg_size_half  same table, row-group size halved (plain: R/2 rows; cdcw: B/2 bytes)

Variants (each with a fresh target per scenario: base uploaded first, then the
edited file to the same place; the figure is the new bytes of that second upload):

  a  hf_xet 1.8 `local://` CAS, plain file: XetSession().new_upload_commit(
     endpoint="local://DIR"), one child process per upload (base, then edited), with
     a fresh DIR and HF_XET_CACHE per scenario; DeduplicationMetrics.new_bytes
  b  cdcstore byte CDC (IngestOptions(parquet_pages=False)), plain file
  c  cdcstore page groups (default IngestOptions), plain file
  d  cdcstore page groups, file written by cdcstore.parquet.write_table
     cdcstore figures: TransferResult.new_bytes of the second Store.push (raw bytes
     of chunks the store lacked), each in a fresh store made by Store.init. The
     edited file is then read back from the store and hash-checked, and the figure
     cross-checked against Store.stats of the new revision (--no-verify skips both);
     a mismatch is printed as a warning/note.

Goals (reported pass/fail, nothing is tuned to meet them):
  c <= a in every scenario; c <= 0.85 a for insert_100 and delete_1pct;
  d <= 0.25 a for insert_100 and delete_1pct; identical re-upload = 0 new bytes
  (required of b, c, d; hf_xet's figure shown for information).

Also reported: chunk counts of the base upload (TransferResult.chunks for b, c, d;
DeduplicationMetrics.total_chunks for hf_xet), the row-group counts of every file,
and the write time of cdcstore's writer against plain pq.write_table with CDC on
(same table, same codec; median of --repeat runs, interleaved). New-bytes figures
are deterministic, so the scenarios run once. MB = 1e6 bytes.

The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/harness.py, bench/data.py
from data import DEDUP_SCENARIOS as SCENARIOS, dedup_edit as edited_table, dedup_table as make_table  # noqa: E402
from harness import Goal, code_version, finish, rounds, start, xet_env  # noqa: E402

GOAL_C_OVER_A_MAX = 1.0
GOAL_C_OVER_A_SHIFT = 0.85
GOAL_D_OVER_A_SHIFT = 0.25
SHIFT_SCENARIOS = ("insert_100", "delete_1pct")
VARIANTS = ("a", "b", "c", "d")
VARIANT_LABEL = {
    "a": "hf_xet local://, plain pyarrow CDC file",
    "b": "cdcstore byte CDC, plain pyarrow CDC file",
    "c": "cdcstore page groups, plain pyarrow CDC file",
    "d": "cdcstore page groups, cdcstore.parquet.write_table file",
}
DEST = "cdc://bench/data.parquet"
PLAIN_ROW_GROUPS = 9.5  # fixed rows per group = ceil(rows / 9.5): 10 groups, the last about half full
CDCW_RG_DIVISOR = 12


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------

def write_plain(table, path: str, row_group_size: int, compression: str) -> None:
    import pyarrow.parquet as pq
    pq.write_table(table, path, use_content_defined_chunking=True, row_group_size=row_group_size,
                   compression=compression)


def write_cdcw(table, path: str, row_group_bytes: int, compression: str) -> list[int]:
    from cdcstore.parquet import write_table
    return write_table(table, path, row_group_bytes=row_group_bytes, compression=compression)


def num_row_groups(path: str) -> int:
    import pyarrow.parquet as pq
    return pq.ParquetFile(path).metadata.num_row_groups


def row_group_rows(path: str) -> list[int]:
    import pyarrow.parquet as pq
    md = pq.ParquetFile(path).metadata
    return [md.row_group(i).num_rows for i in range(md.num_row_groups)]


# ---------------------------------------------------------------------------------------------
# uploads
# ---------------------------------------------------------------------------------------------

def xet_worker(src: str, target: str) -> dict:
    import hf_xet
    t0 = time.perf_counter()
    sess = hf_xet.XetSession()
    commit = sess.new_upload_commit(endpoint="local://" + os.path.abspath(target))
    h = commit.start_upload_file(src, sha256=hf_xet.SKIP_SHA256)
    report = commit.wait_to_finish()
    dm = report.dedup_metrics
    ok = h.result() is not None
    return {"seconds": time.perf_counter() - t0, "ok": ok, "bytes": os.path.getsize(src),
            **{k: getattr(dm, k) for k in ("new_bytes", "new_chunks", "total_bytes", "total_chunks",
                                           "deduped_bytes", "deduped_chunks", "defrag_prevented_dedup_bytes",
                                           "defrag_prevented_dedup_chunks", "xorb_bytes_uploaded")}}


def xet_upload(src: str, target: str, cache: str) -> dict:
    env = dict(os.environ, **xet_env(cache))
    cmd = [sys.executable, os.path.abspath(__file__), "--_xet", src, target]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"hf_xet child failed (exit {p.returncode}) on {src}:\n{p.stderr.decode()[-3000:]}")
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def run_xet(base: str, edited: str, work: str) -> dict:
    target, cache = os.path.join(work, "xet-cas"), os.path.join(work, "xet-cache")
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    r1 = xet_upload(base, target, cache)
    r2 = xet_upload(edited, target, cache)
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    if not (r1["ok"] and r2["ok"]):
        raise RuntimeError("hf_xet upload returned no result")
    return {"new_bytes": r2["new_bytes"], "base_chunks": r1["total_chunks"], "edited_chunks": r2["total_chunks"],
            "base_new_bytes": r1["new_bytes"], "new_chunks": r2["new_chunks"],
            "defrag_prevented_dedup_bytes": r2["defrag_prevented_dedup_bytes"],
            "seconds": r1["seconds"] + r2["seconds"]}


def run_cdc(base: str, edited: str, work: str, parquet_pages: bool, verify: bool = True) -> dict:
    from cdcstore.api import Store
    from cdcstore.engine.ingest import IngestOptions
    target = os.path.join(work, "store")
    shutil.rmtree(target, ignore_errors=True)
    opts = IngestOptions(parquet_pages=parquet_pages)
    # per-file detail (which chunking a file got): `detail=True` where push takes it (the API
    # has had it as a keyword and as always-on)
    extra = {"detail": True} if "detail" in inspect.signature(Store.push).parameters else {}
    t0 = time.perf_counter()
    store = Store.init(target)
    try:
        r1 = store.push([base], DEST, message="base", options=opts, **extra)
        r2 = store.push([edited], DEST, message="edited", options=opts, **extra)
        dt = time.perf_counter() - t0
        check: dict = {}
        if verify:  # the measurement means nothing if the store does not give the file back
            h = hashlib.sha256()
            with store.open(DEST) as f:
                for block in iter(lambda: f.read(1 << 23), b""):
                    h.update(block)
            check["roundtrip_ok"] = h.hexdigest() == file_sha256(edited)
            if r2.changed:  # (an unchanged push makes no commit: the head is still the base)
                try:  # independent accounting: raw bytes of chunks the head has and its parent lacks
                    check["stats_new_bytes"] = store.stats(DEST)["new_bytes"]
                except Exception as e:  # noqa: BLE001 - informational only
                    check["stats_error"] = repr(e)
    finally:
        store.close()
    shutil.rmtree(target, ignore_errors=True)
    d1, d2 = (next(iter((r.files_detail or {"?": {"chunking": "unknown"}}).values())) for r in (r1, r2))
    return {"new_bytes": r2.new_bytes, "base_chunks": r1.chunks, "edited_chunks": r2.chunks,
            "base_new_bytes": r1.new_bytes, "new_chunks": r2.new_chunks, "stored_bytes": r2.stored_bytes,
            "chunking": [d1["chunking"], d2["chunking"]], "changed": r2.changed, "seconds": dt, **check}


_SHA: dict = {}


def file_sha256(path: str) -> str:
    if path not in _SHA:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 23), b""):
                h.update(block)
        _SHA[path] = h.hexdigest()
    return _SHA[path]


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------

def mbs(x: float) -> str:
    return f"{x / 1e6:.2f}"


def pct(x: float, of: float) -> str:
    return f"{100 * x / of:.2f}%" if of else "n/a"


def ratio(x: float, y: float) -> float | None:
    if y == 0:
        return 0.0 if x == 0 else None
    return x / y


def fr(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.3f}"


def same_bytes(p: str, q: str) -> bool:
    if os.path.getsize(p) != os.path.getsize(q):
        return False
    with open(p, "rb") as f, open(q, "rb") as g:
        while True:
            a, b = f.read(1 << 24), g.read(1 << 24)
            if a != b:
                return False
            if not a:
                return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=120,
                    help="on-disk size of the base file written by plain pyarrow, MB (default 120)")
    ap.add_argument("--data-dir", default="/tmp/cdcbench-dedup", help="generated data and targets")
    ap.add_argument("--repeat", type=int, default=3, help="runs of the write-time comparison (median quoted)")
    ap.add_argument("--compression", default="zstd", help="Parquet codec of both writers (default zstd)")
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip reading each edited file back from the cdcstore store (hash check) "
                         "and the Store.stats cross-check")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset to run")
    ap.add_argument("--_xet", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    opening = start("dedup")  # the load average before the run
    if args._xet:
        print(json.dumps(xet_worker(*args._xet)))
        return

    import importlib.metadata

    import hf_xet
    import pyarrow as pa
    import cdcstore  # noqa: F401
    try:
        xet_version = importlib.metadata.version("hf_xet")
    except importlib.metadata.PackageNotFoundError:
        xet_version = getattr(hf_xet, "__version__", "?")

    t_start = time.perf_counter()
    scenarios = [s for s in args.scenarios.split(",") if s]
    for s in scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s!r}; choose from {', '.join(SCENARIOS)}")
    print(f"dedup benchmark: Parquet edits, new bytes of the edited file; hf_xet "
          f"{xet_version} local:// vs cdcstore; pyarrow {pa.__version__}, "
          f"python {platform.python_version()}, {os.cpu_count()} cpus; data under {args.data_dir}")
    data = args.data_dir
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)

    # -- base table, calibrated to --size-mb on disk (plain writer) --------------------------------
    t0 = time.perf_counter()
    probe_rows = 100_000
    probe = os.path.join(data, "probe.parquet")
    write_plain(make_table(1, probe_rows), probe, probe_rows, args.compression)
    per_row = os.path.getsize(probe) / probe_rows
    os.unlink(probe)
    rows = int(args.size_mb * 1e6 / per_row)
    base = make_table(1, rows)
    rg_rows = math.ceil(rows / PLAIN_ROW_GROUPS)
    rg_bytes = base.nbytes // CDCW_RG_DIVISOR
    base_dir = os.path.join(data, "base")
    os.makedirs(base_dir)
    plain_base = os.path.join(base_dir, "plain.parquet")
    cdcw_base = os.path.join(base_dir, "cdcw.parquet")
    write_plain(base, plain_base, rg_rows, args.compression)
    cdcw_sizes = write_cdcw(base, cdcw_base, rg_bytes, args.compression)
    gen_seconds = time.perf_counter() - t0
    plain_size, cdcw_size = os.path.getsize(plain_base), os.path.getsize(cdcw_base)
    dataset = {"rows": rows, "columns": base.column_names, "arrow_bytes": base.nbytes,
               "plain_file_bytes": plain_size, "cdcw_file_bytes": cdcw_size,
               "plain_row_group_rows": rg_rows, "plain_row_groups": num_row_groups(plain_base),
               "cdcw_row_group_bytes": rg_bytes, "cdcw_row_groups": len(cdcw_sizes),
               "cdcw_row_group_rows": cdcw_sizes, "compression": args.compression,
               "generate_seconds": gen_seconds}
    print(f"base table: {rows:,} rows, {len(base.column_names)} columns ({', '.join(base.column_names)}), "
          f"{base.nbytes / 1e6:.1f} MB in Arrow memory; generated and written in {gen_seconds:.1f} s")
    print(f"  plain (pq.write_table, CDC on, {args.compression}, row_group_size={rg_rows:,}): "
          f"{plain_size / 1e6:.1f} MB, {dataset['plain_row_groups']} row groups")
    print(f"  cdcw  (cdcstore.parquet.write_table, {args.compression}, row_group_bytes={rg_bytes:,}): "
          f"{cdcw_size / 1e6:.1f} MB, {len(cdcw_sizes)} row groups "
          f"(rows per group: {', '.join(f'{n:,}' for n in cdcw_sizes)})")
    if plain_size < 100e6:
        print(f"  note: the base file is under 100 MB (--size-mb {args.size_mb:g}); the spec asks for >= 100 MB")

    # -- write-time cost: cdcstore writer vs plain pyarrow CDC (same table, same codec) ------------
    tdir = os.path.join(data, "timing")
    os.makedirs(tdir)
    times: dict = {"plain": [], "cdcw": []}
    for _, w in rounds(("plain", "cdcw"), args.repeat):
        path = os.path.join(tdir, f"{w}.parquet")
        t0 = time.perf_counter()
        if w == "plain":
            write_plain(base, path, rg_rows, args.compression)
        else:
            write_cdcw(base, path, rg_bytes, args.compression)
        times[w].append(time.perf_counter() - t0)
        os.unlink(path)
    shutil.rmtree(tdir)
    wt = {w: statistics.median(v) for w, v in times.items()}
    write_timing = {"plain_seconds": wt["plain"], "cdcw_seconds": wt["cdcw"], "runs": times,
                    "cdcw_over_plain": wt["cdcw"] / wt["plain"],
                    "plain_mb_s": base.nbytes / wt["plain"] / 1e6, "cdcw_mb_s": base.nbytes / wt["cdcw"] / 1e6}
    print(f"write time (median of {args.repeat}, same table): plain pq.write_table CDC {wt['plain']:.2f} s, "
          f"cdcstore.parquet.write_table {wt['cdcw']:.2f} s -> {write_timing['cdcw_over_plain']:.2f}x "
          f"({write_timing['plain_mb_s']:.0f} vs {write_timing['cdcw_mb_s']:.0f} MB/s of Arrow data)")

    # -- scenarios -----------------------------------------------------------------------------------
    results: dict = {}
    for name in scenarios:
        t0 = time.perf_counter()
        sdir = os.path.join(data, name)
        os.makedirs(sdir)
        table, desc = edited_table(name, base, rows)
        s: dict = {"description": desc, "rows": table.num_rows}
        if name == "identical":
            plain_ed, cdcw_ed = plain_base, cdcw_base
            # for information: does writing the same table again give the same bytes?
            p2, c2 = os.path.join(sdir, "plain-rewrite.parquet"), os.path.join(sdir, "cdcw-rewrite.parquet")
            write_plain(base, p2, rg_rows, args.compression)
            write_cdcw(base, c2, rg_bytes, args.compression)
            s["plain_rewrite_identical"] = same_bytes(p2, plain_base)
            s["cdcw_rewrite_identical"] = same_bytes(c2, cdcw_base)
            os.unlink(p2)
            os.unlink(c2)
        else:
            plain_ed, cdcw_ed = os.path.join(sdir, "plain.parquet"), os.path.join(sdir, "cdcw.parquet")
            rgr = rg_rows // 2 if name == "rg_size_half" else rg_rows
            rgb = rg_bytes // 2 if name == "rg_size_half" else rg_bytes
            write_plain(table, plain_ed, rgr, args.compression)
            write_cdcw(table, cdcw_ed, rgb, args.compression)
            s["plain_row_group_rows"], s["cdcw_row_group_bytes"] = rgr, rgb
        del table
        s["plain_file_bytes"], s["cdcw_file_bytes"] = os.path.getsize(plain_ed), os.path.getsize(cdcw_ed)
        s["plain_row_groups"], s["cdcw_row_groups"] = num_row_groups(plain_ed), num_row_groups(cdcw_ed)
        s["cdcw_row_group_rows_list"] = row_group_rows(cdcw_ed)
        t_write = time.perf_counter() - t0
        s["a"] = run_xet(plain_base, plain_ed, sdir)
        s["b"] = run_cdc(plain_base, plain_ed, sdir, parquet_pages=False, verify=args.verify)
        s["c"] = run_cdc(plain_base, plain_ed, sdir, parquet_pages=True, verify=args.verify)
        s["d"] = run_cdc(cdcw_base, cdcw_ed, sdir, parquet_pages=True, verify=args.verify)
        shutil.rmtree(sdir)
        s["seconds"] = time.perf_counter() - t0
        s["write_seconds"] = t_write
        a = s["a"]["new_bytes"]
        s["ratio_b_over_a"] = ratio(s["b"]["new_bytes"], a)
        s["ratio_c_over_a"] = ratio(s["c"]["new_bytes"], a)
        s["ratio_d_over_a"] = ratio(s["d"]["new_bytes"], a)
        results[name] = s
        print(f"  {name:<14} {desc}: a {mbs(a)} MB, b {mbs(s['b']['new_bytes'])}, c {mbs(s['c']['new_bytes'])}, "
              f"d {mbs(s['d']['new_bytes'])} MB ({s['seconds']:.0f} s)", flush=True)
        for v in "bcd":
            modes = s[v]["chunking"]
            want = "bytes" if v == "b" else "parquet-pages"
            if modes != [want, want]:
                print(f"    warning: variant {v} chunked the files as {modes}, expected {want}")
            if s[v].get("roundtrip_ok") is False:
                print(f"    warning: variant {v}: reading the edited file back from the store gave other bytes")
            if "stats_new_bytes" in s[v] and s[v]["stats_new_bytes"] != s[v]["new_bytes"]:
                print(f"    note: variant {v}: Store.stats new_bytes {s[v]['stats_new_bytes']:,} != push "
                      f"new_bytes {s[v]['new_bytes']:,}")
            if "stats_error" in s[v]:
                print(f"    note: variant {v}: Store.stats failed: {s[v]['stats_error']}")

    # -- report ----------------------------------------------------------------------------------------
    print("\nnew bytes of the edited version after uploading the base (MB = 1e6 bytes; % of the edited file)")
    for v in VARIANTS:
        print(f"  {v} = {VARIANT_LABEL[v]}")
    hdr = (f"  {'scenario':<14} {'a MB':>8} {'a %':>7} {'b MB':>8} {'b %':>7} {'c MB':>8} {'c %':>7} "
           f"{'d MB':>8} {'d %':>7} {'c/a':>7} {'d/a':>7} {'b/a':>7}")
    print(hdr)
    for name, s in results.items():
        cells = []
        for v in VARIANTS:
            size = s["cdcw_file_bytes"] if v == "d" else s["plain_file_bytes"]
            cells.append(f"{mbs(s[v]['new_bytes']):>8} {pct(s[v]['new_bytes'], size):>7}")
        print(f"  {name:<14} {' '.join(cells)} {fr(s['ratio_c_over_a']):>7} {fr(s['ratio_d_over_a']):>7} "
              f"{fr(s['ratio_b_over_a']):>7}")
    print(f"  (a, b, c: plain file of {plain_size / 1e6:.1f} MB base; d: cdcstore-written file of "
          f"{cdcw_size / 1e6:.1f} MB base; ratio 0/0 shown as 0.000)")

    print("\nfiles per scenario (edited version): size and row groups")
    print(f"  {'scenario':<14} {'plain MB':>9} {'plain RGs':>10} {'cdcw MB':>9} {'cdcw RGs':>9}")
    print(f"  {'(base)':<14} {mbs(plain_size):>9} {dataset['plain_row_groups']:>10} {mbs(cdcw_size):>9} "
          f"{dataset['cdcw_row_groups']:>9}")
    for name, s in results.items():
        print(f"  {name:<14} {mbs(s['plain_file_bytes']):>9} {s['plain_row_groups']:>10} "
              f"{mbs(s['cdcw_file_bytes']):>9} {s['cdcw_row_groups']:>9}")
    if "identical" in results:
        s = results["identical"]
        print(f"  re-writing the same table gives identical bytes: plain {s['plain_rewrite_identical']}, "
              f"cdcw {s['cdcw_rewrite_identical']}")

    first = results[scenarios[0]]
    chunks = {v: first[v]["base_chunks"] for v in VARIANTS}
    consistent = all(results[n][v]["base_chunks"] == chunks[v] for n in results for v in VARIANTS)
    print("\nchunks of the base upload (same in every scenario: %s)" % consistent)
    for v in VARIANTS:
        size = cdcw_size if v == "d" else plain_size
        src = "DeduplicationMetrics.total_chunks" if v == "a" else "TransferResult.chunks"
        print(f"  {v}: {chunks[v]:>7,} chunks, mean {size / max(1, chunks[v]) / 1024:,.1f} KiB ({src})")

    # -- goals -----------------------------------------------------------------------------------------
    goals: list[Goal] = []

    def goal(text: str, g: Goal, detail: str) -> None:
        goals.append(g)
        state = "n/a (scenario not run)" if g.met is None else ("PASS" if g.met else "FAIL")
        print(f"  [{state}] {text}: {detail}")

    print("\ngoals (reported as measured; nothing tuned to meet them)")
    fails = [n for n, s in results.items() if s["c"]["new_bytes"] > s["a"]["new_bytes"]]
    worst = max((s["ratio_c_over_a"] for s in results.values() if s["ratio_c_over_a"] is not None), default=None)
    goal("c <= a in every scenario", Goal("c_le_a_all", worst, GOAL_C_OVER_A_MAX, "<=", met=not fails),
         "all scenarios" if not fails else "exceeded in " + ", ".join(
             f"{n} (c/a {fr(results[n]['ratio_c_over_a'])})" for n in fails))
    for n in SHIFT_SCENARIOS:
        s = results.get(n)
        goal(f"c <= {GOAL_C_OVER_A_SHIFT} a for {n}",
             Goal(f"c_le_0.85a_{n}", None if s is None else s["ratio_c_over_a"], GOAL_C_OVER_A_SHIFT, "<=",
                  met=None if s is None else s["c"]["new_bytes"] <= GOAL_C_OVER_A_SHIFT * s["a"]["new_bytes"]),
             "" if s is None else f"c/a = {fr(s['ratio_c_over_a'])}")
    for n in SHIFT_SCENARIOS:
        s = results.get(n)
        goal(f"d <= {GOAL_D_OVER_A_SHIFT} a for {n}",
             Goal(f"d_le_0.25a_{n}", None if s is None else s["ratio_d_over_a"], GOAL_D_OVER_A_SHIFT, "<=",
                  met=None if s is None else s["d"]["new_bytes"] <= GOAL_D_OVER_A_SHIFT * s["a"]["new_bytes"]),
             "" if s is None else f"d/a = {fr(s['ratio_d_over_a'])}")
    s = results.get("identical")
    goal("identical re-upload = 0 new bytes (b, c, d)",
         Goal("identical_zero", None if s is None else max(s[v]["new_bytes"] for v in "bcd"), 0, "=="),
         "" if s is None else ", ".join(f"{v} {s[v]['new_bytes']:,} B" for v in VARIANTS) + " (a for information)")

    total = time.perf_counter() - t_start
    print(f"\ntotal time {total:.0f} s")
    shutil.rmtree(data, ignore_errors=True)
    fig = {**opening, "dataset": dataset, "write_timing": write_timing, "scenarios": results,
           "base_chunks": chunks, "base_chunks_consistent": consistent, "goals": {g.name: g.met for g in goals},
           "goals_all_met": all(g.met for g in goals if g.met is not None),
           "variants": VARIANT_LABEL, "hf_xet_version": xet_version,
           "pyarrow_version": pa.__version__, "total_seconds": total, "code": code_version()}
    finish(fig, goals)


if __name__ == "__main__":
    sys.exit(main())

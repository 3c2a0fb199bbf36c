"""fsspec benchmark: reading through the `cdc://` filesystem (cdcstore/fs.py) over HTTP on loopback.

    python bench/fs.py [--size-mb 1000] [--small-mb 250] [--repeat 3] [--reads 1000] [--procs 8]
                       [--data-dir /tmp/cdcbench-fs] [--parts 1,2,3,4,5]

Data (generated once with bench/data.py's make_table (fs_data), cached under --data-dir/data; the file
names carry the generator version and size, e.g. fs-g1-big-1000mb.parquet)
---------------------------------------------------------------------------------------------
  big.parquet   at least --size-mb MB (default 1000): row groups of make_table(seed 100 + i) written
                by one ParquetWriter (zstd, use_content_defined_chunking) until the file reaches the size
  mid.parquet   at least --small-mb MB (default 250), the same way (seeds 200 + i)
  mid-v2.parquet  mid.parquet with a contiguous block of 1% of its rows given new value/price/text
                (as data.make_v2 edits part-000), written with the same row groups
  ds/part-00N.parquet  8 small files (20,000 rows each) for the many-processes test
Columns: id, ts, user_id (int64), value, price (float64), category, uuid, text (strings).

Each run
--------
A real `python -m cdcstore serve` (bench/servers.py's ServerProcess) over a fresh store, and a
plain aiohttp static file server (web.static over --data-dir/data, in a subprocess: bench/
servers.py's StaticServer) on another loopback port, whose access log records every request with
its status, bytes written (%b) and Content-Length. The files are pushed once (Store(url, cache=False)):
big -> cdc://big/big.parquet, mid -> cdc://scan/mid.parquet, mid v1 then v2 ->
cdc://ver/data.parquet, ds/ -> cdc://ds/. hf_xet (for part 5) gets mid.parquet uploaded to a
local:// endpoint, as in bench/read.py. Every filesystem below is a new CdcFileSystem instance
(skip_instance_cache) with its own ChunkCache file under the run directory ("cold" = a new,
empty cache; "warm" = a new instance over the cache a cold pass filled).

Parts (medians of --repeat repetitions; MB = 1e6 bytes)
--------------------------------------------------------
1. One column chunk of one row group of big.parquet, cold: pq.ParquetFile(fs.open(path))
   .read_row_group(r, columns=[c]) with r the middle row group and c the column whose compressed
   chunk size there is closest to the issue's 1.26 MB example. Figure: bytes received on the wire
   (fs.store.counters(): bodies + headers) over the column chunk's total_compressed_size;
   goal <= 1.3. Requests counted too (and by kind from the server's log). The same read with
   fsspec's HTTPFileSystem (default block size and cache) against the static server. fsspec's
   bytes are counted in its client (an aiohttp trace: bodies as read + status lines and
   headers), with the static server's log giving its requests and statuses: the log cannot
   give bytes, because %b holds only the headers when aiohttp sends a file by sendfile, and
   fsspec's size probes are plain GETs of the whole file that it drops after the headers.
   Every other column of that row group is read the same way, for information.
2. Full scan of mid.parquet with pq.read_table through PyFileSystem(FSSpecHandler(fs)):
   ours cold, ours warm (a new instance over the filled cache), the same file with pyarrow's
   local filesystem, and fsspec's HTTPFileSystem on the static server; for information also ours
   with cache=False. Throughput = file bytes / seconds (sides rotate their order per repetition).
   Goals: cold / local >= 0.7, warm / local >= 0.9, cold / fsspec >= 1.0.
3. v2 after v1: with a fresh cache, read cdc://ver@<v1 commit>/data.parquet fully (fs.open,
   8 MiB reads), then cdc://ver/data.parquet (v2) fully through the same filesystem. Figure:
   bytes received while reading v2 over the v2 push's new_bytes; goal <= 1.1.
4. --procs processes (spawned, released together by a barrier) each list cdc://ds/ and read one
   small file (pq.read_table through fs.open). Two ways of getting the filesystem:
     fresh    each process calls fsspec.filesystem("cdc", store=url, cache=<shared cache path>)
     pickled  the parent lists once, then passes its pickled instance to every process
   Both with a new shared cache file (the default cache is shared by every process of a user).
   Figure: listing requests (the server's access log: GET .../resolve/, .../commits/,
   .../branches and /v1/repos lines during the phase, the parent's included) per process;
   goal <= 1.
5. --reads random 64 KiB reads (fixed-seed uniform offsets) of mid.parquet through
   fs.open(path): seek + read, latency of each; ours cold (new empty cache), ours warm (a new
   instance over the cache the cold pass filled), against hf_xet's download_stream(info, off,
   off + 65536) on a local:// endpoint (a new download stream group per repetition); for
   information also ours with cache=False. The branch is resolved and the file opened before
   the timings; our first read locates every chunk of the file (one request) and is timed.
   Per repetition the median latency; quoted: the median of those. Goals: warm / hf_xet <= 0.1,
   cold (over loopback) / hf_xet <= 1.0.

Everything is read from the page cache (data just written, both servers on loopback), so the
scans compare software paths, not disks or networks. Results are checked against the local
file once (first repetition) outside the timings. Goals are reported as measured, pass or fail.
The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import os
import pickle
import platform
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # bench/harness.py, data.py, reads.py, servers.py
from data import DS_FILES, DS_ROWS, fs_data as make_data  # noqa: E402
from harness import Goal, code_version, finish, loadavg_text, med, pct, rotated, run_dir, start, xet_env  # noqa: E402
from reads import random_offsets, random_reads, read_to_end, xet_random_reads, xxh_file  # noqa: E402
from servers import LogWindow, ServerProcess, StaticServer, cdc_requests, static_log  # noqa: E402

ISSUE_CHUNK = 1.26e6  # the column chunk size in the issue's example
GOALS = {  # name: (op, bound)
    "p1_wire_over_column_chunk": ("<=", 1.3),
    "p2_cold_over_local": (">=", 0.7),
    "p2_warm_over_local": (">=", 0.9),
    "p2_cold_over_fsspec": (">=", 1.0),
    "p3_v2_wire_over_new_bytes": ("<=", 1.1),
    "p4_listing_requests_per_process_fresh": ("<=", 1.0),
    "p4_listing_requests_per_process_pickled": ("<=", 1.0),
    "p5_warm_latency_over_hf_xet": ("<=", 0.1),
    "p5_cold_latency_over_hf_xet": ("<=", 1.0),
}


def mb(x: float) -> str:
    return f"{x / 1e6:,.2f} MB"


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# server logs (the servers: servers.ServerProcess, servers.StaticServer)
# ---------------------------------------------------------------------------------------------

def counting_http_fs():
    """fsspec's HTTPFileSystem (defaults: 5 MiB blocks, its default cache) with an aiohttp trace
    that counts what the client received: body bytes as read, plus each response's status line
    and headers (counted as cdcstore's client counts its own). Client-side because fsspec probes
    a file's size with a plain GET that it abandons after the headers: the static server's log
    shows those as 200s of the whole file (Content-Length), though almost none of it is read."""
    import aiohttp
    import fsspec
    counts = {"requests": 0, "received_bytes": 0, "body_bytes": 0}

    async def on_end(session, ctx, params):
        counts["requests"] += 1
        counts["received_bytes"] += sum(len(k) + len(v) + 4 for k, v in params.response.raw_headers) + 17

    async def on_chunk(session, ctx, params):
        counts["received_bytes"] += len(params.chunk)
        counts["body_bytes"] += len(params.chunk)

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_end)
    trace.on_response_chunk_received.append(on_chunk)
    return fsspec.filesystem("http", skip_instance_cache=True, client_kwargs={"trace_configs": [trace]}), counts



LISTING_KINDS = ("resolve", "commits", "branches", "repos")


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

class Ctx:
    """What every part needs: the server, the static server, the data, a place for caches."""

    def __init__(self, url, static, srv_log, info, work, xet=None):
        self.url = url
        self.static = static
        self.srv_log = srv_log
        self.info = info
        self.work = work
        self.xet = xet
        self.n = 0

    def cache_path(self, what: str) -> str:
        self.n += 1
        d = os.path.join(self.work, "caches", f"{self.n:03d}-{what}")
        os.makedirs(d)
        return os.path.join(d, "cache.sqlite")

    def cdcfs(self, cache_path: str):
        from cdcstore.fs import CdcFileSystem
        return CdcFileSystem(store=self.url, cache=cache_path, skip_instance_cache=True)


def close_fs(fs) -> None:
    try:
        fs.store.close()
    except Exception:
        pass


def drop_cache(cache_path: str) -> None:
    shutil.rmtree(os.path.dirname(cache_path), ignore_errors=True)


def wire_delta(fs, before: dict) -> dict:
    now = fs.store.counters()
    return {k: now[k] - before[k] for k in ("requests", "sent_bytes", "received_bytes")}


ZERO = {"requests": 0, "sent_bytes": 0, "received_bytes": 0}


# ---------------------------------------------------------------------------------------------
# part 1: one column chunk, cold
# ---------------------------------------------------------------------------------------------

def p1_target(path: str) -> dict:
    import pyarrow.parquet as pq
    md = pq.ParquetFile(path).metadata
    r = md.num_row_groups // 2
    rg = md.row_group(r)
    cols = [(rg.column(c).path_in_schema, rg.column(c).total_compressed_size, rg.column(c).data_page_offset,
             rg.column(c).dictionary_page_offset) for c in range(rg.num_columns)]
    name, size, _, _ = min(cols, key=lambda c: (abs(c[1] - ISSUE_CHUNK), c[0]))
    return {"row_group": r, "row_groups": md.num_row_groups, "column": name, "column_chunk_bytes": size,
            "footer_bytes": md.serialized_size, "chunks_by_column": {c[0]: c[1] for c in cols}}


def p1_read(ctx: Ctx, side: str, r: int, col: str):
    """One cold read of column `col` of row group `r` of the big file; (table, figures)."""
    import pyarrow.parquet as pq
    if side == "ours":
        cache = ctx.cache_path("p1")
        fs = ctx.cdcfs(cache)
        win = LogWindow(ctx.srv_log).start()
        t0 = time.perf_counter()
        f = fs.open("big/big.parquet")
        pf = pq.ParquetFile(f)
        opened = wire_delta(fs, ZERO)
        got = pf.read_row_group(r, columns=[col])
        dt = time.perf_counter() - t0
        total = wire_delta(fs, ZERO)
        f.close()
        close_fs(fs)
        drop_cache(cache)
        return got, {"seconds": dt, **total, "open_and_footer": opened,
                     "column_read": {k: total[k] - opened[k] for k in total},
                     "server_requests": cdc_requests(win.lines())}
    hfs, counts = counting_http_fs()
    win = LogWindow(ctx.static.log_path).start()
    t0 = time.perf_counter()
    f = hfs.open(f"{ctx.static.url}/{os.path.basename(ctx.info['paths']['big'])}")
    got = pq.ParquetFile(f).read_row_group(r, columns=[col])
    dt = time.perf_counter() - t0
    f.close()
    return got, {"seconds": dt, **counts, **static_log(win.lines())}


def p1_rep(ctx: Ctx, rep: int, verify: bool) -> dict:
    """The target column (both sides, order alternating), then every other column of the same
    row group (for information: how the figure depends on the column)."""
    import pyarrow.parquet as pq
    t = ctx.info["p1"]
    r = t["row_group"]
    cols = [t["column"]] + [c for c in t["chunks_by_column"] if c != t["column"]]
    out: dict = {"columns": {}}
    for col in cols:
        ref = pq.ParquetFile(ctx.info["paths"]["big"]).read_row_group(r, columns=[col]) if verify else None
        res = {}
        for side in rotated(["ours", "fsspec"], rep):
            got, res[side] = p1_read(ctx, side, r, col)
            if verify:
                out.setdefault("verify", {})[f"{side}:{col}"] = "ok" if got.equals(ref) else "DIFFERENT from local"
            del got
        if col == t["column"]:
            out.update(res)
        else:
            out["columns"][col] = {s: {k: v[k] for k in ("received_bytes", "requests")} for s, v in res.items()}
    return out


# ---------------------------------------------------------------------------------------------
# part 2: full scans
# ---------------------------------------------------------------------------------------------

def p2_rep(ctx: Ctx, rep: int, verify: bool) -> dict:
    import pyarrow.parquet as pq
    from pyarrow.fs import FSSpecHandler, PyFileSystem
    path = ctx.info["paths"]["mid"]
    ref = pq.read_table(path) if verify else None
    out: dict = {}
    checks: dict = {}

    def check(name, t):
        if verify:
            checks[name] = "ok" if t.equals(ref) else "DIFFERENT from the local read"

    sides = ["ours", "local", "fsspec", "nocache"]
    order = rotated(sides, rep)
    out["order"] = order
    for side in order:
        if side == "local":
            t0 = time.perf_counter()
            t = pq.read_table(path)
            out["local_seconds"] = time.perf_counter() - t0
            check("local", t)
        elif side == "fsspec":
            hfs, counts = counting_http_fs()
            win = LogWindow(ctx.static.log_path).start()
            t0 = time.perf_counter()
            t = pq.read_table(f"{ctx.static.url}/{os.path.basename(path)}", filesystem=PyFileSystem(FSSpecHandler(hfs)))
            out["fsspec_seconds"] = time.perf_counter() - t0
            out["fsspec_wire"] = {**counts, **static_log(win.lines())}
            check("fsspec", t)
        else:  # ours: cold then warm over the same cache; or (for information) without a cache
            cache = ctx.cache_path("p2")
            for phase in (("cold", "warm") if side == "ours" else ("nocache",)):
                fs = ctx.cdcfs(cache if side == "ours" else False)
                win = LogWindow(ctx.srv_log).start()
                t0 = time.perf_counter()
                t = pq.read_table("scan/mid.parquet", filesystem=PyFileSystem(FSSpecHandler(fs)))
                out[f"{phase}_seconds"] = time.perf_counter() - t0
                out[f"{phase}_wire"] = wire_delta(fs, ZERO)
                close_fs(fs)
                out[f"{phase}_wire"]["by_kind"] = cdc_requests(win.lines(settle=0.1))["by_kind"]
                check(phase, t)
                del t
                t = None
            drop_cache(cache)
        del t
    if verify:
        out["verify"] = checks
    return out


# ---------------------------------------------------------------------------------------------
# part 3: v2 after v1
# ---------------------------------------------------------------------------------------------

def p3_rep(ctx: Ctx, rep: int, verify: bool) -> dict:
    import xxhash
    v1_commit = ctx.info["push"]["ver_v1"]["commit"]
    cache = ctx.cache_path("p3")
    fs = ctx.cdcfs(cache)
    out: dict = {}
    hashes = {}
    for name, path in (("v1", f"ver@{v1_commit}/data.parquet"), ("v2", "ver/data.parquet")):
        before = fs.store.counters()
        h = xxhash.xxh3_128()
        t0 = time.perf_counter()
        with fs.open(path) as f:
            n = read_to_end(f, h)
        out[name] = {"seconds": time.perf_counter() - t0, "bytes": n, **wire_delta(fs, before)}
        hashes[name] = h.hexdigest()
        if name == "v1":
            win_v2 = LogWindow(ctx.srv_log).start()
    out["v2"]["server_requests"] = cdc_requests(win_v2.lines())
    out["cache_bytes"] = fs.store.cache.bytes()
    close_fs(fs)
    drop_cache(cache)
    if verify:
        out["verify"] = {k: "ok" if hashes[k] == ctx.info["hash"][k] else "DIFFERENT from the local file"
                         for k in ("v1", "v2")}
    return out


# ---------------------------------------------------------------------------------------------
# part 4: many processes open the same dataset
# ---------------------------------------------------------------------------------------------

def p4_worker(mode: str, arg, i: int, barrier, results) -> None:
    """Child (spawned): get a filesystem, list the dataset, read one small file."""
    try:
        import fsspec
        import pyarrow.parquet as pq
        import cdcstore.fs  # noqa: F401 (imported before the barrier: we time the work, not imports)
        fs = pickle.loads(arg) if mode == "pickled" else None
        barrier.wait(60)
        t0 = time.perf_counter()
        if fs is None:
            fs = fsspec.filesystem("cdc", store=arg["url"], cache=arg["cache"])
        names = fs.ls("ds", detail=False)
        t1 = time.perf_counter()
        with fs.open(names[i % len(names)]) as f:
            rows = pq.read_table(f).num_rows
        dt = time.perf_counter() - t0
        results.put({"i": i, "pid": os.getpid(), "files": len(names), "rows": rows, "list_seconds": t1 - t0,
                     "seconds": dt, **fs.store.counters()})
        fs.store.close()
    except Exception as e:  # reported by the parent
        results.put({"i": i, "error": f"{type(e).__name__}: {e}"})


def p4_phase(ctx: Ctx, mode: str, procs: int) -> dict:
    import multiprocessing
    mp = multiprocessing.get_context("spawn")
    cache = ctx.cache_path(f"p4-{mode}")
    win = LogWindow(ctx.srv_log).start()
    parent = None
    if mode == "pickled":
        parent = ctx.cdcfs(cache)
        parent.ls("ds")
        arg = pickle.dumps(parent)
    else:
        arg = {"url": ctx.url, "cache": cache}
    barrier = mp.Barrier(procs)
    results = mp.Queue()
    t0 = time.perf_counter()
    ps = [mp.Process(target=p4_worker, args=(mode, arg, i, barrier, results)) for i in range(procs)]
    for p in ps:
        p.start()
    got = []
    try:
        for _ in range(procs):
            got.append(results.get(timeout=300))
    finally:
        for p in ps:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()
    wall = time.perf_counter() - t0
    parent_wire = dict(parent.store.counters()) if parent else None
    if parent:
        close_fs(parent)
    reqs = cdc_requests(win.lines())
    drop_cache(cache)
    listing = sum(reqs["by_kind"].get(k, 0) for k in LISTING_KINDS)
    errors = [g["error"] for g in got if "error" in g]
    ok = [g for g in got if "error" not in g]
    return {"procs": procs, "wall_seconds": wall, "server_requests": reqs, "listing_requests": listing,
            "listing_per_process": listing / procs, "requests_per_process": reqs["total"] / procs,
            "parent_wire": parent_wire, "errors": errors,
            "process_seconds_median": med([g["seconds"] for g in ok]) if ok else None,
            "list_seconds_median": med([g["list_seconds"] for g in ok]) if ok else None,
            "rows_ok": all(g["rows"] == DS_ROWS and g["files"] == DS_FILES for g in ok) and len(ok) == procs}


def p4_rep(ctx: Ctx, rep: int, procs: int) -> dict:
    modes = rotated(["fresh", "pickled"], rep)
    return {m: p4_phase(ctx, m, procs) for m in modes}


# ---------------------------------------------------------------------------------------------
# part 5: random 64 KiB reads
# ---------------------------------------------------------------------------------------------

def p5_ours(fs, offsets) -> tuple[list[float], list[bytes]]:
    with fs.open("scan/mid.parquet") as f:
        return random_reads(f, offsets, "ours")


def lat_stats(lat: list[float], total: float) -> dict:
    return {"median_s": statistics.median(lat), "p90_s": pct(lat, 0.9), "mean_s": statistics.fmean(lat),
            "first_s": lat[0], "max_s": max(lat), "total_s": total}


def p5_rep(ctx: Ctx, rep: int, offsets, expect) -> dict:
    out: dict = {}
    samples = {}
    units = rotated(["ours", "hf_xet"], rep)
    for u in units:
        if u == "hf_xet":
            t0 = time.perf_counter()
            lat, samples["hf_xet"] = xet_random_reads(*ctx.xet, offsets)  # ctx.xet: (session, endpoint, info)
            out["hf_xet"] = lat_stats(lat, time.perf_counter() - t0)
        else:
            cache = ctx.cache_path("p5")
            for phase in ("cold", "warm", "nocache"):
                fs = ctx.cdcfs(cache if phase != "nocache" else False)
                fs.info("scan/mid.parquet")  # resolve the branch outside the timings (as hf_xet gets its hash)
                before = fs.store.counters()
                t0 = time.perf_counter()
                lat, samples[phase] = p5_ours(fs, offsets)
                out[phase] = {**lat_stats(lat, time.perf_counter() - t0), **wire_delta(fs, before)}
                close_fs(fs)
            drop_cache(cache)
    out["verify"] = {k: "ok" if v == expect else "DIFFERENT from the local file" for k, v in samples.items()}
    return out


# ---------------------------------------------------------------------------------------------
# setup and reporting
# ---------------------------------------------------------------------------------------------

def push_all(url: str, info: dict) -> dict:
    from cdcstore.api import Store
    p = info["paths"]
    out = {}

    def push(key, src, dest, message):
        with Store(url, cache=False) as s:
            r = s.push([src], dest, message=message)
        out[key] = {"seconds": r.seconds, "bytes": r.bytes, "new_bytes": r.new_bytes, "stored_bytes": r.stored_bytes,
                    "chunks": r.chunks, "new_chunks": r.new_chunks, "commit": r.commit,
                    "sent_bytes": r.sent_bytes, "requests": r.requests}

    push("big", p["big"], "cdc://big/big.parquet", "big")
    push("scan", p["mid"], "cdc://scan/mid.parquet", "mid")
    push("ver_v1", p["mid"], "cdc://ver/data.parquet", "v1")
    push("ver_v2", p["mid_v2"], "cdc://ver/data.parquet", "v2")
    push("ds", p["ds"], "cdc://ds/", "dataset")
    return out


def unique_chunks(url: str) -> int:
    """Distinct chunk ids of the big file (what a whole-file locate asks for)."""
    from cdcstore.api import Store
    with Store(url, cache=False) as s:
        _, commit = s.resolve("cdc://big/")
        m = s.manifest("big", commit.files["big.parquet"].manifest)
    return len(set(m.chunk_ids))


def setup_xet(work: str, path: str):
    import hf_xet
    endpoint = "local://" + os.path.join(work, "xet")
    sess = hf_xet.XetSession()
    t0 = time.perf_counter()
    commit = sess.new_upload_commit(endpoint=endpoint)
    h = commit.start_upload_file(path, sha256=hf_xet.SKIP_SHA256)
    commit.wait_to_finish()
    meta = h.result()
    info = hf_xet.XetFileInfo(meta.xet_info.hash, meta.xet_info.file_size)
    return (hf_xet.XetSession(), endpoint, info), time.perf_counter() - t0


def ratio(a, b):
    return a / b if a is not None and b else None


def goal_line(fig: dict, key: str, value, text: str) -> str:
    op, bound = GOALS[key]
    g = Goal(key, value, bound, op)
    fig["goals_list"].append(g)
    met = g.met
    fig["goals"][key] = {"value": value, "op": op, "goal": bound, "met": met}
    verdict = "n/a (failed)" if met is None else "PASS" if met else "FAIL"
    v = "failed" if value is None else f"{value:.3f}"
    return f"  {text} = {v}  (goal {op} {bound}: {verdict})"


def summarize_p1(reps: list[dict], fig: dict) -> list[str]:
    t = fig["data"]["p1"]
    size = t["column_chunk_bytes"]
    o = {k: med([r["ours"][k] for r in reps]) for k in ("received_bytes", "sent_bytes", "requests", "seconds")}
    o["open_and_footer_received"] = med([r["ours"]["open_and_footer"]["received_bytes"] for r in reps])
    o["column_read_received"] = med([r["ours"]["column_read"]["received_bytes"] for r in reps])
    o["server_requests_by_kind"] = reps[0]["ours"]["server_requests"]["by_kind"]
    o["located_chunks_estimate"] = o["sent_bytes"] / 16  # the reader's requests are GETs but for locate's ids
    x = {k: med([r["fsspec"][k] for r in reps]) for k in ("received_bytes", "body_bytes", "requests", "seconds")}
    x["statuses"] = reps[0]["fsspec"]["statuses"]
    others = {}
    for col in reps[0]["columns"]:
        c = {s: med([r["columns"][col][s]["received_bytes"] for r in reps]) for s in ("ours", "fsspec")}
        cs = t["chunks_by_column"][col]
        others[col] = {"column_chunk_bytes": cs, "ours_received": c["ours"], "fsspec_received": c["fsspec"],
                       "ours_over_chunk": c["ours"] / cs, "fsspec_over_chunk": c["fsspec"] / cs}
    n = fig["push"]["big"]["chunks"]
    uniq = fig["data"]["big_unique_chunks"]
    p = {"target": t, "ours": o, "fsspec": x, "per_rep": reps, "other_columns": others,
         "manifest_bytes": 48 + 20 * n, "locate_all_bytes": 56 * uniq,
         "ours_over_chunk": o["received_bytes"] / size, "fsspec_over_chunk": x["received_bytes"] / size,
         "ours_over_fsspec_bytes": ratio(o["received_bytes"], x["received_bytes"])}
    fig["parts"]["p1"] = p
    lines = [f"\n1. one column chunk, cold: {os.path.basename(fig['data']['paths']['big'])} "
             f"({mb(fig['data']['big']['bytes'])}, {t['row_groups']} row groups), row group {t['row_group']}, "
             f"column {t['column']!r} = {mb(size)} compressed (column nearest the issue's 1.26 MB)",
             f"  ours (cdc://, cold cache)  received {mb(o['received_bytes'])} in {o['requests']:.0f} requests "
             f"({o['seconds'] * 1e3:.0f} ms; open + footer {mb(o['open_and_footer_received'])}, column read "
             f"{mb(o['column_read_received'])}; sent {mb(o['sent_bytes'])}); server requests by kind "
             f"{o['server_requests_by_kind']}",
             f"  fsspec HTTPFileSystem      received {mb(x['received_bytes'])} in {x['requests']:.0f} requests "
             f"({x['seconds'] * 1e3:.0f} ms; bodies {mb(x['body_bytes'])}; static server log {x['statuses']}) = "
             f"{p['fsspec_over_chunk']:.2f}x the chunk "
             f"(issue: 6.6 MB for 1.26 MB, 5.2x)",
             f"  of ours: the manifest {mb(p['manifest_bytes'])} (48 B + 20 B x {n:,} chunks: the whole file's list); "
             f"locate: sent {mb(o['sent_bytes'])}, 16 B per chunk id, so ~{o['located_chunks_estimate']:,.0f} of the "
             f"file's {uniq:,} chunks located, ~{mb(56 * o['located_chunks_estimate'])} of answers at 56 B each "
             f"(locating all of them: {mb(p['locate_all_bytes'])})",
             f"  ours / fsspec bytes = {p['ours_over_fsspec_bytes']:.3f}",
             goal_line(fig, "p1_wire_over_column_chunk", p["ours_over_chunk"], "ours wire bytes / column chunk"),
             f"  for information, the other columns of row group {t['row_group']} (cold, wire bytes / column chunk):",
             f"    {'column':<10} {'chunk':>10} {'ours':>10} {'ratio':>6} {'fsspec':>10} {'ratio':>6}"]
    for col, c in others.items():
        lines.append(f"    {col:<10} {mb(c['column_chunk_bytes']):>10} {mb(c['ours_received']):>10} "
                     f"{c['ours_over_chunk']:>6.2f} {mb(c['fsspec_received']):>10} {c['fsspec_over_chunk']:>6.2f}")
    return lines


def summarize_p2(reps: list[dict], fig: dict) -> list[str]:
    size = fig["data"]["mid"]["bytes"]
    secs = {k: med([r[f"{k}_seconds"] for r in reps]) for k in ("cold", "warm", "local", "fsspec", "nocache")}
    mbs = {k: size / v / 1e6 for k, v in secs.items()}
    p = {"file_bytes": size, "seconds": secs, "mb_s": mbs, "per_rep": reps,
         "cold_wire": reps[0]["cold_wire"], "warm_wire": reps[0]["warm_wire"], "fsspec_wire": reps[0]["fsspec_wire"],
         "nocache_wire": reps[0]["nocache_wire"], "nocache_over_local": mbs["nocache"] / mbs["local"],
         "cold_over_local": mbs["cold"] / mbs["local"], "warm_over_local": mbs["warm"] / mbs["local"],
         "cold_over_fsspec": mbs["cold"] / mbs["fsspec"], "warm_over_fsspec": mbs["warm"] / mbs["fsspec"],
         "per_rep_cold_over_local": [r["local_seconds"] / r["cold_seconds"] for r in reps],
         "per_rep_warm_over_local": [r["local_seconds"] / r["warm_seconds"] for r in reps],
         "per_rep_cold_over_fsspec": [r["fsspec_seconds"] / r["cold_seconds"] for r in reps]}
    fig["parts"]["p2"] = p
    lines = [f"\n2. full scan, pq.read_table of {os.path.basename(fig['data']['paths']['mid'])} ({mb(size)})",
             f"  {'':<28} {'seconds':>8} {'MB/s':>8} {'received':>12} {'requests':>9}"]
    wires = {"cold": p["cold_wire"], "warm": p["warm_wire"], "fsspec": p["fsspec_wire"], "nocache": p["nocache_wire"]}
    for k, label in (("cold", "ours cold (empty cache)"), ("warm", "ours warm (cache filled)"),
                     ("local", "local file (pyarrow)"), ("fsspec", "fsspec HTTPFileSystem"),
                     ("nocache", "ours, cache=False (info)")):
        w = wires.get(k)
        lines.append(f"  {label:<28} {secs[k]:>8.3f} {mbs[k]:>8.1f} "
                     f"{mb(w['received_bytes']) if w else '-':>12} {w['requests'] if w else '-':>9}")
    lines.append("  per repetition: cold/local " + ", ".join(f"{x:.2f}" for x in p["per_rep_cold_over_local"]) +
                 "; warm/local " + ", ".join(f"{x:.2f}" for x in p["per_rep_warm_over_local"]) +
                 "; cold/fsspec " + ", ".join(f"{x:.2f}" for x in p["per_rep_cold_over_fsspec"]))
    lines.append(goal_line(fig, "p2_cold_over_local", p["cold_over_local"], "throughput ours cold / local"))
    lines.append(goal_line(fig, "p2_warm_over_local", p["warm_over_local"], "throughput ours warm / local"))
    lines.append(goal_line(fig, "p2_cold_over_fsspec", p["cold_over_fsspec"], "throughput ours cold / fsspec"))
    lines.append(f"  fsspec's requests in the static server's log: {p['fsspec_wire']['statuses']} (its plain GETs "
                 f"probing the size are abandoned after the headers)")
    lines.append(f"  (for information: ours warm / fsspec = {p['warm_over_fsspec']:.3f}; ours without a cache / local = "
                 f"{p['nocache_over_local']:.3f}; warm requests by kind {p['warm_wire']['by_kind']})")
    return lines


def summarize_p3(reps: list[dict], fig: dict) -> list[str]:
    new = fig["push"]["ver_v2"]["new_bytes"]
    recv = med([r["v2"]["received_bytes"] for r in reps])
    v1recv = med([r["v1"]["received_bytes"] for r in reps])
    p = {"v2_new_bytes": new, "v2_push_stored_bytes": fig["push"]["ver_v2"]["stored_bytes"],
         "v2_received_bytes": recv, "v2_requests": med([r["v2"]["requests"] for r in reps]),
         "v2_sent_bytes": med([r["v2"]["sent_bytes"] for r in reps]),
         "v1_received_bytes": v1recv, "v1_requests": med([r["v1"]["requests"] for r in reps]),
         "v1_seconds": med([r["v1"]["seconds"] for r in reps]), "v2_seconds": med([r["v2"]["seconds"] for r in reps]),
         "v2_server_requests": reps[0]["v2"]["server_requests"]["by_kind"], "ratio": recv / new if new else None,
         "per_rep": reps}
    fig["parts"]["p3"] = p
    size = reps[0]["v2"]["bytes"]
    return [f"\n3. v2 after v1 (cdc://ver/data.parquet, {mb(size)}; v2 = 1% of rows "
            f"{fig['data']['mid_v2']['updated_rows']} given new value/price/text)",
            f"  read v1 fully (fills the cache): received {mb(v1recv)} in {p['v1_requests']:.0f} requests, "
            f"{p['v1_seconds']:.2f} s",
            f"  read v2 fully after it: received {mb(recv)} in {p['v2_requests']:.0f} requests "
            f"({p['v2_seconds']:.2f} s; sent {mb(p['v2_sent_bytes'])}); server requests {p['v2_server_requests']}",
            f"  push of v2: new_bytes {mb(new)}, stored {mb(p['v2_push_stored_bytes'])}",
            goal_line(fig, "p3_v2_wire_over_new_bytes", p["ratio"], "v2 read wire bytes / v2 new bytes")]


def summarize_p4(reps: list[dict], fig: dict, procs: int) -> list[str]:
    p: dict = {"procs": procs, "per_rep": reps}
    lines = [f"\n4. {procs} processes list cdc://ds/ ({DS_FILES} files) and read one small file each"]
    for mode, text in (("fresh", "each makes fsspec.filesystem('cdc', ...)"),
                       ("pickled", "the parent's listed instance, pickled")):
        rs = [r[mode] for r in reps]
        q = {"listing_requests": med([r["listing_requests"] for r in rs]),
             "listing_per_process": med([r["listing_per_process"] for r in rs]),
             "requests_per_process": med([r["requests_per_process"] for r in rs]),
             "wall_seconds": med([r["wall_seconds"] for r in rs]),
             "process_seconds_median": med([r["process_seconds_median"] for r in rs if r["process_seconds_median"]]
                                           or [0]),
             "server_requests_by_kind": rs[0]["server_requests"]["by_kind"],
             "listing_per_rep": [r["listing_requests"] for r in rs],
             "rows_ok": all(r["rows_ok"] for r in rs), "errors": [e for r in rs for e in r["errors"]]}
        p[mode] = q
        lines.append(f"  {mode:<8} ({text}): listing requests {q['listing_requests']:.0f} "
                     f"(per repetition {q['listing_per_rep']}), all requests {q['requests_per_process']:.2f} per "
                     f"process; by kind {q['server_requests_by_kind']}; per process {q['process_seconds_median'] * 1e3:.0f} "
                     f"ms from the barrier, phase {q['wall_seconds']:.1f} s with process start"
                     f"{'' if q['rows_ok'] else '; WRONG rows or errors: ' + str(q['errors'][:3])}")
        lines.append(goal_line(fig, f"p4_listing_requests_per_process_{mode}", q["listing_per_process"],
                               f"{mode}: listing requests per process"))
    fig["parts"]["p4"] = p
    return lines


def summarize_p5(reps: list[dict], fig: dict, reads: int) -> list[str]:
    sides = ("cold", "warm", "hf_xet", "nocache")
    s = {k: {m: med([r[k][m] for r in reps]) for m in ("median_s", "p90_s", "mean_s", "first_s", "total_s")}
         for k in sides}
    for k in ("cold", "warm", "nocache"):
        s[k]["received_bytes"] = med([r[k]["received_bytes"] for r in reps])
        s[k]["requests"] = med([r[k]["requests"] for r in reps])
    p = {"reads": reads, "sides": s, "per_rep": reps,
         "warm_over_hf_xet": s["warm"]["median_s"] / s["hf_xet"]["median_s"],
         "cold_over_hf_xet": s["cold"]["median_s"] / s["hf_xet"]["median_s"],
         "warm_p90_over_hf_xet": s["warm"]["p90_s"] / s["hf_xet"]["p90_s"],
         "cold_p90_over_hf_xet": s["cold"]["p90_s"] / s["hf_xet"]["p90_s"],
         "cold_mean_over_hf_xet": s["cold"]["mean_s"] / s["hf_xet"]["mean_s"],
         "nocache_over_hf_xet": s["nocache"]["median_s"] / s["hf_xet"]["median_s"]}
    fig["parts"]["p5"] = p
    lines = [f"\n5. {reads} random 64 KiB reads of {os.path.basename(fig['data']['paths']['mid'])} "
             f"(seek + read on fs.open; hf_xet download_stream on local://)",
             f"  {'':<22} {'median':>10} {'p90':>10} {'mean':>10} {'first':>10} {'all reads':>10} {'received':>12} "
             f"{'requests':>9}"]
    for k, label in (("cold", "ours cold (loopback)"), ("warm", "ours warm (cache)"), ("hf_xet", "hf_xet local://"),
                     ("nocache", "ours cache=False (info)")):
        v = s[k]
        lines.append(f"  {label:<22} {v['median_s'] * 1e6:>8.0f}us {v['p90_s'] * 1e6:>8.0f}us {v['mean_s'] * 1e6:>8.0f}us "
                     f"{v['first_s'] * 1e3:>8.1f}ms {v['total_s']:>9.3f}s "
                     f"{mb(v['received_bytes']) if 'received_bytes' in v else '-':>12} {v.get('requests', '-'):>9}")
    lines.append(f"  p90 ratios: warm/hf_xet {p['warm_p90_over_hf_xet']:.3f}, cold/hf_xet {p['cold_p90_over_hf_xet']:.3f}; "
                 f"mean cold/hf_xet {p['cold_mean_over_hf_xet']:.3f}; median without a cache/hf_xet "
                 f"{p['nocache_over_hf_xet']:.3f}")
    lines.append(goal_line(fig, "p5_warm_latency_over_hf_xet", p["warm_over_hf_xet"], "median latency ours warm / hf_xet"))
    lines.append(goal_line(fig, "p5_cold_latency_over_hf_xet", p["cold_over_hf_xet"], "median latency ours cold / hf_xet"))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=1000, help="size of part 1's Parquet file in MB (default 1000)")
    ap.add_argument("--small-mb", type=float, default=250,
                    help="size of the file of parts 2, 3 and 5 in MB (default 250)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions; medians are quoted (default 3)")
    ap.add_argument("--reads", type=int, default=1000, help="random 64 KiB reads per repetition (default 1000)")
    ap.add_argument("--procs", type=int, default=8, help="processes of part 4 (default 8)")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the random offsets of part 5")
    ap.add_argument("--parts", default="1,2,3,4,5", help="which parts to run (default all: 1,2,3,4,5)")
    ap.add_argument("--data-dir", default="/tmp/cdcbench-fs", help="generated data and runs (default /tmp/cdcbench-fs)")
    args = ap.parse_args()
    opening = start("fs")  # the load average before the run
    parts = {int(p) for p in args.parts.split(",") if p.strip()}

    work = run_dir(args.data_dir, "run")
    os.environ.update(xet_env(os.path.join(work, "xet-cache")))
    import aiohttp
    import fsspec
    import hf_xet  # noqa: F401
    import pyarrow
    from cdcstore.storage.repository import LocalStore
    import cdcstore

    print(f"fsspec benchmark: reading through cdc:// (cdcstore.fs) over HTTP on loopback vs local files, fsspec "
          f"HTTPFileSystem + aiohttp static server, hf_xet local://; {args.repeat} repetitions, medians quoted; "
          f"python {platform.python_version()}, {os.cpu_count()} cpus, pyarrow {pyarrow.__version__}, fsspec "
          f"{fsspec.__version__}, aiohttp {aiohttp.__version__}, hf_xet {_version('hf_xet')}; cdcstore imported from "
          f"{os.path.dirname(cdcstore.__file__)}; data under {args.data_dir}; load average at start {loadavg_text()}")
    t_start = time.perf_counter()
    t0 = time.perf_counter()
    info, cached = make_data(args.data_dir, args.size_mb, args.small_mb)
    print(f"data: big {mb(info['big']['bytes'])} ({info['big']['row_groups']} row groups of "
          f"{info['big']['rows_per_row_group']:,} rows), mid {mb(info['mid']['bytes'])} "
          f"({info['mid']['row_groups']} x {info['mid']['rows_per_row_group']:,} rows), mid v2 "
          f"{mb(info['mid_v2']['bytes'])}, ds {DS_FILES} files {mb(info['ds']['bytes'])}; ready in "
          f"{time.perf_counter() - t0:.1f} s{' (cached from an earlier run)' if cached else ''}")
    info["p1"] = p1_target(info["paths"]["big"])
    info["hash"] = {"v1": xxh_file(info["paths"]["mid"]), "v2": xxh_file(info["paths"]["mid_v2"])}

    store_dir = os.path.join(work, "server-store")
    LocalStore.init(store_dir)
    srv = ServerProcess(store_dir).start()
    static = StaticServer(info["paths"]["root"], os.path.basename(info["paths"]["mid"]),
                          os.path.join(work, "static.log")).start()
    fig: dict = {**opening, "args": {k: v for k, v in vars(args).items() if not k.startswith("_")}, "data": info,
                 "parts": {}, "goals": {}, "goals_list": [], "errors": []}
    errors = fig["errors"]
    lines: list[str] = []
    try:
        t0 = time.perf_counter()
        fig["push"] = push_all(srv.url, info)
        info["push"] = fig["push"]
        info["big_unique_chunks"] = unique_chunks(srv.url)
        print(f"setup: pushed {len(fig['push'])} times over HTTP in {time.perf_counter() - t0:.1f} s (big "
              f"{fig['push']['big']['seconds']:.1f} s, {fig['push']['big']['chunks']:,} chunks); v2 new_bytes "
              f"{mb(fig['push']['ver_v2']['new_bytes'])}", end="")
        xet = None
        if 5 in parts:
            xet, t_xet = setup_xet(work, info["paths"]["mid"])
            print(f"; hf_xet upload of mid {t_xet:.1f} s", end="")
        print()
        os.sync()
        ctx = Ctx(srv.url, static, srv.log_path, info, work, xet)
        offsets, expect = random_offsets(info["paths"]["mid"], info["mid"]["bytes"], args.reads, args.seed)

        reps: dict = {p: [] for p in parts}
        for rep in range(args.repeat):
            t_rep = time.perf_counter()
            verify = rep == 0
            notes = []
            if 1 in parts:
                r = p1_rep(ctx, rep, verify)
                reps[1].append(r)
                notes.append(f"p1 ours {mb(r['ours']['received_bytes'])} / fsspec {mb(r['fsspec']['received_bytes'])}")
            if 2 in parts:
                r = p2_rep(ctx, rep, verify)
                reps[2].append(r)
                notes.append(f"p2 cold {r['cold_seconds']:.2f} s, warm {r['warm_seconds']:.2f} s, local "
                             f"{r['local_seconds']:.2f} s, fsspec {r['fsspec_seconds']:.2f} s")
            if 3 in parts:
                r = p3_rep(ctx, rep, verify)
                reps[3].append(r)
                notes.append(f"p3 v2 received {mb(r['v2']['received_bytes'])}")
            if 4 in parts:
                r = p4_rep(ctx, rep, args.procs)
                reps[4].append(r)
                notes.append(f"p4 listing requests fresh {r['fresh']['listing_requests']}, pickled "
                             f"{r['pickled']['listing_requests']}")
                for m in ("fresh", "pickled"):
                    if r[m]["errors"] or not r[m]["rows_ok"]:
                        errors.append(f"rep {rep} p4 {m}: errors {r[m]['errors'][:3]}, rows ok {r[m]['rows_ok']}")
            if 5 in parts:
                r = p5_rep(ctx, rep, offsets, expect)
                reps[5].append(r)
                notes.append(f"p5 median cold {r['cold']['median_s'] * 1e6:.0f} us, warm "
                             f"{r['warm']['median_s'] * 1e6:.0f} us, hf_xet {r['hf_xet']['median_s'] * 1e6:.0f} us")
                bad = {k: v for k, v in r["verify"].items() if v != "ok"}
                if bad:
                    errors.append(f"rep {rep} p5: {bad}")
            for p in (1, 2, 3):
                if p in parts and "verify" in reps[p][-1]:
                    bad = {k: v for k, v in reps[p][-1]["verify"].items() if v != "ok"}
                    if bad:
                        errors.append(f"rep {rep} p{p}: {bad}")
                    else:
                        notes.append(f"p{p} checked")
            print(f"  rep {rep + 1}/{args.repeat} ({time.perf_counter() - t_rep:.0f} s): " + "; ".join(notes))

        if 1 in parts:
            lines += summarize_p1(reps[1], fig)
        if 2 in parts:
            lines += summarize_p2(reps[2], fig)
        if 3 in parts:
            lines += summarize_p3(reps[3], fig)
        if 4 in parts:
            lines += summarize_p4(reps[4], fig, args.procs)
        if 5 in parts:
            lines += summarize_p5(reps[5], fig, args.reads)
    except Exception as e:
        import traceback
        traceback.print_exc()
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        static.stop()
        srv.stop()
    status = cdc_requests(srv.log_text().splitlines())["statuses"]
    fig["server_statuses"] = status
    odd = {k: v for k, v in status.items() if k == "429" or k[0] == "5"}
    if odd:
        errors.append(f"the server answered {odd} (retries inflate request and byte counts)")

    print(f"\nresults (median of {args.repeat}; MB = 1e6 bytes; received = bodies + headers on the wire)")
    for line in lines:
        print(line)
    g = fig["goals"]
    print(f"\ngoals: {sum(1 for v in g.values() if v['met'])} of {len(g)} met; "
          + ", ".join(f"{k} {'PASS' if v['met'] else 'FAIL' if v['met'] is not None else 'n/a'}" for k, v in g.items()))
    for e in errors:
        print(f"  ERROR: {e}")
    fig["seconds"] = time.perf_counter() - t_start
    print(f"total {fig['seconds']:.0f} s")
    fig["code"] = code_version()
    fig["cdcstore_module"] = os.path.dirname(cdcstore.__file__)
    fig["versions"] = {"python": platform.python_version(), "pyarrow": pyarrow.__version__, "fsspec": fsspec.__version__,
                       "aiohttp": aiohttp.__version__, "hf_xet": _version("hf_xet"), "cpus": os.cpu_count()}
    for rs in fig["parts"].values():  # keep the JSON line readable: medians and per-repetition ratios only
        rs.pop("per_rep", None)
    for d in ("caches", "server-store", "xet", "xet-cache"):  # the logs stay in the run directory
        shutil.rmtree(os.path.join(work, d), ignore_errors=True)
    finish(fig, fig.pop("goals_list"))
    return 1 if errors else 0


def _version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())

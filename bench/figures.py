"""Figures in docs/ come from bench JSON, never typed by hand.

Every bench script prints one JSON object as its last line. Keep a run's figures, then render
them into the docs:

    python bench/stream.py | tee /tmp/out.txt
    python bench/figures.py save stream /tmp/out.txt     # -> bench/results/stream.json
    python bench/figures.py render                        # rewrite the figure blocks in docs/*.md
                                                          # and README.md, redraw docs/figures/*.svg
    python bench/figures.py check                         # exit 1 if a block or chart differs from its JSON

A figure block in a doc is

    <!-- figures stream -->
    ...generated...
    <!-- /figures -->

and holds the run's own table where the bench has one (VIEWS: ingest, read, dedup, chunker,
objects, cold-profile, transfer, engines), a table of its goals (value, goal, met: `goal_results`, or the
older `goals`), a table of per-side figures when the JSON has `sides` with them, and a chart
where a reader would rather look than read (CHARTS: docs/figures/NAME.svg, drawn with
matplotlib from the same JSON; deterministic SVG: fixed fonts and sizes, text kept as text, a
fixed hash salt, no dates). `tests/test_docs_figures.py` runs `check`.
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
CHART_DIR = os.path.join(ROOT, "docs", "figures")
BLOCK = re.compile(r"(<!-- figures (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
SIDE_FIGURES = [("first_batch_seconds", "first batch (s)", "{:.2f}"), ("samples_per_s", "samples/s", "{:,.0f}"),
                ("mb_per_s", "MB/s", "{:.0f}"), ("peak_pss_tree", "peak PSS, process tree (MB)", "MB")]


def last_json(text: str) -> dict:
    """The last line of a bench run that is a JSON object."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("no JSON line in that output: a bench script prints its figures as its last line")


def _fmt(value, how: str = "{:.3g}") -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if how == "MB":
        return f"{value / 1e6:,.0f}"
    if how == "MB1":
        return f"{value / 1e6:,.1f}"
    if isinstance(value, (int, float)):
        return how.format(value)
    return str(value)


def _x(a, b, how: str = "{:.2f}×") -> str:
    """a / b as a ratio ('' when either is missing)."""
    return how.format(a / b) if a is not None and b else ""


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
            + ["| " + " | ".join(r) + " |" for r in rows] + [""])


# ---------------------------------------------------------------------------------------------
# views: a bench's own table (pure: JSON in, markdown lines out)
# ---------------------------------------------------------------------------------------------

def view_ingest(doc: dict) -> list[str]:
    o, x, d = doc["ours"], doc["xet"], doc["dataset"]
    rows = [["push v1, MB/s", f"{o['v1_mb_s']:,.0f}", f"{x['v1_mb_s']:,.0f}", _x(o["v1_mb_s"], x["v1_mb_s"])],
            ["push v2 (mostly known), MB/s", f"{o['v2_mb_s']:,.0f}", f"{x['v2_mb_s']:,.0f}",
             _x(o["v2_mb_s"], x["v2_mb_s"])],
            ["push v1 + v2, MB/s", f"{o['total_mb_s']:,.0f}", f"{x['total_mb_s']:,.0f}",
             _x(o["total_mb_s"], x["total_mb_s"])],
            ["v2 new bytes, MB", _fmt(o["v2_new_bytes"], "MB1"),
             _fmt(x["v2_new_bytes"], "MB1"), _x(o["v2_new_bytes"], x["v2_new_bytes"])],
            ["stored bytes v1 + v2, MB", _fmt(o["v1_stored_bytes"] + o["v2_stored_bytes"], "MB1"),
             _fmt(x["v1_stored_bytes"] + x["v2_stored_bytes"], "MB1"),
             _x(o["v1_stored_bytes"] + o["v2_stored_bytes"], x["v1_stored_bytes"] + x["v2_stored_bytes"])],
            ["peak RSS of the v1 push, MB", _fmt(o["v1_peak_rss"], "MB"), _fmt(x["v1_peak_rss"], "MB"),
             _x(o["v1_peak_rss"], x["v1_peak_rss"])]]
    out = [f"Push of a {d['v1_bytes'] / 1e6:,.0f} MB Parquet dataset (v1, {d['files']} files) and its edited copy "
           f"(v2, {d['v2_bytes'] / 1e6:,.0f} MB) into a local store; medians of {doc['repeat']}:", ""]
    out += table(["figure", "cdcstore", "hf_xet local://", "ours / hf_xet"], rows)
    if "floor" in doc:
        f = doc["floor"]
        out += [f"The floor, `cp -r` of v1 and `sync`: {f['v1_seconds']:.2f} s ({f['v1_mb_s']:,.0f} MB/s); the push "
                f"of v1 takes {o['v1_seconds']:.2f} s: floor / push = {doc['ratios_ours_over_floor']['v1']:.2f}.", ""]
    return out


def view_read(doc: dict) -> list[str]:
    s = doc["sides"]
    rows = [[k, _fmt(v["full_mb_s"], "{:,.0f}"), _fmt(v["random_median_s"] * 1e6 if v["random_median_s"] else None,
                                                        "{:,.0f}"),
             _fmt(v["random_p90_s"] * 1e6 if v["random_p90_s"] else None, "{:,.0f}")] for k, v in s.items()]
    return ([f"A {doc['file_bytes'] / 1e6:,.0f} MB Parquet file read whole (8 MiB reads) and by {doc['reads']:,} "
             f"random 64 KiB reads, all from the page cache; medians of {doc['repeat']}:", ""]
            + table(["side", "full read, MB/s", "random read, median µs", "random read, p90 µs"], rows))


def view_gateway(doc: dict) -> list[str]:
    s = doc["sides"]
    rows = []
    for engine, label in (("pyarrow_file", "pyarrow, one file"), ("pyarrow_dataset", "pyarrow, a dataset folder"),
                          ("polars_file", "polars, one file"), ("polars_dataset", "polars, a glob of files")):
        local, gw = s[f"{engine}_local"], s[f"{engine}_gateway"]
        rows.append([label, f"{local['rows_per_s']:,.0f}", f"{gw['rows_per_s']:,.0f}",
                     _x(gw["rows_per_s"], local["rows_per_s"]), f"{gw['requests_per_file']:.1f}"])
    big = doc["big"]
    return ([f"Full reads of a {big['bytes'] / 1e6:,.0f} MB Parquet file ({big['row_groups']} row groups) and of a "
             f"folder of {s['pyarrow_dataset_local']['files']} files ({s['pyarrow_dataset_local']['bytes'] / 1e6:,.0f} "
             f"MB), SigV4-signed, over loopback, all in the page cache; medians:", ""]
            + table(["engine, read", "local rows/s", "gateway rows/s", "gateway / local", "requests per file"], rows))


DEDUP_LABELS = {"a": "hf_xet (a)", "b": "byte CDC (b)", "c": "page groups (c)", "d": "our writer (d)"}


def view_dedup(doc: dict) -> list[str]:
    rows = []
    for name, s in doc["scenarios"].items():
        rows.append([name] + [f"{s[v]['new_bytes'] / 1e6:,.2f}" for v in "abcd"]
                    + [_fmt(s["ratio_c_over_a"], "{:.2f}"), _fmt(s["ratio_d_over_a"], "{:.2f}")])
    d = doc["dataset"]
    return ([f"New bytes (MB) of an edited {d['plain_file_bytes'] / 1e6:,.0f} MB Parquet file after its base version "
             f"(a, b, c: the file pyarrow writes with CDC on; d: the same table written by "
             f"`cdcstore.parquet.write_table`):", ""]
            + table(["scenario"] + [DEDUP_LABELS[v] for v in "abcd"] + ["c / a", "d / a"], rows))


def view_chunker(doc: dict) -> list[str]:
    rows = [[name, f"{r['ours']['gb_s']:.2f}", f"{r['pyfastcdc']['gb_s']:.2f}",
             f"{r['ratio_ours_over_pyfastcdc']:.3f}×"] for name, r in doc["inputs"].items()]
    return ([f"Chunk scan of a {doc['size_bytes'] / 2 ** 20:,.0f} MiB buffer, min/avg/max "
             f"{'/'.join(str(p // 1024) for p in doc['params'])} KiB; medians of {doc['repeat']}:", ""]
            + table(["input", "ours, GB/s", "pyfastcdc, GB/s", "ours / pyfastcdc"], rows))


OBJECT_OPS = [("put_big_mb_s", "put 8 × 8 MiB, MB/s"), ("put_small_ms", "put 4 KiB, ms each"),
              ("get_big_mb_s", "get 8 MiB whole, MB/s"), ("get_range_ms", "get 64 KiB range of a 2 MiB object, ms"),
              ("list_2000_ms", "list 2,000 keys, ms"), ("create_ms", "create (`If-None-Match: *`), ms"),
              ("cas_ms", "compare-and-swap (`If-Match`), ms")]


def view_objects(doc: dict) -> list[str]:
    rows = [[label, f"{doc[k]['obstore']:,.2f}", f"{doc[k]['s3fs']:,.2f}", f"{doc[k]['ratio']:.2f}"]
            for k, label in OBJECT_OPS if k in doc]
    fork = doc.get("fork_works")
    if fork:
        rows.append(["a client used before `fork()`, then in the child",
                     "works" if fork["obstore_raw"] else "hangs", "works" if fork["s3fs"] else "hangs", ""])
    return ([f"{doc['server']}; medians of {doc['runs']} run(s):", ""]
            + table(["operation", "obstore", "s3fs", "obstore / s3fs"], rows))


def view_cold_profile(doc: dict) -> list[str]:
    stages = [("metadata", "metadata (resolve, commit, manifest)"), ("locate", "locate"),
              ("fetch_verify_place", "fetch + verify + place"), ("total", "total, staged"),
              ("store_cat_total", "`Store.cat` of every file, fresh cache"),
              ("fsspec_total", "fsspec HTTP `cat_file` of the same files")]
    rows = [[label, f"{doc[k]:.3f}"] for k, label in stages if k in doc]
    return ([f"A cold read of {doc['mb']:,.1f} MB ({doc['requests']} requests) from `cdcstore serve` on loopback, "
             f"seconds per stage:", ""] + table(["stage", "seconds"], rows))


def view_transfer(doc: dict) -> list[str]:
    o, f = doc["ops"], doc["figures"]
    rows = [[op, f"{o[op]['bytes'] / 1e6:,.1f}", f"{o[op]['mb_s']:,.0f}", f"{o[op]['requests']:,}"]
            for op in ("push_v1", "push_v2", "pull_v1", "pull_v2_over_v1", "pull_v2_cold")]
    rows += [[op, f"{o[op]['bytes'] / 1e6:,.1f}", f"{o[op]['mb_s']:,.0f}", ""]
             for op in ("push_v1_local", "fsspec_cold", "fsspec_cold_sequential") if op in o]
    return ([f"Push and pull over HTTP on loopback; medians of {doc['repeat']}; cold pull ours / fsspec = "
             f"{f['cold_throughput_ours_over_fsspec']:.2f}×, push v2 wire / new bytes = "
             f"{f['push_v2_wire_over_new_bytes']:.3f}:", ""]
            + table(["operation", "MB", "MB/s", "requests"], rows))


def view_link(doc: dict) -> list[str]:
    labels = {"ours_cold": "ours, cold cache", "ours_nocache": "ours, no cache", "fsspec": "fsspec HTTP",
              "v2_after_v1": "ours, v2 with v1 cached", "warm_read": "ours, warm cache",
              "warm_arrow_ours": "`read_table` via `cdc://`, warm", "arrow_local": "`read_table`, local disk"}
    out = [f"v2 ({doc['bytes'] / 1e6:,.1f} MB) read whole, one file after another; medians of {doc['repeat']}:", ""]
    for name, link in doc["links"].items():
        rows = [[labels.get(k, k), f"{v:,.0f}"] for k, v in link["mb_s"].items()]
        out += table([f"{name}", "MB/s"], rows)
        out += ["Ratios: " + ", ".join(f"{k} {v:.2f}×" for k, v in link["ratios"].items()) + ".", ""]
    return out


def view_fs(doc: dict) -> list[str]:
    p2 = doc.get("parts", {}).get("p2")
    if not p2:
        return []
    labels = {"cold": "ours, cold cache", "warm": "ours, warm cache", "local": "pyarrow, local file",
              "fsspec": "fsspec HTTP", "nocache": "ours, no cache"}
    rows = [[labels.get(k, k), f"{v:,.0f}"] for k, v in p2["mb_s"].items()]
    return ([f"`pq.read_table` of a {p2['file_bytes'] / 1e6:,.0f} MB file through `cdc://` (PyFileSystem over "
             f"`CdcFileSystem`) and its peers; medians of {doc.get('args', {}).get('repeat', '?')}:", ""]
            + table(["full scan", "MB/s"], rows))


def view_engines(doc: dict) -> list[str]:
    rows = []
    for name, e in doc.get("engines", {}).items():
        if "error" in e:
            rows.append([name, "", "", "failed: " + e["error"].splitlines()[-1][:120]])
        else:
            rows.append([name, f"{e['local_rows_per_s']:,}", f"{e['cdc_rows_per_s']:,}", f"{e['cdc_over_local']:.2f}"])
    return ([f"{doc['rows']:,} rows in {doc['files']} Parquet files ({doc['bytes'] / 1e6:,.1f} MB), every column; "
             f"medians of {doc['repeat']}:", ""]
            + table(["engine", "local files, rows/s", "`cdc://`, rows/s", "cdc / local"], rows))


# scale.py: the measured points, constants fitted from them, and the on-paper extrapolation

SCALE_OPS = [("open_new", "open + read 1 file, new machine"), ("ls_new", "`ls` of a folder, new machine"),
             ("edit_push", "push of the folder, 1 file edited"), ("one_push", "push of that 1 file alone"),
             ("upload", "upload of N files"), ("commit", "one commit of the N"),
             ("replica", "new replica: first read")]
# the on-paper store (issue 17) and the service it runs on: assumptions, not measurements
PAPER = {"store_bytes": 1e15, "chunks": 1e10, "files": 1e7, "pack_bytes": 64 * 2 ** 20, "history": 1000,
         "rtt_s": 0.02, "parallel": 64, "client_bytes_s": 1e9, "fanout": 1000, "footer_entry": 36,
         "tree_entry": 80}


def _scale_points(doc: dict, store: str) -> list[dict]:
    return sorted((p for p in doc["points"] if p["store"] == store), key=lambda p: (p["files"], p["versions"]))


def _req(op) -> int | None:
    return op["requests"]["requests"] if op and op.get("requests") else None


def _scale_cell(op) -> str:
    if not op:
        return "skipped"
    if "error" in op:
        return "FAILED (`error` in the JSON)"
    n = _req(op)
    return (f"{n:,} r, " if n is not None else "") + f"{op['seconds']:.2f} s"


def scale_constants(doc: dict) -> dict:
    """Per-unit costs fitted from the measured bucket points (left out where a run lacks the figures:
    an op failed or was skipped)."""
    out: dict = {}
    for name, value in _fit(doc).items():
        try:
            v = value()
        except (KeyError, TypeError, ZeroDivisionError):
            continue
        if v is not None:
            out[name] = v
    return out


def _fit(doc: dict) -> dict:
    """{constant: a function computing it from the bucket points}."""
    pts = _scale_points(doc, "bucket")
    out: dict = {}
    if not pts:
        return out
    by_files: dict = {}
    for p in pts:
        by_files.setdefault(p["files"], []).append(p)
    grown = max(by_files, key=lambda f: (len(by_files[f]), f))  # the dataset grown through most versions
    lo, hi = by_files[grown][0], by_files[grown][-1]
    packs = lambda p: p["objects"].get("packs", 0)  # noqa: E731
    if hi is not lo and packs(hi) > packs(lo):
        out["open_requests_per_pack"] = lambda: ((_req(hi["ops"]["open_new"]) - _req(lo["ops"]["open_new"]))
                                                 / (packs(hi) - packs(lo)))
        out["replica_requests_per_version"] = lambda: ((_req(hi["ops"]["replica"]) - _req(lo["ops"]["replica"]))
                                                       / (hi["versions"] - lo["versions"]))
    big = max(pts, key=lambda p: (p["files"], p["versions"]))
    small = min(pts, key=lambda p: (p["files"], p["versions"]))
    chunks = lambda p: p["objects"].get("manifests", 0)  # noqa: E731 - every file here is one chunk
    if chunks(big) > chunks(small):  # slopes: sqlite's fixed pages cancel out
        out["reader_index_bytes_per_chunk"] = lambda: ((big["index"]["reader_bytes"] - small["index"]["reader_bytes"])
                                                       / (chunks(big) - chunks(small)))
        out["writer_index_bytes_per_chunk"] = lambda: ((big["index"]["writer_bytes"] - small["index"]["writer_bytes"])
                                                       / (chunks(big) - chunks(small)))
    out["commit_bytes_per_file"] = lambda: big["ops"]["commit"]["requests"]["bytes_in"] / big["files"]
    out["ls_bytes_per_file"] = lambda: big["ops"]["ls_new"]["requests"]["bytes_out"] / big["files"]
    edits = [p for p in pts if _req(p["ops"].get("edit_push"))]
    if edits:
        e = max(edits, key=lambda p: (p["files"], p["versions"]))
        out["edit_push_requests_per_file"] = lambda: _req(e["ops"]["edit_push"]) / e["files"]
        out["edit_push_seconds_per_request_here"] = lambda: e["ops"]["edit_push"]["seconds"] / _req(e["ops"]["edit_push"])
    return out


def _dur(seconds: float) -> str:
    for unit, n in (("days", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= n:
            return f"{seconds / n:,.1f} {unit}"
    return f"{seconds * 1e3:,.0f} ms"


def _size(b: float) -> str:
    for unit, n in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= n:
            return f"{b / n:,.1f} {unit}"
    return f"{b:,.0f} B"


# the constants fitted by bench/scale.py (98b477b) on cdcstore ce3b1ea, the design before issue 17 (MEASURED
# then divided; docs/scale.md): what the "before" column of the on-paper table extrapolates
BEFORE_17 = {"open_requests_per_pack": 3, "reader_index_bytes_per_chunk": 144, "commit_bytes_per_file": 80.8,
             "edit_push_requests_per_file": 3.01}


def paper_rows(c: dict, P: dict = PAPER) -> list[list[str]]:
    """The on-paper costs at P's size: today's design from the fitted constants c, issue 17's from
    its structure (a request = rtt_s, `parallel` at once where the work allows; bytes at client_bytes_s)."""
    def t(requests, nbytes=0.0, parallel=1):
        return _dur(requests * P["rtt_s"] / parallel + nbytes / P["client_bytes_s"])
    g = lambda k, d: c.get(k) or d  # noqa: E731 - a constant the run did not fit: the default, said in the doc
    packs = P["store_bytes"] / P["pack_bytes"]
    depth = 3  # folders of <= fanout entries: log_1000(1e7) < 3
    node = P["fanout"] * P["tree_entry"]
    per_pack = g("open_requests_per_pack", 3)
    footer = P["chunks"] * P["footer_entry"]
    index = P["chunks"] * g("reader_index_bytes_per_chunk", 76)
    entry = g("commit_bytes_per_file", 80)
    file_map = P["files"] * entry
    per_file = g("edit_push_requests_per_file", 3)
    rows = [
        ["open + read 1 file, new machine",
         f"{packs * per_pack:,.2g} requests, {_size(footer + file_map)} (every pack footer, the file map); "
         f"{t(packs * per_pack, footer + file_map, P['parallel'])}",
         f"~{5 + depth} requests (ref, commit, {depth} tree nodes, manifest, 1 location lookup, the chunk): "
         f"{_size((depth + 1) * node)}; {t(5 + depth, (depth + 1) * node)}"],
        ["client index on disk", f"{_size(index)} on every machine (every chunk)",
         "what the machine read or wrote (a location cache, a stat cache of ~100 B a local file: 1 GB for 1e7)"],
        ["push of the folder, 1 file edited", f"{P['files'] * per_file:,.2g} requests, every file read again "
         f"({_size(P['store_bytes'])} hashed); {t(P['files'] * per_file, P['store_bytes'], P['parallel'])}",
         f"1e7 local stats (stat cache; ~10-60 s), 1 file uploaded, {depth + 1} tree nodes + commit + ref: "
         f"~{depth + 6} requests, {_size((depth + 1) * node)}; {t(depth + 6, (depth + 1) * node)} + the stats"],
        ["`ls` of a folder", f"the whole file map: {_size(file_map)}; {t(3, file_map)} + decoding "
         f"{P['files']:.0e} entries",
         f"ref, commit, {depth} tree nodes: {_size(depth * node)}; {t(2 + depth, depth * node)}"],
        ["one commit of N uploaded files", f"the whole file map written: {_size(file_map)} a commit; "
         f"1,000 commits (a dask job, one a file): {_size(1000 * file_map)}",
         "the changed folders' nodes and their ancestors: O(N + depth) entries, one commit a job"],
        ["new replica: first read", f"walks the history: {P['history']:,} commits x {_size(file_map)} = "
         f"{_size(P['history'] * file_map)}, and a GET of every manifest they name (>= {P['files']:.0e}); "
         f"{t(P['history'] + P['files'], P['history'] * file_map, P['parallel'])}",
         f"as a new machine's open: ~{5 + depth} requests; {t(5 + depth, (depth + 1) * node)}"],
    ]
    return rows


def view_scale(doc: dict) -> list[str]:
    a = doc.get("args", {})
    out = [f"Datasets of {a.get('files')} files of ~{a.get('small_bytes')} B (100 a folder), grown to "
           f"{a.get('versions')} versions ({a.get('big_versions')} from {a.get('big', 10000):,} files); medians of "
           f"{a.get('repeat')} runs for the new-machine reads and the replica, one run for the writes "
           f"(N = {a.get('commit_files')}). r: requests to the bucket through the counting proxy (moto). "
           "MEASURED:", ""]
    rows = []
    for p in _scale_points(doc, "bucket"):
        o = p["ops"]
        start = o["replica"].get("start_requests")
        rows.append([f"{p['files']:,}", str(p["versions"]), str(p["objects"].get("packs", "")),
                     *(_scale_cell(o.get(k)) for k, _ in SCALE_OPS),
                     f"{start['requests']:,} r" if start else "",
                     _fmt(p["index"]["reader_bytes"] and p["index"]["reader_bytes"] / 1e3, "{:,.0f}"),
                     _fmt(p["index"]["writer_bytes"] / 1e3, "{:,.0f}")])
    head = ["files", "versions", "packs", *(label for _, label in SCALE_OPS), "replica start",
            "reader's cache, kB", "writer's index, kB"]
    if rows:
        out += ["Bucket (moto's S3 server behind the counting proxy):", ""] + table(head, rows)
    rows = [[f"{p['files']:,}", str(p["versions"]), *(_scale_cell(p["ops"].get(k)) for k, _ in SCALE_OPS),
             f"{p['index']['writer_bytes'] / 1e3:,.0f}"] for p in _scale_points(doc, "dir")]
    if rows:
        out += ["Directory store (seconds only; its index lives in the store):", ""]
        out += table(["files", "versions", *(label for _, label in SCALE_OPS), "store's index, kB"], rows)
    kinds = [p for p in _scale_points(doc, "bucket") if (p["ops"]["open_new"].get("requests") or {}).get("by_kind")]
    if kinds:
        p = max(kinds, key=lambda p: (p["versions"], p["files"]))
        rows = []
        for k, label in SCALE_OPS:
            op = p["ops"].get(k)
            if op and op.get("requests"):
                by = op["requests"]["by_kind"]
                rows.append([label, ", ".join(f"{n:,} {kind}" for kind, n in by.items())])
        start = p["ops"]["replica"].get("start_requests")
        if start:
            rows.append(["new replica: its start", ", ".join(f"{n:,} {kind}" for kind, n in start["by_kind"].items())])
        out += [f"Those requests by store folder, at {p['files']:,} files and {p['versions']} versions:", ""]
        out += table(["operation", "requests (method, store folder)"], rows)
    c = scale_constants(doc)
    if c:
        labels = {"open_requests_per_pack": "requests a new machine's open adds per pack in the bucket",
                  "replica_requests_per_version": "requests a new replica's first read adds per version",
                  "reader_index_bytes_per_chunk": "a new reader's index bytes per chunk in the store (it indexed "
                                                  "every pack: the chunk table)",
                  "writer_index_bytes_per_chunk": "the writer's index bytes per chunk (here a chunk a file: the "
                                                  "per-file rows of its grants count too)",
                  "commit_bytes_per_file": "commit bytes written per file in the repo",
                  "ls_bytes_per_file": "bytes a new machine's `ls` reads per file in the repo",
                  "edit_push_requests_per_file": "requests of a one-file-edit folder push per file in the folder",
                  "edit_push_seconds_per_request_here": "seconds per request of that push here (moto, loopback)"}
        out += ["Constants fitted from the bucket points (MEASURED, then divided):", ""]
        out += table(["constant", "value"], [[labels[k], f"{v:,.3g}"] for k, v in c.items()])
    P = PAPER
    out += [f"ON PAPER (arithmetic, not measured): {P['store_bytes'] / 1e15:g} PB, {P['chunks']:.0e} chunks, "
            f"{P['files']:.0e} files in one repo, {P['history']:,} commits of history, packs of 64 MiB "
            f"({P['store_bytes'] / P['pack_bytes']:.2g}), a request {P['rtt_s'] * 1e3:g} ms, {P['parallel']} at once "
            f"where the work allows, a client at {P['client_bytes_s'] / 1e9:g} GB/s, folders of "
            f"<= {P['fanout']:,} entries of {P['tree_entry']} B; the first column uses the constants fitted "
            f"on the design before issue 17 (bench/scale.py at 98b477b, cdcstore ce3b1ea: `BEFORE_17`):", ""]
    out += table(["operation", "before issue 17", "issue 17's design"], paper_rows(BEFORE_17))
    return out


VIEWS = {"fs": view_fs, "link": view_link, "ingest": view_ingest, "read": view_read, "dedup": view_dedup, "chunker": view_chunker,
         "objects": view_objects, "cold-profile": view_cold_profile, "cold_profile": view_cold_profile,
         "transfer": view_transfer, "scale": view_scale, "gateway": view_gateway, "engines": view_engines}


def goal_rows(doc: dict) -> dict:
    """The goals of a run: `goal_results` (harness.Goal), else the older `goals` when it holds dicts."""
    goals = doc.get("goal_results") or doc.get("goals") or {}
    return {k: g for k, g in goals.items() if isinstance(g, dict)}


def render(name: str, doc: dict, chart: str | None = None) -> str:
    """The markdown of one figure block (`chart`: the chart's path relative to the doc)."""
    code = doc.get("code") or {}
    load = doc.get("loadavg_start")
    bench = doc.get("bench", name.replace("-", "_"))
    about = [f"`bench/{bench}.py` at commit {code.get('head', '?')}"] + (
        [f"{doc['cpus']} CPUs"] if "cpus" in doc else []) + (
        [f"load average {load[0]:.1f} at the start"] if load else [])
    out = [f"From `bench/results/{name}.json` ({', '.join(about)}):", ""]
    view = VIEWS.get(name) or VIEWS.get(bench)
    if view:
        out += view(doc)
    goals = goal_rows(doc)
    if goals:
        out += ["| figure | value | goal | met |", "| --- | --- | --- | --- |"]
        for key, g in goals.items():
            if g.get("value") is None:  # that part of the bench did not run
                out.append(f"| {key} | not measured | {g.get('goal', '')} | - |")
                continue
            met = "reported" if g.get("goal") == "reported" else "yes" if g.get("met") else "no"
            out.append(f"| {key} | {_fmt(g.get('value'))} | {g.get('goal', '')} | {met} |")
        out.append("")
    sides = doc.get("sides") or {}
    keys = [(k, label, how) for k, label, how in SIDE_FIGURES if any(k in (v or {}) for v in sides.values())]
    if sides and keys:
        out += ["| side | " + " | ".join(label for _, label, _ in keys) + " |",
                "| --- |" + " --- |" * len(keys)]
        for side, figs in sides.items():
            figs = figs or {}
            out.append(f"| {side} | " + " | ".join(_fmt(figs.get(k), how) if k in figs else "" for k, _, how in keys)
                       + " |")
        out.append("")
    if chart:
        out += [f"![{CHART_TITLES[name]}]({chart})", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# charts (matplotlib, imported only to draw)
# ---------------------------------------------------------------------------------------------

CHART_TITLES = {"dedup": "New bytes per edit scenario, cdcstore against hf_xet",
                "ingest": "Push throughput against hf_xet and the floor (cp -r + sync)",
                "read": "Read throughput and latency against hf_xet and a plain file",
                "read-sizes": "Sequential read throughput by read size against a plain read of the page cache",
                "stream": "Samples/s of each stream side, in process and with 2 DataLoader workers",
                "scale": "Requests of each operation against the versions in the store, per dataset size"}
COLORS = {"ours": "#1f77b4", "peer": "#ff7f0e", "floor": "#7f7f7f", "b": "#aec7e8", "d": "#2ca02c"}


def _bars(ax, labels: list[str], series: list[tuple[str, list, str]], xlabel: str) -> None:
    """Horizontal grouped bars: one group per label, one bar per series (name, values, color)."""
    n = len(series)
    h = 0.8 / n
    for i, (name, values, color) in enumerate(series):
        ys = [g - 0.4 + h / 2 + i * h for g in range(len(labels))]  # the first series on top
        vals = [v if v is not None else 0 for v in values]
        ax.barh(ys, vals, height=h * 0.9, color=color, label=name)
        for y, v in zip(ys, values):
            if v is not None:
                ax.text(v, y, f" {v:,.1f}" if v < 100 else f" {v:,.0f}", va="center", fontsize=7)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.margins(x=0.18)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def chart_dedup(plt, doc: dict):
    names = list(doc["scenarios"])
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(names) + 1.4))
    colors = {"a": COLORS["peer"], "b": COLORS["b"], "c": COLORS["ours"], "d": COLORS["d"]}
    _bars(ax, names, [(DEDUP_LABELS[v], [doc["scenarios"][n][v]["new_bytes"] / 1e6 for n in names], colors[v])
                      for v in "abcd"], "new bytes, MB (less is better)")
    ax.set_title(f"New bytes per edit of a {doc['dataset']['plain_file_bytes'] / 1e6:,.0f} MB Parquet file")
    ax.legend(loc="lower right", fontsize=7, frameon=False)
    return fig


def chart_ingest(plt, doc: dict):
    o, x = doc["ours"], doc["xet"]
    floor = doc.get("floor", {}).get("v1_mb_s")
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    _bars(ax, ["push v1", "push v2 (mostly known)", "push v1 + v2"],
          [("cdcstore", [o["v1_mb_s"], o["v2_mb_s"], o["total_mb_s"]], COLORS["ours"]),
           ("hf_xet local://", [x["v1_mb_s"], x["v2_mb_s"], x["total_mb_s"]], COLORS["peer"]),
           ("floor: cp -r + sync", [floor, None, None], COLORS["floor"])], "MB/s (more is better)")
    ax.set_title(f"Push of {doc['dataset']['v1_bytes'] / 1e6:,.0f} MB of Parquet, medians of {doc['repeat']}")
    ax.legend(loc="lower right", fontsize=7, frameon=False)
    return fig


def chart_read(plt, doc: dict):
    s = doc["sides"]
    names = list(s)
    colors = [COLORS["ours"] if n == "ours" else COLORS["floor"] if n == "plain" else COLORS["peer"] for n in names]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.5, 2.4))
    for ax, key, scale, label in ((a1, "full_mb_s", 1, "full read, MB/s (more is better)"),
                                  (a2, "random_median_s", 1e6, "random 64 KiB read, median µs (less is better)")):
        vals = [s[n][key] * scale if s[n][key] is not None else None for n in names]
        for i, (v, c) in enumerate(zip(vals, colors)):
            ax.barh(i, v or 0, color=c, height=0.7)
            if v is not None:
                ax.text(v, i, f" {v:,.0f}", va="center", fontsize=7)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ax.margins(x=0.25)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.suptitle(f"Reads of a {doc['file_bytes'] / 1e6:,.0f} MB file from the page cache, medians of {doc['repeat']}")
    return fig


def chart_read_sizes(plt, doc: dict):
    """Sequential reads of one file by read size: ours against a plain read of the page cache."""
    sizes = sorted(doc["by_size"], key=int, reverse=True)
    labels = [f"{int(k) >> 20} MiB" if int(k) >= 1 << 20 else f"{int(k) >> 10} KiB" for k in sizes] + ["whole file"]
    ours = [doc["by_size"][k]["ours_mb_s"] for k in sizes] + [doc["sides"]["ours"]["full_mb_s"]]
    plain = [doc["by_size"][k]["plain_mb_s"] for k in sizes] + [doc["sides"]["plain"]["full_mb_s"]]
    fig, ax = plt.subplots(figsize=(6.5, 2.6))
    _bars(ax, labels, [("cdcstore", ours, COLORS["ours"]), ("plain read", plain, COLORS["floor"])],
          "MB/s, sequential reads of that size (more is better)")
    ax.legend(fontsize=7, frameon=False, loc="lower right")
    fig.suptitle(f"Reads of a {doc['file_bytes'] / 1e6:,.0f} MB Parquet file from the page cache, by read size, "
                 f"medians of {doc['repeat']}", fontsize=9)
    return fig


STREAM_GROUPS = [("in process", ["ours", "ours_arrow", "hf", "hf_numpy", "local"]),
                 ("DataLoader, 2 workers", ["ours_dl", "ours_arrow_dl", "ours_shuf_dl", "ours_rawdl", "hf_dl", "mds_dl",
                                            "litdata_dl"])]


def chart_stream(plt, doc: dict):
    """Samples/s of each side, in process and with 2 DataLoader workers."""
    s = doc.get("sides") or {}
    names = [n for _, group in STREAM_GROUPS for n in group if (s.get(n) or {}).get("samples_per_s")]
    vals = [s[n]["samples_per_s"] / 1e6 for n in names]
    colors = [COLORS["ours"] if n.startswith("ours") else COLORS["floor"] if n == "local" else COLORS["peer"]
              for n in names]
    fig, ax = plt.subplots(figsize=(6.5, 0.3 * len(names) + 1.0))
    for i, (v, c) in enumerate(zip(vals, colors)):
        ax.barh(i, v, color=c, height=0.7)
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=7)
    loaders = set(STREAM_GROUPS[1][1])
    # the bench's own labels (bench/stream.py's SIDE_LABELS, in JSON since ours_dl became ds.loader);
    # older JSON: every DataLoader side was DataLoader(2)
    labels = doc.get("side_labels") or {}
    workers = {n: labels.get(n) or ("DataLoader(2)" if n in loaders else "pyarrow, local disk" if n == "local"
                                    else "in process") for n in names}
    ax.set_yticks(range(len(names)), [f"{n} ({workers[n]})" for n in names], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("M samples/s, cold through a server (more is better)")
    ax.margins(x=0.2)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig


def chart_scale(plt, doc: dict):
    """Bucket requests of each op (and the index sizes) against the versions in the store, a line a dataset."""
    from matplotlib import ticker
    pts = _scale_points(doc, "bucket")
    panels = [(k, label) for k, label in SCALE_OPS] + [("start", "new replica: its start"), ("index", "index, kB: writer (o-), new reader (s:)")]
    fig, axes = plt.subplots(2, 5, figsize=(11, 4.6))
    sizes = sorted({p["files"] for p in pts})
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
    for ax, (key, label) in zip(axes.flat, panels):
        for n, color in zip(sizes, colors):
            ps = [p for p in pts if p["files"] == n]
            xs = [p["versions"] for p in ps]
            if key == "index":
                ax.plot(xs, [p["index"]["writer_bytes"] / 1e3 for p in ps], "o-", color=color, ms=3,
                        label=f"{n:,} files")
                xy = [(p["versions"], p["index"]["reader_bytes"] / 1e3) for p in ps if p["index"]["reader_bytes"]]
                if xy:
                    ax.plot(*zip(*xy), "s:", color=color, ms=3)
                continue
            if key == "start":
                ys = [(p["ops"]["replica"].get("start_requests") or {}).get("requests") for p in ps]
            else:
                ys = [_req(p["ops"].get(key)) for p in ps]
            xy = [(x, y) for x, y in zip(xs, ys) if y is not None]
            if xy:
                ax.plot(*zip(*xy), "o-", color=color, ms=3, label=f"{n:,} files")
        ax.set_title(label, fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        vs = sorted({p["versions"] for p in pts})
        ax.set_xticks(vs, [str(v) for v in vs])
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("versions in the store", fontsize=7)
        ax.tick_params(labelsize=7)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes.flat[0].set_ylabel("requests to the bucket")
    axes.flat[5].set_ylabel("requests to the bucket")
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6, frameon=False)
    fig.suptitle("Cost of one operation as the store grows (bucket behind a counting proxy; measured)")
    return fig


CHARTS = {"dedup": chart_dedup, "ingest": chart_ingest, "read": chart_read, "read-sizes": chart_read_sizes,
          "scale": chart_scale, "stream": chart_stream}


def draw(name: str, doc: dict) -> bytes:
    """The chart of a result as SVG bytes, deterministic for a given matplotlib version."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    style = {"svg.hashsalt": "cdcstore-figures", "svg.fonttype": "none", "font.family": "DejaVu Sans",
             "font.size": 8, "axes.titlesize": 9, "figure.dpi": 100, "path.simplify": True}
    with matplotlib.rc_context(style):
        fig = CHARTS[name](plt, doc)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Contributor": None})
        plt.close(fig)
    return buf.getvalue()


def chart_path(name: str) -> str:
    return os.path.join(CHART_DIR, f"{name}.svg")


# ---------------------------------------------------------------------------------------------
# docs
# ---------------------------------------------------------------------------------------------

def load_results() -> dict[str, dict]:
    out = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        with open(path) as f:
            out[os.path.basename(path)[:-5]] = json.load(f)
    return out


def rewrite(text: str, results: dict[str, dict], doc_dir: str | None = None) -> str:
    """text with every figure block rendered from results (charts linked relative to doc_dir)."""
    doc_dir = doc_dir or os.path.join(ROOT, "docs")

    def block(m):
        name = m.group("name")
        if name not in results:
            raise SystemExit(f"a doc shows figures {name!r} but bench/results/{name}.json does not exist: "
                             f"run the bench and `bench/figures.py save {name} OUTPUT`")
        chart = os.path.relpath(chart_path(name), doc_dir) if name in CHARTS else None
        return m.group(1) + render(name, results[name], chart) + "\n" + m.group(4)
    return BLOCK.sub(block, text)


def docs() -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]


def shown_charts() -> list[str]:
    """Names of the charted results some doc shows a figure block of."""
    names = {m.group("name") for p in docs() for m in BLOCK.finditer(open(p).read())}
    return sorted(n for n in names if n in CHARTS)


def stale() -> list[str]:
    """Docs whose figure blocks differ from the JSON they are made from, and shown charts that are missing."""
    results = load_results()
    bad = [p for p in docs() if (t := open(p).read()) != rewrite(t, results, os.path.dirname(p))]
    return bad + [chart_path(n) for n in shown_charts() if not os.path.exists(chart_path(n))]


def stale_charts() -> list[str]:
    """Shown charts whose SVG differs from a fresh drawing (needs matplotlib)."""
    results = load_results()
    out = []
    for n in shown_charts():
        p = chart_path(n)
        if not os.path.exists(p) or open(p, "rb").read() != draw(n, results[n]):
            out.append(p)
    return out


def render_all() -> None:
    results = load_results()
    for p in docs():
        t = open(p).read()
        if (n := rewrite(t, results, os.path.dirname(p))) != t:
            with open(p, "w") as f:
                f.write(n)
    os.makedirs(CHART_DIR, exist_ok=True)
    for n in shown_charts():
        svg = draw(n, results[n])
        p = chart_path(n)
        if not os.path.exists(p) or open(p, "rb").read() != svg:
            with open(p + ".tmp", "wb") as f:
                f.write(svg)
            os.replace(p + ".tmp", p)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save", help="keep the last JSON line of a bench run as bench/results/NAME.json")
    s.add_argument("name")
    s.add_argument("output", help="a file holding the bench's output ('-': stdin)")
    sub.add_parser("render", help="rewrite the figure blocks of docs/*.md and README.md, redraw the charts")
    c = sub.add_parser("check", help="exit 1 if a figure block or a chart differs from its JSON")
    c.add_argument("--no-charts", action="store_true", help="check the blocks only (no matplotlib needed)")
    a = ap.parse_args(argv)
    if a.cmd == "save":
        text = sys.stdin.read() if a.output == "-" else open(a.output).read()
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, f"{a.name}.json"), "w") as f:
            json.dump(last_json(text), f, indent=1, sort_keys=False)
            f.write("\n")
        return 0
    if a.cmd == "render":
        render_all()
        return 0
    bad = stale()
    if not a.no_charts:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib is not installed: charts checked for presence only (pip install -e '.[bench]')")
        else:
            bad += stale_charts()
    for p in dict.fromkeys(bad):
        print(f"{os.path.relpath(p, ROOT)}: differs from bench/results: run `python bench/figures.py render`")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

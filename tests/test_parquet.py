"""Parquet page walking, fallback, and the dedup-friendly writer."""
import base64
import io
import itertools
import os
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import parquet as P
from cdcstore.core import pages
from cdcstore import Store
from cdcstore.core.chunker import ChunkParams, iter_chunks


def sample_table(n=60_000, seed=0):
    rng = np.random.default_rng(seed)
    ints = rng.integers(0, 1000, n)
    return pa.table({
        "id": pa.array(np.arange(n) + seed * 10_000_000),
        "x": pa.array(rng.random(n)),
        "maybe": pa.array([None if i % 7 == 0 else float(i) for i in range(n)]),
        "cat": pa.array([f"cat{v}" for v in ints]),
        "text": pa.array([f"row {i} says {v * 7919}" for i, v in enumerate(ints)]),
        "nested": pa.array([[int(v), int(v) + 1] if v % 3 else None for v in ints]),
        "struct": pa.array([{"a": int(v), "b": str(v)} for v in ints]),
        "flag": pa.array(ints % 2 == 0),
    })


WRITE_VARIANTS = {
    "default": {},
    "no-dictionary-uncompressed": dict(use_dictionary=False, compression="none"),
    "row-groups-gzip": dict(row_group_size=10_000, compression="gzip"),
    "v2-pages-zstd": dict(data_page_version="2.0", compression="zstd", data_page_size=8192),
    "arrow-cdc-page-index": dict(use_content_defined_chunking=True, write_page_index=True, row_group_size=25_000),
    "lz4-no-stats": dict(compression="lz4", write_statistics=False),
}


@pytest.mark.parametrize("variant", sorted(WRITE_VARIANTS))
def test_page_walk_tiles_every_column_chunk(tmp_path, variant):
    path = str(tmp_path / "t.parquet")
    pq.write_table(sample_table(), path, **WRITE_VARIANTS[variant])
    cuts = pages.page_cuts(path)
    assert cuts is not None
    md = pq.ParquetFile(path).metadata
    data = open(path, "rb").read()
    ranges = []
    for rg in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(rg).column(c)
            start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
            ranges.append((start, start + col.total_compressed_size))
            assert start in cuts and start + col.total_compressed_size in cuts
    assert len(cuts) > len(ranges)  # page starts inside column chunks too
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    assert footer_start in cuts
    for c in cuts:
        if any(a <= c < b for a, b in ranges):  # every cut inside a column chunk starts a page
            _, page_type, size = pages.read_page_header(data, c)
            assert page_type in (0, 2, 3) and size >= 0


def test_fallback_for_truncated_and_fake_parquet(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(sample_table(5000), path)
    data = path.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "fake.parquet").write_bytes(b"PAR1 this is not parquet at all PAR1")
    (tmp_path / "text.parquet").write_bytes(b"hello")
    bad_footer = bytearray(data)
    bad_footer[-20:-8] = b"\xff" * 12
    (tmp_path / "badfooter.parquet").write_bytes(bytes(bad_footer))
    for name in ("cut.parquet", "fake.parquet", "text.parquet", "badfooter.parquet"):
        assert pages.page_cuts(str(tmp_path / name)) is None
    s = Store.init(str(tmp_path / "store"))
    r = s.push([str(tmp_path)], "cdc://pq/")  # never fails the push
    assert r.files_detail["t.parquet"]["chunking"] == "parquet-pages"
    assert r.files_detail["cut.parquet"]["chunking"] == "bytes"
    for name in ("t.parquet", "cut.parquet", "fake.parquet", "text.parquet", "badfooter.parquet"):
        assert s.cat(f"cdc://pq/{name}") == (tmp_path / name).read_bytes()


def test_page_aligned_round_trip_and_chunks_follow_pages(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(sample_table(), path, use_content_defined_chunking=True)
    s = Store.init(str(tmp_path / "store"))
    r = s.push([str(path)], "cdc://pq/t.parquet")
    assert s.cat("cdc://pq/t.parquet") == path.read_bytes()
    m = s.manifest("pq", s.resolve("cdc://pq/")[1].files["t.parquet"].manifest)
    cuts = set(pages.page_cuts(str(path)))
    assert cuts <= set(m.ends) | {0}  # every page start is a chunk boundary
    assert r.chunks == len(m.chunk_ids)


def test_writer_files_read_back_equal(tmp_path):
    t = sample_table()
    path = str(tmp_path / "w.parquet")
    sizes = P.write_table(t, path, row_group_bytes=512 * 1024)
    assert len(sizes) > 2 and sum(sizes) == t.num_rows
    back = pq.read_table(path)
    assert back.equals(t)
    assert b"cdcstore.writer" in back.schema.metadata
    md = pq.ParquetFile(path).metadata
    assert md.num_row_groups == len(sizes)
    assert pages.page_cuts(path) is not None
    import duckdb
    import pandas as pd
    import polars as pl

    assert pd.read_parquet(path)["text"].tolist() == t["text"].to_pylist()
    con = duckdb.connect()
    assert con.execute(f"SELECT count(*), sum(id) FROM read_parquet('{path}')").fetchall() == [
        (t.num_rows, sum(t["id"].to_pylist()))]
    assert pl.read_parquet(path)["cat"].to_list() == t["cat"].to_pylist()


def test_writer_dataset_round_trip(tmp_path):
    t = sample_table(40_000)
    paths = P.write_dataset(t, str(tmp_path / "ds"), file_bytes=2 << 20, row_group_bytes=256 * 1024)
    assert len(paths) >= 2
    import pyarrow.dataset as ds

    assert ds.dataset(str(tmp_path / "ds")).to_table().equals(t)


def test_content_defined_row_groups_survive_a_mid_file_insert(tmp_path):
    t = sample_table(200_000)
    extra = sample_table(100, seed=5)
    edited = pa.concat_tables([t.slice(0, 100_000), extra, t.slice(100_000)])
    a = P.write_table(t, str(tmp_path / "a.parquet"), row_group_bytes=1 << 20)
    b = P.write_table(edited, str(tmp_path / "b.parquet"), row_group_bytes=1 << 20)
    assert len(a) >= 4
    # all row groups but the one that took the insert are unchanged
    changed = [x for x, y in zip(sorted(a), sorted(b)) if x != y]
    assert len(set(a) ^ set(b)) <= 2 and len(changed) <= 2
    s = Store.init(str(tmp_path / "store"))
    s.push([str(tmp_path / "a.parquet")], "cdc://w/t.parquet")
    r = s.push([str(tmp_path / "b.parquet")], "cdc://w/t.parquet")
    assert r.new_bytes < 0.35 * os.path.getsize(tmp_path / "b.parquet")


def test_fixed_key_and_target_keep_row_groups_when_a_column_is_added(tmp_path):
    t = sample_table(120_000)
    wider = t.append_column("extra", pa.array(np.arange(t.num_rows, dtype=np.float64)))
    opts = dict(key_columns=["id"], row_group_rows=16_384)
    a = P.write_table(t, str(tmp_path / "a.parquet"), **opts)
    b = P.write_table(wider, str(tmp_path / "b.parquet"), **opts)
    assert a == b and len(a) > 3


def test_plan_row_groups_bounds():
    fps = np.array([2**63] * 1000, dtype=np.uint64)
    fps[[10, 500, 505, 990]] = 0
    ends = P.plan_row_groups(fps, target_rows=100, min_rows=20, max_rows=300)
    assert ends[-1] == 1000
    sizes = [b - a for a, b in zip([0] + ends, ends)]
    assert all(s <= 300 for s in sizes)
    assert 500 in ends and 505 not in ends and 10 not in ends


# A small Parquet file (pyarrow-written, stored here so its bytes never change) and the
# page-aligned chunk boundaries it must get: part of chunk format v1.
GOLDEN_PARQUET = zlib.decompress(base64.b64decode(
    "eNrd13dQk3cYwPE3IYSww3hDEgKE9YYRIiu4cKCICxURFbcRURCBkDDcExVRFFdL7bJ2t3TYvYdt7R52WLvttttuuvsmfuWP4vW8"
    "3vUfc889n7v33ufe5/e+uef3viUFpVmiSjwRLkex2K0UhXCh96dAJfqgCn1RjX6oQX8MwEAMwmAMwVDUYhieaSkCI1FEHUahHg1o"
    "xGg0YQzGYhyaMR4TMBGTMBkltGAKpmIapqMVM9CG/TATszAbczAX7ZiH/XEADsRBOBjzcQgOxWE4HAtwBI7EQhyFRTgax+BYHIfj"
    "sRgn4ESchCU4GUtxCpbhVJyG07EcZ+BMnIWzcQ7OxXk4Hx24ACtwIVbiIlyMVViNS7AGl2It1mE9OrEBXejGRmzCZmzBZbgcV+BK"
    "XIWrcQ2uxXW4HjfgRmzFTbgZt2AbbsV23IbbsQN34E7sxF24G/fgXtzXOwfEw0o5rJ4BphXVotrEtOpWKjQWQaH0Ufmq/TT+AYFB"
    "wSGh2rDwiEhRF6U3GKNNMbFx5viExKRkyZKSmpZuzbD1y8zKzsm15/UfMHDQ4PwhQ4cNLxgxsnBU0egxY8eNL54wcVLJ5NIpZVOn"
    "TS+fMXPW7Dlz5813LKhYWLlocVX1kpqltXX1zgaXu7GpuWXZ8hUrV61es3bd+g0bWzdt3tK2tX3b9o4dOzt37d6zV+5dnrtlYlmx"
    "GOIdup4h25zpzVnenO3NOd6c6812b86Tl9uqkOOsy/WxtB0xHi1PNNYUVnRUdYd12A8eKso9dg4HFX32gQu4vxdiF16E+/FivAQv"
    "xcvwcjyAV+BBvBKvwqvxGrwWr8Pr8Qa8EbvxJrwZb8Fb8RDehrfjHXgn3oV34z14L96H9+MD+CA+hA/jI/goHsbH8HF8Ao/gk/gU"
    "Po3P4LP4HD6PL+CL+BIexZfxFXwVX8Nj+DoexzfwTXwL38Z38F18D0/g+/gBfogf4cf4CX6KJ/Ez/By/wC/xK/wav8FT+C1+h9/j"
    "D/gj/oQ/Yw/+gr/ib/g7/oF/4l//eKFSoBJ9UIW+qEY/1KA/BmAgBmEwhmAoajEMwzECI1FEHUahHg1oxGg0YQzGYhyaMR4TMBGT"
    "MBkltGAKpmIapivOt33gLFO/7/7w/+0Dhny7oFe7K6oqax2iSm4wWalXOAQxyKM7WSj2XEh3XGWwGqySYJIL7IJaa5DPEQVdt1J3"
    "SpRDao+QNKlWeXWCqPQ8G61MfqraIMn9ed+aTWLQmUL36cIDnpBO6qQesU+l53q9xbpOvXy+pJEV/q2H/elSl/4/NdFjk9ps59RE"
    "l97TRYrZ6XA1NFU2ZlQ4nRkOl6u+xdxc6XJX19eZs/NsmbYsg9V0+tvDIf9fS+QPr78BpD1pYg=="))


def test_golden_parquet_page_cuts_and_chunks(tmp_path):
    path = tmp_path / "golden.parquet"
    path.write_bytes(GOLDEN_PARQUET)
    cuts = pages.page_cuts(str(path))
    assert cuts == [4, 1221, 1404, 1460, 1548, 2765, 2948, 3004, 3092]
    chunks = iter_chunks(io.BytesIO(GOLDEN_PARQUET), ChunkParams(64, 256, 1024), cuts=cuts)
    ends = list(itertools.accumulate(len(c) for c in chunks))
    assert ends == [4, 296, 560, 681, 976, 1221, 1404, 1460, 1548, 1807, 2155, 2436, 2703, 2765, 2948, 3004, 3092, 3407, 3453]

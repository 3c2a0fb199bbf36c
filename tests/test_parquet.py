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
    """The reference walk (revisions 1-3: every page start) tiles every column chunk, and the
    native walk finds the same pages (with max_size 1 every candidate is a cut)."""
    path = str(tmp_path / "t.parquet")
    pq.write_table(sample_table(), path, **WRITE_VARIANTS[variant])
    cuts = pages.page_starts(path)
    assert pages.page_cuts(path, ChunkParams(1, 1, 1)) == cuts + [os.path.getsize(path)]
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
        assert pages.page_starts(str(tmp_path / name)) is None
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
    assert cuts <= set(m.ends) | {0}  # every page group ends a chunk
    starts = set(pages.page_starts(str(path)))
    inside = [e for e in m.ends[:-1] if e not in starts]  # cuts inside a page: only in pages over max_size
    spans = sorted(starts | {len(path.read_bytes())})
    for e in inside:
        a = max(c for c in spans if c < e)
        b = min(c for c in spans if c > e)
        assert b - a > 256 * 1024, (a, e, b)
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
    """Revision 1 of the forced cut points (chunk format v1), kept for the record."""
    path = tmp_path / "golden.parquet"
    path.write_bytes(GOLDEN_PARQUET)
    cuts = pages.page_starts(str(path))
    assert cuts == [4, 1221, 1404, 1460, 1548, 2765, 2948, 3004, 3092]
    chunks = iter_chunks(io.BytesIO(GOLDEN_PARQUET), ChunkParams(64, 256, 1024), cuts=cuts)
    ends = list(itertools.accumulate(len(c) for c in chunks))
    assert ends == [
        4, 296, 560, 681, 976, 1221, 1404, 1460, 1548, 1807, 2155, 2436, 2703, 2765, 2948, 3004, 3092,
        3407, 3453
    ]
    chunks = list(iter_chunks(io.BytesIO(GOLDEN_PARQUET), ChunkParams(64, 256, 1024), cuts=cuts))
    from cdcstore.core import ids  # the chunks' ids: BLAKE3-256 (format v2), xxh3-128 (v1, still read)
    assert ids.hexdigest(b"".join(map(ids.digest, chunks))) == \
        "ede822f4827a56142822b1c9e19007028032c7b76abd84e09b660200135fef18"
    assert ids.legacy_hexdigest(b"".join(map(ids.legacy_digest, chunks))) == "7881128ee6f5b481998a9d762ea670d3"


def _delete_edit_tables(n=240_000, cut=2_400):
    """A table of incompressible floats, counters, a few labels and short text, and the same
    table with a contiguous 1% of its rows deleted near the middle."""
    rng = np.random.default_rng(12)
    labels = np.array([f"label-{i:02d}" for i in range(40)])
    t = pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "ts": pa.array(np.cumsum(rng.integers(0, 5000, n))),
        "value": pa.array(rng.random(n)),
        "user": pa.array((rng.random(n) ** 4 * 1_000_000).astype(np.int64)),
        "label": pa.array(labels[rng.integers(0, len(labels), n)]),
    })
    lo = n // 2 + 777
    return t, pa.concat_tables([t.slice(0, lo), t.slice(lo + cut)])


def test_writer_deleting_one_percent_mid_file_stores_little(tmp_path):
    """Deleting 1% of the rows mid-file stores a few pages per column, not the rest of the
    row group: no dictionary renumbering for many-valued columns, and page boundaries that
    fall back into step soon after the cut. (Writer version 1 stored 50% of the file here,
    version 2 stored 12% with a chunk per page (chunk format v1) and 30% with page groups (v2),
    version 3 (no row limit per page) 25% with page groups: chunks four times as large make an
    edit of a few pages cost about a chunk per column. Byte CDC stores 33% of this file.)"""
    t, edited = _delete_edit_tables()
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    P.write_table(t, a, row_group_rows=1 << 16)
    P.write_table(edited, b, row_group_rows=1 << 16)
    s = Store.init(str(tmp_path / "store"))
    s.push([a], "cdc://w/t.parquet")
    r = s.push([b], "cdc://w/t.parquet")
    assert s.cat("cdc://w/t.parquet") == open(b, "rb").read()
    assert r.new_bytes < 0.3 * os.path.getsize(b), r.new_bytes / os.path.getsize(b)


def test_dictionary_only_for_columns_with_few_distinct_values(tmp_path):
    n = 50_000
    rng = np.random.default_rng(3)
    t = pa.table({
        "id": pa.array(np.arange(n)),
        "cat": pa.array([f"c{v}" for v in rng.integers(0, 10, n)]),
        "flag": pa.array(rng.integers(0, 2, n) == 1),
        "dict": pa.array([f"d{v}" for v in rng.integers(0, 5, n)]).dictionary_encode(),
        "many": pa.array([f"m{v}" for v in rng.integers(0, 10**9, n)]).dictionary_encode(),
        "nested": pa.array([[int(v)] for v in rng.integers(0, 3, n)]),
        "long": pa.array([f"{v}" * 400 for v in rng.integers(0, 1000, n)]),  # few values, 1 MB of them
    })
    cols = P.dictionary_columns(t)
    assert cols == ["cat", "flag", "dict", "nested.list.element"]
    path = str(tmp_path / "d.parquet")
    P.write_table(t, path, row_group_rows=1 << 14)
    md = pq.ParquetFile(path).metadata
    for rg in range(md.num_row_groups):
        with_dict = {md.row_group(rg).column(c).path_in_schema for c in range(md.num_columns)
                     if md.row_group(rg).column(c).has_dictionary_page}
        assert with_dict == {"cat", "dict", "nested.list.element"}  # (Parquet never dictionary-encodes booleans)
    import json

    recorded = json.loads(pq.read_schema(path).metadata[P.WRITER_METADATA_KEY])
    assert recorded["dictionary"] == cols and recorded["version"] == P.WRITER_VERSION
    assert_same_rows(pq.read_table(path), t)
    forced = str(tmp_path / "forced.parquet")
    P.write_table(t, forced, use_dictionary=False)  # the caller's choice wins
    md = pq.ParquetFile(forced).metadata
    assert not any(md.row_group(0).column(c).has_dictionary_page for c in range(md.num_columns))


HOSTILE_TABLES = ("nulls", "all_equal", "high_cardinality_strings", "nested", "empty", "one_row",
                  "dictionary_typed")


def assert_same_rows(back, t):
    """Same schema (metadata aside), rows, order and values (dictionary arrays compare by value:
    a reader may split their dictionaries differently)."""
    assert back.schema.remove_metadata() == t.schema.remove_metadata()
    assert back.num_rows == t.num_rows
    for col in t.column_names:
        if pa.types.is_dictionary(t[col].type):
            assert back[col].to_pylist() == t[col].to_pylist(), col
        else:
            assert back[col].combine_chunks().equals(t[col].combine_chunks()), col


def _hostile_table(name):
    rng = np.random.default_rng(9)
    n = 30_000
    return {
        "nulls": pa.table({
            "all_null": pa.nulls(n, pa.int64()),
            "some_null": pa.array([None if v % 3 == 0 else float(v) for v in range(n)]),
            "str_null": pa.array([None if v % 5 == 0 else f"s{v % 7}" for v in range(n)]),
            "str_all_null": pa.nulls(n, pa.string()),
        }),
        "all_equal": pa.table({
            "x": pa.array(np.full(n, 42, dtype=np.int64)),
            "s": pa.array(["same"] * n),
            "f": pa.array(np.zeros(n)),
        }),
        "high_cardinality_strings": pa.table({
            "uuid": pa.array([rng.bytes(16).hex() for _ in range(n)]),
            "big": pa.array(["x" * int(k) + str(i) for i, k in enumerate(rng.integers(0, 3000, n))],
                            pa.large_string()),
            "bin": pa.array([rng.bytes(int(k)) for k in rng.integers(0, 64, n)], pa.binary()),
        }),
        "nested": pa.table({
            "id": pa.array(np.arange(n)),
            "lists": pa.array([list(range(i % 4)) if i % 11 else None for i in range(n)]),
            "strs": pa.array([[f"w{i % 13}", f"v{i}"] for i in range(n)]),
            "struct": pa.array([{"a": i, "b": f"b{i % 3}", "c": [i, i]} for i in range(n)]),
            "map": pa.array([[("k", i), (f"k{i % 2}", -i)] for i in range(n)],
                            pa.map_(pa.string(), pa.int64())),
        }),
        "empty": pa.table({"id": pa.array([], pa.int64()), "s": pa.array([], pa.string()),
                           "l": pa.array([], pa.list_(pa.float64()))}),
        "one_row": pa.table({"id": [7], "s": ["only"]}),
        "dictionary_typed": pa.table({
            "d": pa.array([f"c{i % 9}" if i % 4 else None for i in range(n)]).dictionary_encode(),
            "t": pa.array(np.arange(n).astype("datetime64[ms]")),
            "dec": pa.array([i * 3 for i in range(n)], pa.decimal128(12, 2)),
        }),
    }[name]


@pytest.mark.parametrize("name", HOSTILE_TABLES)
def test_writer_hostile_tables_read_back_equal(tmp_path, name):
    """pyarrow, duckdb and polars read what the writer wrote: same rows, same order, same values."""
    import duckdb
    import polars as pl

    t = _hostile_table(name)
    path = str(tmp_path / f"{name}.parquet")
    sizes = P.write_table(t, path, row_group_rows=1 << 12)
    assert sum(sizes) == t.num_rows
    assert_same_rows(pq.read_table(path), t)
    assert pq.ParquetFile(path).metadata.num_rows == t.num_rows
    con = duckdb.connect()
    rows = con.sql(f"SELECT * FROM read_parquet('{path}')").to_arrow_table()
    assert rows.num_rows == t.num_rows
    frame = pl.read_parquet(path)
    assert frame.height == t.num_rows
    for col in t.column_names:
        want = t[col].to_pylist()
        if not pa.types.is_map(t[col].type):  # duckdb and polars give maps as other shapes
            assert rows[col].to_pylist() == want, (name, col, "duckdb")
        if not (pa.types.is_map(t[col].type) or pa.types.is_decimal(t[col].type)
                or pa.types.is_timestamp(t[col].type)):
            assert frame[col].to_list() == want, (name, col, "polars")


def _page_bytes(path):
    """The bytes between consecutive page starts of a Parquet file."""
    data = open(path, "rb").read()
    cuts = pages.page_starts(path)
    return [data[a:b] for a, b in zip(cuts, cuts[1:])]


def test_dictionary_order_does_not_depend_on_first_appearance(tmp_path):
    """Reordering the first rows of a row group must not renumber the dictionary (sorted
    dictionaries): only the pages holding the reordered rows change."""
    rng = np.random.default_rng(4)
    labels = np.array([f"label-{i:03d}" for i in range(300)])[rng.integers(0, 300, 400_000)]
    t1 = pa.table({"label": labels, "raw": pa.array(labels.astype(object), pa.binary())})
    t2 = pa.table({"label": np.concatenate([labels[:2000][::-1], labels[2000:]]),
                   "raw": pa.array(np.concatenate([labels[:2000][::-1], labels[2000:]]).astype(object),
                                   pa.binary())})
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    for t, path in ((t1, a), (t2, b)):
        P.write_table(t, path, key_columns=[], row_group_rows=1 << 20)
        assert pq.ParquetFile(path).metadata.num_row_groups == 1
        assert_same_rows(pq.read_table(path), t)
    old = set(_page_bytes(a))
    new = [p for p in _page_bytes(b) if p not in old]
    assert len(_page_bytes(b)) > 20
    assert len(new) <= 4, len(new)  # the first data page of each column, and the footer region


# A Parquet file with a page index whose string column index is over INDEX_CUT_BYTES (pyarrow,
# 60 one-row pages, stored here so its bytes never change), and its forced cut points and chunks
# (revision 2 of the forced cut points: that index is cut out of the footer region).
GOLDEN_PARQUET_PAGE_INDEX = zlib.decompress(base64.b64decode(
    "eNrtmn9o1WUUxs+9HufU+WO67/FenTp/7Ham29z3/phTL0vNzMxsLTOJiMwtNEvXNNufIiIhIiISIhEiIRIiIiIiIkNEREQkRERE"
    "RCRERExkiIh0nklQ0BtvvH9UcL9On2d7xuvlnmeX7/nctc1rjyOKqqKq+ihppiwqI0qS/U3YP+SIEu4o6Y4GuCN2RwPdUZk7GuSO"
    "yt3RYHc0xB0NdUcV7miYOxrujka4o5HuqNIdjXJHo91RlTuK3JG4ozHuKOWO0u5orDsa546q3dF4dzTBHU10RzXuaJI7muyOprij"
    "qe6o1h1l3NEr7kjdUZ07muaOprujenfU4I4a3dEMd9TkjmJ3lHVHOXeUd0cFd9Tsjma6oxZ3NMsdzXZHc15GHVHHX3ajya4ej+vv"
    "j4jDj8iGH5ELPyIffkQh/Ijm8CNmhh/REn7ErOAj4vB2xuHtjMPbGYe3Mw5vZxzezji8nXF4O+Pwdsbh7cyGtzMb3s5seDuz4e3M"
    "hrczG97ObHg7s+HtzIa3Mxvezlx4O3Ph7cyFtzMX3s5ceDtz4e3MhbczF97OXHg7c+HtzIe3Mx/eznx4O/Ph7cyHtzMf3s58eDvz"
    "4e3Mh7czH97OQng7C+HtLIS3sxDezkJ4Owvh7SyEt7MQ3s5CeDsLXu1M/1pMBlzpp0VgXGLQYcZ/zyC+jC8yKC6D1zLILIPBMmgr"
    "g6syCCqDlTKoKIN/Mkgng2ky6CWDUzKIJIM9MigjgycyyCGDETJoIIP7MQgfg+UxqB2DzzFIHIO5Megag6MxiBmDjTEoGIN3McgW"
    "42lj0CoGl2IQKAZrYlAlBj9ikCIGE2LQHwbnYRAdBrthUBoGj2GQFwZjYdAUBjdhEJLS0/WPnq4ome4rUsBV19djPxP/zp/wnyz1"
    "pWbqy8bUl4CpL+dSX5qlvsxKfcmU+vIn9aVM6suS1JcYqS8XUl/6o76MR31JjvryGvWlMurLXtSXsKgvR1FfWqK+TER9yYf68g31"
    "pRjqyyrUl0ioL3dQX7qgvgxBfUmB+vIA9d361Xe3V98NXn33dPXdxtV351bfzVp992f13ZLVdxdW341Xffda9d1e1XdHVd9NVH33"
    "TfXdKtV3d1TfDVF990D13fbUd6dT381Nffcz9d3C1HfXUt+NSr33ptLtWen2rHR7Vro9K92elW7PSrdnpduz0u3Zf+n27P9NDp8X"
    "pTxqFiJpNUmSbDRhkp8SpmUkt6HlJN8lTYeQXIJWkGwZYDqc5CR0JMlD6CiSH9m0iuQGVEh2DTRNkZyHjiV5Dq0mOVZmOoHkHrSG"
    "5IdBppNJrkKnkmzHo8qQ9EKVpA86jeTwYNN6kjvQRpK9Q0ybSC5DsyRbh5rmSU5Bm0keQVtIDlaYzia5CS2S7B5m2kpyATqX5AV0"
    "Psnx4aYLSO5DF5LsH2G6iOQadDHJjpGmS0jOQpeSPIW2kRypNG0nuQtdRrJvlOlykivQFSTbRpt+SHIa+hHJY+jHJIeqTD8huQX9"
    "lGRPZNpBchH6GclmMV1NcgL6OckD6BckB8aYriO5Du0i2Zky7SY5B91I8gy6ifoHfDQdbcMvR8uJsTA25NPjYGzMZ6thbM4XxsPY"
    "oC9PgLFJX50IY6O+UQNjs749CcaG/ctkGJv2gykwNu7HU2Fs3k9rYWzgLzIwNvGtCmMj314HYzPfNQ3Ghv7ddBib+vf1MDb2Aw0w"
    "NvdDjTA2+CMzYGzyx5tgbPSnYhibfW8WxoZ/Pgdj07+Uh7Hx/1yAsflfb4axAtyaCWMNuNsCYxW4PwvGOvBoNoyVoG8OjLXgeRHG"
    "arClFcZ68O2rMFaEnXNhrAl75sFYFfbNh7Eu7H8NxspwcAGMteHw6zBWh2MLYawPJ9+AsUKcWQRjjTj3JoxV4uJiGOvElbdgrBTX"
    "lsBYK26+DWO1uLMUxnpx7x0YK8bDNhhrxpN3Yawaz9phrBubl8FYOba9D2Pt2LEcxuqx+wOYTWQvXW0BF0WcLhYoVbZh1erOL1dG"
    "TFGyNplKrumgqMJMYm0tLcE7P9KTrk7XZ6jaXi1ryyiNb4nsq3IobR+Z8mKq/12YVP9bVkL6h88qKyldHeE3fnuoWFeWzlCPfUvv"
    "iUR0dpDsXREdH0Y4t+LluYm1/cfea7WPzNF0sZnU+5U85b1m/+kxSW9t+veHteVMIjozWC51Rk+sB7tWSE+m3IS0pmtl91dfd25s"
    "WNXV1bCyu3v9NzWbOrs3rFm/ribb3NjUGKfr7XnCU/VegqhtXnv8GwW0ghg="))
GOLDEN_PAGE_INDEX_CUTS = [
    4, 31, 58, 85, 112, 139, 166, 193, 220, 247, 274, 301, 328, 355, 382, 409, 436, 463, 490, 517,
    544, 571, 598, 625, 652, 679, 706, 733, 760, 787, 814, 841, 868, 895, 922, 949, 976, 1003, 1030,
    1057, 1084, 1111, 1138, 1165, 1192, 1219, 1246, 1273, 1300, 1327, 1354, 1381, 1408, 1435, 1462,
    1489, 1516, 1543, 1570, 1597, 1624, 1691, 1758, 1825, 1892, 1959, 2026, 2093, 2160, 2227, 2294,
    2361, 2428, 2495, 2562, 2629, 2696, 2763, 2830, 2897, 2964, 3031, 3098, 3165, 3232, 3299, 3366,
    3433, 3500, 3567, 3634, 3701, 3768, 3835, 3902, 3969, 4036, 4103, 4170, 4237, 4304, 4371, 4438,
    4505, 4572, 4639, 4706, 4773, 4840, 4907, 4974, 5041, 5108, 5175, 5242, 5309, 5376, 5443, 5510,
    5577, 5644, 6502, 11680, 12768
]


def test_golden_parquet_large_page_index_cuts_and_chunks(tmp_path):
    """Revision 2 of the forced cut points (chunk format v1), kept for the record."""
    path = tmp_path / "golden-index.parquet"
    path.write_bytes(GOLDEN_PARQUET_PAGE_INDEX)
    cuts = pages.page_starts(str(path))
    assert cuts == GOLDEN_PAGE_INDEX_CUTS
    assert {6502, 11680} <= set(cuts)  # the column index of `k` (5,178 bytes); smaller indexes get no cuts
    chunks = iter_chunks(io.BytesIO(GOLDEN_PARQUET_PAGE_INDEX), ChunkParams(64, 256, 1024), cuts=cuts)
    ends = list(itertools.accumulate(len(c) for c in chunks))
    assert ends == [
        4, 31, 58, 85, 112, 139, 166, 193, 220, 247, 274, 301, 328, 355, 382, 409, 436, 463, 490, 517,
        544, 571, 598, 625, 652, 679, 706, 733, 760, 787, 814, 841, 868, 895, 922, 949, 976, 1003, 1030,
        1057, 1084, 1111, 1138, 1165, 1192, 1219, 1246, 1273, 1300, 1327, 1354, 1381, 1408, 1435, 1462,
        1489, 1516, 1543, 1570, 1597, 1624, 1691, 1758, 1825, 1892, 1959, 2026, 2093, 2160, 2227, 2294,
        2361, 2428, 2495, 2562, 2629, 2696, 2763, 2830, 2897, 2964, 3031, 3098, 3165, 3232, 3297, 3299,
        3366, 3433, 3500, 3567, 3634, 3701, 3768, 3835, 3902, 3969, 4036, 4103, 4170, 4237, 4304, 4371,
        4438, 4505, 4572, 4639, 4706, 4773, 4840, 4907, 4974, 5041, 5108, 5175, 5242, 5309, 5376, 5443,
        5510, 5577, 5644, 5925, 6049, 6328, 6502, 6769, 7134, 7417, 7635, 7982, 8249, 8679, 9005, 9310,
        9597, 9880, 10098, 10445, 10712, 11142, 11468, 11680, 12032, 12383, 12639, 12768, 13065, 13115
    ]


def test_misplaced_page_index_is_ignored_not_trusted():
    chunks = [(4, 100), (100, 200)]
    assert pages._index_cuts([(300, 5000)], chunks, footer_start=6000) == {300, 5000}
    for bad in ([(150, 5000)], [(300, 7000)], [(300, 5000), (50, 90)], [(5000, 300)]):
        assert pages._index_cuts(bad, chunks, footer_start=6000) == set()

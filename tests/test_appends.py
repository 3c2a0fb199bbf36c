"""Appends under page groups (issue 46, item 5; docs/parquet.md, "Appends").

Rows appended to a Parquet file change the last row group's column chunks and the footer: every
chunk before them dedups. Inside those column chunks, page groups (chunk format v2, revision 4)
store more than the pages that changed, where chunk format v1 (a chunk per page) stored only
those: the group that ends a column chunk is stored again with the unchanged pages before its
rewritten last page, and a dictionary page that gains values is stored again with the data pages
grouped with it. No rule that cuts by content can keep the first: the old version ends that group
at the column chunk's end, the new version cuts there only if the content rule says so (the
figures: docs/parquet.md). These tests pin that behaviour and the counting bench/dedup.py uses
for chunk format v1 and the what-if rules.
"""
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.core import pages

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import dedup as bench  # noqa: E402  (bench/dedup.py: chunk lists in-process)

ROWS = 120_000
GROUP_ROWS = 50_000  # 3 row groups, the last 20,000 rows: an append lands in it


def _table(n, seed, start=0):
    """Narrow typed columns as users record them (plain pyarrow gives pages of a few KiB): `tail`
    draws from values that grow with the row number, so appended rows bring new dictionary values;
    `carrier` has six values, all present from the start."""
    rng = np.random.default_rng(seed)
    rows = np.arange(start, start + n)
    return pa.table({
        "id": pa.array(rows),
        "delay": pa.array(rng.normal(10, 40, n).astype(np.int64)),
        "carrier": pa.array(np.array(["UA", "AA", "B6", "DL", "EV", "MQ"])[rng.integers(0, 6, n)]),
        "tail": pa.array([f"N{v}" for v in rows // 40 + rng.integers(0, 50, n)]),
        "distance": pa.array(rng.integers(80, 5000, n)),
    })


@pytest.fixture(scope="module")
def appended(tmp_path_factory):
    d = tmp_path_factory.mktemp("appends")
    base, edited = str(d / "v1.parquet"), str(d / "v2.parquet")
    t = _table(ROWS, 1)
    pq.write_table(t, base, row_group_size=GROUP_ROWS)
    pq.write_table(pa.concat_tables([t, _table(ROWS // 20, 2, start=ROWS)]), edited, row_group_size=GROUP_ROWS)
    return base, edited


def _last_row_group(path):
    md = pq.ParquetFile(path).metadata
    rg = md.row_group(md.num_row_groups - 1)
    spans = {}
    for c in range(rg.num_columns):
        cc = rg.column(c)
        a = cc.dictionary_page_offset if cc.has_dictionary_page and cc.dictionary_page_offset else cc.data_page_offset
        spans[cc.path_in_schema] = (a, a + cc.total_compressed_size)
    return spans


def _pages(path, a, e):
    return [c for c in pages.page_starts(path) if a <= c < e] + [e]


def test_an_append_stores_nothing_before_the_last_row_group(tmp_path, appended):
    base, edited = appended
    start = min(a for a, _ in _last_row_group(edited).values())
    assert start == min(a for a, _ in _last_row_group(base).values())  # the earlier row groups: same bytes
    s = Store.init(str(tmp_path / "store"))
    s.push([base], "cdc://r/t.parquet")
    r = s.push([edited], "cdc://r/t.parquet")
    assert s.cat("cdc://r/t.parquet") == open(edited, "rb").read()
    known = {i for *_, i in bench.chunk_list(base, "pages")}
    for off, n, i in bench.chunk_list(edited, "pages"):
        if off + n <= start:
            assert i in known, (off, n)
    assert 0 < r.new_bytes <= os.path.getsize(edited) - start


def test_counted_new_bytes_are_what_a_push_stores(tmp_path, appended):
    """bench/dedup.py counts chunk format v1 and the what-if rules in-process; for the rule a push
    uses, the count must be the push's figure."""
    base, edited = appended
    s = Store.init(str(tmp_path / "store"))
    s.push([base], "cdc://r/t.parquet")
    pushed = s.push([edited], "cdc://r/t.parquet").new_bytes
    assert bench.stored(bench.chunk_list(base, "pages"), bench.chunk_list(edited, "pages")) == pushed
    v1 = bench.stored(bench.chunk_list(base, "v1"), bench.chunk_list(edited, "v1"))
    assert v1 < pushed  # a chunk per page stores less of an append (the cost of grouping)
    parts = bench.excess(base, edited)
    assert parts["total"] == pushed
    assert parts["changed_pages"] <= v1  # what changed at page level; v1 byte-cuts only pages over 256 KiB


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(os.path.dirname(__file__), "data", "geometry"))))
def test_the_what_if_walk_of_the_shipped_rule_is_revision_4(name):
    """The prototypes of bench/dedup.py start from the shipped rule written in Python: it must cut
    where `pages.page_cuts` cuts (chunk_list raises otherwise), and so must the variants on a file
    without dictionary pages."""
    path = os.path.join(os.path.dirname(__file__), "data", "geometry", name)
    data = open(path, "rb").read()
    for rule in ("pages", "dict", "nc"):
        cuts = bench.group_cuts(data, path, bench.WHAT_IF[rule][1], rule)
        if rule == "pages":
            assert cuts == pages.page_cuts(path)
        assert all(0 < a < b for a, b in zip(cuts, cuts[1:]))
    bench.forget_lists(path)


def test_the_group_that_ends_a_column_chunk_is_stored_again_with_its_unchanged_pages(appended):
    """`carrier` keeps its dictionary; its last page was partial and is rewritten. Chunk format v1
    stores the pages from that one on; page groups also store the unchanged pages grouped before
    it, since the old version ended that group at the column chunk's end and the new one does not
    cut there."""
    base, edited = appended
    a, e = _last_row_group(base)["carrier"]
    a2, e2 = _last_row_group(edited)["carrier"]  # (it moves: the column chunks before it grew)
    old, new = open(base, "rb").read(), open(edited, "rb").read()
    last = _pages(base, a, e)[-2] - a  # the old last page, from the column chunk's start
    assert e2 - a2 > e - a and old[a:a + last] == new[a2:a2 + last] and old[a + last:e] != new[a2 + last:e2]
    known = {i for *_, i in bench.chunk_list(base, "pages")}
    group = next(c for c in bench.chunk_list(edited, "pages") if c[0] <= a2 + last < c[0] + c[1])
    assert group[2] not in known and group[0] < a2 + last  # stored again from before the changed page
    known_v1 = {i for *_, i in bench.chunk_list(base, "v1")}
    assert all(i in known_v1 for off, n, i in bench.chunk_list(edited, "v1") if a2 <= off and off + n <= a2 + last)


def test_a_dictionary_that_gains_values_is_stored_again_with_the_pages_grouped_with_it(appended):
    """`tail` gains values: its dictionary page changes. Page groups store the group holding it -
    dictionary and the unchanged data pages after it - where chunk format v1 stored the
    dictionary page alone."""
    base, edited = appended
    a, e = _last_row_group(base)["tail"]
    a2, e2 = _last_row_group(edited)["tail"]
    dict_end, dict_end2 = _pages(base, a, e)[1], _pages(edited, a2, e2)[1]
    old, new = open(base, "rb").read(), open(edited, "rb").read()
    assert old[a:dict_end] != new[a2:dict_end2]
    second = _pages(base, a, e)[2]  # the first data page is unchanged (the rows before the append)
    assert old[dict_end:second] == new[dict_end2:dict_end2 + second - dict_end]
    known = {i for *_, i in bench.chunk_list(base, "pages")}
    group = next(c for c in bench.chunk_list(edited, "pages") if c[0] == a2)
    assert group[2] not in known and group[1] > dict_end2 - a2  # the dictionary and data pages with it
    known_v1 = {i for *_, i in bench.chunk_list(base, "v1")}
    first_data = next(c for c in bench.chunk_list(edited, "v1") if c[0] == dict_end2)
    assert first_data[2] in known_v1
    # the prototype "dict" makes the dictionary page a chunk of its own: the data pages dedup
    dict_rule = {i for *_, i in bench.chunk_list(base, "dict")}
    after = next(c for c in bench.chunk_list(edited, "dict") if c[0] == dict_end2)
    assert after[2] in dict_rule

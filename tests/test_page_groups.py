"""Chunk format v2 for Parquet: page groups (docs/format.md, forced cut points revision 4).

The golden files in tests/data/geometry were written once by pyarrow (plain defaults: narrow typed
columns with dictionaries and 20,000-row pages; wide strings; dictionary pages in four row groups;
one page larger than the maximum chunk, with a page index) and by `cdcstore.parquet.write_table`;
their cut points and chunk ends are the contract. `tests/reference_chunker.py` is the rule written
from the text, in Python; the native walk and the streaming chunker must agree with it.
"""
import hashlib
import io
import itertools
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore import parquet as P
from cdcstore.core import pages
from cdcstore.core.chunker import DEFAULT_PARAMS, ChunkParams, Chunker, iter_chunks
from cdcstore.core.manifest import max_chunks
from cdcstore.engine.ingest import IngestOptions

from reference_chunker import page_group_chunk_ends, page_group_cuts

GEOMETRY = os.path.join(os.path.dirname(__file__), "data", "geometry")
SMALL = ChunkParams(2048, 8192, 32768)

# name -> (cuts with the default sizes, cuts with SMALL)
GOLDEN = {
    "dictionary.parquet": (
        [4, 27940, 33102, 60978, 66136, 94046, 99208, 127061, 132222, 133430],
        [4, 12863, 27940, 33102, 45901, 60978, 66136, 78969, 94046, 99208, 111984, 127061, 132222, 133430]),
    "huge-page.parquet": ([4, 300623, 306291, 310865], [4, 300623, 302202, 306291, 310865]),
    "narrow-cdcstore.parquet": (
        [4, 447, 66052, 155137, 173745, 204136, 271087, 284376, 286662],
        [4, 447, 22591, 31241, 48814, 66052, 96389, 119303, 155137, 173745, 183930, 192823, 202905, 204136,
         226477, 247511, 271087, 283428, 284376, 286662]),
    "narrow-plain.parquet": (
        [4, 612, 69689, 89386, 187258, 217627, 297057, 298462],
        [4, 612, 24441, 47065, 69689, 89386, 122010, 154634, 187258, 197445, 207536, 217627, 245681, 271377,
         297057, 298462]),
    "strings.parquet": ([4, 6898, 113065, 218582, 317507, 318307],
                        [4, 6898, 60888, 113065, 166150, 218582, 270828, 317507, 318307]),
}


#: sha256 over the BLAKE3 ids of every golden file's chunks (default sizes), files in name order
GOLDEN_IDS = "589a6d3942faa99927d645ca2d9762579c76d1c6126d072aa3abebc2c7828ca0"


def _layout(path):
    with open(path, "rb") as f:
        return pages.footer_layout(f, os.path.getsize(path))


def _stream_ends(path, params, block_size=8 << 20):
    cuts = pages.page_cuts(path, params)
    with open(path, "rb") as f:
        chunks = iter_chunks(f, params, block_size, cuts=cuts, whole_segments=True)
        return list(itertools.accumulate(len(c) for c in chunks))


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_page_groups_cuts_and_chunks(name):
    path = os.path.join(GEOMETRY, name)
    default_cuts, small_cuts = GOLDEN[name]
    assert pages.page_cuts(path) == default_cuts
    assert pages.page_cuts(path, SMALL) == small_cuts
    data = open(path, "rb").read()
    for params, cuts in ((DEFAULT_PARAMS, default_cuts), (SMALL, small_cuts)):
        ends = page_group_chunk_ends(data, cuts[:-1], params.min_size, params.avg_size, params.max_size)
        assert _stream_ends(path, params) == ends
        assert _stream_ends(path, params, block_size=4096) == ends  # fed in small pieces: the same chunks


def test_golden_page_groups_chunk_ids():
    """The ids of every golden file's chunks, default sizes: a change here is a format change."""
    from cdcstore.core import ids
    h = hashlib.sha256()
    for name in sorted(GOLDEN):
        path = os.path.join(GEOMETRY, name)
        with open(path, "rb") as f:
            for c in iter_chunks(f, cuts=pages.page_cuts(path), whole_segments=True):
                h.update(ids.digest(c))
    assert h.hexdigest() == GOLDEN_IDS


@pytest.mark.parametrize("name", sorted(GOLDEN))
@pytest.mark.parametrize("params", [DEFAULT_PARAMS, SMALL, ChunkParams(64, 256, 1024), ChunkParams(1, 1, 1)],
                         ids=["default", "small", "tiny", "every-page"])
def test_native_walk_and_choice_match_the_reference(name, params):
    path = os.path.join(GEOMETRY, name)
    data = open(path, "rb").read()
    ranges, hard = _layout(path)
    ref = page_group_cuts(data, ranges, hard, params.min_size, params.avg_size, params.max_size)
    assert pages.page_cuts(path, params) == pages.thin_cuts(ref, len(data)) + [len(data)]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_with_max_of_one_byte_every_page_start_is_a_cut(name):
    """The native walk finds exactly the page starts the Python reference walk finds."""
    path = os.path.join(GEOMETRY, name)
    starts = pages.page_starts(path)
    assert pages.page_cuts(path, ChunkParams(1, 1, 1))[:-1] == starts


def test_golden_parquet_of_revision_1_and_2_under_page_groups(tmp_path):
    from test_parquet import GOLDEN_PARQUET, GOLDEN_PARQUET_PAGE_INDEX
    for blob in (GOLDEN_PARQUET, GOLDEN_PARQUET_PAGE_INDEX):
        path = tmp_path / "g.parquet"
        path.write_bytes(blob)
        ranges, hard = _layout(str(path))
        for p in (ChunkParams(64, 256, 1024), ChunkParams(256, 1024, 4096)):
            ref = page_group_cuts(blob, ranges, hard, p.min_size, p.avg_size, p.max_size)
            assert pages.page_cuts(str(path), p) == ref + [len(blob)]


def _flights_like(n, seed=0):
    rng = np.random.default_rng(seed)
    return pa.table({
        "year": pa.array(np.full(n, 2013)),
        "month": pa.array(np.sort(rng.integers(1, 13, n))),
        "day": pa.array(rng.integers(1, 29, n)),
        "dep_time": pa.array(rng.integers(500, 2400, n)),
        "dep_delay": pa.array(rng.normal(10, 40, n).astype(np.int64)),
        "carrier": pa.array(np.array(["UA", "AA", "B6", "DL", "EV", "MQ"])[rng.integers(0, 6, n)]),
        "tailnum": pa.array([f"N{v}" for v in rng.integers(100, 99999, n)]),
        "distance": pa.array(rng.integers(80, 5000, n)),
    })


@pytest.mark.parametrize("writer", ["plain", "cdcstore"])
def test_real_shaped_parquet_gets_chunks_near_the_target(tmp_path, writer):
    """Narrow typed columns written by plain pyarrow (a page every 20,000 rows) made chunks of
    10-17 KiB under revision 3; page groups average near the 64 KiB target."""
    path = str(tmp_path / "t.parquet")
    t = _flights_like(600_000)
    (pq.write_table if writer == "plain" else P.write_table)(t, path)
    size = os.path.getsize(path)
    n_old = len(pages.page_starts(path)) + 1
    s = Store.init(str(tmp_path / "store"))
    r = s.push([path], "cdc://r/t.parquet")
    assert [d["chunking"] for d in r.files_detail.values()] == ["parquet-pages"]
    assert s.cat("cdc://r/t.parquet") == open(path, "rb").read()
    per_100mb = r.chunks * 100e6 / size
    assert per_100mb <= 2000, (per_100mb, r.chunks, size)
    assert r.chunks * 3 < n_old, (r.chunks, n_old)


def test_an_edit_stores_about_a_group_per_column_and_less_than_byte_cdc(tmp_path):
    """Deleting rows mid-file from our writer's file stores about a group per column, not the
    rest of the row group (the groups resynchronise after the edit), and less than byte CDC
    of the same files (writer version 3: chunk format v1's page cuts store 6% here, page groups
    17%, byte CDC 32%)."""
    t = _flights_like(400_000, seed=3)
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    P.write_table(t, a)
    P.write_table(pa.concat_tables([t.slice(0, 200_000), t.slice(201_000)]), b)
    s = Store.init(str(tmp_path / "store"))
    s.push([a], "cdc://r/t.parquet")
    r = s.push([b], "cdc://r/t.parquet")
    assert s.cat("cdc://r/t.parquet") == open(b, "rb").read()
    assert r.new_bytes < 0.22 * os.path.getsize(b), r.new_bytes / os.path.getsize(b)
    bytes_store = Store.init(str(tmp_path / "bytes"))
    opts = IngestOptions(parquet_pages=False)
    bytes_store.push([a], "cdc://r/t.parquet", options=opts)
    assert r.new_bytes < bytes_store.push([b], "cdc://r/t.parquet", options=opts).new_bytes


def _rewrite_page_size(data: bytes, at: int, new_size: int) -> bytes:
    """The file with the compressed_page_size (field 3) of the page header at `at` replaced by
    `new_size`, varint width kept (header bytes after it unchanged)."""
    from cdcstore.core.thrift import Decoder
    d = Decoder(data, at)
    head = d.byte()  # field 1: type
    assert head & 0x0F == 5
    d.zigzag()
    d.byte()  # field 2: uncompressed size
    d.zigzag()
    head = d.byte()
    assert head >> 4 == 1 and head & 0x0F == 5  # field 3: compressed size, i32
    start = d.pos
    d.zigzag()
    width = d.pos - start
    z = (new_size << 1) if new_size >= 0 else ((-new_size << 1) - 1)
    out = []
    for i in range(width):
        b = (z >> (7 * i)) & 0x7F
        out.append(b | (0x80 if i + 1 < width else 0))
    if z >> (7 * width):
        raise ValueError("does not fit")
    return data[:start] + bytes(out) + data[start + width:]


@pytest.mark.parametrize("lie", [-5, 1, 1_000_000])
def test_a_lying_page_header_falls_back_to_bytes(tmp_path, lie):
    """A page size that is negative, too small or past the column chunk (or the file) never
    makes the walk read past the file or allocate by the claimed size: the file is bytes."""
    src = os.path.join(GEOMETRY, "narrow-plain.parquet")
    data = open(src, "rb").read()
    for at in pages.page_starts(src)[1:]:  # a page whose size takes 3 bytes: room for every lie
        try:
            bad = _rewrite_page_size(data, at, lie)  # 1,000,000: past the column chunk and the file
            break
        except (AssertionError, ValueError):
            continue
    else:
        raise AssertionError("no page header to rewrite in the golden file")
    path = tmp_path / "bad.parquet"
    path.write_bytes(bad)
    assert pages.page_cuts(str(path)) is None
    s = Store.init(str(tmp_path / "store"))
    r = s.push([str(path)], "cdc://r/bad.parquet")
    assert r.files_detail["bad.parquet"]["chunking"] == "bytes"
    assert s.cat("cdc://r/bad.parquet") == bad


def test_a_footer_that_lies_about_column_chunks_falls_back_to_bytes(tmp_path):
    """Column chunks that overlap, or pass the footer, are not walked."""
    src = os.path.join(GEOMETRY, "dictionary.parquet")
    data = open(src, "rb").read()
    ranges, hard = _layout(src)
    import cdcstore.core._gear as g
    with open(src, "rb") as f:
        fd = f.fileno()
        pack = lambda rs: b"".join(struct.pack("<QQ", a, b) for a, b in rs)
        hard_b = b"".join(struct.pack("<Q", c) for c in hard)
        assert g.page_groups(fd, len(data), pack(ranges), hard_b, 64, 256, 1024) is not None
        overlapping = sorted(ranges + [(ranges[0][0] + 1, ranges[1][1])])
        assert g.page_groups(fd, len(data), pack(overlapping), hard_b, 64, 256, 1024) is None
        past_end = ranges[:-1] + [(ranges[-1][0], len(data) + 10)]
        assert g.page_groups(fd, len(data), pack(past_end), hard_b, 64, 256, 1024) is None
        shifted = [(a + 3, b) for a, b in ranges]  # starts that are not page headers
        assert g.page_groups(fd, len(data), pack(shifted), hard_b, 64, 256, 1024) is None


def test_a_file_that_is_not_a_file_of_the_os_is_chunked_as_bytes():
    data = open(os.path.join(GEOMETRY, "strings.parquet"), "rb").read()
    assert pages.page_cuts_of(io.BytesIO(data), len(data)) is None


def test_tiny_pages_give_chunks_near_the_target_and_within_the_bound(tmp_path):
    """A file of one-row pages (revision 3 thinned its million cuts) is grouped like any other."""
    n = 40_000
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": pa.array(np.arange(n)), "y": pa.array(np.arange(n) * 3)}), path,
                   data_page_size=1, write_batch_size=1, compression="none", use_dictionary=False,
                   write_statistics=False)
    size = path.stat().st_size
    ranges, _ = _layout(str(path))
    data = path.read_bytes()
    n_pages = 0
    for a, e in ranges:
        while a < e:
            hlen, _, body = pages.read_page_header(data, a)
            a += hlen + body
            n_pages += 1
    assert n_pages >= 2 * n
    cuts = pages.page_cuts(str(path))
    assert cuts is not None and len(cuts) <= size // DEFAULT_PARAMS.min_size + 4
    ends = _stream_ends(str(path), DEFAULT_PARAMS)
    assert len(ends) <= max_chunks(size)
    lengths = [b - a for a, b in zip([0] + ends, ends)]
    assert sum(lengths) / len(lengths) > 48 * 1024
    assert sum(n < DEFAULT_PARAMS.min_size for n in lengths) <= len(ranges) + 3  # column chunks' tails


def test_whole_segments_wait_for_the_whole_segment():
    """A segment of at most max bytes is one chunk even when it arrives in pieces, and a file
    shorter than its cuts promised is still cut to the end."""
    data = os.urandom(300_000)
    p = ChunkParams(1024, 4096, 16384)
    cuts = [10_000, 20_000, 200_000, 300_000]
    ch = Chunker(p, cuts, whole_segments=True)
    out = []
    for i in range(0, len(data), 777):
        out += ch.feed(data[i:i + 777])
    out += ch.finish()
    ends = list(itertools.accumulate(len(c) for c in out))
    assert ends[:2] == [10_000, 20_000] and 200_000 in ends and ends[-1] == 300_000
    assert b"".join(out) == data
    ch = Chunker(p, [10_000, 20_000, 400_000], whole_segments=True)  # the file ended early
    out = ch.feed(data[:15_000]) + ch.finish()
    assert b"".join(out) == data[:15_000] and len(out[0]) == 10_000


CHUNK_V1_STORE = os.path.join(os.path.dirname(__file__), "data", "chunkv1-parquet-store")


def test_a_store_written_with_chunk_format_v1_reads_takes_pushes_and_dedups_what_it_can(tmp_path):
    """tests/data/chunkv1-parquet-store was written by the chunk-format-v1 code (c712819: a chunk
    per page) from two golden files. It reads back; a v2 push of the same files stores the small
    pages again, grouped, and dedups the page larger than max_size and the footers; a second v2
    push stores nothing."""
    import shutil
    root = tmp_path / "store"
    shutil.copytree(CHUNK_V1_STORE, root)
    src = tmp_path / "src"
    src.mkdir()
    names = ("huge-page.parquet", "narrow-plain.parquet")
    for n in names:
        shutil.copy(os.path.join(GEOMETRY, n), src / n)
    with Store(str(root)) as s:
        for n in names:
            assert s.cat(f"cdc://geo/{n}") == (src / n).read_bytes()
        assert s.check(read_data=True)["problems"] == []
        r = s.push([str(src)], "cdc://geo/", message="v2 push")
        detail = r.files_detail
        assert all(d["chunking"] == "parquet-pages" for d in detail.values())
        big = detail["huge-page.parquet"]
        assert big["new_bytes"] < 0.1 * big["bytes"], big  # its 300 KB page is cut as before
        assert detail["narrow-plain.parquet"]["new_bytes"] > 0.5 * detail["narrow-plain.parquet"]["bytes"]
        assert s.push([str(src)], "cdc://geo2/").new_bytes == 0
        log = s.log("geo")
        assert [c["message"] for c in log] == ["v2 push", "written by chunk format v1 (c712819)"]
        for n in names:  # both versions: v1 chunks and v2 chunks of the same bytes
            assert s.cat(f"cdc://geo/{n}") == (src / n).read_bytes()
            assert s.cat(f"cdc://geo@{log[1]['commit']}/{n}") == (src / n).read_bytes()
        assert s.check(read_data=True)["problems"] == []


@pytest.mark.parametrize("header", [
    bytes([0x1B]) + b"\xff" * 9 + b"\x01" + bytes([0x11]),  # field 1: a map of 2^64-ish bool -> bool entries
    bytes([0x19]) + bytes([0xF1]) + b"\xff" * 9 + b"\x01",  # field 1: a list of as many bools
    bytes([0x1C]) * 40,  # structs nested 40 deep
])
def test_a_page_header_of_huge_containers_is_refused_at_once(tmp_path, header):
    """Containers that claim more elements than the bytes left (bools take no bytes as a field,
    one as an element) or nest past 32 levels: the walk stops at once, the file is bytes."""
    import time
    src = os.path.join(GEOMETRY, "narrow-plain.parquet")
    data = bytearray(open(src, "rb").read())
    at = pages.page_starts(src)[2]
    data[at:at + len(header)] = header
    path = tmp_path / "bad.parquet"
    path.write_bytes(bytes(data))
    t0 = time.monotonic()
    assert pages.page_cuts(str(path)) is None
    assert time.monotonic() - t0 < 10  # a walk of the claimed elements would take hours


PARQUET_KILLED_WORKER = """
import os, random, sys
import pyarrow as pa, pyarrow.parquet as pq
from cdcstore import Store
root, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
s = Store(root)
for i in range(1000):
    d = os.path.join(root + "-data", f"{seed}-{i}")
    os.makedirs(d, exist_ok=True)
    n = rng.randint(100_000, 300_000)
    t = pa.table({"k": pa.array([rng.randint(0, 50) for _ in range(2000)] * (n // 2000)),
                  "v": pa.array(range(seed * 10**9 + i * 10**6, seed * 10**9 + i * 10**6 + n // 2000 * 2000))})
    path = os.path.join(d, "t.parquet")
    pq.write_table(t, path)  # plain pyarrow: a page every 20,000 rows, grouped by the push
    r = s.push([path], f"cdc://ds/{seed}/{i}/t.parquet")
    assert [d["chunking"] for d in r.files_detail.values()] == ["parquet-pages"]
    with open(path, "rb") as f:
        print(r.commit, f"{seed}/{i}/t.parquet", f.read().hex()[-64:], flush=True)  # acknowledged
"""


def test_sigkill_mid_push_of_parquet_loses_nothing_acknowledged(tmp_path):
    """Workers pushing Parquet (page groups) are SIGKILLed at random moments: every push they
    acknowledged reads back, `check --read-data` finds no problem, and the next push works."""
    import random
    import signal
    import time

    from forker import Forker
    from cdcstore.storage.repository import LocalStore

    root = str(tmp_path / "store")
    LocalStore.init(root)
    rng = random.Random(29)
    acked, kills = [], 0
    with Forker(tmp_path, preload=("cdcstore", "pyarrow.parquet")) as fk:
        for seed in range(12):
            p = fk.run([root, str(seed)], code=PARQUET_KILLED_WORKER)
            if seed % 3 == 0:  # some workers acknowledge a push first: on a loaded machine one may take seconds
                end = time.monotonic() + 120
                while not p.stdout().strip() and not p.exited() and time.monotonic() < end:
                    time.sleep(0.05)
            time.sleep(0.2 + rng.random() * 0.6)
            p.send_signal(signal.SIGKILL)
            kills += p.wait() == -signal.SIGKILL
            acked += [line.split() for line in p.stdout().splitlines() if line.strip()]
    assert kills >= 10 and acked
    with Store(root) as s:
        assert s.check(read_data=True)["problems"] == []
        for commit, path, tail in acked:
            assert s.cat(f"cdc://ds@{commit}/{path}")[-32:].hex() == tail
        src = tmp_path / "again.parquet"
        pq.write_table(pa.table({"x": pa.array(range(100_000))}), src)
        assert s.push([str(src)], "cdc://ds/again.parquet").new_bytes > 0
        assert s.cat("cdc://ds/again.parquet") == src.read_bytes()


@pytest.mark.parametrize("edit", ["delete 1%", "append a fifth"])
def test_a_small_file_of_our_writer_stores_about_its_edit(tmp_path, edit):
    """Files of a few MB (a month or a quarter of flights) were one or two row groups of our writer's
    32 MiB target: every column chunk a page or two, so deleting 1% of the rows stored 68-98% of the
    file and an append 56-100%. Writer version 4 gives a small table about 8 row groups (its rows / 8
    as a power of two): the delete stores about a row group and the footer, an append that keeps the
    table in the same power of two about the new rows (docs/parquet.md says where it does not hold)."""
    t = _flights_like(60_000, seed=3)
    path = str(tmp_path / "f.parquet")
    P.write_table(t, path)
    assert pq.ParquetFile(path).num_row_groups >= 5
    s = Store.init(str(tmp_path / "store"))
    s.push([path], "cdc://r/f.parquet")
    n = t.num_rows
    if edit == "delete 1%":
        new_table, limit = pa.concat_tables([t.slice(0, n // 2), t.slice(n // 2 + n // 100)]), 0.35
    else:
        new_table, limit = pa.concat_tables([t, _flights_like(n // 4, seed=4)]), 0.2 + 0.15
    P.write_table(new_table, path)
    size = os.path.getsize(path)
    r = s.push([path], "cdc://r/f.parquet")
    print(f"{edit}: {r.new_bytes} new of {size} ({r.new_bytes / size:.0%})")
    assert r.new_bytes / size < limit, (r.new_bytes, size)
    assert s.cat("cdc://r/f.parquet") == open(path, "rb").read()

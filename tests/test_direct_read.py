"""Large reads land straight in their result (storage/reader.py `_pread_direct`): the bytes
stay exact with duplicate chunks, compressed chunks, partial first and last chunks,
cached and uncached chunks mixed, and a damaged chunk is still an error."""
import os
import sqlite3

import pytest

from cdcstore import CorruptionError, Store
from cdcstore.core.chunker import ChunkParams
from cdcstore.core.pack import CODEC_RAW, CODEC_ZSTD, PackEntry
from cdcstore.core.ranges import ByteRange, scatter
from cdcstore.engine.ingest import IngestOptions
from cdcstore.storage.cache import ChunkCache
from conftest import golden_input

BLOCK = golden_input(1_200_000)
DATA = BLOCK + b"z" * 400_000 + BLOCK + golden_input(900_001)[::-1]  # repeats and compressible runs


@pytest.fixture
def pushed(server, tmp_path):
    (tmp_path / "f.bin").write_bytes(DATA)
    with Store(server.url, cache=False) as s:
        v = s.push([str(tmp_path / "f.bin")], "cdc://d/f.bin",
                   options=IngestOptions(params=ChunkParams(16384, 65536, 262144)))
    return f"cdc://d@{v.commit}/f.bin"


def _check_reads(s: Store, addr: str) -> None:
    with s.open(addr) as f:
        assert f.read() == DATA
        for off, n in [(0, len(DATA)), (12_345, 2_000_000), (1_199_999, 1_300_000), (len(DATA) - 1_048_577, 5 << 20)]:
            got = f.pread(off, n)
            assert type(got) is bytes and got == DATA[off:off + n]
        f.seek(3_000_000)
        assert f.read(10) == DATA[3_000_000:3_000_010]  # a small read fills the reader's LRU
        f.seek(2_000_000)
        assert f.read(1_500_000) == DATA[2_000_000:3_500_000]


def test_direct_reads_are_exact_without_cache(server, pushed):
    with Store(server.url, cache=False) as s:
        _check_reads(s, pushed)


def test_direct_reads_are_exact_cold_warm_and_mixed(server, pushed, tmp_path):
    with Store(server.url, cache=str(tmp_path / "c.sqlite")) as s:
        with s.open(pushed) as f:
            assert f.pread(1_300_000, 1_000_000) == DATA[1_300_000:2_300_000]  # some chunks cached
        s.cache.wait()
        _check_reads(s, pushed)  # cached and fetched chunks in one result
        s.cache.wait()
        before = s.counters()["requests"]
        assert s.cat(pushed) == DATA
        assert s.counters()["requests"] == before  # warm: all from the cache


def test_a_damaged_chunk_in_a_landed_range_is_an_error(server, pushed, tmp_path):
    packs = [os.path.join(d, n) for d, _, ns in os.walk(tmp_path / "srv") for n in ns if n.endswith(".pack")]
    assert packs
    for p in packs:  # flip a byte well inside every pack's data
        with open(p, "r+b") as f:
            f.seek(500_000)
            b = f.read(1)
            f.seek(500_000)
            f.write(bytes([b[0] ^ 0xFF]))
    with Store(server.url, cache=str(tmp_path / "c.sqlite")) as s:
        with pytest.raises(CorruptionError, match="does not match"):
            s.cat(pushed)
        s.cache.wait()
    with sqlite3.connect(tmp_path / "c.sqlite") as c:
        ids = [r[0] for r in c.execute("SELECT id FROM chunks")]
    assert len(ChunkCache(str(tmp_path / "c.sqlite")).get(ids)) == len(ids)  # no damaged chunk cached


def test_scatter_lands_raw_chunks_wanted_whole_and_spares_the_rest():
    a = PackEntry(b"a" * 16, 100, 10, 10, CODEC_RAW)
    b = PackEntry(b"b" * 16, 110, 5, 5, CODEC_RAW)
    r = ByteRange("p", 100, 115, (a, b))
    # back to back in the pack and in the output: one segment (a second place is copied later)
    assert scatter(r, {a.chunk_id: [(40, 0, 10)], b.chunk_id: [(50, 0, 5), (0, 0, 5)]}) == ([(True, 40, 15)], 0)
    # not adjacent in the output: two segments, both landed
    assert scatter(r, {a.chunk_id: [(40, 0, 10)], b.chunk_id: [(51, 0, 5)]}) == ([(True, 40, 10), (True, 51, 5)], 0)
    # a chunk wanted in part goes to the spare buffer
    assert scatter(r, {a.chunk_id: [(40, 2, 10)], b.chunk_id: [(48, 0, 5)]}) == ([(False, 0, 10), (True, 48, 5)], 10)
    z = PackEntry(b"z" * 16, 110, 5, 9, CODEC_ZSTD)  # compressed: spare
    assert scatter(ByteRange("p", 100, 115, (a, z)), {a.chunk_id: [(0, 0, 10)], z.chunk_id: [(10, 0, 9)]}) == \
        ([(True, 0, 10), (False, 0, 5)], 5)
    gap = PackEntry(b"g" * 16, 112, 3, 3, CODEC_RAW)  # a hole of 2 bytes before it: spare, never used
    assert scatter(ByteRange("p", 100, 115, (a, gap)), {a.chunk_id: [(0, 0, 10)], gap.chunk_id: [(10, 0, 3)]}) == \
        ([(True, 0, 10), (False, 0, 2), (True, 10, 3)], 2)
    c = PackEntry(b"c" * 16, 115, 4, 8, CODEC_ZSTD)  # two spared pieces in a row merge
    assert scatter(ByteRange("p", 100, 119, (a, z, c)),
                   {a.chunk_id: [(0, 0, 10)], z.chunk_id: [(10, 0, 9)], c.chunk_id: [(19, 0, 8)]}) == \
        ([(True, 0, 10), (False, 0, 9)], 9)

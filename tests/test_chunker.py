import io
import json
import os

import pytest
import xxhash
from hypothesis import given, settings, strategies as st

from cdcstore.core import _gear
from cdcstore.core.chunker import DEFAULT_PARAMS, ChunkParams, Chunker, chunk_ends, iter_chunks, scan, split_point
from conftest import golden_input
from reference_chunker import GEAR, chunk_lengths

params_strategy = st.tuples(st.integers(1, 200), st.integers(0, 300), st.integers(0, 600)).map(
    lambda t: ChunkParams(t[0], t[0] + t[1], t[0] + t[1] + t[2]))


def ends_of(lengths):
    out, total = [], 0
    for n in lengths:
        total += n
        out.append(total)
    return out


def test_gear_table_matches_reference():
    assert _gear.gear_table() == tuple(GEAR)
    assert len(set(GEAR)) == 256


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=6000), p=params_strategy)
def test_native_scan_agrees_with_reference(data, p):
    assert chunk_ends(data, p) == ends_of(chunk_lengths(data, p.min_size, p.avg_size, p.max_size))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(0, 40000))
def test_reference_agreement_on_random_bytes(seed, n):
    data = golden_input(n + seed % 977)[seed % 977:]
    p = ChunkParams(256, 1024, 4096)
    assert chunk_ends(data, p) == ends_of(chunk_lengths(data, p.min_size, p.avg_size, p.max_size))


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, 20000), max_size=12), p=params_strategy)
def test_streaming_equals_whole(cuts, p):
    data = golden_input(20000)
    whole = chunk_ends(data, p)
    chunker = Chunker(p)
    pieces = []
    prev = 0
    for c in sorted(cuts) + [len(data)]:
        pieces.extend(chunker.feed(data[prev:c]))
        prev = c
    pieces.extend(chunker.finish())
    assert b"".join(pieces) == data
    assert ends_of(map(len, pieces)) == whole


def test_streaming_with_default_params_and_odd_blocks():
    data = golden_input(3 * 1024 * 1024 + 12345)
    whole = chunk_ends(data)
    for block in (1, 4095, 65536, 1 << 20):
        if block == 1:
            stream_data = data[: 600 * 1024]  # byte-at-a-time is slow; a prefix suffices
            expect = chunk_ends(stream_data)
            chunker = Chunker()
            got = [c for b in range(len(stream_data)) for c in chunker.feed(stream_data[b:b + 1])]
            got += chunker.finish()
            assert ends_of(map(len, got)) == expect
            continue
        got = list(iter_chunks(io.BytesIO(data), block_size=block))
        assert ends_of(map(len, got)) == whole


def test_chunk_sizes_respect_bounds():
    data = os.urandom(8 * 1024 * 1024)
    ends = chunk_ends(data)
    sizes = [b - a for a, b in zip([0] + ends, ends)]
    assert all(DEFAULT_PARAMS.min_size <= s <= DEFAULT_PARAMS.max_size for s in sizes[:-1])
    mean = sum(sizes) / len(sizes)
    assert 40 * 1024 < mean < 110 * 1024, mean


# Golden vectors: these boundaries ARE the chunk format (v1). Changing them is a format change.
def test_golden_default_params():
    data = golden_input(1 << 20)
    assert chunk_ends(data) == [74473, 206500, 299260, 372696, 446652, 513575, 585991, 703798, 769993,
                                845768, 914181, 979831, 1045425, 1048576]


def test_golden_chunk_ids():
    """The ids of the golden chunks: BLAKE3-256 (format v2, what is written) and xxh3-128 (format
    v1, what the reader still checks old data against)."""
    from cdcstore.core import ids
    data = golden_input(1 << 20)
    ends = chunk_ends(data)
    chunks = [data[a:b] for a, b in zip([0] + ends, ends)]
    assert ids.digest(chunks[0]).hex() == "d29518d1d239fc5325be69eac1c95b4a173f02ccaa3f543fa57599baf9a6f57f"
    assert ids.hexdigest(b"".join(map(ids.digest, chunks))) == \
        "0e94a139bd5efd014edd3d22a5cc14b6bafd51e83272bfc38ba0a36a839ed33a"
    assert ids.legacy_digest(chunks[0]).hex() == "16eee56c6169c9e328f9f3387f8ff0f1"  # v1
    assert ids.legacy_hexdigest(b"".join(map(ids.legacy_digest, chunks))) == "e8eb0dd57bb018791e646bfb861e644f"


def test_golden_small_params():
    ends = chunk_ends(golden_input(1 << 16), ChunkParams(64, 256, 1024))
    assert len(ends) == 221
    assert ends[:8] == [348, 611, 938, 1273, 1556, 1933, 2196, 2456]
    assert xxhash.xxh3_64_hexdigest(json.dumps(ends).encode()) == "e672ee0ceab1e7e2"


def test_golden_periodic_input_cuts_at_max():
    assert chunk_ends(bytes(range(256)) * 4096) == [262144, 524288, 786432, 1048576]


def test_boundaries_resync_after_an_insert():
    data = golden_input(4 * 1024 * 1024)
    edited = data[:1_000_000] + b"inserted bytes" + data[1_000_000:]
    a = set(c for c in (bytes(x) for x in iter_chunks(io.BytesIO(data))))
    b = [bytes(x) for x in iter_chunks(io.BytesIO(edited))]
    new = sum(len(c) for c in b if c not in a)
    assert new < 3 * DEFAULT_PARAMS.max_size


def test_bad_params_are_rejected():
    with pytest.raises(ValueError, match="min <= avg <= max"):
        ChunkParams(100, 50, 200)
    with pytest.raises(ValueError):
        _gear.scan(b"abc", 10, 5, 20, True)


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(-5, 20050), max_size=30), block=st.sampled_from([1, 7, 100, 5000, 70000]))
def test_forced_cuts_chunk_each_segment_independently(cuts, block):
    data = golden_input(20000)
    p = ChunkParams(64, 256, 1024)
    bounds = sorted({0, len(data), *(c for c in cuts if 0 < c < len(data))})
    expect = [a + e for a, b in zip(bounds, bounds[1:]) for e in chunk_ends(data[a:b], p)]
    got = list(iter_chunks(io.BytesIO(data), p, block_size=block, cuts=cuts))
    assert b"".join(got) == data
    assert ends_of(map(len, got)) == expect


def _pattern(kind: str, n: int, seed: int) -> bytes:
    """Inputs that resynchronise easily (random) and hardly or never (zeros, a short period)."""
    if kind == "random":
        return golden_input(n + seed % 977)[seed % 977:]
    if kind == "zeros":
        return bytes(n)
    if kind == "period":
        unit = golden_input(1 + seed % 300)
        return (unit * (n // len(unit) + 1))[:n]
    half = n // 2  # random, then zeros: the tail of the file never cuts where a mid-file scan does
    return golden_input(half) + bytes(n - half)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["random", "zeros", "period", "mixed"]), n=st.integers(0, 30000),
       seed=st.integers(0, 2**32), split=st.floats(0, 1), p=params_strategy, eof=st.booleans())
def test_parallel_halves_cut_exactly_like_one_scan(kind, n, seed, split, p, eof):
    data = _pattern(kind, n, seed)
    one = scan(data, p, eof, split=0)
    assert scan(data, p, eof, split=int(split * n)) == one
    if eof:
        assert one == ends_of(chunk_lengths(data, p.min_size, p.avg_size, p.max_size))


@pytest.mark.parametrize("kind", ["random", "zeros", "period", "mixed"])
def test_parallel_halves_with_default_params_on_large_buffers(kind):
    data = _pattern(kind, 9 * 1024 * 1024 + 4321, 7)
    one = chunk_ends(data, split=0)
    assert split_point(len(data), DEFAULT_PARAMS) > 0
    for split in (None, 1, 256 * 1024, len(data) // 3, len(data) - 1):
        assert chunk_ends(data, split=split) == one
    assert [len(c) for c in iter_chunks(io.BytesIO(data), block_size=5 * 1024 * 1024)] == \
        [b - a for a, b in zip([0] + one, one)]


@settings(max_examples=150, deadline=None)
@given(cuts=st.lists(st.integers(0, 30000), max_size=8), blocks=st.lists(st.integers(1, 9000), min_size=1, max_size=6),
       p=params_strategy, kind=st.sampled_from(["random", "zeros", "period", "mixed"]))
def test_read_from_cuts_like_one_scan_whatever_the_reads(cuts, blocks, p, kind):
    """`read_from` cuts a block in place after joining only its start to the uncut tail: the chunks
    are those of one scan of each segment, whatever the block sizes, forced cuts and data."""
    data = _pattern(kind, 30000, 3)
    bounds = sorted({0, len(data), *(c for c in cuts if 0 < c < len(data))})
    expect = [a + e for a, b in zip(bounds, bounds[1:]) for e in chunk_ends(data[a:b], p)]
    chunker, f, got, i = Chunker(p, cuts), io.BytesIO(data), [], 0
    while True:
        block, chunks = chunker.read_from(f, blocks[i % len(blocks)])
        i += 1
        got += chunks
        if not block:
            break
    got += chunker.finish()
    assert b"".join(got) == data
    assert ends_of(map(len, got)) == expect

"""Range planning (core/ranges.py): every chunk read once, ranges bounded, slices exact."""
from hypothesis import given, settings, strategies as st

from cdcstore.core.pack import PackEntry
from cdcstore.core.ranges import plan_ranges, slices


def _layout(sizes_and_gaps):
    out, pos = [], 0
    for i, (size, gap, pack) in enumerate(sizes_and_gaps):
        pos += gap
        out.append((f"p{pack}", PackEntry(i.to_bytes(16, "big"), pos, size, size, 0)))
        pos += size
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 3000), st.integers(0, 2)), max_size=60),
       st.integers(0, 2048), st.integers(1, 20000))
def test_each_chunk_once_within_bounds(layout, max_hole, max_range):
    wanted = _layout(layout)
    ranges = plan_ranges(wanted, max_hole=max_hole, max_range=max_range)
    seen = [(r.pack, e.chunk_id) for r in ranges for e in r.entries]
    assert sorted(seen) == sorted((p, e.chunk_id) for p, e in wanted)
    for r in ranges:
        assert r.start == min(e.offset for e in r.entries)
        assert r.end == max(e.offset + e.stored_len for e in r.entries)
        assert r.end - r.start <= max_range or len(r.entries) == 1
        offs = sorted(r.entries, key=lambda e: e.offset)
        for a, b in zip(offs, offs[1:]):
            assert b.offset - (a.offset + a.stored_len) <= max_hole


def test_slices_cut_each_chunk_out_of_the_read():
    wanted = _layout([(3, 0, 0), (4, 2, 0), (5, 0, 0)])
    (r,) = plan_ranges(wanted, max_hole=8)
    data = bytes(range(r.start, r.end))
    got = {e.chunk_id: bytes(v) for e, v in slices(r, data)}
    assert got == {e.chunk_id: bytes(range(e.offset, e.offset + e.stored_len)) for _, e in wanted}

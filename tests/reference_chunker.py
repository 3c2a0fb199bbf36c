"""Pure-Python reference of the chunk format v1 boundary rule (slow; tests only).

Written from the rule in docs/format.md, independently of the C scan.
"""
M64 = (1 << 64) - 1


def gear_table() -> list[int]:
    x = 0x6364636765617231  # b"cdcgear1"
    table = []
    for _ in range(256):
        x = (x + 0x9E3779B97F4A7C15) & M64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        table.append(z ^ (z >> 31))
    return table


GEAR = gear_table()


def chunk_lengths(data: bytes, min_size: int, avg_size: int, max_size: int) -> list[int]:
    """Lengths of the chunks of a whole buffer."""
    thr_small = (M64 // avg_size) >> 2
    thr_large = min(M64, (M64 // avg_size) << 2)
    out = []
    s = 0
    n = len(data)
    while s < n:
        h = 0
        cut = n - s
        for length in range(1, min(max_size, n - s) + 1):
            h = ((h << 1) + GEAR[data[s + length - 1]]) & M64
            if length < min_size:
                continue
            if length == max_size:
                cut = length
                break
            if h < (thr_small if length < avg_size else thr_large):
                cut = length
                break
        out.append(cut)
        s += cut
    return out


def gear_before(data: bytes, c: int) -> int:
    """The gear hash of the (up to) 64 bytes before offset `c`."""
    h = 0
    for b in data[max(0, c - 64):c]:
        h = ((h << 1) + GEAR[b]) & M64
    return h


def page_group_cuts(data: bytes, ranges, hard, min_size: int, avg_size: int, max_size: int) -> list[int]:
    """Chunk format v2's page groups (docs/format.md, revision 4), written from the text: the
    cuts chosen among the hard offsets, column chunk bounds (`ranges`) and page starts, which
    are walked here with the Python reference decoder."""
    from cdcstore.core.pages import read_page_header

    size = len(data)
    kinds: dict[int, int] = {}  # offset -> 2 hard, 1 firm, 0 soft
    for c in hard:
        kinds[c] = 2
    for a, e in ranges:
        for c in (a, e):
            kinds[c] = max(kinds.get(c, 1), 1)
        pos = a
        while pos < e:
            if pos != a:
                kinds.setdefault(pos, 0)
            hlen, _, body = read_page_header(data[pos:e])
            pos += hlen + body
        assert pos == e
    order = sorted(c for c in kinds if 0 < c < size)
    fixed = sorted(c for c in kinds if kinds[c] > 0) + [size]
    small, large = (M64 // avg_size) >> 2, min(M64, (M64 // avg_size) << 2)
    cuts, s, prev = [], 0, 0
    for i, c in enumerate(order):
        nxt = order[i + 1] if i + 1 < len(order) else size
        length, gap, prev = c - s, c - prev, c
        kind = kinds[c]
        if kind == 2:
            cut = True
        elif nxt - s > max_size:
            cut = True
        elif kind == 1:
            region = next(f for f in fixed if f > c) - c
            cut = region >= min_size or length >= min_size
        elif length < min_size:
            cut = False
        else:
            cut = gear_before(data, c) < min(M64, gap * (small if length < avg_size else large))
        if cut:
            cuts.append(c)
            s = c
    return cuts


def page_group_chunk_ends(data: bytes, cuts, min_size: int, avg_size: int, max_size: int) -> list[int]:
    """End offsets of the chunks of a file cut at `cuts`: a segment of at most max_size bytes
    is one chunk, a longer one is cut by the byte rule."""
    ends, bounds = [], [0, *cuts, len(data)]
    for a, b in zip(bounds, bounds[1:]):
        if b - a <= max_size:
            ends.append(b)
            continue
        for n in chunk_lengths(data[a:b], min_size, avg_size, max_size):
            a += n
            ends.append(a)
    return ends

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

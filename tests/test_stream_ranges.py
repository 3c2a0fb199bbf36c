"""A byte range inside a large media file costs only the chunks it touches (a video frame, as LeRobot reads)."""
import random

import fsspec

from cdcstore import Store

SIZE = 64 << 20
# what a cold open + reads may cost beyond the touched chunks: the commit, the manifest (~30 KB for
# 64 MiB), locate answers (a block of 512 chunk locations, ~28 KB, per block touched) and headers
OVERHEAD = 256 << 10


def touched(m, ranges):
    """Bytes of the distinct chunks the ranges touch."""
    idx = {i for off, n in ranges for i in m.span(off, off + n)}
    return sum(m.lengths[i] for i in idx)


def read_ranges(server, tmp_path, ranges, name):
    fs = fsspec.filesystem("cdc", store=server.url, cache=str(tmp_path / name), skip_instance_cache=True)
    out = []
    with fs.open("cdc://media/episode.mp4", "rb") as f:
        for off, n in ranges:
            f.seek(off)
            out.append(f.read(n))
        m = f._m
    fs.store.backend.cache.wait()
    return out, fs.store.counters(), m


def test_small_ranges_of_a_64mb_file_fetch_only_their_chunks(server, tmp_path):
    data = random.Random(0).randbytes(SIZE)  # incompressible, like encoded video
    (tmp_path / "episode.mp4").write_bytes(data)
    with Store(server.url, cache=False) as up:
        up.push([str(tmp_path / "episode.mp4")], "cdc://media/episode.mp4", message="v1")
    frames = [(5_000_000, 40_000), (33_333_333, 25_000), (61_000_000, 60_000), (17_000_123, 1)]
    got, c, m = read_ranges(server, tmp_path, frames, "cache-random")
    assert got == [data[o:o + n] for o, n in frames]
    need = touched(m, frames)
    assert need < 2 << 20 and c["received_bytes"] <= need + OVERHEAD, (c, need)
    # consecutive frames (frame i, then frame i + 1) must not start a 32 MiB read-ahead
    consecutive = [(40_000_000, 30_000), (40_030_000, 30_000), (40_060_000, 30_000)]
    got, c, m = read_ranges(server, tmp_path, consecutive, "cache-consecutive")
    assert got == [data[o:o + n] for o, n in consecutive]
    need = touched(m, consecutive)
    assert c["received_bytes"] <= need + 4 * (256 << 10) + OVERHEAD, (c, need)

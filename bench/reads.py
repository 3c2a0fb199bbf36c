"""The reads of read.py and fs.py: to the end in 8 MiB pieces, random 64 KiB ones (ours, plain,
hf_xet), xxh3 of a file and the fixed-seed offsets every side reads at."""
from __future__ import annotations

import random
import time


PIECE = 8 * 1024 * 1024  # the read size of full reads
RANDOM_LEN = 64 * 1024  # the length of each random read


def read_to_end(f, hasher=None) -> int:
    """Read the file object f to EOF in PIECE-sized reads; the byte count (each piece fed to hasher)."""
    n = 0
    while True:
        b = f.read(PIECE)
        if not b:
            break
        n += len(b)
        if hasher:
            hasher.update(b)
    return n


def xxh_file(path: str) -> str:
    """xxh3-128 of a file's bytes (hex)."""
    import xxhash
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(PIECE), b""):
            h.update(block)
    return h.hexdigest()


def random_offsets(path: str, size: int, reads: int, seed: int) -> tuple[list[int], list[bytes]]:
    """`reads` uniform offsets of RANDOM_LEN reads in a file of `size` bytes (random.Random(seed)),
    and the file's bytes at every 100th of them (what random_reads samples)."""
    rng = random.Random(seed)
    offsets = [rng.randrange(0, size - RANDOM_LEN + 1) for _ in range(reads)]
    with open(path, "rb") as f:
        expect = []
        for off in offsets[::100]:
            f.seek(off)
            expect.append(f.read(RANDOM_LEN))
    return offsets, expect


def random_reads(f, offsets, name: str | None = None) -> tuple[list[float], list[bytes]]:
    """seek + read(RANDOM_LEN) at each offset on the open file object f: the latency of each, and
    the bytes of every 100th read. With a name, a short read raises (naming the side)."""
    lat, sample = [], []
    for i, off in enumerate(offsets):
        t0 = time.perf_counter()
        f.seek(off)
        b = f.read(RANDOM_LEN)
        lat.append(time.perf_counter() - t0)
        if name is not None and len(b) != RANDOM_LEN:
            raise RuntimeError(f"{name}: short read at {off}: {len(b)}")
        if i % 100 == 0:
            sample.append(b)
    return lat, sample


def xet_random_reads(sess, endpoint: str, info, offsets) -> tuple[list[float], list[bytes]]:
    """random_reads with hf_xet: download_stream(info, off, off + RANDOM_LEN) joined, in a new
    download stream group of sess on endpoint."""
    group = sess.new_download_stream_group(endpoint=endpoint)
    lat, sample = [], []
    for i, off in enumerate(offsets):
        t0 = time.perf_counter()
        b = b"".join(group.download_stream(info, off, off + RANDOM_LEN))
        lat.append(time.perf_counter() - t0)
        if len(b) != RANDOM_LEN:
            raise RuntimeError(f"hf_xet: short read at {off}: {len(b)}")
        if i % 100 == 0:
            sample.append(b)
    group.finish()
    return lat, sample

"""The write path under stress: compression decisions, parallel chunking, a push that is
killed, a file that changes while it is pushed (issue 12)."""
import io
import json
import os
import random

import numpy as np

import pytest

from cdcstore import Store
from cdcstore.core import ids
from cdcstore.core.pack import CODEC_RAW, CODEC_ZSTD, decode_chunk, encode_chunk
from conftest import short_writes

MIN_SAVING = 1 / 4  # the least saving for which zstd is kept (cdcstore.core.pack.MIN_SAVING)


def _codecs(store: Store) -> list[tuple[int, int, int]]:
    """(codec, raw_len, stored_len) of every chunk row."""
    return [(e.codec, e.raw_len, e.stored_len) for _, e in store.backend.index.rows().values()]


def _csv(n_rows: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    out = io.StringIO("id,ts,user,category,price\n")
    out.seek(0, 2)
    for i in range(n_rows):
        out.write(f"{i},{1700000000 + i * 7},{rng.randrange(10**6)},{rng.choice(['a', 'bb', 'ccc'])},"
                  f"{rng.random() * 100:.2f}\n")
    return out.getvalue().encode()


def test_compressible_data_is_still_compressed(tmp_path):
    csv = _csv(60_000)
    js = "\n".join(json.dumps({"id": i, "name": f"user{i}", "tags": ["x", "y"], "score": i % 97})
                   for i in range(40_000)).encode()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "t.csv").write_bytes(csv)
    (tmp_path / "d" / "t.jsonl").write_bytes(js)
    s = Store.init(str(tmp_path / "s"))
    r = s.push([str(tmp_path / "d")], "cdc://ds/")
    rows = _codecs(s)
    assert rows and all(codec == CODEC_ZSTD for codec, _, _ in rows)
    assert r.stored_bytes < 0.5 * (len(csv) + len(js))
    assert s.cat("cdc://ds/t.csv") == csv and s.cat("cdc://ds/t.jsonl") == js


def test_incompressible_data_is_stored_raw_and_reads_back(tmp_path):
    rng = random.Random(3)
    data = rng.randbytes(3_000_000)
    (tmp_path / "r.bin").write_bytes(data)
    s = Store.init(str(tmp_path / "s"))
    s.push([str(tmp_path / "r.bin")], "cdc://ds/")
    rows = _codecs(s)
    assert len(rows) > 10 and all(codec == CODEC_RAW and raw == stored for codec, raw, stored in rows)
    assert s.cat("cdc://ds/r.bin") == data
    assert s.check(read_data=True)["problems"] == []


def test_a_chunk_zstd_barely_shrinks_is_stored_raw():
    """Random bytes with a little run of zeros: zstd saves ~2%, which is not worth a decompression
    on every read."""
    raw = random.Random(5).randbytes(60_000) + bytes(1500)
    cid = ids.digest(raw)
    codec, stored = encode_chunk(raw, cid)
    assert codec == CODEC_RAW and bytes(stored) == raw


def test_a_chunk_compressible_past_its_samples_is_still_compressed():
    """The probe looks at the start and the middle; a chunk that compresses well there is compressed
    whole, and a chunk that saves enough is kept compressed and verified."""
    raw = bytes(40_000) + random.Random(6).randbytes(30_000)
    cid = ids.digest(raw)
    codec, stored = encode_chunk(raw, cid)
    assert codec == CODEC_ZSTD and len(stored) <= len(raw) * (1 - MIN_SAVING)
    assert decode_chunk(stored, codec, len(raw), cid) == raw


def _push_changing(tmp_path, change) -> tuple[bytes, bytes]:
    """Push one 20 MB file whose bytes `change(path)` alters after the first 6 MiB block was read
    (blocks this large are scanned in parallel halves); return (its bytes before, what was stored)."""
    from cdcstore.engine.ingest import IngestOptions
    data = random.Random(8).randbytes(20_000_000)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    s = Store.init(str(tmp_path / "s"))
    calls = []

    def progress(n):
        if not calls:
            change(path)
        calls.append(n)

    r = s.push([str(path)], "cdc://ds/", progress=progress, options=IngestOptions(block_size=6 << 20))
    got = s.cat("cdc://ds/big.bin")
    assert r.bytes == len(got) == sum(calls)
    assert s.check(read_data=True)["problems"] == []
    s.close()
    return data, got


@pytest.mark.timeout(60)
def test_a_file_that_shrinks_while_pushed_is_stored_as_read(tmp_path):
    def shrink(path):
        with open(path, "r+b") as f:
            f.truncate(9_000_000)
    data, got = _push_changing(tmp_path, shrink)
    assert got == data[:9_000_000]


@pytest.mark.timeout(60)
def test_a_file_that_grows_while_pushed_is_stored_as_read(tmp_path):
    extra = random.Random(9).randbytes(7_000_000)

    def grow(path):
        with open(path, "ab") as f:
            f.write(extra)
    data, got = _push_changing(tmp_path, grow)
    assert got == data + extra


KILLED_PUSH = """
import sys
from cdcstore import Store
from cdcstore.engine.ingest import IngestOptions
def progress(n):
    print("block", n, flush=True)  # the parent kills after the k-th block
Store(sys.argv[1]).push([sys.argv[2]], "cdc://ds/", progress=progress,
                        options=IngestOptions(max_pack_bytes=1 << 20, block_size=6 << 20))
print("done", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_push_killed_midway_leaves_the_store_consistent(tmp_path):
    """SIGKILL after the k-th block of pushes of large files (parallel halves, many small packs):
    every time, `check --read-data` is clean, and later pushes store each file whole once."""
    import signal
    import subprocess as sp
    import sys
    root = str(tmp_path / "s")
    Store.init(root).close()
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    kills = 0
    for i, k in enumerate((1, 2, 4, 6), 1):
        path = tmp_path / f"big{i}.bin"
        path.write_bytes(random.Random(i).randbytes(40_000_000))  # 7 blocks of 6 MiB
        p = sp.Popen([sys.executable, "-c", KILLED_PUSH, root, str(path)], stdout=sp.PIPE, text=True, env=env)
        for _ in range(k):
            assert p.stdout.readline().startswith("block")
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
        kills += p.returncode == -signal.SIGKILL
        s = Store(root)
        assert s.check(read_data=True)["problems"] == []
        s.close()
    assert kills == 4
    s = Store(root)
    for i in range(1, 5):
        data = (tmp_path / f"big{i}.bin").read_bytes()
        s.push([str(tmp_path / f"big{i}.bin")], "cdc://ds/")
        assert s.cat(f"cdc://ds/big{i}.bin") == data
    assert s.check(read_data=True)["problems"] == []
    assert s.backend.totals()["chunk_raw_bytes"] == 4 * 40_000_000  # nothing indexed twice


def test_a_gathered_pack_file_holds_every_piece_in_order_even_after_short_writes(tmp_path, monkeypatch):
    """Packs are written with os.writev of the pieces (no copy into a buffer); more pieces than
    one call takes, and a write that stops part way, go on where it stopped."""
    from cdcstore.engine import ingest

    rng = random.Random(3)
    pieces = [rng.randbytes(rng.randrange(0, 300)) for _ in range(3000)]
    pieces += [os.urandom(5 << 20), memoryview(os.urandom(70_000))[10:]]
    real = os.writev
    monkeypatch.setattr(os, "writev", short_writes(real, 1000, 7))
    f = ingest.GatherFile(str(tmp_path / "p"))
    for p in pieces:
        f.write(p)
    f.close()
    assert (tmp_path / "p").read_bytes() == b"".join(bytes(p) for p in pieces)



def test_a_files_compression_probe_backs_off_on_compressed_bytes_and_comes_back():
    """FileProbe: after RUN chunks in a row that zstd would not shrink, one chunk in EVERY is
    probed; one that passes brings back a probe per chunk (pure: no store)."""
    from cdcstore.core import pack

    calls = []
    real = pack.worth_compressing
    try:
        pack.worth_compressing = lambda raw: calls.append(raw) or real(raw)
        probe = pack.FileProbe()
        noise = [os.urandom(65536) for _ in range(100)]
        assert not any(probe.worth(c) for c in noise)
        assert len(calls) == pack.FileProbe.RUN + (100 - pack.FileProbe.RUN) // pack.FileProbe.EVERY + 1
        text = b"the same words again and again " * 2048
        answers = [probe.worth(text) for _ in range(3 * pack.FileProbe.EVERY)]
        assert answers[pack.FileProbe.EVERY:] == [True] * (2 * pack.FileProbe.EVERY)  # back to every chunk
    finally:
        pack.worth_compressing = real


def test_a_push_compresses_text_and_stores_compressed_parquet_raw(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    (src / "notes.txt").write_bytes(b"".join(b"line %d of a log that repeats itself\n" % i for i in range(100_000)))
    rng = np.random.default_rng(1)
    pq.write_table(pa.table({"x": pa.array(rng.random(400_000))}), src / "t.parquet", compression="zstd")
    s = Store.init(str(tmp_path / "store"))
    r = s.push([str(src)], "cdc://r/")
    text_bytes = (src / "notes.txt").stat().st_size
    pq_bytes = (src / "t.parquet").stat().st_size
    assert r.stored_bytes < pq_bytes + 0.5 * text_bytes  # the text shrank by half at least
    assert r.stored_bytes > pq_bytes  # the Parquet pages were not
    assert s.cat("cdc://r/notes.txt") == (src / "notes.txt").read_bytes()


def test_the_probe_starts_again_at_each_region():
    """A Parquet file's column chunks are regions: after a column of noise, the first chunks of
    a column of text are probed (and compressed) at once, not one in EVERY."""
    from cdcstore.core import pack

    noise = [os.urandom(65536) for _ in range(40)]
    text = [b"the same words again and again " * 2048 for _ in range(3)]
    probe = pack.FileProbe(regions=[40 * 65536])
    assert not any(probe.worth(c) for c in noise)
    assert all(probe.worth(c) for c in text)
    probe = pack.FileProbe()  # no regions: the text waits for the next probe in EVERY
    assert not any(probe.worth(c) for c in noise)
    assert [probe.worth(c) for c in text] != [True] * 3

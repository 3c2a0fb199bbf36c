"""The chunk cache keeps chunk bytes in segment files beside its sqlite file (storage/segments.py):
written once, read back verified, reclaimed by eviction, shared by processes, and an old cache
(bytes in sqlite) still reads."""
import multiprocessing
import os
import sqlite3
import time

import pytest

from cdcstore.core import ids
from cdcstore.core.pack import CODEC_RAW
from cdcstore.storage import cache as cache_mod
from cdcstore.storage.cache import ChunkCache
from conftest import short_writes


def entries(n: int, size: int = 64 * 1024, seed: int = 0) -> list[tuple[bytes, int, int, bytes]]:
    out = []
    for i in range(n):
        data = (f"{seed}:{i}:".encode() * size)[:size]
        out.append((ids.digest(data), CODEC_RAW, len(data), data))
    return out


def folder_bytes(cache: ChunkCache) -> int:
    d = cache.path + "-chunks"
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def test_chunk_bytes_go_to_segments_not_sqlite(tmp_path):
    c = ChunkCache(str(tmp_path / "c.sqlite"))
    es = entries(64)  # 4 MiB
    c.put(es)
    got = c.get([e[0] for e in es])
    assert got == {e[0]: e[3] for e in es}
    assert folder_bytes(c) == 64 * 64 * 1024  # each byte written once, to a segment
    assert os.path.getsize(c.path) + os.path.getsize(c.path + "-wal") < 1024 * 1024  # not to sqlite
    assert c.stats()["segment_bytes"] == 64 * 64 * 1024
    c.put(es)  # cached already: nothing is appended again
    assert folder_bytes(c) == 64 * 64 * 1024


def test_a_damaged_or_lost_segment_is_a_miss_then_cached_again(tmp_path):
    c = ChunkCache(str(tmp_path / "c.sqlite"))
    es = entries(8)
    c.put(es)
    seg, off = c.conn.execute("SELECT seg, off FROM chunks WHERE id = ?", (es[3][0],)).fetchone()
    with open(c._files.path(seg), "r+b") as f:
        f.seek(off + 100)
        f.write(b"\xff\xfe")
    got = c.get([e[0] for e in es])
    assert es[3][0] not in got and len(got) == 7  # the damaged entry is left out and dropped
    assert c.has([es[3][0]]) == {}
    os.unlink(c._files.path(seg))  # a user cleaning the folder while the process runs
    other = ChunkCache(c.path)  # another process's view: it never opened the segment
    assert other.get([e[0] for e in es]) == {}  # misses, and the rows go
    c.put(es)  # the writer sees its file is gone and starts another segment
    assert other.get([e[0] for e in es]) == {e[0]: e[3] for e in es}
    assert c.conn.execute("SELECT COUNT(*) FROM segments").fetchone()[0] == 2


def test_eviction_frees_the_folder_and_keeps_hot_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod, "SEGMENT_BYTES", 256 * 1024)
    limit = 1024 * 1024
    c = ChunkCache(str(tmp_path / "c.sqlite"), max_bytes=limit)
    hot = entries(4, seed=1)
    c.put(hot)
    c.get([e[0] for e in hot])  # promoted: read from the cache once more
    for k in range(6):  # a scan 6x the budget, in several puts
        c.put(entries(16, seed=10 + k))
    c.prune()
    assert c.bytes() <= limit
    assert folder_bytes(c) <= limit + cache_mod.SEGMENT_BYTES  # evicted bytes leave the disk
    assert c.stats()["segment_bytes"] == folder_bytes(c)
    assert c.get([e[0] for e in hot]) == {e[0]: e[3] for e in hot}  # copied forward, not lost


def _writer(path: str, seed: int) -> None:
    c = ChunkCache(path)
    for k in range(4):
        c.put(entries(8, size=32 * 1024, seed=seed * 100 + k))


def test_processes_write_one_cache_at_once(tmp_path):
    path = str(tmp_path / "c.sqlite")
    ChunkCache(path)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, s)) for s in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    c = ChunkCache(path)
    want = {e[0]: e[3] for s in range(3) for k in range(4) for e in entries(8, size=32 * 1024, seed=s * 100 + k)}
    assert c.get(list(want)) == want  # each process appended to its own segment: nothing overwritten
    owners = c.conn.execute("SELECT COUNT(DISTINCT owner) FROM segments").fetchone()[0]
    assert owners == 3


def test_a_dead_writers_segment_and_stray_files_are_reclaimed(tmp_path):
    path = str(tmp_path / "c.sqlite")
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_writer, args=(path, 7))
    p.start()
    p.join(60)
    c = ChunkCache(path)
    (seg,) = [r[0] for r in c.conn.execute("SELECT seg FROM segments WHERE sealed = 0")]  # never sealed
    stray = c._files.path(999)
    with open(stray, "wb") as f:
        f.write(b"x" * 1000)
    os.utime(stray, (time.time() - 3600, time.time() - 3600))
    c.prune(0)  # evict everything
    assert c.bytes() == 0
    assert not os.path.exists(c._files.path(seg)) and not os.path.exists(stray)
    assert c.conn.execute("SELECT COUNT(*) FROM segments").fetchone()[0] == 0


def test_a_cache_made_before_segments_still_reads(tmp_path):
    path = str(tmp_path / "old.sqlite")
    db = sqlite3.connect(path)  # the layout of the version before: bytes in the chunks table
    db.executescript("""
        CREATE TABLE chunks (id BLOB PRIMARY KEY, codec INTEGER NOT NULL, raw_len INTEGER NOT NULL,
            size INTEGER NOT NULL, used REAL NOT NULL, data BLOB NOT NULL, hot INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
        INSERT INTO meta VALUES ('bytes', 0);
    """)
    (cid, codec, raw_len, data), = entries(1)
    db.execute("INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, 0)", (cid, codec, raw_len, len(data), time.time(), data))
    db.commit()
    db.close()
    c = ChunkCache(path)
    assert c.get([cid]) == {cid: data}
    new = entries(2, seed=5)
    c.put(new)
    assert c.get([e[0] for e in new] + [cid]) == {**{e[0]: e[3] for e in new}, cid: data}
    c.clear()
    assert c.get([cid]) == {} and folder_bytes(c) == 0


@pytest.mark.parametrize("n", [1, 1500])
def test_many_small_entries_in_one_put(tmp_path, n):
    c = ChunkCache(str(tmp_path / "c.sqlite"))
    es = entries(n, size=100, seed=n)  # more buffers than one pwritev takes
    c.put(es)
    assert c.get([e[0] for e in es]) == {e[0]: e[3] for e in es}


def test_segment_appends_go_on_after_short_writes(tmp_path, monkeypatch):
    """Segments.append writes through storage.local.write_all (the pack writer's too): more
    buffers than one pwritev takes, and writes that stop part way, land every byte in order."""
    import os
    import random
    from cdcstore.storage.segments import Segments

    rng = random.Random(5)
    bufs = [rng.randbytes(rng.randrange(0, 400)) for _ in range(2500)] + [memoryview(os.urandom(9000))[3:]]
    real = os.pwritev

    monkeypatch.setattr(os, "pwritev", short_writes(real, 700, 5))
    segs = Segments(str(tmp_path / "segs"))
    fd = segs.create(1)
    offsets = Segments.append(fd, 10, bufs)
    os.close(fd)
    data = open(segs.path(1), "rb").read()
    assert data[10:] == b"".join(bytes(b) for b in bufs)
    assert [data[o:o + len(b)] for o, b in zip(offsets, bufs)] == [bytes(b) for b in bufs]

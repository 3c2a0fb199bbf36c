"""The local dedup cache, in front of a real server."""
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest
import xxhash

from cdcstore import Store
from cdcstore.storage.cache import ChunkCache, parse_size
from conftest import golden_input


@pytest.fixture
def published(server, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(golden_input(3_000_000))
    with Store(server.url, cache=False) as s:
        v1 = s.push([str(src)], "cdc://r/")
        edited = bytearray(golden_input(3_000_000))
        edited[1_500_000:1_500_004] = b"v2v2"
        (src / "f.bin").write_bytes(bytes(edited))
        v2 = s.push([str(src)], "cdc://r/")
    return v1, v2, bytes(edited)


def test_cached_read_makes_no_request_and_v1_chunks_serve_v2(server, published, tmp_path):
    v1, v2, edited = published
    cache = ChunkCache(str(tmp_path / "c.sqlite"))
    with Store(server.url, cache=cache) as s:
        assert s.cat(f"cdc://r@{v1.commit}/f.bin") == golden_input(3_000_000)
        cache.wait()  # cache writes happen in the background
        before = s.counters()
        assert s.cat(f"cdc://r@{v1.commit}/f.bin") == golden_input(3_000_000)
        assert s.counters() == before  # fully served from the cache: not one request
        cache.wait()
        got_before = s.counters()["received_bytes"]
        assert s.cat(f"cdc://r@{v2.commit}/f.bin") == edited
        received = s.counters()["received_bytes"] - got_before
        assert received < v2.new_bytes + 32 * 1024  # only the chunks v1 did not have
    st = cache.stats()
    assert st["chunks"] > 0 and st["objects"] >= 4


def test_eviction_keeps_the_cache_bounded(server, published, tmp_path):
    v1, v2, _ = published
    cache = ChunkCache(str(tmp_path / "c.sqlite"), max_bytes=1_000_000)
    with Store(server.url, cache=cache) as s:
        s.cat(f"cdc://r@{v1.commit}/f.bin")
        cache.wait()
        assert cache.bytes() <= 1_000_000
        assert s.cat(f"cdc://r@{v2.commit}/f.bin") == published[2]  # evicted chunks are fetched again
    assert 0 < cache.bytes() <= 1_000_000
    freed = cache.prune(200_000)
    assert freed > 0 and cache.bytes() <= 200_000
    cache.clear()
    assert cache.stats()["chunks"] == 0


def test_a_corrupt_cache_entry_is_fetched_again(server, published, tmp_path):
    v1, _, _ = published
    path = str(tmp_path / "c.sqlite")
    with Store(server.url, cache=ChunkCache(path)) as s:
        s.cat(f"cdc://r@{v1.commit}/f.bin")
    db = sqlite3.connect(path)
    rows = db.execute("SELECT seg, off, size FROM chunks").fetchall()
    db.close()
    for seg, off, size in rows[:5]:  # flip a byte of each entry in its segment file
        with open(os.path.join(path + "-chunks", f"{seg}.seg"), "r+b") as f:
            f.seek(off + size // 2)
            byte = f.read(1)
            f.seek(off + size // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
    with Store(server.url, cache=ChunkCache(path)) as s:
        assert s.cat(f"cdc://r@{v1.commit}/f.bin") == golden_input(3_000_000)
        assert s.counters()["received_bytes"] > 0  # the damaged entries came from the server


READER = textwrap.dedent("""
    import sys
    from cdcstore import Store
    from cdcstore.storage.cache import ChunkCache
    with Store(sys.argv[1], cache=ChunkCache(sys.argv[2], max_bytes=sys.argv[4])) as s:
        data = s.cat(sys.argv[3])
    import xxhash
    sys.stdout.write(str(len(data)) + " " + xxhash.xxh3_64_hexdigest(data))
""")


def test_processes_share_one_cache_at_once(server, published, tmp_path):
    v1, v2, edited = published
    path = str(tmp_path / "c.sqlite")
    procs = [subprocess.Popen([sys.executable, "-c", READER, server.url, path,
                               f"cdc://r@{(v1, v2)[i % 2].commit}/f.bin", "2000000"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(6)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    expect = {0: f"{len(golden_input(3_000_000))} {xxhash.xxh3_64_hexdigest(golden_input(3_000_000))}",
              1: f"{len(edited)} {xxhash.xxh3_64_hexdigest(edited)}"}
    assert [o[0].decode() for o in outs] == [expect[i % 2] for i in range(6)]
    assert ChunkCache(path).bytes() <= 2_000_000


def test_cache_cli_and_sizes(tmp_path):
    assert parse_size("2G") == 2 * 1024**3 and parse_size("512k") == 512 * 1024 and parse_size(10) == 10
    path = str(tmp_path / "c.sqlite")
    ChunkCache(path).put([(b"x" * 16, 0, 3, b"abc")])
    run = lambda *a: subprocess.run([sys.executable, "-m", "cdcstore", "cache", *a, "--cache", path],
                                    capture_output=True, text=True, timeout=60)
    assert '"chunks": 1' in run("stats", "--json").stdout
    assert run("prune", "--max-size", "1").returncode == 0
    assert run("clear").returncode == 0 and ChunkCache(path).stats()["chunks"] == 0


def _entries(tag: bytes, n: int, size: int) -> list[tuple[bytes, int, int, bytes]]:
    """n raw chunks of `size` bytes, as cache entries keyed by their real ids."""
    from cdcstore.core.ids import digest
    from cdcstore.core.pack import CODEC_RAW
    out = []
    for i in range(n):
        data = (tag + i.to_bytes(4, "little")) * (size // (len(tag) + 4))
        out.append((digest(data), CODEC_RAW, len(data), data))
    return out


def test_a_scan_larger_than_the_cache_keeps_its_hot_set(tmp_path):
    """A hot set read twice, then a one-pass scan 3x the cache: the hot set stays."""
    cache = ChunkCache(str(tmp_path / "c.sqlite"), max_bytes=1_000_000)
    hot = _entries(b"hot", 20, 10_000)  # 200 KB, read again below: second touch
    cache.put(hot)
    hot_ids = [e[0] for e in hot]
    assert len(cache.get(hot_ids)) == 20
    for k in range(30):  # 3 MB of chunks seen once, in 100 KB batches as a reader stores them
        cache.put(_entries(b"scan%d" % k, 10, 10_000))
        assert cache.bytes() <= 1_000_000
    assert len(cache.get(hot_ids)) == 20  # every hot chunk is still a hit
    assert len(cache.has([e[0] for e in _entries(b"scan29", 10, 10_000)])) == 10  # the newest scan data too


def test_a_hot_set_larger_than_its_share_still_admits_new_data(tmp_path):
    """Everything read twice cannot freeze the cache: old protected entries are demoted."""
    cache = ChunkCache(str(tmp_path / "c.sqlite"), max_bytes=1_000_000)
    for k in range(3):  # 1.5 MB read twice, in turn
        batch = _entries(b"h%d" % k, 50, 10_000)
        cache.put(batch)
        cache.get([e[0] for e in batch])
    assert cache.bytes() <= 1_000_000
    fresh = _entries(b"fresh", 10, 10_000)
    cache.put(fresh)
    assert len(cache.has([e[0] for e in fresh])) == 10
    assert len(cache.get([e[0] for e in fresh])) == 10  # read twice: now hot in turn
    for k in range(30):
        cache.put(_entries(b"scan%d" % k, 10, 10_000))
    assert len(cache.get([e[0] for e in fresh])) == 10  # and kept through a scan
    assert cache.bytes() <= 1_000_000


def _accounts(path) -> tuple:
    """(the cache's byte count, the bytes its rows hold; each segment's live bytes, its rows' bytes)."""
    with sqlite3.connect(path) as c:
        counted = c.execute("SELECT value FROM meta WHERE key = 'bytes'").fetchone()[0]
        held = c.execute("SELECT coalesce(sum(size), 0) FROM chunks").fetchone()[0]
        live = dict(c.execute("SELECT seg, live FROM segments WHERE live != 0"))
        by_seg = dict(c.execute("SELECT seg, sum(size) FROM chunks WHERE seg IS NOT NULL GROUP BY seg"))
    return counted, held, live, by_seg


def test_byte_counts_stay_exact_with_or_without_an_older_versions_triggers(tmp_path):
    """Inserts are counted once per write (not by a trigger per row); an older cdcstore that opens
    the cache re-creates its insert triggers, and then they count, never both."""
    path = str(tmp_path / "c.sqlite")
    cache = ChunkCache(path, max_bytes=10_000_000)
    cache.put(_entries(b"a", 40, 30_000))
    cache.put(_entries(b"a", 40, 30_000) + _entries(b"b", 5, 7_000))  # the repeats are not counted again
    counted, held, live, by_seg = _accounts(path)
    assert counted == held and held >= 40 * 30_000 and live == by_seg
    with sqlite3.connect(path) as db:  # what an older version's schema set-up does
        db.executescript("""
            CREATE TRIGGER IF NOT EXISTS chunks_add AFTER INSERT ON chunks
                BEGIN UPDATE meta SET value = value + NEW.size WHERE key = 'bytes'; END;
            CREATE TRIGGER IF NOT EXISTS seg_add AFTER INSERT ON chunks WHEN NEW.seg IS NOT NULL
                BEGIN UPDATE segments SET live = live + NEW.size WHERE seg = NEW.seg; END;""")
    cache.put(_entries(b"c", 10, 20_000))
    counted, held, live, by_seg = _accounts(path)
    assert counted == held and live == by_seg
    cache.prune(300_000)  # deletes are counted by triggers, as before
    counted, held, live, by_seg = _accounts(path)
    assert counted == held <= 300_000 and live == by_seg
    ChunkCache(path)  # this version again: its triggers go, the counts stay exact
    cache.put(_entries(b"d", 10, 20_000))
    counted, held, live, by_seg = _accounts(path)
    assert counted == held and live == by_seg


def test_byte_counts_stay_exact_with_writers_in_threads_and_processes(tmp_path):
    """Four writers at once (two threads here, two processes), overlapping entries: every insert
    counted once, by the transaction that made it."""
    path = str(tmp_path / "c.sqlite")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from test_cache import _entries
        from cdcstore.storage.cache import ChunkCache
        c = ChunkCache({path!r}, max_bytes=100_000_000)
        for k in range(20):
            c.put(_entries(b"p%d" % (k % 7), 8, 9_000))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]

    def write(tag: bytes) -> None:
        c = ChunkCache(path, max_bytes=100_000_000)
        for k in range(20):
            c.put(_entries(tag + b"%d" % (k % 5), 8, 11_000))

    threads = [threading.Thread(target=write, args=(t,)) for t in (b"t", b"p")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(p.wait(60) == 0 for p in procs)
    counted, held, live, by_seg = _accounts(path)
    assert counted == held > 0 and live == by_seg


def test_a_cache_from_before_segments_is_upgraded_in_place(tmp_path):
    path = str(tmp_path / "c.sqlite")
    (cid, codec, raw_len, data), = _entries(b"old", 1, 1000)
    db = sqlite3.connect(path)
    db.executescript("""CREATE TABLE chunks (id BLOB PRIMARY KEY, codec INTEGER NOT NULL, raw_len INTEGER NOT NULL,
                        size INTEGER NOT NULL, used REAL NOT NULL, data BLOB NOT NULL);
                        CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
                        INSERT INTO meta VALUES ('bytes', 0);""")
    db.execute("INSERT INTO chunks VALUES (?, ?, ?, ?, 0, ?)", (cid, codec, raw_len, len(data), data))
    db.commit()
    db.close()
    cache = ChunkCache(path)
    assert cache.get([cid]) == {cid: data}
    assert sqlite3.connect(path).execute("SELECT hot FROM chunks").fetchone() == (1,)  # promoted by that hit


def _rows(path) -> int:
    with sqlite3.connect(path) as c:
        return c.execute("SELECT count(*) FROM chunks").fetchone()[0]


def test_queued_cache_writes_are_served_at_once_and_land_without_a_pause(tmp_path):
    """A fetched chunk counts as cached the moment it is queued, and the background writer
    lands it while reads go on (writes that waited for reads to pause made a cold read's
    close wait for all of them: a 100 MB read took 0.30 s instead of 0.24 s)."""
    import os
    import time
    from cdcstore.core.ids import digest
    from cdcstore.core.pack import CODEC_RAW
    cache = ChunkCache(str(tmp_path / "c.sqlite"))
    blobs = [os.urandom(1000) for _ in range(20)]
    entries = [(digest(b), CODEC_RAW, len(b), b) for b in blobs]
    cache.put_later(entries[:10])
    assert set(cache.has([e[0] for e in entries[:10]])) == {e[0] for e in entries[:10]}  # served while queued
    deadline = time.monotonic() + 5
    while _rows(cache.path) < 10 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _rows(cache.path) == 10  # landed with no wait() and no pause asked for
    cache.put_later(entries[10:])
    cache.wait()
    assert _rows(cache.path) == 20
    assert cache.get([e[0] for e in entries]) == {e[0]: e[3] for e in entries}
    cache.close()


def _use_cache_in_child(cache):
    cache.wait()
    cache.put_later([(b"\x01" * 16, 0, 1, b"x")])
    cache.wait(10)


def _take(lock, q):
    with lock:
        q.put("took it")


def _fork_while_another_thread_holds(lock, target, args=()) -> int:
    """Fork a child running `target(*args)` while another thread of this process holds `lock`
    (as a background thread may at any fork); the child's exit code (None: it hung)."""
    import multiprocessing
    held, release = threading.Event(), threading.Event()

    def holder():
        with lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    p = multiprocessing.get_context("fork").Process(target=target, args=args)
    p.start()
    release.set()
    t.join()
    p.join(20)
    if p.exitcode is None:
        p.kill()
    return p.exitcode


def test_a_fork_while_the_cache_writer_holds_its_lock_does_not_hang(tmp_path):
    """A DataLoader worker forked at the moment the parent's cache writer held the cache's
    condition inherited it locked, and hung on its first read (seen once in CI under load)."""
    from cdcstore.storage.cache import ChunkCache
    cache = ChunkCache(str(tmp_path / "c.sqlite"))
    cache.wait()  # makes this process's condition
    assert _fork_while_another_thread_holds(cache._idle, _use_cache_in_child, (cache,)) == 0


def test_runtime_locks_are_fresh_in_a_forked_child():
    """Every lock of an object that crosses a fork (client, repository, cache) is a runtime.Lock:
    held by another thread at the fork, it is still free in the child."""
    import multiprocessing
    from cdcstore import runtime
    for lock in (runtime.Lock(), runtime.Lock(reentrant=True)):
        q = multiprocessing.get_context("fork").Queue()
        assert _fork_while_another_thread_holds(lock, _take, (lock, q)) == 0
        assert q.get(timeout=5) == "took it"


def test_a_fork_waits_for_the_cache_writer_to_leave_sqlite(tmp_path):
    """A DataLoader forks right after the dataset's reads queued cache writes: a child forked while
    the background writer is inside sqlite would inherit sqlite's mutexes held and hang on its first
    call (a worker hung 12 minutes in `sqlite3.connect`). The fork waits for the writer instead."""
    import multiprocessing
    import threading
    import time

    cache = ChunkCache(str(tmp_path / "c.sqlite"))
    cache.put_later(_entries(b"w", 3, 1000))  # starts this process's writer
    cache.wait()
    entered = threading.Event()

    def writer_busy():
        with cache._busy:  # what the writer holds around its sqlite work
            entered.set()
            time.sleep(0.6)

    t = threading.Thread(target=writer_busy)
    t.start()
    entered.wait()
    start = time.monotonic()
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=lambda: q.put(len(ChunkCache(cache.path).get([e[0] for e in _entries(b"w", 3, 1000)]))))
    p.start()
    waited = time.monotonic() - start
    assert q.get(timeout=30) == 3  # the child uses sqlite
    p.join(30)
    t.join()
    assert waited >= 0.4, waited  # the fork waited for the writer to leave sqlite


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_stores_opened_and_closed_leave_no_files_or_threads_behind(server, published, tmp_path):
    """A long-lived process (a notebook, a dask worker, a server) opens and closes many Stores:
    each one's cache files and writer thread go with it. Once, each Store kept an open
    segment file and, after its first cold read, a writer thread, until 'Too many open files'."""
    v1, v2, edited = published
    paths = [str(tmp_path / f"c{i}.sqlite") for i in range(3)]

    def round_(i):
        with Store(server.url, cache=paths[i % 3]) as s:  # cold for the first 3, warm after
            assert s.cat(f"cdc://r@{v2.commit}/f.bin") == edited

    for i in range(3):
        round_(i)
    fds, threads = _open_fds(), threading.active_count()
    for i in range(3, 40):
        round_(i)
    assert _open_fds() <= fds + 2, os.listdir("/proc/self/fd")
    assert threading.active_count() <= threads
    with Store(server.url, cache=str(tmp_path / "new.sqlite")) as s:  # a cold read starts a writer
        assert s.cat(f"cdc://r@{v1.commit}/f.bin") == golden_input(3_000_000)
    assert threading.active_count() <= threads  # its writer thread ended with it


def test_a_cache_the_caller_passed_stays_open_after_the_store_closes(server, published, tmp_path):
    v1, v2, edited = published
    cache = ChunkCache(str(tmp_path / "mine.sqlite"))
    with Store(server.url, cache=cache) as s:
        assert s.cat(f"cdc://r@{v2.commit}/f.bin") == edited
    cache.wait()
    assert cache.bytes() > 0  # still open
    with Store(server.url, cache=cache) as s:
        before = s.counters()
        assert s.cat(f"cdc://r@{v2.commit}/f.bin") == edited
        assert s.counters()["requests"] <= before["requests"] + 1  # warm: at most the branch head
    cache.close()  # the caller closes what it opened; using it again reopens what it needs
    assert cache.bytes() > 0
    with Store(server.url, cache=cache) as s:
        assert s.cat(f"cdc://r@{v1.commit}/f.bin") == golden_input(3_000_000)
    cache.close()
    cache.close()  # twice is fine


def test_local_stores_opened_and_closed_leave_no_files_behind(store, tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(golden_input(1_000_000))

    def round_(i):
        with Store(store.location) as s:
            s.push([str(src)], f"cdc://ds/{i}.bin")
            assert s.cat("cdc://ds/0.bin") == golden_input(1_000_000)

    for i in range(3):
        round_(i)
    fds = _open_fds()
    for i in range(3, 30):
        round_(i)
    assert _open_fds() <= fds + 2, os.listdir("/proc/self/fd")  # the index's connections closed


def test_a_fork_while_a_thread_opens_a_cache_connection_does_not_hang(tmp_path):
    """sqlite connections are tracked per process (for `close`) under a lock; a DataLoader
    worker forked while another thread held it must still open its own connections."""
    cache = ChunkCache(str(tmp_path / "c.sqlite"))
    cache.wait()
    assert _fork_while_another_thread_holds(cache._conns._lock, _open_cache_in_child, (cache,)) == 0
    cache.close()


def _open_cache_in_child(cache):
    cache.bytes()  # this thread's first connection in the child


def test_a_claim_that_raced_a_landed_fetch_keeps_its_other_chunks_claimed(server, tmp_path):
    """Single flight: when some chunks of a claim turn out queued for the cache already (another
    thread's fetch landed between the cache lookup and the claim), those are let go, and the
    rest stay claimed until this fetch lands: a third reader waits for them, never fetches
    them a second time."""
    from cdcstore.core.pack import PackEntry
    with Store(server.url, cache=str(tmp_path / "c.sqlite")) as s:
        b = s.backend
        items = [("p" * 64, PackEntry(bytes([i]) * 32, i * 10, 10, 10, 0)) for i in range(4)]
        raced = {items[0][1].chunk_id}
        b.cache.inner.queued = lambda ids: {c for c in ids if c in raced}  # as if a fetch just landed
        mine, theirs = b._claim(items)
        assert [e.chunk_id for _, e in mine] == [e.chunk_id for _, e in items[1:]]
        assert [(e.chunk_id, ev.is_set()) for (_, e), ev in theirs] == [(items[0][1].chunk_id, True)]
        b.cache.inner.queued = lambda ids: set()
        mine2, theirs2 = b._claim(items)  # a third reader, while this fetch is in flight
        assert [e.chunk_id for _, e in mine2] == [items[0][1].chunk_id]  # only the landed one is free
        assert {e.chunk_id for (_, e), _ in theirs2} == {e.chunk_id for _, e in items[1:]}
        assert not any(ev.is_set() for _, ev in theirs2)  # still in flight: wait, don't fetch again
        b._land(mine)
        assert all(ev.is_set() for _, ev in theirs2)
        b._land(mine2)


def test_closing_a_store_while_another_thread_reads_through_it(server, published, tmp_path, caplog):
    """close() lets go of the cache's files and connections while a reader thread is mid-read:
    the reader's reads still return the right bytes (what they need is reopened), and no
    'the cache cannot be used' warning tells the user to delete a healthy cache."""
    import logging
    v1, v2, edited = published
    caplog.set_level(logging.WARNING, logger="cdcstore")
    for delay in (0.0, 0.02, 0.08):
        s = Store(server.url, cache=str(tmp_path / f"c{delay}.sqlite"))
        got, errors = [], []

        def reader():
            try:
                for ref in (v1.commit, v2.commit) * 3:
                    got.append((ref, s.cat(f"cdc://r@{ref}/f.bin")))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t = threading.Thread(target=reader)
        t.start()
        import time
        time.sleep(delay)
        s.close()
        t.join(60)
        assert not t.is_alive() and errors == []
        assert all(data == (golden_input(3_000_000) if ref == v1.commit else edited) for ref, data in got)
        s.close()
    assert "cannot be used" not in caplog.text


RACE = """
import sys, threading, time
from cdcstore.storage.sqlite import Connections, is_closed_error
c = Connections(sys.argv[1])
c.conn.execute("CREATE TABLE t (x)")
c.conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(5000)])
stop, errors, rounds = False, [], [0]
def reader():
    while not stop:
        try:
            assert sum(1 for _ in c.conn.execute("SELECT x FROM t")) == 5000
            rounds[0] += 1
        except Exception as e:
            if not is_closed_error(e):
                errors.append(repr(e))
threads = [threading.Thread(target=reader) for _ in range(2)]
[t.start() for t in threads]
t0 = time.monotonic()
while time.monotonic() - t0 < 1.5:
    c.close()
    time.sleep(0.0005)
stop = True
[t.join() for t in threads]
print(len(errors), rounds[0], errors[:3])
"""


def test_connections_closed_while_other_threads_query_never_crash(tmp_path):
    """Connections.close() closes every thread's connection; one closed in the middle of another
    thread's query made Python's sqlite3 crash with a segmentation fault (3 of 3 runs of this
    script; CI saw it under test_closing_a_store_while_another_thread_reads_through_it). Now the
    close waits for the step in flight, and the other thread's next step says 'closed'."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", RACE, str(tmp_path / "race.sqlite")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    errors, rounds = p.stdout.split()[:2]
    assert errors == "0" and int(rounds) > 10, p.stdout

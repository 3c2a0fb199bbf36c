"""Reads of a local store (the fast path: pack ranges land in the result and are verified
there): exact bytes for any range, every damaged byte caught on every path (raw and zstd
chunks), a truncated pack, a read racing a gc that repacks, readers in threads."""
import os
import random
import sqlite3
import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cdcstore import CorruptionError, Store
from cdcstore.core.chunker import ChunkParams
from cdcstore.core.pack import CODEC_RAW, CODEC_ZSTD
from cdcstore.engine.ingest import IngestOptions
from cdcstore.storage.repository import LocalStore
from conftest import flip_byte, golden_input, pack_file

PARAMS = ChunkParams(16384, 65536, 262144)
# raw runs, a compressible run (zstd chunks), a repeated block (duplicate chunks), an odd tail
DATA = golden_input(2_500_000) + b"z" * 300_000 + golden_input(900_000) + golden_input(1_000_001)[::-1]
MiB = 1 << 20


def _push(s: Store, tmp_path, data: bytes, addr: str = "cdc://d/f.bin", **opts) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    s.push([str(src)], addr, options=IngestOptions(params=PARAMS, **opts))


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-read")
    s = Store.init(str(root / "store"))
    _push(s, root, DATA, max_pack_bytes=1_500_000)  # several packs: runs break at pack ends
    yield s
    s.close()


def _read_all(f, piece: int) -> bytes:
    out = []
    while b := f.read(piece):
        out.append(b)
    return b"".join(out)


@pytest.mark.parametrize("piece", [-1, 8 * MiB, 1 * MiB, 1_000_003, 65_536, 4097])
def test_sequential_reads_are_exact(pushed, piece):
    with pushed.open("cdc://d/f.bin") as f:
        assert (f.read() if piece < 0 else _read_all(f, piece)) == DATA


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reads=st.lists(st.tuples(st.integers(0, len(DATA) + 10),
                                st.one_of(st.integers(0, 70_000), st.integers(MiB - 10, 3 * MiB),
                                          st.just(len(DATA)))), min_size=1, max_size=6))
def test_random_ranges_equal_the_plain_file(pushed, reads):
    with pushed.open("cdc://d/f.bin") as f:
        for off, n in reads:
            got = f.pread(off, n)
            assert type(got) is bytes and got == DATA[off:off + n]
            f.seek(off)
            assert f.read(n) == DATA[off:off + n]  # read moves the position: the next may be sequential


def test_readers_in_threads_get_exact_bytes(pushed):
    errors = []

    def reader(seed):
        rng = random.Random(seed)
        try:
            with pushed.open("cdc://d/f.bin") as f:
                for _ in range(12):
                    off, n = rng.randrange(len(DATA)), rng.choice([100, 70_000, 2 * MiB, len(DATA)])
                    assert f.pread(off, n) == DATA[off:off + n]
                assert _read_all(f, 3 * MiB) == DATA
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)


# -- damage -------------------------------------------------------------------------------------------

def _rows(store_root, codec=None):
    with sqlite3.connect(os.path.join(store_root, "index.sqlite")) as c:
        q = "SELECT id, pack, offset, stored_len, raw_len, codec FROM chunks"
        return [r for r in c.execute(q) if codec is None or r[5] == codec]


def _flip(store_root, pack, at):
    flip_byte(pack_file(store_root, pack), at)


@pytest.fixture
def fresh(tmp_path):
    s = Store.init(str(tmp_path / "store"))
    _push(s, tmp_path, DATA, max_pack_bytes=1_500_000)
    yield s
    s.close()


def _file_offset_of(s: Store, chunk_id: bytes) -> int:
    with s.open("cdc://d/f.bin") as f:
        m = f._m
    return m.chunk_start(m.chunk_ids.index(chunk_id))


READS = {
    "read(8 MiB) to the end": lambda f, at: _read_all(f, 8 * MiB),
    "read()": lambda f, at: f.read(),
    "large pread around it": lambda f, at: f.pread(max(0, at - MiB), 2 * MiB + 5),
    "small read inside it": lambda f, at: f.pread(at + 10, 100),
    "sequential 1 MiB reads": lambda f, at: _read_all(f, MiB),
    "sequential 64 KiB reads (the window)": lambda f, at: _read_all(f, 64 * 1024),
    "sequential 16 MiB reads": lambda f, at: _read_all(f, 16 * MiB),
}


@pytest.mark.parametrize("codec", [CODEC_RAW, CODEC_ZSTD])
@pytest.mark.parametrize("how", list(READS))
def test_a_damaged_byte_is_caught_on_every_path(fresh, codec, how):
    rows = [r for r in _rows(fresh.location, codec) if r[3] > 100]
    cid, pack, off, slen, _, _ = rows[len(rows) // 2]
    at = _file_offset_of(fresh, cid)
    _flip(fresh.location, pack, off + slen // 2)
    with fresh.open("cdc://d/f.bin") as f:
        with pytest.raises(CorruptionError, match=f"chunk {cid.hex()} does not (match|decompress)"):
            READS[how](f, at)
    assert cid not in {r[0] for r in _rows(fresh.location)}  # counted absent: a push stores it again


def test_a_truncated_pack_is_an_error_not_short_bytes(fresh):
    rows = _rows(fresh.location)
    pack = max({r[1] for r in rows}, key=lambda p: sum(r[3] for r in rows if r[1] == p))
    path = os.path.join(fresh.location, "packs", pack[:2], pack + ".pack")
    os.truncate(path, os.path.getsize(path) // 2)
    for how in ("read(8 MiB) to the end", "read()", "sequential 1 MiB reads"):
        with fresh.open("cdc://d/f.bin") as f:
            with pytest.raises(CorruptionError, match=f"pack {pack}"):
                READS[how](f, 0)


# -- a read racing gc ---------------------------------------------------------------------------------

def test_a_read_racing_a_repack_reads_exact_bytes(tmp_path):
    """A reader that located its file before gc moved the chunks (a repack in another
    process: another LocalStore) still reads the file exactly."""
    old = golden_input(2_500_000)
    keep = b"".join(old[i:i + 250_000] if (i // 250_000) % 2 == 0 else random.Random(i).randbytes(250_000)
                    for i in range(0, len(old), 250_000))  # half the old chunks stay live, interleaved
    s = Store.init(str(tmp_path / "store"))
    try:
        _push(s, tmp_path, old, "cdc://d@exp/f.bin", max_pack_chunks=12)
        _push(s, tmp_path, keep, "cdc://d/f.bin", max_pack_chunks=12)
        s.delete_branch("d", "exp")
        with s.open("cdc://d/f.bin") as f:
            assert f.read(1000) == keep[:1000]  # located the whole file, opened its first pack
            r = Store(s.location).gc(grace=0, repack_dead=0.2)
            assert r["repack_packs"] >= 2  # live chunks were moved to new packs
            assert f.read(2 * MiB) == keep[1000:1000 + 2 * MiB]
            assert f.read() == keep[1000 + 2 * MiB:]
        with s.open("cdc://d/f.bin") as f:
            assert f.read() == keep
        assert Store(s.location).check(read_data=True)["problems"] == []
    finally:
        s.close()


# -- locating -----------------------------------------------------------------------------------------

def test_a_file_is_located_once_and_again_only_when_the_index_changed(tmp_path, monkeypatch):
    """One batched lookup per file (not per chunk or per read); a file opened again while
    the index is unchanged needs none; a change by another process (a push) is noticed."""
    s = Store.init(str(tmp_path / "store"))
    try:
        _push(s, tmp_path, DATA)
        calls = []
        real = s.backend.locate
        monkeypatch.setattr(s.backend, "locate", lambda ids, repo=None: calls.append(len(list(ids))) or real(ids, repo))
        with s.open("cdc://d/f.bin") as f:
            assert _read_all(f, MiB) == DATA and f.read(10) == b""
        assert len(calls) == 1
        with s.open("cdc://d/f.bin") as f:
            assert f.read() == DATA
        assert len(calls) == 1
        other = Store(s.location)  # another writer: its own index connection
        (tmp_path / "g.bin").write_bytes(b"another file")
        other.push([str(tmp_path / "g.bin")], "cdc://d/g.bin")
        other.close()
        with s.open("cdc://d/f.bin") as f:
            assert f.read() == DATA
        assert len(calls) == 2
    finally:
        s.close()


def test_readers_in_threads_while_gc_repacks(tmp_path):
    """Readers open and read the file again and again while another store object repacks
    the packs under them: every read is exact, none fails."""
    old = golden_input(2_500_000)
    keep = b"".join(old[i:i + 250_000] if (i // 250_000) % 2 == 0 else random.Random(i).randbytes(250_000)
                    for i in range(0, len(old), 250_000))
    s = Store.init(str(tmp_path / "store"))
    stop, errors, reads = threading.Event(), [], []

    def reader(k):
        try:
            while not stop.is_set():
                with s.open("cdc://d/f.bin") as f:
                    assert (f.read() if k % 2 else _read_all(f, 300_000)) == keep
                reads.append(k)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    try:
        _push(s, tmp_path, old, "cdc://d@exp/f.bin", max_pack_chunks=12)
        _push(s, tmp_path, keep, "cdc://d/f.bin", max_pack_chunks=12)
        s.delete_branch("d", "exp")
        threads = [threading.Thread(target=reader, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        r = Store(s.location).gc(grace=0, repack_dead=0.2)
        stop.set()
        for t in threads:
            t.join(60)
        assert r["repack_packs"] >= 2 and not errors and reads
    finally:
        stop.set()
        s.close()


# -- planning (pure) ----------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(layout=st.lists(st.tuples(st.sampled_from(["p", "q"]), st.integers(1, 50), st.booleans(), st.booleans()),
                       min_size=1, max_size=40))
def test_file_runs_cover_the_file_with_reads_that_match_the_pack(layout):
    """Each chunk is in exactly one run, in file order; a run of raw chunks is one contiguous
    range of one pack whose bytes are exactly the chunks', in order; a compressed chunk stands alone."""
    from cdcstore.core.pack import PackEntry
    from cdcstore.core.ranges import file_runs
    ends = {"p": 16, "q": 16}
    ids, locs = [], {}
    for k, (pack, n, zstd, gap) in enumerate(layout):
        cid = k.to_bytes(16, "little")
        ends[pack] += 7 if gap else 0  # a hole in the pack breaks a run
        stored = max(1, n // 2) if zstd else n
        locs[cid] = (pack, PackEntry(cid, ends[pack], stored, n, CODEC_ZSTD if zstd else CODEC_RAW))
        ends[pack] += stored
        ids.append(cid)
    runs = file_runs(ids, locs)
    assert [i for r in runs for i in range(r.first, r.stop)] == list(range(len(ids)))
    for r in runs:
        pack, first = locs[ids[r.first]]
        assert r.pack == pack and r.offset == first.offset
        if r.entry is not None:
            assert r.stop == r.first + 1 and r.entry == first and first.codec == CODEC_ZSTD
            continue
        at = r.offset
        for i in range(r.first, r.stop):
            p, e = locs[ids[i]]
            assert p == r.pack and e.offset == at and e.codec == CODEC_RAW and e.stored_len == e.raw_len
            at += e.stored_len
    for a, b in zip(runs, runs[1:]):  # runs are as long as they can be: each boundary is a real break
        if a.entry is None and b.entry is None:
            last, nxt = locs[ids[a.stop - 1]], locs[ids[b.first]]
            assert last[0] != nxt[0] or last[1].offset + last[1].stored_len != nxt[1].offset

"""The native read run (`core/_xxh3.c`): XXH3-64 equal to the `xxhash` package at every length
class, a run read and checked chunk by chunk (a flipped byte names its chunk, a short file is
-2, bad arguments are errors), and the window filled ahead on another thread: exact bytes, and
damage met there surfaces when the reader reaches it, never as wrong bytes."""
import os
import random

import pytest
import xxhash

from cdcstore import CorruptionError, Store
from cdcstore.core import _xxh3
from cdcstore.core.chunker import ChunkParams
from cdcstore.engine.ingest import IngestOptions
from cdcstore.storage import window
from conftest import flip_byte, golden_input, pack_file

# every branch of the algorithm: 0, 1-3, 4-8, 9-16, 17-128, 129-240, and long inputs (one block
# is 1,024 bytes; the last stripe and partial blocks)
LENGTHS = [*range(0, 260), 1023, 1024, 1025, 1087, 1088, 1089, 2048, 4096 + 63, 65536, 1_000_003]


@pytest.mark.parametrize("n", LENGTHS)
def test_xxh3_equals_the_xxhash_package(n):
    data = random.Random(n).randbytes(n)
    assert _xxh3.xxh3_64(data) == xxhash.xxh3_64_intdigest(data)
    assert _xxh3.xxh3_64(memoryview(bytearray(data))) == xxhash.xxh3_64_intdigest(data)


def _run_file(tmp_path, lengths):
    data = random.Random(7).randbytes(sum(lengths))
    path = tmp_path / "pack"
    path.write_bytes(b"H" * 100 + data)
    checks, at = [], 0
    for n in lengths:
        checks.append(xxhash.xxh3_64_intdigest(data[at:at + n]))
        at += n
    return path, data, checks


def test_read_run_reads_exact_bytes_and_names_the_damaged_chunk(tmp_path):
    lengths = [70_000, 5, 300_000, 1, 0, 64 * 1024, 1_000_000]
    path, data, checks = _run_file(tmp_path, lengths)
    fd = os.open(path, os.O_RDONLY)
    try:
        out = bytearray(len(data))
        assert _xxh3.read_run(fd, 100, out, lengths, checks) == -1 and out == data
        assert _xxh3.first_mismatch(out, lengths, checks) == -1
        for k in (0, 2, 6):  # a byte flipped in chunk k: k is named, whichever read group holds it
            bad = bytearray(data)
            bad[sum(lengths[:k]) + lengths[k] // 2] ^= 0x40
            path.write_bytes(b"H" * 100 + bad)
            assert _xxh3.read_run(fd, 100, bytearray(len(data)), lengths, checks) == k
            assert _xxh3.first_mismatch(bad, lengths, checks) == k
        path.write_bytes(b"H" * 100 + data[:-10])  # the pack ends first
        assert _xxh3.read_run(fd, 100, bytearray(len(data)), lengths, checks) == -2
        with pytest.raises(ValueError, match="do not add up"):
            _xxh3.read_run(fd, 100, bytearray(len(data) + 1), lengths, checks)
        with pytest.raises(ValueError, match="differ in length"):
            _xxh3.read_run(fd, 100, out, lengths, checks[:-1])
        with pytest.raises(TypeError):
            _xxh3.read_run(fd, 100, bytes(len(data)), lengths, checks)  # not writable
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        _xxh3.read_run(fd, 0, bytearray(5), [5], [0])  # a closed descriptor


PARAMS = ChunkParams(16384, 65536, 262144)
DATA = golden_input(6_000_000) + b"z" * 300_000 + golden_input(3_000_000)[::-1]


@pytest.fixture
def small_windows(tmp_path, monkeypatch):
    """A store whose readers use 256 KiB windows: a file of 9 MB takes ~36 of them."""
    monkeypatch.setattr(window, "WINDOW", 256 * 1024)
    s = Store.init(str(tmp_path / "store"))
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    s.push([str(src)], "cdc://d/f.bin", options=IngestOptions(params=PARAMS, max_pack_bytes=2_000_000))
    yield s
    s.close()


@pytest.mark.parametrize("piece", [4097, 65536, 200_000])
def test_windows_filled_ahead_give_exact_bytes(small_windows, piece):
    with small_windows.open("cdc://d/f.bin") as f:
        got = []
        while b := f.read(piece):
            got.append(b)
        assert b"".join(got) == DATA
        f.seek(0)
        buf = bytearray(piece)
        out = bytearray()
        while n := f.readinto(buf):
            out += buf[:n]
        assert out == DATA


def test_damage_in_a_window_filled_ahead_surfaces_when_reached(small_windows):
    with small_windows.open("cdc://d/f.bin") as f:
        m = f._m
    i = len(m.lengths) * 2 // 3  # a chunk well past the first windows
    start = m.chunk_start(i)
    import sqlite3
    with sqlite3.connect(os.path.join(small_windows.location, "index.sqlite")) as c:
        pack, off, slen = c.execute("SELECT pack, offset, stored_len FROM chunks WHERE id = ?",
                                    (m.chunk_ids[i],)).fetchone()
    flip_byte(pack_file(small_windows.location, pack), off + slen // 2, 1)
    with small_windows.open("cdc://d/f.bin") as f:
        got = bytearray()
        with pytest.raises(CorruptionError, match=m.chunk_ids[i].hex()):
            while b := f.read(65536):
                got += b
        assert len(got) <= start and got == DATA[:len(got)]  # nothing past the damage, nothing wrong


def test_a_reader_is_freed_without_the_cycle_collector(small_windows):
    """The window holds no reference back to its reader: a server opens a reader per request,
    and readers kept alive until a collection held their plans (peak RSS 656 MiB, not < 400, in
    tests/test_one_read_core.py's huge manifests)."""
    import gc
    import weakref
    gc.disable()
    try:
        f = small_windows.open("cdc://d/f.bin")
        assert len(f.read(65536)) == 65536 and len(f.read(65536)) == 65536  # the window is in use
        f.close()
        ref = weakref.ref(f)
        del f
        assert ref() is None
    finally:
        gc.enable()


def _filler_runs(tmp_path, sizes):
    """Runs of chunks of `sizes` (a list of lists) in one file, and where each lands in one buffer."""
    rng = random.Random(11)
    runs_data = [[rng.randbytes(n) for n in run] for run in sizes]
    path = tmp_path / "packs"
    blob, runs, at = bytearray(b"P" * 37), [], 0
    for chunks in runs_data:
        offset = len(blob)
        blob += b"".join(chunks)
        blob += b"gap"
        runs.append((offset, at, [len(c) for c in chunks], [xxhash.xxh3_64_intdigest(c) for c in chunks]))
        at += sum(len(c) for c in chunks) + 5  # runs land apart: the bytes between are never written
    path.write_bytes(bytes(blob))
    want = bytearray(b"\xee" * at)
    for (offset, dest, lengths, _), chunks in zip(runs, runs_data):
        want[dest:dest + sum(lengths)] = b"".join(chunks)
    return path, runs, want


@pytest.mark.parametrize("spin_us", [0, 500])
def test_filler_lands_runs_exactly_and_names_damage(tmp_path, spin_us):
    sizes = [[70_000, 5, 300_000, 1, 0, 65536], [1_000_000], [200_000] * 9, [3]]
    path, runs, want = _filler_runs(tmp_path, sizes)
    fd = os.open(path, os.O_RDONLY)
    f = _xxh3.Filler(spin_us)
    try:
        job = [(fd, off, at, lens, checks) for off, at, lens, checks in runs]
        for _ in range(3):  # the thread is reused job after job
            out = bytearray(b"\xee" * len(want))
            f.start(out, job)
            assert f.busy
            with pytest.raises(RuntimeError):
                f.start(out, job)  # one job at a time
            assert f.wait() is None and out == want and not f.busy
        blob = bytearray(path.read_bytes())
        for r, k in ((0, 2), (1, 0), (2, 8), (3, 0)):  # a byte flipped in chunk k of run r: named
            off, _, lens, _ = runs[r]
            bad = bytearray(blob)
            bad[off + sum(lens[:k]) + lens[k] // 2] ^= 0x08
            path.write_bytes(bytes(bad))
            f.start(bytearray(len(want)), job)
            assert f.wait() == (r, k)
        path.write_bytes(bytes(blob[:runs[3][0] + 1]))  # the file ends inside the last run
        f.start(bytearray(len(want)), job)
        assert f.wait() == (3, -2)
        with pytest.raises(ValueError, match="does not fit"):
            f.start(bytearray(10), job)
        with pytest.raises(RuntimeError):
            f.wait()  # nothing started
        f.start(bytearray(len(want)), [])
        assert f.wait() is None  # an empty job
        with pytest.raises(OSError):
            f.start(bytearray(5), [(12345, 0, 0, [5], [0])])  # not a descriptor
        f.start(bytearray(len(want)), job)
        f.close()  # waits for the job: the buffer is never written after close returns
        assert not f.busy
    finally:
        f.close()
        os.close(fd)


def test_the_portable_hash_path_equals_the_vector_one():
    """The AVX2 path is chosen at import; the portable one must give the same checksums."""
    was = _xxh3._vector(False)
    try:
        for n in (241, 1024, 1025, 4096 + 63, 65536, 1_000_003):
            d = random.Random(n).randbytes(n)
            assert _xxh3.xxh3_64(d) == xxhash.xxh3_64_intdigest(d), n
    finally:
        _xxh3._vector(was)


def test_a_window_filled_natively_reads_on_after_a_fork(small_windows):
    """The filler's thread stays in the parent: a forked child (a DataLoader worker) reading on
    through the same reader gets exact bytes, as does the parent."""
    with small_windows.open("cdc://d/f.bin") as f:
        head = f.read(65536) + f.read(65536)
        assert f._win._filler is not None and f._win._filler.busy  # a fill is under way at the fork
        pid = os.fork()
        if pid == 0:  # the child: exit status tells
            ok = False
            try:
                rest = b"".join(iter(lambda: f.read(65536), b""))
                ok = head + rest == DATA
            finally:
                os._exit(0 if ok else 1)
        rest = b"".join(iter(lambda: f.read(65536), b""))
        assert head + rest == DATA
        assert os.waitpid(pid, 0)[1] == 0

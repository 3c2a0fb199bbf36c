"""The file object behaves like a plain file (property tests against bytes)."""
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cdcstore import Store
from cdcstore.core.chunker import ChunkParams
from cdcstore.engine.ingest import IngestOptions
from conftest import golden_input

DATA = golden_input(700_000) + b"z" * 50_000 + golden_input(123_457)[::-1]


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    root = tmp_path_factory.mktemp("reader")
    src = root / "f.bin"
    src.write_bytes(DATA)
    s = Store.init(str(root / "store"))
    s.push([str(src)], "cdc://r/f.bin", options=IngestOptions(params=ChunkParams(1024, 8192, 32768)))
    yield s
    s.close()


ops = st.lists(st.tuples(st.sampled_from(["seek_set", "seek_cur", "seek_end", "read", "readinto", "pread"]),
                         st.integers(-900_000, 900_000), st.integers(-1, 300_000)), max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops)
def test_random_seeks_and_reads_match_a_plain_file(pushed, ops):
    plain = io.BytesIO(DATA)
    with pushed.open("cdc://r/f.bin") as f:
        for op, a, b in ops:
            if op.startswith("seek"):
                whence = {"seek_set": 0, "seek_cur": 1, "seek_end": 2}[op]
                target = {0: a, 1: plain.tell() + a, 2: len(DATA) + a}[whence]
                if target < 0:
                    with pytest.raises(OSError):
                        f.seek(a, whence)
                    continue
                assert f.seek(a, whence) == plain.seek(a, whence)
            elif op == "read":
                assert f.read(b) == plain.read(b)
            elif op == "readinto":
                n = max(b, 0)
                x, y = bytearray(n), bytearray(n)
                assert f.readinto(x) == plain.readinto(y)
                assert x == y
            else:
                start = abs(a)
                assert f.pread(start, max(b, 0)) == DATA[start:start + max(b, 0)]
            assert f.tell() == plain.tell()


def test_full_read_and_buffered_wrapper(pushed):
    with pushed.open("cdc://r/f.bin") as f:
        assert f.read() == DATA
        assert f.read() == b""
        assert f.size == len(DATA)
    with io.BufferedReader(pushed.open("cdc://r/f.bin")) as f:
        assert f.read(10) == DATA[:10]
        assert f.read() == DATA[10:]


def test_pyarrow_reads_a_column_through_the_file_object(tmp_path):
    table = pa.table({"a": list(range(100_000)), "b": [f"row {i}" for i in range(100_000)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=20_000)
    s = Store.init(str(tmp_path / "store"))
    s.push([str(tmp_path / "t.parquet")], "cdc://r/t.parquet")
    with s.open("cdc://r/t.parquet") as f:
        got = pq.read_table(f, columns=["b"])
    assert got.column("b").equals(table.column("b"))
    with s.open("cdc://r/t.parquet") as f:
        assert pq.ParquetFile(f).metadata.num_row_groups == 5


def test_read_across_a_chunk_the_cache_is_about_to_evict(pushed):
    cid, commit = pushed.resolve("cdc://r/")
    m = pushed.manifest("r", commit.files["f.bin"].manifest)
    with pushed.reader("r", m, cache_chunks=4) as f:
        starts = [m.chunk_start(i) for i in range(len(m.lengths))]
        for i in range(1, 5):  # cache chunks 1..4, chunk 1 oldest
            assert f.pread(starts[i] + 1, 10) == DATA[starts[i] + 1:starts[i] + 11]
        assert f.pread(starts[1] - 100, 200) == DATA[starts[1] - 100:starts[1] + 100]
        assert f.pread(0, len(DATA)) == DATA


def _hammer(f, data: bytes, threads: int = 8, reads: int = 150) -> list:
    """`threads` threads reading one file object at once: sequential runs (read-ahead) and random
    preads; returns what went wrong."""
    import random
    import threading

    errors = []

    def run(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(reads):
                off = rng.randrange(len(data))
                n = rng.choice([1, 4096, 65536, 300_000])
                if f.pread(off, n) != data[off:off + n]:
                    errors.append(("bytes differ", off, n))
        except Exception as e:  # noqa: BLE001 - the test reports every kind
            errors.append(repr(e))

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


def test_one_file_object_read_by_many_threads_at_once(pushed, server, tmp_path):
    """duckdb reads one handle from several threads: every read is exact, local and remote, with
    read-ahead in flight (before, a race on the read-ahead table raised KeyError)."""
    with pushed.open("cdc://r/f.bin") as f:
        assert _hammer(f, DATA) == []
    (tmp_path / "f.bin").write_bytes(DATA)
    with Store(server.url, cache=str(tmp_path / "c.sqlite")) as s:
        s.push([str(tmp_path / "f.bin")], "cdc://r/f.bin", options=IngestOptions(params=ChunkParams(1024, 8192, 32768)))
        with s.open("cdc://r/f.bin") as f:
            assert _hammer(f, DATA) == []


def test_duckdb_with_threads_reads_files_through_cdc(tmp_path):
    import duckdb
    from cdcstore.fs import CdcFileSystem

    folder = tmp_path / "t"
    folder.mkdir()
    for i in range(4):
        pq.write_table(pa.table({"id": pa.array(range(i * 100_000, (i + 1) * 100_000)),
                                 "v": pa.array([float(x) for x in range(100_000)])}),
                       folder / f"p{i}.parquet", row_group_size=20_000)
    s = Store.init(str(tmp_path / "store"))
    s.push([str(folder)], "cdc://d/", message="v1")
    con = duckdb.connect()
    con.execute("SET threads TO 4")
    con.register_filesystem(CdcFileSystem(store=str(tmp_path / "store")))
    got = con.execute("SELECT count(*), sum(id) FROM read_parquet('cdc://d/*.parquet')").fetchone()
    assert got == (400_000, sum(range(400_000)))

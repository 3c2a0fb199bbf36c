"""Inputs that lie (issue 19): Parquet footers that claim rows their pages do not hold, manifests
whose chunk lengths are not their chunks', Parquet files of countless tiny pages, TAR shards streamed
past the prefetch budget. Each gets a clear error (naming the file) or stays within its bound."""
import io
import os
import struct
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.core import ids
from cdcstore.core.commit import Commit, FileEntry
from cdcstore.core.errors import CorruptionError
from cdcstore.core.manifest import Manifest
from cdcstore.core.thrift import I16, I32, I64, LIST, SET, Decoder
from cdcstore.streaming.dataset import StreamingDataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- Parquet footers that lie ----------------------------------------------------------------------

class Spans(Decoder):
    """A footer decoder that notes where each integer field's bytes are, by path of field ids and
    list indices: (3,) FileMetaData.num_rows, (4, k, 3) row group k's num_rows,
    (4, k, 1, j, 3, 5) its column j's num_values."""

    def __init__(self, buf):
        super().__init__(buf)
        self.path, self.spans = [], {}

    def struct(self, depth=0):
        out, last = {}, 0
        while True:
            head = self.byte()
            t = head & 0x0F
            if t == 0:
                return out
            fid = last + (head >> 4) if head >> 4 else self.zigzag()
            last = fid
            self.path.append(fid)
            start = self.pos
            out[fid] = self.value(t, depth)
            if t in (I16, I32, I64):
                self.spans[tuple(self.path)] = (start, self.pos)
            self.path.pop()

    def value(self, t, depth=0):
        if t in (LIST, SET):
            head = self.byte()
            size, et = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            out = []
            for k in range(size):
                self.path.append(k)
                out.append(self.value(et, depth + 1))
                self.path.pop()
            return out
        return super().value(t, depth)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def patch_footer(data: bytes, changes: dict) -> bytes:
    """A Parquet file whose footer's integer fields at `changes`' paths hold the given values."""
    n = struct.unpack("<I", data[-8:-4])[0]
    footer = data[-8 - n:-8]
    d = Spans(footer)
    d.struct()
    out, pos = bytearray(), 0
    for path in sorted(changes, key=lambda p: d.spans[p]):
        a, b = d.spans[path]
        v = changes[path]
        out += footer[pos:a] + _varint(((v << 1) ^ (v >> 63)) & (2**64 - 1))
        pos = b
    out += footer[pos:]
    return data[:-8 - n] + bytes(out) + struct.pack("<I", len(out)) + b"PAR1"


def _lying_parquet(store, tmp_path, claim: int, name: str = "x.parquet", num_values: bool = True) -> str:
    """Push a 1,000-row file (two row groups of 500) whose footer says row group 0 has `claim` rows
    (and, with `num_values`, that its columns hold as many values); its cdc:// address."""
    t = pa.table({"a": list(range(1000)), "b": [str(i) for i in range(1000)]})
    buf = io.BytesIO()
    pq.write_table(t, buf, row_group_size=500)
    changes = {(3,): claim + 500, (4, 0, 3): claim}
    if num_values:
        changes |= {(4, 0, 1, 0, 3, 5): max(claim, 0), (4, 0, 1, 1, 3, 5): max(claim, 0)}
    src = tmp_path / "pq"
    src.mkdir(exist_ok=True)
    (src / name).write_bytes(patch_footer(buf.getvalue(), changes))
    store.push([str(src / name)], f"cdc://r/{name}")
    return f"cdc://r/{name}"


def _stream_all(store, addr, **kw) -> list:
    return [row["a"] for row in StreamingDataset(addr, store=store, **kw)]


@pytest.mark.parametrize("claim,num_values", [(10_001, True), (10_001, False), (1 << 26, True), (-5, False),
                                              (0, False), (499, True)])
def test_a_footer_that_lies_about_row_counts_is_a_clear_error(store, tmp_path, claim, num_values):
    """Old: 10,001 claimed rows with shuffle gave a duplicated row, 2^26 spent 22.7 s on phantom rows,
    -5 gave 0 rows and no error."""
    addr = _lying_parquet(store, tmp_path, claim, num_values=num_values)
    t0 = time.monotonic()
    with pytest.raises(CorruptionError, match="x.parquet.*row"):
        _stream_all(store, addr, shuffle=True, seed=1, shuffle_buffer=100)
    assert time.monotonic() - t0 < 5


def test_an_honest_file_streams_every_row_once(store, tmp_path):
    addr = _lying_parquet(store, tmp_path, 500)  # the truth
    rows = _stream_all(store, addr, shuffle=True, seed=1, shuffle_buffer=100)
    assert sorted(rows) == list(range(1000))


def test_a_footer_claiming_2_to_the_40_rows_is_refused_before_anything_is_allocated(store, tmp_path):
    """Old: 23.6 GB and an OOM kill. Run under a 3 GiB address-space limit, so that the old code
    fails fast instead of taking the machine's memory."""
    addr = _lying_parquet(store, tmp_path, 1 << 40)
    script = ("import resource, sys\n"
              "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
              "from cdcstore import Store\nfrom cdcstore.streaming.dataset import StreamingDataset\n"
              "from cdcstore.core.errors import CorruptionError\n"
              "try:\n"
              "    for _ in StreamingDataset(sys.argv[2], store=Store(sys.argv[1]), batch_size=100): pass\n"
              "except CorruptionError as e:\n"
              "    print('CorruptionError', e)\n")
    p = subprocess.run([sys.executable, "-c", script, store.location, addr], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert p.stdout.startswith("CorruptionError") and "x.parquet" in p.stdout, (p.returncode, p.stdout, p.stderr[-800:])


# -- a manifest that lies about its chunks' lengths ----------------------------------------------

def _forge(store: Store, lengths, chunk_ids, size: int, path: str = "forged.bin") -> None:
    """Commit (on branch main of repo r) a file whose manifest lists `chunk_ids` with `lengths`."""
    b = store.backend
    m = Manifest(list(chunk_ids), list(lengths), size, ids.weak_hasher().digest())
    name = b.put_manifests([m])[0]
    head = b.resolve_ref("r", "main")[0]
    parent = b.get_commit("r", head)
    files = dict(b.view("r", parent).files())
    files[path] = FileEntry(name, size)
    b.commit(Commit("r", head, "forged", time.time(), files), "main", head)


@pytest.fixture
def small_chunk(store, tmp_path):
    """A store holding one 300-byte file (one chunk); its chunk id."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "small.bin").write_bytes(os.urandom(300))
    store.push([str(src)], "cdc://r/")
    _, c = store.resolve("cdc://r/small.bin")
    entry = store.backend.view("r", c).get("small.bin")
    return store.backend.get_manifest(entry.manifest, "r").chunk_ids[0]


def test_a_manifest_listing_a_chunk_longer_than_it_is_fails_the_read(store, small_chunk, tmp_path):
    """Old: `cat` exited 0 with 300 of 2,005 bytes."""
    _forge(store, [2005], [small_chunk], 2005)
    with pytest.raises(CorruptionError, match="forged.bin"):
        store.cat("cdc://r/forged.bin")
    with pytest.raises(CorruptionError):
        with store.open("cdc://r/forged.bin") as f:
            f.read(100)
    with pytest.raises(CorruptionError, match="forged.bin"):
        store.pull("cdc://r/forged.bin", str(tmp_path / "out.bin"))
    assert not (tmp_path / "out.bin").exists()
    p = subprocess.run([sys.executable, "-m", "cdcstore", "cat", "cdc://r/forged.bin", "--store", store.location],
                       capture_output=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    assert p.returncode == 1 and len(p.stdout) < 2005, (p.returncode, len(p.stdout))
    assert len(p.stderr.decode().strip().splitlines()) == 1, p.stderr


def test_a_manifest_listing_a_chunk_shorter_than_it_is_fails_the_read(store, small_chunk):
    _forge(store, [100, 300], [small_chunk, small_chunk], 400)
    with pytest.raises(CorruptionError, match="forged.bin"):
        store.cat("cdc://r/forged.bin")


def test_a_served_manifest_that_lies_about_lengths_fails_the_read(server, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "small.bin").write_bytes(os.urandom(300))
    with Store(server.url, cache=False) as s:
        s.push([str(src)], "cdc://r/")
        _, c = s.resolve("cdc://r/small.bin")
        chunk = s.backend.get_manifest(s.backend.view("r", c).get("small.bin").manifest, "r").chunk_ids[0]
        _forge(s, [2005], [chunk], 2005)
    with Store(server.url, cache=False) as s:
        with pytest.raises(CorruptionError, match="forged.bin"):
            s.cat("cdc://r/forged.bin")


@pytest.mark.parametrize("lengths,size,what", [([0, 10], 10, "empty chunk"),
                                               ([1 << 31, 10], (1 << 31) + 10, "over the format's limit")])
def test_manifest_entries_are_validated_when_decoded(lengths, size, what):
    m = Manifest([b"\1" * 32, b"\2" * 32], lengths, size, b"\0" * 16)
    with pytest.raises(CorruptionError, match=what):
        Manifest.decode(m.encode(), "manifest x")


# -- TAR streaming within prefetch_bytes ---------------------------------------------------------

def test_tar_streaming_holds_about_prefetch_bytes(store, tmp_path):
    """A shard of 240 samples of 100 KB (24 MB) streamed with prefetch_bytes = 1 MiB: what the
    stream holds stays near 1 MiB (old: a whole step of 1,024 positions at once, 216 MB for 16 MiB
    asked in the report). Measured: 46.6 MiB before, 6.6 MiB after (the readers' chunk LRU included)."""
    import tarfile
    import tracemalloc

    src = tmp_path / "tar"
    src.mkdir()
    with tarfile.open(src / "shard-0.tar", "w", format=tarfile.GNU_FORMAT) as t:
        for i in range(240):
            for ext, data in (("jpg", os.urandom(100_000)), ("cls", b"%d" % i)):
                info = tarfile.TarInfo(f"s{i:05d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    store.push([str(src)], "cdc://t/")
    ds = StreamingDataset("cdc://t/", store=store, prefetch_bytes=1 << 20, batch_size=4, decode=False)
    tracemalloc.start()
    try:
        seen = 0
        for batch in ds:
            seen += len(batch["__key__"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == 240
    assert peak < 12 << 20, f"the stream held {peak / 2**20:.1f} MiB for prefetch_bytes = 1 MiB"


# -- Parquet files of countless tiny pages ---------------------------------------------------------

def _tiny_pages_parquet(path, rows: int = 30_000) -> None:
    """A valid Parquet file whose every page is one row (a few bytes)."""
    t = pa.table({"a": pa.array(range(rows), pa.int32())})
    pq.write_table(t, path, data_page_size=1, write_batch_size=1, compression="none", use_dictionary=False,
                   write_statistics=False, row_group_size=rows)


def test_a_parquet_file_of_tiny_pages_gets_a_bounded_number_of_chunks(store, tmp_path):
    """Old: a 7 MB file of one-row pages became 1,000,002 chunks (10.5 s, 385 MB on push).
    Revision 3 thinned its cut points to one per MIN_CUT_SPACING bytes; revision 4 (page groups)
    groups its pages like any other file's: chunks near the target size, within the bound."""
    from cdcstore.core import pages
    from cdcstore.core.chunker import DEFAULT_PARAMS
    from cdcstore.core.manifest import max_chunks

    path = tmp_path / "tiny" / "t.parquet"
    path.parent.mkdir()
    _tiny_pages_parquet(path)
    size = path.stat().st_size
    cuts = pages.page_cuts(str(path))
    assert cuts is not None and len(cuts) <= size // DEFAULT_PARAMS.min_size + 4
    starts = pages.page_starts(str(path))  # revision 3 thins them
    assert starts is not None and len(starts) <= size // pages.MIN_CUT_SPACING + pages.CUT_ALLOWANCE + 1
    assert all(b - a >= pages.MIN_CUT_SPACING for a, b in zip(starts[1:], starts[2:]))
    t0 = time.monotonic()
    r = store.push([str(path.parent)], "cdc://r/")
    assert time.monotonic() - t0 < 20
    _, c = store.resolve("cdc://r/t.parquet")
    m = store.backend.get_manifest(store.backend.view("r", c).get("t.parquet").manifest, "r")
    assert len(m.lengths) <= max_chunks(size), (len(m.lengths), size)
    assert len(m.lengths) < size // 16_000
    assert store.cat("cdc://r/t.parquet") == path.read_bytes()
    assert r.files_detail["t.parquet"]["chunking"] == "parquet-pages"


def test_the_chunk_bound_holds_for_any_bytes_and_the_manifest_limit_follows_from_it():
    from cdcstore.core import pages
    from cdcstore.core.chunker import DEFAULT_PARAMS, Chunker
    from cdcstore.core.manifest import ENTRY, HEADER, MAX_FILE_BYTES, MAX_MANIFEST_BYTES, max_chunks

    assert HEADER.size + ENTRY.size * max_chunks(MAX_FILE_BYTES) <= MAX_MANIFEST_BYTES
    data = os.urandom(1 << 20)
    cuts = pages.thin_cuts(list(range(1, len(data), 7)), len(data))  # a cut every 7 bytes
    ch = Chunker(DEFAULT_PARAMS, cuts)
    n = len(ch.feed(data)) + len(ch.finish())
    assert n <= max_chunks(len(data)), n


def test_a_file_whose_chunks_pass_one_manifest_is_refused_while_chunking(store, tmp_path, monkeypatch):
    """Old: a 23 MiB file failed at a server after 32 s with 413. The limit is checked as chunks
    are made (here a small limit stands for MAX_MANIFEST_BYTES)."""
    from cdcstore.core.errors import InvalidAddressError
    from cdcstore.engine import ingest

    monkeypatch.setattr(ingest, "max_entries", lambda: 10)
    f = tmp_path / "big" / "b.bin"
    f.parent.mkdir()
    f.write_bytes(os.urandom(2 << 20))
    with pytest.raises(InvalidAddressError, match="b.bin.*split the file"):
        store.push([str(f.parent)], "cdc://r/")


@pytest.mark.parametrize("bad", [b"x\xff.bin", b"tab\there.bin", b"line\nbreak.bin", b"del\x7f.bin"])
def test_a_file_name_that_is_not_utf8_or_holds_control_characters_is_refused_at_commit(tmp_path, bad, server):
    """Issue 31, case 7: a committed name with a lone surrogate (a local name whose bytes are not
    UTF-8) broke every gateway listing of its repo and crashed `ls`; control characters broke S3
    clients' XML. Such a name is refused before anything is committed, naming it and the fix,
    locally and through a server; the other files of the folder are not committed either."""
    from cdcstore.core.errors import InvalidAddressError
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.bin").write_bytes(b"good")
    with open(os.path.join(os.fsencode(src), bad), "wb") as f:
        f.write(b"bad")
    for where in (str(tmp_path / "store"), server.url):
        s = Store.init(where) if not where.startswith("http") else Store(where, cache=False)
        with pytest.raises(InvalidAddressError, match="rename the file"):
            s.push([str(src)], "cdc://r/")
        assert not _has_repo(s, "r")  # nothing was committed
        (src / "good.bin").write_bytes(b"good")  # the folder without the bad name pushes
        os.unlink(os.path.join(os.fsencode(src), bad))
        s.push([str(src)], "cdc://r/")
        assert [e["name"] for e in s.ls("cdc://r/")] == ["good.bin"]
        with open(os.path.join(os.fsencode(src), bad), "wb") as f:
            f.write(b"bad")
        s.close()


def _has_repo(s, repo: str) -> bool:
    try:
        s.ls(f"cdc://{repo}/")
        return True
    except Exception:  # noqa: BLE001 - no such repo
        return False


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1]:99999", "http://:8470", "http://a:1,http://[b"])
def test_a_server_address_that_does_not_parse_is_a_clear_error(url):
    """Issue 31, case 8: `--store http://[::1` printed aiohttp's traceback."""
    from cdcstore.core.errors import InvalidAddressError
    with pytest.raises(InvalidAddressError, match="bad server address"):
        Store(url, cache=False).ls("cdc://a/")
    p = subprocess.run([sys.executable, "-m", "cdcstore", "ls", "cdc://a/", "--store", url],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "Traceback" not in p.stderr and "bad server address" in p.stderr, p.stderr

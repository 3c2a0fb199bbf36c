"""Chunk format v3 for tar files: TAR members (docs/format.md, forced cut points revision 5).

The golden files in tests/data/tar were written once by Python's tarfile (a WebDataset-like pax
shard with float mtimes; a GNU shard with long names and one member over the small maximum; a pax
archive with long and non-ASCII names, a directory, a symlink, a hard link and an empty file); their
cut points and chunk ends are the contract. Python's `tarfile` is the reference for the walk: the
expected cuts are derived from its members' `offset_data` and `size`.
"""
import hashlib
import io
import os
import random
import tarfile
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcstore import Store
from cdcstore.core import tar
from cdcstore.core.chunker import DEFAULT_PARAMS, ChunkParams, Chunker
from cdcstore.core.manifest import max_chunks
from cdcstore.engine.ingest import FileChunks, IngestOptions
from cdcstore.streaming import shards
from conftest import flip_byte, pack_file

DATA = os.path.join(os.path.dirname(__file__), "data", "tar")
SMALL = ChunkParams(2048, 8192, 32768)

# name -> (sha256 prefix of the file, chunk ends with the default sizes, chunk ends with SMALL)
GOLDEN = {
    "big-member-gnu.tar": ("827fc422ff29f91e", [44032, 94208, 94720, 112640, 129536, 146432, 153600],
                           [1536, 9728, 11264, 14336, 15872, 23040, 24576, 31232, 35328, 42496, 44032, 54707,
                            68551, 77256, 84889, 94208, 94720, 112640, 113152, 122880, 123392, 129024, 129536,
                            146432, 153600]),
    "pax-long-names.tar": ("05a22e9b8e8b1549", [10240, 50688, 61440],
                           [2048, 7168, 10240, 19116, 27599, 38367, 46856, 50688, 53248, 56320, 61440]),
    "wds-pax.tar": ("a2daf958835fd489", [225280],
                    [3584, 6144, 11776, 18944, 24576, 33792, 39424, 43008, 48640, 50688, 56320, 66560, 72192,
                     74752, 80384, 88064, 93696, 97280, 102912, 104960, 110592, 115712, 121344, 132608, 138240,
                     146432, 152064, 158208, 163840, 170496, 176128, 178688, 184320, 190464, 196096, 202752,
                     208384, 210432, 216064, 222208, 225280]),
}


def reader(data: bytes, calls: list | None = None):
    def read(off: int, n: int) -> bytes:
        assert 0 <= off and n >= 0, (off, n)
        assert off + n <= len(data), f"read past the file: {off}+{n} > {len(data)}"
        if calls is not None:
            calls.append((off, n))
        return data[off:off + n]
    return read


def native_cuts(data: bytes, params: ChunkParams = DEFAULT_PARAMS) -> list[int] | None:
    """`tar.member_cuts_of` (the native walk a push uses) over `data` in a file."""
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        return tar.member_cuts_of(f.fileno(), len(data), params)


def chunk_ends(data: bytes, params: ChunkParams) -> list[int]:
    cuts = tar.member_cuts(reader(data), len(data), params)
    ch = Chunker(params, cuts or (), whole_segments=bool(cuts))
    ends, e = [], 0
    for c in ch.feed(data) + ch.finish():
        e += len(c)
        ends.append(e)
    return ends


def expected_cuts(data: bytes, params: ChunkParams) -> list[int]:
    """The rule, from Python's tarfile: start and end of each data region of >= min bytes."""
    cuts: list[int] = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf.getmembers():
            size = m.size if m.isreg() or m.type not in tarfile.SUPPORTED_TYPES else 0
            end = m.offset_data + -(-size // 512) * 512
            if end - m.offset_data >= params.min_size:
                cuts += [m.offset_data, end]
    return sorted({c for c in cuts if 0 < c < len(data)}) + [len(data)]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_tar_members_cuts_and_chunks(name):
    data = open(os.path.join(DATA, name), "rb").read()
    digest, default_ends, small_ends = GOLDEN[name]
    assert hashlib.sha256(data).hexdigest()[:16] == digest
    assert chunk_ends(data, DEFAULT_PARAMS) == default_ends
    assert chunk_ends(data, SMALL) == small_ends
    for params in (DEFAULT_PARAMS, SMALL):  # the rule, read off tarfile's own walk; the native walk agrees
        assert tar.member_cuts(reader(data), len(data), params) == expected_cuts(data, params)
        assert native_cuts(data, params) == expected_cuts(data, params)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_walk_agrees_with_tarfile(name):
    data = open(os.path.join(DATA, name), "rb").read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        ref = [(m.name, m.offset, m.offset_data) for m in tf.getmembers()]
    got = list(tar.walk(reader(data), len(data)))
    assert [m.name.rstrip("/") for m in got] == [r[0] for r in ref]  # (tarfile drops a folder's slash)
    assert [m.header for m in got] == [r[1] for r in ref]  # pax and GNU records belong to the member after them
    assert [m.data for m in got] == [r[2] for r in ref]


def webdataset_like(path: str, n: int, jpg: int, mtime: float | None = None, change: int = -1) -> bytes:
    """A shard as WebDataset's default TarWriter writes one: pax format, a float mtime in every member."""
    rnd = random.Random(7)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(n):
            body = rnd.randbytes(jpg)
            for ext, b in (("cls", str(i).encode()), ("jpg", b"!" * jpg if i == change else body),
                           ("json", b'{"caption": "a sample"}')):
                ti = tarfile.TarInfo(f"{i:06d}.{ext}")
                ti.size, ti.mtime = len(b), (mtime if mtime is not None else 1.7e9 + random.random())
                tf.addfile(ti, io.BytesIO(b))
    return open(path, "rb").read()


def test_a_rewritten_shard_with_new_mtimes_stores_only_its_headers(store, tmp_path):
    """The issue's case: every header changes (a new float mtime each) and one sample's data: what
    is stored anew is the header regions (compressed: a few hundred bytes each) and that sample."""
    v1 = tmp_path / "v1" / "shard.tar"
    v2 = tmp_path / "v2" / "shard.tar"
    v1.parent.mkdir()
    v2.parent.mkdir()
    webdataset_like(str(v1), 120, 25_000)
    data = webdataset_like(str(v2), 120, 25_000, change=60)
    r1 = store.push([str(v1)], "wds@main/shard.tar")
    assert r1.files_detail["shard.tar"]["chunking"] == "tar-members"
    r2 = store.push([str(v2)], "wds@main/shard.tar")
    size = len(data)
    assert r2.new_bytes < 0.25 * size  # headers and one sample, raw (byte CDC: the whole shard)
    assert r2.stored_bytes < 25_000 + 120 * 600, r2.stored_bytes  # compressed headers and one sample
    with store.open("wds@main/shard.tar") as f:
        assert f.read() == data
    old = Store.init(str(tmp_path / "old"))
    try:  # the same two versions under v2's rule (byte CDC) store nearly everything again
        old.push([str(v1)], "wds@main/shard.tar", options=IngestOptions(tar_members=False))
        r_old = old.push([str(v2)], "wds@main/shard.tar", options=IngestOptions(tar_members=False))
        assert r_old.new_bytes > 0.9 * size
    finally:
        old.close()


def test_a_store_written_under_v2_reads_and_dedups_after_the_upgrade(tmp_path):
    """Manifests list chunks, not rules: a store holding v2 (byte CDC) chunks of a tar file reads it
    back under v3; the first v3 push of it stores its new shape once, and the next dedups fully;
    a file that is not tar is cut exactly as before (dedups at once)."""
    shard = tmp_path / "a" / "shard.tar"
    shard.parent.mkdir()
    data = webdataset_like(str(shard), 40, 20_000, mtime=0)
    other = tmp_path / "a" / "plain.bin"
    other.write_bytes(random.Random(3).randbytes(300_000))
    s = Store.init(str(tmp_path / "s"))
    try:
        r0 = s.push([str(tmp_path / "a") + "/"], "r@main/", options=IngestOptions(tar_members=False))
        assert r0.files_detail["shard.tar"]["chunking"] == "bytes"
        with s.open("r@main/shard.tar") as f:
            assert f.read() == data
        r1 = s.push([str(tmp_path / "a") + "/"], "r@v3/", stat_cache=False)
        assert r1.files_detail["shard.tar"]["chunking"] == "tar-members"
        assert r1.files_detail["plain.bin"]["new_bytes"] == 0
        r2 = s.push([str(tmp_path / "a") + "/"], "r@v3b/", stat_cache=False)
        assert r2.new_bytes == 0
        with s.open("r@v3/shard.tar") as f:
            assert f.read() == data
    finally:
        s.close()


def test_file_chunks_cut_a_tar_file_at_its_members(tmp_path):
    p = tmp_path / "s.tar"
    data = webdataset_like(str(p), 30, 20_000)
    with open(p, "rb") as f:
        fc = FileChunks(f, DEFAULT_PARAMS)
        got = [bytes(c) for _, chunks in fc for c in chunks]
    assert fc.mode == "tar-members"
    assert b"".join(got) == data
    ends = [sum(map(len, got[:i + 1])) for i in range(len(got))]
    assert ends == chunk_ends(data, DEFAULT_PARAMS)
    with open(p, "rb") as f:  # turned off: bytes, as in v2
        assert FileChunks(f, DEFAULT_PARAMS, tar_members=False).mode == "bytes"


def header_with(data: bytes, at: int, field: slice, value: bytes, checksum: bool = True) -> bytes:
    """`data` with the header at `at` given `value` in `field`, its checksum made right again."""
    h = bytearray(data[at:at + 512])
    h[field] = value.ljust(field.stop - field.start, b"\0")[:field.stop - field.start]
    if checksum:
        h[148:156] = b" " * 8
        h[148:156] = b"%06o\0 " % sum(h)
    return data[:at] + bytes(h) + data[at + 512:]


def test_a_pax_size_record_sets_the_member_size():
    """A member over 8 GiB has its size in a pax record (the header's field cannot hold it): the walk
    takes the record's. Built by hand: a pax record `size=40000` before a header whose field says 0."""
    body = random.Random(1).randbytes(40_000)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("big.bin")
        ti.size, ti.pax_headers = len(body), {"size": str(len(body))}
        tf.addfile(ti, io.BytesIO(body))
    data = buf.getvalue()
    real = data.index(b"big.bin", 512) // 512 * 512  # the member's own header, after the pax record
    data = header_with(data, real, slice(124, 136), b"00000000000\0")
    assert tarfile.open(fileobj=io.BytesIO(data)).getmembers()[0].size == 40_000  # tarfile agrees
    [m] = tar.walk(reader(data), len(data))
    assert (m.header, m.data, m.size) == (0, real + 512, 40_000)
    assert tar.member_cuts(reader(data), len(data)) == [real + 512, real + 512 + 40_448, len(data)]


@pytest.mark.parametrize("case", ["size past the file", "negative base-256", "octal garbage", "bad checksum",
                                  "huge pax record", "bad pax length", "cut short"])
def test_a_lying_header_falls_back_to_byte_cdc(case, tmp_path):
    good = open(os.path.join(DATA, "big-member-gnu.tar"), "rb").read()
    members = list(tar.walk(reader(good), len(good)))
    at = members[3].data - 512  # a header in the middle
    bad = {
        "size past the file": lambda: header_with(good, at, slice(124, 136), b"%011o" % (len(good) * 2)),
        "negative base-256": lambda: header_with(good, at, slice(124, 136), b"\xff" * 12),
        "octal garbage": lambda: header_with(good, at, slice(124, 136), b"12x45"),
        "bad checksum": lambda: header_with(good, at, slice(0, 4), b"evil", checksum=False),
        "huge pax record": lambda: header_with(header_with(good, at, slice(156, 157), b"x"), at,
                                               slice(124, 136), b"%011o" % (3 << 20)),
        "bad pax length": lambda: header_with(header_with(good, at, slice(156, 157), b"x"), at,
                                              slice(124, 136), b"%011o" % 100),
        "cut short": lambda: good[:at + 300],
    }[case]()
    calls: list = []
    assert tar.member_cuts(reader(bad, calls), len(bad)) is None
    assert native_cuts(bad) is None
    assert all(n <= max(tar.WINDOW, tar.MAX_RECORD) for _, n in calls)
    p = tmp_path / "bad.tar"
    p.write_bytes(bad)
    with open(p, "rb") as f:
        fc = FileChunks(f, DEFAULT_PARAMS)
        assert b"".join(bytes(c) for _, chunks in fc for c in chunks) == bad
    assert fc.mode == "bytes"
    if case != "cut short":  # the streaming walk names the problem (ShardError)
        with pytest.raises(shards.ShardError):
            shards.scan(reader(bad), len(bad))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzzed_headers_never_read_past_the_file_or_break_the_bytes(data):
    """Any bytes written into any header field (checksum made right, so the walk trusts it enough to
    act on it): the native walk gives exactly the reference's cuts, the cut points stay inside the
    file, the chunks give the file back, the chunk count stays within the format's bound, and no
    read asks for more than a window or a record."""
    good = open(os.path.join(DATA, "pax-long-names.tar"), "rb").read()
    heads = [m.header for m in tar.walk(reader(good), len(good))] + \
        [m.data - 512 for m in tar.walk(reader(good), len(good))]
    at = data.draw(st.sampled_from(sorted(set(heads))))
    start = data.draw(st.integers(0, 500))
    value = data.draw(st.binary(min_size=1, max_size=12))
    bad = header_with(good, at, slice(start, start + len(value)), value, checksum=data.draw(st.booleans()))
    if data.draw(st.booleans()):
        bad = bad[:data.draw(st.integers(0, len(bad)))]
    calls: list = []
    for params in (DEFAULT_PARAMS, SMALL):
        cuts = tar.member_cuts(reader(bad, calls), len(bad), params)
        assert native_cuts(bad, params) == cuts
        if cuts is not None:
            assert cuts == sorted(set(cuts)) and cuts[-1] == len(bad) and all(0 < c for c in cuts)
        ch = Chunker(params, cuts or (), whole_segments=bool(cuts))
        out = ch.feed(bad) + ch.finish()
        assert b"".join(bytes(c) for c in out) == bad
        assert len(out) <= max_chunks(len(bad), params.min_size)
    assert all(n <= max(tar.WINDOW, tar.MAX_RECORD) for _, n in calls)


def pax_record(key: bytes, value: bytes) -> bytes:
    """One well-formed pax record (`LENGTH KEY=VALUE\\n`, LENGTH counting its own digits)."""
    body = len(key) + len(value) + 3
    n = next(body + d for d in range(1, 4) if len(str(body + d)) == d)
    return b"%d %s=%s\n" % (n, key, value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzzed_pax_records_walk_the_same_natively(data):
    """Any bytes in a pax record (and any length for it, its header's checksum made right): the
    native walk and the reference agree exactly (cuts, or None), and take a `size` record alike."""
    good = open(os.path.join(DATA, "wds-pax.tar"), "rb").read()
    pax = [m.header for m in tar.walk(reader(good), len(good))]  # each member here starts with its pax record
    at = data.draw(st.sampled_from(pax))
    record = data.draw(st.one_of(
        st.binary(max_size=600),
        st.builds(pax_record, st.sampled_from([b"size", b"path", b"mtime", b"siz"]),
                  st.one_of(st.binary(max_size=40), st.integers(0, 10**30).map(lambda n: b"%d" % n)))))
    length = data.draw(st.one_of(st.just(len(record)), st.integers(0, 700)))
    block = (record + bytes(512))[:512]
    bad = header_with(good, at, slice(124, 136), b"%011o" % length)
    bad = bad[:at + 512] + block + bad[at + 1024:]
    for params in (DEFAULT_PARAMS, SMALL):
        assert native_cuts(bad, params) == tar.member_cuts(reader(bad), len(bad), params)


def test_many_tiny_members_get_a_bounded_number_of_chunks():
    """A tar of 20,000 empty members and one of 3,000 members of exactly `min` bytes: chunks stay within
    the format's bound (every cut pair spans min + a header)."""
    for n, size in ((20_000, 0), (3_000, SMALL.min_size)):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            body = b"z" * size
            for i in range(n):
                ti = tarfile.TarInfo(f"m{i}")
                ti.size = size
                tf.addfile(ti, io.BytesIO(body))
        data = buf.getvalue()
        ends = chunk_ends(data, SMALL)
        assert ends[-1] == len(data)
        assert len(ends) <= max_chunks(len(data), SMALL.min_size)


def test_not_a_tar_file_is_left_to_byte_cdc():
    noise = random.Random(5).randbytes(5000)
    looks = bytearray(noise)
    looks[257:263] = b"ustar\0"  # the magic, but no valid checksum
    for data in (noise, bytes(looks), b"", b"x" * 100):
        assert tar.member_cuts(reader(data), len(data)) is None


@pytest.mark.parametrize("which", ["header", "data"])
def test_a_shard_reads_exact_and_a_flipped_byte_in_any_of_its_chunks_is_caught(store, tmp_path, which):
    """A v3 shard's chunks alternate in its pack: a compressed header region, a member's raw data.
    Reads of any size land them together (`read_mixed_into`: one preadv, each chunk checked); the
    bytes are exact, and a byte flipped in a header record or in a member's data is a
    CorruptionError naming that chunk, never other bytes."""
    import sqlite3

    from cdcstore import CorruptionError
    from cdcstore.core.pack import CODEC_RAW, CODEC_ZSTD
    p = tmp_path / "shard.tar"
    data = webdataset_like(str(p), 60, 20_000)
    store.push([str(p)], "wds@main/shard.tar")
    for piece in (1 << 20, 300_000, 8 << 20, 64 << 10):
        with store.open("wds@main/shard.tar") as f:
            got = b"".join(iter(lambda: f.read(piece), b""))
        assert got == data, piece
    with sqlite3.connect(os.path.join(store.location, "index.sqlite")) as c:
        rows = list(c.execute("SELECT id, pack, offset, stored_len, codec FROM chunks"))
    assert {r[4] for r in rows} == {CODEC_RAW, CODEC_ZSTD}  # both kinds in the pack
    cid, pack, off, slen, _ = sorted(r for r in rows if (r[4] == CODEC_RAW) == (which == "data"))[len(rows) // 4]
    flip_byte(pack_file(store.location, pack), off + slen // 2)
    with store.open("wds@main/shard.tar") as f:
        with pytest.raises(CorruptionError, match=f"chunk {cid.hex()} does not (match|decompress)"):
            f.read()

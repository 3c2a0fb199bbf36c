"""Pack, manifest and commit formats: round trips, corruption, golden vectors."""
import io

import pytest

from cdcstore.core import ids
from cdcstore.core.commit import Commit, FileEntry
from cdcstore.core.errors import CorruptionError
from cdcstore.core.manifest import Manifest
from cdcstore.core.pack import CODEC_RAW, CODEC_ZSTD, PackWriter, decode_chunk, encode_chunk, read_index
from conftest import golden_input

GOLDEN_ZSTD_PACK = bytes.fromhex(
    "4344435041434b00010000000000000028b52ffd60e8024d00001061610100e32b8005b01da365eddaa29cb3e7af62"
    "7147db7c100000000000000013000000e80300000100000001000000010000008a05358ae3da07f6bbf13cadd08d72"
    "9643444350454e4400")


def build_pack(chunks):
    buf = io.BytesIO()
    w = PackWriter(buf)
    for c in chunks:
        cid = ids.digest(c)
        codec, stored = encode_chunk(c, cid)
        w.add(cid, codec, stored, len(c))
    return w.finish(), buf.getvalue(), w.entries


def test_pack_round_trip_and_codecs():
    chunks = [b"a" * 100_000, golden_input(70_000), b"", b"x"]
    name, data, entries = build_pack(chunks)
    assert name == ids.hexdigest(data)
    assert [e.codec for e in entries] == [CODEC_ZSTD, CODEC_RAW, CODEC_RAW, CODEC_RAW]
    assert entries[0].stored_len < 1000  # compressible chunk shrank
    parsed = read_index(io.BytesIO(data), len(data))
    assert parsed == entries
    for c, e in zip(chunks, parsed):
        assert decode_chunk(data[e.offset:e.offset + e.stored_len], e.codec, e.raw_len, e.chunk_id) == c


def test_golden_raw_pack_name():
    # Raw chunks only, so the bytes do not depend on the zstd library version.
    name, data, _ = build_pack([golden_input(3000), b"hello world"])
    assert len(data) == 16 + 3000 + 11 + 2 * 36 + 32
    assert name == "18b46e85dafe40718d070c0160d909d4"


def test_golden_zstd_pack_still_reads():
    entries = read_index(io.BytesIO(GOLDEN_ZSTD_PACK), len(GOLDEN_ZSTD_PACK))
    e = entries[0]
    raw = decode_chunk(GOLDEN_ZSTD_PACK[e.offset:e.offset + e.stored_len], e.codec, e.raw_len, e.chunk_id)
    assert raw == b"a" * 1000
    assert ids.hexdigest(GOLDEN_ZSTD_PACK) == "36ad218975a51adb923b629511b1ae25"


@pytest.mark.parametrize("pos", [20, 3000, -100, -40])
def test_flipped_byte_is_detected(pos):
    chunks = [golden_input(3000), b"b" * 5000]
    _, data, entries = build_pack(chunks)
    bad = bytearray(data)
    bad[pos] ^= 0x01
    with pytest.raises(CorruptionError):
        parsed = read_index(io.BytesIO(bytes(bad)), len(bad))
        for e in parsed:
            decode_chunk(bytes(bad[e.offset:e.offset + e.stored_len]), e.codec, e.raw_len, e.chunk_id)


@pytest.mark.parametrize("cut", [0, 10, 40, 100])
def test_truncated_pack_is_detected(cut):
    _, data, _ = build_pack([golden_input(3000)])
    short = data[:len(data) - cut - 1]
    with pytest.raises(CorruptionError):
        read_index(io.BytesIO(short), len(short))


def test_not_a_pack():
    junk = b"PAR1" + b"\x00" * 100
    with pytest.raises(CorruptionError, match="not a cdcstore pack"):
        read_index(io.BytesIO(junk), len(junk))


def test_decode_rejects_wrong_id():
    cid = ids.digest(b"right")
    with pytest.raises(CorruptionError, match="does not match"):
        decode_chunk(b"wrong", CODEC_RAW, 5, cid)
    with pytest.raises(CorruptionError, match="does not decompress"):
        decode_chunk(b"\x28\xb5\x2f\xfd garbage", CODEC_ZSTD, 5, cid)


def make_manifest(chunks):
    return Manifest([ids.digest(c) for c in chunks], [len(c) for c in chunks], sum(map(len, chunks)),
                    ids.digest(b"".join(chunks)))


def test_manifest_round_trip_span_and_golden():
    chunks = [b"a" * 1000, golden_input(3000), b"hello world"]
    m = make_manifest(chunks)
    data = m.encode()
    assert Manifest.decode(data) == m
    assert m.name() == "2e3f0b72e8ae23128bc34f11d52cd1b1"  # golden: manifest format v1
    assert list(m.span(0, 1)) == [0]
    assert list(m.span(999, 1001)) == [0, 1]
    assert list(m.span(1000, 4000)) == [1]
    assert list(m.span(3999, 10**9)) == [1, 2]
    assert list(m.span(4011, 5000)) == []
    assert list(m.span(5, 5)) == []
    with pytest.raises(CorruptionError):
        Manifest.decode(data[:-1])
    bad = bytearray(data)
    bad[0] ^= 1
    with pytest.raises(CorruptionError):
        Manifest.decode(bytes(bad))


def test_commit_encoding_is_canonical_and_golden():
    c = Commit("demo", None, "v1", 1700000000.0,
               {"a/b.parquet": FileEntry("2e3f0b72e8ae23128bc34f11d52cd1b1", 4011)})
    assert c.encode() == (b'{"files":{"a/b.parquet":{"manifest":"2e3f0b72e8ae23128bc34f11d52cd1b1","size":4011}},'
                          b'"format":1,"message":"v1","parent":null,"repo":"demo","time":1700000000.0}')
    assert c.id == "9739c2484dc98f0bfaee8b219dd49206"
    assert Commit.decode(c.encode()) == c
    with pytest.raises(CorruptionError):
        Commit.decode(b'{"format": 99}')


GOLDEN_SUBTREE = b'{"entries":{"b.parquet":{"manifest":"2e3f0b72e8ae23128bc34f11d52cd1b1","size":4011}},"format":2,"type":"tree"}'
GOLDEN_ROOT_TREE = (b'{"entries":{"a":{"files":1,"size":4011,"tree":"632ec3b129c74991d811d5d0fd01323a"},'
                    b'"c.txt":{"manifest":"2e3f0b72e8ae23128bc34f11d52cd1b1","size":4011}},"format":2,"type":"tree"}')
GOLDEN_COMMIT_V2 = (b'{"format":2,"message":"v2","parent":null,"repo":"demo","time":1700000000.0,'
                    b'"tree":"1a1b394516d80b38d74aa98737ef9475"}')


def test_tree_and_commit_format_2_are_canonical_and_golden():
    """Tree format 2 (one folder) and commit format 2 (names its root tree); ids are ids.hexdigest
    of these exact bytes (they change with the id hash, the bytes do not)."""
    from cdcstore.core import treeobj
    m = "2e3f0b72e8ae23128bc34f11d52cd1b1"
    root, nodes = treeobj.build({"c.txt": FileEntry(m, 4011), "a/b.parquet": FileEntry(m, 4011)})
    assert {n.encode() for n in nodes.values()} == {GOLDEN_SUBTREE, GOLDEN_ROOT_TREE}
    assert ids.hexdigest(GOLDEN_SUBTREE) == "632ec3b129c74991d811d5d0fd01323a"
    assert root == ids.hexdigest(GOLDEN_ROOT_TREE) == "1a1b394516d80b38d74aa98737ef9475"
    assert treeobj.Tree.decode(GOLDEN_ROOT_TREE).encode() == GOLDEN_ROOT_TREE
    c = Commit("demo", None, "v2", 1700000000.0, None, root)
    assert c.encode() == GOLDEN_COMMIT_V2 and c.id == "1e102b6976e0dd26ff4c65be29441821"
    assert Commit.decode(GOLDEN_COMMIT_V2) == c and Commit.decode(GOLDEN_COMMIT_V2).format == 2
    for bad in (b'{"format":2,"type":"tree","entries":{"a/b":{"manifest":"' + m.encode() + b'","size":1}}}',
                b'{"format":2,"type":"tree","entries":{"a":{"tree":"' + m.encode() + b'","size":1,"files":0}}}',
                b'{"format":3,"type":"tree","entries":{}}', b'[]'):
        with pytest.raises(CorruptionError):
            treeobj.Tree.decode(bad)
    with pytest.raises(CorruptionError):  # a commit names a tree or holds files, never both
        Commit.decode(GOLDEN_COMMIT_V2[:-1] + b',"files":{}}')

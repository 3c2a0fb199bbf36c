"""Pack, manifest and commit formats: round trips, corruption, golden vectors."""
import io

import pytest

from cdcstore.core import ids
from cdcstore.core.commit import Commit, FileEntry
from cdcstore.core.errors import CorruptionError
from cdcstore.core.manifest import Manifest
from cdcstore.core.pack import (CODEC_RAW, CODEC_ZSTD, PackWriter, decode_checked, decode_chunk, encode_chunk,
                                 first_mismatch, read_index, read_verified)
from conftest import golden_input

GOLDEN_ZSTD_PACK_V2 = bytes.fromhex(  # b"a" * 1000, zstd, pack format v2
    "4344435041434b00020000000000000028b52ffd60e8024d00001061610100e32b80059957a9014733dd6b6e2f6abcbe"
    "7b259a6da1aa0b0e184cd7bf1810e5c425f405100000000000000013000000e80300007cdb477162afe7b30100000000"
    "0000000100000002000000b93146cd3d0ec3e50b13ba96b742403143444350454e4400")
GOLDEN_ZSTD_PACK = bytes.fromhex(  # the same chunk in pack format v1 (xxh3-128 ids), as v1 wrote it
    "4344435041434b00010000000000000028b52ffd60e8024d00001061610100e32b8005b01da365eddaa29cb3e7af62"
    "7147db7c100000000000000013000000e80300000100000001000000010000008a05358ae3da07f6bbf13cadd08d72"
    "9643444350454e4400")


def build_pack(chunks, version=2):
    buf = io.BytesIO()
    w = PackWriter(buf, version)
    for c in chunks:
        cid = ids.digest(c) if version == 2 else ids.legacy_digest(c)
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
    name, data, entries = build_pack([golden_input(3000), b"hello world"])
    assert len(data) == 16 + 3000 + 11 + 2 * 64 + 32  # format v2: 64-byte index entries
    assert name == "92a186b479acfe9e63c137d99cae407d5d97f2f94bee7c69c3066e7eaf0558cb"  # BLAKE3-256
    assert name == ids.hexdigest(data) and ids.matches(data, name)
    # BLAKE3-256("hello world"), the reference implementation's published value
    assert entries[1].chunk_id == bytes.fromhex("d74981efa70a0c880b8d8c1985d075dbcbf679b99a5f9914e5aaf96b831a9e24")
    assert entries[1].check == ids.checksum(b"hello world")
    assert read_index(io.BytesIO(data), len(data)) == entries


def test_golden_raw_pack_name_v1():
    # The v1 writer (kept for repacking v1 packs and for tests) still makes v1's bytes.
    name, data, entries = build_pack([golden_input(3000), b"hello world"], version=1)
    assert len(data) == 16 + 3000 + 11 + 2 * 36 + 32
    assert name == "18b46e85dafe40718d070c0160d909d4"  # xxh3-128, as format v1 named it
    assert ids.matches(data, name) and not ids.matches(data, ids.hexdigest(data)[:32])
    parsed = read_index(io.BytesIO(data), len(data))
    assert parsed == entries and all(e.check is None and len(e.chunk_id) == 16 for e in parsed)


def test_golden_zstd_pack_still_reads():
    entries = read_index(io.BytesIO(GOLDEN_ZSTD_PACK), len(GOLDEN_ZSTD_PACK))
    e = entries[0]
    raw = decode_chunk(GOLDEN_ZSTD_PACK[e.offset:e.offset + e.stored_len], e.codec, e.raw_len, e.chunk_id)
    assert raw == b"a" * 1000
    assert ids.legacy_hexdigest(GOLDEN_ZSTD_PACK) == "36ad218975a51adb923b629511b1ae25"
    assert ids.matches(GOLDEN_ZSTD_PACK, "36ad218975a51adb923b629511b1ae25")


def test_golden_zstd_pack_v2():
    entries = read_verified(io.BytesIO(GOLDEN_ZSTD_PACK_V2), len(GOLDEN_ZSTD_PACK_V2))
    assert [(e.chunk_id, e.raw_len, e.codec, e.check) for e in entries] == [
        (ids.digest(b"a" * 1000), 1000, CODEC_ZSTD, ids.checksum(b"a" * 1000))]
    e = entries[0]
    assert decode_chunk(GOLDEN_ZSTD_PACK_V2[e.offset:e.offset + e.stored_len], e.codec, e.raw_len,
                        e.chunk_id, e.check) == b"a" * 1000
    assert ids.hexdigest(GOLDEN_ZSTD_PACK_V2) == "e183a9705d384be87e8fe66fd36fb2fa1b689b15c7d800f91a1f206272451030"


def test_pack_ids_have_their_versions_width():
    w = PackWriter(io.BytesIO())
    with pytest.raises(ValueError, match="32-byte ids"):
        w.add(ids.legacy_digest(b"x"), CODEC_RAW, b"x", 1)
    w1 = PackWriter(io.BytesIO(), version=1)
    with pytest.raises(ValueError, match="16-byte ids"):
        w1.add(ids.digest(b"x"), CODEC_RAW, b"x", 1)


def test_checksum_catches_damage_and_id_catches_a_forged_checksum():
    raw = golden_input(5000)
    cid, check = ids.digest(raw), ids.checksum(raw)
    bad = bytearray(raw)
    bad[100] ^= 1
    with pytest.raises(CorruptionError, match="checksum differs"):
        decode_checked(bytes(bad), CODEC_RAW, len(raw), cid, check)
    assert decode_checked(raw, CODEC_RAW, len(raw), cid, check) == raw
    with pytest.raises(CorruptionError, match="does not match"):  # untrusted bytes: id AND checksum
        decode_chunk(raw, CODEC_RAW, len(raw), cid, check ^ 1)
    view = memoryview(raw + b"hello")
    lens = [len(raw), 5]
    assert first_mismatch(view, [cid, ids.digest(b"hello")], lens) == -1
    assert first_mismatch(view, [cid, ids.digest(b"hellO")], lens) == 1
    assert first_mismatch(view, [cid, ids.digest(b"hellO")], lens, [check, ids.checksum(b"hello")]) == -1
    assert first_mismatch(view, [cid, cid], lens, [check ^ 1, None]) == 0


def test_ids_length_names_the_hash():
    data = b"some bytes"
    assert len(ids.digest(data)) == 32 and len(ids.hexdigest(data)) == 64
    assert ids.digest(data) == bytes.fromhex(ids.hexdigest(data))
    assert ids.matches(data, ids.digest(data)) and ids.matches(data, ids.hexdigest(data))
    assert ids.matches(data, ids.legacy_digest(data)) and ids.matches(data, ids.legacy_hexdigest(data))
    assert not ids.matches(data, ids.legacy_digest(b"other")) and not ids.matches(data, ids.digest(b"other"))
    assert not ids.matches(data, ids.digest(data)[:16])  # a truncated BLAKE3 id is no xxh3 id
    assert ids.is_hex_id("a" * 64) and ids.is_hex_id("a" * 32) and not ids.is_hex_id("a" * 48)
    assert ids.is_new_hex_id("a" * 64) and not ids.is_new_hex_id("a" * 32)
    h = ids.hasher()
    h.update(data[:3])
    h.update(data[3:])
    assert h.hexdigest() == ids.hexdigest(data)


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


def make_manifest(chunks, version=2):
    digest = ids.digest if version == 2 else ids.legacy_digest
    return Manifest([digest(c) for c in chunks], [len(c) for c in chunks], sum(map(len, chunks)),
                    ids.legacy_digest(b"".join(chunks)), version)


def test_manifest_v1_still_reads():
    chunks = [b"a" * 1000, golden_input(3000), b"hello world"]
    m = make_manifest(chunks, version=1)
    data = m.encode()
    assert len(data) == 48 + 3 * 20
    assert Manifest.decode(data) == m and Manifest.decode(data).version == 1
    assert m.name() == "2e3f0b72e8ae23128bc34f11d52cd1b1"  # golden: manifest format v1 (xxh3-128)
    assert ids.matches(data, m.name())


def test_manifest_round_trip_span_and_golden():
    chunks = [b"a" * 1000, golden_input(3000), b"hello world"]
    m = make_manifest(chunks)
    data = m.encode()
    assert len(data) == 48 + 3 * 36 and data[8:12] == b"\x02\x00\x00\x00"
    assert Manifest.decode(data) == m
    assert m.name() == "a49ea7b2e5069d2f53049a925d701a1bcd65a18be05c54e1f25fd71dd5ee068c"  # golden: format v2
    assert m.name() == ids.hexdigest(data)
    with pytest.raises(ValueError, match="32-byte chunk ids"):
        Manifest([ids.legacy_digest(b"x")], [1], 1, ids.legacy_digest(b"x")).encode()
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
    assert ids.legacy_hexdigest(c.encode()) == "9739c2484dc98f0bfaee8b219dd49206"  # its v1 name
    assert c.id == "017bb0ad18c9015d688fcc5a853fa0ac3ec991025926dbc939780985d4cae361"  # BLAKE3-256 now
    c2 = Commit("demo", c.id, "v2", 1700000001.0, {"a/b.parquet": FileEntry(
        "a49ea7b2e5069d2f53049a925d701a1bcd65a18be05c54e1f25fd71dd5ee068c", 4011)})
    assert c2.id == "1125583ef5402b31444626d13e49db8941906384f73371614bda56e4da115d3c"
    assert Commit.decode(c2.encode()).parent == c.id  # a 64-hex parent (and a 32-hex one above) validate
    assert Commit.decode(c.encode()) == c
    with pytest.raises(CorruptionError):
        Commit.decode(b'{"format": 99}')


GOLDEN_LOCATIONS = bytes.fromhex(
    "4344434c4f435300010000000200000003000000206162616261626162616261626162616261626162616261626162616261626162"
    "206364636463646364636463646364636463646364636463646364636463646364000000001000000000000000080000000100000018"
    "000000000000001400000000000000100000000000000008000000010001")


def test_location_record_golden_and_damage():
    """Location records (format v1, docs/format.md): pinned bytes; damage is a CorruptionError."""
    from cdcstore.core import locations
    from cdcstore.core.pack import PackEntry

    one, two = b"\x01" * 16, b"\x02" * 16
    m = Manifest([one, two, one], [10, 20, 10], 40, b"\x07" * 16)
    where = {one: ("ab" * 16, PackEntry(one, 16, 8, 10, CODEC_ZSTD)), two: ("cd" * 16, PackEntry(two, 24, 20, 20, CODEC_RAW))}
    assert locations.encode(m, where) == GOLDEN_LOCATIONS
    assert locations.decode(GOLDEN_LOCATIONS, m) == where
    assert locations.encode(m, {one: where[one]}) is None  # a chunk not located: no record
    for bad in (GOLDEN_LOCATIONS[:-1], GOLDEN_LOCATIONS[:10], b"X" + GOLDEN_LOCATIONS[1:],
                GOLDEN_LOCATIONS[:20] + b"\x00" + GOLDEN_LOCATIONS[21:]):
        with pytest.raises(CorruptionError):
            locations.decode(bad, m)
    with pytest.raises(CorruptionError, match="lists 3 chunks"):
        locations.decode(GOLDEN_LOCATIONS, Manifest([one], [10], 10, b"\x07" * 16))


def test_anchor_rule_and_names_golden():
    """Dedup anchors (format v1, docs/format.md): the rule that picks them and their object
    names are pinned; a name that is not an anchor parses to None."""
    from cdcstore.core import anchors

    assert anchors.is_anchor(bytes(31) + b"\x00") and anchors.is_anchor(bytes(31) + b"\xc0")
    assert not anchors.is_anchor(bytes(31) + b"\x01") and not anchors.is_anchor(bytes(31) + b"\x3f")
    assert sum(anchors.is_anchor(bytes([0] * 31 + [b])) for b in range(256)) == 256 // anchors.ANCHOR_EVERY
    cid, pack = b"\xab\xcd" + bytes(30), "ef" * 32
    assert anchors.name(cid, pack) == "anchors/ab/abcd" + "00" * 30 + "/" + "ef" * 32
    assert anchors.prefix(cid) == "anchors/ab/abcd" + "00" * 30 + "/"
    assert anchors.parse(anchors.name(cid, pack)) == (cid, pack)
    assert anchors.parse(anchors.name(b"\x01" * 16, "12" * 16)) == (b"\x01" * 16, "12" * 16)  # v1 ids
    for bad in ("anchors/ab/cd" + "00" * 31 + "/" + pack, "anchors/ab/abcd" + "00" * 30 + "/x",
                "anchors/ab/abcd" + "00" * 30, "locations/ab/abcd" + "00" * 30 + "/" + pack,
                "anchors/ab/abcd" + "00" * 30 + "/" + pack + "/y"):
        assert anchors.parse(bad) is None

GOLDEN_SUBTREE = b'{"entries":{"b.parquet":{"manifest":"2e3f0b72e8ae23128bc34f11d52cd1b1","size":4011}},"format":2,"type":"tree"}'
GOLDEN_ROOT_TREE = (b'{"entries":{"a":{"files":1,"size":4011,"tree":"e8bcc34db5164baec6edd0aa519097baa78c76bf0f23eb0a36a3accb359f65e2"},'
                    b'"c.txt":{"manifest":"2e3f0b72e8ae23128bc34f11d52cd1b1","size":4011}},"format":2,"type":"tree"}')
GOLDEN_ROOT_TREE4 = (b'{"entries":{"a":{"content":"3b01696803afa514f2ee2576e0a7520706fe8c6d449231bd7453fc156edb8503",'
                     b'"files":1,"size":4011,"tree":"e8bcc34db5164baec6edd0aa519097baa78c76bf0f23eb0a36a3accb359f65e2"},'
                     b'"c.txt":{"manifest":"2e3f0b72e8ae23128bc34f11d52cd1b1","size":4011}},"format":4,"type":"tree"}')
GOLDEN_COMMIT_V2 = (b'{"format":2,"message":"v2","parent":null,"repo":"demo","time":1700000000.0,'
                    b'"tree":"9144ec38d993023cc5aa7a3f195c60522460e23b18c6a90aa3aeacaab46492a6"}')


def test_tree_and_commit_format_2_are_canonical_and_golden():
    """Tree format 2 (one folder) and commit format 2 (names its root tree); ids are ids.hexdigest
    of these exact bytes (they change with the id hash, the bytes do not)."""
    from cdcstore.core import treeobj
    m = "2e3f0b72e8ae23128bc34f11d52cd1b1"
    new_root, nodes = treeobj.build({"c.txt": FileEntry(m, 4011), "a/b.parquet": FileEntry(m, 4011)})
    # what cdcstore writes now: the page of files is format 2, the root names its folder's content id (format 4)
    assert {n.encode() for n in nodes.values()} == {GOLDEN_SUBTREE, GOLDEN_ROOT_TREE4}
    assert new_root == "d0c86c0b4edc14ba201ecf15f2d5de03d1a6ea2974180b46fb17082eb14788e1"
    assert ids.hexdigest(GOLDEN_SUBTREE) == "e8bcc34db5164baec6edd0aa519097baa78c76bf0f23eb0a36a3accb359f65e2"
    root = ids.hexdigest(GOLDEN_ROOT_TREE)  # format 2, as written before content ids: still read
    assert root == "9144ec38d993023cc5aa7a3f195c60522460e23b18c6a90aa3aeacaab46492a6"
    assert treeobj.Tree.decode(GOLDEN_ROOT_TREE).encode() == GOLDEN_ROOT_TREE
    assert treeobj.Tree.decode(GOLDEN_ROOT_TREE).content is None
    c = Commit("demo", None, "v2", 1700000000.0, None, root)
    assert c.encode() == GOLDEN_COMMIT_V2 and c.id == "ae2251d75a55413caaf52eea45cff24ef6bbb85268c3276c4313b0c2a1030c20"
    assert Commit.decode(GOLDEN_COMMIT_V2) == c and Commit.decode(GOLDEN_COMMIT_V2).format == 2
    for bad in (b'{"format":2,"type":"tree","entries":{"a/b":{"manifest":"' + m.encode() + b'","size":1}}}',
                b'{"format":2,"type":"tree","entries":{"a":{"tree":"' + m.encode() + b'","size":1,"files":0}}}',
                b'{"format":3,"type":"tree","entries":{}}', b'[]'):
        with pytest.raises(CorruptionError):
            treeobj.Tree.decode(bad)
    with pytest.raises(CorruptionError):  # a commit names a tree or holds files, never both
        Commit.decode(GOLDEN_COMMIT_V2[:-1] + b',"files":{}}')

"""Every parser of untrusted bytes, fuzzed: pack footers, manifests, commits, wire bodies, Thrift,
Parquet page headers, TAR headers. Garbage gives a clear error (a CdcError or ValueError), never
another exception, and no call allocates more than a bound."""
import io
import os
import struct
import tempfile
import tracemalloc

from hypothesis import HealthCheck, given, settings, strategies as st

from cdcstore.core import pack, pages

from cdcstore.streaming import shards
from cdcstore.core.commit import Commit
from cdcstore.core.errors import CdcError
from cdcstore.core.manifest import Manifest
from cdcstore.core.thrift import Decoder
from cdcstore.core import wire

BOUND = 32 << 20  # bytes any parser may allocate for an input of at most a few KiB
FUZZ = settings(max_examples=300, deadline=None, derandomize=True,  # CI sees the same cases each run
                suppress_health_check=[HealthCheck.too_slow])
CLEAR = (CdcError, ValueError)  # errors that name the problem (ThriftError and ShardError are among them)
def bounded(fn, *args):
    """Call fn; only clear errors may escape; peak allocation stays under BOUND."""
    tracemalloc.start()
    try:
        fn(*args)
    except CLEAR:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < BOUND, f"{fn.__name__} allocated {peak} bytes"


def _valid_pack() -> bytes:
    buf = io.BytesIO()
    w = pack.PackWriter(buf)
    data = b"chunk data " * 50
    from cdcstore.core import ids

    w.add(ids.digest(data), pack.CODEC_RAW, data, len(data))
    w.finish()
    return buf.getvalue()


VALID_PACK = _valid_pack()


def _read_index(data: bytes):
    return pack.read_index(io.BytesIO(data), len(data), "fuzz")


@FUZZ
@given(st.binary(max_size=4096))
def test_pack_footer_garbage(data):
    bounded(_read_index, data)


@FUZZ
@given(st.integers(0, len(VALID_PACK) - 1), st.integers(0, 255), st.integers(0, 64))
def test_pack_footer_flipped_and_cut(pos, value, cut):
    damaged = bytearray(VALID_PACK)
    damaged[pos] = value
    bounded(_read_index, bytes(damaged[: len(damaged) - cut]))


@FUZZ
@given(st.binary(max_size=4096))
def test_pack_footer_huge_counts(tail):
    # a trailer that claims a billion entries must be refused before any allocation
    trailer = struct.pack("<I", 10**9)
    bounded(_read_index, VALID_PACK[:16] + tail + trailer + VALID_PACK[-(pack.TRAILER.size - 4):])


@FUZZ
@given(st.binary(max_size=4096))
def test_manifest_garbage(data):
    bounded(Manifest.decode, data)


@FUZZ
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=10), c, max_size=5),
                    max_leaves=30))
def test_commit_json_shapes(doc):
    import json

    bounded(Commit.decode, json.dumps(doc).encode())


@FUZZ
@given(st.binary(max_size=4096))
def test_commit_garbage(data):
    bounded(Commit.decode, data)


@FUZZ
@given(st.binary(max_size=4096), st.lists(st.binary(min_size=16, max_size=16), max_size=20))
def test_wire_bodies(body, ids):
    bounded(wire.decode_ids, body)
    bounded(wire.decode_presence, ids, body)
    bounded(wire.decode_to_prove, ids, body)
    bounded(wire.presence_nonce, ids, body)
    bounded(wire.decode_proofs, body)
    bounded(wire.decode_locations, body)
    bounded(wire.decode_blobs, body)


@FUZZ
@given(st.binary(max_size=4096))
def test_thrift_structs(data):
    bounded(lambda b: Decoder(b).struct(), data)


@FUZZ
@given(st.binary(max_size=4096))
def test_parquet_page_walker(data):
    blob = b"PAR1" + data + struct.pack("<I", len(data)) + b"PAR1"
    with tempfile.TemporaryFile() as f:  # the native walk reads a file descriptor
        f.write(blob)
        f.flush()
        bounded(pages.page_cuts_of, f, len(blob))
    bounded(pages.page_starts_of, io.BytesIO(blob), len(blob))
    bounded(pages.read_page_header, data)


_GEOMETRY = os.path.join(os.path.dirname(__file__), "data", "geometry", "narrow-plain.parquet")


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=12))
def test_native_page_walk_of_a_damaged_parquet_file(edits):
    """Bytes of a real file's pages and footer changed at random: the native walk returns
    sorted cuts inside the file or None (bytes), within bounded memory, never a crash."""
    blob = bytearray(open(_GEOMETRY, "rb").read())
    for at, value in edits:
        blob[at % len(blob)] = value
    with tempfile.TemporaryFile() as f:
        f.write(blob)
        f.flush()
        tracemalloc.start()
        try:
            cuts = pages.page_cuts_of(f, len(blob))
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
    assert peak < BOUND
    if cuts is not None:
        assert cuts[-1] == len(blob) and all(0 < a < b for a, b in zip(cuts, cuts[1:]))


@FUZZ
@given(st.binary(max_size=8192))
def test_tar_headers(data):
    def scan(b):
        shards.samples(shards.scan(lambda off, n: b[off:off + n], len(b), "fuzz"))

    bounded(scan, data)



def test_thrift_map_with_container_keys_is_a_clear_error():
    # field 1 is a map of one entry whose keys are lists (found by the fuzzer: TypeError before)
    bounded(lambda b: Decoder(b).struct(), bytes([0x1B, 0x01, 0x95, 0x10, 0x00]))


def test_a_parquet_footer_whose_row_groups_are_not_a_list_is_a_clear_error():
    data = b"A\x00"  # found by the fuzzer: TypeError before
    bounded(pages.page_starts_of, io.BytesIO(b"PAR1" + data + struct.pack("<I", len(data)) + b"PAR1"), len(data) + 12)
    bounded(pages.column_chunk_ranges, bytes([0x49, 0x00]))  # field 4 (row groups) as a list of booleans

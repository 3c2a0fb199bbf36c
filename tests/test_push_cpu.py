"""What a push's CPU savings must never cost (issue 46, item 4): read blocks reused only once no
chunk views them, packs named as they are written, the whole-file hash taken chunk by chunk, and
a CLI that imports nothing it does not use."""
import json
import os
import random
import subprocess
import sys

import pytest

from cdcstore import CdcError, Store
from cdcstore.core import ids
from cdcstore.core.chunker import ChunkParams, Chunker, chunk_ends
from cdcstore.engine import ingest
from cdcstore.engine.ingest import FileChunks, IngestOptions, ReadBlocks, in_use

# small blocks, small chunks: most chunks straddle two blocks, and every read happens while the
# chunker still holds the tail of the block before it
PARAMS = ChunkParams(1024, 4096, 16384)
BLOCK = 64 * 1024


def _files(folder) -> dict[str, bytes]:
    rng = random.Random(46)
    base = rng.randbytes(700_000)
    text = "".join(f"{i},{rng.randrange(10**6)},{rng.choice(['a', 'bb', 'ccc'])}\n" for i in range(60_000))
    data = {
        "random.bin": rng.randbytes(1_500_000),
        "repeats.bin": base + rng.randbytes(50_000) + base[1000:] + base[:300_000],  # dedups inside itself
        "table.csv": text.encode(),  # compressible: zstd records in the packs
        "exact.bin": rng.randbytes(4 * BLOCK),  # whole blocks only
        "small.bin": rng.randbytes(BLOCK // 3),  # shorter than a block: bytes of its own
        "empty.bin": b"",
    }
    for name, b in data.items():
        (folder / name).write_bytes(b)
    return data


class CountingBlocks(ReadBlocks):
    made_pools: list["CountingBlocks"] = []

    def __init__(self, size: int, keep: int):
        super().__init__(size, keep)
        self.made_pools.append(self)


def _push_and_check(tmp_path, monkeypatch, max_inflight: int) -> list["CountingBlocks"]:
    """Push the files with reused blocks; every chunk id, every file's bytes and every pack must
    be exactly what the files' bytes say (a block written again under a held chunk breaks one)."""
    monkeypatch.setattr(ingest, "ReadBlocks", CountingBlocks)
    CountingBlocks.made_pools = []
    (tmp_path / "d").mkdir()
    data = _files(tmp_path / "d")
    s = Store.init(str(tmp_path / "s"))
    opts = IngestOptions(params=PARAMS, block_size=BLOCK, max_inflight_bytes=max_inflight,
                         max_pack_bytes=256 * 1024, parquet_pages=False, file_threads=2, workers=2)
    r = s.push([str(tmp_path / "d")], "cdc://ds/", options=opts, stat_cache=False)
    assert r.bytes == sum(len(b) for b in data.values())
    view = s.view("ds", s.get_commit("ds", s.resolve_ref("ds", "main")[0]))
    for name, b in data.items():
        entry = view.get(name)
        m = s.manifest("ds", entry.manifest)
        ends = chunk_ends(b, PARAMS) if b else []  # the rule on the whole file at once
        starts = [0, *ends[:-1]]
        assert list(m.lengths) == [e - a for a, e in zip(starts, ends)], name
        assert list(m.chunk_ids) == [ids.digest(b[a:e]) for a, e in zip(starts, ends)], name
        assert m.file_hash == _xxh3_128(b), name
        assert s.cat(f"cdc://ds/{name}") == b, name
    assert s.check(read_data=True)["problems"] == []  # every pack named by its bytes, every chunk by its id
    s.close()
    return CountingBlocks.made_pools


def _xxh3_128(b: bytes) -> bytes:
    h = ids.weak_hasher()
    h.update(b)
    return h.digest()


def test_reused_read_blocks_never_change_a_chunk_still_held(tmp_path, monkeypatch):
    """A small in-flight window: blocks come free and are read into again while other chunks (the
    chunker's tail, queued and encoding chunks, a pack's write buffer) still view older ones."""
    pools = _push_and_check(tmp_path, monkeypatch, max_inflight=96 * 1024)
    assert sum(p.reused for p in pools) > 10 and sum(p.made for p in pools) >= 2  # blocks were reused


def test_blocks_held_by_chunks_in_flight_are_not_reused(tmp_path, monkeypatch):
    """The default window holds every chunk until the presence query: nothing may be reused early."""
    _push_and_check(tmp_path, monkeypatch, max_inflight=64 << 20)


def test_the_check_fails_when_a_held_block_is_reused(tmp_path, monkeypatch):
    """The tests above would catch the bug they guard against: with the export check switched
    off, a block is read into again under the chunks that view it, and a chunk changes."""
    monkeypatch.setattr(ingest, "in_use", lambda block: False)
    with pytest.raises((AssertionError, CdcError)):
        _push_and_check(tmp_path, monkeypatch, max_inflight=64 << 20)


def test_a_block_is_in_use_while_any_view_of_it_lives():
    for block in (ingest.new_block(1 << 16), bytearray(1 << 16)):
        assert in_use(block) is False
        view = memoryview(block)[100:200].toreadonly()
        part = view[10:20]  # a slice of a slice: the same export
        del view
        assert in_use(block) is True
        del part
        assert in_use(block) is False
        assert len(block) == 1 << 16  # the check leaves the block as it was


def test_the_pool_hands_out_only_blocks_nothing_views():
    pool = ReadBlocks(4096, keep=4)
    a = pool.take()
    a[:4] = b"abcd"
    chunk = memoryview(a)[:4].toreadonly()
    pool.give_back(a)
    b = pool.take()
    assert b is not a and bytes(chunk) == b"abcd"  # `a` is still viewed: a new block
    pool.give_back(b)
    del chunk
    assert pool.take() in (a, b) and pool.reused == 1
    pool.clear()
    assert pool.take() is not a and pool.made == 3


def test_chunks_fed_as_blocks_are_the_chunks_fed_as_bytes():
    data = random.Random(5).randbytes(300_000)
    ref = Chunker(PARAMS)
    want = [bytes(c) for c in ref.feed(data)] + [bytes(c) for c in ref.finish()]
    got = []
    chunker = Chunker(PARAMS)
    for at in range(0, len(data), 7000):
        block = bytearray(data[at:at + 7000])
        got += [bytes(c) for c in chunker.feed_block(memoryview(block))]
    got += [bytes(c) for c in chunker.finish()]
    assert got == want


@pytest.mark.parametrize("size", [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 5 * BLOCK + 17])
def test_file_chunks_with_a_pool_reads_every_byte_once(tmp_path, size):
    data = random.Random(size).randbytes(size)
    (tmp_path / "f").write_bytes(data)
    pool = ReadBlocks(BLOCK, keep=2)
    with open(tmp_path / "f", "rb") as f:
        out = list(FileChunks(f, PARAMS, False, BLOCK, pool))
    assert sum(n for n, _ in out) == size and out[-1][0] == 0
    assert b"".join(bytes(c) for _, cs in out for c in cs) == data
    assert pool.made == size // BLOCK  # whole blocks from the pool (each still viewed), the rest as bytes


HEAVY = ("pyarrow", "aiohttp", "numpy", "tqdm", "pandas", "boto3", "fsspec")

IMPORTS = """
import json, sys
{body}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _heavy_imported(body: str, cwd) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCSTORE_")}
    p = subprocess.run([sys.executable, "-c", IMPORTS.format(body=body, heavy=HEAVY)], capture_output=True,
                       text=True, env=env, cwd=str(cwd), timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_importing_the_cli_imports_no_heavy_library(tmp_path):
    assert _heavy_imported("import cdcstore.cli", tmp_path) == []


def test_help_and_a_quiet_push_import_no_heavy_library(tmp_path):
    """`cdcstore --help` and a push of local files (Parquet among them) to a directory store need
    no pyarrow (page cuts come from cdcstore's own footer parser), no HTTP client, no numpy and
    no progress bar (stderr is not a terminal)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"x": list(range(50_000)), "s": [f"v{i % 97}" for i in range(50_000)]}),
                   str(tmp_path / "d" / "t.parquet"), compression="zstd")
    (tmp_path / "d" / "b.bin").write_bytes(os.urandom(300_000))
    Store.init(str(tmp_path / "s")).close()
    run = """
from cdcstore.cli import main
sys.argv = {argv!r}
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
"""
    assert _heavy_imported(run.format(argv=["cdcstore", "--help"]), tmp_path) == []
    push = ["cdcstore", "push", str(tmp_path / "d"), "cdc://ds/", "--store", str(tmp_path / "s"), "-q",
            "--author", "a <a@example.com>"]
    assert _heavy_imported(run.format(argv=push), tmp_path) == []
    s = Store(str(tmp_path / "s"))
    assert s.cat("cdc://ds/t.parquet") == (tmp_path / "d" / "t.parquet").read_bytes()
    s.close()

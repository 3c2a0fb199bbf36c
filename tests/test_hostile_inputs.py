"""Inputs that lie (issue 19): Parquet footers that claim rows their pages do not hold, manifests
whose chunk lengths are not their chunks', Parquet files of countless tiny pages, TAR shards streamed
past the prefetch budget. Each gets a clear error (naming the file) or stays within its bound."""
import io
import os
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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

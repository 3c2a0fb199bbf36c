"""A process killed while writing a cdc:// file leaves its temp file; the next writer on the
machine removes it (the name carries the writer's pid)."""
import os
import subprocess
import sys
import tempfile
import textwrap

import fsspec

from cdcstore import runtime
from cdcstore.api import Store

KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys, fsspec
    fs = fsspec.filesystem("cdc", store=sys.argv[1], skip_instance_cache=True)
    f = fs.open("cdc://r/big.bin", "wb")
    f.write(os.urandom(4 << 20))
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_killed_writers_temp_file_is_removed_by_the_next_writer(tmp_path, monkeypatch):
    store = str(tmp_path / "store")
    Store.init(store)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    r = subprocess.run([sys.executable, "-c", KILLED_WRITER, store], env=env)
    assert r.returncode == -9
    left = os.listdir(tmp)
    assert len(left) == 1 and left[0].startswith("cdcstore-write-") and os.path.getsize(tmp / left[0]) == 4 << 20
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr("cdcstore.fs._SWEPT", runtime.Local())  # as in a new process
    fs = fsspec.filesystem("cdc", store=store, skip_instance_cache=True)
    with fs.open("cdc://r/small.bin", "wb") as f:
        f.write(b"hello")
    assert os.listdir(tmp) == []  # the killed writer's file is gone, and ours was removed at close
    assert fs.cat("cdc://r/small.bin") == b"hello" and not fs.exists("cdc://r/big.bin")

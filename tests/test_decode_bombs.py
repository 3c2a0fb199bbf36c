"""Issue 31 case 5: decode bombs. A few KB of Parquet whose one dictionary value repeats, or a PNG
whose zeros compress 1,000 to 1, must not put GBs into /dev/shm or a process's memory: a row
group is refused before it is decoded past `CDCSTORE_MAX_DECODED_BYTES` (1 GiB by default), an
image past `CDCSTORE_MAX_IMAGE_PIXELS` (2**26 by default), each with an error naming the file
and the bound; and the loader's shared folder goes when its owner is killed, not at the next run.
Real loaders in real processes: the figures are their peak RSS and /dev/shm's."""
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.streaming.dataset import StreamingDataset
from test_stream_tar import tar_bytes

MiB = 1 << 20


def bomb_parquet(path, rows: int, value_bytes: int = MiB) -> None:
    """One row group of `rows` rows, each the same `value_bytes` string: a dictionary of one value
    and all-zero indices, compressed; written without the Arrow schema, so readers decode it."""
    col = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["a" * value_bytes]))
    pq.write_table(pa.table({"s": col}), path, compression="zstd", store_schema=False, row_group_size=rows)


def bomb_png(width: int, height: int) -> bytes:
    """An RGBA PNG of zeros, written by hand (never held decoded here)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z, row, parts = zlib.compressobj(9), bytes(1 + 4 * width), []
    for _ in range(height):
        parts.append(z.compress(row))
    parts.append(z.flush())
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))
            + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b""))


class ShmPeak:
    """The peak growth of /dev/shm's used bytes while it runs (sampled every 20 ms)."""

    def __init__(self):
        self.base = self._used()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _used() -> int:
        st = os.statvfs("/dev/shm")
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._used() - self.base)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


LOADER = """
import json, resource, sys
from cdcstore.streaming.dataset import StreamingDataset
ds = StreamingDataset(sys.argv[2], store=sys.argv[1], batch_size=8, decode=True)
out = {"error": None}
try:
    for batch in ds.loader(num_workers=2):
        pass
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
import gc
gc.collect()  # the loader's workers are joined: their peak RSS counts below
# this process's own peak (VmHWM): ru_maxrss would carry the pytest process's size over fork and exec
out["rss_mib"] = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
out["workers_rss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps(out))
"""


def _run_loader(store: str, source: str, **env) -> dict:
    with ShmPeak() as shm:
        out = subprocess.run([sys.executable, "-c", LOADER, store, source], capture_output=True, text=True,
                             timeout=300, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"shm_mib": shm.peak / MiB}


def test_a_dictionary_bomb_parquet_is_refused_before_it_is_decoded(tmp_path):
    (tmp_path / "data").mkdir()
    bomb_parquet(tmp_path / "data" / "bomb.parquet", rows=1280)  # 1.25 GiB decoded
    size = os.path.getsize(tmp_path / "data" / "bomb.parquet")
    store = str(tmp_path / "store")
    with Store.init(store) as s:
        s.push([str(tmp_path / "data")], "cdc://ds/train/")
    got = _run_loader(store, "cdc://ds/train/", CDCSTORE_CACHE=str(tmp_path / "c.sqlite"))
    print(f"\n{size} B dictionary bomb through a 2-worker loader: {got}")
    assert got["error"] is not None and "bomb.parquet" in got["error"], got
    assert "CDCSTORE_MAX_DECODED_BYTES" in got["error"] and "row group 0" in got["error"], got
    assert got["shm_mib"] < 64 and got["workers_rss_mib"] < 512 and got["rss_mib"] < 512, got


def test_the_decoded_bound_is_the_callers_to_raise(tmp_path, monkeypatch):
    """The bound is a setting: a 40 MiB row group is refused under 16 MiB and read under 64 MiB."""
    (tmp_path / "data").mkdir()
    bomb_parquet(tmp_path / "data" / "b.parquet", rows=40)
    with Store.init(str(tmp_path / "store")) as s:
        s.push([str(tmp_path / "data")], "cdc://ds/train/")
        monkeypatch.setenv("CDCSTORE_MAX_DECODED_BYTES", str(16 * MiB))
        with pytest.raises(ValueError, match="b.parquet.*row group 0.*over.*CDCSTORE_MAX_DECODED_BYTES"):
            list(StreamingDataset("cdc://ds/train/", store=s, batch_size=8))
        monkeypatch.setenv("CDCSTORE_MAX_DECODED_BYTES", str(64 * MiB))
        rows = sum(len(b["s"]) for b in StreamingDataset("cdc://ds/train/", store=s, batch_size=8))
        assert rows == 40


def test_a_png_bomb_in_a_tar_shard_is_refused_by_the_pixel_bound(tmp_path):
    png = bomb_png(13_000, 13_000)  # 644 MiB of RGBA pixels, under Pillow's own bomb limit
    (tmp_path / "shards").mkdir()
    small = bomb_png(4, 4)
    (tmp_path / "shards" / "s-0.tar").write_bytes(tar_bytes(
        [("a.png", small), ("a.cls", b"1"), ("b.png", png), ("b.cls", b"2")]))
    store = str(tmp_path / "store")
    with Store.init(store) as s:
        s.push([str(tmp_path / "shards")], "cdc://ds/shards/")
    got = _run_loader(store, "cdc://ds/shards/", CDCSTORE_CACHE=str(tmp_path / "c.sqlite"))
    print(f"\n{len(png)} B PNG bomb through a 2-worker loader: {got}")
    assert got["error"] is not None and "sample 'b'" in got["error"], got
    assert "CDCSTORE_MAX_IMAGE_PIXELS" in got["error"], got
    assert got["workers_rss_mib"] < 400 and got["rss_mib"] < 400, got


KILLED = """
import sys, time
from cdcstore.streaming.dataset import StreamingDataset
ds = StreamingDataset(sys.argv[2], store=sys.argv[1], batch_size=8)
it = iter(ds.loader(num_workers=2))
next(it)
print(ds._decoded.path, flush=True)
time.sleep(600)
"""


def test_the_shared_folder_goes_when_its_owner_is_killed(tmp_path):
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"x": list(range(20_000))}), tmp_path / "data" / "p.parquet", row_group_size=2000)
    store = str(tmp_path / "store")
    with Store.init(store) as s:
        s.push([str(tmp_path / "data")], "cdc://ds/train/")
    proc = subprocess.Popen([sys.executable, "-c", KILLED, store, "cdc://ds/train/"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "CDCSTORE_CACHE": str(tmp_path / "c.sqlite")})
    folder = proc.stdout.readline().strip()
    assert folder and os.path.isdir(folder)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while os.path.exists(folder) and time.time() < deadline:
        time.sleep(0.1)
    print(f"\nshared folder after SIGKILL of its owner: {'still there' if os.path.exists(folder) else 'gone'} "
          f"after {10 - max(0, deadline - time.time()):.1f} s")
    assert not os.path.exists(folder), "the killed loader's decoded row groups stay until the next run"

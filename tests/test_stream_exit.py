"""A process that breaks off a stream exits cleanly: its prefetch thread is stopped, and has left
pyarrow's `read_row_groups`, before the interpreter is torn down. Before, the thread was still
reading at exit: the process aborted ("PyGILState_Release: thread state ... must be current") or
hung in Arrow's pool shutdown, about 1 run in 40 (issue 45's first-batch measurements)."""
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cdcstore import Store

CHILD = r"""
import atexit, sys, threading

def check():  # registered first, so it runs last: after cdcstore's own exit hooks
    alive = [t.name for t in threading.enumerate() if t.name == "cdcstore-stream"]
    print("prefetch threads alive at exit:", alive, flush=True)

atexit.register(check)
from cdcstore.stream import StreamingDataset
ds = StreamingDataset("cdc://ds/data/", store=sys.argv[1], batch_size=1000, format="arrow", columns=["id", "s"])
it = iter(ds)
print("first batch rows:", next(it).num_rows, flush=True)
"""


def test_a_process_that_breaks_off_a_stream_exits_with_its_prefetch_thread_stopped(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):  # row groups large enough that the prefetch thread is reading when the child exits
        ids = np.arange(i * 400_000, (i + 1) * 400_000)
        pq.write_table(pa.table({"id": ids, "s": [f"row {v}" for v in ids]}), data / f"part-{i}.parquet",
                       row_group_size=100_000)
    root = str(tmp_path / "st")
    with Store.init(root) as s:
        s.push([str(data)], "cdc://ds/data/")
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", CHILD, root], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        assert "first batch rows: 1000" in p.stdout
        assert "prefetch threads alive at exit: []" in p.stdout, p.stdout
        assert "Fatal" not in p.stderr and "terminate called" not in p.stderr, p.stderr[-2000:]

"""Scripts that read cdc:// with pyarrow or pandas exit with code 0 (apache/arrow#34314:
pyarrow threads freeing Python objects during interpreter teardown abort with 134)."""
import gc
import weakref

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cdcstore import Store
from cdcstore.storage import reader
from cdcstore.fs import CdcFileSystem

RUNS = 50
HOWS = [("pyarrow", "pyarrow"), ("pyarrow", "pyarrow"), ("pyarrow", "pandas")]  # pandas aborts less often
CHILD = """
import sys
store, how = sys.argv[1], sys.argv[2]
url = "cdc://ds/data/t.parquet"
if how == "pyarrow":
    import fsspec, pyarrow.parquet as pq
    n = pq.read_table(url, filesystem=fsspec.filesystem("cdc", store=store)).num_rows
else:
    import pandas as pd
    n = len(pd.read_parquet(url, storage_options={"store": store}))
assert n == 20000, n
"""


def make_store(tmp_path) -> str:
    data = tmp_path / "data"
    data.mkdir()
    t = pa.table({"id": np.arange(20000), "x": np.random.default_rng(1).random(20000)})
    pq.write_table(t, data / "t.parquet", row_group_size=5000)  # several row groups: async reads
    with Store.init(str(tmp_path / "store")) as s:
        s.push([str(data)], "cdc://ds/data/")
    return str(tmp_path / "store")


def test_short_reads_exit_cleanly(tmp_path):
    from forker import Forker

    make_store(tmp_path)
    codes = []
    # the children are forked from a Python that has imported pyarrow, pandas and cdcstore (an
    # interpreter start and those imports were ~1 s of each child); the abort is at the child's
    # own interpreter shutdown, which a forked child runs in full: with the exit hook removed,
    # forked children aborted 3 of 50 (fresh ones 0 of 30 in the same hour)
    with Forker(tmp_path, preload=("cdcstore", "cdcstore.fs", "fsspec", "pyarrow.parquet", "pandas"),
                freeze=False) as fk:  # the teardown as a script's: what aborted is in it
        for i in range(0, RUNS, 2):  # in pairs: the two cores stay busy, as under a CI's load
            procs = [fk.run([str(tmp_path / "store"), how], code=CHILD) for how in HOWS[i // 2 % len(HOWS)]]
            for p in procs:
                codes.append((p.wait(), p.stderr().strip()[-300:]))
    bad = [c for c in codes if c[0] != 0 or "Traceback" in c[1]]  # a failing exit hook prints one
    assert not bad, f"{len(bad)} of {RUNS} reads exited non-zero: {bad[:3]}"


def test_exit_wait_ends_when_pyarrow_lets_go_and_is_bounded_when_objects_live(tmp_path):
    fs = CdcFileSystem(store=make_store(tmp_path))
    f = fs.open("cdc://ds/data/t.parquet")
    freed = weakref.ref(f)
    pf = pq.ParquetFile(f)  # a live object keeps the file and what was read through it
    del f
    assert pf.read().num_rows == 20000
    # gives up (False) while a live object holds the reader: the main thread frees `pf` later, safely
    assert not reader.arrow_settled(patience=0.2)
    del pf
    gc.collect()
    assert reader.arrow_settled()  # pyarrow let go of the reader
    assert freed() is None

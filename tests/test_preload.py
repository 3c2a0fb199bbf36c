"""runtime.preload: modules imported on a background thread, and a fork waits for them (a child
forked mid-import would inherit a half-made module)."""
import multiprocessing
import subprocess
import sys
import time

from cdcstore import runtime

SLOW = """
import time
time.sleep(0.6)
DONE = True
"""


def _child(name, q):
    mod = sys.modules.get(name)
    q.put(getattr(mod, "DONE", False))


def test_a_fork_waits_for_modules_being_preloaded(tmp_path, monkeypatch):
    name = "cdcstore_slow_module_for_test"
    (tmp_path / f"{name}.py").write_text(SLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    t0 = time.perf_counter()
    runtime.preload(name)
    assert time.perf_counter() - t0 < 0.3  # it returns at once: the import runs meanwhile
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(name, q))
    p.start()  # forks: waits for the import to finish first
    assert q.get(timeout=30) is True
    p.join(30)
    assert sys.modules[name].DONE


CONSTRUCT = """
import sys
from cdcstore import runtime
from cdcstore.streaming.dataset import StreamingDataset
assert "pandas" not in sys.modules, "imported before the stream"
ds = StreamingDataset("cdc://r/t.parquet", batch_size=4, store=sys.argv[1])
print("pandas" in runtime._preloads)
"""


def test_a_stream_preloads_what_its_first_batch_imports(tmp_path):
    """pyarrow imports pandas at a process's first to_numpy (about 1 s of a first batch): a stream
    starts that import while it reads its footers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cdcstore.api import Store
    pq.write_table(pa.table({"x": list(range(10))}), tmp_path / "t.parquet")
    Store.init(str(tmp_path / "s"))
    with Store(str(tmp_path / "s")) as s:
        s.push([str(tmp_path / "t.parquet")], "cdc://r/t.parquet")
    r = subprocess.run([sys.executable, "-c", CONSTRUCT, str(tmp_path / "s")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr

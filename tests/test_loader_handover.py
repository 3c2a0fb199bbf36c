"""`ds.loader(num_workers=N)` hands finished batches over through shared-memory files
(`streaming/handover.py`): the same batches in the same order as in one process, arrays that
view the mapping (no copy), and no file left behind whether the loop ends, breaks off, a worker
is SIGKILLed or the main process is."""
import multiprocessing
import os
import pickle
import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore.streaming import dataset as dsm
from cdcstore.streaming import handover
from cdcstore.streaming.dataset import StreamingDataset

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

FILES, GROUPS, ROWS = 2, 3, 4_000  # 24,000 rows


@pytest.fixture
def source(store, tmp_path, monkeypatch):
    """Two Parquet files of three row groups: ints, floats with NaN, bools, timestamps, strings
    with nulls and a dictionary column; bundles of 4 batches of 250 rows (many files per epoch)."""
    monkeypatch.setattr(dsm, "BUNDLE_ROWS", 1_000)
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(5)
    n = 0
    for i in range(FILES):
        with pq.ParquetWriter(folder / f"part-{i}.parquet", pa.schema([
                ("id", pa.int64()), ("v", pa.float64()), ("ok", pa.bool_()), ("ts", pa.timestamp("ms")),
                ("s", pa.string()), ("cat", pa.dictionary(pa.int32(), pa.string()))])) as w:
            for _ in range(GROUPS):
                ids = np.arange(n, n + ROWS)
                v = rng.random(ROWS)
                v[::97] = np.nan
                s = [None if k % 13 == 0 else f"row {k} " + "x" * int(k % 7) for k in ids]
                w.write_table(pa.table({
                    "id": ids, "v": v, "ok": ids % 3 == 0, "ts": pa.array(ids * 1000, pa.timestamp("ms")),
                    "s": s, "cat": pa.array([("a", "bb", "ccc")[k % 3] for k in ids]).dictionary_encode()}))
                n += ROWS
    store.push([str(folder)], "cdc://ds/train/", message="v1")
    return store


def make(store, **kw):
    return StreamingDataset("cdc://ds/train/", store=store, **{"batch_size": 250, "shuffle": True,
                                                              "shuffle_buffer": 3_000, "seed": 3, **kw})


def files_left() -> list[str]:
    """The hand-over files of this process's folder."""
    path = handover._folders.get(os.getpid())
    return os.listdir(path) if path and os.path.isdir(path) else []


def same(a, b) -> None:
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        assert type(x) is type(y), k
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x.nan_to_num(-1.0) if x.is_floating_point() else x,
                                                      y.nan_to_num(-1.0) if y.is_floating_point() else y), k
        elif isinstance(x, pa.Array):
            assert x.type == y.type and x.equals(y), k
        else:
            assert x.dtype == y.dtype and x.tolist() == y.tolist(), k


@pytest.mark.parametrize("strings", ["arrow", "python"])
def test_the_same_batches_in_the_same_order_through_shared_memory(source, strings):
    before = handover.stats["bundles"]
    got = list(make(source, strings=strings).loader(num_workers=2))
    assert handover.stats["bundles"] - before >= FILES * GROUPS * ROWS // 1_000 - 2  # (a worker's last may be short)
    want = list(make(source, strings=strings).loader(num_workers=0))
    assert len(got) == len(want) == FILES * GROUPS * ROWS // 250
    for a, b in zip(got, want):
        same(a, b)
    b = got[0]
    assert isinstance(b["s"], pa.StringArray if strings == "arrow" else np.ndarray)
    assert isinstance(b["cat"], pa.DictionaryArray if strings == "arrow" else np.ndarray)
    ids = b["id"].numpy()
    assert not ids.flags.owndata and ids.flags.writeable  # a view of the mapping, writable (copy on write)
    b["id"][0] = -5  # no warning, no effect on the next batch
    assert got[1]["id"].tolist() == want[1]["id"].tolist()
    assert files_left() == []


def test_arrow_batches_and_odd_arrays_round_trip(tmp_path):
    """Every kind a batch may hold, through `ship` and a pickle, as the DataLoader queue does."""
    big = pa.array([f"s{i}" if i % 5 else None for i in range(100)])
    batches = [
        {"i": np.arange(10, dtype=np.int32), "m": np.arange(12.0).reshape(4, 3), "e": np.array([], np.int64),
         "s": big.slice(7, 20), "d": pa.array(["x", "y", None, "x"]).dictionary_encode(),
         "b": pa.array([True, None, False]), "bin": pa.array([b"\x00\x01", b""], pa.large_binary()),
         "obj": np.array(["a", "b"], dtype=object), "n": 3},
        {"i": np.arange(5, dtype=np.int32), "m": np.ones((2, 3)), "e": np.array([], np.int64),
         "s": big.slice(0, 0), "d": pa.array(["z"]).dictionary_encode(), "b": pa.array([False]),
         "bin": pa.array([b"z"], pa.large_binary()), "obj": np.array([None], dtype=object), "n": 4},
        pa.record_batch({"x": pa.array([1, 2, None]), "t": pa.array(["u", None, "w"])}),
        {"empty": pa.array(["", ""]), "nulls": pa.array([None, None], pa.string())},  # no data bytes at all
    ]
    shipped, fd = handover.ship(dsm.Bundle(1, batches, True), str(tmp_path), "t-1")
    assert isinstance(shipped, handover.Shipped) and fd is not None
    os.close(fd)
    back = pickle.loads(pickle.dumps(shipped))
    assert not os.listdir(tmp_path)  # unlinked as it was taken
    assert (back.worker, back.last) == (1, True)
    for got, want in zip(back.batches, batches):
        if isinstance(want, pa.RecordBatch):
            assert got.equals(want)
            continue
        for k, v in want.items():
            g = got[k]
            if isinstance(v, np.ndarray):
                assert g.dtype == v.dtype and g.shape == v.shape and g.tolist() == v.tolist(), k
            elif isinstance(v, pa.Array):
                g.validate(full=True)
                assert g.type == v.type and g.equals(v) and g.offset == 0, k
            else:
                assert g == v
    # a folder that cannot take the file: the bundle goes by value
    bundle = dsm.Bundle(0, batches, False)
    assert handover.ship(bundle, str(tmp_path / "missing"), "t-2") == (bundle, None)


def test_a_loop_that_breaks_off_leaves_no_file(source):
    loader = make(source, strings="arrow").loader(num_workers=2, prefetch_factor=4)
    for i, _ in enumerate(loader):
        if i == 5:
            break
    assert files_left() == []
    # persistent workers: a loop broken off, then a whole epoch, the same batches as in process
    loader = make(source, strings="arrow").loader(num_workers=2, persistent_workers=True)
    for i, _ in enumerate(loader):
        if i == 5:
            break
    got = list(loader)
    want = list(make(source, strings="arrow").loader(num_workers=0))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        same(a, b)
    del loader, got
    assert files_left() == []


def test_a_sigkilled_worker_leaves_no_file(source):
    loader = make(source, strings="arrow").loader(num_workers=2, prefetch_factor=4)
    before = {p.pid for p in psutil.Process().children()}
    it = iter(loader)
    next(it)
    workers = [p for p in psutil.Process().children() if p.pid not in before and p.name() != "sh"]
    assert len(workers) == 2
    time.sleep(0.3)  # both write ahead
    os.kill(workers[0].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        for _ in it:
            pass
    assert files_left() == []


def _run_and_hang(store_path: str, q) -> None:
    ds = StreamingDataset("cdc://ds/train/", store=store_path, batch_size=250)
    dsm.BUNDLE_ROWS = 1_000
    it = iter(ds.loader(num_workers=2, prefetch_factor=4))
    next(it)
    q.put(handover._folders[os.getpid()])
    time.sleep(60)


def test_a_sigkilled_main_process_leaves_no_file(source):
    """Its workers exit with it, and the folder's reaper removes what they had written."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_run_and_hang, args=(source.location, q))
    p.start()
    try:
        path = q.get(timeout=30)
        time.sleep(0.3)  # the workers write ahead: files wait in the folder
        assert os.listdir(path)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    deadline = time.monotonic() + 10
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(path)

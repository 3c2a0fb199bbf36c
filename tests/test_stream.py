"""cdcstore.streaming.dataset: exactly once per epoch on any split, exact elastic resume, bounded memory."""
import gc
import os
import pickle
import random
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.core.errors import CorruptionError, InvalidAddressError, PathNotFoundError
from cdcstore.streaming.dataset import StreamingDataset

BATCH = 7  # divides no row group, file or total
WINDOW = 50
GROUPS = [[37, 50, 13], [64], [5, 60, 41, 7], [1], [23, 29, 31, 37, 41, 43], [59, 11]]
TOTAL = sum(map(sum, GROUPS))
MAX_GROUP = max(map(max, GROUPS))


def write_files(folder, groups=GROUPS, first=0):
    """Parquet files with row groups of the given (uneven) sizes; `id` numbers the rows."""
    folder.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("s", pa.string())])
    n = first
    for i, sizes in enumerate(groups):
        with pq.ParquetWriter(folder / f"part-{i}.parquet", schema) as w:
            for k in sizes:
                ids = np.arange(n, n + k)
                w.write_table(pa.table({"id": ids, "x": ids * 0.5, "s": [f"row {v}" for v in ids]}, schema=schema))
                n += k
    (folder / "README.txt").write_text("not parquet: a folder source skips it")
    return n - first


@pytest.fixture
def ds_store(tmp_path, store):
    write_files(tmp_path / "data")
    store.push([str(tmp_path / "data")], "cdc://ds/train/", message="v1")
    return store


def make(store, **kw):
    kw = {"batch_size": BATCH, "shuffle": True, "seed": 5, "shuffle_buffer": WINDOW, "columns": ["id"], **kw}
    return StreamingDataset("cdc://ds/train/", store=store, **kw)


def ids_of(batches):
    return [int(v) for b in batches for v in b["id"]]


def loader_order(store, world_size, num_workers, epoch=0, state=None, steps=None, **kw):
    """What DataLoaders on `world_size` ranks with `num_workers` workers each hand to the training loop,
    step by step (a DataLoader takes batches from its workers in turn): a list of steps, each the
    batches of every rank. Stops after `steps` steps when given."""
    per_rank = []
    for r in range(world_size):
        ds = make(store, rank=r, world_size=world_size, **kw)
        ds.set_epoch(epoch)
        if state:
            ds.load_state_dict(state)
        per_rank.append(_round_robin([list(ds.iterate(w, num_workers)) for w in range(num_workers)]))
    out = [[rank[t] for rank in per_rank if t < len(rank)] for t in range(max(map(len, per_rank)))]
    return out if steps is None else out[:steps]


def without_tail_repeats(seen, ranks):
    """`seen` without the rows the even tail repeats (when fewer rows than ranks remain, a rank left
    without one repeats the tail's first row): at most ranks - 1 of them, each an earlier row."""
    out = list(dict.fromkeys(seen))
    assert len(seen) - len(out) <= ranks - 1, (len(seen), len(out))
    return out


def _round_robin(workers):
    """torch's in-order DataLoader: batch j from worker j mod W, skipping workers that are done."""
    out, its = [], [iter(w) for w in workers]
    live = list(range(len(workers)))
    while live:
        for w in list(live):
            b = next(its[w], None)
            if b is None:
                live.remove(w)
            else:
                out.append(b)
    return out


def flat(steps):
    return [i for step in steps for i in ids_of(step)]


PAIRS = [(1, 1), (1, 3), (2, 2), (3, 1), (4, 3)]


@pytest.mark.parametrize("world_size,num_workers", PAIRS)
def test_exactly_once_per_epoch_on_any_split(ds_store, world_size, num_workers):
    single = flat(loader_order(ds_store, 1, 1))
    assert sorted(single) == list(range(TOTAL))
    for epoch in (0, 1):
        got = flat(loader_order(ds_store, world_size, num_workers, epoch=epoch))
        assert sorted(got) == list(range(TOTAL)), "each row exactly once"
        # the DataLoaders of all ranks together hand out the one global order, in order
        assert got == flat(loader_order(ds_store, 1, 1, epoch=epoch))


def test_kill_at_20_points_and_resume_on_another_split(ds_store):
    rnd = random.Random(1)
    for _ in range(20):
        (r1, w1), (r2, w2) = rnd.sample(PAIRS, 2)
        epoch = rnd.randrange(2)
        full = loader_order(ds_store, r1, w1, epoch=epoch)
        steps = rnd.randrange(len(full) + 1)
        before = flat(full[:steps])
        state = make(ds_store, rank=0, world_size=r1).state_dict(steps=steps)  # the steps each rank took
        state["epoch"] = epoch
        after = flat(loader_order(ds_store, r2, w2, epoch=epoch, state=state))
        assert without_tail_repeats(before + after, r2) == flat(loader_order(ds_store, 1, 1, epoch=epoch)), \
            (r1, w1, steps, r2, w2)


def test_state_dict_counts_in_process_and_resumes_mid_batch(ds_store):
    ds = make(ds_store, batch_size=None, block_size=3)
    it = iter(ds)
    before = [next(it)["id"] for _ in range(101)]  # not a multiple of the block
    state = ds.state_dict()
    assert state["consumed"] == 101 and state["commits"] == ds.commits
    after = []
    for w in range(3):
        other = make(ds_store, batch_size=None, block_size=3, rank=0, world_size=1)
        other.load_state_dict(pickle.loads(pickle.dumps(state)))
        after += [row["id"] for row in other.iterate(w, 3)]
    assert sorted(before + after) == list(range(TOTAL))


def test_same_seed_same_order_new_epoch_or_seed_another(ds_store):
    a = ids_of(make(ds_store))
    assert a == ids_of(make(ds_store))
    assert a != ids_of(make(ds_store, seed=6))
    ds = make(ds_store)
    ds.set_epoch(1)
    assert a != ids_of(ds) and sorted(ids_of(ds)) == sorted(a)
    plain = ids_of(make(ds_store, shuffle=False))
    assert plain == list(range(TOTAL))


def test_shuffle_moves_rows_across_row_groups_but_memory_stays_bounded(ds_store):
    ds = make(ds_store, prefetch_row_groups=1)
    got = ids_of(ds)
    m = ds.metrics()
    # rows held at once: about one window, plus the row groups cut by its edges
    assert m["max_rows_held"] <= 2 * WINDOW + 2 * MAX_GROUP < TOTAL
    assert got[:WINDOW] != sorted(got[:WINDOW])
    big = make(ds_store, shuffle_buffer=TOTAL)
    ids_of(big)
    assert big.metrics()["max_rows_held"] == TOTAL


def test_pinned_snapshot_and_pickling(ds_store, tmp_path):
    ds = make(ds_store)
    expected = ids_of(ds)
    write_files(tmp_path / "more", [[10, 10]], first=TOTAL)
    ds_store.push([str(tmp_path / "more")], "cdc://ds/train/more/", message="v2")
    blob = pickle.dumps(ds)
    assert b"sqlite" not in blob.lower()
    copy = pickle.loads(blob)
    assert copy._store.here() is None and copy.commits == ds.commits  # no store crosses a pickle
    assert ids_of(copy) == expected, "the revision was resolved once, at construction"
    assert make(ds_store).num_rows == TOTAL + 20


def test_formats_columns_and_figures(ds_store):
    arrow = list(StreamingDataset("cdc://ds/train/part-0.parquet", batch_size=40, format="arrow", store=ds_store))
    assert all(isinstance(b, pa.RecordBatch) for b in arrow)
    assert [b.num_rows for b in arrow] == [40, 40, 20] and arrow[0].schema.names == ["id", "x", "s"]
    py = next(iter(StreamingDataset("cdc://ds/train/part-*.parquet", batch_size=2, format="python",
                                    columns=["s"], store=ds_store)))
    assert py == {"s": ["row 0", "row 1"]}
    rows = StreamingDataset(["cdc://ds/train/part-3.parquet", "cdc://ds/train/part-1.parquet"], store=ds_store)
    got = list(rows)
    assert got[0] == {"id": 37 + 50 + 13 + 64 + 5 + 60 + 41 + 7, "x": got[0]["id"] * 0.5, "s": f"row {got[0]['id']}"}
    assert len(got) == 65
    narrow, wide = make(ds_store), make(ds_store, columns=None)
    ids_of(narrow), ids_of(wide)
    m = narrow.metrics()
    assert m["samples"] == TOTAL and m["batches"] == -(-TOTAL // BATCH) and m["samples_per_s"] > 0
    assert 0 < m["bytes_read"] < wide.metrics()["bytes_read"]
    assert m["store"] == {**ds_store.counters(), **ds_store.cache_counters()}


def test_skip_take_and_drop_last(ds_store):
    order = ids_of(make(ds_store))
    assert ids_of(make(ds_store).skip(30)) == order[30:]
    assert ids_of(make(ds_store).skip(30).take(40)) == order[30:70]
    assert ids_of(make(ds_store).take(40).skip(30)) == order[30:40]
    batches = [list(make(ds_store, rank=r, world_size=2, drop_last=True).iterate(w, 3))
               for r in range(2) for w in range(3)]
    assert len({len(b) for b in batches}) == 1 and all(len(x["id"]) == BATCH for b in batches for x in b)
    assert TOTAL - 6 * BATCH < sum(len(x["id"]) for b in batches for x in b) <= TOTAL


def test_bad_input_is_one_clear_error(ds_store):
    with pytest.raises(PathNotFoundError, match="no Parquet file"):
        StreamingDataset("cdc://ds/nothing-here/", store=ds_store)
    with pytest.raises(ValueError, match="format"):
        StreamingDataset("cdc://ds/train/", format="pandas", store=ds_store)
    with pytest.raises(InvalidAddressError, match="README.txt is not a readable Parquet file"):
        StreamingDataset("cdc://ds/train/README.txt", store=ds_store)
    other = StreamingDataset("cdc://ds/train/", seed=9, store=ds_store)
    with pytest.raises(ValueError, match="another snapshot or order"):
        other.load_state_dict(make(ds_store).state_dict())


def test_over_a_real_server(server, tmp_path):
    write_files(tmp_path / "data")
    with Store(server.url, cache=False) as up:
        up.push([str(tmp_path / "data")], "cdc://ds/train/", message="v1")
    with Store(server.url, cache=str(tmp_path / "cache")) as s:
        got = []
        for r in range(2):
            ds = make(s, rank=r, world_size=2)
            for w in range(2):
                got += ids_of(ds.iterate(w, 2))
        assert sorted(got) == list(range(TOTAL))
        assert ds.metrics()["store"]["requests"] > 0
        remote = pickle.loads(pickle.dumps(make(server.url)))
        assert remote._store.here() is None and sorted(ids_of(remote)) == list(range(TOTAL))


def test_torch_dataloader_with_two_persistent_workers(ds_store):
    import torch.utils.data as torch_data  # in the test extra: this test fails, never skips, without torch
    ds = make(ds_store)
    copy = pickle.loads(pickle.dumps(make(ds_store).as_torch()))  # found by name, as a spawned worker does
    assert isinstance(copy, torch_data.IterableDataset) and ids_of(copy) == ids_of(make(ds_store))
    loader = torch_data.DataLoader(ds.as_torch(), batch_size=None, num_workers=2, persistent_workers=True)
    for epoch in (0, 1):
        ds.set_epoch(epoch)  # reaches the persistent workers
        got = [int(v) for b in loader for v in b["id"]]
        assert got == flat(loader_order(ds_store, 1, 1, epoch=epoch))
    m = ds.metrics()  # figures add up the workers
    assert m["samples"] == 2 * TOTAL and m["batches"] == 2 * -(-TOTAL // BATCH) and m["row_groups"] >= 2 * 14
    # both workers drew rows from most row groups, yet each was fetched and decoded once per epoch
    # (the other worker mapped it from the shared folder), and the folder is empty after each epoch
    assert m["decodes"] == 2 * len(ds.units) < m["row_groups"], m
    assert os.listdir(ds._decoded.path) == []
    assert m["bytes_read"] > 0 and m["samples_per_s"] > 0 and m["store"]["requests"] == 0
    # resume recipe: count steps in the loop, then state_dict(consumed=steps * world_size * batch)
    ds.set_epoch(2)
    seen, steps = [], 0
    for b in loader:
        seen += [int(v) for v in b["id"]]
        steps += 1
        if steps == 5:
            break
    state = ds.state_dict(consumed=steps * BATCH)
    fresh = make(ds_store)
    fresh.load_state_dict(state)
    rest = [int(v) for b in torch_data.DataLoader(fresh.as_torch(), batch_size=None, num_workers=1) for v in b["id"]]
    assert sorted(seen + rest) == list(range(TOTAL))
    folder = ds._decoded.path
    del loader, ds, copy
    gc.collect()
    assert not os.path.exists(folder)  # the shared folder goes with the main process's dataset


def test_interleave_mixes_by_seed_and_resumes(ds_store):
    from cdcstore.streaming.dataset import interleave

    def sources():
        return [StreamingDataset("cdc://ds/train/part-[0-2].parquet", batch_size=None, columns=["id"],
                                 store=ds_store, shuffle=True, seed=1),
                StreamingDataset("cdc://ds/train/part-[3-5].parquet", batch_size=None, columns=["id"],
                                 store=ds_store, shuffle=True, seed=2)]

    small = sum(map(sum, GROUPS[:3]))
    full = [r["id"] for r in interleave(sources(), [0.25, 0.75], seed=3, stopping="all_exhausted")]
    assert sorted(full) == list(range(TOTAL))
    assert full == [r["id"] for r in interleave(sources(), [0.25, 0.75], seed=3, stopping="all_exhausted")]
    head = [i < small for i in full[:200]]
    assert 20 < sum(head) < 80, "about a quarter from the first source"
    first = [r["id"] for r in interleave(sources(), [0.25, 0.75], seed=3)]
    assert len(first) < TOTAL and full[:len(first)] == first
    mix = interleave(sources(), [0.25, 0.75], seed=3, stopping="all_exhausted")
    it = iter(mix)
    before = [next(it)["id"] for _ in range(123)]
    again = interleave(sources(), [0.25, 0.75], seed=3, stopping="all_exhausted")
    again.load_state_dict(pickle.loads(pickle.dumps(mix.state_dict())))
    assert before + [r["id"] for r in again] == full


def test_prefetch_stays_within_its_byte_budget():
    from cdcstore.streaming.dataset import _Prefetcher

    seen, ready = [], threading.Event()

    def produce():
        ready.wait()
        for i in range(50):
            seen.append(pre._bytes)  # what is queued while the next row group is read
            yield i, 40

    pre = _Prefetcher(produce, max_bytes=100, max_items=8)
    ready.set()
    got = []
    while (item := pre.get()) is not None:
        got.append(item)
    pre.close()
    assert got == list(range(50)) and max(seen) <= 100


def test_a_damaged_pack_fails_the_consumer_instead_of_hanging(ds_store, tmp_path):
    ds = make(ds_store)
    for pack in (tmp_path / "store" / "packs").rglob("*"):
        if pack.is_file():
            data = bytearray(pack.read_bytes())
            data[len(data) // 2:] = bytes(len(data) - len(data) // 2)
            pack.write_bytes(bytes(data))
    with pytest.raises(CorruptionError):
        ids_of(ds)


def test_figures_cache_hit_ratio_cold_then_warm(server, tmp_path, monkeypatch):
    folder = tmp_path / "big"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):  # ~1.6 MB of random floats each: many chunks
        pq.write_table(pa.table({"v": rng.random(200_000)}), folder / f"p{i}.parquet", row_group_size=50_000)
    with Store(server.url, cache=False) as up:
        up.push([str(folder)], "cdc://big/", message="v1")
    with Store(server.url, cache=str(tmp_path / "resolve-cache")) as s:
        built = StreamingDataset("cdc://big/", batch_size=1000, store=s)
    monkeypatch.setenv("CDCSTORE_CACHE", str(tmp_path / "fresh-cache"))  # workers' default cache
    cold = pickle.loads(pickle.dumps(built))  # rebuilds its store with the fresh default cache
    assert sum(len(b["v"]) for b in cold) == 600_000
    m = cold.metrics()
    assert m["cache_misses"] > 10 and m["cache_hit_ratio"] < 0.8
    assert m["requests"] > 0 and m["samples_per_s"] > 0 and m["mb_per_s"] > 0 and m["wait_seconds"] >= 0
    cold.store.backend.cache.wait()
    fetched = cold.store.backend.cache.stats()["chunks"]  # distinct chunks the cold pass fetched
    # each chunk is fetched once, though the footer check, the row group read and read-ahead all
    # touch some chunks (they find it cached, or wait for the read in flight that fetches it)
    assert m["cache_misses"] == fetched > 10, (m, fetched)
    assert m["received_bytes"] < 1.15 * sum(f.stat().st_size for f in folder.iterdir()), m
    # row groups were fetched ahead (while the one before decoded), and that fetched nothing twice
    assert 0 < m["warmed"] < m["row_groups"] == 12, m
    warm = pickle.loads(pickle.dumps(built))
    assert sum(len(b["v"]) for b in warm) == 600_000
    w = warm.metrics()
    assert w["cache_misses"] == 0 and w["cache_hits"] >= fetched and w["requests"] < m["requests"], (m, w, fetched)


def test_loader_hands_numpy_over_and_gives_tensors(ds_store):
    import torch
    ds = make(ds_store, columns=["id", "s"])
    got = list(ds.loader(num_workers=2, persistent_workers=True))
    assert all(isinstance(b["id"], torch.Tensor) and b["s"].dtype == object for b in got)
    assert [int(v) for b in got for v in b["id"]] == flat(loader_order(ds_store, 1, 1))
    assert ds.metrics()["samples"] == TOTAL
    raw = next(iter(make(ds_store).loader(num_workers=1, tensors=False)))
    assert isinstance(raw["id"], np.ndarray)


def test_a_damaged_store_is_reported_as_damage_not_as_a_bad_file(ds_store):
    """A footer that cannot be read because the store is damaged says so (not "not Parquet")."""
    import glob
    import os

    for pack in glob.glob(os.path.join(ds_store.location, "packs", "*", "*.pack")):
        with open(pack, "r+b") as f:
            f.truncate(64)  # every pack cut short: the chunks cannot be read back
    with pytest.raises(CorruptionError):
        StreamingDataset("cdc://ds/train/", store=ds_store.location)


def test_the_order_is_kept_per_step_not_per_batch(ds_store, monkeypatch):
    """Issue 30: the order's bookkeeping (locate, the steps) runs once per step of STEP_ROWS
    positions, however small the batches: 1-row batches over TOTAL rows locate a few times, and
    every row still comes once, in order."""
    from cdcstore.streaming import dataset as stream_mod
    from cdcstore.streaming import order as order_mod

    calls = []
    real = order_mod.EpochOrder.locate
    monkeypatch.setattr(order_mod.EpochOrder, "locate", lambda self, seq: calls.append(len(seq)) or real(self, seq))
    monkeypatch.setattr(stream_mod, "STEP_ROWS", 128)
    got = ids_of(make(ds_store, batch_size=1, shuffle=False))
    assert got == list(range(TOTAL))
    assert len(calls) <= -(-TOTAL // 128) + 1, f"{len(calls)} locates for {TOTAL} one-row batches"


@pytest.mark.parametrize("columns", [["x", "ident"], ["ident"]])
def test_a_misspelled_column_is_an_error_naming_the_closest(ds_store, columns):
    """A column no file has was dropped silently: batches of the other columns only, or empty
    `{}` batches while `len` counted rows. Now an error names it and the closest names, as pyarrow
    does for an unknown column; nothing is yielded."""
    with pytest.raises(InvalidAddressError, match=r"no column 'ident' in .*did you mean 'id'") as e:
        list(make(ds_store, columns=columns))  # at once, when the footers are read
    assert "its columns are id, x, s" in str(e.value)

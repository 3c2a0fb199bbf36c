"""Resume without arithmetic: `ds.loader().state_dict()` under torchrun, with 2 ranks x 2 DataLoader
workers, killed mid-epoch and resumed on 1 and on 3 ranks; every row exactly once, and every rank
takes the same number of steps.

The killed run starts under `torchrun`; the resumed runs' ranks are forked from a Python that has
imported torch (tests/forker.py), with the variables torchrun gives its ranks (RANK, WORLD_SIZE,
MASTER_ADDR, ...): each torchrun was a launcher and its ranks importing torch one after the other,
~2/3 of the test's minute (2-3 s of CPU per import)."""
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.storage.repository import LocalStore
from cdcstore.streaming.dataset import StreamingDataset

BATCH = 16
GROUPS = [[200, 130], [57], [310, 91, 44], [171]]  # 1,003 rows: no split divides it
TOTAL = sum(map(sum, GROUPS))

TRAIN = r'''
import json, os, sys
import torch.distributed as dist
from cdcstore.streaming.dataset import StreamingDataset

store, out, state_in, stop_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
ds = StreamingDataset("cdc://ds/train/", store=store, batch_size=%(batch)d, shuffle=True, seed=3,
                      shuffle_buffer=100, columns=["id"])
loader = ds.loader(num_workers=2)
if state_in != "-":
    loader.load_state_dict(json.load(open(state_in)))
seen, steps = [], 0
for batch in loader:
    seen += batch["id"].tolist()
    steps += 1
    dist.barrier()  # a DDP step: every rank's all-reduce
    if steps == stop_at:
        if rank == 0:
            json.dump(loader.state_dict(), open(os.path.join(out, "state.json"), "w"))
        json.dump({"seen": seen, "steps": steps, "len": len(loader)}, open(os.path.join(out, f"rank{rank}.json"), "w"))
        for _ in range(2):  # work past the checkpoint that the kill throws away
            next(iter(loader), None)
        os._exit(0)  # killed: no clean shutdown
json.dump({"seen": seen, "steps": steps, "len": len(loader)}, open(os.path.join(out, f"rank{rank}.json"), "w"))
dist.barrier()
dist.destroy_process_group()
''' % {"batch": BATCH}


def write_data(folder):
    folder.mkdir(parents=True)
    n = 0
    for i, sizes in enumerate(GROUPS):
        with pq.ParquetWriter(folder / f"part-{i}.parquet", pa.schema([("id", pa.int64())])) as w:
            for k in sizes:
                w.write_table(pa.table({"id": np.arange(n, n + k)}))
                n += k


def torchrun(tmp_path, name, ranks, store, state, stop_at):
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_port=0",
           "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", str(script), store, str(out), state, str(stop_at)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CDCSTORE_CACHE": str(tmp_path / f"cache-{name}")}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)], out


def forked_ranks(fk, tmp_path, name, ranks, store, state, stop_at, deadline=240.0):
    """What `torchrun` does for TRAIN, with ranks forked by `fk` (a Forker that imported torch)."""
    out = tmp_path / name
    out.mkdir()
    with socket.socket() as s:  # a free port for the ranks' rendezvous (torchrun's --master_port=0)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE":
           str(ranks), "GROUP_RANK": "0", "CDCSTORE_CACHE": str(tmp_path / f"cache-{name}")}
    procs = [fk.run([store, str(out), state, str(stop_at)], code=TRAIN,
                    env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(ranks)]
    end = time.monotonic() + deadline
    while any(p.returncode is None for p in procs):  # as torchrun: one rank failing ends the others
        for p in procs:
            if p.returncode is None and p.exited():
                if p.wait() != 0:
                    for q in procs:
                        q.send_signal(9)
                    raise AssertionError(f"rank {procs.index(p)} exited {p.returncode}: {p.stderr()[-3000:]}")
        if time.monotonic() > end:
            for q in procs:
                q.send_signal(9)
            raise AssertionError(f"ranks still running after {deadline:.0f} s: {[p.stderr()[-500:] for p in procs]}")
        time.sleep(0.02)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)], out


@pytest.fixture
def store_dir(tmp_path):
    write_data(tmp_path / "data")
    path = str(tmp_path / "store")
    LocalStore.init(path)
    with Store(path) as s:
        s.push([str(tmp_path / "data")], "cdc://ds/train/", message="v1")
    return path


def test_killed_two_rank_run_resumes_on_one_and_on_three_ranks_exactly_once(tmp_path, store_dir):
    from forker import Forker

    # the forker imports torch while torchrun runs
    with Forker(tmp_path, preload=("torch", "torch.distributed", "torch.utils.data", "cdcstore.streaming.dataset"),
                env={"OMP_NUM_THREADS": "1"}) as fk:
        first, out = torchrun(tmp_path, "first", 2, store_dir, "-", stop_at=9)
        assert [r["steps"] for r in first] == [9, 9]
        state = json.loads((out / "state.json").read_text())
        assert state["consumed"] == 9 * 2 * BATCH  # no arithmetic in the loop: the loader counted
        rests = {ranks: forked_ranks(fk, tmp_path, f"rest{ranks}", ranks, store_dir, str(out / "state.json"), -1)[0]
                 for ranks in (1, 3)}
    for ranks, rest in rests.items():
        steps = {r["steps"] for r in rest}
        assert len(steps) == 1 and steps == {r["len"] for r in rest}, rest  # equal steps, as len() said
        got = sorted(i for r in first + rest for i in r["seen"])
        assert got == list(range(TOTAL)), ranks  # every row exactly once across the kill


def test_bare_state_dict_with_ranks_or_workers_is_an_error_not_a_wrong_count(store_dir):
    ds = StreamingDataset("cdc://ds/train/", store=store_dir, batch_size=BATCH, rank=0, world_size=2)
    with pytest.raises(ValueError, match="loader.state_dict"):
        ds.state_dict()
    assert ds.state_dict(consumed=64)["consumed"] == 64
    one = StreamingDataset("cdc://ds/train/", store=store_dir, batch_size=BATCH)
    loader = one.loader(num_workers=2)
    assert sum(len(b["id"]) for b in loader) == TOTAL
    with pytest.raises(ValueError, match="DataLoader workers"):
        one.state_dict()
    assert loader.state_dict()["consumed"] == TOTAL and len(loader) == -(-TOTAL // BATCH)


def test_ranks_take_equal_steps_and_every_row_once(store_dir):
    """1,003 rows in batches of 16 on 3 ranks: 62 full blocks and 11 rows; without the even tail
    the ranks took 21, 21 and 21 steps only by luck of the counts, and 2 ranks 32 and 31."""
    for ranks in (2, 3):
        per_rank = []
        for r in range(ranks):
            ds = StreamingDataset("cdc://ds/train/", store=store_dir, batch_size=BATCH, rank=r, world_size=ranks,
                                  shuffle=True, seed=1)
            per_rank.append([b["id"].tolist() for b in ds])
        assert len({len(b) for b in per_rank}) == 1, [len(b) for b in per_rank]
        assert sorted(i for b in per_rank for batch in b for i in batch) == list(range(TOTAL))

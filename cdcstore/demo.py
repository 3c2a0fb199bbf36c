"""`cdcstore demo`: the main job end to end on an embedded local store.

Writes a sharded Parquet dataset, publishes it, edits it (rows updated in one
shard, rows appended to another, a new shard), publishes the edit, reads the new
version back byte for byte and prints what each version stored.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import Store

if TYPE_CHECKING:
    from .api import TransferResult

SHARDS = 8


def make_table(rows: int, seed: int) -> pa.Table:
    """A table with integer, float and text columns (deterministic for a seed)."""
    ids = pa.array(range(seed * 10_000_000, seed * 10_000_000 + rows), pa.int64())
    x = pc.random(rows, initializer=seed)
    y = pc.random(rows, initializer=seed + 1)
    label = pc.cast(pc.floor(pc.multiply(x, 1000)), pa.int64())
    words = pc.binary_join_element_wise(
        "token", pc.cast(label, pa.string()), pc.cast(pc.floor(pc.multiply(y, 1e9)), pa.int64()).cast(pa.string()),
        " ")
    return pa.table({"id": ids, "x": x, "y": y, "label": label, "text": words})


def write(table: pa.Table, path: str) -> None:
    pq.write_table(table, path, compression="zstd", use_content_defined_chunking=True)


def _commit(r: TransferResult) -> str:
    """The commit a push landed (a push makes or keeps one)."""
    if r.commit is None:
        raise TypeError(f"the push made no commit: {r}")
    return r.commit


def _row(name: str, r) -> str:
    mb = 1024 * 1024
    return (f"{name:<10} {r.files:>5} files {r.bytes / mb:>9.1f} MiB   new {r.new_bytes / mb:>8.2f} MiB "
            f"({100 * r.new_bytes / max(1, r.bytes):5.1f}%)   stored {r.stored_bytes / mb:>8.2f} MiB"
            f"   {r.bytes / mb / max(r.seconds, 1e-9):7.0f} MiB/s")


def run(size_mb: int = 64, workdir: str | None = None) -> dict:
    own = workdir is None
    work = workdir or tempfile.mkdtemp(prefix="cdcstore-demo-")
    try:
        data = os.path.join(work, "dataset")
        os.makedirs(data, exist_ok=True)
        rows = max(1000, size_mb * 1024 * 1024 // 40 // SHARDS)  # about 40 bytes a row on disk
        shards = [make_table(rows, seed) for seed in range(SHARDS)]
        for i, t in enumerate(shards):
            write(t, os.path.join(data, f"part-{i:03d}.parquet"))
        store_dir = os.path.join(work, "store")
        if os.path.exists(store_dir):
            shutil.rmtree(store_dir)
        store = Store.init(store_dir)
        print(f"store: {store.location} (embedded, local)")

        v1 = store.push([data], "cdc://demo/", message="v1")
        print(_row("push v1", v1), f"commit {_commit(v1)[:12]}")
        print(f"           new < pushed: {(v1.bytes - v1.new_bytes) / 2**20:.2f} MiB of v1's chunks repeat within it "
              f"(the same pages in several shards) and are stored once")
        again = store.push([data], "cdc://demo/", message="v1 again")
        print(_row("re-push", again), "(no changes)" if not again.changed else "")

        # the edit: 1% of rows updated in one shard, rows appended to another, one new shard
        t = shards[2]
        n = t.num_rows
        mask = pc.equal(pc.bit_wise_and(t["id"], pa.scalar(127, pa.int64())), 0)
        t = t.set_column(1, "x", pc.if_else(mask, pa.scalar(-1.0), t["x"]))
        write(t, os.path.join(data, "part-002.parquet"))
        write(pa.concat_tables([shards[5], make_table(n // 100, 99)]), os.path.join(data, "part-005.parquet"))
        write(make_table(n // 4, 100), os.path.join(data, f"part-{SHARDS:03d}.parquet"))

        v2 = store.push([data], "cdc://demo/", message="v2: edits")
        print(_row("push v2", v2), f"commit {_commit(v2)[:12]}")
        detail = v2.files_detail or {}  # (new_bytes_by_file is empty without it)
        for path, n in v2.new_bytes_by_file.items():
            print(f"           {path}: {n / 2**20:.2f} MiB new of {detail[path]['bytes'] / 2**20:.2f}")

        out = os.path.join(work, "readback")
        t0 = time.perf_counter()
        r = store.pull("cdc://demo/", out)
        secs = time.perf_counter() - t0
        for name in sorted(os.listdir(data)):
            with open(os.path.join(data, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
                if a.read() != b.read():
                    raise SystemExit(f"read-back mismatch in {name}")
        print(f"read back {r.files} files, {r.bytes / 2**20:.1f} MiB in {secs:.2f}s "
              f"({r.bytes / 2**20 / max(secs, 1e-9):.0f} MiB/s): identical to the local files")
        with store.open(f"cdc://demo@{_commit(v1)[:8]}/part-002.parquet") as f:
            old = pq.read_table(f, columns=["x"])
        print(f"v1 is still readable: part-002.parquet@{_commit(v1)[:8]} has {old.num_rows} rows, "
              f"min x = {pc.min(old['x']).as_py():.3f}")
        st = store.stats()
        print(f"store holds {st['bytes'] / 2**20:.1f} MiB of branch heads and two versions in "
              f"{st['pack_bytes'] / 2**20:.1f} MiB of packs")
        print(f"sent: the embedded store is local, so 'stored' is all that was written "
              f"({(v1.stored_bytes + v2.stored_bytes) / 2**20:.1f} MiB); against a server "
              f"(`cdcstore serve`) the same push sends about that much plus ~32 bytes per chunk id")
        summary = {"v1": v1.to_dict(), "v2": v2.to_dict(), "store": st}
        store.close()
        return summary
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)

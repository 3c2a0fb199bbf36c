"""Stream Parquet rows, or WebDataset-style TAR samples, from `cdc://` into training: exact, elastic,
resumable.

    ds = StreamingDataset("cdc://ds@v1/train/", batch_size=1024, shuffle=True, seed=7)
    for batch in ds: ...                       # dicts of numpy arrays
    loader = DataLoader(ds.as_torch(), batch_size=None, num_workers=2)

The revision is resolved once, at construction; footers are read once and travel with the object
when it is pickled to workers. The order, sharding and resume math is in `order.py`; this module
runs it: ranks, workers, epochs, resume, a background thread within a byte budget, figures. The
I/O of each kind of file is its `Source` (`streaming/sources.py`): for each row group a consumer needs, only
the columns asked for; for TAR shards (sample tables from `shards.py`) only the byte ranges of the
samples' members it needs. docs/streaming.md says what is exact and what memory is bounded by.
"""
from __future__ import annotations

import atexit
import collections
import copy
import itertools
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import pyarrow as pa

from .. import runtime
from .. import settings
from ..api import Store
from ..core.address import Address, parse
from ..core.errors import InvalidAddressError
from . import decoded as _decoded
from . import handover as _handover
from . import order as _order
from . import sources as _sources
from .decoded import DecodedUnits
from .sources import (KINDS, LOOK_AHEAD_STEPS, ParquetSource, SampleSource, Source, SourceFile,  # noqa: F401
                      TarSource, expand)
from .sources import Warmer as _Warmer  # noqa: F401 - the name docs/streaming.md used
from .sources import checked_footer as _checked_footer, lying_rows as _lying_rows  # noqa: F401

if TYPE_CHECKING:
    import ctypes

FORMATS = ("numpy", "arrow", "python")
STRINGS = ("python", "arrow")  # how format="numpy" batches carry string and binary columns (`strings=`)
SUMMED = ("samples", "batches", "by_reference", "bytes_read", "row_groups", "decodes", "warmed", "wait_seconds",
          "read_seconds", "requests", "received_bytes", "cache_hits", "cache_misses")
STORE_FIGURES = ("requests", "received_bytes", "cache_hits", "cache_misses")
FIGURES = SUMMED + ("max_rows_held", "started")

STEP_ROWS = 16384  # positions per step of a consumer: the order's bookkeeping is per step, batches are cut from it
SLOTS = 65  # figure slots: this process, then DataLoader workers 0..63 (worker w uses slot w % 64 + 1)
_GLOB = _sources._GLOB


def _candidates(view, path: str) -> dict:
    """The files of a commit that a source path can name (reads only the folders below the
    part of the path before its first glob character)."""
    parts = path.split("/") if path else []
    fixed = []
    for part in parts:
        if _GLOB & set(part):
            break
        fixed.append(part)
    top = "/".join(fixed)
    return view.under(top) if view.kind(top) else {}


def _torch_rank() -> tuple[int, int] | None:
    """(rank, world size) from torch.distributed when it is imported and initialised."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Arguments first, then torch.distributed, then $RANK / $WORLD_SIZE, then (0, 1)."""
    if rank is not None or world_size is not None:
        return int(rank or 0), int(world_size or 1)
    found = _torch_rank()
    if found:
        return found
    return settings.RANK.get(0), settings.WORLD_SIZE.get(1)


class _Shared:
    """Epoch and resume position, shared with DataLoader workers (persistent ones too), and the
    figures they add up: multiprocessing arrays inherited by workers (or passed at spawn), plain
    values when pickled any other way."""

    def __init__(self, epoch: int = 0, start: int = 0):
        self._local = [epoch, start]
        self._arr: ctypes.Array[ctypes.c_longlong] | None = None
        self._figs: ctypes.Array[ctypes.c_double] | None = None

    def share(self) -> None:
        import multiprocessing

        if self._arr is None:
            ctx = multiprocessing.get_context()
            self._arr = ctx.Array("q", self._local, lock=False)
            self._figs = ctx.Array("d", SLOTS * len(FIGURES), lock=False)  # one writer per slot: no lock

    @property
    def shared(self) -> bool:
        return self._figs is not None

    def _shared_figures(self) -> ctypes.Array[ctypes.c_double]:
        if self._figs is None:
            raise TypeError("the figures are not shared (`share` first)")
        return self._figs

    def read(self, slot: int) -> dict:
        n = len(FIGURES)
        return dict(zip(FIGURES, self._shared_figures()[slot * n:(slot + 1) * n]))

    def write(self, slot: int, values: dict) -> None:
        n = len(FIGURES)
        self._shared_figures()[slot * n:(slot + 1) * n] = [float(values[k]) for k in FIGURES]

    def figures(self) -> dict:
        """All slots together."""
        slots = [self.read(i) for i in range(SLOTS)]
        out = {k: sum(f[k] for f in slots) for k in SUMMED}
        out["max_rows_held"] = max(f["max_rows_held"] for f in slots)
        out["started"] = min((f["started"] for f in slots if f["started"]), default=0.0)
        return out

    def get(self) -> tuple[int, int]:
        src = self._arr if self._arr is not None else self._local
        return int(src[0]), int(src[1])

    def set(self, epoch: int, start: int) -> None:
        self._local[:] = [epoch, start]
        if self._arr is not None:
            self._arr[0], self._arr[1] = epoch, start

    def __getstate__(self):
        from multiprocessing.context import get_spawning_popen

        spawning = get_spawning_popen() is not None  # shared arrays go to a child process only
        return {"_local": list(self.get()), "_arr": self._arr if spawning else None,
                "_figs": self._figs if spawning else None}


_prefetchers: "weakref.WeakSet[_Prefetcher]" = weakref.WeakSet()  # running, for `_stop_prefetchers` at exit
_exit_hook = threading.Lock()
EXIT_JOIN = 10.0  # seconds an exiting process waits for a prefetch thread to finish the row group it reads


def _stop_prefetchers() -> None:
    """At exit, before the interpreter is torn down: stop every prefetch thread and wait (bounded)
    until it has left the row group it is reading. A loop that broke off leaves its prefetch thread
    inside pyarrow's `read_row_groups`, whose I/O threads call this process's file objects; one that
    still does so once the interpreter finalizes is cut off mid-read, and the process aborts
    (PyGILState_Release) or hangs in Arrow's pool shutdown (apache/arrow#34314)."""
    for p in list(_prefetchers):
        p.close(timeout=EXIT_JOIN)


class _Prefetcher:
    """Runs `produce` in a thread: it yields (item, nbytes); a bounded queue holds at most
    `max_items` row groups and `max_bytes` bytes of them (always at least one)."""

    def __init__(self, produce, max_bytes: int, max_items: int):
        if _exit_hook.acquire(blocking=False):  # once, after the reader's own hook: atexit runs it first
            atexit.register(_stop_prefetchers)
        _prefetchers.add(self)
        self._produce = produce
        self._max_bytes, self._max_items = max_bytes, max(1, max_items)
        self._q: collections.deque = collections.deque()
        self._bytes = self._units = 0
        self._cv = threading.Condition()
        self._stop = False
        self._done = False
        self._error: BaseException | None = None
        self._thread = runtime.thread(self._run, name="stream")

    def _run(self) -> None:
        items = self._produce()
        try:
            for item, nbytes in items:
                with self._cv:
                    while not self._stop and nbytes and self._units and (
                            self._bytes + nbytes > self._max_bytes or self._units >= self._max_items):
                        self._cv.wait()
                    if self._stop:
                        return
                    self._q.append((item, nbytes))
                    self._bytes += nbytes
                    self._units += bool(nbytes)
                    self._cv.notify_all()
        except BaseException as e:  # handed to the consumer
            self._error = e
        finally:
            items.close()  # closes the files it opened
            with self._cv:
                self._done = True
                self._cv.notify_all()

    def get(self):
        """The next item, or None at the end."""
        with self._cv:
            while not self._q and not self._done:
                self._cv.wait()
            if self._q:
                item, nbytes = self._q.popleft()
                self._bytes -= nbytes
                self._units -= bool(nbytes)
                self._cv.notify_all()
                return item
            if self._error is not None:
                raise self._error
            return None

    def close(self, timeout: float = 30) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=timeout)
        _prefetchers.discard(self)


class StreamingDataset:
    """The rows of one snapshot of `cdc://` sources (Parquet row groups, TAR samples, or another kind
    of `sources.Source`), as batches or rows.

    `source`: `cdc://REPO[@REV]/PATH` naming a file, a folder (its .parquet files or .tar shards) or
    a glob; or a list of them. `format`: "numpy" (dicts of arrays), "arrow" (RecordBatch) or "python" (dicts of
    lists); with `batch_size=None` it yields rows as dicts. `shuffle` permutes row groups and rows
    within windows of `shuffle_buffer` rows. Consumers are dealt blocks of `batch_size` positions; in
    row mode `block_size` (default 1) sets the block: make it the DataLoader's batch size when the
    DataLoader batches rows, so that a count of steps stays an exact resume point.
    `rank`/`world_size` default to torch.distributed, then $RANK/$WORLD_SIZE, then (0, 1).
    `decode` (TAR shards): members decoded by extension as WebDataset's `.decode()` does (txt, json,
    cls, npy; images through Pillow when installed; `streaming/decoders.py`); the default for every format
    but "arrow", which carries bytes. False keeps bytes; a dict adds or replaces decoders.
    `kinds`: the `sources.Source` classes the files may be (default TAR shards, then Parquet).
    `strings` (format "numpy", Parquet columns): "python" (the default) gives string and binary
    columns as numpy object arrays of `str`/`bytes`; "arrow" gives them as pyarrow arrays
    (`StringArray`, `LargeStringArray`, `BinaryArray`, ..., or `DictionaryArray` where the file's
    Arrow schema says dictionary), built and moved as buffers with no Python object per row: what
    DataLoader workers should hand over (`loader(strings="arrow")`; `.to_pylist()` gives the strings).
    """

    def __init__(self, source, *, columns=None, batch_size: int | None = None, format: str = "numpy",
                 shuffle: bool = False, seed: int = 0, shuffle_buffer: int = 10_000,
                 rank: int | None = None, world_size: int | None = None, store=None,
                 token: str | None = None, prefetch_bytes: int = 256 << 20, prefetch_row_groups: int = 8,
                 drop_last: bool = False, block_size: int | None = None, decode: "bool | dict | None" = None,
                 kinds: Sequence[type[Source]] = KINDS, strings: str = "python"):
        if format not in FORMATS:
            raise ValueError(f"format {format!r} is not one of {', '.join(FORMATS)}")
        _check_strings(strings, format)
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer or None, not {batch_size!r}")
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, not {seed!r}")
        self.columns = list(columns) if columns is not None else None
        self.batch_size, self.format, self.strings = batch_size, format, strings
        self.shuffle, self.seed, self.shuffle_buffer = bool(shuffle), int(seed), int(shuffle_buffer)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.block = int(batch_size or block_size or 1)
        self.prefetch_bytes, self.prefetch_row_groups = int(prefetch_bytes), int(prefetch_row_groups)
        self.drop_last = drop_last
        if format != "arrow":  # pyarrow imports pandas (0.2-1 s) at a process's first to_numpy: meanwhile
            runtime.preload("pandas")  # (Arrow batches need no pandas: no import competing with the first batch)
        given = None if store is None or isinstance(store, str) else store  # a Store, else a location or None
        self._store_args = {"location": store if given is None else given.location, "token": token}
        self._store = runtime.Local(given) if given is not None else runtime.Local()  # this process's
        self.files, self.commits = self._resolve([source] if isinstance(source, str) else list(source), kinds)
        kind = _sources.kind_of(self.files, kinds)
        if decode and format == "arrow":
            raise ValueError("format='arrow' carries TAR members as bytes: leave decode out, or pick format='numpy' "
                             "or 'python' to decode them")
        self.source: Source = kind.index(self, self.files, decode)  # the units; the I/O of this kind
        self.units = self.source.units
        self._limit: tuple[int, int | None] = (0, None)  # skip, take
        self._shared = _Shared()
        self._decoded: DecodedUnits | None = None  # row groups shared by DataLoader workers (as_torch)
        self._consumed = 0
        self._metrics = {"samples": 0, "batches": 0, "by_reference": 0, "bytes_read": 0, "row_groups": 0, "decodes": 0,
                         "warmed": 0, "wait_seconds": 0.0, "read_seconds": 0.0, "max_rows_held": 0}
        self._t0: float | None = None
        self._slot = 0  # where this process writes its figures when they are shared
        self._flushed = runtime.Local()  # (figures at start, slot at start) of this process's first iteration

    # -- construction ----------------------------------------------------------------------
    @property
    def store(self) -> Store:
        """This process's Store (nothing network-bound survives a fork or a pickle)."""
        return self._store.get(lambda: Store(self._store_args["location"], token=self._store_args["token"]))

    # -- what a source uses besides the settings (sources.SourceContext) ----------------------
    @property
    def counts(self) -> dict:
        """The figures a source adds to ("bytes_read", "read_seconds", ...): what `metrics()` sums."""
        return self._metrics

    def yielded(self, samples: int, batches: int = 0) -> None:
        """A source handed `samples` rows to its consumer (in `batches` batches): the resume
        position (`state_dict`) and the figures count them."""
        self._consumed += samples
        self._metrics["samples"] += samples
        self._metrics["batches"] += batches

    @property
    def in_worker(self) -> bool:
        """True in a DataLoader worker of `loader()`/`as_torch` (its batches go to the main process)."""
        return self._slot != 0

    def _resolve(self, sources: list[str], kinds) -> tuple[list[SourceFile], dict[str, str]]:
        if not sources:
            raise InvalidAddressError("StreamingDataset needs at least one cdc:// source")
        files: dict[tuple[str, str, str], SourceFile] = {}
        commits: dict[str, str] = {}
        for src in sources:
            a = parse(src)
            key = f"{a.repo}@{a.ref}"
            cid, commit = self.store.resolve(Address(a.repo, commits.get(key, a.rev), a.path))
            commits[key] = cid  # one commit per revision named, even if a branch moves meanwhile
            for f in expand(src, _candidates(self.store.view(a.repo, commit), a.path), cid, kinds):
                files.setdefault((f.repo, f.commit, f.path), f)
        return list(files.values()), commits

    def __getstate__(self):
        from multiprocessing.context import get_spawning_popen

        state = dict(self.__dict__)
        state["_store"] = runtime.Local()
        if get_spawning_popen() is None:  # the decoded row groups go to DataLoader workers only
            state["_decoded"] = None
        return state

    # -- epochs and state --------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return sum(n for _, _, n in self.units)

    @property
    def epoch(self) -> int:
        return self._shared.get()[0]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (in DataLoader workers too). A new epoch starts at
        its beginning; setting the current one keeps a loaded resume position."""
        cur, start = self._shared.get()
        self._shared.set(int(epoch), start if int(epoch) == cur else 0)
        if int(epoch) != cur:
            self._consumed = 0

    def state_dict(self, consumed: int | None = None, *, steps: int | None = None) -> dict:
        """Where the stream is: the count of samples of the epoch's global order consumed so far.

        `steps`: the steps every rank took from its DataLoader since this epoch's start (or resume);
        the count follows (`ds.loader()`'s `state_dict()` does this for you). `consumed`: the count
        itself. With neither, the count is what this object yielded in-process, which is the
        stream's position only with one consumer: with ranks or DataLoader workers this raises."""
        epoch, start = self._shared.get()
        if steps is not None:
            first, end = self.epoch_bounds()
            consumed = _order.position_after(first, end, self.block, self._even_ranks, int(steps)) \
                if self._even_ranks > 1 else min(first + int(steps) * self.world_size * self.block, end)
        if consumed is None and (self.world_size > 1 or self._served_by_workers()):
            who = f"{self.world_size} ranks" if self.world_size > 1 else "DataLoader workers"
            raise ValueError(f"state_dict() without consumed= counts only what this process yielded, which is not "
                             f"the stream's position with {who}: take the state from the loader "
                             f"(loader = ds.loader(...); loader.state_dict()), or pass steps= (the steps each "
                             f"rank took)")
        done = start + self._consumed if consumed is None else int(consumed)
        return {"epoch": epoch, "seed": self.seed, "consumed": min(done, self._order_total()),
                "commits": dict(self.commits), "shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer,
                "limit": list(self._limit), "files": [f.address for f in self.files]}

    def _served_by_workers(self) -> bool:
        return self._shared.shared and any(self._shared.read(i)["samples"] for i in range(1, SLOTS))

    @property
    def _even_ranks(self) -> int:
        """The ranks the even tail is shared by (drop_last makes the epoch even by itself)."""
        return 1 if self.drop_last else self.world_size

    def epoch_bounds(self, num_workers: int = 0) -> tuple[int, int]:
        """(start, end) positions of the current epoch's global order for this many DataLoader workers
        per rank (`end` is short of the total only with drop_last)."""
        _, start = self._shared.get()
        total = self._order_total()
        n = self.world_size * max(num_workers, 1)
        return min(start, total), _order.epoch_end(total, min(start, total), self.block, n, self.drop_last)

    def load_state_dict(self, state: dict) -> None:
        """Resume where `state` was taken, with any number of ranks or workers."""
        mine = {k: getattr(self, k) for k in ("seed", "shuffle", "shuffle_buffer")} | {"limit": list(self._limit)}
        theirs = {k: state.get(k) for k in mine} | {"limit": list(state.get("limit", self._limit))}
        if mine != theirs or state.get("commits") != self.commits or \
                state.get("files", [f.address for f in self.files]) != [f.address for f in self.files]:
            raise ValueError("this state was taken on another snapshot or order (commits, files, seed, shuffle, "
                             "skip/take): "
                             "build the dataset with the same sources at the same commits and settings")
        self._shared.set(int(state["epoch"]), int(state["consumed"]))
        self._consumed = 0

    # -- combinators ---------------------------------------------------------------------------
    def skip(self, n: int) -> "StreamingDataset":
        """A copy that leaves out the first n samples of each epoch's global order."""
        skip, take = self._limit
        return self._limited(skip + int(n), None if take is None else max(take - int(n), 0))

    def take(self, n: int) -> "StreamingDataset":
        """A copy that serves at most the first n samples of each epoch's global order."""
        skip, take = self._limit
        return self._limited(skip, int(n) if take is None else min(take, int(n)))

    def _limited(self, skip: int, take: int | None) -> "StreamingDataset":
        out = copy.copy(self)
        out._limit = (skip, take)
        out._shared = _Shared(*self._shared.get())
        out._metrics = {k: 0 for k in self._metrics}
        out._t0, out._flushed = None, runtime.Local()
        return out

    def _order_total(self) -> int:
        skip, take = self._limit
        n = max(self.num_rows - skip, 0)
        return n if take is None else min(n, take)

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        return self._iter_here()

    def _iter_here(self, refs: bool = False) -> Iterator:
        """This process's share: the whole rank's, or a DataLoader worker's (`refs`: batches handed
        over by reference, for `Loader`)."""
        worker, workers = 0, 1
        torch_data = sys.modules.get("torch.utils.data")
        info = torch_data.get_worker_info() if torch_data is not None else None
        if info is not None:
            worker, workers = info.id, info.num_workers
            self._slot = worker % (SLOTS - 1) + 1
            _decoded.exit_with_parent()  # a worker of a SIGKILLed rank exits (streaming/decoded.py)
            if runtime.bound_malloc():  # a worker's freed row-group buffers go back to the system,
                pa.set_memory_pool(pa.system_memory_pool())  # Arrow's too (mimalloc keeps them a while)
        return self.iterate(worker, workers, refs=refs and info is not None)

    def iterate(self, worker: int = 0, num_workers: int = 1, *, refs: bool = False) -> Iterator:
        """The samples of consumer (this rank, `worker` of `num_workers`) for the current epoch;
        `refs` (a DataLoader worker of `Loader`): batches as `decoded.BatchRef`s where it can."""
        epoch, start = self._shared.get()
        k, n = _order.consumer_index(self.rank, self.world_size, worker, num_workers)
        skip, _ = self._limit
        total = self._order_total()
        order = _order.EpochOrder(tuple(u[2] for u in self.units), self.seed, epoch, self.shuffle,
                                  self.shuffle_buffer)
        end = _order.epoch_end(total, min(start, total), self.block, n, self.drop_last)
        steps = _order.consumer_steps(min(start, total), end, self.block, k, n, rows=STEP_ROWS,
                                      span=order.window if order.window > 1 else STEP_ROWS,
                                      ranks=self._even_ranks)
        self._consumed = 0
        if self._t0 is None:
            self._t0 = time.perf_counter()
            self._started = time.time()
        self._flushed.get(lambda: (self._figures_now(),  # first iteration in this process
                                   self._shared.read(self._slot) if self._shared.shared else {}))
        share = self._decoded if (num_workers > 1 or refs) and self._slot and self.source.shares_decoded else None
        loop = share.loop if share is not None else 0  # the loader's iteration this one serves
        pin = (lambda u: share.pin(epoch, u, loop)) if refs and share is not None else None
        if share is not None:  # the row groups it decodes ahead: those of every num_workers-th slot of the order
            share.worker, share.workers = worker, num_workers
        progress = None
        if share is not None:  # this worker's progress, and the decoded row groups no worker needs now
            slots = range(1, min(num_workers, SLOTS - 1) + 1)

            def progress(past: int) -> None:
                share.report(self._slot, epoch, past)
                share.release(slots, epoch, lambda u: _order.release_bound(order, u) - skip)
            share.report(self._slot, epoch, min(start, total))
        return self._run(lambda: self.source.produce(self, order, steps, skip, share, epoch), progress, pin)

    def _run(self, produce, progress=None, pin=None):
        pre = _Prefetcher(produce, self.prefetch_bytes, self.prefetch_row_groups)
        try:
            yield from self._consume(pre, progress, pin)
            if progress is not None:
                progress(_decoded.DONE)
        finally:
            pre.close()

    def _consume(self, pre: _Prefetcher, progress=None, pin=None):
        """What the source makes of each item the prefetch thread hands over (`Source.consumer`)."""
        take = self.source.consumer(self, progress, pin)
        m = self._metrics
        while True:
            t0 = time.perf_counter()
            item = pre.get()
            m["wait_seconds"] += time.perf_counter() - t0
            if item is None:
                self._flush()
                return
            out = take(item)
            if out is not None:
                yield from out
                self._flush()

    # -- figures and torch ------------------------------------------------------------------------
    def _figures_now(self) -> dict:
        c = {**self.store.counters(), **self.store.cache_counters()}
        return {**self._metrics, **{k: c.get(k, 0) for k in STORE_FIGURES},
                "started": getattr(self, "_started", 0.0)}

    def _flush(self) -> None:
        """Write this process's figures (what an earlier process in its slot left, plus what this one
        did) to its slot of the figures shared with workers."""
        if not self._shared.shared:
            return
        now = self._figures_now()
        base, carried = self._flushed.here()
        values = {k: carried[k] + now[k] - base[k] for k in SUMMED}
        values["max_rows_held"] = max(carried["max_rows_held"], now["max_rows_held"])
        values["started"] = carried["started"] or now["started"]
        self._shared.write(self._slot, values)

    def metrics(self) -> dict:
        """Figures so far: samples, batches (`by_reference`: those `loader()` workers handed over as
        references to decoded row groups), bytes read (compressed column chunks, or TAR member
        bytes), row groups, seconds waiting on data and reading, samples/s, MB/s, and since the first
        iteration: requests to the store, chunk reads found in the local dedup cache or not
        (`cache_hits`, `cache_misses`, `cache_hit_ratio`; zeros without a cache). `store` holds the
        store's counters. After `as_torch()` they add up every DataLoader worker (and this process);
        otherwise they are this process's."""
        if self._shared.shared:
            f = self._shared.figures()
            m = {k: (v if k.endswith("seconds") else int(v)) for k, v in f.items() if k != "started"}
            elapsed = time.time() - f["started"] if f["started"] else 0.0
            m["store"] = {k: m[k] for k in STORE_FIGURES}
        else:
            m = dict(self._metrics)
            elapsed = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
            m["store"] = store = {**self.store.counters(), **self.store.cache_counters()}
            first = self._flushed.here()
            base = first[0] if first else self._figures_now()
            m.update({k: store.get(k, 0) - base[k] for k in STORE_FIGURES})
        looked = m["cache_hits"] + m["cache_misses"]
        m["cache_hit_ratio"] = m["cache_hits"] / looked if looked else 0.0
        m["seconds"] = elapsed
        m["samples_per_s"] = m["samples"] / elapsed if elapsed else 0.0
        m["mb_per_s"] = m["bytes_read"] / 1e6 / elapsed if elapsed else 0.0
        return m

    def loader(self, num_workers: int = 0, tensors: bool = True, by_reference: bool = False,
               strings: str | None = None, shared_memory: bool = True, **kwargs) -> "Loader":
        """A torch DataLoader (`Loader.dataloader`) over this dataset, `batch_size=None`, with
        batches passed from workers as numpy arrays and made tensors in this process (`tensors`):
        the fast way to feed training from several workers (docs/streaming.md, "Figures").
        `shared_memory`: workers hand their finished arrays over in shared-memory files that this
        process maps (`streaming/handover.py`); False pickles them through torch's queue.
        `strings`: "arrow" hands string and binary columns over as pyarrow arrays (buffers: no
        Python object per row in the workers or here), "python" as object arrays of `str`; None
        (the default) keeps the dataset's `strings` ("python" unless it was built otherwise). The
        loader then runs over a copy of the dataset that shares its epoch, position and figures."""
        ds = self
        if strings is not None and strings != self.strings:
            _check_strings(strings, self.format)
            ds = type(self).__new__(type(self))  # not copy.copy (`__getstate__` would drop the store):
            ds.__dict__.update(self.__dict__)  # shares `_shared` (epoch, resume position, figures), the store
            ds.strings = strings
        return Loader(ds, tensors=tensors, by_reference=by_reference, shared_memory=shared_memory,
                      num_workers=num_workers, **kwargs)

    def as_torch(self, _refs: bool = False, _bundle: int = 1, _handover: "_handover.Handover | None" = None):
        """This dataset as a torch IterableDataset (torch must be installed). Shares epoch and
        resume position with DataLoader workers, persistent ones included. (For `Loader`:
        `_bundle`, a worker hands its batches over that many at a time, see `Bundle`; `_handover`,
        through shared-memory files.)"""
        self._shared.share()
        import pyarrow.compute  # noqa: F401 - imported once here, not by each forked worker at its first take
        if self._decoded is None and self.source.shares_decoded:
            self._decoded = DecodedUnits(SLOTS)
        return __getattr__("TorchStreamingDataset")(self, _refs, _bundle, _handover)


def _check_strings(strings: object, format: str) -> None:
    if strings not in STRINGS:
        raise ValueError(f"strings={strings!r} is not one of {', '.join(map(repr, STRINGS))}: 'python' gives string "
                         f"and binary columns as numpy object arrays of str/bytes, 'arrow' as pyarrow arrays")
    if strings == "arrow" and format == "python":
        raise ValueError("strings='arrow' applies to format='numpy' (format='python' gives lists of str): pick "
                         "format='numpy' or 'arrow', or leave strings out")


BUNDLE_ROWS = 16384  # rows a DataLoader worker of `Loader` hands over at once (see `Bundle`)
_loaders = itertools.count(1)  # `Loader` serials (names of their hand-over files)


@dataclass
class Bundle:
    """Consecutive batches of one DataLoader worker, handed over as one item: torch's worker queue
    costs ~0.2 ms an item, whatever its size, which 1,000-row batches paid one by one. `last`: the
    worker has no more. `Loader` puts the batches back in the order one by one would have given.
    With `shared_memory` the arrays cross in a file (`handover.Shipped`), the rest pickled."""
    worker: int
    batches: list
    last: bool


def _bundled(batches: Iterator, size: int, worker: int) -> Iterator[Bundle]:
    """A worker's batches in bundles of `size`; the last bundle says so (it may be empty)."""
    held: list = []
    for b in batches:
        held.append(b)
        if len(held) == size:
            yield Bundle(worker, held, False)
            held = []
    yield Bundle(worker, held, True)


def _unbundled(items: Iterator, workers: int) -> Iterator:
    """The batches of bundled DataLoader items in the order torch gives unbundled ones: a batch
    from each worker still going, in turn (its in-order round robin), so `Loader`'s step count
    stays the stream's exact resume point."""
    queues: list[collections.deque] = [collections.deque() for _ in range(workers)]
    ended: set[int] = set()  # sent their last bundle
    w = 0
    while len(ended) < workers or any(queues):
        while not queues[w] and w not in ended:
            bundle = next(items, None)
            if bundle is None:  # the loader ended (a worker ends with its last bundle)
                ended.update(range(workers))
                break
            queues[bundle.worker].extend(bundle.batches)
            if bundle.last:
                ended.add(bundle.worker)
        if queues[w]:
            yield queues[w].popleft()
        w = (w + 1) % workers


def _keep(batch):
    """The DataLoader collate of `StreamingDataset.loader`: batches cross the worker queue as they are
    (numpy arrays pickle as bytes; tensors would each take a shared-memory file and a socket
    round trip to pass its descriptor)."""
    return batch


def _to_tensors(batch):
    """Numeric numpy arrays as tensors (`torch.from_numpy`, no copy), in the main process; the rest
    (object arrays, pyarrow string arrays) as it is. One pass over a flat dict of columns."""
    from torch import from_numpy

    def conv(v):
        if isinstance(v, np.ndarray):
            return from_numpy(v) if v.dtype.kind in "biufc" else v
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    if type(batch) is dict:
        return {k: (from_numpy(v) if v.dtype.kind in "biufc" else v) if type(v) is np.ndarray else conv(v)
                for k, v in batch.items()}
    return conv(batch)


class Loader:
    """A torch DataLoader over a StreamingDataset whose workers hand batches over as numpy arrays
    (and Arrow arrays), in shared-memory files this process maps (`shared_memory`, `handover.py`);
    numeric arrays become tensors in the main process (`tensors=True`), as the default collate
    would give, without its per-tensor shared-memory hand-over. `.dataloader` is the DataLoader.

    `state_dict()` is the stream's exact resume point, on every rank, with any number of workers:
    it counts the steps the training loop took from this loader (every rank takes the same steps,
    and a step is one block of the global order on each rank); `load_state_dict()` resumes on any
    number of ranks and workers."""

    def __init__(self, ds: "StreamingDataset", tensors: bool = True, by_reference: bool = False,
                 shared_memory: bool = True, **kwargs):
        from torch.utils.data import DataLoader

        kwargs.setdefault("batch_size", None)
        kwargs.setdefault("collate_fn", _keep)
        rows = kwargs["batch_size"]
        if ds.batch_size is not None and rows is not None:
            raise ValueError(f"the dataset already batches (batch_size={ds.batch_size}): leave the loader's "
                             f"batch_size out")
        if ds.batch_size is None and (rows or 1) != ds.block:
            raise ValueError(f"a loader batching rows by {rows} needs the dataset's block_size={rows}, so that "
                             f"a step is one block of the global order (an exact resume point)")
        self.ds = ds
        # a worker gathers and formats its batches and hands them over by value, in bundles: this
        # process only unpickles them. `by_reference`: it hands over references to the decoded row
        # groups (`decoded.BatchRef`) and this process gathers the rows, which measured slower and
        # took 3-4x the CPU of this process (docs/streaming.md, "Figures")
        refs = by_reference and ds.batch_size is not None and ds.source.shares_decoded
        self.bundle = max(1, BUNDLE_ROWS // ds.block) if kwargs.get("num_workers") else 1
        # bundles by value: their arrays through shared-memory files (`streaming/handover.py`)
        self.handover = _handover.Handover(next(_loaders)) if shared_memory and self.bundle > 1 and not refs \
            else None
        self.dataloader = DataLoader(ds.as_torch(_refs=refs, _bundle=self.bundle, _handover=self.handover), **kwargs)
        self.tensors = tensors
        self._steps: int | None = None  # steps taken from the current iteration (None: not begun)

    def __iter__(self):
        self._steps = 0
        tables = _decoded.PinnedTables()
        source, share = self.ds.source, self.ds._decoded
        loop = share.begin_loop() if share is not None else 0
        persistent = self.dataloader.persistent_workers
        # a new tag for workers started now (persistent ones keep their first: their bundles of an
        # iteration that broke off are drained, so unlinked, when the next begins)
        tag = self.handover.begin() if self.handover is not None and (
            not persistent or not self.handover.tag) else None
        it = iter(self.dataloader)
        batches = _unbundled(it, self.dataloader.num_workers) if self.bundle > 1 else it
        try:
            for batch in batches:
                if isinstance(batch, _decoded.BatchRef):
                    batch = source.resolve(self.ds, batch, tables)
                if self._steps == 0 and share is not None:
                    # persistent workers have left an earlier iteration that stopped early (they
                    # make this one's batches now): the links of its batches in flight can go
                    share.drop_pins(before=loop)
                self._steps += 1
                yield _to_tensors(batch) if self.tensors else batch
        finally:
            tables.clear()
            # (not at interpreter exit: the folders go then, and modules may already be torn down)
            if not persistent and not sys.is_finalizing():
                if hasattr(batches, "close"):
                    batches.close()
                stop = getattr(it, "_shutdown_workers", None)
                del batches, it
                if stop is not None:  # its workers stop (a loop that broke off, a worker that died;
                    stop()  # an exception's frames may still hold the iterator); then
                if share is not None:  # the links of the batches they had handed over can go,
                    share.drop_pins()
                if tag is not None and self.handover is not None:  # and the files of bundles that
                    _handover.sweep(self.handover.path, tag)  # never crossed

    def __len__(self) -> int:
        """Steps of the current epoch on this rank (the same on every rank)."""
        start, end = self.ds.epoch_bounds(self.dataloader.num_workers)
        if self.ds._even_ranks == 1:  # one rank, or drop_last: this rank's blocks
            blocks = -(-(end - start) // self.ds.block)
            return max(0, -(-(blocks - self.ds.rank) // self.ds.world_size))
        return _order.rank_steps(start, end, self.ds.block, self.ds.world_size)

    def set_epoch(self, epoch: int) -> None:
        self.ds.set_epoch(epoch)

    def state_dict(self) -> dict:
        """`ds.state_dict(consumed=...)` at what the training loop took: every rank took as many steps
        as this one, so the global order was consumed up to `core.order.position_after`."""
        if self._steps is None:
            return self.ds.state_dict(consumed=self.ds.epoch_bounds()[0])
        return self.ds.state_dict(steps=self._steps)

    def load_state_dict(self, state: dict) -> None:
        self.ds.load_state_dict(state)
        self._steps = None


class Interleave:
    """Items drawn from several datasets with `probabilities`, seeded by (seed, epoch).

    Draw i picks among the sources still live with the uniform number u_i of (seed, epoch, i // 1024),
    so the mix is a function of (seed, epoch) and each source's own order. `stopping="first_exhausted"`
    ends when a draw picks an exhausted source; `"all_exhausted"` drops exhausted sources and goes on
    until all are done, so every item of every source comes exactly once (no oversampling). With
    workers, each consumer mixes its own shares; `state_dict()` resumes exactly on the same split."""

    def __init__(self, datasets, probabilities=None, seed: int = 0, stopping: str = "first_exhausted"):
        if stopping not in ("first_exhausted", "all_exhausted"):
            raise ValueError(f"stopping must be 'first_exhausted' or 'all_exhausted', not {stopping!r}")
        self.datasets = list(datasets)
        p = np.full(len(self.datasets), 1.0) if probabilities is None else np.asarray(probabilities, float)
        if len(p) != len(self.datasets) or (p < 0).any() or p.sum() <= 0:
            raise ValueError("probabilities: one non-negative weight per dataset, not all zero")
        self.probabilities, self.seed, self.stopping = p / p.sum(), int(seed), stopping
        self._epoch, self._draws, self._live = 0, 0, [True] * len(self.datasets)

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self._epoch:
            self._draws, self._live = 0, [True] * len(self.datasets)
        self._epoch = int(epoch)
        for d in self.datasets:
            d.set_epoch(epoch)

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "draws": self._draws, "live": list(self._live),
                "sources": [d.state_dict() for d in self.datasets]}

    def load_state_dict(self, state: dict) -> None:
        self._epoch, self._draws, self._live = state["epoch"], state["draws"], list(state["live"])
        for d, st in zip(self.datasets, state["sources"]):
            d.load_state_dict(st)

    def _uniform(self, i: int, cache: dict) -> float:
        key = i // 1024
        if key not in cache:
            cache.clear()
            cache[key] = _order.rng(self.seed, self._epoch, key).random(1024)
        return float(cache[key][i % 1024])

    def __iter__(self):
        its = [iter(d) for d in self.datasets]
        cache: dict = {}
        while any(self._live):
            p = np.where(self._live, self.probabilities, 0.0)
            if p.sum() <= 0:
                return
            k = int(np.searchsorted(np.cumsum(p / p.sum()), self._uniform(self._draws, cache), side="right"))
            k = min(k, len(its) - 1)
            item = next(its[k], None)
            self._draws += 1
            if item is None:
                self._live[k] = False
                if self.stopping == "first_exhausted":
                    return
                continue
            yield item


def interleave(datasets, probabilities=None, seed: int = 0, stopping: str = "first_exhausted") -> Interleave:
    """Mix several datasets (see `Interleave`)."""
    return Interleave(datasets, probabilities, seed, stopping)


def torch_dataset(ds: StreamingDataset):
    """`ds.as_torch()`."""
    return ds.as_torch()


def _torch_class():
    from torch.utils.data import IterableDataset

    class TorchStreamingDataset(IterableDataset):
        """A torch IterableDataset over a StreamingDataset: each DataLoader worker reads its share."""

        def __init__(self, ds: StreamingDataset, refs: bool = False, bundle: int = 1,
                     handover: "_handover.Handover | None" = None):
            self.ds, self.refs, self.bundle, self.handover = ds, refs, bundle, handover

        def __iter__(self):
            batches = self.ds._iter_here(self.refs)
            info = sys.modules["torch.utils.data"].get_worker_info()
            if self.bundle > 1 and info is not None:  # `Loader`'s workers: see `Bundle`
                bundles = _bundled(batches, self.bundle, info.id)
                return self.handover.shipped(bundles) if self.handover is not None else bundles
            return batches

        def set_epoch(self, epoch: int) -> None:
            self.ds.set_epoch(epoch)

        def state_dict(self, consumed: int | None = None) -> dict:
            return self.ds.state_dict(consumed)

        def load_state_dict(self, state: dict) -> None:
            self.ds.load_state_dict(state)

    TorchStreamingDataset.__module__ = __name__  # pickled by name, found by this module's __getattr__
    TorchStreamingDataset.__qualname__ = "TorchStreamingDataset"
    return TorchStreamingDataset


def __getattr__(name: str):
    """`TorchStreamingDataset` is built on first use, so that importing this module never imports torch."""
    if name == "TorchStreamingDataset":
        cls = globals()[name] = _torch_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Stream Parquet rows, or WebDataset-style TAR samples, from `cdc://` into training: exact, elastic,
resumable.

    ds = StreamingDataset("cdc://ds@v1/train/", batch_size=1024, shuffle=True, seed=7)
    for batch in ds: ...                       # dicts of numpy arrays
    loader = DataLoader(ds.as_torch(), batch_size=None, num_workers=2)

The revision is resolved once, at construction; footers are read once and travel with the object
when it is pickled to workers. The order, sharding and resume math is in `order.py`; this module
does the I/O: it reads, for each row group a consumer needs, only the columns asked for, in a
background thread within a byte budget; for TAR shards (sample tables from `shards.py`) only the
byte ranges of the samples' members it needs. docs/streaming.md says what is exact and what memory is
bounded by.
"""
from __future__ import annotations

import copy
import fnmatch
import os
import collections
import concurrent.futures
import sys
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .core import decoders as _decoders
from .core import order as _order
from .core import tree
from .core import shards as _shards
from .core.address import Address, parse
from . import decoded as _decoded
from . import runtime
from .api import Store
from .decoded import DecodedUnits
from .core import pages as _pages
from .core.errors import CdcError, CorruptionError, InvalidAddressError, PathNotFoundError
from .core.thrift import ThriftError

FORMATS = ("numpy", "arrow", "python")
SUMMED = ("samples", "batches", "bytes_read", "row_groups", "decodes", "warmed", "wait_seconds", "read_seconds",
          "requests", "received_bytes", "cache_hits", "cache_misses")
STORE_FIGURES = ("requests", "received_bytes", "cache_hits", "cache_misses")
FIGURES = SUMMED + ("max_rows_held", "started")
LOOK_AHEAD_STEPS = 256  # steps a stream looks ahead for the next row group to fetch while one decodes
SLOTS = 65  # figure slots: this process, then DataLoader workers 0..63 (worker w uses slot w % 64 + 1)
_GLOB = set("*?[")


@dataclass(frozen=True)
class SourceFile:
    """One file of one resolved commit."""

    repo: str
    commit: str
    path: str
    size: int

    @property
    def address(self) -> str:
        return str(Address(self.repo, self.commit, self.path))


def expand(source: str, files: dict, commit: str) -> list[SourceFile]:
    """The files a `cdc://` source names in a commit's file map: a file, a folder's Parquet files or
    TAR shards, or a glob's matches, in path order (pure)."""
    a = parse(source)
    if a.path in files:
        found = [a.path]
    elif _GLOB & set(a.path):
        found = [p for p in files if fnmatch.fnmatchcase(p, a.path)]
    else:
        under = list(tree.under(files, a.path))
        found = [p for p in under if p.endswith(".parquet") or _shards.is_tar(p)]
        found = found or [p for p in under if _shards.is_compressed_tar(p)]
    packed = [p for p in found if _shards.is_compressed_tar(p)]
    if packed:
        raise InvalidAddressError(f"{source}: {packed[0]} is a compressed tar: stream plain .tar shards "
                                  f"(decompress them before pushing; chunks dedup better uncompressed)")
    if not found:
        raise PathNotFoundError(f"{source}: no Parquet file or TAR shard there at commit {commit[:12]}: "
                                f"check the path with `cdcstore ls`")
    return [SourceFile(a.repo, commit, p, files[p].size) for p in sorted(found)]


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
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class _Shared:
    """Epoch and resume position, shared with DataLoader workers (persistent ones too), and the
    figures they add up: multiprocessing arrays inherited by workers (or passed at spawn), plain
    values when pickled any other way."""

    def __init__(self, epoch: int = 0, start: int = 0):
        self._local = [epoch, start]
        self._arr = None
        self._figs = None

    def share(self) -> None:
        import multiprocessing

        if self._arr is None:
            ctx = multiprocessing.get_context()
            self._arr = ctx.Array("q", self._local, lock=False)
            self._figs = ctx.Array("d", SLOTS * len(FIGURES), lock=False)  # one writer per slot: no lock

    @property
    def shared(self) -> bool:
        return self._figs is not None

    def read(self, slot: int) -> dict:
        n = len(FIGURES)
        return dict(zip(FIGURES, self._figs[slot * n:(slot + 1) * n]))

    def write(self, slot: int, values: dict) -> None:
        n = len(FIGURES)
        self._figs[slot * n:(slot + 1) * n] = [float(values[k]) for k in FIGURES]

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


class _Prefetcher:
    """Runs `produce` in a thread: it yields (item, nbytes); a bounded queue holds at most
    `max_items` row groups and `max_bytes` bytes of them (always at least one)."""

    def __init__(self, produce, max_bytes: int, max_items: int):
        self._produce = produce
        self._max_bytes, self._max_items = max_bytes, max(1, max_items)
        self._q: collections.deque = collections.deque()
        self._bytes = self._units = 0
        self._cv = threading.Condition()
        self._stop = False
        self._done = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cdcstore-stream", daemon=True)
        self._thread.start()

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

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=30)


class _Warmer:
    """Fetches the bytes of the row group a stream will read next into the chunk cache, on a
    thread of its own, while the stream's thread decodes the one before: the fetch and the
    decode overlap. The stream's own read of those bytes then finds them fetched (or waits for
    the fetch in flight: the cache's single flight), so nothing is fetched twice. One warm-up
    at a time; a failed one only leaves the read to fetch. Used when the store has a cache
    (a read from it costs a request), not for a local directory."""

    def __init__(self, ds: "StreamingDataset"):
        self._ds = ds
        self._pool = runtime.pool("warm", 2)  # the process's: streams of this process share it
        self._busy: concurrent.futures.Future | None = None
        self._done: set[int] = set()
        self._readers: dict = {}  # file index -> FileReader (this thread's)

    def ahead(self, u: int) -> None:
        if u in self._done or (self._busy is not None and not self._busy.done()):
            return
        self._done.add(u)
        self._busy = self._pool.submit(self._fetch, u)

    def _fetch(self, u: int) -> None:
        ds = self._ds
        fi = ds.units[u][0]
        try:
            reader = self._readers.get(fi)
            if reader is None:
                if len(self._readers) >= 8:
                    self._readers.pop(next(iter(self._readers))).close()
                reader = self._readers[fi] = ds.store.open(ds.files[fi].address)
            for lo, n in ds._unit_spans(u):
                reader.pread(lo, n)
            ds._metrics["warmed"] += 1
        except Exception:  # noqa: BLE001 - the stream's own read fetches and reports
            pass

    def close(self) -> None:
        if self._busy is not None and not self._busy.cancel():
            concurrent.futures.wait([self._busy])  # its readers are closed next
        for reader in self._readers.values():
            reader.close()


class StreamingDataset:
    """Parquet row groups of one snapshot of `cdc://` sources, as batches or rows.

    `source`: `cdc://REPO[@REV]/PATH` naming a file, a folder (its .parquet files) or a glob; or a
    list of them. `format`: "numpy" (dicts of arrays), "arrow" (RecordBatch) or "python" (dicts of
    lists); with `batch_size=None` it yields rows as dicts. `shuffle` permutes row groups and rows
    within windows of `shuffle_buffer` rows. Consumers are dealt blocks of `batch_size` positions; in
    row mode `block_size` (default 1) sets the block: make it the DataLoader's batch size when the
    DataLoader batches rows, so that a count of steps stays an exact resume point.
    `rank`/`world_size` default to torch.distributed, then $RANK/$WORLD_SIZE, then (0, 1).
    `decode` (TAR shards): members decoded by extension as WebDataset's `.decode()` does (txt, json,
    cls, npy; images through Pillow when installed; `core/decoders.py`); the default for every format
    but "arrow", which carries bytes. False keeps bytes; a dict adds or replaces decoders.
    """

    def __init__(self, source, *, columns=None, batch_size: int | None = None, format: str = "numpy",
                 shuffle: bool = False, seed: int = 0, shuffle_buffer: int = 10_000,
                 rank: int | None = None, world_size: int | None = None, store=None,
                 token: str | None = None, prefetch_bytes: int = 256 << 20, prefetch_row_groups: int = 8,
                 drop_last: bool = False, block_size: int | None = None, decode: "bool | dict | None" = None):
        if format not in FORMATS:
            raise ValueError(f"format {format!r} is not one of {', '.join(FORMATS)}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer or None, not {batch_size!r}")
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, not {seed!r}")
        self.columns = list(columns) if columns is not None else None
        self.batch_size, self.format = batch_size, format
        self.shuffle, self.seed, self.shuffle_buffer = bool(shuffle), int(seed), int(shuffle_buffer)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.block = int(batch_size or block_size or 1)
        self.prefetch_bytes, self.prefetch_row_groups = int(prefetch_bytes), int(prefetch_row_groups)
        self.drop_last = drop_last
        # pyarrow imports pandas (about 1 s) at a process's first to_numpy or array of numpy: meanwhile
        runtime.preload("pyarrow.compute", "pandas")
        given = None if store is None or isinstance(store, str) else store  # a Store, else a location or None
        self._store_args = {"location": store if given is None else given.location, "token": token}
        self._store = runtime.Local(given) if given is not None else runtime.Local()  # this process's
        self.files, self.commits = self._resolve([source] if isinstance(source, str) else list(source))
        self.tar = self._kind(self.files)
        if decode and format == "arrow":
            raise ValueError("format='arrow' carries TAR members as bytes: leave decode out, or pick format='numpy' "
                             "or 'python' to decode them")
        self._decoders = _decoders.table(format != "arrow" if decode is None else decode) if self.tar else {}
        if self.tar:  # work unit: the shard; each sample's byte ranges come from its table
            self._meta = [self._index(f) for f in self.files]
            self.units = [(fi, 0, len(table)) for fi, table in enumerate(self._meta) if table]
            exts = dict.fromkeys(e for table in self._meta for smp in table for e, _, _ in smp.parts)
            self.extensions = [e for e in exts if self.columns is None or e in self.columns]
        else:  # work unit: the row group
            self._meta = [self._footer(f) for f in self.files]
            self.units = [(fi, rg, md.row_group(rg).num_rows)
                          for fi, md in enumerate(self._meta) for rg in range(md.num_row_groups)]
        self._limit: tuple[int, int | None] = (0, None)  # skip, take
        self._shared = _Shared()
        self._decoded: DecodedUnits | None = None  # row groups shared by DataLoader workers (as_torch)
        self._consumed = 0
        self._metrics = {"samples": 0, "batches": 0, "bytes_read": 0, "row_groups": 0, "decodes": 0, "warmed": 0,
                         "wait_seconds": 0.0, "read_seconds": 0.0, "max_rows_held": 0}
        self._t0: float | None = None
        self._slot = 0  # where this process writes its figures when they are shared
        self._flushed = runtime.Local()  # (figures at start, slot at start) of this process's first iteration

    # -- construction ----------------------------------------------------------------------
    @property
    def store(self) -> Store:
        """This process's Store (nothing network-bound survives a fork or a pickle)."""
        return self._store.get(lambda: Store(self._store_args["location"], token=self._store_args["token"]))

    def _resolve(self, sources: list[str]) -> tuple[list[SourceFile], dict[str, str]]:
        if not sources:
            raise InvalidAddressError("StreamingDataset needs at least one cdc:// source")
        files: dict[tuple[str, str, str], SourceFile] = {}
        commits: dict[str, str] = {}
        for src in sources:
            a = parse(src)
            key = f"{a.repo}@{a.ref}"
            cid, commit = self.store.resolve(Address(a.repo, commits.get(key, a.rev), a.path))
            commits[key] = cid  # one commit per revision named, even if a branch moves meanwhile
            for f in expand(src, _candidates(self.store.view(a.repo, commit), a.path), cid):
                files.setdefault((f.repo, f.commit, f.path), f)
        return list(files.values()), commits

    @staticmethod
    def _kind(files: list[SourceFile]) -> bool:
        """True for TAR shards, False for Parquet; a mix is refused."""
        tars = [f for f in files if _shards.is_tar(f.path)]
        if tars and len(tars) != len(files):
            other = next(f for f in files if not _shards.is_tar(f.path))
            raise InvalidAddressError(f"{tars[0].address} is a TAR shard but {other.address} is not: "
                                      f"stream Parquet files and TAR shards as two datasets "
                                      f"(mix them with `interleave`)")
        return bool(tars)

    def _index(self, f: SourceFile) -> list:
        """The sample table of one TAR shard, from its headers (read a window at a time)."""
        with self.store.open(f.address) as r:
            return _shards.samples(_shards.scan(r.pread, f.size, f.address), f.address)

    def _footer(self, f: SourceFile) -> pq.FileMetaData:
        with self.store.open(f.address) as r:
            try:
                return _checked_footer(pq.ParquetFile(r, pre_buffer=False).metadata, f)
            except CdcError:  # the store's own error (busy, unreachable, damaged) says what it is
                raise
            except (pa.ArrowInvalid, OSError) as e:
                if isinstance(e.__cause__ or e.__context__, CdcError):
                    raise (e.__cause__ or e.__context__) from None
                raise InvalidAddressError(f"{f.address} is not a readable Parquet file ({e}): "
                                          f"stream Parquet files only") from None

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
        worker, workers = 0, 1
        torch_data = sys.modules.get("torch.utils.data")
        info = torch_data.get_worker_info() if torch_data is not None else None
        if info is not None:
            worker, workers = info.id, info.num_workers
            self._slot = worker % (SLOTS - 1) + 1
        return self.iterate(worker, workers)

    def iterate(self, worker: int = 0, num_workers: int = 1) -> Iterator:
        """The samples of consumer (this rank, `worker` of `num_workers`) for the current epoch."""
        epoch, start = self._shared.get()
        k, n = _order.consumer_index(self.rank, self.world_size, worker, num_workers)
        skip, _ = self._limit
        total = self._order_total()
        order = _order.EpochOrder(tuple(u[2] for u in self.units), self.seed, epoch, self.shuffle,
                                  self.shuffle_buffer)
        end = _order.epoch_end(total, min(start, total), self.block, n, self.drop_last)
        steps = _order.consumer_steps(min(start, total), end, self.block, k, n,
                                      span=order.window if order.window > 1 else 1024,
                                      ranks=self._even_ranks)
        self._consumed = 0
        if self._t0 is None:
            self._t0 = time.perf_counter()
            self._started = time.time()
        self._flushed.get(lambda: (self._figures_now(),  # first iteration in this process
                                   self._shared.read(self._slot) if self._shared.shared else {}))
        if self.tar:
            return self._run(lambda: self._produce_tar(order, steps, skip))
        share = self._decoded if num_workers > 1 and self._slot else None
        progress = None
        if share is not None:  # this worker's progress, and the decoded row groups no worker needs now
            slots = range(1, min(num_workers, SLOTS - 1) + 1)

            def progress(past: int) -> None:
                share.report(self._slot, epoch, past)
                share.release(slots, epoch, lambda u: _order.release_bound(order, u) - skip)
            share.report(self._slot, epoch, min(start, total))
        return self._run(lambda: self._produce(order, steps, skip, share, epoch), progress)

    def _run(self, produce, progress=None):
        pre = _Prefetcher(produce, self.prefetch_bytes, self.prefetch_row_groups)
        try:
            yield from self._consume(pre, progress)
            if progress is not None:
                progress(_decoded.DONE)
        finally:
            pre.close()

    def _produce(self, order: _order.EpochOrder, steps, skip: int, share: "DecodedUnits | None" = None,
                 epoch: int = 0):
        """In the prefetch thread: each needed row group once, in order of first need, then each step
        (whole blocks of this consumer's positions). With `share`, a row group another worker
        decoded is mapped from the shared folder, and one decoded here is put there."""
        loaded: set[int] = set()
        files: dict[int, tuple[pq.ParquetFile, object]] = {}
        warm = _Warmer(self) if share is None and self.store.cache is not None else None
        located: collections.deque = collections.deque()  # steps located ahead: (pos, units, rows)
        steps = iter(steps)

        def pull() -> bool:
            pos = next(steps, None)
            if pos is not None:
                located.append((pos, *order.locate(order.sequence_index(pos + skip))))
            return pos is not None

        def next_new(after: int) -> int | None:
            """The first row group needed after `after` that is not loaded (looking ahead at most
            `LOOK_AHEAD_STEPS` steps)."""
            k = 0
            while True:
                while k >= len(located):
                    if k >= LOOK_AHEAD_STEPS or not pull():
                        return None
                for v in located[k][1].tolist():
                    if v not in loaded and v != after:
                        return v
                k += 1

        try:
            while located or pull():
                pos, units, rows = located[0]  # stays first while it loads: `next_new` looks from it
                for u in dict.fromkeys(units.tolist()):
                    if u in loaded:
                        continue
                    loaded.add(u)
                    if warm is not None:  # the next row group's bytes arrive while this one decodes
                        v = next_new(u)
                        if v is not None:
                            warm.ahead(v)
                    if share is None:
                        table = self._read_unit(u, files)
                    else:
                        table = share.load(epoch, u, lambda: self._read_unit(u, files))
                    self._metrics["row_groups"] += 1
                    yield ("unit", u, table, _order.release_bound(order, u) - skip), table.nbytes or 1
                located.popleft()
                yield ("step", int(pos[-1]) + 1, units, rows), 0
        finally:
            if warm is not None:
                warm.close()
            for _, reader in files.values():
                reader.close()

    def _unit_spans(self, u: int) -> list[tuple[int, int]]:
        """The byte ranges (offset, length) of a row group's column chunks asked for, merged
        where they are less than 1 MiB apart."""
        fi, rg, _ = self.units[u]
        g = self._meta[fi].row_group(rg)
        want = None if self.columns is None else set(self.columns)
        spans = []
        for j in range(g.num_columns):
            c = g.column(j)
            if want is not None and c.path_in_schema.split(".")[0] not in want:
                continue
            start = c.data_page_offset
            if c.has_dictionary_page and c.dictionary_page_offset:
                start = min(start, c.dictionary_page_offset)
            spans.append((start, start + c.total_compressed_size))
        return [(lo, hi - lo) for lo, hi in _shards.coalesce(spans, 1 << 20)]

    def _produce_tar(self, order: _order.EpochOrder, steps, skip: int):
        """In the prefetch thread: the samples of each step, their byte ranges read in few reads."""
        readers: dict[int, object] = {}
        try:
            for pos in steps:
                units, rows = order.locate(order.sequence_index(pos + skip))
                for lo, hi in self._tar_pieces(units, rows):
                    got = self._read_samples(units[lo:hi], rows[lo:hi], readers)
                    nbytes = sum(len(v) for s in got for v in s.values()) or 1
                    if self._decoders:
                        got = [_decoders.decode_sample(s, self._decoders) for s in got]
                    yield ("samples", got), nbytes
        finally:
            for reader in readers.values():
                reader.close()

    def _tar_pieces(self, units: np.ndarray, rows: np.ndarray) -> list[tuple[int, int]]:
        """A step's positions cut, at block boundaries, into pieces of at most a quarter of
        `prefetch_bytes` of member bytes (at least one block each): the queue, the piece being
        read and the one being consumed then hold about 1.5 x prefetch_bytes, whatever the step."""
        want = None if self.columns is None else set(self.columns)
        sizes = [sum(n for e, _, n in self._meta[self.units[u][0]][r].parts if want is None or e in want)
                 for u, r in zip(units.tolist(), rows.tolist())]
        budget, block = max(1, self.prefetch_bytes // 4), self.block
        pieces, lo, held = [], 0, 0
        for b in range(0, len(sizes), block):
            nbytes = sum(sizes[b:b + block])
            if b > lo and held + nbytes > budget:
                pieces.append((lo, b))
                lo, held = b, 0
            held += nbytes
        if lo < len(sizes):
            pieces.append((lo, len(sizes)))
        return pieces

    def _read_samples(self, units: np.ndarray, rows: np.ndarray, readers: dict) -> list[dict]:
        """One dict per (unit, row): `__key__` and one bytes entry per extension asked for. The
        members' ranges of each shard are merged (gaps up to 64 KiB) and read in order."""
        want = None if self.columns is None else set(self.columns)
        picked = []
        for u, row in zip(units.tolist(), rows.tolist()):
            fi = self.units[u][0]
            sample = self._meta[fi][row]
            picked.append((fi, sample, [p for p in sample.parts if want is None or p[0] in want]))
        t0 = time.perf_counter()
        data: dict[tuple[int, int], memoryview] = {}  # (file, range start) -> bytes of the range
        starts: dict[int, list[int]] = {}
        for fi in dict.fromkeys(fi for fi, _, _ in picked):
            spans = _shards.coalesce([(o, o + n) for f, _, parts in picked if f == fi for _, o, n in parts],
                                     64 << 10)
            if fi not in readers:
                if len(readers) >= 8:
                    readers.pop(next(iter(readers))).close()
                readers[fi] = self.store.open(self.files[fi].address)
            for lo, hi in spans:
                data[fi, lo] = memoryview(readers[fi].pread(lo, hi - lo))
            starts[fi] = [lo for lo, _ in spans]
        out = []
        for fi, sample, parts in picked:
            s = {"__key__": sample.key}
            for ext, o, n in parts:
                lo = starts[fi][int(np.searchsorted(starts[fi], o, side="right")) - 1]
                s[ext] = bytes(data[fi, lo][o - lo:o - lo + n])
                self._metrics["bytes_read"] += n
            out.append(s)
        self._metrics["read_seconds"] += time.perf_counter() - t0
        return out

    def _read_unit(self, u: int, files: dict) -> pa.Table:
        fi, rg, _ = self.units[u]
        if fi not in files:
            if len(files) >= 8:
                files.pop(next(iter(files)))[1].close()
            reader = self.store.open(self.files[fi].address)
            files[fi] = (pq.ParquetFile(reader, metadata=self._meta[fi], pre_buffer=False), reader)
        pf = files[fi][0]
        t0 = time.perf_counter()
        self._check_rows(fi, rg, files[fi][1])
        table = pf.read_row_group(rg, columns=self.columns)
        if table.num_rows != self.units[u][2]:
            raise _lying_rows(self.files[fi], rg, self.units[u][2], f"pyarrow read {table.num_rows}")
        self._metrics["read_seconds"] += time.perf_counter() - t0
        self._metrics["bytes_read"] += self._column_bytes(fi, rg)
        self._metrics["decodes"] += 1
        return table

    def _check_rows(self, fi: int, rg: int, reader) -> None:
        """Before pyarrow allocates for a row group's rows: the page headers of one of its column
        chunks that is not repeated (the smallest among the columns asked for, else of all) must
        hold the rows its footer claims."""
        md, f = self._meta[fi], self.files[fi]
        g = md.row_group(rg)
        want = None if self.columns is None else set(self.columns)
        flat = [j for j in range(g.num_columns) if md.schema.column(j).max_repetition_level == 0]
        if not flat:
            return
        j = min(flat, key=lambda j: (want is not None and md.schema.column(j).path.split(".")[0] not in want,
                                     g.column(j).total_compressed_size))
        c = g.column(j)
        start = c.data_page_offset
        if c.has_dictionary_page and c.dictionary_page_offset:
            start = min(start, c.dictionary_page_offset)
        size = c.total_compressed_size
        if not (4 <= start and 0 <= size and start + size <= f.size - 8):
            raise CorruptionError(f"{f.address}: row group {rg}'s column {c.path_in_schema} lies outside the file: "
                                  f"its footer is damaged")
        try:
            held = _pages.column_chunk_rows(reader.pread(start, size))
        except (ThriftError, RecursionError) as e:
            raise CorruptionError(f"{f.address}: row group {rg}'s column {c.path_in_schema} has unreadable "
                                  f"pages ({e}): the file is damaged") from None
        if held != g.num_rows:
            raise _lying_rows(f, rg, g.num_rows, f"its pages hold {held}")

    def _column_bytes(self, fi: int, rg: int) -> int:
        g = self._meta[fi].row_group(rg)
        want = None if self.columns is None else set(self.columns)
        return sum(g.column(j).total_compressed_size for j in range(g.num_columns)
                   if want is None or g.column(j).path_in_schema.split(".")[0] in want)

    def _consume(self, pre: _Prefetcher, progress=None):
        held: dict[int, tuple[pa.Table, int]] = {}
        m = self._metrics
        while True:
            t0 = time.perf_counter()
            item = pre.get()
            m["wait_seconds"] += time.perf_counter() - t0
            if item is None:
                self._flush()
                return
            if item[0] == "samples":
                yield from self._emit_samples(item[1])
                self._flush()
                continue
            if item[0] == "unit":
                _, u, table, bound = item
                held[u] = (table, bound)
                m["max_rows_held"] = max(m["max_rows_held"], sum(t.num_rows for t, _ in held.values()))
                continue
            _, past, units, rows = item
            table = self._gather(held, units, rows)
            for u in [u for u, (_, bound) in held.items() if bound <= past]:
                del held[u]
            if progress is not None:
                progress(past)
            yield from self._emit(table)
            self._flush()

    def _gather(self, held: dict, units: np.ndarray, rows: np.ndarray) -> pa.Table:
        """The rows of one block, in order, from the row groups held: slices (no copy) when they are
        a few runs of consecutive rows (no shuffle), else a take."""
        cuts = np.flatnonzero((np.diff(units) != 0) | (np.diff(rows) != 1)) + 1
        if len(cuts) < 4:
            bounds = [0, *cuts.tolist(), len(rows)]
            parts = [held[int(units[lo])][0].slice(int(rows[lo]), hi - lo) for lo, hi in zip(bounds, bounds[1:])]
            table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            if self.format != "arrow" or self._slot == 0:
                return table
            return table.combine_chunks().take(pa.array(np.arange(len(rows))))  # to a worker: compact
        ids, which = np.unique(units, return_inverse=True)
        tables = [held[int(u)][0] for u in ids]
        base = np.cumsum([0] + [t.num_rows for t in tables])[:-1]
        index = rows + base[which]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        return table.take(pa.array(index))

    def _emit(self, table: pa.Table):
        """Rows, or one batch per block (the last one of a consumer may be short)."""
        m = self._metrics
        if self.batch_size is None:
            for row in table.to_pylist():
                self._consumed += 1
                m["samples"] += 1
                yield row
            return
        for lo in range(0, table.num_rows, self.block):
            yield self._format(table.slice(lo, self.block))

    def _emit_samples(self, samples: list[dict]):
        """TAR samples: one dict each, or one batch per block with a column per extension of the
        dataset: a dict of lists ("numpy" and "python"; None where a sample lacks the extension) or
        a RecordBatch ("arrow")."""
        m = self._metrics
        if self.batch_size is None:
            for s in samples:
                self._consumed += 1
                m["samples"] += 1
                yield s
            return
        for lo in range(0, len(samples), self.block):
            part = samples[lo:lo + self.block]
            self._consumed += len(part)
            m["samples"] += len(part)
            m["batches"] += 1
            names = ["__key__", *self.extensions]
            cols = {k: [s.get(k) for s in part] for k in names}
            if self.format == "arrow":
                yield pa.RecordBatch.from_pydict(
                    cols, pa.schema([(k, pa.string() if k == "__key__" else pa.binary()) for k in names]))
            else:
                yield cols

    def _format(self, table: pa.Table):
        m = self._metrics
        n = table.num_rows
        self._consumed += n
        m["samples"] += n
        m["batches"] += 1
        if self.format == "arrow":
            return table.combine_chunks().to_batches()[0] if n else pa.RecordBatch.from_pylist([], table.schema)
        if self.format == "python":
            return table.to_pydict()
        table = table.combine_chunks()  # writable arrays: torch takes them without a warning
        return {name: col.chunk(0).to_numpy(zero_copy_only=False, writable=True) if col.num_chunks
                else col.to_numpy() for name, col in zip(table.column_names, table.columns)}

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
        """Figures so far: samples, batches, bytes read (compressed column chunks, or TAR member
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
            m["store"] = {**self.store.counters(), **self.store.cache_counters()}
            first = self._flushed.here()
            base = first[0] if first else self._figures_now()
            m.update({k: m["store"].get(k, 0) - base[k] for k in STORE_FIGURES})
        looked = m["cache_hits"] + m["cache_misses"]
        m["cache_hit_ratio"] = m["cache_hits"] / looked if looked else 0.0
        m["seconds"] = elapsed
        m["samples_per_s"] = m["samples"] / elapsed if elapsed else 0.0
        m["mb_per_s"] = m["bytes_read"] / 1e6 / elapsed if elapsed else 0.0
        return m

    def loader(self, num_workers: int = 0, tensors: bool = True, **kwargs) -> "Loader":
        """A torch DataLoader (`Loader.dataloader`) over this dataset, `batch_size=None`, with
        batches passed from workers as numpy arrays and made tensors in this process (`tensors`):
        the fast way to feed training from several workers (docs/streaming.md, "Figures")."""
        return Loader(self, tensors=tensors, num_workers=num_workers, **kwargs)

    def as_torch(self):
        """This dataset as a torch IterableDataset (torch must be installed). Shares epoch and
        resume position with DataLoader workers, persistent ones included."""
        self._shared.share()
        import pyarrow.compute  # noqa: F401 - imported once here, not by each forked worker at its first take
        if self._decoded is None and not self.tar:
            self._decoded = DecodedUnits(SLOTS)
        return __getattr__("TorchStreamingDataset")(self)


def _lying_rows(f: SourceFile, rg: int, claimed: int, truth: str) -> CorruptionError:
    return CorruptionError(f"{f.address}: row group {rg} claims {claimed} rows but {truth}: the file's "
                           f"footer is damaged (or forged); rewrite the file")


def _checked_footer(md: pq.FileMetaData, f: SourceFile) -> pq.FileMetaData:
    """`md` if its row counts agree: no row group below 0 rows, their sum the file's count, and each
    column that is not repeated holding exactly one value per row (a repeated one at least one);
    else CorruptionError naming the file. The pages are checked when a row group is read."""
    total = 0
    for rg in range(md.num_row_groups):
        g = md.row_group(rg)
        if g.num_rows < 0:
            raise _lying_rows(f, rg, g.num_rows, "a count cannot be negative")
        for j in range(g.num_columns):
            values, flat = g.column(j).num_values, md.schema.column(j).max_repetition_level == 0
            if values < 0 or (values != g.num_rows if flat else values < g.num_rows):
                raise _lying_rows(f, rg, g.num_rows, f"its column {g.column(j).path_in_schema} holds {values} values")
        total += g.num_rows
    if total != md.num_rows:
        raise CorruptionError(f"{f.address}: its row groups hold {total} rows but its footer claims {md.num_rows}: "
                              f"the file's footer is damaged (or forged); rewrite the file")
    return md


def _keep(batch):
    """The DataLoader collate of `StreamingDataset.loader`: batches cross the worker queue as they are
    (numpy arrays pickle as bytes; tensors would each take a shared-memory file and a socket
    round trip to pass its descriptor)."""
    return batch


def _to_tensors(batch):
    """Numeric numpy arrays as tensors (`torch.from_numpy`, no copy), in the main process."""
    import torch

    def conv(v):
        if isinstance(v, np.ndarray) and v.dtype.kind in "biufc":
            return torch.from_numpy(v)
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    return conv(batch)


class Loader:
    """A torch DataLoader over a StreamingDataset whose workers hand batches over as numpy arrays;
    numeric arrays become tensors in the main process (`tensors=True`), as the default collate
    would give, without its per-tensor shared-memory hand-over. `.dataloader` is the DataLoader.

    `state_dict()` is the stream's exact resume point, on every rank, with any number of workers:
    it counts the steps the training loop took from this loader (every rank takes the same steps,
    and a step is one block of the global order on each rank); `load_state_dict()` resumes on any
    number of ranks and workers."""

    def __init__(self, ds: "StreamingDataset", tensors: bool = True, **kwargs):
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
        self.dataloader = DataLoader(ds.as_torch(), **kwargs)
        self.tensors = tensors
        self._steps: int | None = None  # steps taken from the current iteration (None: not begun)

    def __iter__(self):
        self._steps = 0
        for batch in self.dataloader:
            self._steps += 1
            yield _to_tensors(batch) if self.tensors else batch

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

        def __init__(self, ds: StreamingDataset):
            self.ds = ds

        def __iter__(self):
            return iter(self.ds)

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

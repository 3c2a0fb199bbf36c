"""Row groups decoded once per DataLoader, shared by its workers.

Every DataLoader worker of a shuffled stream draws rows from every row group (its blocks of the
global order are spread over all of them), so without sharing each worker fetches, verifies and
decodes each row group. `DecodedUnits` is a folder (under /dev/shm when it has room, else the temp
dir) that the main process makes before the workers start: the first worker to need a row group
decodes it and writes it there as an uncompressed Arrow IPC file; the others map that file
(`pa.memory_map`, no copy), so the decoded bytes are in memory once for the whole process tree.

A file is deleted once no worker can need it again: each worker publishes how far it has consumed
(epoch and position in the global order, in a shared array), and a row group's rows are all before
its release bound (`core.order.release_bound`). A worker that has not reported yet counts as not
started, so nothing it needs goes early. Files hold `e<epoch>-u<unit>.arrow`; a crashed run's folder
is removed by the next one made on the machine (its owner pid is in the name).

Bounds (docs/streaming.md "Decode bounds"): `read_row_group` refuses a row group whose decoded
size is over `CDCSTORE_MAX_DECODED_BYTES` (1 GiB by default) before pyarrow allocates it (a few
hundred bytes of Parquet whose one dictionary value repeats decode to GBs), so no worker holds it
and the folder never receives it. The folder goes when its owner dies however it dies: a reaper
(`sh`, in a session of its own) waits for the owner's pid and removes it; and the workers exit
with their parent (`exit_with_parent`).

Batches by reference (`StreamingDataset.loader`): a worker does not gather, convert and pickle a
batch's rows; it hands over a `BatchRef` (which rows of which row groups: a few KB) with a hard link
to each row group's file made for that batch (`pin-*.arrow`), and the main process maps the files,
removes the links and makes the batch (`PinnedTables`). The link keeps the file for the main
process however far the workers have gone; the workers fetch, verify and decode on their cores
while the main process only gathers rows, as an in-process stream's consumer does.
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import runtime, settings
from ..core.errors import CdcError, CorruptionError

SHM = "/dev/shm"
SHM_MIN_FREE = 1 << 30  # /dev/shm is used only with this much free (a container's is often 64 MiB)
RESCAN_EVERY = 16  # `release` calls (steps) between two scans of the folder at most
POS_BITS = 40  # progress = epoch << POS_BITS | position (positions below 2**40 rows)
DONE = (1 << POS_BITS) - 1  # the position of a worker whose epoch is over
_NAME = re.compile(r"e(\d+)-u(\d+)\.arrow$")
_FOLDER = re.compile(r"cdcstore-units-(\d+)-")
_PIN = re.compile(r"pin-(\d+)-")
MAX_DECODED_BYTES = 1 << 30  # default bound of one decoded row group (CDCSTORE_MAX_DECODED_BYTES)
_REAPER = 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; rm -rf -- "$2"'


class DecodeBoundError(ValueError):
    """A row group decodes to more bytes than the bound allows."""


def read_row_group(source, metadata, rg: int, columns: list[str] | None, what: str):
    """Row group `rg` of the Parquet file `source` (its footer `metadata`; named `what` in errors),
    refused with DecodeBoundError when it decodes to more than `CDCSTORE_MAX_DECODED_BYTES`: first
    by what its footer says (fixed-width values, string offsets), then with its dictionary-encoded
    string columns read as dictionaries (indices and values, no more) and their decoded size
    counted, then, for encodings no count foresees, by the table's size. Only then are the
    dictionaries expanded. Its column chunks are read in one coalesced request (pre_buffer)."""
    import pyarrow.parquet as pq

    limit = settings.MAX_DECODED_BYTES.get(MAX_DECODED_BYTES)
    schema, g = metadata.schema.to_arrow_schema(), metadata.row_group(rg)
    names = [n for n in (columns if columns is not None else schema.names) if n in schema.names]
    dicts = [n for n in names if _may_expand_past(g, schema.field(n), limit)]

    def check(size: int, how: str) -> None:
        if size > limit:
            raise DecodeBoundError(f"{what}: row group {rg} decodes to {size} bytes ({how}), over the bound of "
                                   f"{limit}: set CDCSTORE_MAX_DECODED_BYTES to read larger row groups, or "
                                   f"rewrite the file with smaller ones")

    check(sum(_footer_bytes(g.num_rows, schema.field(n).type) for n in names), "by its footer")
    try:
        pf = pq.ParquetFile(source, metadata=metadata, pre_buffer=True, read_dictionary=dicts or None)
        table = pf.read_row_group(rg, columns=columns)
    except (OSError, pa.ArrowException) as e:  # pyarrow's word for a forged footer or damaged pages
        cause = e.__cause__ or e.__context__
        if isinstance(cause, CdcError):  # the store's own error (busy, unreachable, damaged) says what it is
            raise cause from None
        raise CorruptionError(f"{what}: row group {rg} does not decode ({e}): the file's footer or pages are "
                              f"damaged (or forged); rewrite the file") from None
    sizes = {n: _expanded_bytes(table.column(n)) for n in dicts}
    check(sum(c.nbytes for n, c in zip(table.column_names, table.columns) if n not in sizes) + sum(sizes.values()),
          "its values")
    for n in dicts:
        i = table.column_names.index(n)
        table = table.set_column(i, schema.field(n), table.column(i).cast(schema.field(n).type))
    return table


def _may_expand_past(g, field, limit: int) -> bool:
    """A top-level string or binary column whose chunk in row group `g` is dictionary-encoded and
    could decode past `limit`: one value is at most the chunk's uncompressed bytes, so a chunk of
    rows x those bytes under the limit cannot (a caller who trusts its data and raises the bound
    far enough skips the count; the count costs a dictionary build where pages fell back to plain)."""
    t = field.type
    if not (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t)):
        return False
    for j in range(g.num_columns):
        c = g.column(j)
        if c.path_in_schema == field.name:
            return c.has_dictionary_page and g.num_rows * c.total_uncompressed_size > limit
    return False


def _footer_bytes(rows: int, t: pa.DataType) -> int:
    """Bytes a column of `rows` rows of type `t` takes at least: fixed-width values, or offsets."""
    try:
        return rows * max(t.bit_width // 8, 1)
    except ValueError:  # not fixed-width: strings and lists have offsets at least
        return rows * 4


def _expanded_bytes(column) -> int:
    """The bytes a dictionary-encoded string column takes once expanded (values and offsets)."""
    total = 0
    for chunk in column.chunks:
        lengths = pc.binary_length(chunk.dictionary)
        total += (pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0) + 4 * (len(chunk) + 1)
    return total


def _root() -> str:
    try:
        st = os.statvfs(SHM)
        if st.f_bavail * st.f_frsize >= SHM_MIN_FREE and os.access(SHM, os.W_OK):
            return SHM
    except OSError:
        pass
    return tempfile.gettempdir()


def _sweep_stale(root: str) -> None:
    """Remove folders left by runs whose main process is gone."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            m = _FOLDER.match(entry.name)
            if m and not runtime.pid_alive(int(m.group(1))):
                shutil.rmtree(entry.path, ignore_errors=True)


def _reap_when_gone(pid: int, path: str) -> None:
    """Remove `path` once process `pid` is gone, even by SIGKILL: a `sh` loop in its own session
    (so a signal to the owner's process group spares it), polling once a second."""
    with contextlib.suppress(OSError):
        subprocess.Popen(["sh", "-c", _REAPER, "sh", str(pid), path], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         close_fds=True)


_watched = runtime.Local()  # set in a process whose parent a thread watches (`exit_with_parent`)


def exit_with_parent(poll: float = 1.0) -> None:
    """In a DataLoader worker: exit within `poll` s of the parent's death (a SIGKILLed rank), even
    when blocked: at exit a worker waits to flush its batches into the pipe to the dead parent,
    which a sibling worker keeps open, so it used to wait forever. Once per process."""
    if _watched.here():
        return
    _watched.set(True)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(1)

    runtime.thread(watch, name="exit-with-parent")


def _remove_if_owner(path: str, owner: int) -> None:
    if runtime.is_this_process(owner):
        shutil.rmtree(path, ignore_errors=True)


class DecodedUnits:
    """The shared folder of decoded row groups and the workers' progress (see the module)."""

    def __init__(self, slots: int):
        import multiprocessing

        root = _root()
        _sweep_stale(root)
        self.path = tempfile.mkdtemp(prefix=f"cdcstore-units-{os.getpid()}-", dir=root)
        _reap_when_gone(os.getpid(), self.path)
        self._progress = multiprocessing.get_context().Array("q", slots, lock=False)
        self._loops = multiprocessing.get_context().Value("q", 0, lock=False)  # the loader's iterations begun
        # removed when collected, or at exit AFTER multiprocessing has stopped the daemonic DataLoader
        # workers (exitpriority < 0): a worker still writing into the folder kept it alive past an
        # atexit removal (weakref.finalize runs before that), and a script's exit left it behind
        from multiprocessing import util
        self._finalizer = util.Finalize(self, _remove_if_owner, args=(self.path, os.getpid()), exitpriority=-1)
        self.decodes = 0  # row groups this process decoded
        # (slowest position at the last scan, earliest release left, calls since)
        self._scanned: tuple[tuple[int, int] | None, tuple[int, int] | None, int] = (None, None, 0)
        self._pins = itertools.count()
        self.worker, self.workers = 0, 1  # which worker of how many this process is (set by the stream)

    def __getstate__(self):
        from multiprocessing.context import get_spawning_popen

        if get_spawning_popen() is None:
            raise TypeError("DecodedUnits goes only to DataLoader workers (their spawn or fork)")
        return {"path": self.path, "_progress": self._progress, "_loops": self._loops, "decodes": 0,
                "_scanned": (None, None, 0), "_pins": itertools.count(), "worker": 0, "workers": 1}

    # -- progress ---------------------------------------------------------------------------
    def report(self, slot: int, epoch: int, position: int) -> None:
        """Worker `slot` has consumed every position of `epoch` before `position`."""
        self._progress[slot] = epoch << POS_BITS | min(position, DONE)

    def _slowest(self, slots: range) -> tuple[int, int]:
        low = min(self._progress[s] for s in slots)
        return low >> POS_BITS, low & DONE

    def release(self, slots: range, epoch: int, bound) -> int:
        """Delete the files no worker of `slots` can need again; `bound(unit)` is a unit's release
        bound in `epoch`. Returns how many went."""
        low = low_epoch, low_pos = self._slowest(slots)
        seen, earliest, calls = self._scanned
        # the folder is scanned when the slowest worker moved and has reached the earliest release
        # bound seen at the last scan, at the end of an epoch, or every `RESCAN_EVERY` calls (row
        # groups other workers added): not at every step (a scan per step cost 6% of a worker's CPU)
        if low == seen or (low_pos != DONE and calls + 1 < RESCAN_EVERY and (earliest is None or low < earliest)):
            self._scanned = seen, earliest, calls + 1
            return 0
        gone, left = 0, []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.path):
                m = _NAME.match(entry.name)
                if not m:
                    continue
                e, u = int(m.group(1)), int(m.group(2))
                if e < low_epoch or (e == low_epoch == epoch and bound(u) <= low_pos) or \
                        (e == low_epoch and low_pos == DONE):
                    for name in (entry.path, entry.path + ".lock"):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(name)
                    gone += 1
                else:
                    # when it can go: at its bound (this epoch's order), at the end of its epoch, or after
                    left.append((e, bound(u)) if e == low_epoch == epoch else (e, DONE) if e == low_epoch else (e, 0))
        self._scanned = low, min(left, default=None), 0
        return gone

    # -- row groups ---------------------------------------------------------------------------
    def ready(self, epoch: int, unit: int) -> bool:
        """Row group `unit` is in the folder."""
        return os.path.exists(os.path.join(self.path, f"e{epoch}-u{unit}.arrow"))

    def put(self, epoch: int, unit: int, decode) -> pa.Table | None:
        """Decode row group `unit` into the folder ahead of need, unless a worker did; the table when
        the folder could not take it (the caller keeps it), else None."""
        table = self.load(epoch, unit, decode)
        return None if self.ready(epoch, unit) else table

    def load(self, epoch: int, unit: int, decode) -> pa.Table:
        """Row group `unit` of `epoch`: mapped from the folder, or `decode()`d here (by one worker
        at a time) and written there first. If the folder cannot take it (full), the table
        decoded here is returned as it is."""
        path = os.path.join(self.path, f"e{epoch}-u{unit}.arrow")
        table = self._open(path)
        if table is not None:
            return table
        with open(path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            table = self._open(path)
            if table is not None:
                return table
            table = decode()
            self.decodes += 1
            tmp = path + f".{os.getpid()}.tmp"
            try:
                with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                    writer.write_table(table)
                os.rename(tmp, path)
            except OSError:  # no room: this worker keeps its own copy; another decodes its own
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                return table
        return self._open(path) or table

    # -- batches by reference ----------------------------------------------------------------
    def begin_loop(self) -> int:
        """In the main process, as a loader's iteration begins: its number (workers name their
        links with the number current when their iteration starts, see `loop`)."""
        self._loops.value += 1
        return self._loops.value

    @property
    def loop(self) -> int:
        return self._loops.value

    def pin(self, epoch: int, unit: int, loop: int = 0) -> str | None:
        """A new hard link to row group `unit`'s file, for one batch of iteration `loop` handed over
        by reference; None when the folder does not hold it (it was full: the caller hands the rows
        over itself). The caller still holds the row group, so its file cannot have been released."""
        path = os.path.join(self.path, f"pin-{loop}-{os.getpid()}-{next(self._pins)}.arrow")
        try:
            os.link(os.path.join(self.path, f"e{epoch}-u{unit}.arrow"), path)
        except FileNotFoundError:
            return None
        return path

    def drop_pins(self, before: int | None = None) -> int:
        """Remove the links of batches handed over but never taken (a loop that stopped early): of
        iterations before `before`, or all; only once no worker can make more of them. Returns how
        many went."""
        gone = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.path):
                m = _PIN.match(entry.name)
                if m and (before is None or int(m.group(1)) < before):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        gone += 1
        return gone

    @staticmethod
    def _open(path: str) -> pa.Table | None:
        try:
            source = pa.memory_map(path)
        except FileNotFoundError:
            return None
        with source:
            return pa.ipc.open_file(source).read_all()


@dataclass
class BatchRef:
    """One batch as a worker hands it over by reference: position k of the batch is row `rows[k]` of
    row group `units[k]`, or, when they are a few runs of consecutive rows, `runs` says so as
    (unit, first row, rows) and the arrays are None; `pins` maps each of those row groups to a
    link made for this batch."""

    units: np.ndarray | None
    rows: np.ndarray | None
    pins: dict[int, str]
    runs: list[tuple[int, int, int]] | None = None

    def __len__(self) -> int:
        if self.runs is not None:
            return sum(n for _, _, n in self.runs)
        if self.rows is None:
            raise TypeError("a BatchRef without runs has rows")
        return len(self.rows)


class PinnedTables:
    """The main process's side of `BatchRef`s: maps each pinned row group (once while it stays among
    the `keep` most recently used: a row group decodes to the same table in every epoch), removes
    the batch's links, and returns the tables."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._tables: collections.OrderedDict[int, pa.Table] = collections.OrderedDict()

    def tables(self, ref: BatchRef) -> dict[int, pa.Table]:
        out = {}
        try:
            for u, path in ref.pins.items():
                table = self._tables.pop(u, None)
                if table is None:
                    table = DecodedUnits._open(path)
                    if table is None:
                        raise RuntimeError(f"a DataLoader worker's link to a decoded row group ({path}) is gone "
                                           f"before this process read it: was the folder removed while the "
                                           f"loader ran?")
                self._tables[u] = out[u] = table
        finally:
            for path in ref.pins.values():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        while len(self._tables) > max(self.keep, len(out)):
            self._tables.popitem(last=False)
        return out

    def clear(self) -> None:
        self._tables.clear()

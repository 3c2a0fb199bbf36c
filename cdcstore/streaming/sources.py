"""The kinds of file a `StreamingDataset` streams: Parquet files and WebDataset-style TAR shards, two
implementations of one `Source` interface.

A source cuts its files into units of work (a Parquet row group, a TAR shard), each holding a
number of rows (samples). The dataset owns the order (`streaming/order.py`: which unit and row each
position of an epoch is), the ranks, workers, resume and prefetch; a source owns the I/O:

    index    read once, at construction, what the units are (footers, tar headers); the source
             travels with the dataset when it is pickled to workers
    produce  in the prefetch thread, for this consumer's steps, the items that hold its rows
    emit     in the consumer, each item as batches or rows in the dataset's format

Both built-in sources honour the same contract: the same positions give the same rows, whatever
the kind, so shuffle, ranks and resume mean the same. A third kind subclasses `SampleSource` (rows
as dicts, read a step at a time, as TAR does) or `Source`, and is passed with
`StreamingDataset(..., kinds=[MySource, *sources.KINDS])`.
"""
from __future__ import annotations

import collections
import concurrent.futures
import difflib
import fnmatch
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator, Protocol, Sequence, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import runtime, settings
from ..api import PositionedFile, Store, handed_to_arrow
from ..core import filemap
from ..core import pages as _pages
from ..core.address import Address, parse
from ..core.errors import CdcError, CorruptionError, InvalidAddressError, PathNotFoundError
from ..core.thrift import ThriftError
from . import decoded as _decoded
from . import decoders as _decoders
from . import order as _order
from . import shards as _shards

if TYPE_CHECKING:
    from ..api import FileReader
    from .decoded import BatchRef, DecodedUnits, PinnedTables

WARM_AHEAD = 2  # fetches (of 1 or 2 row groups) a stream with a cache has ahead at once (`Warmer`)
LOOK_AHEAD_STEPS = 256  # steps a stream looks ahead for the next row group to fetch while one decodes
FOOTER_BYTES = 8  # a file's end fetched with its manifest: the chunk holding its last 8 bytes, which is
#                  its footer (a push cuts a Parquet footer as a chunk of its own, up to 256 KiB)
FOOTERS_TOGETHER = 256  # files opened together at construction (their ends are held in the cache)
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


class SourceContext(Protocol):
    """What a source asks of the dataset it streams for (`stream.StreamingDataset` is one): its
    settings, and where its figures go."""

    @property
    def store(self) -> Store:
        """This process's."""

    source: "Source"  # the dataset's source (this one)
    columns: list[str] | None
    batch_size: int | None
    block: int  # rows per batch (or per step of a row stream)
    format: str  # "numpy", "arrow" or "python"
    strings: str  # format "numpy": string/binary columns as object arrays ("python") or pyarrow arrays ("arrow")
    prefetch_bytes: int

    @property
    def counts(self) -> dict:
        """The figures a source adds to ("bytes_read", "read_seconds", "row_groups", ...)."""

    def yielded(self, samples: int, batches: int = 0) -> None:
        """`samples` rows handed to the consumer (in `batches` batches): the resume position."""

    @property
    def in_worker(self) -> bool:
        """True in a DataLoader worker (its batches go to the main process)."""


class Source:
    """One kind of file, streamed. `units`: (file index, unit within the file, rows) in file order.

    A subclass sets `noun`/`plural` (for messages), `claims` (the paths a folder source lists for
    it), `index`, `produce` and `consumer`. The dataset `ds` passed to them gives the settings
    (`columns`, `block`, `batch_size`, `format`, `prefetch_bytes`, `store`) and takes the figures:
    a source adds to `ds.counts` ("bytes_read", "read_seconds", ...) and tells `ds.yielded(n, batches)`
    the samples it yielded, which `metrics()` and `state_dict()` report (see `SourceContext`)."""

    noun: ClassVar[str] = "a file"
    plural: ClassVar[str] = "files"
    shares_decoded: ClassVar[bool] = False  # DataLoader workers share its decoded units (`streaming/decoded.py`)

    def __init__(self, files: list[SourceFile], units: list[tuple[int, int, int]]):
        self.files, self.units = files, units

    @classmethod
    def claims(cls, path: str) -> bool:
        """True for the paths of this kind a folder source lists."""
        raise NotImplementedError

    @classmethod
    def index(cls, ds: SourceContext, files: list[SourceFile], decode=None) -> "Source":
        """The units of `files`, read once (footers, headers) through `ds.store`."""
        raise NotImplementedError

    def produce(self, ds: SourceContext, order: _order.EpochOrder, steps: Iterator, skip: int,
                share: "DecodedUnits | None" = None, epoch: int = 0) -> Iterator[tuple[object, int]]:
        """In the prefetch thread: (item, bytes held) for the positions of `steps` (each an array of
        positions of one step, shifted by `skip`); an item of 0 bytes is not counted in the budget.
        `share` (only for a source that `shares_decoded`) holds units decoded by other workers."""
        raise NotImplementedError

    def consumer(self, ds: SourceContext, progress: Callable[[int], None] | None = None,
                 pin: Callable[[int], str | None] | None = None) -> Callable[[object], Iterator | None]:
        """A function of each produced item, in order: what to yield for it (batches or rows), or
        None. `progress(past)` (with `share`): the consumer is past this position of the order.
        `pin(unit)` (a source that `shares_decoded`, in a worker of `ds.loader()`): a link to a
        shared decoded unit, to hand batches over as `decoded.BatchRef`s (None: hand the rows)."""
        raise NotImplementedError

    def resolve(self, ds: SourceContext, ref: "BatchRef", tables: "PinnedTables"):
        """In the main process: the batch a worker handed over by reference (see `consumer`)."""
        raise NotImplementedError(f"{type(self).__name__} hands batches over by value")


class SampleSource(Source):
    """A source whose rows are dicts of `__key__` and one entry per field, read a step at a time
    (in pieces of about a quarter of the prefetch budget): a subclass gives `fields` and implements
    `sizes` and `read`."""

    fields: list[str]

    def sizes(self, ds: SourceContext, units: list[int], rows: list[int]) -> list[int]:
        """The bytes each (unit, row) will read."""
        return [1] * len(units)

    def read(self, ds: SourceContext, units: np.ndarray, rows: np.ndarray, readers: dict) -> list[dict]:
        """One dict per (unit, row); `readers` (file index -> open reader) lives as long as `produce`."""
        raise NotImplementedError

    def finish(self, samples: list[dict]) -> list[dict]:
        """In the prefetch thread, after the read (TAR decodes members here)."""
        return samples

    def produce(self, ds, order, steps, skip, share=None, epoch=0):
        readers: dict[int, FileReader] = {}
        try:
            for pos in steps:
                units, rows = order.locate(order.sequence_index(pos + skip))
                for lo, hi in self._pieces(ds, units, rows):
                    got = self.read(ds, units[lo:hi], rows[lo:hi], readers)
                    nbytes = sum(len(v) for s in got for v in s.values()) or 1
                    yield ("samples", self.finish(got)), nbytes
        finally:
            for reader in readers.values():
                reader.close()

    def _pieces(self, ds, units: np.ndarray, rows: np.ndarray) -> list[tuple[int, int]]:
        """A step's positions cut, at block boundaries, into pieces of at most a quarter of
        `prefetch_bytes` of bytes read (at least one block each): the queue, the piece being
        read and the one being consumed then hold about 1.5 x prefetch_bytes, whatever the step."""
        sizes = self.sizes(ds, units.tolist(), rows.tolist())
        budget, block = max(1, ds.prefetch_bytes // 4), ds.block
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

    def consumer(self, ds, progress=None, pin=None):
        return lambda item: self._emit(ds, item[1])

    def _emit(self, ds, samples: list[dict]):
        """One dict per sample, or one batch per block with a column per field of the dataset: a
        dict of lists ("numpy" and "python"; None where a sample lacks the field) or a RecordBatch
        ("arrow"; keys as strings, fields as bytes)."""
        if ds.batch_size is None:
            for s in samples:
                ds.yielded(1)
                yield s
            return
        names = ["__key__", *self.fields]
        for lo in range(0, len(samples), ds.block):
            part = samples[lo:lo + ds.block]
            ds.yielded(len(part), 1)
            cols = {k: [s.get(k) for s in part] for k in names}
            if ds.format == "arrow":
                yield pa.RecordBatch.from_pydict(
                    cols, pa.schema([(k, pa.string() if k == "__key__" else pa.binary()) for k in names]))
            else:
                yield cols


class TarSource(SampleSource):
    """WebDataset-style TAR shards: a unit is a shard, a row a sample (its members grouped by key,
    `streaming/shards.py`); only the byte ranges of the members asked for (`columns`: extensions) are read."""

    noun, plural = "a TAR shard", "TAR shards"

    def __init__(self, files, tables: list, fields: list[str], decoders: dict, want: set | None):
        super().__init__(files, [(fi, 0, len(table)) for fi, table in enumerate(tables) if table])
        self.tables, self.fields, self.decoders, self.want = tables, fields, decoders, want

    @property
    def extensions(self) -> list[str]:
        return self.fields

    @classmethod
    def claims(cls, path: str) -> bool:
        return _shards.is_tar(path)

    @classmethod
    def index(cls, ds, files, decode=None):
        tables = []
        for f in files:  # each shard's sample table, from its headers (read a window at a time)
            with ds.store.open(f.address) as r:
                tables.append(_shards.samples(_shards.scan(r.pread, f.size, f.address), f.address))
        exts = dict.fromkeys(e for table in tables for smp in table for e, _, _ in smp.parts)
        want = None if ds.columns is None else set(ds.columns)
        decoders = _decoders.table(ds.format != "arrow" if decode is None else decode,
                                   settings.MAX_IMAGE_PIXELS.get(_decoders.MAX_IMAGE_PIXELS))
        return cls(files, tables, [e for e in exts if want is None or e in want], decoders, want)

    def sizes(self, ds, units, rows):
        want = self.want
        return [sum(n for e, _, n in self.tables[self.units[u][0]][r].parts if want is None or e in want)
                for u, r in zip(units, rows)]

    def read(self, ds, units, rows, readers):
        """The members' ranges of each shard are merged (gaps up to 64 KiB) and read in order."""
        want = self.want
        picked = []
        for u, row in zip(units.tolist(), rows.tolist()):
            fi = self.units[u][0]
            sample = self.tables[fi][row]
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
                readers[fi] = ds.store.open(self.files[fi].address)
            for lo, hi in spans:
                data[fi, lo] = memoryview(readers[fi].pread(lo, hi - lo))
            starts[fi] = [lo for lo, _ in spans]
        out = []
        m = ds.counts
        for fi, sample, parts in picked:
            s = {"__key__": sample.key}
            for ext, o, n in parts:
                lo = starts[fi][int(np.searchsorted(starts[fi], o, side="right")) - 1]
                s[ext] = bytes(data[fi, lo][o - lo:o - lo + n])
                m["bytes_read"] += n
            out.append(s)
        m["read_seconds"] += time.perf_counter() - t0
        return out

    def finish(self, samples):
        if self.decoders:
            return [_decoders.decode_sample(s, self.decoders) for s in samples]
        return samples


def check_columns(columns: list[str], md: pq.FileMetaData, what) -> None:
    """That each column asked for is in the file (a top-level field, or a nested one's dotted
    path): a misspelled name is an error naming it and the closest names, never a column
    silently left out (pyarrow raises too)."""
    schema = md.schema.to_arrow_schema()
    known = set(schema.names) | {md.schema.column(j).path for j in range(md.num_columns)}
    missing = [c for c in columns if c not in known]
    if missing:
        close = difflib.get_close_matches(missing[0], sorted(known), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise InvalidAddressError(
            f"no column {missing[0]!r} in {what}: {hint}its columns are "
            f"{', '.join(schema.names[:20])}{' ...' if len(schema.names) > 20 else ''}"
            + (f" ({len(missing) - 1} more not found: {', '.join(map(repr, missing[1:4]))})" if len(missing) > 1 else ""))


class ParquetSource(Source):
    """Parquet files: a unit is a row group, read whole (the columns asked for) once per consumer
    in order of first need, held until its rows are consumed; a step's rows are gathered from the
    row groups held."""

    noun, plural = "a Parquet file", "Parquet files"
    shares_decoded = True

    def __init__(self, files, footers: list[pq.FileMetaData], columns: list[str] | None):
        super().__init__(files, [(fi, rg, md.row_group(rg).num_rows)
                                 for fi, md in enumerate(footers) for rg in range(md.num_row_groups)])
        self.footers, self.columns = footers, columns
        self.want = None if columns is None else set(columns)
        if columns is not None:
            for f, md in zip(files, footers):
                check_columns(columns, md, f.address)

    @classmethod
    def claims(cls, path: str) -> bool:
        return path.endswith(".parquet")

    @classmethod
    def index(cls, ds, files, decode=None):
        """The footers. The files are opened `FOOTERS_TOGETHER` at a time (`Store.open_many`: on a
        server their manifests and the chunks of their last `FOOTER_BYTES` come in one request,
        into the chunk cache), then each footer is read through its reader (8 at a time: from the
        cache, or by a request each where the store could not send it with the manifests)."""
        footers: list[pq.FileMetaData] = []
        for lo in range(0, len(files), FOOTERS_TOGETHER):
            part = files[lo:lo + FOOTERS_TOGETHER]
            readers = ds.store.open_many([f.address for f in part], tail=FOOTER_BYTES)
            try:
                pairs = list(zip(part, readers))
                footers += runtime.pool("io", 8).map(lambda p: cls._footer(*p), pairs) if len(pairs) > 1 \
                    else [cls._footer(*p) for p in pairs]
            finally:
                for r in readers:
                    r.close()
        return cls(files, footers, ds.columns)

    @staticmethod
    def _footer(f: SourceFile, r: "FileReader") -> pq.FileMetaData:
        """The file's footer, read exactly (its length, then its bytes: no more than the chunk a
        push cut it into) and parsed by pyarrow from those bytes alone."""
        try:
            size = r.size
            end = r.pread(size - 8, 8) if size >= 12 else b""
            n = int.from_bytes(end[:4], "little")
            if end[4:] != b"PAR1" or n > size - 12:
                raise pa.ArrowInvalid("no Parquet footer at its end (an encrypted footer is not supported)")
            footer = b"PAR1" + r.pread(size - 8 - n, n) + end  # the footer alone is a file pyarrow reads
            return checked_footer(pq.ParquetFile(pa.BufferReader(footer)).metadata, f)
        except CdcError:  # the store's own error (busy, unreachable, damaged) says what it is
            raise
        except (pa.ArrowInvalid, OSError) as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, CdcError):
                raise cause from None
            raise InvalidAddressError(f"{f.address} is not a readable Parquet file ({e}): "
                                      f"stream Parquet files only") from None

    # -- the prefetch thread ----------------------------------------------------------------------
    def produce(self, ds, order, steps, skip, share=None, epoch=0):
        """Each needed row group once, in order of first need, then each step (whole blocks of
        this consumer's positions). With `share`, a row group another worker decoded is mapped
        from the shared folder, and one decoded here is put there."""
        loaded: set[int] = set()
        files: dict[int, FileReader] = {}  # file index -> its open reader (the last 8)
        warm = Warmer(ds) if share is None and ds.store.cache is not None else None
        located: collections.deque = collections.deque()  # steps located ahead: (pos, units, rows)
        steps = iter(steps)
        metrics = ds.counts

        def pull() -> bool:
            pos = next(steps, None)
            if pos is not None:
                units, rows = order.locate(order.sequence_index(pos + skip))
                located.append((pos, units, rows, _first_seen(units)))
            return pos is not None

        def next_new(after: int, want=None) -> int | None:
            """The first row group needed after `after` that is not loaded (and that `want`s, if
            given), looking ahead at most `LOOK_AHEAD_STEPS` steps."""
            k = 0
            while True:
                while k >= len(located):
                    if k >= LOOK_AHEAD_STEPS or not pull():
                        return None
                for v in located[k][3]:
                    if v not in loaded and v != after and (want is None or want(v)):
                        return v
                k += 1

        def mine(v: int) -> bool:  # the shared row groups this worker decodes ahead
            return int(order.slots[v]) % share.workers == share.worker and v not in spare and not share.ready(epoch, v)

        spare: dict[int, pa.Table] = {}  # decoded ahead, not put in the folder (it was full)

        try:
            while located or pull():
                pos, units, rows, needed = located[0]  # stays first while it loads: `next_new` looks from it
                for u in needed:
                    if u in loaded:
                        continue
                    loaded.add(u)
                    fetched = warm.claim(u) if warm is not None else None  # its bytes, fetched ahead
                    if warm is not None:  # the next row groups' bytes arrive while this one decodes
                        nexts: list[int] = []
                        while warm.room() and len(nexts) < 2 * WARM_AHEAD:
                            v = next_new(u, lambda x: warm.wants(x) and x not in nexts)
                            if v is None:
                                break
                            nexts.append(v)
                        warm.ahead(nexts)
                    if share is None:
                        table = self._read_unit(ds, u, files, Warmer.spans_of(fetched))
                    elif u in spare:
                        table = spare.pop(u)
                    else:
                        # another worker decodes this one (`mine`): meanwhile, decode the next of ours
                        v = next_new(u, mine) if not mine(u) and not share.ready(epoch, u) else None
                        if v is not None:
                            kept = share.put(epoch, v, lambda: self._read_unit(ds, v, files))
                            if kept is not None:
                                spare[v] = kept
                        table = share.load(epoch, u, lambda: self._read_unit(ds, u, files))
                    metrics["row_groups"] += 1
                    yield ("unit", u, table, _order.release_bound(order, u) - skip), table.nbytes or 1
                located.popleft()
                yield ("step", int(pos[-1]) + 1, units, rows), 0
        finally:
            if warm is not None:
                warm.close()
            for reader in files.values():
                reader.close()

    def spans(self, u: int) -> list[tuple[int, int]]:
        """The byte ranges (offset, length) of a row group's column chunks asked for, merged
        where they are less than 1 MiB apart."""
        fi, rg, _ = self.units[u]
        g = self.footers[fi].row_group(rg)
        want = self.want
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

    def _read_unit(self, ds, u: int, files: dict, fetched: "list[tuple[int, bytes]] | None" = None) -> pa.Table:
        """Row group `u` decoded, read through the file's reader, or from `fetched`: its
        spans' bytes, which a `Warmer` read (verified) through a reader of its own."""
        fi, rg, _ = self.units[u]
        if fi not in files:
            if len(files) >= 8:
                files.pop(next(iter(files))).close()
            files[fi] = ds.store.open(self.files[fi].address)
        reader = files[fi] if not fetched else HeldSpans(files[fi], fetched)
        t0 = time.perf_counter()
        self._check_rows(fi, rg, reader)
        # pre_buffer: the row group's column chunks in one coalesced read (no read-ahead past it,
        # which would fetch what another DataLoader worker decodes); a ParquetFile per row group,
        # since one keeps its last pre-buffered bytes while it lives
        table = _decoded.read_row_group(reader, self.footers[fi], rg, self.columns, self.files[fi].address)
        if table.num_rows != self.units[u][2]:
            raise lying_rows(self.files[fi], rg, self.units[u][2], f"pyarrow read {table.num_rows}")
        m = ds.counts
        m["read_seconds"] += time.perf_counter() - t0
        m["bytes_read"] += self._column_bytes(fi, rg)
        m["decodes"] += 1
        return table

    def _check_rows(self, fi: int, rg: int, reader) -> None:
        """Before pyarrow allocates for a row group's rows: the page headers of one of its column
        chunks that is not repeated (the smallest among the columns asked for, else of all) must
        hold the rows its footer claims."""
        md, f = self.footers[fi], self.files[fi]
        g = md.row_group(rg)
        want = self.want
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
            raise lying_rows(f, rg, g.num_rows, f"its pages hold {held}")

    def _column_bytes(self, fi: int, rg: int) -> int:
        g = self.footers[fi].row_group(rg)
        want = self.want
        return sum(g.column(j).total_compressed_size for j in range(g.num_columns)
                   if want is None or g.column(j).path_in_schema.split(".")[0] in want)

    # -- the consumer -----------------------------------------------------------------------------
    def consumer(self, ds, progress=None, pin=None):
        """Row groups are held until the consumer is past their release bound; a step's rows are
        gathered from them and emitted, or, with `pin`, handed over by reference (one `BatchRef`
        per block, made before the progress that lets the row groups go)."""
        held: dict[int, tuple[pa.Table, int]] = {}
        m = ds.counts

        def take(item):
            if item[0] == "unit":
                _, u, table, bound = item
                held[u] = (table, bound)
                m["max_rows_held"] = max(m["max_rows_held"], sum(t.num_rows for t, _ in held.values()))
                return None
            _, past, units, rows = item
            out = self._refs(ds, units, rows, pin) if pin is not None and ds.batch_size is not None else None
            if out is None:
                out = self._emit(ds, self._gather(ds, held, units, rows))
            for u in [u for u, (_, bound) in held.items() if bound <= past]:
                del held[u]
            if progress is not None:
                progress(past)
            return out
        return take

    @staticmethod
    def _refs(ds, units: np.ndarray, rows: np.ndarray, pin) -> list | None:
        """One `BatchRef` per block of the step, each with its own links; None (and no link left)
        when a row group is not in the shared folder."""
        from .decoded import BatchRef

        refs: list[BatchRef] = []
        made: list[str] = []
        m = ds.counts
        for lo in range(0, len(rows), ds.block):
            us, rs = units[lo:lo + ds.block], rows[lo:lo + ds.block]
            pins = {}
            for u in dict.fromkeys(us.tolist()):
                path = pin(u)
                if path is None:
                    for p in made:
                        os.unlink(p)
                    return None
                pins[u] = path
                made.append(path)
            runs = ParquetSource._runs(us, rs)  # worked out here: the main process has the least time
            refs.append(BatchRef(None, None, pins, runs) if runs is not None else BatchRef(us, rs, pins))
        for r in refs:
            ParquetSource._count(ds, len(r))
            m["by_reference"] += 1
        return refs

    def resolve(self, ds, ref, tables):
        """The batch a worker handed over as `ref`, gathered from the mapped row groups."""
        mapped = tables.tables(ref)
        held = {u: (t, 0) for u, t in mapped.items()}
        return self._formatted(ds, self._gather(ds, held, ref.units, ref.rows, ref.runs))

    @staticmethod
    def _runs(units: np.ndarray, rows: np.ndarray) -> list[tuple[int, int, int]] | None:
        """A block's positions as (unit, first row, rows) runs of consecutive rows when they are a
        few (no shuffle); None otherwise."""
        cuts = np.flatnonzero((np.diff(units) != 0) | (np.diff(rows) != 1)) + 1
        if len(cuts) >= 4:
            return None
        bounds = [0, *cuts.tolist(), len(rows)]
        return [(int(units[lo]), int(rows[lo]), hi - lo) for lo, hi in zip(bounds, bounds[1:])]

    @classmethod
    def _gather(cls, ds, held: dict, units: np.ndarray, rows: np.ndarray, runs=False) -> pa.Table:
        """The rows of one block, in order, from the row groups held: slices (no copy) when they are
        a few runs of consecutive rows (no shuffle; `runs`, when the caller has them), else a take."""
        if runs is False:
            runs = cls._runs(units, rows)
        if runs is not None:
            parts = [held[u][0].slice(first, n) for u, first, n in runs]
            table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            if ds.format != "arrow" or not ds.in_worker:
                return table
            return table.combine_chunks().take(pa.array(np.arange(len(rows))))  # to a worker: compact
        ids, which = np.unique(units, return_inverse=True)
        tables = [held[int(u)][0] for u in ids]
        base = np.cumsum([0] + [t.num_rows for t in tables])[:-1]
        index = rows + base[which]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        return table.take(pa.array(index))

    @classmethod
    def _emit(cls, ds, table: pa.Table):
        """Rows, or one batch per block (the last one of a consumer may be short)."""
        if ds.batch_size is None:
            for row in table.to_pylist():
                ds.yielded(1)
                yield row
            return
        if ds.format == "python" or not table.num_rows:
            for lo in range(0, table.num_rows, ds.block):
                yield cls._format(ds, table.slice(lo, ds.block))
            return
        if any(c.num_chunks > 1 for c in table.columns):
            table = table.combine_chunks()  # once a step: each block is then a zero-copy slice
        if ds.format == "arrow":
            for batch in table.to_batches(max_chunksize=ds.block):  # in C++, no copy
                cls._count(ds, batch.num_rows)
                yield batch
            return
        arrays = cls._formatted(ds, table, compact=False)  # numpy: each column copied once a step (writable)
        for lo in range(0, table.num_rows, ds.block):
            n = min(ds.block, table.num_rows - lo)
            cls._count(ds, n)
            # an Arrow string column's block gets buffers of its own: a pickled slice carries its
            # whole parent's buffers (pyarrow 25 and 26), and a held one keeps them alive
            yield {name: pa.concat_arrays([a.slice(lo, n)]) if isinstance(a, pa.Array) else a[lo:lo + n]
                   for name, a in arrays.items()}

    @classmethod
    def _format(cls, ds, table: pa.Table):
        cls._count(ds, table.num_rows)
        return cls._formatted(ds, table)

    @staticmethod
    def _count(ds, n: int) -> None:
        """One batch of `n` rows consumed (the resume position and the figures)."""
        ds.yielded(n, 1)

    @staticmethod
    def _formatted(ds, table: pa.Table, compact: bool = True):
        """One block's rows in the dataset's format (`compact`: Arrow string columns in buffers of
        their own, not slices of a row group's)."""
        n = table.num_rows
        if ds.format == "arrow":
            if not n:
                return pa.RecordBatch.from_pylist([], table.schema)
            if all(c.num_chunks == 1 for c in table.columns):  # a slice of a combined step: no copy
                return pa.RecordBatch.from_arrays([c.chunk(0) for c in table.columns], schema=table.schema)
            return table.combine_chunks().to_batches()[0]
        if ds.format == "python":
            return table.to_pydict()
        table = table.combine_chunks()  # writable arrays: torch takes them without a warning
        arrow = getattr(ds, "strings", "python") == "arrow"
        return {name: _arrow_strings(col, compact) if arrow and is_text(col.type)
                else col.chunk(0).to_numpy(zero_copy_only=False, writable=True) if col.num_chunks
                else col.to_numpy() for name, col in zip(table.column_names, table.columns)}


def is_text(t: pa.DataType) -> bool:
    """A string or binary type (or a dictionary of one): what `strings="arrow"` keeps as Arrow."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or pa.types.is_string_view(t) or pa.types.is_binary_view(t))


def _arrow_strings(col: pa.ChunkedArray, compact: bool) -> pa.Array:
    """A combined column as one pyarrow array (in C++; no Python object per row); `compact`: in
    buffers of its own, so that it pickles as its own bytes only."""
    if col.num_chunks == 0:
        return col.combine_chunks()
    if col.num_chunks == 1 and not compact:
        return col.chunk(0)
    return pa.concat_arrays(col.chunks)


KINDS: tuple[type[Source], ...] = (TarSource, ParquetSource)  # a path no kind claims is the last kind's


def _first_seen(units: np.ndarray) -> list[int]:
    """The distinct units of a step in order of first appearance (numpy: no Python per row)."""
    if len(units) and units[0] == units[-1] and (len(units) < 3 or (units == units[0]).all()):
        return [int(units[0])]
    found, first = np.unique(units, return_index=True)
    return found[np.argsort(first, kind="stable")].tolist()


def kind_of(files: list[SourceFile], kinds: Sequence[type[Source]] = KINDS) -> type[Source]:
    """The one kind of `files` (a file no kind claims counts as the last kind, which says so if it
    cannot read it); a mix is refused."""
    def of(f: SourceFile) -> type[Source]:
        return next((k for k in kinds if k.claims(f.path)), kinds[-1])
    first = of(files[0])
    other = next((f for f in files if of(f) is not first), None)
    if other is not None:
        a, b = (files[0], other) if first is not kinds[-1] else (other, files[0])
        names = " and ".join(sorted({first.plural, of(other).plural}))
        raise InvalidAddressError(f"{a.address} is {of(a).noun} but {b.address} is not: stream {names} as two "
                                  f"datasets (mix them with `interleave`)")
    return first


def expand(source: str, files: dict, commit: str, kinds: Sequence[type[Source]] = KINDS) -> list[SourceFile]:
    """The files a `cdc://` source names in a commit's file map: a file, a folder's files of the
    `kinds` (Parquet files or TAR shards), or a glob's matches, in path order (pure)."""
    a = parse(source)
    if a.path in files:
        found = [a.path]
    elif _GLOB & set(a.path):
        found = [p for p in files if fnmatch.fnmatchcase(p, a.path)]
    else:
        under = list(filemap.under(files, a.path))
        found = [p for p in under if any(k.claims(p) for k in kinds)]
        found = found or [p for p in under if _shards.is_compressed_tar(p)]
    packed = [p for p in found if _shards.is_compressed_tar(p)]
    if packed:
        raise InvalidAddressError(f"{source}: {packed[0]} is a compressed tar: stream plain .tar shards "
                                  f"(decompress them before pushing; chunks dedup better uncompressed)")
    if not found:
        what = " or ".join(k.noun[k.noun.index(" ") + 1:] for k in (kinds[-1], *kinds[:-1]))
        raise PathNotFoundError(f"{source}: no {what} there at commit {commit[:12]}: "
                                f"check the path with `cdcstore ls`")
    return [SourceFile(a.repo, commit, p, files[p].size) for p in sorted(found)]


def lying_rows(f: SourceFile, rg: int, claimed: int, truth: str) -> CorruptionError:
    return CorruptionError(f"{f.address}: row group {rg} claims {claimed} rows but {truth}: the file's "
                           f"footer is damaged (or forged); rewrite the file")


def checked_footer(md: pq.FileMetaData, f: SourceFile) -> pq.FileMetaData:
    """`md` if its row counts agree: no row group below 0 rows, their sum the file's count, and each
    column that is not repeated holding exactly one value per row (a repeated one at least one);
    else CorruptionError naming the file. The pages are checked when a row group is read."""
    total = 0
    for rg in range(md.num_row_groups):
        g = md.row_group(rg)
        if g.num_rows < 0:
            raise lying_rows(f, rg, g.num_rows, "a count cannot be negative")
        for j in range(g.num_columns):
            values, flat = g.column(j).num_values, md.schema.column(j).max_repetition_level == 0
            if values < 0 or (values != g.num_rows if flat else values < g.num_rows):
                raise lying_rows(f, rg, g.num_rows, f"its column {g.column(j).path_in_schema} holds {values} values")
        total += g.num_rows
    if total != md.num_rows:
        raise CorruptionError(f"{f.address}: its row groups hold {total} rows but its footer claims {md.num_rows}: "
                              f"the file's footer is damaged (or forged); rewrite the file")
    return md


class HeldSpans(PositionedFile):
    """A Parquet file for pyarrow whose ranges (offset, bytes) fetched ahead are held here: a read
    inside one is a slice of it; any other read goes to the file's reader. The held bytes were
    verified as they arrived (a `FileReader` returns nothing else) and never left this process."""

    def __init__(self, reader: FileReader, spans: list[tuple[int, bytes]]):
        super().__init__()
        self._reader, self._spans, self._pos = reader, spans, 0
        self._handed = False

    @property
    def size(self) -> int:
        return self._reader.size

    def _view(self, offset: int, length: int) -> bytes | memoryview:
        end = min(offset + max(length, 0), self._reader.size)
        for lo, data in self._spans:
            if lo <= offset and end <= lo + len(data):
                return memoryview(data)[offset - lo:end - lo]
        return self._reader.pread(offset, end - offset) if end > offset else b""

    def pread(self, offset: int, length: int) -> bytes:
        return bytes(self._view(offset, length))

    def read(self, size: int | None = -1) -> bytes:
        return bytes(self._read_view(size))

    def _read_view(self, size: int | None) -> bytes | memoryview:
        n = self._reader.size - self._pos if size is None or size < 0 else size
        data = self._view(self._pos, n)
        self._pos += len(data)
        return data

    def read_buffer(self, size: int | None = -1) -> memoryview:
        """`read` for pyarrow, no copy: a view of the held bytes, tracked as `FileReader.read_buffer`'s."""
        if not self._handed:
            self._handed = True
            handed_to_arrow(self)
        return handed_to_arrow(memoryview(self._read_view(size)))


class Warmer:
    """Fetches the bytes of the row groups a stream will read next, on threads of their own,
    while the stream's thread decodes the one before: the fetches and the decode overlap. The
    fetch goes through the chunk cache (what it fetched is kept there, for other processes and
    later reads) and its bytes are handed to the stream (`claim`), which decodes from them
    without reading them back. At most `WARM_AHEAD` fetches not yet claimed, each of one row
    group or of two next to each other in a file (one range request where two would straddle a
    pack boundary), each through readers of its own thread (a reader reads one range at a time);
    a failed one only leaves the read to fetch. Used when the store has a cache (a read from it costs a
    request), not for a local directory."""

    def __init__(self, ds: SourceContext):
        self._ds = ds
        self._pool = runtime.pool("warm", WARM_AHEAD)  # the process's: streams of this process share it
        self._busy: dict[int, concurrent.futures.Future] = {}  # row group -> its fetch, not claimed yet
        self._done: set[int] = set()
        self._readers: dict[int, dict[int, FileReader]] = {}  # thread -> file index -> FileReader
        self._count_lock = threading.Lock()

    def wants(self, u: int) -> bool:
        """Not fetched (nor being fetched) yet."""
        return u not in self._done

    def room(self) -> bool:
        """Fewer than `WARM_AHEAD` fetches not claimed."""
        return len({id(f) for f in self._busy.values()}) < WARM_AHEAD

    def ahead(self, units: list[int]) -> None:
        """Start fetching these row groups, in order, while there is room: two next to each other
        in a file in one read (one range request where one would straddle two packs)."""
        units = [u for u in units if u not in self._done]
        source = cast("ParquetSource", self._ds.source)
        while units and self.room():
            group = units[:1]
            if len(units) > 1:
                (fa, ra, _), (fb, rb, _) = source.units[units[0]], source.units[units[1]]
                if fb == fa and rb == ra + 1:
                    group.append(units[1])
            units = units[len(group):]
            fut = self._pool.submit(self._fetch, group)
            for u in group:
                self._done.add(u)
                self._busy[u] = fut

    def claim(self, u: int) -> concurrent.futures.Future | None:
        """The fetch of row group `u` (in flight or done), handed to the caller; None if there is none."""
        return self._busy.pop(u, None)

    @staticmethod
    def spans_of(fetch: concurrent.futures.Future | None) -> list[tuple[int, bytes]] | None:
        """A claimed fetch's (offset, bytes), once it is done; None if it failed."""
        if fetch is None:
            return None
        try:
            return fetch.result()
        except Exception:  # noqa: BLE001 - the stream's own read fetches and reports
            return None

    def _fetch(self, group: list[int]) -> list[tuple[int, bytes]] | None:
        ds = self._ds
        source = cast("ParquetSource", ds.source)  # a Warmer serves a Parquet stream
        fi = source.units[group[0]][0]
        try:
            readers = self._readers.setdefault(threading.get_ident(), {})
            reader = readers.get(fi)
            if reader is None:
                if len(readers) >= 8:
                    readers.pop(next(iter(readers))).close()
                reader = readers[fi] = ds.store.open(source.files[fi].address, readahead=False)  # its exact ranges
            spans = _shards.coalesce([(lo, lo + n) for u in group for lo, n in source.spans(u)], 1 << 20)
            got = [(lo, reader.pread(lo, hi - lo)) for lo, hi in spans]
            with self._count_lock:  # the Warmer's threads count together
                ds.counts["warmed"] += len(group)
            return got
        except Exception:  # noqa: BLE001 - the stream's own read fetches and reports
            return None

    def close(self) -> None:
        pending = [f for f in self._busy.values() if not f.cancel()]
        self._busy.clear()
        if pending:
            concurrent.futures.wait(pending)  # their readers are closed next
        for readers in list(self._readers.values()):
            for reader in readers.values():
                reader.close()

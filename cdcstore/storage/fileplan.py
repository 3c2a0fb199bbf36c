"""Where a file's chunks are: the plan a `reader.FileReader` reads by.

A server is asked where chunks are in aligned blocks of `LOCATE_BLOCK` chunks, as a read and
its read-ahead need them; a local store locates the whole file at its first read. A store that
reads runs (`reads_runs`: a directory) is planned instead in segments of `PLAN_CHUNKS` chunks,
each a list of runs of adjacent chunks in a pack (`core.ranges.file_runs`), located in one batch
when first read and kept per process while the store's index is unchanged (`_Plans`). Every
location is checked against the manifest's chunk lengths before any byte is read by it.
"""
from __future__ import annotations

import bisect
import collections
import threading
import weakref
from typing import Iterable, Sequence

from .. import runtime
from ..core.errors import CorruptionError
from ..core.ids import digest
from ..core.manifest import Manifest
from ..core.pack import CODEC_RAW, PackEntry
from ..core.ranges import Run, file_runs
from .roles import ChunkSource, Located

LOCATE_ALL_CHUNKS = 65536  # local files up to ~4 GiB are located in one go at their first read
LOCATE_BLOCK = 512  # chunks located together on a server (~32 MiB of file)
RUN_PIECE = 1024 * 1024  # bytes read at once before they are hashed (still in the CPU's cache)
PLANS_MAX_RUNS = 1 << 16  # runs of the file plans kept per local store
PLAN_CHUNKS = 1 << 16  # a local file is planned in segments of this many chunks (~4 GiB), located when first read
PLAN_SEGMENTS_KEPT = 4  # segments' plans a reader keeps (a scan moves on; a segment holds at most PLAN_CHUNKS runs)

#: A read of raw chunks back to back in a pack (`FilePlan.pieces`): pack, offset, first chunk, stop
#: chunk, their checksums (None: check the ids)
Piece = tuple[str, int, int, int, list[int] | None]
#: A segment's plan (`FilePlan.runs`): its runs, and the first chunk of each
SegmentPlan = tuple[list[Run], list[int]]


class _Plans:
    """Each local store's file plans (`file_runs`) by their file's chunk list, kept while
    the store's index is unchanged (`index_stamp`): a file opened again reads without
    locating. Bounded by runs (a file written by one push has a few runs per pack)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # source -> its plans by key: (the index stamp they hold under, the plan, its runs)
        self._by_source: weakref.WeakKeyDictionary[
            ChunkSource, collections.OrderedDict[bytes, tuple[object, SegmentPlan, int]]] = weakref.WeakKeyDictionary()

    def get(self, source: ChunkSource, key: bytes, stamp: object) -> SegmentPlan | None:
        with self._lock:
            plans = self._by_source.get(source)
            got = plans.get(key) if plans is not None else None
            if plans is None or got is None or got[0] != stamp:
                return None
            plans.move_to_end(key)
            return got[1]

    def put(self, source: ChunkSource, key: bytes, stamp: object, plan: SegmentPlan, size: int) -> None:
        with self._lock:
            plans = self._by_source.setdefault(source, collections.OrderedDict())
            plans[key] = (stamp, plan, size)
            plans.move_to_end(key)
            while plans and sum(p[2] for p in plans.values()) > PLANS_MAX_RUNS:
                plans.popitem(last=False)  # a plan larger than the bound is not kept at all

    def drop(self, source: ChunkSource, key: bytes) -> None:
        with self._lock:
            plans = self._by_source.get(source)
            if plans is not None:
                plans.pop(key, None)


def _plans() -> _Plans:
    """This process's file plans (a forked child starts with none, and a fresh lock)."""
    return runtime.per_process(_Plans, _Plans)


class FilePlan:
    """Where each chunk of one file is, for one reader: `locate` learns it as reads need it,
    `item` and `location` answer it, `pieces` cuts a local file's runs into reads, and
    `relocate` learns it again after a gc moved chunks."""

    def __init__(self, source: ChunkSource, manifest: Manifest, name: str = "", repo: str | None = None,
                 locations: Located | None = None):
        self._src = source
        self._m = manifest
        self._repo = repo
        self.name = name
        self._locs: Located = locations if locations is not None else {}  # may be shared
        self._by_runs = source.capabilities.reads_runs  # a local store: planned in segments of runs
        self._segs: collections.OrderedDict[int, SegmentPlan] = collections.OrderedDict()  # see `runs`

    def locate(self, indices: Sequence[int]) -> None:
        """Learn where chunks live. A local store locates the whole file at the first
        read (one batched lookup, so later reads need none); a server is asked for the
        aligned blocks of `LOCATE_BLOCK` chunks that hold what this read and its
        read-ahead need (locating a whole 1 GB file would cost ~1 MB; a block ~28 KB)."""
        ids = self._m.chunk_ids
        if self._by_runs:
            for seg in sorted({i // PLAN_CHUNKS for i in indices}):
                self.runs(seg)
            return
        if self._src.capabilities.local_reads:
            if not self._locs and len(ids) <= LOCATE_ALL_CHUNKS:
                indices = range(len(ids))
        else:
            blocks = sorted({i // LOCATE_BLOCK for i in indices if ids[i] not in self._locs})
            indices = [k for b in blocks for k in range(b * LOCATE_BLOCK, min(len(ids), (b + 1) * LOCATE_BLOCK))]
        missing = [c for c in dict.fromkeys(ids[i] for i in indices) if c not in self._locs]
        if missing:
            self._locs.update(self._src.locate(missing, self._repo))
        self.check_lengths(indices)

    def check_lengths(self, indices: Iterable[int]) -> None:
        """The manifest's length of each chunk is the one its pack entry records: a manifest that
        lists a chunk longer or shorter than it is (damaged or forged) fails the read, never
        gives a short or padded file."""
        ids, lens, locs = self._m.chunk_ids, self._m.lengths, self._locs
        for i in indices:
            loc = locs.get(ids[i])
            if loc is not None and loc[1].raw_len != lens[i]:
                raise CorruptionError(
                    f"{self.name or 'file'}: its manifest lists chunk {i} ({ids[i].hex()[:16]}...) as {lens[i]} "
                    f"bytes, but that chunk holds {loc[1].raw_len}: the manifest is damaged; the file cannot be read")

    def runs(self, seg: int, fresh: bool = False) -> tuple[list[Run], list[int]]:
        """The runs (`file_runs`, chunk indices counted from the segment's first) of segment
        `seg` of the file (chunks [seg * PLAN_CHUNKS, (seg + 1) * PLAN_CHUNKS)) and their first
        chunks: located in one batch at its first read (chunks the reader was given locations
        of are not asked again, unless `fresh`), or taken from a file opened before while the
        index is unchanged. A file of any size costs a read at most a segment's plan, and a
        reader keeps the plans of `PLAN_SEGMENTS_KEPT` segments."""
        plan = self._segs.get(seg)
        if plan is not None:
            self._segs.move_to_end(seg)
            return plan
        base = seg * PLAN_CHUNKS
        ids = self._m.chunk_ids[base:base + PLAN_CHUNKS]
        key, stamp = self._plan_key(ids), self._src.index_stamp()  # the stamp before locating
        plan = None if fresh else _plans().get(self._src, key, stamp)
        if plan is None:
            wanted = list(dict.fromkeys(ids))
            known: Located = {} if fresh else {c: self._locs[c] for c in wanted if c in self._locs}
            missing = [c for c in wanted if c not in known]
            located = known | self._src.locate(missing, self._repo) if missing else known
            for cid in missing:
                if cid not in located:
                    raise self.not_in_store(cid)
            self._locs.update(located)  # a pull shares them between its files
            self.check_lengths(range(base, base + len(ids)))
            runs = file_runs(ids, located)
            plan = (runs, [r.first for r in runs])
            if not known:  # all located now: true while the stamp holds
                _plans().put(self._src, key, stamp, plan, len(runs))
        self._segs[seg] = plan
        while len(self._segs) > PLAN_SEGMENTS_KEPT:
            self._segs.popitem(last=False)
        return plan

    def pieces(self, first: int, stop: int) -> tuple[list[Piece], list[int]]:
        """Chunks [first, stop) as reads of pack ranges of at most `RUN_PIECE` bytes (pack,
        offset, first chunk, stop chunk, their checksums or None), and the compressed chunks
        among them."""
        lens, ends = self._m.lengths, self._m.ends
        pieces: list[Piece]
        packed: list[int]
        pieces, packed = [], []
        for seg in range(first // PLAN_CHUNKS, (stop - 1) // PLAN_CHUNKS + 1):
            base = seg * PLAN_CHUNKS
            lo, hi = max(first, base), min(stop, base + PLAN_CHUNKS)
            runs, firsts = self.runs(seg)
            k = bisect.bisect_right(firsts, lo - base) - 1
            while k < len(runs) and base + runs[k].first < hi:
                r = runs[k]
                k += 1
                r_first = base + r.first
                if r.entry is not None:
                    packed.append(r_first)
                    continue
                run_start = ends[r_first] - lens[r_first]
                i, b = max(r_first, lo), min(base + r.stop, hi)
                while i < b:
                    start = ends[i] - lens[i]
                    j = max(i + 1, bisect.bisect_right(ends, start + RUN_PIECE, i, b))
                    checks = r.checks[i - r_first:j - r_first] if r.checks is not None else None
                    pieces.append((r.pack, r.offset + start - run_start, i, j, checks))
                    i = j
        return pieces, packed

    def mixed(self, pieces: list[Piece], packed: list[int], base: int,
              most: int = 512) -> list[tuple[str, list[tuple[int, PackEntry]]]]:
        """`pieces` and the compressed chunks `packed` (what `pieces` gave) as reads of chunks back
        to back in one pack, raw and compressed together: (pack, [(where in a result that holds
        the file from byte `base`, entry)]) in file order, at most `most` chunks and about
        `RUN_PIECE` bytes each. A compressed chunk between two raw runs of the same pack no
        longer breaks them into two reads (`read_mixed_into`)."""
        ids, lens, ends = self._m.chunk_ids, self._m.lengths, self._m.ends
        located: list[tuple[int, str, PackEntry]] = [(k, *self.item(k)) for k in packed]
        for pack, offset, i, j, checks in pieces:
            for k in range(i, j):
                located.append((k, pack, PackEntry(ids[k], offset, lens[k], lens[k], CODEC_RAW,
                                                   checks[k - i] if checks is not None else None)))
                offset += lens[k]
        located.sort(key=lambda x: x[0])
        out: list[tuple[str, list[tuple[int, PackEntry]]]] = []
        parts: list[tuple[int, PackEntry]] = []
        pack, end, size = "", -1, 0
        for k, p, e in located:
            if parts and (p != pack or e.offset != end or len(parts) >= most or size >= RUN_PIECE):
                out.append((pack, parts))
                parts, size = [], 0
            parts.append((ends[k] - lens[k] - base, e))
            pack, end, size = p, e.offset + e.stored_len, size + e.stored_len
        if parts:
            out.append((pack, parts))
        return out

    @staticmethod
    def _plan_key(ids: Sequence[bytes]) -> bytes:
        """A segment's chunk list, hashed (the key of its plan)."""
        return digest(b"".join(ids))

    def relocate(self, indices: Iterable[int]) -> None:
        """Locate chunks again (a pack named by their old location is gone)."""
        if self._by_runs:
            ids = self._m.chunk_ids
            segs = sorted({i // PLAN_CHUNKS for i in indices} | set(self._segs)) or [0]
            for seg in segs:
                _plans().drop(self._src, self._plan_key(ids[seg * PLAN_CHUNKS:(seg + 1) * PLAN_CHUNKS]))
            self._segs.clear()
            for seg in segs:
                self.runs(seg, fresh=True)
        else:
            ids = self._m.chunk_ids
            self._locs.update(self._src.locate(list(dict.fromkeys(ids[i] for i in indices)), self._repo))

    def item(self, i: int) -> tuple[str, PackEntry]:
        """Where chunk i lives (from the runs, on a local store)."""
        if not self._by_runs:
            return self.location(self._m.chunk_ids[i])
        seg = i // PLAN_CHUNKS
        base = seg * PLAN_CHUNKS
        runs, firsts = self.runs(seg)
        r = runs[bisect.bisect_right(firsts, i - base) - 1]
        if r.entry is not None:
            return r.pack, r.entry
        ends, lens, r_first = self._m.ends, self._m.lengths, base + r.first
        offset = r.offset + (ends[i] - lens[i]) - (ends[r_first] - lens[r_first])
        check = r.checks[i - r_first] if r.checks is not None else None
        return r.pack, PackEntry(self._m.chunk_ids[i], offset, lens[i], lens[i], CODEC_RAW, check)

    def items(self, indices: Iterable[int]) -> list[tuple[str, PackEntry]]:
        """Where chunks `indices` are, once per distinct chunk (what a read asks its source for)."""
        ids = self._m.chunk_ids
        return list({ids[i]: self.item(i) for i in indices}.values())

    def location(self, cid: bytes) -> tuple[str, PackEntry]:
        loc = self._locs.get(cid)
        if loc is None:
            raise self.not_in_store(cid)
        return loc

    def not_in_store(self, cid: bytes) -> CorruptionError:
        return CorruptionError(f"chunk {cid.hex()} of {self.name or 'file'} is not in the store (a damaged "
                               f"copy was dropped, or the index lacks it): run `cdcstore check`, which names "
                               f"the files affected and the fix")

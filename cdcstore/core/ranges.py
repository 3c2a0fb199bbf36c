"""Range planning: chunk locations merged into few reads of packs (pure logic).

The local store (preads), the HTTP client (range requests) and the server plan
their reads here, and cut the chunks back out of a read with `slices`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from .pack import CODEC_RAW, PackEntry


@dataclass(frozen=True)
class ByteRange:
    """One HTTP range request on a pack and the chunks it serves."""

    pack: str
    start: int
    end: int  # exclusive
    entries: tuple[PackEntry, ...]


def plan_ranges(wanted: list[tuple[str, PackEntry]], max_hole: int = 8 * 1024,
                max_range: int = 32 * 1024 * 1024) -> list[ByteRange]:
    """Merge chunk locations into few range requests (pure, no I/O).

    Chunks of the same pack whose gap is at most `max_hole` bytes share a request,
    as long as the request stays within `max_range` bytes. Each chunk appears once.
    """
    by_pack: dict[str, dict[int, PackEntry]] = {}
    for pack, e in wanted:
        by_pack.setdefault(pack, {})[e.offset] = e
    out: list[ByteRange] = []
    for pack in sorted(by_pack):
        entries = [by_pack[pack][o] for o in sorted(by_pack[pack])]
        group = [entries[0]]
        start, end = entries[0].offset, entries[0].offset + entries[0].stored_len
        for e in entries[1:]:
            e_end = e.offset + e.stored_len
            if e.offset - end <= max_hole and max(end, e_end) - start <= max_range:
                group.append(e)
                end = max(end, e_end)
            else:
                out.append(ByteRange(pack, start, end, tuple(group)))
                group, start, end = [e], e.offset, e_end
        out.append(ByteRange(pack, start, end, tuple(group)))
    return out


def slices(r: ByteRange, data) -> Iterator[tuple[PackEntry, memoryview]]:
    """Each entry of a planned range with its stored bytes, cut from the bytes read for it."""
    view = memoryview(data)
    for e in r.entries:
        lo = e.offset - r.start
        yield e, view[lo:lo + e.stored_len]


def landing(r: ByteRange, places: dict) -> int | None:
    """Where range `r` can land in the output as it is: its chunks raw, back to back in
    the pack and, whole, back to back in the output; else None."""
    dest = None
    pos = r.start
    for e in r.entries:
        if e.codec != CODEC_RAW or e.offset != pos or e.stored_len != e.raw_len:
            return None
        first = places[e.chunk_id][0]
        if first[1] != 0 or first[2] != e.raw_len:
            return None
        if dest is None:
            dest = first[0]
        elif first[0] != dest + (pos - r.start):
            return None
        pos += e.stored_len
    return dest if pos == r.end else None


@dataclass(frozen=True, slots=True)
class Run:
    """Chunks [first, stop) of a file that sit back to back in one pack: one read. A raw
    run's stored bytes are the file's bytes (they land in a result as they are); a
    compressed chunk is a run of its own (`entry` set)."""

    first: int
    stop: int
    pack: str
    offset: int  # in the pack, of chunk `first`
    entry: PackEntry | None = None  # a compressed chunk's location
    checks: list | None = None  # a raw run's xxh3-64 checksums, chunk by chunk (None: check the ids)


def file_runs(chunk_ids: list[bytes], locations: dict) -> list[Run]:
    """A file's chunks (in file order) as runs (pure): a raw chunk joins the run before
    it when it follows it directly in the same pack. `locations[id]` is (pack, entry)."""
    runs: list[Run] = []
    first = pack = None
    offset = end = 0
    checks: list = []
    for i, cid in enumerate(chunk_ids):
        p, e = locations[cid]
        if e.codec != CODEC_RAW or e.stored_len != e.raw_len:
            if first is not None:
                runs.append(Run(first, i, pack, offset, None, _all_or_none(checks)))
                first = None
            runs.append(Run(i, i + 1, p, e.offset, e))
        elif first is not None and p == pack and e.offset == end:
            end += e.stored_len
            checks.append(e.check)
        else:
            if first is not None:
                runs.append(Run(first, i, pack, offset, None, _all_or_none(checks)))
            first, pack, offset, end = i, p, e.offset, e.offset + e.stored_len
            checks = [e.check]
    if first is not None:
        runs.append(Run(first, len(chunk_ids), pack, offset, None, _all_or_none(checks)))
    return runs


def _all_or_none(checks: list) -> list | None:
    return None if None in checks else checks

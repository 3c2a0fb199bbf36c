"""Range planning: chunk locations merged into few reads of packs (pure logic).

The local store (preads), the HTTP client (range requests) and the server plan
their reads here, and cut the chunks back out of a read with `slices`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence, cast

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


def slices(r: ByteRange, data: bytes | bytearray | memoryview) -> Iterator[tuple[PackEntry, memoryview]]:
    """Each entry of a planned range with its stored bytes, cut from the bytes read for it."""
    view = memoryview(data)
    for e in r.entries:
        lo = e.offset - r.start
        yield e, view[lo:lo + e.stored_len]


#: chunk id -> the (dest, lo, hi) places it goes to: out[dest:dest + hi - lo] = chunk[lo:hi]
Places = Mapping[bytes, Sequence[tuple[int, int, int]]]


def lands(e: PackEntry, places: Places) -> int | None:
    """Where chunk `e` can be received as it is: its first place's offset in the output when
    the chunk is stored raw and that place is the whole chunk; else None."""
    if e.codec != CODEC_RAW or e.stored_len != e.raw_len:
        return None
    dest, lo, hi = places[e.chunk_id][0]
    return dest if lo == 0 and hi == e.raw_len else None


def scatter(r: ByteRange, places: Places) -> tuple[list[tuple[bool, int, int]], int]:
    """Where the bytes of range `r` go as they arrive (pure): a list of segments
    (in_output, at, length) in range order, and the size of the spare buffer. A raw chunk
    whose first place is the whole chunk is received straight into the output at its
    place; a compressed or partly wanted chunk, and a hole between chunks, into the spare
    buffer. Adjacent segments with adjacent targets are merged: a range of raw chunks
    back to back in the pack and in the output is one segment."""
    segs: list[list[int]] = []  # [in_output (a bool), at, length]
    spare = 0
    pos = r.start

    def add(in_output: bool, at: int, n: int) -> None:
        if n <= 0:
            return
        last = segs[-1] if segs else None
        if last is not None and last[0] == in_output and last[1] + last[2] == at:
            last[2] += n
        else:
            segs.append([in_output, at, n])

    for e in r.entries:
        if e.offset > pos:  # a hole: read, never used
            add(False, spare, e.offset - pos)
            spare += e.offset - pos
        dest = lands(e, places)
        if dest is None:
            add(False, spare, e.stored_len)
            spare += e.stored_len
        else:
            add(True, dest, e.stored_len)
        pos = e.offset + e.stored_len
    return cast("list[tuple[bool, int, int]]", [tuple(x) for x in segs]), spare


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
    checks: list[int] | None = None  # a raw run's xxh3-64 checksums, chunk by chunk (None: check the ids)


def file_runs(chunk_ids: Sequence[bytes], locations: Mapping[bytes, tuple[str, PackEntry]]) -> list[Run]:
    """A file's chunks (in file order) as runs (pure): a raw chunk joins the run before
    it when it follows it directly in the same pack. `locations[id]` is (pack, entry)."""
    runs: list[Run] = []
    first: int | None = None
    pack = ""  # the pack of the run from `first` (read only when there is one)
    offset = end = 0
    checks: list[int | None] = []
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


def _all_or_none(checks: list[int | None]) -> list[int] | None:
    return None if None in checks else cast("list[int]", checks)

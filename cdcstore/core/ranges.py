"""Range planning: chunk locations merged into few reads of packs (pure logic).

The local store (preads), the HTTP client (range requests) and the server plan
their reads here, and cut the chunks back out of a read with `slices`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from .pack import PackEntry


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

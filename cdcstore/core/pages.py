"""Parquet page geometry: where the chunks of a Parquet file end (docs/format.md, forced cut points).

`page_cuts` (revision 4, page groups: what a push uses) reads a Parquet file's footer here
(Thrift compact protocol, `thrift.py`; no pyarrow import), then hands the column chunk
ranges to the native walk (`_gear.page_groups`): it reads every page header through one
window buffer and chooses, among the page boundaries, the ones where a chunk ends, by
content, so that consecutive small pages share a chunk of about the target size. Each
segment between two cuts is one chunk when it is at most the maximum chunk size, else
(one page larger than the maximum, a footer region) it is cut by the byte chunker.

`page_starts` (revisions 1-3, every page start a cut) is kept as the reference walk in
Python: tests check the native walk against it, and `column_chunk_rows` reads pages
with the same decoder. Anything that is not a readable Parquet file yields None, and the
caller falls back to plain byte CDC.
"""
from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO

from . import _gear
from .chunker import DEFAULT_PARAMS, ChunkParams
from .thrift import Decoder, ThriftError

MAGIC = b"PAR1"
_HEADER_PROBE = 4096  # bytes read per page header at first; grown when a header is longer
#: A column index or offset index at least this long gets cut points at its start and end
#: (revision 2 of the forced cut points): a large index - min/max of long strings, many pages -
#: then dedups on its own when others around it change. Smaller ones stay with their
#: neighbours, so that a wide table's many small indexes do not each become a tiny chunk.
INDEX_CUT_BYTES = 4096
#: Revision 3 of the forced cut points: a file with more than size // MIN_CUT_SPACING + CUT_ALLOWANCE
#: of them (countless tiny pages: a hostile or degenerate file) keeps only those at least
#: MIN_CUT_SPACING bytes after the last one kept (`thin_cuts`). Segments, hence chunks per byte, are
#: then bounded by design (`manifest.max_chunks`); files below the threshold are cut as before.
MIN_CUT_SPACING = 4096
CUT_ALLOWANCE = 1024
#: The forced cut points' revision that `page_cuts` implements (docs/format.md).
REVISION = 4


def read_page_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int, int]:
    """(header length, page type, compressed page size) of the PageHeader at `pos`."""
    d = Decoder(buf, pos)
    h = d.struct()
    ptype, size = h.get(1), h.get(3)
    if not isinstance(ptype, int) or not isinstance(size, int) or size < 0:
        raise ThriftError("page header lacks type or size")
    return d.pos - pos, ptype, size


def read_page_sizes(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int, int, int]:
    """(header length, page type, compressed size, uncompressed size) of the PageHeader at `pos`:
    what a page decodes to, which a reader checks before it lets a decoder allocate for it."""
    d = Decoder(buf, pos)
    h = d.struct()
    ptype, raw, size = h.get(1), h.get(2), h.get(3)
    if not (isinstance(ptype, int) and isinstance(raw, int) and isinstance(size, int)) or size < 0 or raw < 0:
        raise ThriftError("page header lacks type or sizes")
    return d.pos - pos, ptype, size, raw


DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3


def column_chunk_rows(chunk: bytes | bytearray | memoryview) -> int:
    """The rows the pages of one column chunk (its bytes, whole) hold, from their headers: the
    sum of each data page's num_values (v1 pages; the row count of a column that is not
    repeated) or num_rows (v2 pages). ThriftError if the pages do not tile the chunk exactly.
    A reader checks a footer's row counts with it before it allocates for them."""
    pos, rows = 0, 0
    while pos < len(chunk):
        d = Decoder(chunk, pos)
        h = d.struct()
        ptype, size = h.get(1), h.get(3)
        if not isinstance(ptype, int) or not isinstance(size, int) or size < 0:
            raise ThriftError("page header lacks type or size")
        if ptype == DATA_PAGE:
            rows += _count(h.get(5), 1)  # DataPageHeader.num_values
        elif ptype == DATA_PAGE_V2:
            rows += _count(h.get(8), 3)  # DataPageHeaderV2.num_rows
        pos = d.pos + size
    if pos != len(chunk):
        raise ThriftError("pages do not tile the column chunk")
    return rows


def _count(header: object, field: int) -> int:
    n = header.get(field) if isinstance(header, dict) else None
    if not isinstance(n, int) or n < 0:
        raise ThriftError("data page header without a count")
    return n


def column_chunk_ranges(footer: bytes) -> list[tuple[int, int]]:
    """(start, end) of every column chunk, from the FileMetaData bytes."""
    return footer_ranges(footer)[0]


def footer_ranges(footer: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(column chunk ranges, large page index ranges) from the FileMetaData bytes: every
    column chunk's (start, end), and (start, end) of every column index and offset index of at
    least INDEX_CUT_BYTES."""
    meta = Decoder(footer).struct()
    ranges, indexes = [], []
    for rg in _list_of_structs(meta.get(4, []), "row groups"):  # FileMetaData.row_groups
        for cc in _list_of_structs(rg.get(1, []), "columns"):  # RowGroup.columns
            md = cc.get(3)  # ColumnChunk.meta_data
            if not isinstance(md, dict) or not isinstance(md.get(9), int) or not isinstance(md.get(7), int):
                raise ThriftError("column chunk without metadata")
            start = md[9]  # data_page_offset
            if isinstance(md.get(11), int) and md[11]:  # dictionary_page_offset
                start = min(start, md[11])
            ranges.append((start, start + md[7]))  # total_compressed_size
            for off, length in ((4, 5), (6, 7)):  # offset_index_offset/length, column_index_offset/length
                o, n = cc.get(off), cc.get(length)
                if isinstance(o, int) and isinstance(n, int) and n >= INDEX_CUT_BYTES:
                    indexes.append((o, o + n))
    return sorted(ranges), sorted(indexes)


def _list_of_structs(value: object, what: str) -> list[dict[int, Any]]:
    """A Thrift list of structs, or ThriftError (untrusted footers may hold anything)."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ThriftError(f"footer {what} are not a list of structs")
    return value


def page_cuts(path: str, params: ChunkParams = DEFAULT_PARAMS) -> list[int] | None:
    """Offsets where the chunks of Parquet file `path` end (revision 4: page groups; the
    last is the file's size), or None if it is not readable Parquet (then use byte CDC)."""
    try:
        with open(path, "rb") as f:
            return page_cuts_of(f, os.fstat(f.fileno()).st_size, params)
    except OSError:
        return None


def page_cuts_of(f: BinaryIO, size: int, params: ChunkParams = DEFAULT_PARAMS) -> list[int] | None:
    """`page_cuts` for an open binary file (it must have a file descriptor) of `size` bytes.
    Reads the footer with `f` (moves its position) and the page headers with pread."""
    geometry = page_geometry(f, size, params)
    return None if geometry is None else geometry[0]


def page_geometry(f: BinaryIO, size: int,
                  params: ChunkParams = DEFAULT_PARAMS) -> tuple[list[int], list[int]] | None:
    """(`page_cuts`, the start of every column chunk in file order) of an open binary file, or
    None if it is not Parquet that walks cleanly. A push resets its compression probe at each
    column chunk (`pack.FileProbe`): columns compress differently."""
    layout = footer_layout(f, size)
    try:
        fd = f.fileno()
    except (OSError, AttributeError):  # not a file of the OS (io.BytesIO): no pread
        return None
    if layout is None:
        return None
    ranges, hard = layout
    ranges = sorted(ranges)
    if any(a < b for (_, b), (a, _) in zip(ranges, ranges[1:])):
        return None  # column chunks that overlap: not a layout to trust
    flat = b"".join(struct.pack("<QQ", a, b) for a, b in ranges)
    cuts = _gear.page_groups(fd, size, flat, b"".join(struct.pack("<Q", c) for c in hard),
                             params.min_size, params.avg_size, params.max_size)
    if cuts is None:
        return None
    return thin_cuts(cuts, size) + [size], [a for a, _ in ranges]


def leading_groups(fd: int, size: int, starts: list[int], pages_end: int,
                   params: ChunkParams = DEFAULT_PARAMS) -> list[int] | None:
    """Page groups of a Parquet file's first bytes, pages tiling [4, pages_end) and no footer
    yet (a file still arriving: `engine.prechunk`): chosen as for column chunks that start at
    `starts` (sorted, the first 4; the last ends at `pages_end`), where the whole file's footer
    would say where they are. None when the native walk does not trust the pages."""
    bounds = [s for s in starts if s < pages_end] + [pages_end]
    ranges = b"".join(struct.pack("<QQ", a, b) for a, b in zip(bounds, bounds[1:]))
    return _gear.page_groups(fd, size, ranges, struct.pack("<Q", 4), params.min_size, params.avg_size,
                             params.max_size)


def footer_layout(f: BinaryIO, size: int) -> tuple[list[tuple[int, int]], list[int]] | None:
    """(column chunk ranges, hard cut points) from the footer of an open binary file, or None
    if it is not Parquet. Hard cut points: 4 (after the magic), the footer region's start,
    and the ends of large page indexes (revision 2)."""
    try:
        f.seek(0)
        if size < 12 or f.read(4) != MAGIC:  # cheap test first: most files are not Parquet
            return None
        f.seek(size - 8)
        tail = f.read(8)
        footer_len = struct.unpack("<I", tail[:4])[0]
        footer_start = size - 8 - footer_len
        if tail[4:] != MAGIC or footer_start < 4:
            return None
        f.seek(footer_start)
        ranges, indexes = footer_ranges(f.read(footer_len))
        if not all(4 <= start <= end <= footer_start for start, end in ranges):
            return None
        hard = sorted({4, footer_start} | _index_cuts(indexes, ranges, footer_start))
        return ranges, hard
    except (OSError, ThriftError, struct.error, RecursionError):
        return None


def page_starts(path: str) -> list[int] | None:
    """Revisions 1-3 of the forced cut points (every page start, column chunk end, footer
    start), walked in Python: the reference the native walk is tested against."""
    try:
        with open(path, "rb") as f:
            return page_starts_of(f, os.fstat(f.fileno()).st_size)
    except OSError:
        return None


def page_starts_of(f: BinaryIO, size: int) -> list[int] | None:
    """`page_starts` for an open binary file of `size` bytes (moves its position)."""
    layout = footer_layout(f, size)
    if layout is None:
        return None
    ranges, hard = layout
    cuts = set(hard)
    try:
        for start, end in ranges:
            cuts.add(end)
            pos = start
            while pos < end:
                cuts.add(pos)
                pos += _page_length(f, pos, end)
            if pos != end:
                return None  # pages do not tile the column chunk: do not trust the walk
    except (OSError, ThriftError, struct.error, RecursionError):
        return None
    return thin_cuts(sorted(c for c in cuts if 0 < c < size), size)


def thin_cuts(cuts: list[int], size: int) -> list[int]:
    """`cuts` (sorted) as they are when at most size // MIN_CUT_SPACING + CUT_ALLOWANCE, else only
    the cuts at least MIN_CUT_SPACING bytes after the last one kept (from offset 0): then no
    segment but the last is shorter than MIN_CUT_SPACING (pure)."""
    if len(cuts) <= size // MIN_CUT_SPACING + CUT_ALLOWANCE:
        return cuts
    kept, last = [], 0
    for c in cuts:
        if c - last >= MIN_CUT_SPACING:
            kept.append(c)
            last = c
    return kept


def _index_cuts(indexes: list[tuple[int, int]], ranges: list[tuple[int, int]], footer_start: int) -> set[int]:
    """Start and end of each large page index that lies after the last column chunk and before
    the footer; none at all if any does not (an index the footer misplaces is ignored, never
    trusted)."""
    lowest = max((end for _, end in ranges), default=4)
    if not all(lowest <= a < b <= footer_start for a, b in indexes):
        return set()
    return {c for a, b in indexes for c in (a, b)}


def _page_length(f: BinaryIO, pos: int, end: int) -> int:
    probe = _HEADER_PROBE
    while True:
        f.seek(pos)
        head = f.read(min(probe, end - pos))
        try:
            hlen, _, body = read_page_header(head)
            return hlen + body
        except ThriftError as e:
            if str(e) != "truncated" or probe >= end - pos or probe >= (64 << 20):
                raise
            probe *= 16

"""Parquet as a first-class citizen: page-aligned cut points for the chunker.

`page_cuts` reads a Parquet file's footer (pyarrow), walks the page headers of
every column chunk (Thrift compact protocol; only the fields we need are read,
the rest skipped), and returns the offsets where a chunk must end: every page
start, every column chunk end and the start of the footer region. Files written
with Arrow's content-defined chunking then dedup at page granularity; pages larger
than the maximum chunk size are sub-chunked by the byte chunker (hash reset at the
page start). Anything that is not a readable Parquet file yields None, and the
caller falls back to plain byte CDC.
"""
from __future__ import annotations

import os
import struct
from typing import BinaryIO

MAGIC = b"PAR1"

# Thrift compact protocol type ids
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
_MAX_DEPTH = 32


class ThriftError(ValueError):
    pass


class _Reader:
    """Just enough of the Thrift compact protocol to read a PageHeader."""

    def __init__(self, buf: bytes, pos: int = 0):
        self.buf = buf
        self.pos = pos

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise ThriftError("truncated")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise ThriftError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, ttype: int, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise ThriftError("nesting too deep")
        if ttype in (_TRUE, _FALSE):
            return
        if ttype == _BYTE:
            self.pos += 1
        elif ttype in (_I16, _I32, _I64):
            self.varint()
        elif ttype == _DOUBLE:
            self.pos += 8
        elif ttype == _BINARY:
            n = self.varint()  # not `self.pos += self.varint()`: that reads pos before the varint moves it
            self.pos += n
        elif ttype in (_LIST, _SET):
            head = self.byte()
            size, etype = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                if etype in (_TRUE, _FALSE):
                    self.pos += 1  # list booleans take one byte each
                else:
                    self.skip(etype, depth + 1)
        elif ttype == _MAP:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.skip(kv >> 4, depth + 1)
                    self.skip(kv & 0x0F, depth + 1)
        elif ttype == _STRUCT:
            self.struct_fields(depth + 1, want=())
        else:
            raise ThriftError(f"unknown type {ttype}")
        if self.pos > len(self.buf):
            raise ThriftError("truncated")

    def struct_fields(self, depth: int, want: tuple[int, ...]) -> dict[int, int]:
        """Read a struct, returning the integer fields whose ids are in `want`."""
        out: dict[int, int] = {}
        last = 0
        while True:
            head = self.byte()
            ttype = head & 0x0F
            if ttype == _STOP:
                return out
            delta = head >> 4
            fid = last + delta if delta else self.zigzag()
            last = fid
            if fid in want and ttype in (_I16, _I32, _I64):
                out[fid] = self.zigzag()
            else:
                self.skip(ttype, depth)


def read_page_header(buf: bytes, pos: int) -> tuple[int, int, int]:
    """(header length, page type, compressed page size) of the PageHeader at `pos`."""
    r = _Reader(buf, pos)
    fields = r.struct_fields(0, want=(1, 3))
    if 1 not in fields or 3 not in fields or fields[3] < 0:
        raise ThriftError("page header lacks type or size")
    return r.pos - pos, fields[1], fields[3]


def _column_chunk_ranges(f: BinaryIO) -> list[tuple[int, int]] | None:
    import pyarrow.parquet as pq

    try:
        md = pq.ParquetFile(f).metadata
    except Exception:  # not Parquet, or damaged: the caller falls back to byte CDC
        return None
    ranges = []
    for rg in range(md.num_row_groups):
        row_group = md.row_group(rg)
        for c in range(row_group.num_columns):
            col = row_group.column(c)
            start = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset:
                start = min(start, col.dictionary_page_offset)
            ranges.append((start, start + col.total_compressed_size))
    return sorted(ranges)


def page_cuts(path: str, max_header: int = 1 << 20) -> list[int] | None:
    """Offsets where page-aligned chunking must cut, or None if `path` is not
    readable Parquet (then use plain byte CDC)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size < 12 or f.read(4) != MAGIC:  # cheap test first: most files are not Parquet
                return None
            f.seek(size - 4)
            if f.read(4) != MAGIC:
                return None
            f.seek(size - 8)
            footer_len = struct.unpack("<I", f.read(4))[0]
            footer_start = size - 8 - footer_len
            ranges = _column_chunk_ranges(f)
            if ranges is None or footer_start < 4:
                return None
            cuts = {4, footer_start}
            for start, end in ranges:
                if not 4 <= start <= end <= footer_start:
                    return None
                cuts.add(end)
                pos = start
                while pos < end:
                    cuts.add(pos)
                    f.seek(pos)
                    head = f.read(min(max_header, end - pos))
                    hlen, _, body = read_page_header(head, 0)
                    pos += hlen + body
                if pos != end:
                    return None  # pages do not tile the column chunk: do not trust the walk
            return sorted(c for c in cuts if 0 < c < size)
    except (OSError, ThriftError, struct.error):
        return None

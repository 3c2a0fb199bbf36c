"""A small decoder of the Thrift compact protocol (pure logic), enough for Parquet
footers and page headers. Structs decode to {field id: value}; lists and sets to
lists; binary to bytes; integers are zigzag-decoded; bools to True/False."""
from __future__ import annotations

import struct
from typing import Any

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
MAX_DEPTH = 32
MAX_ITEMS = 10_000_000


class ThriftError(ValueError):
    pass


class Decoder:
    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0):
        self.buf = buf
        self.pos = pos

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise ThriftError("truncated")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ThriftError("truncated")
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

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

    def value(self, ttype: int, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ThriftError("nesting too deep")
        if ttype == TRUE:
            return True
        if ttype == FALSE:
            return False
        if ttype == BYTE:
            return self.byte()
        if ttype in (I16, I32, I64):
            return self.zigzag()
        if ttype == DOUBLE:
            return struct.unpack("<d", self.take(8))[0]
        if ttype == BINARY:
            return self.take(self.varint())
        if ttype in (LIST, SET):
            head = self.byte()
            size, etype = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if size > MAX_ITEMS:
                raise ThriftError("list too long")
            if etype in (TRUE, FALSE):  # booleans in lists take a byte each
                return [self.byte() == TRUE for _ in range(size)]
            return [self.value(etype, depth + 1) for _ in range(size)]
        if ttype == MAP:
            size = self.varint()
            if size > MAX_ITEMS:
                raise ThriftError("map too long")
            if not size:
                return {}
            kv = self.byte()
            if kv >> 4 in (LIST, SET, MAP, STRUCT):  # Parquet has no such keys; Python could not hash them
                raise ThriftError("map with container keys")
            return {self.value(kv >> 4, depth + 1): self.value(kv & 0x0F, depth + 1) for _ in range(size)}
        if ttype == STRUCT:
            return self.struct(depth + 1)
        raise ThriftError(f"unknown type {ttype}")

    def struct(self, depth: int = 0) -> dict[int, Any]:
        out: dict[int, Any] = {}
        last = 0
        while True:
            head = self.byte()
            ttype = head & 0x0F
            if ttype == STOP:
                return out
            delta = head >> 4
            fid = last + delta if delta else self.zigzag()
            last = fid
            out[fid] = self.value(ttype, depth)

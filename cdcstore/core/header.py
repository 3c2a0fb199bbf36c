"""The fixed header a binary object of ours opens with: magic bytes, a u32 version, then fields
(pure logic). One check for each format, so a damaged or foreign object is named the same way."""
from __future__ import annotations

import struct
from typing import Any

from .errors import CorruptionError


def unpack(data: bytes | memoryview, header: struct.Struct, magic: bytes, version: int, kind: str,
           what: str) -> tuple[Any, ...]:
    """The header's fields after the magic and the version; CorruptionError naming `what` if
    `data` is too short, is not a `kind` or has another version."""
    if len(data) < header.size:
        raise CorruptionError(f"{what} is truncated")
    found, got, *fields = header.unpack_from(data)
    if found != magic:
        raise CorruptionError(f"{what} is not a cdcstore {kind}")
    if got != version:
        raise CorruptionError(f"{what} has {kind} format {got}; this cdcstore reads {version}")
    return tuple(fields)

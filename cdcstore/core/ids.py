"""Content ids: xxh3-128 digests, 16 raw bytes, written as 32 lowercase hex digits.

Chunk ids hash the raw chunk; packs, manifests and commits are named by the
xxh3-128 of their own bytes so that each verifies against its name. xxh3 detects
corruption but is not collision-resistant against an adversary (see
docs/architecture.md, "Trust model").
"""
from __future__ import annotations

import xxhash

ID_BYTES = 16
HEX_LEN = 2 * ID_BYTES


def digest(data) -> bytes:
    """The 16-byte xxh3-128 digest of `data`."""
    return xxhash.xxh3_128_digest(data)


def hexdigest(data) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def hasher():
    """An incremental xxh3-128 hasher (`update`, `digest`, `hexdigest`)."""
    return xxhash.xxh3_128()


def is_hex_id(text: str) -> bool:
    return len(text) == HEX_LEN and all(c in "0123456789abcdef" for c in text)

"""Content ids. New objects are named by BLAKE3-256 (32 raw bytes, 64 hex digits);
format-v1 data is named by xxh3-128 (16 raw bytes, 32 hex digits) and stays readable.

The length of an id or name says which hash made it (`matches`, `hash_for`): that is
the one place that decides how a stored object is checked against its name. Chunk
ids hash the raw chunk; packs, manifests and commits (and any other content-named
object) are named by the hash of their own bytes. BLAKE3 is collision-resistant, so
a name is a commitment to the bytes even against an adversary (docs/architecture.md,
"Trust model"); xxh3 only detects accidents, so the server takes no new xxh3 ids.

`digest`, `hexdigest` and `hasher` always give the NEW (BLAKE3) name of new data.
`checksum`, `weak_hexdigest` and `weak_hasher` are xxh3 for the things nothing
trusts: a pack entry's corruption checksum, object version tokens, cache scopes,
check sampling and a manifest's whole-file hash.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

import blake3
import xxhash

if TYPE_CHECKING:
    from typing_extensions import Buffer

ID_BYTES = 32  # BLAKE3-256: format v2 chunk ids and object names
HEX_LEN = 2 * ID_BYTES
LEGACY_ID_BYTES = 16  # xxh3-128: format v1 (still read, no longer written)
LEGACY_HEX_LEN = 2 * LEGACY_ID_BYTES
_HEX = frozenset("0123456789abcdef")


class Hasher(Protocol):
    """An incremental hasher of either kind (BLAKE3 or xxh3-128)."""

    def update(self, data: Buffer, /) -> object: ...

    def digest(self) -> bytes: ...

    def hexdigest(self) -> str: ...


def digest(data: Buffer) -> bytes:
    """The 32-byte BLAKE3-256 digest of `data` (a new chunk id)."""
    return blake3.blake3(data).digest()


def hexdigest(data: Buffer) -> str:
    """The name of new content: BLAKE3-256 as 64 hex digits."""
    return blake3.blake3(data).hexdigest()


def hasher() -> blake3.blake3:
    """An incremental BLAKE3-256 hasher (`update`, `digest`, `hexdigest`)."""
    return blake3.blake3()


def legacy_digest(data: Buffer) -> bytes:
    """The 16-byte xxh3-128 digest: how format-v1 ids were made (reads and tests only)."""
    return xxhash.xxh3_128_digest(data)


def legacy_hexdigest(data: Buffer) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def legacy_hasher() -> xxhash.xxh3_128:
    return xxhash.xxh3_128()


def is_legacy(name_or_id: str | bytes) -> bool:
    """True for a format-v1 (xxh3-128) id or name: 16 raw bytes or 32 hex digits."""
    return len(name_or_id) == (LEGACY_HEX_LEN if isinstance(name_or_id, str) else LEGACY_ID_BYTES)


def hash_for(name_or_id: str | bytes) -> Callable[[Buffer], bytes]:
    """The digest function (data -> raw bytes) that made `name_or_id`, told by its length."""
    return legacy_digest if is_legacy(name_or_id) else digest


def hasher_for(name: str) -> Hasher:
    """An incremental hasher of the kind that made `name` (its length says which)."""
    return legacy_hasher() if is_legacy(name) else blake3.blake3()


def matches(data: Buffer, name_or_id: str | bytes) -> bool:
    """Does `data` hash to `name_or_id` (raw id bytes or hex name) under the hash its length names?"""
    if isinstance(name_or_id, str):
        return hash_for(name_or_id)(data).hex() == name_or_id
    return hash_for(name_or_id)(data) == name_or_id


def is_hex_id(text: str) -> bool:
    """A full name, new (64 hex digits) or format v1 (32): what reads accept."""
    return len(text) in (HEX_LEN, LEGACY_HEX_LEN) and _HEX.issuperset(text)


def is_new_hex_id(text: str) -> bool:
    """A BLAKE3 name (64 hex digits): what a server accepts for new objects."""
    return len(text) == HEX_LEN and _HEX.issuperset(text)


LEGACY_REFUSED = ("format-v1 (16-byte xxh3-128) ids are no longer accepted for new data: xxh3 can be "
                  "collided on purpose, so one token could shadow another's chunks. Upgrade the client "
                  "(cdcstore writes 32-byte BLAKE3 ids since format v2); old data stays readable")


def checksum(data: Buffer) -> int:
    """xxh3-64 of `data`: a pack entry's corruption check (not a name; nothing trusts it)."""
    return xxhash.xxh3_64_intdigest(data)


def weak_hexdigest(data: Buffer) -> str:
    """xxh3-128 hex: version tokens, cache scopes, sampling (fast; never a content name)."""
    return xxhash.xxh3_128_hexdigest(data)


def weak_hasher() -> xxhash.xxh3_128:
    """An incremental xxh3-128 hasher: a manifest's whole-file hash (a check, not a name)."""
    return xxhash.xxh3_128()

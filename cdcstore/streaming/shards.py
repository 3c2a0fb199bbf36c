"""WebDataset-style TAR shards: parse tar headers into a sample table (pure logic, no I/O).

A shard is a plain (ustar / GNU / pax) tar file whose members are named `KEY.EXT`; the members that
share a KEY form one sample `{"__key__": KEY, EXT: bytes, ...}` (the key is the name up to the first
dot of its last path component, the extension the rest, as WebDataset does). `scan` walks the headers
through a `read(offset, length)` callable handed in by the caller, reading windows of `window` bytes
so that the headers of small members come a window at a time; a member larger than the window costs
one read of `window` bytes at its header, so scanning reads at most
`headers x window` bytes (and never more than the file).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core import tar
from ..core.errors import InvalidAddressError

REGULAR = tar.REGULAR
SKIPPED = tar.NO_DATA + (b"V", b"D", b"M", b"N", b"S")  # links, dirs, volume labels, GNU extras
WINDOW = 256 * 1024


class ShardError(InvalidAddressError):
    """A TAR shard that cannot be indexed (damaged, truncated, or not a WebDataset shard)."""


@dataclass(frozen=True)
class Member:
    name: str
    offset: int  # of its data
    size: int


@dataclass(frozen=True)
class Sample:
    key: str
    parts: tuple[tuple[str, int, int], ...]  # (extension, data offset, size), in tar order

    @property
    def nbytes(self) -> int:
        return sum(n for _, _, n in self.parts)


def scan(read, size: int, where: str = "shard", window: int = WINDOW) -> list[Member]:
    """The regular members of a tar file of `size` bytes, in tar order (`core.tar.walk` reads the
    headers). `read(offset, length)` returns those bytes. Raises ShardError on a bad checksum, a
    truncated file, a member past the end, or a member type a shard does not hold."""
    members: list[Member] = []
    try:
        for m in tar.walk(read, size, where, window):
            if m.kind in REGULAR:
                members.append(Member(m.name, m.data, m.size))
            elif m.kind not in SKIPPED:
                raise ShardError(f"{where}: header at offset {m.header}: unknown member type {m.kind!r}: "
                                 f"write shards as plain tar files")
    except tar.TarError as e:
        raise ShardError(str(e)) from None
    return members


def split_name(name: str, where: str) -> tuple[str, str]:
    """(key, extension) of a member name: the extension starts at the first dot of the last path
    component (`a/b.seg.jpg` -> `a/b`, `seg.jpg`)."""
    head, _, last = name.rpartition("/")
    stem, dot, ext = last.partition(".")
    if not dot or not stem or not ext:
        raise ShardError(f"{where}: member {name!r} has no KEY.EXT name: name every member of a "
                         f"WebDataset shard KEY.EXT (e.g. 000123.jpg)")
    return (head + "/" + stem if head else stem), ext


def samples(members: list[Member], where: str = "shard") -> list[Sample]:
    """Members grouped by key, in order of each key's first member. Members of one key need not be
    adjacent; one key with one extension twice is an error."""
    parts: dict[str, list[tuple[str, int, int]]] = {}
    for m in members:
        key, ext = split_name(m.name, where)
        got = parts.setdefault(key, [])
        if any(e == ext for e, _, _ in got):
            raise ShardError(f"{where}: key {key!r} has two {ext!r} members: each sample holds one "
                             f"member per extension")
        got.append((ext, m.offset, m.size))
    return [Sample(k, tuple(p)) for k, p in parts.items()]


def coalesce(ranges: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Sorted (start, end) ranges merged where they overlap or lie at most `gap` bytes apart."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def is_tar(path: str) -> bool:
    return path.endswith(".tar")


def is_compressed_tar(path: str) -> bool:
    return path.endswith((".tar.gz", ".tgz", ".tar.zst", ".tar.bz2", ".tar.xz"))

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

from ..core.errors import InvalidAddressError

BLOCK = 512
REGULAR = (b"0", b"\0", b"7")
SKIPPED = (b"1", b"2", b"3", b"4", b"5", b"6", b"g", b"K", b"V", b"D", b"M", b"N", b"S")  # links, dirs, ...
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


def _number(field: bytes, what: str, where: str) -> int:
    """An octal header number, or GNU base-256 (high bit of the first byte set)."""
    if field[:1] and field[0] & 0x80:
        if field[0] != 0x80:
            raise ShardError(f"{where}: negative or unsupported base-256 {what}: the tar is damaged")
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" \0")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ShardError(f"{where}: {what} field {field!r} is not a number: the tar is damaged") from None


def _checksum_ok(h: bytes) -> bool:
    stored = h[148:156]
    text = stored.split(b"\0", 1)[0].strip(b" \0")
    try:
        want = int(text, 8)
    except ValueError:
        return False
    unsigned = sum(h[:148]) + 8 * 32 + sum(h[156:])
    signed = sum(b - 256 if b > 127 else b for b in h[:148] + h[156:]) + 8 * 32
    return want in (unsigned, signed)


def _name(h: bytes) -> str:
    name = h[0:100].split(b"\0", 1)[0]
    if h[257:262] == b"ustar":
        prefix = h[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _pax_path(data: bytes, where: str) -> str | None:
    """The `path` record of a pax extended header, if any."""
    path, i = None, 0
    while i < len(data):
        sp = data.find(b" ", i)
        if sp < 0 or not data[i:sp].isdigit():
            break
        n = int(data[i:sp])
        if n <= 0:
            raise ShardError(f"{where}: bad pax record length: the tar is damaged")
        key, _, value = data[sp + 1:i + n - 1].partition(b"=")
        if key == b"path":
            path = value.decode("utf-8", "surrogateescape")
        i += n
    return path


def scan(read, size: int, where: str = "shard", window: int = WINDOW) -> list[Member]:
    """The regular members of a tar file of `size` bytes, in tar order. `read(offset, length)` returns
    those bytes. Raises ShardError on a bad checksum, a truncated file or a member past the end."""
    members: list[Member] = []
    buf, base = b"", 0
    off = 0
    long_name: str | None = None
    while off < size:
        if off + BLOCK > size:
            raise ShardError(f"{where}: truncated inside the header at offset {off}: the tar is damaged "
                             f"(re-create the shard)")
        if not (base <= off and off + BLOCK <= base + len(buf)):
            base, buf = off, read(off, min(max(window, BLOCK), size - off))
        h = buf[off - base:off - base + BLOCK]
        if h == bytes(BLOCK):
            break  # end of archive
        at = f"{where}: header at offset {off}"
        if not _checksum_ok(h):
            raise ShardError(f"{at} has a bad checksum: not a tar file, or damaged (re-create the shard)")
        n = _number(h[124:136], "size", at)
        kind = h[156:157]
        data = off + BLOCK
        if data + n > size:
            raise ShardError(f"{at} declares {n} bytes but the file ends at {size}: the tar is truncated "
                             f"or damaged (re-create the shard)")
        nxt = data + -(-n // BLOCK) * BLOCK
        if kind in (b"L", b"x"):
            if n > 1 << 20:
                raise ShardError(f"{at}: a {n}-byte long-name record: the tar is damaged")
            raw = read(data, n)
            long_name = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape") if kind == b"L" \
                else (_pax_path(raw, at) or long_name)
        elif kind in REGULAR:
            members.append(Member(long_name or _name(h), data, n))
            long_name = None
        elif kind in SKIPPED:
            long_name = None
        else:
            raise ShardError(f"{at}: unknown member type {kind!r}: write shards as plain tar files")
        off = nxt
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

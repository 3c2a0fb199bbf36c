"""TAR geometry: the members of a tar file, and where its chunks end (docs/format.md, TAR members).

`walk` reads the headers of a plain tar file (ustar, GNU or pax; not compressed) through a
`read(offset, length)` callable and yields its members: where each one's headers start (pax and
GNU long-name records included, which belong to the member they precede), where its data starts,
and how long it is (a pax `size` record overrides the header's field). It trusts nothing: every
header's checksum is checked, sizes are checked against the file before anything is read or
allocated for them, and an extended record is read only up to `MAX_RECORD` bytes. Any header it
cannot trust raises `TarError`, naming the offset.

`member_cuts` (revision 5 of the forced cut points, chunk format v3) turns the members into cut
points: the start and end of every data region of at least `min` bytes, so that a member's bytes
are chunked by themselves, whatever the headers around them say (a writer that stamps the current
time into every header, as WebDataset's does by default, then changes only the header chunks).
A file that is not a tar file, or one `walk` refuses, gets None: plain byte CDC.

Pure logic: I/O is the caller's `read`. `streaming/shards.py` builds WebDataset samples on `walk`.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from . import _gear
from .chunker import DEFAULT_PARAMS, ChunkParams
from .pages import thin_cuts

BLOCK = 512
#: Types whose data follows the header (`walk` yields them with their size). Links, devices,
#: directories and fifos carry no data whatever their size field says (as Python's tarfile and
#: GNU tar read them); every other type, unknown ones included, is followed by `size` bytes.
NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")
REGULAR = (b"0", b"\0", b"7")
#: Records that describe the next member (pax extended header, GNU long name and long link
#: target) or all later ones (pax global header): their bytes belong to a header region.
RECORDS = (b"x", b"g", b"L", b"K")
#: The longest pax or GNU record read; a longer one makes the file untrusted (a hostile size
#: must not make a reader allocate; real records are a few hundred bytes).
MAX_RECORD = 1 << 20
WINDOW = 64 * 1024  # bytes read at a header that is not in the last window read

Read = Callable[[int, int], bytes]


class TarError(ValueError):
    """A tar header that cannot be trusted (bad checksum, a size past the file, garbage)."""


@dataclass(frozen=True)
class Member:
    header: int  # offset of its first header block (pax and GNU records before it included)
    data: int  # offset of its data
    size: int  # bytes of data (0 for links, directories, devices)
    kind: bytes  # the type flag, one byte
    name: str  # pax `path`, else GNU long name, else the ustar prefix and name

    @property
    def end(self) -> int:
        """Where its data ends with its padding to the next 512-byte block."""
        return self.data + -(-self.size // BLOCK) * BLOCK


def is_tar_header(block: bytes | bytearray | memoryview) -> bool:
    """Whether 512 bytes are a ustar or GNU header with a valid checksum (the test a file's
    first block must pass to be walked as a tar file at all)."""
    h = bytes(block[:BLOCK])
    return len(h) == BLOCK and h[257:262] == b"ustar" and checksum_ok(h)


def checksum_ok(h: bytes) -> bool:
    """The header's checksum field matches its bytes (unsigned or, as old tars wrote it, signed)."""
    text = h[148:156].split(b"\0", 1)[0].strip(b" \0")
    if not text or any(c not in b"01234567" for c in text):
        return False
    want = int(text, 8)
    unsigned = sum(h[:148]) + 8 * 32 + sum(h[156:])
    if want == unsigned:
        return True
    return want == unsigned - 256 * sum(1 for b in h[:148] + h[156:] if b > 127)


def number(field: bytes, what: str, where: str) -> int:
    """An octal header number, or a positive GNU base-256 one (first byte 0x80)."""
    if field[:1] and field[0] & 0x80:
        if field[0] != 0x80:
            raise TarError(f"{where}: negative or unsupported base-256 {what}: the tar is damaged")
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" \0")
    if any(c not in b"01234567" for c in text):
        raise TarError(f"{where}: {what} field {field!r} is not a number: the tar is damaged")
    return int(text, 8) if text else 0


def header_name(h: bytes) -> str:
    """The ustar name, with its prefix field (as Python's tarfile reads it; not for GNU records)."""
    name = h[0:100].split(b"\0", 1)[0]
    if h[257:262] == b"ustar" and h[156:157] != b"S":  # (GNU sparse headers use the prefix's bytes)
        prefix = h[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def pax_records(data: bytes, where: str) -> dict[bytes, bytes]:
    """The `LENGTH KEY=VALUE\\n` records of a pax extended header."""
    out: dict[bytes, bytes] = {}
    i = 0
    while i < len(data) and data[i] != 0:
        sp = data.find(b" ", i, i + 21)
        if sp < 0 or not data[i:sp].isdigit():
            raise TarError(f"{where}: a pax record without a length: the tar is damaged")
        n = int(data[i:sp])
        if n <= sp - i + 1 or i + n > len(data) or data[i + n - 1] != 0x0A:
            raise TarError(f"{where}: bad pax record length: the tar is damaged")
        key, eq, value = data[sp + 1:i + n - 1].partition(b"=")
        if not eq:
            raise TarError(f"{where}: a pax record without '=': the tar is damaged")
        out[key] = value
        i += n
    return out


class _Window:
    """`read` through one window: headers of small members come a window at a time."""

    def __init__(self, read: Read, size: int, window: int):
        self._read, self._size, self._window = read, size, max(window, BLOCK)
        self._base, self._buf = 0, b""

    def block(self, off: int) -> bytes:
        if not (self._base <= off and off + BLOCK <= self._base + len(self._buf)):
            self._base, self._buf = off, bytes(self._read(off, min(self._window, self._size - off)))
        at = off - self._base
        return self._buf[at:at + BLOCK]

    def record(self, off: int, n: int) -> bytes:
        if self._base <= off and off + n <= self._base + len(self._buf):
            return self._buf[off - self._base:off - self._base + n]
        data = bytes(self._read(off, n))
        if len(data) != n:
            raise TarError(f"a record at offset {off} reads short: the file changed or is damaged")
        return data


def walk(read: Read, size: int, where: str = "tar", window: int = WINDOW) -> Iterator[Member]:
    """The members of a tar file of `size` bytes, in order, up to its end-of-archive block (or the
    end of the file, met exactly at a header's start). `read(offset, length)` returns those bytes
    (fewer only at the end of the file). Raises TarError on anything it cannot trust."""
    win = _Window(read, size, window)
    off = 0
    first: int | None = None  # where the records of the next member began
    pax: dict[bytes, bytes] = {}
    glob: dict[bytes, bytes] = {}
    long_name: str | None = None
    while off < size:
        if off + BLOCK > size:
            raise TarError(f"{where}: truncated inside the header at offset {off}: the tar is damaged "
                           f"(re-create it)")
        h = win.block(off)
        if len(h) != BLOCK:
            raise TarError(f"{where}: the header at offset {off} reads short: the file changed or is damaged")
        if h == bytes(BLOCK):
            return  # end of archive
        at = f"{where}: header at offset {off}"
        if not checksum_ok(h):
            raise TarError(f"{at} has a bad checksum: not a tar file, or damaged (re-create it)")
        kind = h[156:157]
        n = number(h[124:136], "size", at)
        if kind not in RECORDS:
            pax_size = pax.get(b"size", glob.get(b"size"))
            if pax_size is not None:
                if not pax_size.isdigit():
                    raise TarError(f"{at}: pax size {pax_size[:32]!r} is not a number: the tar is damaged")
                n = int(pax_size)
        if kind in NO_DATA:
            n = 0
        data = off + BLOCK
        if data + n > size:
            raise TarError(f"{at} declares {n} bytes but the file ends at {size}: the tar is truncated "
                           f"or damaged (re-create it)")
        if first is None:
            first = off
        if kind in RECORDS:
            if n > MAX_RECORD:
                raise TarError(f"{at}: a {n}-byte {kind.decode('latin-1')} record: the tar is damaged")
            raw = win.record(data, n)
            if kind == b"x":
                pax = pax_records(raw, at)
            elif kind == b"g":
                glob.update(pax_records(raw, at))
            elif kind == b"L":
                long_name = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if kind == b"g":
                first = None  # a global header describes no one member: its region stands alone
        else:
            path = pax.get(b"path")
            name = path.decode("utf-8", "surrogateescape") if path is not None else long_name or header_name(h)
            yield Member(first, data, n, kind, name)
            first, pax, long_name = None, {}, None
        off = data + -(-n // BLOCK) * BLOCK


def member_cuts(read: Read, size: int, params: ChunkParams = DEFAULT_PARAMS) -> list[int] | None:
    """Offsets where the chunks of a tar file of `size` bytes end (revision 5: TAR members; the last
    is `size`), or None if it is not a tar file `walk` trusts (then: byte CDC). Cut points: the start
    and end of every member's data region (its data and padding) of at least `params.min_size`
    bytes; each segment between them is one chunk up to `max_size`, else cut by the byte rule.
    The reference, over any `read`; a push uses `member_cuts_of` (native, the same cuts)."""
    if size < BLOCK or not is_tar_header(read(0, BLOCK)):
        return None
    cuts: list[int] = []
    try:
        for m in walk(read, size):
            if m.end - m.data >= params.min_size:
                if not cuts or cuts[-1] != m.data:
                    cuts.append(m.data)
                cuts.append(m.end)
    except (TarError, OSError):
        return None
    return _finish(cuts, size)


def member_cuts_of(fd: int, size: int, params: ChunkParams = DEFAULT_PARAMS) -> list[int] | None:
    """`member_cuts` of the file open as `fd` (`size` bytes), walked natively (`_gear.tar_cuts`,
    the GIL released): a tar of a million small members costs no Python per member."""
    try:
        if size < BLOCK or not is_tar_header(os.pread(fd, BLOCK, 0)):
            return None
        cuts = _gear.tar_cuts(fd, size, params.min_size)
    except OSError:
        return None
    return None if cuts is None else _finish(cuts, size)


def _finish(cuts: list[int], size: int) -> list[int]:
    return thin_cuts([c for c in cuts if 0 < c < size], size) + [size]

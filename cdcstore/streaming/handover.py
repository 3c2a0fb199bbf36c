"""Finished batches from `Loader`'s DataLoader workers to the main process through shared memory.

A worker writes the arrays of a bundle of batches (`dataset.Bundle`) into one file of this
process tree's folder (under /dev/shm when it has room) with one `writev`: numeric numpy columns
as their bytes, Arrow string and binary columns (and fixed-width Arrow arrays, dictionaries of
them, RecordBatches of them) as their validity, offsets and data buffers, each at a 64-byte
boundary. Through torch's queue goes only a descriptor (`Shipped`: names, dtypes, shapes,
offsets; anything else, such as object arrays of `str`, rides in it pickled as before). Unpickling
the descriptor in the main process opens the file, unlinks it at once, maps it copy-on-write and
wraps the arrays (`ndarray.view`, `pa.Array.from_buffers`): no copy, and the mapping lives as
long as any array viewing it (`_Region`). Nothing is left in the folder:

- a bundle the main process receives, even one torch drops (a persistent worker's batches of an
  iteration that broke off), is unlinked when it is unpickled;
- a loop that ends or breaks off, or a worker that dies, stops the workers, then removes the
  files of that iteration that never crossed (`sweep`);
- the folder itself goes when its process exits, and when it is SIGKILLed (a reaper waits for its
  pid, `decoded._reap_when_gone`); a folder whose owner is gone is removed by the next one made.

A worker that cannot write (the folder full) hands the bundle over by value, as before.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import math
import mmap
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa

from .. import runtime
from . import decoded as _decoded

PREFIX = "cdcstore-handover-"
ALIGN = 64  # each buffer starts at a multiple of this in its file
HOLD = 4  # files a worker keeps open after handing them over (`Handover.shipped`)
_ZEROS = bytes(ALIGN)
_IOV_MAX = 1024
_NUMERIC = frozenset("biufcmM")  # numpy kinds that go as bytes (bool, ints, floats, complex, datetimes)
stats = {"bundles": 0, "bytes": 0}  # received through files by this process (figures for tests and bench)
_seq = itertools.count()  # this process's file names
_folders: dict[int, str] = {}  # pid -> this process's folder


def folder() -> str:
    """This process's folder of hand-over files, made (with its reaper) on first use."""
    pid = os.getpid()
    path = _folders.get(pid)
    if path is None:
        from multiprocessing import util

        root = _decoded._root()
        _sweep_stale(root)
        path = _folders[pid] = tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-", dir=root)
        _decoded._reap_when_gone(pid, path)
        # at exit after multiprocessing has stopped daemonic DataLoader workers (exitpriority < 0)
        util.Finalize(None, _decoded._remove_if_owner, args=(path, pid), exitpriority=-1)
    return path


def _sweep_stale(root: str) -> None:
    """Remove the folders of processes that are gone."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if entry.name.startswith(PREFIX):
                pid = entry.name[len(PREFIX):].split("-", 1)[0]
                if pid.isdigit() and not runtime.pid_alive(int(pid)):
                    shutil.rmtree(entry.path, ignore_errors=True)


def sweep(path: str, tag: str) -> int:
    """Remove the files of iteration `tag` left in `path` (its workers have stopped); how many."""
    n = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(path):
            if entry.name.startswith(tag + "-"):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    n += 1
    return n


class Handover:
    """Where one `Loader`'s workers write: the folder and the tag of the current iteration
    (pickled to the workers with the dataset)."""

    def __init__(self, serial: int):
        self.serial, self.loops = serial, 0
        self.path = ""
        self.tag = ""

    def begin(self) -> str:
        """A new iteration (in the main process, before its workers start): its tag."""
        self.path = self.path or folder()
        self.loops += 1
        self.tag = f"{self.serial}.{self.loops}"
        return self.tag

    def shipped(self, bundles):
        """Each bundle as a `Shipped` descriptor of a file written here (by value when it has no
        array to share or the file cannot be written). The worker keeps its last HOLD files open:
        the process that drops a file's last reference frees its pages (~0.8 ms for 3 MB), and
        the main process has usually unmapped a bundle by the time its worker closes it."""
        held: collections.deque[int] = collections.deque()
        try:
            for b in bundles:
                item, fd = ship(b, self.path, f"{self.tag}-{os.getpid()}-{next(_seq)}")
                if fd is not None:
                    held.append(fd)
                    if len(held) > HOLD:
                        os.close(held.popleft())
                yield item
        finally:
            for fd in held:
                os.close(fd)


class Shipped:
    """A bundle whose arrays are in a file: pickles as the descriptor; unpickled, it is the bundle
    (`_receive`)."""
    __slots__ = ("cls", "worker", "last", "path", "size", "batches")

    def __init__(self, cls: type, worker: int, last: bool, path: str, size: int, batches: tuple):
        self.cls, self.worker, self.last, self.path, self.size, self.batches = cls, worker, last, path, size, batches

    def __reduce__(self):
        return _receive, (self.cls, self.worker, self.last, self.path, self.size, self.batches)


# -- the worker's side ------------------------------------------------------------------------------
class _Parts:
    """The buffers of one file (`parts`, of `sizes` bytes), each at an ALIGN boundary."""

    def __init__(self) -> None:
        self.parts: list = []
        self.sizes: list[int] = []
        self.size = 0

    def add(self, data, nbytes: int) -> int:
        pad = -self.size % ALIGN
        if pad:
            self.parts.append(_ZEROS[:pad])
            self.sizes.append(pad)
            self.size += pad
        at = self.size
        if nbytes:
            self.parts.append(data)
            self.sizes.append(nbytes)
            self.size += nbytes
        return at


def ship(bundle, path: str, name: str) -> tuple[Any, int | None]:
    """`bundle` (with `.worker`, `.batches`, `.last`) as a `Shipped` whose arrays are in the file
    `path/name`, and the file's descriptor (the caller closes it); the bundle itself and None
    when nothing goes to a file or writing fails."""
    parts = _Parts()
    descs = _encode_bundle(bundle.batches, parts)
    if not parts.size or not path:
        return bundle, None
    file = os.path.join(path, name)
    try:
        fd = os.open(file, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except OSError:
        return bundle, None
    try:
        _write_all(fd, parts)
    except OSError:  # the folder is full: by value
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(file)
        return bundle, None
    return Shipped(type(bundle), bundle.worker, bundle.last, file, parts.size, descs), fd


def _write_all(fd: int, parts: _Parts) -> None:
    for i in range(0, len(parts.parts), _IOV_MAX):
        group = parts.parts[i:i + _IOV_MAX]
        want = sum(parts.sizes[i:i + _IOV_MAX])
        got = os.writev(fd, group)
        if got < want:  # a short write: the rest of the group
            rest = memoryview(b"".join(memoryview(p).cast("B") for p in group))[got:]
            while rest:
                rest = rest[os.write(fd, rest):]


def _encode_bundle(batches: list, parts: _Parts) -> tuple:
    """Batches that are dicts with the same keys column by column (`_encode_column`: a numeric
    column's arrays back to back, wrapped once and sliced); any others one by one (`_encode`)."""
    keys = tuple(batches[0]) if batches and type(batches[0]) is dict else None
    if keys is None or any(type(b) is not dict or tuple(b) != keys for b in batches):
        return ("g", [_encode(b, parts) for b in batches])
    return ("c", keys, [_encode_column([b[k] for b in batches], parts) for k in keys])


def _encode_column(values: list, parts: _Parts) -> tuple:
    v0 = values[0]
    if isinstance(v0, np.ndarray) and v0.dtype.kind in _NUMERIC and v0.dtype.fields is None and v0.ndim:
        dt, tail = v0.dtype, v0.shape[1:]
        if all(isinstance(v, np.ndarray) and v.dtype == dt and v.shape[1:] == tail for v in values):
            whole = np.concatenate(values) if len(values) > 1 else np.ascontiguousarray(v0)  # one part, not 16
            return ("n", parts.add(whole.reshape(-1).view(np.uint8), whole.nbytes), dt.str, tail,
                    [len(v) for v in values])
    if isinstance(v0, pa.Array):
        t = v0.type
        ow = _OFFSETS.get(t.id)
        if ow and all(isinstance(v, pa.Array) and v.type == t for v in values):
            return ("a", t, [_var_size(v, ow, parts) for v in values])
        if not pa.types.is_dictionary(t):
            entries = [_arrow(v, parts) if isinstance(v, pa.Array) and v.type == t else None for v in values]
            if all(e is not None for e in entries):
                return ("a", t, [e[2:] for e in entries if e is not None])
    return ("g", [_encode(v, parts) for v in values])


_OFFSETS = {pa.string().id: 4, pa.binary().id: 4, pa.large_string().id: 8, pa.large_binary().id: 8}


def _var_size(a: pa.Array, ow: int, parts: _Parts) -> tuple:
    """(rows, nulls, buffers) of a string or binary array of offsets `ow` bytes wide (`_arrow`)."""
    if a.offset:
        a = pa.concat_arrays([a])
    n, nulls = len(a), a.null_count
    validity, offsets, data = a.buffers()
    end = int.from_bytes(memoryview(offsets)[n * ow:(n + 1) * ow], "little", signed=True)
    return (n, nulls, [(parts.add(validity, (n + 7) >> 3), (n + 7) >> 3) if nulls else None,
                       (parts.add(offsets, (n + 1) * ow), (n + 1) * ow),
                       (parts.add(data, end), end)])  # (a data buffer even when empty: Arrow needs one)


def _encode(v: Any, parts: _Parts):
    """A batch (or a value in one) as a descriptor; its arrays' bytes added to `parts`."""
    if type(v) is dict:
        return ("m", tuple(v), [_encode(x, parts) for x in v.values()])
    if isinstance(v, np.ndarray) and v.dtype.kind in _NUMERIC and v.dtype.fields is None:
        a = np.ascontiguousarray(v)
        return ("n", parts.add(a.reshape(-1).view(np.uint8), a.nbytes), a.nbytes, a.dtype.str, a.shape)
    if isinstance(v, pa.Array):
        d = _arrow(v, parts)
        if d is not None:
            return d
    elif isinstance(v, pa.RecordBatch):
        cols = [_arrow(c, parts) for c in v.columns]
        if all(c is not None for c in cols):
            return ("b", v.schema, cols)
    return ("o", v)


def _width(t: pa.DataType) -> int | None:
    """Bits per value of a fixed-width type of two buffers (validity, values), else None."""
    if t.num_buffers != 2 or t.num_fields or isinstance(t, pa.ExtensionType):
        return None
    try:
        return t.bit_width
    except ValueError:
        return None


def _arrow(a: pa.Array, parts: _Parts):
    t = a.type
    if pa.types.is_dictionary(t):
        idx, dic = _arrow(a.indices, parts), _arrow(a.dictionary, parts)
        return None if idx is None or dic is None else ("d", t, idx, dic)
    bits = _width(t)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        ow = 4
    elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        ow = 8
    elif bits is None:
        return None
    else:
        ow = 0
    if a.offset:  # buffers of its own from row 0 (a slice's are its parent's)
        a = pa.concat_arrays([a])
    n, bufs = len(a), a.buffers()
    if any(b is None for b in bufs[1:]):
        return None
    out: list = [None]
    if a.null_count:
        out[0] = _buffer(bufs[0], (n + 7) // 8, parts)
    if ow:
        offsets = memoryview(bufs[1])
        end = int.from_bytes(offsets[n * ow:(n + 1) * ow], "little", signed=True)
        out += [_buffer(bufs[1], (n + 1) * ow, parts), _buffer(bufs[2], end, parts)]
    elif bits is not None:
        out.append(_buffer(bufs[1], (n * bits + 7) // 8, parts))
    if any(b is False for b in out):
        return None
    return ("a", t, n, a.null_count, out)


def _buffer(buf: pa.Buffer, nbytes: int, parts: _Parts):
    if nbytes > buf.size:
        return False
    return parts.add(memoryview(buf)[:nbytes], nbytes), nbytes


# -- the main process's side ------------------------------------------------------------------------
def _receive(cls: type, worker: int, last: bool, path: str, size: int, descs: tuple):
    """The bundle of a `Shipped`: its file mapped (then unlinked and closed), its arrays wrapped."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"a DataLoader worker's batches were removed before this process took them "
                                f"({path})") from None
    try:
        os.unlink(path)
        mem = _map(fd, size)
    finally:
        os.close(fd)
    stats["bundles"] += 1
    stats["bytes"] += size
    return cls(worker, _decode_bundle(descs, mem), last)


def _decode_bundle(d: tuple, mem: np.ndarray) -> list:
    if d[0] == "g":
        return [_decode(x, mem) for x in d[1]]
    _, keys, cols = d
    base = mem.ctypes.data
    columns = []
    for c in cols:
        kind = c[0]
        if kind == "n":  # one array for the bundle, a slice per batch
            _, at, dtype, tail, counts = c
            total = sum(counts)
            big = np.frombuffer(mem, dtype, total * math.prod(tail), at) if total else np.empty(0, dtype)
            if tail:
                big = big.reshape((total,) + tail)
            out, lo = [], 0
            for n in counts:
                out.append(big[lo:lo + n])
                lo += n
            columns.append(out)
        elif kind == "a":
            t = c[1]
            columns.append([pa.Array.from_buffers(t, n, [None if b is None else pa.foreign_buffer(base + b[0], b[1], mem)
                                                        for b in bufs], nulls) for n, nulls, bufs in c[2]])
        else:
            columns.append([_decode(x, mem) for x in c[1]])
    return [dict(zip(keys, row)) for row in zip(*columns)]


def _decode(d: tuple, mem: np.ndarray):
    tag = d[0]
    if tag == "m":
        return dict(zip(d[1], [_decode(x, mem) for x in d[2]]))
    if tag == "n":
        _, at, nbytes, dtype, shape = d
        return mem[at:at + nbytes].view(dtype).reshape(shape)
    if tag == "a" or tag == "d":
        return _decode_arrow(d, mem)
    if tag == "b":
        return pa.RecordBatch.from_arrays([_decode_arrow(c, mem) for c in d[2]], schema=d[1])
    return d[1]


def _decode_arrow(d: tuple, mem: np.ndarray) -> pa.Array:
    if d[0] == "d":
        return pa.DictionaryArray.from_arrays(_decode_arrow(d[2], mem), _decode_arrow(d[3], mem),
                                              ordered=d[1].ordered)
    _, t, n, nulls, bufs = d
    return pa.Array.from_buffers(t, n, [None if b is None else pa.py_buffer(mem[b[0]:b[0] + b[1]]) for b in bufs],
                                 nulls)


class _Region:
    """A private writable mapping of a file, as an array source (`np.asarray`); unmapped when the
    last array viewing it goes. (Not `mmap.mmap`: it keeps a file descriptor per mapping.)"""

    def __init__(self, addr: int, size: int):
        self.addr, self.size, self._munmap = addr, size, _libc().munmap  # (module globals may be gone at exit)
        self.__array_interface__ = {"data": (addr, False), "shape": (size,), "typestr": "|u1", "version": 3}

    def __del__(self) -> None:
        self._munmap(self.addr, self.size)


_LIBC: list = []


def _libc() -> Any:
    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _LIBC.append(libc)
    return _LIBC[0]


def _map(fd: int, size: int) -> np.ndarray:
    """The file as a writable uint8 array (copy-on-write: writes stay in this process)."""
    addr = _libc().mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        raise OSError(err, f"mapping a DataLoader worker's batches: {os.strerror(err)}")
    return np.asarray(_Region(addr, size))

"""A stored manifest read in ranges, never whole (bounded memory for a manifest of any size):
its header's facts, its first and last chunk ids, and a scan of all of them in slices that
checks the bytes against the name (what `Repository.get_manifest` checks, without decoding)."""
from __future__ import annotations

import os
import struct
from typing import Callable, Iterator, Protocol

from ..core import ids
from ..core.errors import CorruptionError
from ..core.manifest import ENTRIES, HEADER, MAGIC
from .names import manifest_name
from .objects import NotFound, ObjectStore
from .roles import BackendCapabilities

SLICE = 65536  # chunk ids a scan yields at once (~6 MB of Python objects)
FIRST_READ = 256 * 1024  # bytes of the first read: a manifest this small is read in one request


class ManifestMissing(CorruptionError):
    """No such manifest in the store."""


class ManifestSource(Protocol):
    """Where a store's manifests are (its `metadata`): a local file, or a bundle's copy."""

    def manifest_file(self, name: str) -> str | None: ...

    def bundled_manifest(self, name: str, search: bool = False) -> bytes | None: ...


class ManifestHost(Protocol):
    """What `ManifestFile` reads a manifest through (a `Repository`)."""

    @property
    def objects(self) -> ObjectStore: ...

    @property
    def location(self) -> str: ...

    @property
    def capabilities(self) -> BackendCapabilities: ...

    @property
    def metadata(self) -> ManifestSource: ...


class ManifestFile:
    """A stored manifest read in ranges, never whole: its header's facts, its first and last
    chunk ids, and a scan of all of them in slices that checks the bytes against the name.
    A small manifest (most) costs one read, as `get_manifest` does."""

    def __init__(self, store: ManifestHost, name: str):
        self.name, self.what = name, f"manifest {name}"
        path: str | None = store.metadata.manifest_file(name)
        obj: str | None = manifest_name(name)
        bundled = store.metadata.bundled_manifest(name) if store.capabilities.bundles else None
        if bundled is not None:  # small: whole, from its bundle (checked against its name there)
            path, obj = None, None

        def read(lo: int, n: int) -> bytes:
            if path is not None:
                with open(path, "rb") as f:
                    return os.pread(f.fileno(), n, lo)
            assert obj is not None  # None only for a manifest that came whole from its bundle
            return bytes(store.objects.get_range(obj, lo, n))

        first: bytes | None
        try:
            first = bundled if bundled is not None else read(0, FIRST_READ)
        except (FileNotFoundError, NotFound):
            first = store.metadata.bundled_manifest(name, search=True) if store.capabilities.bundles else None
            if first is None:
                raise ManifestMissing(f"manifest {name} is missing from {store.location}") from None
        self.head = first[:HEADER.size]
        if len(self.head) < HEADER.size or self.head[:8] != MAGIC:
            raise CorruptionError(f"{self.what} is not a cdcstore manifest: run `cdcstore check` on the server")
        _, self.version, self.count, self.size, _ = HEADER.unpack(self.head)
        entry = ENTRIES.get(self.version)
        self.bytes = HEADER.size + self.count * entry.size if entry else -1
        self.data: bytes | None = None  # the bytes, when they came whole with the first read
        if len(first) < FIRST_READ:  # all of it: kept
            self.data = first
            self.read: Callable[[int, int], bytes] = lambda lo, n: first[lo:lo + n]
            actual = len(first)
        else:
            self.read = read
            try:
                assert obj is not None  # None only for a manifest that came whole from its bundle
                actual = os.path.getsize(path) if path is not None else store.objects.stat(obj).size
            except (FileNotFoundError, NotFound):
                raise ManifestMissing(f"manifest {name} is missing from {store.location}") from None
        if entry is None or self.bytes != actual:
            raise CorruptionError(f"{self.what} is damaged (version {self.version}, {self.count} chunks, "
                                  f"{actual} bytes): run `cdcstore check` on the server")
        self.entry: struct.Struct = entry  # its version's entry layout

    def ids(self, first: int, count: int) -> list[bytes]:
        part = self.read(HEADER.size + first * self.entry.size, count * self.entry.size)
        return [bytes(e[0]) for e in self.entry.iter_unpack(part)]

    def ends(self, n: int) -> list[bytes]:
        """The ids of the first and last `n` chunks."""
        n = min(n, self.count)
        return self.ids(0, n) + self.ids(self.count - n, n)

    def scan(self, step: int = SLICE) -> Iterator[set[bytes]]:
        """The chunk ids, `step` at a time (a set per slice); CorruptionError if the bytes do
        not match the name or the lengths do not add up to the size (after the last slice)."""
        h = ids.hasher_for(self.name)
        h.update(self.head)
        total = 0
        for first in range(0, self.count, step):
            k = min(step, self.count - first)
            part = self.read(HEADER.size + first * self.entry.size, k * self.entry.size)
            if len(part) != k * self.entry.size:
                raise CorruptionError(f"{self.what} changed while it was read: try again")
            h.update(part)
            entries = list(self.entry.iter_unpack(part))
            total += sum(e[1] for e in entries)
            yield {bytes(e[0]) for e in entries}
        if h.hexdigest() != self.name or total != self.size:
            raise CorruptionError(f"{self.what} does not match its name (damaged): run `cdcstore check` on the server")

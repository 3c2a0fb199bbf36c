"""Manifest bundles in a store (core/bundle.py): written by a bucket store's pushes, read by
anyone who holds a manifest's name.

A push of small files writes their manifests and location records as a few bundles,
`bundles/ab/<id>`, instead of two objects a file. The tree entries of those files name the
bundle (`FileEntry.bundle`), and `Bundles` learns those pointers as trees are decoded, so a
reader takes a manifest from its bundle in one GET (kept: the next file of the same push costs
nothing). A pointer is a hint: a manifest is always checked against its name, and one whose
bundle is not known, or gone, is looked for as its own object and then in every bundle of
the store (`find`: a listing and a read of each bundle not read before; the slow path, for a
name that came without its tree)."""
from __future__ import annotations

import collections
import contextlib
from typing import Iterable, Iterator, Protocol

from .. import runtime
from ..core import bundle, ids
from ..core.errors import CorruptionError
from .names import bundle_name
from .objects import NotFound, ObjectInfo, ObjectStore

WHERE_MAX = 1 << 18  # manifest -> bundle pointers kept per store (least recently learned out first)
KEPT_BUNDLES = 16  # decoded bundles kept per store (each at most bundle.MAX_BYTES)
PREFIX = "bundles/"

Entries = dict[str, tuple[bytes, bytes]]  # a bundle's manifest name -> (manifest bytes, location record)


class BundleHost(Protocol):
    """What `Bundles` reads through (read at each call: `objects` may be replaced)."""

    @property
    def objects(self) -> ObjectStore: ...


def bundle_of(object_name: str) -> str | None:
    """The bundle an object name holds, or None for anything else."""
    base = object_name.rsplit("/", 1)[-1]
    return base if ids.is_new_hex_id(base) and object_name == bundle_name(base) else None


def read_stored(objects: ObjectStore, bid: str) -> Entries | None:
    """A stored bundle's entries, checked against its name and each manifest against its own
    (None if it is not stored; CorruptionError if damaged)."""
    try:  # at most one byte past the largest bundle: a huge object there is refused, not read whole
        data = bytes(objects.get_range(bundle_name(bid), 0, bundle.MAX_BYTES + 1))
    except NotFound:
        return None
    if len(data) > bundle.MAX_BYTES:
        raise CorruptionError(f"manifest bundle {bid} is over {bundle.MAX_BYTES} bytes (damaged or not a bundle)")
    if not ids.matches(data, bid):
        raise CorruptionError(f"manifest bundle {bid} does not match its name (damaged)")
    return bundle.decode(data, f"manifest bundle {bid}")


def listing(objects: ObjectStore) -> Iterator[tuple[str, ObjectInfo]]:
    """Every stored bundle: (id, ObjectInfo)."""
    for info in objects.list(PREFIX):
        bid = bundle_of(info.name)
        if bid is not None:
            yield bid, info


class Bundles:
    """The manifest bundles of one store: write them, know which holds a manifest, read them."""

    def __init__(self, host: BundleHost) -> None:
        self._host = host  # objects, location
        self._where: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._kept: collections.OrderedDict[str, Entries] = collections.OrderedDict()
        self._reading: dict[str, runtime.Lock] = {}  # bundle -> the lock of the thread reading it
        self._scanned: dict[str, frozenset[str]] = {}  # bundles `find` has read -> the manifests they hold
        self._lock = runtime.Lock()
        self._scan_lock = runtime.Lock()
        # `run`: bundle -> entries, None or the damage
        self._run: dict[str, Entries | CorruptionError | None] | None = None
        self._runs = 0

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        """One run of check, gc or a push: each bundle is read from the store once, checked,
        and its entries kept until the run ends, so a run costs a read per bundle, not one per
        manifest (issue 42; bundles group manifests by name, not by path, so a walk in path order
        met them at random and a 16-bundle memo missed). Memory follows the manifests the run
        reads, as its own work does (gc's live chunks, check's decoded manifests, a push's files).
        Runs may nest; the outermost ends it."""
        with self._lock:
            self._runs += 1
            if self._run is None:
                self._run = {}
        try:
            yield
        finally:
            with self._lock:
                self._runs -= 1
                if not self._runs:
                    self._run = None

    # -- pointers ---------------------------------------------------------------------------------
    def learn(self, pairs: Iterable[tuple[str, str | None]]) -> None:
        """Remember (manifest, bundle) pointers, from a tree's entries or a caller's."""
        with self._lock:
            for name, b in pairs:
                if b is not None:
                    self._where[name] = b
                    self._where.move_to_end(name)
            while len(self._where) > WHERE_MAX:
                self._where.popitem(last=False)

    def where(self, name: str) -> str | None:
        with self._lock:
            return self._where.get(name)

    # -- bundles ------------------------------------------------------------------------------
    def put(self, items: list[tuple[str, bytes, bytes]]) -> dict[str, str]:
        """Store (name, manifest, location record) triples as bundles, durably: manifest name ->
        bundle. A bundle stored before is made young again (gc's grace window covers it anew)."""
        groups = bundle.plan(items)
        out: dict[str, str] = {}

        def put(group: list[tuple[str, bytes, bytes]]) -> tuple[str, list[tuple[str, bytes, bytes]]]:
            data = bundle.encode(group)
            bid = ids.hexdigest(data)
            objects = self._host.objects
            if not objects.put(bundle_name(bid), data, exist_ok=True):
                objects.touch(bundle_name(bid))
            self._keep(bid, {n: (m, r) for n, m, r in group})
            return bid, group

        done = map(put, groups) if len(groups) <= 1 else runtime.pool("io", 8).map(put, groups)
        for bid, group in done:
            out.update((n, bid) for n, _, _ in group)
        self.learn(out.items())
        return out

    def read(self, bid: str, fresh: bool = False) -> Entries | None:
        """A bundle's entries, checked (None if it is not stored). `fresh`: read the store
        now, not what this process kept before (check); within a `run`, what the run read.
        Threads asking for one bundle read it once."""
        if fresh and self._run is None:
            return read_stored(self._host.objects, bid)
        with self._lock:
            one = self._reading.setdefault(bid, runtime.Lock())
        with one:
            with self._lock:
                if self._run is not None and bid in self._run:
                    got = self._run[bid]
                    if isinstance(got, CorruptionError):
                        raise got
                    return got
                got = None if fresh else self._kept.get(bid)
                if got is not None:
                    self._kept.move_to_end(bid)
                    return got
            try:
                try:
                    entries = read_stored(self._host.objects, bid)
                except CorruptionError as e:
                    self._in_run(bid, e)
                    raise
                self._in_run(bid, entries)
                if entries is not None:
                    self._keep(bid, entries)
                return entries
            finally:
                with self._lock:
                    self._reading.pop(bid, None)

    def _in_run(self, bid: str, got: Entries | CorruptionError | None) -> None:
        with self._lock:
            if self._run is not None:
                self._run[bid] = got

    def _keep(self, bid: str, entries: Entries) -> None:
        with self._lock:
            self._kept[bid] = entries
            self._kept.move_to_end(bid)
            while len(self._kept) > KEPT_BUNDLES:
                self._kept.popitem(last=False)

    def take(self, name: str, fresh: bool = False) -> tuple[bytes, bytes] | None:
        """(manifest bytes, location record) from the bundle a pointer names, or None (no
        pointer, the bundle gone, or it does not hold the manifest: the pointer is dropped);
        CorruptionError if that bundle is damaged."""
        bid = self.where(name)
        if bid is None:
            return None
        entries = self.read(bid, fresh)  # CorruptionError: the bundle is damaged
        got = entries.get(name) if entries else None
        if got is None:
            with self._lock:
                if self._where.get(name) == bid:
                    del self._where[name]
        return got

    def find(self, names: Iterable[str]) -> set[str]:
        """Which of `names` some bundle of the store holds, learning the pointers of every bundle
        not read before (a listing, and a GET a new bundle): the path of a name that came
        without its tree. A damaged bundle is passed over (check reports it)."""
        names = set(names)
        with self._scan_lock:
            new = [b for b, _ in listing(self._host.objects) if b not in self._scanned]

            def scan(bid: str) -> tuple[str, Entries | None]:
                try:
                    return bid, self.read(bid)
                except CorruptionError:
                    return bid, None

            for bid, entries in (runtime.pool("io", 8).map(scan, new) if len(new) > 1 else map(scan, new)):
                self._scanned[bid] = frozenset(entries or ())
                if entries:
                    self.learn((n, bid) for n in entries)
            lost = [n for n in names if self.where(n) is None]  # e.g. a wrong pointer, dropped
            if lost and self._scanned:
                self.learn((n, bid) for n in lost for bid, held in self._scanned.items() if n in held)
        return {n for n in names if self.where(n) is not None}

"""How a bucket store finds chunks without listing it: dedup anchors and location records.

Both are hints a machine follows, never the truth it acknowledges on (DESIGN §9b): an anchor
names the pack that holds a chunk, whose footer is then read and indexed; a location record
says where a manifest's chunks are, and a read verifies every chunk it takes from there.
A directory store has neither (its index sees every pack this machine writes).

    anchors/<ab>/<chunk id>.<pack>     empty objects (core/anchors.py)
    locations/ab/<manifest>            a manifest's chunk locations (core/locations.py)
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol

from .. import runtime
from ..core import anchors, locations
from ..core.errors import CorruptionError
from ..core.manifest import Manifest
from ..core.pack import PackEntry
from .index import ChunkIndex
from .names import locations_name
from .objects import NotFound, ObjectStore


class PackIndex(Protocol):
    """What the hints ask of the pack store they serve (`packs.Packs`): its index, footers, and
    the locations its index and records know."""

    @property
    def index(self) -> ChunkIndex: ...

    def pack_size(self, name: str) -> int: ...

    def read_pack_index(self, name: str, size: int | None = None) -> list[PackEntry]: ...

    def locate_known(self, wanted: list[bytes]) -> dict[bytes, tuple[str, PackEntry]]: ...

ANCHORED = "anchored"  # every pack of this store has its dedup anchors (core/anchors.py)
HINTS_MAX = 4_000_000  # chunk locations kept from location records per process (~1 GB at most)


class HintHost(Protocol):
    """What the hints ask of the store they serve (read at each call: `objects` may be replaced)."""

    @property
    def objects(self) -> ObjectStore: ...

    @property
    def shared(self) -> bool: ...


class Anchors:
    """The dedup anchors of a bucket store: a push finds the packs that hold what it shares by
    a listing per anchor, so its cost follows the new data, not the store."""

    def __init__(self, host: HintHost, packs: PackIndex) -> None:
        self._host, self._packs = host, packs  # packs: `packs.Packs` (its index and footers)
        self._misses: set[bytes] = set()  # anchors looked up in this push and not found
        self._anchored: bool | None = None

    def forget_misses(self) -> None:
        """A new push (or a read after a repack) looks up again what was not found."""
        self._misses.clear()

    def anchored(self) -> bool:
        """Whether every pack of this store has its anchors (a new bucket store, or an old one
        after a gc wrote them): then a push needs no index of every chunk."""
        if self._anchored is None:
            self._anchored = self._host.objects.exists(ANCHORED)
        return self._anchored

    def find_anchored(self, unknown: list[bytes]) -> int:
        """Index the packs that these unknown anchor chunks' anchors name: one listing per
        anchor and one footer per pack found, 8 at a time, so the cost follows the new data,
        not the store. A miss (no anchor, or only gone packs) is remembered for the push.
        Returns how many packs were indexed."""
        wanted = [c for c in dict.fromkeys(unknown) if c not in self._misses]
        if not wanted:
            return 0
        objects, index = self._host.objects, self._packs.index

        def look(cid: bytes) -> list[str]:
            found = (anchors.parse(i.name) for i in objects.list(anchors.prefix(cid)))
            return [a[1] for a in found if a is not None]

        named: dict[str, list[bytes]] = {}
        for cid, packs in zip(wanted, runtime.pool("io", 8).map(look, wanted)):
            if not packs:
                self._misses.add(cid)
            elif not any(index.has_pack(p) for p in packs):
                named.setdefault(packs[0], []).append(cid)  # one copy is enough

        indexed = index_footers(self._packs, list(named))
        for pack in set(named) - indexed:  # gone (a gc) or damaged (`check` reports it): a miss
            self._misses.update(named[pack])
        return len(indexed)

    def put_anchors(self, pack: str, chunk_ids: Iterable[bytes]) -> None:
        """Store the anchors of these chunks of `pack` (a bucket store): empty objects whose
        names say which pack holds which chunk."""
        if not self._host.shared:
            return
        names = [anchors.name(c, pack) for c in dict.fromkeys(chunk_ids)]
        if names:
            objects = self._host.objects
            list(runtime.pool("io", 8).map(lambda n: objects.put(n, b"", exist_ok=True), names))

    def sweep_anchors(self) -> int:
        """After a gc deleted or rewrote packs (the index then agrees with the listing): an
        anchor naming a pack that is gone is deleted, and put again naming the pack that now
        holds its chunk, if any (a repack). Only names are listed, no object is read.
        Returns how many anchors were deleted."""
        if not self._host.shared:
            return 0
        objects, index = self._host.objects, self._packs.index
        live = index.packs()
        dead = [(i.name, anchors.parse(i.name)) for i in objects.list(anchors.PREFIX)]
        dead = [(n, a) for n, a in dead if a is None or a[1] not in live]
        moved: dict[str, list[bytes]] = {}
        for cid, (pack, _) in index.locate([a[0] for _, a in dead if a is not None]).items():
            moved.setdefault(pack, []).append(cid)
        for pack, cids in moved.items():
            self.put_anchors(pack, cids)
        list(runtime.pool("io", 8).map(objects.delete, [n for n, _ in dead]))
        return len(dead)

    def write_all_anchors(self) -> int:
        """Give every indexed pack the anchors of its rule-picked chunks and mark the store
        anchored (an old bucket store, once, at a gc that has just brought the index up to the
        listing; files' first chunks get theirs as their manifests are pushed again).
        Returns the packs."""
        if not self._host.shared or self.anchored():
            return 0
        by_pack: dict[str, list[bytes]] = {}
        for pack, e in self._packs.index.all_rows():
            by_pack.setdefault(pack, [])
            if anchors.is_anchor(e.chunk_id):
                by_pack[pack].append(e.chunk_id)
        for pack, cids in by_pack.items():
            self.put_anchors(pack, cids)
        self._host.objects.put(ANCHORED, b"", exist_ok=True)
        self._anchored = True
        return len(by_pack)


def index_footers(packs: PackIndex, names: list[str]) -> set[str]:
    """Read and index these packs' footers (`packs`: a `packs.Packs`), 8 at a time; the packs
    indexed (one gone, or whose footer is damaged, is passed over: `check` reports it)."""
    def footer(pack: str) -> tuple[int, list[PackEntry]] | None:
        try:
            size = packs.pack_size(pack)
            return size, packs.read_pack_index(pack, size)
        except (NotFound, CorruptionError):
            return None

    done: set[str] = set()
    for pack, got in zip(names, runtime.pool("io", 8).map(footer, names)):
        if got is not None:
            packs.index.add_pack(pack, got[0], got[1])
            done.add(pack)
    return done


class LocationHints:
    """Chunk locations read from manifests' location records (a bucket store), kept per process
    beside the index: a new machine reads a file without listing the bucket or reading any
    pack footer."""

    def __init__(self, host: HintHost, packs: PackIndex) -> None:
        self._host, self._packs = host, packs  # packs: `packs.Packs` (what its index knows)
        self._hints: dict[bytes, tuple[str, PackEntry]] = {}  # chunk locations from location records
        self._hint_packs: set[str] = set()  # the packs they name

    def add(self, wanted: list[bytes], found: dict[bytes, tuple[str, PackEntry]]) -> None:
        """Into `found`, the hinted locations of the chunks of `wanted` it lacks."""
        hints = self._hints
        if hints:
            found.update((c, hints[c]) for c in wanted if c not in found and c in hints)

    def index_vouched(self, missing: list[bytes], vouched: Callable[[set[bytes]], set[bytes]]) -> int:
        """Chunks a landed commit holds (`vouched(ids)`) that this machine's index lacks because no
        dedup anchor led to their pack (anchors sample 1 chunk in 64; a small pack of an edit may
        have none): the landed manifests, read to vouch, taught these hints their packs, whose
        footers are indexed now. Without this a new machine uploaded them again (an unchanged
        folder: 670 KB of 14.6 MB in tests/test_cold_push.py). How many packs it indexed."""
        held = vouched(set(missing))
        if not held:
            return 0
        where: dict[bytes, tuple[str, PackEntry]] = {}
        self.add(list(held), where)
        fresh = sorted({p for p, _ in where.values() if not self._packs.index.has_pack(p)})
        return len(index_footers(self._packs, fresh)) if fresh else 0

    def names(self, pack: str) -> bool:
        return pack in self._hint_packs

    def in_pack(self, pack: str, start: int, end: int) -> list[PackEntry]:
        """Hinted chunks of `pack` whose bytes overlap [start, end)."""
        if pack not in self._hint_packs:
            return []
        return [e for p, e in list(self._hints.values())
                if p == pack and e.offset < end and e.offset + e.stored_len > start]

    def drop_pack(self, pack: str) -> None:
        """Forget the hints naming a pack found gone."""
        if pack in self._hint_packs:
            self._hints = {c: v for c, v in self._hints.items() if v[0] != pack}
            self._hint_packs.discard(pack)

    def load_locations(self, name: str, manifest: Manifest) -> None:
        """Learn where a manifest's chunks are from its location record (a bucket store),
        unless the index knows them all: a new machine reads a file without listing the
        bucket or reading any pack footer. One GET; a missing or damaged record is no error."""
        if not self._wanted(manifest):
            return
        try:
            data = bytes(self._host.objects.get(locations_name(name)))
        except NotFound:
            return
        self.learn_record(name, manifest, data, wanted_checked=True)

    def _wanted(self, manifest: Manifest) -> bool:
        if not self._host.shared or not manifest.chunk_ids:
            return False
        return len(self._packs.locate_known(list(dict.fromkeys(manifest.chunk_ids)))) < len(set(manifest.chunk_ids))

    def learn_record(self, name: str, manifest: Manifest, record: bytes, wanted_checked: bool = False) -> None:
        """Learn where a manifest's chunks are from its location record's bytes (read from its
        own object or taken from a manifest bundle); a damaged record is no error."""
        if not record or (not wanted_checked and not self._wanted(manifest)):
            return
        try:
            found = locations.decode(record, manifest, f"location record of manifest {name}")
        except CorruptionError:
            return
        if len(self._hints) > HINTS_MAX:
            self._hints, self._hint_packs = {}, set()
        self._hints.update(found)
        self._hint_packs.update(p for p, _ in found.values())

    def records(self, manifests: list[tuple[str, Manifest]]) -> dict[str, bytes]:
        """The location record of each manifest whose chunks are all located (a bucket store)."""
        if not self._host.shared:
            return {}
        where = self._packs.locate_known(list({c for _, m in manifests for c in m.chunk_ids}))
        out: dict[str, bytes] = {}
        for name, m in manifests:
            record = locations.encode(m, where)
            if record is not None:
                out[name] = record
        return out

    def put_first_anchors(self, manifests: list[tuple[str, Manifest]]) -> None:
        """The anchor of each large file's first chunk (core/anchors.py; a bucket store)."""
        large = [m for _, m in manifests if m.size >= anchors.FIRST_MIN and m.chunk_ids]
        if not self._host.shared or not large:
            return
        where = self._packs.locate_known(list({m.chunk_ids[0] for m in large}))
        objects = self._host.objects
        names = {anchors.name(m.chunk_ids[0], where[m.chunk_ids[0]][0]) for m in large if m.chunk_ids[0] in where}
        if len(names) <= 4:
            for n in names:
                objects.put(n, b"", exist_ok=True)
        else:
            list(runtime.pool("io", 8).map(lambda n: objects.put(n, b"", exist_ok=True), names))

    def put_locations(self, manifests: list[tuple[str, Manifest]]) -> None:
        """Write each manifest's location record (a bucket store, all chunks located), and the
        anchors of large files' first chunks."""
        if not self._host.shared:
            return
        objects = self._host.objects
        records = list(self.records(manifests).items())

        def put(item: tuple[str, bytes]) -> None:
            objects.put(locations_name(item[0]), item[1], exist_ok=True)

        if len(records) <= 4:
            for item in records:
                put(item)
        else:
            list(runtime.pool("io", 8).map(put, records))
        self.put_first_anchors(manifests)

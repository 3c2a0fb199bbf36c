"""The pack store: packs over an object store, and the chunk index that says where chunks are.

`Packs` plays `roles.ChunkSource` and `roles.ChunkSink` for a `repository.Repository`: it adds
packs durably and then indexes them (invariant 2), locates and reads verified chunks, and keeps
the index (a rebuildable cache, in the store's directory or under the user cache dir) agreeing
with the pack listing. A bucket store finds what the index lacks through its hints (hints.py).
`LocalPacks` is the directory form: reads are `os.pread` on descriptors kept open per process,
never mmap (a pack truncated under a reader gives a short read, a CorruptionError, not a SIGBUS).
"""
from __future__ import annotations

import collections
import contextlib
import os
import time
from typing import AbstractSet, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, cast

from .. import runtime, settings
from ..core import anchors, ids
from ..core.errors import CdcError, CorruptionError, MissingChunksError, PackMissingError
from ..core.pack import CODEC_RAW, PackEntry, decode_checked, decode_chunk, first_mismatch, read_index, read_run, read_verified
from ..core.ranges import plan_ranges, slices
from .hints import Anchors, LocationHints
from .index import ChunkIndex
from .local import open_regular
from .names import pack_name, pack_of
from .objects import NotFound, ObjectStore

MAX_OPEN = 256  # open pack descriptors per process (directory stores)
MIXED_PARTS = 512  # chunks one `read_mixed_into` reads (one preadv: at most IOV_MAX, 1024, buffers)
LOCAL_RUN = 4 << 20  # bytes per pread: larger buffers are fresh pages each time (~10x slower here)
REMOTE_RUN = 16 << 20  # bytes per ranged GET on an object store
INDEX_MAX_CHUNKS = 2_000_000  # chunk rows a bucket store's index keeps on a machine (~600 MB; CDCSTORE_INDEX_MAX_CHUNKS)


class PackHost(Protocol):
    """What the pack store asks of the repository it serves (read at each call: `objects` may
    be replaced, e.g. by a test's counting store)."""

    objects: ObjectStore
    location: str

    @property
    def shared(self) -> bool: ...


class _RangeFile:
    """A read-only file object over an object's byte ranges (for the pack footer parser)."""

    def __init__(self, objects: ObjectStore, name: str, size: int):
        self._objects, self._name, self.size, self._pos = objects, name, size, 0

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else (self._pos + pos if whence == 1 else self.size + pos)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self._pos if n < 0 else n
        data = bytes(self._objects.get_range(self._name, self._pos, n)) if n > 0 else b""
        self._pos += len(data)
        return data


class Packs:
    """Packs and the chunk index of one store (`roles.ChunkSource`, `roles.ChunkSink`)."""

    run = REMOTE_RUN  # bytes read at once from a pack

    def __init__(self, host: PackHost, index_path: str):
        self._host = host
        self.index_path = index_path
        self._index_error: CorruptionError | None = None
        os.makedirs(os.path.dirname(index_path), exist_ok=True)
        try:
            self._index = ChunkIndex(index_path)
        except CorruptionError as e:  # only `rebuild_index` works then
            self._index_error = e
        self._recover_lock = runtime.Lock()
        self._used: dict[str, float] = {}  # packs this process used since it last bounded the index
        self.anchors = Anchors(host, self)
        self.hints = LocationHints(host, self)

    @property
    def objects(self) -> ObjectStore:
        return self._host.objects

    @property
    def index(self) -> ChunkIndex:
        """The chunk index; a damaged one is tried again on each use (another process may
        have rebuilt it meanwhile), else CorruptionError naming rebuild-index."""
        if self._index_error:
            self._index = ChunkIndex(self.index_path)
            self._index_error = None
        return self._index

    def adopt_store(self, store_id: Callable[[], str]) -> None:
        """Empty an index kept for another store of this name (`store_id()`, asked only then)."""
        if self._index_error is None:
            self._index.adopt_store(store_id())

    def replace_damaged_index(self) -> None:
        """Move an index file sqlite cannot read aside (<index>.damaged) and start an empty one."""
        path = self.index_path
        os.replace(path, path + ".damaged")
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(NotFound, FileNotFoundError):
                os.unlink(path + suffix)
        self._index = ChunkIndex(path)
        self._index_error = None

    # -- which chunks are held (ChunkSink) ------------------------------------------------------
    def present(self, chunk_ids: list[bytes]) -> set[bytes]:
        return self.present_or_prove(dict.fromkeys(chunk_ids))

    def present_or_prove(self, chunks: Mapping[bytes, object], firsts: Iterable[bytes] = (),
                         vouched: Callable[[set[bytes]], set[bytes]] | None = None) -> set[bytes]:
        wanted = list(chunks)
        found = self.index.present(wanted)
        shared = self._host.shared
        if shared and len(found) < len(wanted) and self.anchors.anchored():
            firsts = set(firsts)
            unknown = [c for c in wanted if c not in found and (c in firsts or anchors.is_anchor(c))]
            if unknown and self.anchors.find_anchored(unknown):
                found = self.index.present(wanted)
        if shared and vouched is not None and len(found) < len(wanted):
            if self.hints.index_vouched([c for c in wanted if c not in found], vouched):
                found = self.index.present(wanted)
        if shared and found:
            found -= self._unverified(found, vouched)
        return found

    def _unverified(self, chunk_ids: set[bytes],
                    vouched: Callable[[set[bytes]], set[bytes]] | None = None) -> set[bytes]:
        """Of these indexed chunks of a bucket store, those a push must not deduplicate
        against: held in a pack another machine wrote (`own_packs`), not vouched for by a landed
        commit (`vouched`, trust by history), and whose bytes, read now, do not match the
        chunk's id, or cannot be read. A copy that fails is recorded damaged and dropped from
        the index (another copy takes its place), so the push uploads the chunk and later reads
        go to the copy it uploads. A co-tenant's well-formed pack of the right ids over other
        bytes is thus never trusted for what its footer says; a chunk a landed commit reaches is
        deduplicated by id (a genuine copy exists: readers verify every chunk and fall back to it)."""
        located = self.index.locate(chunk_ids)
        own = self.index.own_packs({p for p, _ in located.values()})
        doubt = [(p, e) for p, e in located.values() if p not in own]
        if doubt and vouched is not None:
            trusted = vouched({e.chunk_id for _, e in doubt})
            doubt = [(p, e) for p, e in doubt if e.chunk_id not in trusted]
        bad: set[bytes] = set()
        dropped: set[bytes] = set()
        for r in plan_ranges(doubt, max_hole=0, max_range=self.run):
            try:
                stored = self.read_stored(r.pack, r.start, r.end - r.start)
            except (NotFound, CorruptionError):
                bad.update(e.chunk_id for e in r.entries)
                continue
            failed = []
            for e, stored_bytes in slices(r, stored):
                try:
                    decode_chunk(stored_bytes, e.codec, e.raw_len, e.chunk_id)  # against the id, BLAKE3
                except CorruptionError:
                    failed.append(e.chunk_id)
            if failed:
                self.index.drop_chunks(r.pack, failed, damaged=True)
                dropped.update(failed)
        bad |= dropped
        if dropped:  # another copy took a dropped one's place: it is asked about in turn
            again = self.index.present(dropped)
            if again:
                bad -= again - self._unverified(again, vouched)
        return bad

    def add_pack(self, tmp: str, name: str, entries: list[PackEntry]) -> None:
        """Make a finished pack durable, then index its chunks (invariant 2)."""
        size = os.path.getsize(tmp)
        try:
            wrote = self.objects.put_file(pack_name(name), tmp, exist_ok=True)
            repaired = not wrote and self._repair_pack(name, tmp)
        finally:
            with contextlib.suppress(NotFound, FileNotFoundError):
                os.unlink(tmp)
        self.anchors.put_anchors(name, [e.chunk_id for e in entries if anchors.is_anchor(e.chunk_id)])
        if repaired:  # its rows and damage record replaced at once: the same chunks, now sound
            self.index.replace_pack(name, name, size, entries)
        else:
            self.index.add_pack(name, size, entries, own=True)
        if self._host.shared:
            self._used[name] = time.time()

    def bound(self, keep: AbstractSet[str] = frozenset()) -> None:
        """Keep a bucket store's index on this machine within `settings.INDEX_MAX_CHUNKS` chunk
        rows (`ChunkIndex.evict`: least recently used packs first, never those in `keep`).
        Run before a push (`Repository.begin_push`) and after a read indexed packs, never
        during a push: its own packs stay until its manifests' location records and its
        commit's check have located their chunks (the index may hold one push beyond the bound)."""
        limit = settings.INDEX_MAX_CHUNKS.get(INDEX_MAX_CHUNKS)
        if not self._host.shared or self.index.chunk_count() <= limit:  # a read, no write lock
            return
        used, self._used = {**self._used, **dict.fromkeys(keep, time.time())}, {}
        self.index.evict(limit, used, keep)

    def _repair_pack(self, name: str, tmp: str) -> bool:
        """The same pack written again (its chunks were out of the index) where a copy known
        damaged lies (`check` or a read found it): the sound bytes replace it. Whether they did."""
        if not any(pack == name for pack, _ in self.index.damaged()):
            return False
        with open(tmp, "rb") as f:
            # (stat always gives a token: only a listing may not)
            self.objects.put_if_match(pack_name(name), f.read(),
                                      self.objects.stat(pack_name(name)).token)  # type: ignore[arg-type]
        return True

    def require_stored(self, chunk_ids: Iterable[bytes]) -> None:
        """Raise `MissingChunksError` unless every chunk is in a pack the store holds now.
        The index says where; each distinct pack is then looked up in the store itself
        (one stat each, 8 at a time: the cost follows the change, not the store). A pack
        found gone is forgotten, so the push that is retried uploads its chunks again.
        Callers hold a push session, so no gc deletes a pack between this and the commit."""
        wanted = list(dict.fromkeys(chunk_ids))
        if not wanted:
            return
        located = self.locate(wanted)
        missing = [c for c in wanted if c not in located]
        packs = sorted({p for p, _ in located.values()})

        def gone(p: str) -> bool:
            try:
                self.pack_size(p)
                return False
            except NotFound:
                return True

        lost = [p for p, g in zip(packs, runtime.pool("io", 8).map(gone, packs)) if g] if packs else []
        if lost:
            self.index.drop_packs(lost)
            lost_set = set(lost)
            missing += [c for c, (p, _) in located.items() if p in lost_set]
        if missing:
            raise MissingChunksError(
                f"{len(missing)} chunks the commit names are not in the store (e.g. {missing[0].hex()}"
                + (f"; pack {lost[0]} is gone: a gc on another machine deleted it" if lost else "")
                + "): nothing was committed; push again (the chunks are uploaded again)")

    # -- the pack listing, and the index kept agreeing with it ----------------------------------
    def pack_sizes(self) -> dict[str, int]:
        """Every pack in the store: name -> size (objects under packs/ that are not named as
        a pack is, e.g. in another folder, are not packs: `foreign_objects` lists them)."""
        out = {}
        for info in self.objects.list("packs/"):
            name = pack_of(info.name)
            if name is not None:
                out[name] = info.size
        return out

    def foreign_objects(self) -> list[str]:
        """Objects under packs/ named like a pack but in another pack's folder (a co-tenant's
        or an operator's stray object): `check` reports them, every other command skips them
        (other stray files, e.g. a README, are ignored)."""
        def pack_like(name: str) -> bool:
            base = name.rsplit("/", 1)[-1]
            return base.endswith(".pack") and ids.is_hex_id(base[:-5])
        return [i.name for i in self.objects.list("packs/") if pack_of(i.name) is None and pack_like(i.name)]

    def iter_pack_names(self) -> Iterator[str]:
        yield from sorted(self.pack_sizes())

    def pack_size(self, name: str) -> int:
        """Bytes of a stored pack; NotFound if absent."""
        return self.objects.stat(pack_name(name)).size

    def pack_file(self, name: str) -> str | None:
        """A local file holding the pack, to send without a copy (None: not a directory store)."""
        return self.objects.local_path(pack_name(name)) if self.objects.capabilities.local_path else None

    def pack_range(self, name: str, offset: int, length: int) -> bytes:
        """Bytes of a stored pack as stored (may be short at its end); NotFound if absent."""
        return bytes(self.objects.get_range(pack_name(name), offset, length))

    def indexed_pack(self, name: str) -> bool:
        """Whether the chunk index lists pack `name`."""
        return self.index.has_pack(name)

    def read_pack_index(self, name: str, size: int | None = None) -> list[PackEntry]:
        """A pack's footer index, read with two or three ranged reads (never the whole pack)."""
        try:
            size = self.pack_size(name) if size is None else size
        except NotFound:
            raise CorruptionError(f"pack {name} is missing") from None
        # the parsers take a BinaryIO and use its seek and read: what a _RangeFile has
        return read_index(_RangeFile(self.objects, pack_name(name), size),  # type: ignore[arg-type]
                          size, f"pack {name}")

    def recover(self, forget_gone: bool = True, whole: bool = False) -> int:
        """Make the index agree with the store's pack listing: index packs that are stored
        but not indexed (a push killed between making a pack durable and indexing it; for a
        bucket, packs another machine wrote) and, with `forget_gone`, forget the rows of
        indexed packs that are gone (a gc or repack on another machine): the index is a
        cache, the listing is the truth. Packs evicted from a bounded index stay out unless
        `whole` (gc). Returns how many packs were added."""
        with self._recover_lock:
            known = self.index.packs()  # read before the listing: a pack indexed later was put before it
            evicted = self.index.evicted()
            listed = self.pack_sizes()
            gone = known - listed.keys()
            if forget_gone and gone:
                self.index.drop_packs(gone)
            if evicted.keys() - listed.keys():
                self.index.forget_evicted(evicted.keys() - listed.keys())
            return self._index_unknown(listed, known if whole else known | evicted.keys())

    def index_listed(self, listed: dict[str, int]) -> int:
        """Index the packs of one listing (`pack_sizes()`) that the index lacks, forgetting
        nothing: for a caller that goes on to use that same listing (`check`), so a pack
        that lands after it is out of its view rather than half in it. Returns how many."""
        with self._recover_lock:
            return self._index_unknown(listed, self.index.packs())

    def _index_unknown(self, listed: dict[str, int], known: set[str]) -> int:
        added = 0
        bad = self.index.bad_packs()  # read once and found unreadable: not read again at each push
        for name, size in listed.items():
            if name not in known and bad.get(name) != size:
                try:
                    entries = self.read_pack_index(name, size)
                except CorruptionError:
                    self.index.mark_bad_pack(name, size)  # reported by `check`; never indexed
                    continue
                self.index.add_pack(name, size, entries)
                added += 1
        return added

    def pack_hash(self, name: str) -> str:
        """The hash of a pack's bytes of the kind its name says (BLAKE3, or xxh3-128 for a
        v1 pack), read in 4 MiB ranges: its name, if undamaged."""
        h = ids.hasher_for(name)
        offset = 0
        while block := self.objects.get_range(pack_name(name), offset, 4 << 20):
            h.update(block)
            offset += len(block)
        return h.hexdigest()

    def index_found_pack(self, name: str) -> bool:
        """Whether pack `name` is indexed, indexing it first when it is durable but not in
        the index (a writer killed between the two steps). The found object is verified in
        full (name and every chunk); a damaged one counts as absent."""
        if self.index.has_pack(name):
            return True
        try:
            size = self.pack_size(name)
            if self.pack_hash(name) != name:
                return False
            entries = read_verified(_RangeFile(self.objects, pack_name(name), size),  # type: ignore[arg-type]
                                    size, f"pack {name}")  # (as `read_pack_index`)
        except (NotFound, CorruptionError):
            return False
        self.index.add_pack(name, size, entries, own=True)  # its name and every chunk verified
        return True

    # -- where chunks are, and their bytes (ChunkSource) ----------------------------------------
    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> dict[bytes, tuple[str, PackEntry]]:
        wanted = list(chunk_ids)
        found = self.locate_known(wanted)
        shared = self._host.shared
        if len(found) < len(wanted) and shared and self.anchors.anchored():
            # a repack moved chunks (a stale location record): their anchors name the new pack
            self.anchors.forget_misses()
            first = wanted[:1]  # a reader locating a file passes its first chunk first (an anchor)
            unknown = [c for c in wanted if c not in found and (anchors.is_anchor(c) or c in first)]
            if self.anchors.find_anchored(unknown):
                found = self.locate_known(wanted)
        if len(found) < len(wanted):
            # packs another machine wrote (a bucket), or a repack moved chunks: look at the listing
            if self.recover() or not self.objects.capabilities.local_path:
                found = self.index.locate(wanted)
            if len(found) < len(wanted) and shared and self.index.evicted():
                self.recover(whole=True)  # the chunks may be in packs a bounded index let go
                found = self.index.locate(wanted)
            self.bound({p for p, _ in found.values()})
        elif shared and found:
            now = time.time()
            self._used.update((p, now) for p, _ in found.values())
        return found

    def locate_known(self, wanted: list[bytes]) -> dict[bytes, tuple[str, PackEntry]]:
        """Locations from the index, then from location records read (no listing)."""
        found = self.index.locate(wanted)
        if len(found) < len(wanted):
            self.hints.add(wanted, found)
        return found

    def knows_pack(self, name: str) -> bool:
        """Whether the index or a location record read names pack `name` (no listing)."""
        return self.hints.names(name) or self.index.has_pack(name)

    def pack_chunks(self, pack: str, start: int, end: int) -> list[PackEntry]:
        """Known chunks of `pack` whose bytes overlap [start, end) (index rows and location records)."""
        out = {e.chunk_id: e for e in self.index.pack_chunks(pack, start, end)}
        for e in self.hints.in_pack(pack, start, end):
            out.setdefault(e.chunk_id, e)
        return sorted(out.values(), key=lambda e: e.offset)

    def read_stored(self, pack: str, offset: int, length: int) -> memoryview:
        """Raw bytes of a pack range (no decoding); CorruptionError if the pack is short."""
        try:
            data = self.objects.get_range(pack_name(pack), offset, length) if length else b""
        except NotFound:
            raise self.pack_gone(pack) from None
        if len(data) != length:
            raise CorruptionError(f"pack {pack} is truncated: wanted {length} bytes at {offset}, "
                                  f"got {len(data)}; run `cdcstore check`")
        return memoryview(data)

    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> bytes | memoryview:
        return self.read_chunks([(pack, entry)])[entry.chunk_id]

    def read_chunks(self, items: list[tuple[str, PackEntry]], repo: str | None = None,
                    stored: dict[bytes, bytes] | None = None) -> dict[bytes, bytes | memoryview]:
        """One read per run of adjacent chunks in a pack; each chunk verified: in a bucket
        against its id (BLAKE3: bytes from a place other machines write), in a directory
        this machine writes against its entry's xxh3-64 (rot; its id was verified on write)."""
        out: dict[bytes, bytes | memoryview] = {}  # a raw chunk: a view of the bytes read
        trust_checks = not self._host.shared
        for r in plan_ranges(items, max_hole=0, max_range=self.run):
            for e, stored_bytes in slices(r, self.read_stored(r.pack, r.start, r.end - r.start)):
                try:
                    out[e.chunk_id] = decode_checked(stored_bytes, e.codec, e.raw_len, e.chunk_id,
                                                     e.check if trust_checks else None)
                except CorruptionError as err:
                    damaged = self.damaged(r.pack, e.chunk_id, err)  # its row dropped: not read again
                    other = self.locate([e.chunk_id], repo).get(e.chunk_id)
                    if other is None or other[0] == r.pack:
                        raise damaged from None
                    out.update(self.read_chunks([other], repo))  # another copy (a good push's, verified)
        return out

    def pack_gone(self, pack: str) -> PackMissingError:
        """The error for a pack the index names and the store lacks. Its rows are forgotten
        first: a gc or repack elsewhere moved its chunks, so the next `locate` (which
        re-reads the listing on a miss) finds them where they are now."""
        with contextlib.suppress(CdcError):
            self.index.drop_pack(pack)
        self.hints.drop_pack(pack)
        return PackMissingError(f"pack {pack} is missing from {self._host.location} (a gc or repack moved its "
                                f"chunks, or the store is damaged): read again, or run `cdcstore check`")

    def damaged(self, pack: str, chunk_id: bytes, err: Exception | str) -> CorruptionError:
        """The error for a stored chunk that failed verification; its index row is dropped
        first (absent now: the next push stores it again)."""
        self.index.drop_chunks(pack, [chunk_id], damaged=True)
        return CorruptionError(f"{err} in pack {pack}: the store is damaged; run `cdcstore check`,"
                               f" or push the original files again to repair it")

    def close(self) -> None:
        """Let go of the index's sqlite connections (a later use opens them again)."""
        if self._index_error is None:
            self._index.close()


class LocalPacks(Packs):
    """The packs of a directory store, read with os.pread on descriptors kept open per process
    (`roles.BackendCapabilities.reads_runs`: runs of raw chunks land in a caller's buffer)."""

    run = LOCAL_RUN

    def __init__(self, host: PackHost, index_path: str):
        super().__init__(host, index_path)
        # pack name -> open descriptor, this process's (the parent's stay theirs); runtime.Local is untyped
        self._fds = runtime.Local()  # type: ignore[no-untyped-call]
        self._fd_lock = runtime.Lock()

    def pack_path(self, name: str) -> str:
        path = self.objects.local_path(pack_name(name))
        assert path is not None  # a directory store's objects are files
        return path

    def pack_size(self, name: str) -> int:
        try:
            return os.path.getsize(self.pack_path(name))
        except FileNotFoundError:
            raise NotFound(f"no pack {name}") from None

    def _fd(self, pack: str) -> int:
        """An open descriptor of a pack (per process; at most MAX_OPEN kept open)."""
        with self._fd_lock:
            fds: collections.OrderedDict[str, int] = self._fds.get(collections.OrderedDict)
            fd = fds.get(pack)
            if fd is None:
                try:
                    fd = open_regular(self.pack_path(pack))
                except FileNotFoundError:
                    raise self.pack_gone(pack) from None
                fds[pack] = fd
                while len(fds) > MAX_OPEN:
                    os.close(fds.popitem(last=False)[1])
            else:
                fds.move_to_end(pack)
            return fd

    def read_stored(self, pack: str, offset: int, length: int) -> memoryview:
        """Raw bytes of a pack range (no decoding); CorruptionError if the pack is short."""
        data = os.pread(self._fd(pack), length, offset) if offset >= 0 else b""
        if len(data) < length and data:  # a short read that is not the end of the file
            data += self._read_rest(pack, offset + len(data), length - len(data))
        if len(data) != length:
            raise CorruptionError(f"pack {pack} is truncated: wanted {length} bytes at {offset}, "
                                  f"got {len(data)}; run `cdcstore check`")
        return memoryview(data)

    def run_fd(self, pack: str) -> int:
        """An open descriptor of a pack, for a native read of its raw runs (`_xxh3.Filler`, which
        duplicates it: the descriptor stays this object's). PackMissingError if it is gone."""
        return self._fd(pack)

    def read_run_into(self, pack: str, offset: int, out: memoryview, chunk_ids: Sequence[bytes],
                      lengths: Sequence[int], checks: Sequence[int | None] | None = None) -> None:
        """Raw chunks that sit back to back in a pack from `offset`, read straight into
        `out` (one copy, from the page cache) and each checked there: against its pack
        entry's xxh3-64 checksum when `checks` gives them (this store's own pack, whose ids
        were verified when it was written or received), else against its id."""
        fd, got = self._fd(pack), 0
        if checks is not None and None not in checks:  # native: each chunk read and checked in C, GIL released
            bad = read_run(fd, offset, out, lengths, cast("Sequence[int]", checks))  # no None in it
            if bad == -2:
                raise CorruptionError(f"pack {pack} is truncated: wanted {len(out)} bytes at {offset}; "
                                      f"run `cdcstore check`")
            if bad >= 0:
                raise self.damaged(pack, chunk_ids[bad], f"chunk {chunk_ids[bad].hex()} does not match its id "
                                                         f"(its checksum differs)")
            return
        while got < len(out):  # preadv may return less than asked before the end
            n = os.preadv(fd, [out[got:]], offset + got)
            if not n:
                raise CorruptionError(f"pack {pack} is truncated: wanted {len(out)} bytes at {offset}, "
                                      f"got {got}; run `cdcstore check`")
            got += n
        bad = first_mismatch(out, chunk_ids, lengths, checks)
        if bad >= 0:
            raise self.damaged(pack, chunk_ids[bad], f"chunk {chunk_ids[bad].hex()} does not match its id"
                                                     f"{' (its checksum differs)' if checks else ''}")

    def read_mixed_into(self, pack: str, parts: Sequence[tuple[int, PackEntry]], out: memoryview) -> None:
        """Chunks back to back in this pack, raw and compressed (`parts`: (dest, entry) in pack
        order; at most `MIXED_PARTS`), read with one `preadv`: a raw chunk straight into its place
        in `out`, a compressed one into a buffer of its own and decoded into its place. Each is
        checked there, as `read_chunks` checks (this store's own packs: the entry's xxh3-64).
        A tar file's header chunks (compressed) then cost no run break between its members' data."""
        fd, start = self._fd(pack), parts[0][1].offset
        bufs: list[memoryview] = []
        for dest, e in parts:
            raw = e.codec == CODEC_RAW and e.stored_len == e.raw_len
            bufs.append(out[dest:dest + e.raw_len] if raw else memoryview(bytearray(e.stored_len)))
        todo, first, got = list(bufs), 0, 0
        while first < len(todo):  # preadv may return less than asked before the end
            n = os.preadv(fd, todo[first:first + 1024], start + got)
            if not n:
                raise CorruptionError(f"pack {pack} is truncated: wanted {sum(map(len, bufs))} bytes at {start}, "
                                      f"got {got}; run `cdcstore check`")
            got += n
            while first < len(todo) and n >= len(todo[first]):
                n -= len(todo[first])
                first += 1
            if n:
                todo[first] = todo[first][n:]
        trust_checks = not self._host.shared
        for (dest, e), buf in zip(parts, bufs):
            check = e.check if trust_checks else None
            if e.codec == CODEC_RAW and e.stored_len == e.raw_len:
                if not (ids.checksum(buf) == check if check is not None else ids.matches(buf, e.chunk_id)):
                    raise self.damaged(pack, e.chunk_id, f"chunk {e.chunk_id.hex()} does not match its id"
                                                         f"{' (its checksum differs)' if check is not None else ''}")
                continue
            try:
                out[dest:dest + e.raw_len] = decode_checked(buf, e.codec, e.raw_len, e.chunk_id, check)
            except CorruptionError as err:
                raise self.damaged(pack, e.chunk_id, err) from None

    def index_stamp(self) -> tuple[int, int, int]:
        """Changes whenever the chunk index may have changed, in any process: what was
        located under one stamp is still where the index says while the stamp holds."""
        conn = self.index.conn
        return id(conn), conn.total_changes, conn.execute("PRAGMA data_version").fetchone()[0]

    def _read_rest(self, pack: str, offset: int, length: int) -> bytes:
        parts = []
        while length > 0 and (part := os.pread(self._fd(pack), length, offset)):
            parts.append(part)
            offset += len(part)
            length -= len(part)
        return b"".join(parts)

    def close(self) -> None:
        with self._fd_lock:
            for fd in (self._fds.here() or {}).values():  # type: ignore[no-untyped-call]  # runtime.Local
                os.close(fd)
            self._fds.clear()
        super().close()

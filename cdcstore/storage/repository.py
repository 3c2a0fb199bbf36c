"""The repository: packs, manifests, commits and refs over a dumb object store.

One layer owns every format on top of `objects.ObjectStore` (a directory, a bucket,
memory); the `repos/` names, refs and the compare-and-swap commit are `refs.Refs`'s, to
which `Repository` delegates. Object names (store format v1, docs/format.md):

    cdcstore.json                          {"format": "cdcstore", "version": 1}
    packs/ab/<name>.pack                   immutable, named by BLAKE3-256 of their bytes
    manifests/ab/<name>                    file manifests, named likewise
    trees/ab/<name>                        trees (one folder of a format 2 commit), named likewise
    repos/<repo>/commits/<id>.json         commits, named by BLAKE3-256 of their JSON
    repos/<repo>/branches/<branch>         the commit id a branch points at
    repos/<repo>/tags/<tag>                the commit id a tag names (never rewritten)
    repos/<repo>/applied/<id>.<landed>     a rebased commit's copy (empty; see update_branch)
    grants/<owner>/<hash>                  chunk ids a server token uploaded (access.AccessRecords)

Names made by format v1 (xxh3-128: 32 hex digits; chunk ids of 16 bytes) stay readable:
the length of a name says which hash checks it (`ids.matches`).

Beside them, on local disk only, the chunk index (`index.ChunkIndex`, a rebuildable
cache: in the store's directory for a local store, under the user cache dir for a
bucket). Objects are written once and only whole (invariant 1). Write order is packs
-> index rows -> manifests -> trees -> commit -> branch, and a branch moves by a conditional
put (compare-and-swap), so two writers on two machines never lose a commit and need no
lock server.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import tempfile
from typing import Iterable, Iterator

import platformdirs

from .. import runtime
from ..core import ids
from ..core.address import check_name
from ..core import treeobj
from ..core.commit import Commit
from ..core.errors import (CdcError, CorruptionError, MissingChunksError, NotAStoreError, PackMissingError,
                           PathNotFoundError, RevisionNotFoundError, StoreFormatError)
from ..core import anchors, locations
from ..core.manifest import LEGACY_MANIFEST_VERSION, Manifest
from ..core.pack import PackEntry, decode_checked, decode_chunk, first_mismatch, read_index, read_verified
from ..core.ranges import plan_ranges, slices
from .backend import Backend, BackendCapabilities
from .index import ChunkIndex
from . import commands, maintenance, open_objects, staging
from .local import LocalObjects, open_regular
from .manifest_file import ManifestFile
from .names import locations_name, manifest_name, pack_name, pack_of, tree_name  # noqa: F401 (names: the layout)
from .objects import Conflict, NotFound, ObjectStore
from .refs import DELETED, Refs, _suppress_not_found, commit_name  # noqa: F401 (DELETED: access.py's)

STORE_FORMAT = "cdcstore"
STORE_VERSION = 1
MARKER = "cdcstore.json"
MAX_OPEN = 256  # open pack descriptors per process (directory stores)
LOCAL_RUN = 4 << 20  # bytes per pread: larger buffers are fresh pages each time (~10x slower here)
REMOTE_RUN = 16 << 20  # bytes per ranged GET on an object store
HINTS_MAX = 4_000_000  # chunk locations kept from location records per process (~1 GB at most)
TREE_MEMO = 4096  # trees kept decoded per process (immutable: named by their bytes)
MANIFEST_MEMO_CHUNKS = 1 << 18  # chunk entries of decoded manifests kept per store (~40 MB at most; see `get_manifest`)
PUT_IDS_MEMO = 1 << 18  # chunk ids of just-stored manifests kept for their commit (about 25 MB at most)


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


def _store_meta() -> bytes:
    return json.dumps({"format": STORE_FORMAT, "version": STORE_VERSION}).encode()


def check_marker(data: bytes | None, where: str) -> None:
    """The store marker must name this format and version."""
    if data is None:
        raise NotAStoreError(
            f"{where} is not a cdcstore store (no {MARKER}): pass the store's location, "
            f"or create a new store with `cdcstore init --store {where}`")
    try:
        meta = json.loads(data)
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise StoreFormatError(f"{where.rstrip('/')}/{MARKER} is damaged; restore it as "
                               f'{{"format": "cdcstore", "version": {STORE_VERSION}}}')
    if meta.get("format") != STORE_FORMAT or meta.get("version") != STORE_VERSION:
        raise StoreFormatError(f"{where} holds store format {meta!r}; this cdcstore reads "
                               f"version {STORE_VERSION}: upgrade cdcstore")


STORE_ID = "store-id"
ANCHORED = "anchored"  # every pack of this store has its dedup anchors (core/anchors.py)


def default_index_path(identity: str) -> str:
    """Where the chunk index of a bucket store lives on this machine (a rebuildable cache),
    keyed by the store's full identity (`ObjectStore.identity`: endpoint, bucket, prefix)."""
    key = hashlib.blake2b(identity.encode(), digest_size=8).hexdigest()
    return os.path.join(platformdirs.user_cache_dir("cdcstore"), "index", f"{key}.sqlite")


class Repository(Backend):
    """A store over an object store, with its chunk index at `index_path`.

    `open_repository(url)` opens one by location; `LocalStore` is the directory form.
    """

    capabilities = BackendCapabilities(local_reads=True, runs_here=True)

    def __init__(self, objects: ObjectStore, index_path: str, location: str | None = None):
        self.objects = objects
        self.location = location or objects.url
        self.index_path = index_path
        if objects.counters() is not None:  # a bucket counts its requests and bytes
            self.capabilities = dataclasses.replace(self.capabilities, counts_requests=True)
        try:
            marker = bytes(objects.get(MARKER))
        except NotFound:
            marker = None
        check_marker(marker, self.location)
        self._index_error: CorruptionError | None = None
        os.makedirs(os.path.dirname(index_path), exist_ok=True)
        try:
            self._index = ChunkIndex(index_path)
        except CorruptionError as e:  # only `rebuild_index` works then
            self._index_error = e
        if not objects.capabilities.local_path and self._index_error is None:
            self._index.adopt_store(self.store_id())  # an index of another store by that name is emptied
        self._recover_lock = runtime.Lock()
        self._hints: dict[bytes, tuple[str, PackEntry]] = {}  # chunk locations from location records
        self._hint_packs: set[str] = set()  # the packs they name
        self._shared = not objects.capabilities.local_path  # a bucket: other machines write it too
        self._trees: dict[str, treeobj.Tree] = {}  # decoded trees (immutable), at most TREE_MEMO
        self._manifests: collections.OrderedDict[str, Manifest] = collections.OrderedDict()  # `get_manifest`
        self._manifest_chunks = 0  # chunk entries held by `_manifests`
        self._manifests_lock = runtime.Lock()
        self._anchor_misses: set[bytes] = set()  # anchors looked up in this push and not found
        self._anchored: bool | None = None
        self._put_ids: collections.OrderedDict[str, list[bytes]] = collections.OrderedDict()  # see `_written_ids`
        self._put_ids_count = 0
        self._put_ids_lock = runtime.Lock()
        self._refs = Refs(self)  # repos, branches, tags, commit by compare-and-swap

    @classmethod
    def create(cls, objects: ObjectStore, index_path: str, location: str | None = None,
               exist_ok: bool = False) -> "Repository":
        """Write the store marker (once) and open the new store."""
        try:
            objects.put_if_absent(MARKER, _store_meta())
        except Conflict:
            if not exist_ok:
                raise FileExistsError(f"a store already exists at {location or objects.url}") from None
        else:
            if not objects.capabilities.local_path:  # a new bucket store: anchors from its first pack
                objects.put(ANCHORED, b"", exist_ok=True)
        return cls(objects, index_path, location)

    @property
    def identity(self) -> str:
        return self.objects.identity

    def store_id(self) -> str:
        """The store's random identity (object `store-id`, made once by the first machine that
        needs it): a bucket deleted and made again, or another service's bucket of the same
        name, has another, so no machine takes its cache of one for the other."""
        try:
            return bytes(self.objects.get(STORE_ID)).decode().strip()
        except NotFound:
            with contextlib.suppress(Conflict):
                self.objects.put_if_absent(STORE_ID, secrets.token_hex(16).encode())
            return bytes(self.objects.get(STORE_ID)).decode().strip()

    def created(self) -> float | None:
        """When the store was made: its marker's write time (None where the store keeps none)."""
        info = next(iter(self.objects.list(MARKER)), None)
        return info.mtime if info is not None and info.mtime else None

    # -- upkeep (roles.Upkeep: runs_here) and what a server asks of its store ----------------
    def admin(self, command: str, **options):
        """Run a maintenance command here (storage/commands.py): gc, check, forget, delete-repo,
        rebuild-index, recover."""
        return commands.run(self, command, **options)

    def push_session(self):
        """This process's push-session marker (maintenance.PushSession)."""
        return maintenance.PushSession(self)

    def journal(self) -> staging.Journal:
        return staging.Journal(self)

    @property
    def shared(self) -> bool:
        """Other machines write this store too (a bucket), so what this index holds may lag."""
        return self._shared

    def has_manifest(self, name: str) -> bool:
        return self.objects.exists(manifest_name(name))

    def manifests_present(self, repo: str, names: list[str]) -> set[str]:
        """Which of these manifests are stored (a look at each object; `repo` is not checked)."""
        names = list(dict.fromkeys(names))
        found = runtime.pool("io", 8).map(self.has_manifest, names) if len(names) > 1 else map(self.has_manifest, names)
        return {n for n, ok in zip(names, list(found)) if ok}

    def put_manifest_file(self, name: str, path: str) -> None:
        """Store a manifest received into a local file (its name checked by the caller); one
        stored before is made young again, as `put_manifests` does."""
        if not self.objects.put_file(manifest_name(name), path, exist_ok=True):
            self.objects.touch(manifest_name(name))

    def session_marker(self, name: str) -> bytes:
        """A push session's marker object (`maintenance.PushSession.name`); NotFound if absent."""
        return bytes(self.objects.get(name))

    def pack_range(self, name: str, offset: int, length: int) -> bytes:
        """Bytes of a stored pack as stored (may be short at its end); NotFound if absent."""
        return bytes(self.objects.get_range(pack_name(name), offset, length))

    def indexed_pack(self, name: str) -> bool:
        """Whether the chunk index lists pack `name`."""
        return self.index.has_pack(name)

    def reach_stale(self) -> bool:
        """The index predates chunk-level access records (storage/index.py): rebuild it once."""
        return self.index.reach_stale()

    # -- temp files (packs are built locally, then put) ---------------------------------
    def tmp_path(self) -> str:
        d = os.path.join(os.path.dirname(self.index_path), "tmp")
        os.makedirs(d, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=f"{os.getpid()}-", suffix=".tmp", dir=d)
        os.close(fd)
        return path

    def clean_tmp(self) -> None:
        """Remove temp files left by processes that died mid-write: the store's own (a
        directory store) and, for a bucket, the packs being built under this machine's cache
        folder (a push killed before its upload)."""
        self.objects.clean_tmp()
        if not self.objects.capabilities.local_path:
            runtime.clean_dead_temps(os.path.join(os.path.dirname(self.index_path), "tmp"))

    # -- packs and chunks -------------------------------------------------------------------
    def present(self, chunk_ids: list[bytes]) -> set[bytes]:
        return self.present_or_prove(dict.fromkeys(chunk_ids))

    def present_or_prove(self, chunks: dict, firsts: Iterable[bytes] = ()) -> set[bytes]:
        wanted = list(chunks)
        found = self.index.present(wanted)
        if self._shared and len(found) < len(wanted) and self.anchored():
            firsts = set(firsts)
            unknown = [c for c in wanted if c not in found and (c in firsts or anchors.is_anchor(c))]
            if unknown and self.find_anchored(unknown):
                found = self.index.present(wanted)
        if self._shared and found:
            found -= self._unverified(found)
        return found

    def _unverified(self, chunk_ids: set[bytes]) -> set[bytes]:
        """Of these indexed chunks of a bucket store, those a push must not deduplicate
        against: held in a pack another machine wrote (`own_packs`) whose bytes, read now,
        do not match the chunk's id, or cannot be read. A copy that fails is recorded damaged
        and dropped from the index (another copy takes its place), so the push uploads the
        chunk and later reads go to the copy it uploads. A co-tenant's well-formed pack of
        the right ids over other bytes is thus never trusted for what its footer says."""
        located = self.index.locate(chunk_ids)
        own = self.index.own_packs({p for p, _ in located.values()})
        doubt = [(p, e) for p, e in located.values() if p not in own]
        bad: set[bytes] = set()
        dropped: set[bytes] = set()
        for r in plan_ranges(doubt, max_hole=0, max_range=self._run):
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
                bad -= again - self._unverified(again)
        return bad

    def begin_push(self) -> None:
        """Before a push: clean temp files; bring the index up to the listing, unless the
        store's anchors let the push find what it shares as it goes (a bucket store)."""
        self.clean_tmp()
        self._anchor_misses.clear()
        if not (self._shared and self.anchored()):
            self.recover()

    # -- dedup anchors (a bucket store: core/anchors.py) ---------------------------------------
    def anchored(self) -> bool:
        """Whether every pack of this store has its anchors (a new bucket store, or an old one
        after a gc wrote them): then a push needs no index of every chunk."""
        if self._anchored is None:
            self._anchored = self.objects.exists(ANCHORED)
        return self._anchored

    def find_anchored(self, unknown: list[bytes]) -> int:
        """Index the packs that these unknown anchor chunks' anchors name: one listing per
        anchor and one footer per pack found, 8 at a time, so the cost follows the new data,
        not the store. A miss (no anchor, or only gone packs) is remembered for the push.
        Returns how many packs were indexed."""
        wanted = [c for c in dict.fromkeys(unknown) if c not in self._anchor_misses]
        if not wanted:
            return 0

        def look(cid: bytes) -> list[str]:
            found = (anchors.parse(i.name) for i in self.objects.list(anchors.prefix(cid)))
            return [a[1] for a in found if a is not None]

        named: dict[str, list[bytes]] = {}
        for cid, packs in zip(wanted, runtime.pool("io", 8).map(look, wanted)):
            if not packs:
                self._anchor_misses.add(cid)
            elif not any(self.index.has_pack(p) for p in packs):
                named.setdefault(packs[0], []).append(cid)  # one copy is enough

        def footer(pack: str):
            try:
                size = self.pack_size(pack)
                return size, self.read_pack_index(pack, size)
            except (NotFound, CorruptionError):
                return None  # gone (a gc) or damaged (`check` reports it): a miss

        added = 0
        for pack, got in zip(named, runtime.pool("io", 8).map(footer, list(named))):
            if got is None:
                self._anchor_misses.update(named[pack])
                continue
            self.index.add_pack(pack, got[0], got[1])
            added += 1
        return added

    def put_anchors(self, pack: str, chunk_ids: Iterable[bytes]) -> None:
        """Store the anchors of these chunks of `pack` (a bucket store): empty objects whose
        names say which pack holds which chunk."""
        if not self._shared:
            return
        names = [anchors.name(c, pack) for c in dict.fromkeys(chunk_ids)]
        if names:
            list(runtime.pool("io", 8).map(lambda n: self.objects.put(n, b"", exist_ok=True), names))

    def sweep_anchors(self) -> int:
        """After a gc deleted or rewrote packs (the index then agrees with the listing): an
        anchor naming a pack that is gone is deleted, and put again naming the pack that now
        holds its chunk, if any (a repack). Only names are listed, no object is read.
        Returns how many anchors were deleted."""
        if not self._shared:
            return 0
        live = self.index.packs()
        dead = [(i.name, anchors.parse(i.name)) for i in self.objects.list(anchors.PREFIX)]
        dead = [(n, a) for n, a in dead if a is None or a[1] not in live]
        moved: dict[str, list[bytes]] = {}
        for cid, (pack, _) in self.index.locate([a[0] for _, a in dead if a is not None]).items():
            moved.setdefault(pack, []).append(cid)
        for pack, cids in moved.items():
            self.put_anchors(pack, cids)
        list(runtime.pool("io", 8).map(self.objects.delete, [n for n, _ in dead]))
        return len(dead)

    def write_all_anchors(self) -> int:
        """Give every indexed pack the anchors of its rule-picked chunks and mark the store
        anchored (an old bucket store, once, at a gc that has just brought the index up to the
        listing; files' first chunks get theirs as their manifests are pushed again).
        Returns the packs."""
        if not self._shared or self.anchored():
            return 0
        by_pack: dict[str, list[bytes]] = {}
        for pack, e in self.index.all_rows():
            by_pack.setdefault(pack, [])
            if anchors.is_anchor(e.chunk_id):
                by_pack[pack].append(e.chunk_id)
        for pack, cids in by_pack.items():
            self.put_anchors(pack, cids)
        self.objects.put(ANCHORED, b"", exist_ok=True)
        self._anchored = True
        return len(by_pack)

    def totals(self) -> dict:
        return self.index.totals()

    def counters(self) -> dict:
        """Requests and body bytes to and from a bucket, this process (zeros for a directory)."""
        return self.objects.counters() or super().counters()

    def add_pack(self, tmp: str, name: str, entries: list[PackEntry]) -> None:
        """Make a finished pack durable, then index its chunks (invariant 2)."""
        size = os.path.getsize(tmp)
        try:
            wrote = self.objects.put_file(pack_name(name), tmp, exist_ok=True)
            repaired = not wrote and self._repair_pack(name, tmp)
        finally:
            with _suppress_not_found():
                os.unlink(tmp)
        self.put_anchors(name, [e.chunk_id for e in entries if anchors.is_anchor(e.chunk_id)])
        if repaired:  # its rows and damage record replaced at once: the same chunks, now sound
            self.index.replace_pack(name, name, size, entries)
        else:
            self.index.add_pack(name, size, entries, own=True)

    def _repair_pack(self, name: str, tmp: str) -> bool:
        """The same pack written again (its chunks were out of the index) where a copy known
        damaged lies (`check` or a read found it): the sound bytes replace it. Whether they did."""
        if not any(pack == name for pack, _ in self.index.damaged()):
            return False
        with open(tmp, "rb") as f:
            self.objects.put_if_match(pack_name(name), f.read(), self.objects.stat(pack_name(name)).token)
        return True

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

    def manifest_file(self, name: str) -> str | None:
        return self.objects.local_path(manifest_name(name)) if self.objects.capabilities.local_path else None

    def manifest_bytes(self, name: str) -> bytes:
        """A stored manifest's bytes as stored (NotFound if absent)."""
        return bytes(self.objects.get(manifest_name(name)))

    def read_pack_index(self, name: str, size: int | None = None) -> list[PackEntry]:
        """A pack's footer index, read with two or three ranged reads (never the whole pack)."""
        try:
            size = self.pack_size(name) if size is None else size
        except NotFound:
            raise CorruptionError(f"pack {name} is missing") from None
        return read_index(_RangeFile(self.objects, pack_name(name), size), size, f"pack {name}")

    def recover(self, forget_gone: bool = True) -> int:
        """Make the index agree with the store's pack listing: index packs that are stored
        but not indexed (a push killed between making a pack durable and indexing it; for a
        bucket, packs another machine wrote) and, with `forget_gone`, forget the rows of
        indexed packs that are gone (a gc or repack on another machine): the index is a
        cache, the listing is the truth. Returns how many packs were added."""
        with self._recover_lock:
            known = self.index.packs()  # read before the listing: a pack indexed later was put before it
            listed = self.pack_sizes()
            gone = known - listed.keys()
            if forget_gone and gone:
                self.index.drop_packs(gone)
            return self._index_unknown(listed, known)

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
            entries = read_verified(_RangeFile(self.objects, pack_name(name), size), size, f"pack {name}")
        except (NotFound, CorruptionError):
            return False
        self.index.add_pack(name, size, entries, own=True)  # its name and every chunk verified
        return True

    @property
    def index(self) -> ChunkIndex:
        """The chunk index; a damaged one is tried again on each use (another process may
        have rebuilt it meanwhile), else CorruptionError naming rebuild-index."""
        if self._index_error:
            self._index = ChunkIndex(self.index_path)
            self._index_error = None
        return self._index

    def read_stored(self, pack: str, offset: int, length: int):
        """Raw bytes of a pack range (no decoding); CorruptionError if the pack is short."""
        try:
            data = self.objects.get_range(pack_name(pack), offset, length) if length else b""
        except NotFound:
            raise self.pack_gone(pack) from None
        if len(data) != length:
            raise CorruptionError(f"pack {pack} is truncated: wanted {length} bytes at {offset}, "
                                  f"got {len(data)}; run `cdcstore check`")
        return memoryview(data)

    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> dict[bytes, tuple[str, PackEntry]]:
        wanted = list(chunk_ids)
        found = self._locate_known(wanted)
        if len(found) < len(wanted) and self._shared and self.anchored():
            # a repack moved chunks (a stale location record): their anchors name the new pack
            self._anchor_misses.clear()
            first = wanted[:1]  # a reader locating a file passes its first chunk first (an anchor)
            if self.find_anchored([c for c in wanted if c not in found and (anchors.is_anchor(c) or c in first)]):
                found = self._locate_known(wanted)
        if len(found) < len(wanted):
            # packs another machine wrote (a bucket), or a repack moved chunks: look at the listing
            if self.recover() or not self.objects.capabilities.local_path:
                found = self.index.locate(wanted)
        return found

    def _locate_known(self, wanted: list[bytes]) -> dict[bytes, tuple[str, PackEntry]]:
        """Locations from the index, then from location records read (no listing)."""
        found = self.index.locate(wanted)
        if len(found) < len(wanted) and self._hints:
            hints = self._hints
            found.update((c, hints[c]) for c in wanted if c not in found and c in hints)
        return found

    def load_locations(self, name: str, manifest: Manifest) -> None:
        """Learn where a manifest's chunks are from its location record (a bucket store),
        unless the index knows them all: a new machine reads a file without listing the
        bucket or reading any pack footer. One GET; a missing or damaged record is no error."""
        if not self._shared or not manifest.chunk_ids:
            return
        if len(self._locate_known(list(dict.fromkeys(manifest.chunk_ids)))) == len(set(manifest.chunk_ids)):
            return
        try:
            found = locations.decode(bytes(self.objects.get(locations_name(name))), manifest,
                                     f"location record of manifest {name}")
        except (NotFound, CorruptionError):
            return
        if len(self._hints) > HINTS_MAX:
            self._hints, self._hint_packs = {}, set()
        self._hints.update(found)
        self._hint_packs.update(p for p, _ in found.values())

    def knows_pack(self, name: str) -> bool:
        """Whether the index or a location record read names pack `name` (no listing)."""
        return name in self._hint_packs or self.index.has_pack(name)

    def pack_chunks(self, pack: str, start: int, end: int) -> list[PackEntry]:
        """Known chunks of `pack` whose bytes overlap [start, end) (index rows and location records)."""
        out = {e.chunk_id: e for e in self.index.pack_chunks(pack, start, end)}
        if pack in self._hint_packs:
            for p, e in list(self._hints.values()):
                if p == pack and e.offset < end and e.offset + e.stored_len > start:
                    out.setdefault(e.chunk_id, e)
        return sorted(out.values(), key=lambda e: e.offset)

    def _put_locations(self, manifests: list[tuple[str, Manifest]]) -> None:
        """Write each manifest's location record (a bucket store, all chunks located)."""
        if not self._shared:
            return
        where = self._locate_known(list({c for _, m in manifests for c in m.chunk_ids}))

        def put(item):
            record = locations.encode(item[1], where)
            if record is not None:
                self.objects.put(locations_name(item[0]), record, exist_ok=True)
            first = item[1].chunk_ids[0] if item[1].size >= anchors.FIRST_MIN else None
            if first is not None and first in where:  # a large file's first chunk is an anchor (core/anchors.py)
                self.objects.put(anchors.name(first, where[first][0]), b"", exist_ok=True)

        if len(manifests) <= 4:
            for item in manifests:
                put(item)
        else:
            list(runtime.pool("io", 8).map(put, manifests))

    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> bytes:
        return self.read_chunks([(pack, entry)])[entry.chunk_id]

    _run = REMOTE_RUN

    def read_chunks(self, items: list[tuple[str, PackEntry]], repo: str | None = None,
                    stored: dict | None = None) -> dict[bytes, bytes]:
        """One read per run of adjacent chunks in a pack; each chunk verified: in a bucket
        against its id (BLAKE3: bytes from a place other machines write), in a directory
        this machine writes against its entry's xxh3-64 (rot; its id was verified on write)."""
        out = {}
        trust_checks = not self._shared
        for r in plan_ranges(items, max_hole=0, max_range=self._run):
            for e, stored_bytes in slices(r, self.read_stored(r.pack, r.start, r.end - r.start)):
                try:
                    out[e.chunk_id] = decode_checked(stored_bytes, e.codec, e.raw_len, e.chunk_id,
                                                     e.check if trust_checks else None)
                except CorruptionError as err:
                    damaged = self._damaged(r.pack, e.chunk_id, err)  # its row dropped: not read again
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
        if pack in self._hint_packs:
            self._hints = {c: v for c, v in self._hints.items() if v[0] != pack}
            self._hint_packs.discard(pack)
        return PackMissingError(f"pack {pack} is missing from {self.location} (a gc or repack moved its "
                                f"chunks, or the store is damaged): read again, or run `cdcstore check`")

    def _damaged(self, pack: str, chunk_id: bytes, err) -> CorruptionError:
        """The error for a stored chunk that failed verification; its index row is dropped
        first (absent now: the next push stores it again)."""
        self.index.drop_chunks(pack, [chunk_id], damaged=True)
        return CorruptionError(f"{err} in pack {pack}: the store is damaged; run `cdcstore check`,"
                               f" or push the original files again to repair it")

    def close(self) -> None:
        """Let go of this process's connections and files (the index's sqlite connections
        too); a later use opens what it needs again."""
        self.objects.close()
        if self._index_error is None:
            self._index.close()

    # -- manifests ----------------------------------------------------------------------------
    def put_manifest(self, manifest: Manifest) -> str:
        return self.put_manifests([manifest])[0]

    def put_manifests(self, manifests: list[Manifest]) -> list[str]:
        """Store many manifests durably (written once each; on a few threads, as each put
        waits on a disk or a network, not on the GIL)."""
        encoded = [m.encode() for m in manifests]
        names = [ids.legacy_hexdigest(d) if m.version == LEGACY_MANIFEST_VERSION else ids.hexdigest(d)
                 for m, d in zip(manifests, encoded)]
        todo = dict(zip(names, encoded))

        def put(item):  # one stored before is made young again: gc's grace window covers it anew
            if not self.objects.put(manifest_name(item[0]), item[1], exist_ok=True):
                self.objects.touch(manifest_name(item[0]))

        if len(todo) <= 4:
            for item in todo.items():
                put(item)
        else:
            list(runtime.pool("io", 8).map(put, todo.items()))
        self._put_locations(list(dict(zip(names, manifests)).items()))
        self._remember_ids(zip(names, manifests))
        return names

    def _remember_ids(self, pairs) -> None:
        """Keep the chunk ids of manifests this process just stored (at most `PUT_IDS_MEMO` ids, the
        latest), so that the commit naming them need not read them back (one request each on a
        bucket). Sound whoever stored them: a manifest's name is the hash of the bytes they came from."""
        with self._put_ids_lock:
            for name, m in pairs:
                if name not in self._put_ids:
                    self._put_ids[name] = m.chunk_ids
                    self._put_ids_count += len(m.chunk_ids)
            while self._put_ids_count > PUT_IDS_MEMO and self._put_ids:
                self._put_ids_count -= len(self._put_ids.popitem(last=False)[1])

    def _written_ids(self, name: str) -> list[bytes] | None:
        """The chunk ids of a manifest this process stored lately (taken: a commit uses them once)."""
        with self._put_ids_lock:
            got = self._put_ids.pop(name, None)
            if got is not None:
                self._put_ids_count -= len(got)
            return got

    def _get_named(self, name: str, object_name: str, what: str, missing: Exception) -> bytes:
        """The bytes of an object, checked against the hash that names it."""
        try:
            data = bytes(self.objects.get(object_name))
        except NotFound:
            raise missing from None
        if not ids.matches(data, name):
            raise CorruptionError(f"{what} does not match its name (damaged)")
        return data

    def get_manifest(self, name: str, repo: str | None = None) -> Manifest:
        """A manifest, checked against its name. Decoded manifests are kept (immutable: named by
        their bytes) up to `MANIFEST_MEMO_CHUNKS` chunk entries in all, least recently used
        first out: the next range read of a file (the gateway's, a server's) decodes nothing.
        The bound is in entries, which is what a decoded manifest's memory follows; a larger
        manifest is decoded for each use and never kept."""
        with self._manifests_lock:
            m = self._manifests.get(name)
            if m is not None:
                self._manifests.move_to_end(name)
                return m
        m = self.read_manifest(name)
        self.load_locations(name, m)
        n = len(m.chunk_ids)
        if n <= MANIFEST_MEMO_CHUNKS // 4:
            with self._manifests_lock:
                if name not in self._manifests:
                    self._manifests[name] = m
                    self._manifest_chunks += n
                while self._manifest_chunks > MANIFEST_MEMO_CHUNKS:
                    _, old = self._manifests.popitem(last=False)
                    self._manifest_chunks -= len(old.chunk_ids)
        return m

    def read_manifest(self, name: str) -> Manifest:
        """A manifest read from the store now (never the memo), checked against its name."""
        data = self._get_named(name, manifest_name(name), f"manifest {name}",
                               CorruptionError(f"manifest {name} is missing from {self.location}"))
        return Manifest.decode(data, f"manifest {name}")

    # -- trees ------------------------------------------------------------------------------------
    def put_trees(self, trees: dict[str, treeobj.Tree]) -> None:
        """Store trees durably, written once each (one stored before is made young again,
        as a manifest is: gc's grace window covers it anew)."""
        def put(item):
            name, tree = item
            data = tree.encode()
            if not ids.matches(data, name):
                raise ValueError(f"tree {name} does not match its bytes")
            if not self.objects.put(tree_name(name), data, exist_ok=True):
                self.objects.touch(tree_name(name))
            self._trees[name] = tree

        if len(trees) <= 4:
            for item in trees.items():
                put(item)
        else:
            list(runtime.pool("io", 8).map(put, trees.items()))

    def get_tree(self, name: str, repo: str | None = None) -> treeobj.Tree:
        tree = self._trees.get(name)
        if tree is None:
            tree = self.read_tree(name)
            if len(self._trees) >= TREE_MEMO:
                self._trees.pop(next(iter(self._trees)))
            self._trees[name] = tree
        return tree

    def read_tree(self, name: str) -> treeobj.Tree:
        """A tree read from the store now (never the memo), checked against its name."""
        data = self._get_named(name, tree_name(name), f"tree {name}",
                               CorruptionError(f"tree {name} is missing from {self.location}"))
        return treeobj.Tree.decode(data, f"tree {name}")

    def tree_bytes(self, name: str) -> bytes:
        """A stored tree's bytes as stored (NotFound if absent)."""
        return bytes(self.objects.get(tree_name(name)))

    def tree_names(self) -> dict[str, tuple[int, float]]:
        """Every stored tree: name -> (size, mtime)."""
        out = {}
        for info in self.objects.list("trees/"):
            base = info.name.rsplit("/", 1)[-1]
            if ids.is_hex_id(base):
                out[base] = (info.size, info.mtime)
        return out

    # -- repos and refs: storage/refs.py's `Refs` (roles.RefStore) -----------------------------------
    def repos(self) -> list[str]:
        return self._refs.repos()

    def ref_names(self, repo: str) -> list[str]:
        return self._refs.ref_names(repo)

    def has_repo(self, repo: str) -> bool:
        return self._refs.has_repo(repo)

    def ensure_repo(self, repo: str) -> None:
        self._refs.ensure_repo(repo)

    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        return self._refs.resolve_ref(repo, rev)

    def delete_repo(self, repo: str, dry_run: bool = False) -> dict:
        return self._refs.delete_repo(repo, dry_run)

    def dropped_repo(self, repo: str, tombstone: str) -> None:
        """After delete-repo here: drop the access records of a server on this index
        (access.py) and record the tombstone as acted on (a reused name's new grants stay)."""
        self.index.drop_repo(repo)
        self.index.add_tombstones([tombstone])

    def forgotten(self, repo: str) -> set[str]:
        return self._refs.forgotten(repo)

    def forget(self, repo: str, commit_ids) -> None:
        self._refs.forget(repo, commit_ids)

    def _read_refs(self, repo: str, kind: str, damaged: list | None = None) -> dict[str, str]:
        return self._refs._read_refs(repo, kind, damaged)  # maintenance.py's

    def branches(self, repo: str) -> dict[str, str]:
        return self._refs.branches(repo)

    def tags(self, repo: str) -> dict[str, str]:
        return self._refs.tags(repo)

    def refs(self, repo: str, damaged: list | None = None) -> dict[str, str]:
        return self._refs.refs(repo, damaged)

    def create_ref(self, repo: str, kind: str, name: str, commit_id: str) -> None:
        self._refs.create_ref(repo, kind, name, commit_id)

    def create_tag(self, repo: str, name: str, commit_id: str) -> None:
        self._refs.create_ref(repo, "tag", name, commit_id)

    def create_branch(self, repo: str, name: str, commit_id: str) -> None:
        self._refs.create_ref(repo, "branch", name, commit_id)

    def delete_ref(self, repo: str, kind: str, name: str) -> str:
        return self._refs.delete_ref(repo, kind, name)

    def delete_tag(self, repo: str, name: str) -> str:
        return self._refs.delete_ref(repo, "tag", name)

    def delete_branch(self, repo: str, name: str) -> str:
        return self._refs.delete_ref(repo, "branch", name)

    def commit(self, commit: Commit, branch: str, expected: str | None, landed=None) -> str:
        return self._refs.commit(commit, branch, expected, landed)

    def update_branch(self, repo: str, branch: str, expected: str | None, new: str,
                      commit: Commit | None = None, landed=None) -> str:
        return self._refs.update_branch(repo, branch, expected, new, commit, landed)

    # -- commits, and what a commit adds (asked by `Refs.commit`) ---------------------------------
    def put_commit(self, commit: Commit) -> str:
        check_name("repo", commit.repo)
        data = commit.encode()
        cid = ids.hexdigest(data)  # BLAKE3: a new commit gets a 64-hex name
        self.objects.put(commit_name(commit.repo, cid), data, exist_ok=True)
        return cid

    def get_commit(self, repo: str, commit_id: str) -> Commit:
        check_name("repo", repo)
        if not ids.is_hex_id(commit_id):
            raise RevisionNotFoundError(f"no commit {commit_id!r} in repo {repo!r}")
        try:
            data = self._get_named(commit_id, commit_name(repo, commit_id), f"commit {commit_id} in repo {repo!r}",
                                   RevisionNotFoundError(f"no commit {commit_id} in repo {repo!r}"))
        except RevisionNotFoundError:
            self._refs.require_repo(repo)
            raise
        return self.bound(repo, Commit.decode(data, f"commit {commit_id}"))

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

    def new_reach(self, commit: Commit) -> tuple[set[str], set[str], set[bytes]]:
        """The trees and manifests a commit names that its parent does not, and their chunks.
        Only what is new since the parent is walked: the trees whose ids differ, and the
        files in them."""
        parent = None
        if commit.parent:
            try:
                pc = self.get_commit(commit.repo, commit.parent)
                # a format 1 parent's trees were granted to no one: walk all of this commit's
                parent = self.view(commit.repo, pc) if pc.tree is not None else None
            except CdcError:
                pass
        trees: set[str] = set()
        view = self.view(commit.repo, commit)
        changed, _ = treeobj.changes(parent, view, trees)
        names = {f.manifest for f in changed.values()}
        chunk_ids: set[bytes] = set()
        for n in names:  # in slices: memory follows the new distinct chunks, not the manifests' sizes
            known = self._written_ids(n)
            if known is not None:  # stored by this process moments ago: not read back
                chunk_ids.update(known)
                continue
            for part in ManifestFile(self, n).scan():
                chunk_ids.update(part)
        return trees - set(view.unstored), names, chunk_ids

    def replace_damaged_index(self) -> None:
        """Move an index file sqlite cannot read aside (<index>.damaged) and start an empty one."""
        path = self.index_path
        os.replace(path, path + ".damaged")
        for suffix in ("-wal", "-shm"):
            with _suppress_not_found():
                os.unlink(path + suffix)
        self._index = ChunkIndex(path)
        self._index_error = None


class LocalStore(Repository):
    """A store in a local directory (its chunk index inside it). `LocalStore.init` creates one.

    Reads use os.pread on descriptors kept open per process, never mmap: a pack truncated
    under a reader gives a short read (a CorruptionError), not a SIGBUS."""

    capabilities = BackendCapabilities(local_reads=True, runs_here=True, reads_runs=True)

    _run = LOCAL_RUN

    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        if not os.path.isdir(self.root):
            raise NotAStoreError(f"no store at {self.root}: create one with `cdcstore init --store {self.root}`")
        if not os.path.exists(os.path.join(self.root, MARKER)):
            check_marker(None, self.root)
        super().__init__(LocalObjects(self.root), os.path.join(self.root, "index.sqlite"), self.root)
        self._fds = runtime.Local()  # pack name -> open descriptor, this process's (the parent's stay theirs)
        self._fd_lock = runtime.Lock()

    @classmethod
    def init(cls, root: str, exist_ok: bool = False) -> "LocalStore":
        root = os.path.abspath(os.path.expanduser(root))
        if os.path.exists(os.path.join(root, MARKER)):
            if exist_ok:
                return cls(root)
            raise FileExistsError(f"a store already exists at {root}")
        if os.path.isdir(root) and os.listdir(root):
            raise NotAStoreError(f"{root} is not empty: create the store in a new or empty directory")
        for sub in ("packs", "manifests", "trees", "repos", "tmp"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        ChunkIndex(os.path.join(root, "index.sqlite"))
        Repository.create(LocalObjects(root), os.path.join(root, "index.sqlite"), root, exist_ok=exist_ok)
        return cls(root)

    def tmp_path(self) -> str:
        return os.path.join(self.root, "tmp", f"{os.getpid()}-{secrets.token_hex(8)}.tmp")

    def pack_path(self, name: str) -> str:
        return self.objects.local_path(pack_name(name))

    def manifest_path(self, name: str) -> str:
        return self.objects.local_path(manifest_name(name))

    def pack_size(self, name: str) -> int:
        try:
            return os.path.getsize(self.pack_path(name))
        except FileNotFoundError:
            raise NotFound(f"no pack {name}") from None

    def _fd(self, pack: str) -> int:
        """An open descriptor of a pack (per process; at most MAX_OPEN kept open)."""
        with self._fd_lock:
            fds = self._fds.get(collections.OrderedDict)
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

    def read_stored(self, pack: str, offset: int, length: int):
        """Raw bytes of a pack range (no decoding); CorruptionError if the pack is short."""
        data = os.pread(self._fd(pack), length, offset) if offset >= 0 else b""
        if len(data) < length and data:  # a short read that is not the end of the file
            data += self._read_rest(pack, offset + len(data), length - len(data))
        if len(data) != length:
            raise CorruptionError(f"pack {pack} is truncated: wanted {length} bytes at {offset}, "
                                  f"got {len(data)}; run `cdcstore check`")
        return memoryview(data)

    def read_run_into(self, pack: str, offset: int, out: memoryview, chunk_ids: list[bytes],
                      lengths: list[int], checks: list | None = None) -> None:
        """Raw chunks that sit back to back in a pack from `offset`, read straight into
        `out` (one copy, from the page cache) and each checked there: against its pack
        entry's xxh3-64 checksum when `checks` gives them (this store's own pack, whose ids
        were verified when it was written or received), else against its id."""
        fd, got = self._fd(pack), 0
        while got < len(out):  # preadv may return less than asked before the end
            n = os.preadv(fd, [out[got:]], offset + got)
            if not n:
                raise CorruptionError(f"pack {pack} is truncated: wanted {len(out)} bytes at {offset}, "
                                      f"got {got}; run `cdcstore check`")
            got += n
        bad = first_mismatch(out, chunk_ids, lengths, checks)
        if bad >= 0:
            raise self._damaged(pack, chunk_ids[bad], f"chunk {chunk_ids[bad].hex()} does not match its id"
                                                      f"{' (its checksum differs)' if checks else ''}")

    def index_stamp(self) -> tuple:
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
            for fd in (self._fds.here() or {}).values():
                os.close(fd)
            self._fds.clear()
        super().close()


def is_object_url(location: str) -> bool:
    return location.startswith(("s3://", "memory://"))


def open_repository(location: str, create: bool = False) -> Repository:
    """The store at a directory path or an object store URL (`s3://BUCKET/PREFIX`)."""
    if not is_object_url(location):
        return LocalStore.init(location, exist_ok=True) if create else LocalStore(location)
    objects = open_objects(location)
    index = default_index_path(objects.identity)
    if create:
        return Repository.create(objects, index, location, exist_ok=True)
    return Repository(objects, index, location)


def no_such_path(addr_repo: str, rev: str, path: str) -> PathNotFoundError:
    return PathNotFoundError(f"no file or folder {path!r} in cdc://{addr_repo}@{rev}/: "
                             f"list what is there with `cdcstore ls cdc://{addr_repo}@{rev}/`")

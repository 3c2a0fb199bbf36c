"""The repository: packs, manifests, commits and refs over a dumb object store.

One layer owns every format on top of `objects.ObjectStore` (a directory, a bucket,
memory). `Repository` is composed of its roles, each in a module of its own: the pack store
and the chunk index (`packs.Packs`, with a bucket's hints: hints.py), the metadata objects
(`metadata.Metadata`), the refs and the compare-and-swap commit (`refs.Refs`), and the
upkeep (maintenance.py, commands.py, staging.py). Object names (store format v1, docs/format.md):

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

import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import tempfile
from typing import Any, Callable, ContextManager, Iterable, Mapping, Sequence

import platformdirs

from .. import runtime
from ..core import treeobj
from ..core.commit import Commit
from ..core.errors import NotAStoreError, PathNotFoundError, StoreFormatError
from ..core.manifest import Manifest
from ..core.pack import PackEntry
from . import commands, maintenance, open_objects, staging
from .backend import Backend, BackendCapabilities
from .hints import ANCHORED
from .index import ChunkIndex
from .local import LocalObjects
from .metadata import Metadata
from .names import manifest_name, pack_name  # noqa: F401 (names: the layout)
from .objects import Conflict, NotFound, ObjectStore
from .packs import LocalPacks, Packs
from .refs import DELETED, Added, Refs  # noqa: F401 (DELETED: access.py's)
from .roles import Raw, ViaRefStore

STORE_FORMAT = "cdcstore"
STORE_VERSION = 1
MARKER = "cdcstore.json"


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


def default_index_path(identity: str) -> str:
    """Where the chunk index of a bucket store lives on this machine (a rebuildable cache),
    keyed by the store's full identity (`ObjectStore.identity`: endpoint, bucket, prefix)."""
    key = hashlib.blake2b(identity.encode(), digest_size=8).hexdigest()
    return os.path.join(platformdirs.user_cache_dir("cdcstore"), "index", f"{key}.sqlite")


class Repository(ViaRefStore, Backend):
    """A store over an object store, with its chunk index at `index_path`, composed of its roles:
    `packs` (chunks, packs and the index), `metadata` (manifests, trees, commits) and the refs;
    the upkeep runs here (`admin`, `push_session`, `journal`). It answers the `Backend` roles
    (and what `Refs` asks of its host) by passing each call to the role object, written out
    below; a caller that needs anything else of a role takes the role (`repo.packs.recover()`,
    `repo.metadata.read_bundle(...)`, `repo.ref_store.delete_repo(...)`).

    `open_repository(url)` opens one by location; `LocalStore` is the directory form.
    """

    capabilities = BackendCapabilities(local_reads=True, runs_here=True)
    pack_store = Packs  # the pack store's kind (a directory's reads its packs with pread)
    ref_store: Refs

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
        self._shared = not objects.capabilities.local_path  # a bucket: other machines write it too
        self.packs = self.pack_store(self, index_path)
        if self._shared:
            self.capabilities = dataclasses.replace(self.capabilities, bundles=True, doubts_foreign_packs=True)
            self.packs.adopt_store(self.store_id)  # an index of another store by that name is emptied
        self.ref_store = Refs(self)  # repos, branches, tags, commit by compare-and-swap
        self.metadata = Metadata(self, self.packs.hints, self.ref_store)

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

    @property
    def on_local_disk(self) -> bool:
        """Its objects are files on this machine (a directory store), not objects held remotely."""
        return self.objects.capabilities.local_path

    @property
    def shared(self) -> bool:
        """Other machines write this store too (a bucket), so what this index holds may lag."""
        return self._shared

    @property
    def index(self) -> ChunkIndex:
        """The chunk index (`packs.index`)."""
        return self.packs.index

    def totals(self) -> dict[str, int]:
        return self.index.totals()

    def counters(self) -> dict[str, int]:
        """Requests and body bytes to and from a bucket, this process (zeros for a directory)."""
        return self.objects.counters() or super().counters()

    def reach_stale(self) -> bool:
        """The index predates chunk-level access records (storage/index.py): rebuild it once."""
        return self.index.reach_stale()

    def dropped_repo(self, repo: str, tombstone: str) -> None:
        """After delete-repo here: drop the access records of a server on this index
        (access.py) and record the tombstone as acted on (a reused name's new grants stay)."""
        self.index.drop_repo(repo)
        self.index.add_tombstones([tombstone])

    # -- the roles' answers (Backend, and refs.RefHost: put_commit, new_reach, require_stored) ----
    def present(self, chunk_ids: list[bytes]) -> set[bytes]:
        """`packs.present`."""
        return self.packs.present(chunk_ids)

    def present_or_prove(self, chunks: dict[bytes, bytes], firsts: Iterable[bytes] = (),
                         vouched: Callable[[set[bytes]], set[bytes]] | None = None) -> set[bytes]:
        """`packs.present_or_prove`."""
        return self.packs.present_or_prove(chunks, firsts, vouched)

    def add_pack(self, tmp: str, name: str, entries: list[PackEntry]) -> None:
        """`packs.add_pack`."""
        self.packs.add_pack(tmp, name, entries)

    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> dict[bytes, tuple[str, PackEntry]]:
        """`packs.locate`."""
        return self.packs.locate(chunk_ids, repo)

    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> Raw:
        """`packs.read_chunk`."""
        return self.packs.read_chunk(pack, entry, repo)

    def read_chunks(self, items: list[tuple[str, PackEntry]], repo: str | None = None,
                    stored: dict[bytes, bytes] | None = None) -> Mapping[bytes, Raw]:
        """`packs.read_chunks`."""
        return self.packs.read_chunks(items, repo, stored)

    def require_stored(self, chunk_ids: Iterable[bytes]) -> None:
        """`packs.require_stored`."""
        self.packs.require_stored(chunk_ids)

    def manifests_present(self, repo: str, names: list[str]) -> set[str]:
        """`metadata.manifests_present`."""
        return self.metadata.manifests_present(repo, names)

    def put_manifests(self, manifests: list[Manifest]) -> list[str]:
        """`metadata.put_manifests`."""
        return self.metadata.put_manifests(manifests)

    def get_manifest(self, name: str, repo: str | None = None) -> Manifest:
        """`metadata.get_manifest`."""
        return self.metadata.get_manifest(name, repo)

    def get_tree(self, name: str, repo: str | None = None) -> treeobj.Tree:
        """`metadata.get_tree`."""
        return self.metadata.get_tree(name, repo)

    def put_trees(self, trees: dict[str, treeobj.Tree]) -> None:
        """`metadata.put_trees`."""
        self.metadata.put_trees(trees)

    def get_commit(self, repo: str, commit_id: str) -> Commit:
        """`metadata.get_commit`."""
        return self.metadata.get_commit(repo, commit_id)

    def put_commit(self, commit: Commit) -> str:
        """`metadata.put_commit`."""
        return self.metadata.put_commit(commit)

    def new_reach(self, commit: Commit) -> tuple[set[str], set[str], set[bytes]]:
        """`metadata.new_reach`."""
        return self.metadata.new_reach(commit)

    def learn_bundles(self, pairs: Iterable[tuple[str, str]]) -> None:
        """`metadata.learn_bundles`."""
        self.metadata.learn_bundles(pairs)

    def bundle_of(self, name: str) -> str | None:
        """`metadata.bundle_of`."""
        return self.metadata.bundle_of(name)

    def bundle_run(self) -> ContextManager[object]:
        """`metadata.bundle_run`."""
        return self.metadata.bundle_run()

    # the other ref calls: roles.ViaRefStore; these two say more than the role does
    def commit(self, commit: Commit, branch: str, expected: str | None,
               landed: Callable[[Commit, Added], object] | None = None) -> str:
        """`ref_store.commit`, with `landed` (`Refs.commit`)."""
        return self.ref_store.commit(commit, branch, expected, landed)

    def forgotten(self, repo: str) -> set[str]:
        """`ref_store.forgotten` (a repository can always list them)."""
        return self.ref_store.forgotten(repo)











    # -- upkeep (roles.Upkeep: runs_here) and what a server asks of its store ----------------
    def admin(self, command: str, **options: Any) -> Any:
        """Run a maintenance command here (storage/commands.py): gc, check, forget, delete-repo,
        rebuild-index, recover."""
        return commands.run(self, command, **options)

    def push_session(self) -> maintenance.PushSession:
        """This process's push-session marker (maintenance.PushSession)."""
        return maintenance.PushSession(self)

    def journal(self) -> staging.Journal:
        return staging.Journal(self)

    def session_marker(self, name: str) -> bytes:
        """A push session's marker object (`maintenance.PushSession.name`); NotFound if absent."""
        return bytes(self.objects.get(name))

    def begin_push(self) -> None:
        """Before a push: clean temp files; bring the index up to the listing, unless the
        store's anchors let the push find what it shares as it goes (a bucket store)."""
        self.clean_tmp()
        self.packs.bound()
        self.packs.anchors.forget_misses()
        if not (self._shared and self.packs.anchors.anchored()):
            self.packs.recover()

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

    def close(self) -> None:
        """Let go of this process's connections and files (the index's sqlite connections
        too); a later use opens what it needs again."""
        self.objects.close()
        self.packs.close()


class LocalStore(Repository):
    """A store in a local directory (its chunk index inside it). `LocalStore.init` creates one.
    Its packs are read with pread (`packs.LocalPacks`), never mmap."""

    capabilities = BackendCapabilities(local_reads=True, runs_here=True, reads_runs=True)
    pack_store = LocalPacks
    packs: LocalPacks
    objects: LocalObjects

    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        if not os.path.isdir(self.root):
            raise NotAStoreError(f"no store at {self.root}: create one with `cdcstore init --store {self.root}`")
        if not os.path.exists(os.path.join(self.root, MARKER)):
            check_marker(None, self.root)
        super().__init__(LocalObjects(self.root), os.path.join(self.root, "index.sqlite"), self.root)

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

    def manifest_path(self, name: str) -> str:
        return self.objects.local_path(manifest_name(name))

    # -- roles.ChunkSource, reads_runs: its packs are files here
    def read_run_into(self, pack: str, offset: int, out: memoryview, chunk_ids: Sequence[bytes],
                      lengths: Sequence[int], checks: Sequence[int | None] | None = None) -> None:
        """`packs.read_run_into`."""
        self.packs.read_run_into(pack, offset, out, chunk_ids, lengths, checks)

    def run_fd(self, pack: str) -> int:
        """`packs.run_fd` (a window's native fill ahead, `window.ReadWindow`)."""
        return self.packs.run_fd(pack)

    def read_mixed_into(self, pack: str, parts: Sequence[tuple[int, PackEntry]], out: memoryview) -> None:
        """`packs.read_mixed_into`."""
        self.packs.read_mixed_into(pack, parts, out)

    def index_stamp(self) -> tuple[object, ...]:
        """`packs.index_stamp`."""
        return self.packs.index_stamp()


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

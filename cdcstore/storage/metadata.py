"""The metadata objects of a store: manifests, trees and commits, immutable and named by their hashes.

`Metadata` plays `roles.MetadataStore` for a `repository.Repository`: it writes each object
once (one stored before is made young again, so gc's grace window covers it anew), reads it
checked against its name, keeps decoded trees and manifests (bounded), and says what a commit
adds to its parent (`new_reach`, asked by `refs.Refs.commit`). Object names (docs/format.md):

    manifests/ab/<name>                    file manifests
    bundles/ab/<id>                        many small files' manifests (a bucket store's pushes;
                                           storage/bundles.py)
    trees/ab/<name>                        trees (one folder of a format 2 commit)
    repos/<repo>/commits/<id>.json         commits, named by BLAKE3-256 of their JSON

(storage/memo.py is another thing: the metadata a *process* keeps of any store, remote ones too.)
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING, ContextManager, Iterable, Protocol, Sequence

from .. import runtime
from ..core import bundle, ids, treeobj
from ..core.address import check_name
from ..core.commit import Commit
from ..core.errors import CdcError, CorruptionError, RevisionNotFoundError
from ..core.manifest import LEGACY_MANIFEST_VERSION, Manifest
from .bundles import Bundles
from .manifest_file import ManifestFile, ManifestMissing
from .names import manifest_name, tree_name
from .objects import NotFound, ObjectStore
from .refs import commit_name
from .roles import BackendCapabilities

if TYPE_CHECKING:
    from .hints import LocationHints
    from .refs import Refs

TREE_MEMO = 4096  # trees kept decoded per process (immutable: named by their bytes)
MANIFEST_MEMO_CHUNKS = 1 << 18  # chunk entries of decoded manifests kept per store (~40 MB at most; see `get_manifest`)
PUT_IDS_MEMO = 1 << 18  # chunk ids of just-stored manifests kept for their commit (about 25 MB at most)


class MetadataHost(Protocol):
    """What `Metadata` asks of the repository it serves (read at each call: `objects` may be
    replaced): its objects, where chunk locations go (`packs.hints`), and the commit view."""

    objects: ObjectStore
    location: str
    capabilities: BackendCapabilities  # with `metadata` (this object): what `ManifestFile` reads through

    @property
    def shared(self) -> bool: ...  # a bucket: pushes bundle small files' manifests

    @property
    def metadata(self) -> Metadata: ...

    def get_commit(self, repo: str, commit_id: str) -> Commit: ...

    def view(self, repo: str, commit: Commit) -> treeobj.View: ...

    def bound(self, repo: str, commit: Commit) -> Commit: ...


class Metadata:
    """Manifests, trees and commits of one store (`roles.MetadataStore`)."""

    def __init__(self, host: MetadataHost, hints: LocationHints, refs: Refs):
        self._host = host
        self._hints = hints  # hints.LocationHints: manifests' location records
        self._refs = refs  # refs.Refs: a missing commit of a missing repo says so
        self._trees: collections.OrderedDict[str, treeobj.Tree] = collections.OrderedDict()  # `_keep_tree`
        self._trees_lock = runtime.Lock()
        self._manifests: collections.OrderedDict[str, Manifest] = collections.OrderedDict()  # `get_manifest`
        self._manifest_chunks = 0  # chunk entries held by `_manifests`
        self._manifests_lock = runtime.Lock()
        self._put_ids: collections.OrderedDict[str, Sequence[bytes]] = collections.OrderedDict()  # see `_written_ids`
        self._put_ids_count = 0
        self._put_ids_lock = runtime.Lock()
        self.bundles = Bundles(host)

    @property
    def objects(self) -> ObjectStore:
        return self._host.objects

    def _get_named(self, name: str, object_name: str, what: str, missing: Exception) -> bytes:
        """The bytes of an object, checked against the hash that names it."""
        try:
            data = bytes(self.objects.get(object_name))
        except NotFound:
            raise missing from None
        if not ids.matches(data, name):
            raise CorruptionError(f"{what} does not match its name (damaged)")
        return data

    # -- manifests ----------------------------------------------------------------------------
    def _in_bundle(self, name: str) -> bool:
        """Whether the bundle a pointer names holds the manifest (a damaged one does not)."""
        try:
            return self.bundles.take(name) is not None
        except CorruptionError:
            return False

    def has_manifest(self, name: str) -> bool:
        return self._in_bundle(name) or self.objects.exists(manifest_name(name)) or \
            (self._host.shared and bool(self.bundles.find([name])) and self._in_bundle(name))

    def manifests_present(self, repo: str, names: list[str]) -> set[str]:
        """Which of these manifests are stored (a look at each object, then one look through
        the bundles for the rest; `repo` is not checked)."""
        names = list(dict.fromkeys(names))
        found = {n for n in names if self._in_bundle(n)}
        rest = [n for n in names if n not in found]
        exists = lambda n: self.objects.exists(manifest_name(n))
        held = runtime.pool("io", 8).map(exists, rest) if len(rest) > 1 else map(exists, rest)
        found.update(n for n, ok in zip(rest, list(held)) if ok)
        rest = [n for n in rest if n not in found]
        if rest and self._host.shared:
            found.update(n for n in self.bundles.find(rest) if self._in_bundle(n))
        return found

    def learn_bundles(self, pairs: Iterable[tuple[str, str | None]]) -> None:
        """Remember which bundle holds which manifest: (manifest, bundle) pairs, e.g. from
        entries a caller hands in (a hint: every manifest is checked against its name)."""
        self.bundles.learn(pairs)

    def bundle_run(self) -> ContextManager[None]:
        """A context in which each manifest bundle is read from the store once (`Bundles.run`):
        check, gc and a push run inside one."""
        return self.bundles.run()

    def read_bundle(self, bid: str) -> dict[str, tuple[bytes, bytes]] | None:
        """A stored bundle's entries read now (once per `bundle_run`), checked; None if absent."""
        return self.bundles.read(bid, fresh=True)

    def bundle_of(self, name: str) -> str | None:
        """The bundle this store's pointers say holds a manifest (None: its own object, or unknown)."""
        return self.bundles.where(name)

    def bundled_manifest(self, name: str, search: bool = False) -> bytes | None:
        """A manifest's bytes from the bundle a pointer names (checked against its name), or
        None; `search`: look through the store's bundles when no pointer is known."""
        got = self.bundles.take(name)
        if got is None and search and self._host.shared and self.bundles.find([name]):
            got = self.bundles.take(name)
        return got[0] if got else None

    def put_manifest_file(self, name: str, path: str) -> None:
        """Store a manifest received into a local file (its name checked by the caller); one
        stored before is made young again, as `put_manifests` does."""
        if not self.objects.put_file(manifest_name(name), path, exist_ok=True):
            self.objects.touch(manifest_name(name))

    def manifest_file(self, name: str) -> str | None:
        return self.objects.local_path(manifest_name(name)) if self.objects.capabilities.local_path else None

    def manifest_bytes(self, name: str) -> bytes:
        """A stored manifest's bytes as stored (NotFound if absent)."""
        try:
            return self._stored(name)[0]
        except ManifestMissing:  # damage is raised as it is
            raise NotFound(manifest_name(name)) from None

    def put_manifest(self, manifest: Manifest) -> str:
        return self.put_manifests([manifest])[0]

    def put_manifests(self, manifests: list[Manifest]) -> list[str]:
        """Store many manifests durably (written once each; on a few threads, as each put
        waits on a disk or a network, not on the GIL). In a bucket, small ones go into
        bundles with their location records (`bundle_of` names them after)."""
        encoded = [m.encode() for m in manifests]
        names = [ids.legacy_hexdigest(d) if m.version == LEGACY_MANIFEST_VERSION else ids.hexdigest(d)
                 for m, d in zip(manifests, encoded)]
        todo = dict(zip(names, zip(manifests, encoded)))
        if self._host.shared:
            small = {n: v for n, v in todo.items() if v[0].version != LEGACY_MANIFEST_VERSION and bundle.fits(v[1])}
            if small:
                pairs = [(n, m) for n, (m, _) in small.items()]
                records = self._hints.records(pairs)
                self.bundles.put([(n, d, records.get(n, b"")) for n, (_, d) in small.items()])
                self._hints.put_first_anchors(pairs)
                todo = {n: v for n, v in todo.items() if n not in small}

        # one stored before is made young again: gc's grace window covers it anew
        def put(item: tuple[str, tuple[Manifest, bytes]]) -> None:
            if not self.objects.put(manifest_name(item[0]), item[1][1], exist_ok=True):
                self.objects.touch(manifest_name(item[0]))

        if len(todo) <= 4:
            for item in todo.items():
                put(item)
        else:
            list(runtime.pool("io", 8).map(put, todo.items()))
        self._hints.put_locations([(n, m) for n, (m, _) in todo.items()])
        self._remember_ids(zip(names, manifests))
        return names

    def _remember_ids(self, pairs: Iterable[tuple[str, Manifest]]) -> None:
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

    def _written_ids(self, name: str) -> Sequence[bytes] | None:
        """The chunk ids of a manifest this process stored lately (taken: a commit uses them once)."""
        with self._put_ids_lock:
            got = self._put_ids.pop(name, None)
            if got is not None:
                self._put_ids_count -= len(got)
            return got

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
        data, record = self._stored(name)
        m = Manifest.decode(data, f"manifest {name}")
        if record is None:
            self._hints.load_locations(name, m)
        else:
            self._hints.learn_record(name, m, record)
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
        return Manifest.decode(self._stored(name, fresh=True)[0], f"manifest {name}")

    def _stored(self, name: str, fresh: bool = False) -> tuple[bytes, bytes | None]:
        """A manifest's bytes, checked against its name, and its location record when it came
        from a bundle (None: its own object): from the bundle a pointer names, else its own
        object, else a look through the store's bundles."""
        damage = None
        try:
            got = self.bundles.take(name, fresh)
        except CorruptionError as e:  # the bundle its pointer names is damaged: reported unless found elsewhere
            got, damage = None, e
        if got is not None:
            return got
        missing = damage or ManifestMissing(f"manifest {name} is missing from {self._host.location}")
        try:
            return self._get_named(name, manifest_name(name), f"manifest {name}", missing), None
        except CorruptionError as e:
            if e is not missing or not self._host.shared or not self.bundles.find([name]):
                raise
        got = self.bundles.take(name, fresh)
        if got is None:
            raise missing
        return got

    # -- trees ------------------------------------------------------------------------------------
    def put_trees(self, trees: dict[str, treeobj.Tree]) -> None:
        """Store trees durably, written once each (one stored before is made young again,
        as a manifest is: gc's grace window covers it anew)."""
        def put(item: tuple[str, treeobj.Tree]) -> None:
            name, tree = item
            data = tree.encode()
            if not ids.matches(data, name):
                raise ValueError(f"tree {name} does not match its bytes")
            if not self.objects.put(tree_name(name), data, exist_ok=True):
                self.objects.touch(tree_name(name))
            self._keep_tree(name, tree)

        if len(trees) <= 4:
            for item in trees.items():
                put(item)
        else:
            list(runtime.pool("io", 8).map(put, trees.items()))

    def get_tree(self, name: str, repo: str | None = None) -> treeobj.Tree:
        with self._trees_lock:
            tree = self._trees.get(name)
            if tree is not None:
                self._trees.move_to_end(name)
                return tree
        tree = self.read_tree(name)
        self._keep_tree(name, tree)
        return tree

    def _keep_tree(self, name: str, tree: treeobj.Tree) -> None:
        """Keep a decoded tree, at most `TREE_MEMO`, least recently used first out (under a lock:
        the web view and the gateway ask from many threads at once)."""
        with self._trees_lock:
            self._trees[name] = tree
            self._trees.move_to_end(name)
            while len(self._trees) > TREE_MEMO:
                self._trees.popitem(last=False)

    def read_tree(self, name: str) -> treeobj.Tree:
        """A tree read from the store now (never the memo), checked against its name."""
        data = self._get_named(name, tree_name(name), f"tree {name}",
                               CorruptionError(f"tree {name} is missing from {self._host.location}"))
        tree = treeobj.Tree.decode(data, f"tree {name}")
        self.bundles.learn(tree.bundled())
        return tree

    def tree_bytes(self, name: str) -> bytes:
        """A stored tree's bytes as stored (NotFound if absent)."""
        return bytes(self.objects.get(tree_name(name)))

    def tree_names(self) -> dict[str, tuple[int, float | None]]:
        """Every stored tree: name -> (size, mtime)."""
        out = {}
        for info in self.objects.list("trees/"):
            base = info.name.rsplit("/", 1)[-1]
            if ids.is_hex_id(base):
                out[base] = (info.size, info.mtime)
        return out

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
        return self._host.bound(repo, Commit.decode(data, f"commit {commit_id}"))

    def new_reach(self, commit: Commit) -> tuple[set[str], set[str], set[bytes]]:
        """The trees and manifests a commit names that its parent does not, and their chunks.
        Only what is new since the parent is walked: the trees whose ids differ, and the
        files in them."""
        host = self._host
        parent = None
        if commit.parent:
            try:
                pc = host.get_commit(commit.repo, commit.parent)
                # a format 1 parent's trees were granted to no one: walk all of this commit's
                parent = host.view(commit.repo, pc) if pc.tree is not None else None
            except CdcError:
                pass
        trees: set[str] = set()
        view = host.view(commit.repo, commit)
        changed, _ = treeobj.changes(parent, view, trees)
        names = {f.manifest for f in changed.values()}
        chunk_ids: set[bytes] = set()
        for n in names:  # in slices: memory follows the new distinct chunks, not the manifests' sizes
            known = self._written_ids(n)
            if known is not None:  # stored by this process moments ago: not read back
                chunk_ids.update(known)
                continue
            with self._manifests_lock:
                m = self._manifests.get(n)
            if m is not None:  # decoded moments ago (the commit's entry check), verified: not read again
                chunk_ids.update(m.chunk_ids)
                continue
            for part in ManifestFile(host, n).scan():
                chunk_ids.update(part)
        return trees - set(view.unstored), names, chunk_ids

"""The roles a store plays, each a small protocol: what a consumer may rely on.

- `ChunkSource`: locate chunks and read them (the reader, storage/reader.py).
- `ChunkSink`: which chunks are held, and packs added durably (the writer, engine/ingest.py).
- `MetadataStore`: manifests, trees and commits, immutable and named by their hashes.
- `RefStore`: repos, branches and tags, moved by compare-and-swap.
- `Upkeep`: push sessions, job journals and the maintenance commands, where the store is.

`backend.Backend` is their composition (what `Store` holds). A consumer is annotated with the
narrowest role it uses; a third party implements a role by shape (these are `typing.Protocol`s)
or by subclassing it to inherit the default bodies. What differs between implementations is
declared in `capabilities` (`BackendCapabilities`), never found by probing the object
(docs/architecture.md, "Backends and capabilities"; tests/test_roles.py enforces it).
A store composed of role objects passes each role call on to the object that plays it, in a
method written out (`Repository`, `RemoteStore`, `overlay.Overlay`): grep and a type checker
follow every call.
"""
from __future__ import annotations

import contextlib
import dataclasses
import concurrent.futures
from typing import Any, Callable, ContextManager, Iterable, Mapping, Protocol, Sequence

from ..core import treeobj
from ..core.commit import Commit
from ..core.errors import InvalidAddressError
from ..core.manifest import Manifest
from ..core.pack import PackEntry

class Undeclared(NotImplementedError):
    """A call a store answers only with a capability it does not declare (a default body)."""


Raw = bytes | memoryview  # a chunk's raw bytes (a directory store's: a view of what it read)
Places = dict[bytes, list[tuple[int, int, int]]]  # chunk id -> (dest, lo, hi): out[dest:...] = chunk[lo:hi]
Located = dict[bytes, tuple[str, PackEntry]]  # chunk id -> (pack, entry), as `locate` answers


@dataclasses.dataclass(frozen=True)
class BackendCapabilities:
    """What a store declares about itself, so that callers never probe it.

    local_reads: chunks are located and read on this machine (a local sqlite index, a
      directory or the store's own bucket): locating a whole file at once is cheap.
      False for a server, where locate is a request and goes by blocks.
    counts_requests: `counters()` reports the requests and bytes this client sent.
    proves_possession: `present_or_prove` may prove held bytes instead of sending them.
    remote_admin: the store's side runs gc, check, forget and delete-repo (`admin`) and
      keeps push sessions (`push_session`): a server.
    runs_here: maintenance (`admin`: gc, check, forget, delete-repo, rebuild-index, recover),
      push sessions and job journals run in this process over the store's own objects: a
      directory or a bucket. A commit's entries are checked here against the stored manifests.
    reads_into: `read_chunks_into` writes chunks straight into a caller's buffer (ranges
      received where their bytes go): a server, or the chunk cache in front of a store.
    reads_runs: `read_run_into` reads a run of raw chunks from a pack on this machine's disk
      into a caller's buffer (one pread) and checks them there: a directory store. Its packs
      are local files, so a pull does not seed from an older local copy of a file.
    The reader (storage/reader.py) picks its read strategy from these two.
    bundles: small files' manifests may be stored in manifest bundles (a bucket store, or a
      server over one, which names them in its answer to a put):
      `bundle_of(name)` names the bundle a push put a manifest in (for its tree entry), and
      `learn_bundles(pairs)` takes (manifest, bundle) pointers read elsewhere.
    doubts_foreign_packs: `present_or_prove` reads a chunk held only in packs another machine
      wrote before a push may deduplicate against it (a bucket store), unless the writer's
      `vouched` says a landed commit reaches it (trust by history, docs/protocol.md).
    """

    local_reads: bool = False
    counts_requests: bool = False
    proves_possession: bool = False
    remote_admin: bool = False
    runs_here: bool = False
    reads_into: bool = False
    reads_runs: bool = False
    bundles: bool = False
    doubts_foreign_packs: bool = False


class ChunkSource(Protocol):
    """Where chunks are and their verified bytes. Only `locate` and `read_chunk` are needed;
    the rest have default bodies built on them."""

    capabilities: BackendCapabilities

    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> Located:
        """(pack, entry) of each chunk found; chunks not found are left out."""
        ...

    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> Raw:
        """One chunk's raw bytes, verified against its id."""
        ...

    def read_chunks(self, items: list[tuple[str, PackEntry]], repo: str | None = None,
                    stored: dict[bytes, bytes] | None = None) -> Mapping[bytes, Raw]:
        """Decoded, verified chunks by id (a remote store merges ranges). `stored`, if
        given, may receive chunks' stored bytes (for a cache)."""
        return {e.chunk_id: self.read_chunk(p, e, repo) for p, e in items}

    def read_chunks_into(self, items: list[tuple[str, PackEntry]], places: Places, out: memoryview,
                         repo: str | None = None, *, stored: dict[bytes, bytes] | None = None,
                         keep: memoryview | None = None) -> None:
        """Verified chunks written into `out`: `places[chunk_id]` lists (dest, lo, hi),
        meaning out[dest:dest + hi - lo] = chunk[lo:hi]. The default reads them whole and
        copies; a source declaring `reads_into` receives them in place. `stored`, as for
        `read_chunks`; `keep`, a spare buffer the source may receive whole chunks in."""
        for cid, raw in self.read_chunks(items, repo, stored).items():
            for dest, lo, hi in places.get(cid, ()):
                out[dest:dest + hi - lo] = raw[lo:hi]

    def read_run_into(self, pack: str, offset: int, out: memoryview, chunk_ids: Sequence[bytes],
                      lengths: Sequence[int], checks: Sequence[int | None] | None = None) -> None:
        """Raw chunks back to back in a pack from `offset`, read into `out` and checked
        there; only a source declaring `reads_runs` is asked."""
        raise Undeclared(f"{type(self).__name__} does not declare reads_runs")

    def read_mixed_into(self, pack: str, parts: Sequence[tuple[int, PackEntry]], out: memoryview) -> None:
        """Chunks back to back in one pack, raw and compressed (`parts`: (dest, entry) in pack
        order), each verified and landed whole at out[dest:dest + raw_len] (a compressed one
        decoded there). A source declaring `reads_runs` reads them in one go; this default asks
        `read_chunks`."""
        got = self.read_chunks([(pack, e) for _, e in parts])
        for dest, e in parts:
            out[dest:dest + e.raw_len] = got[e.chunk_id]

    def index_stamp(self) -> tuple[object, ...]:
        """Changes whenever what `locate` answers may have changed (asked with `reads_runs`)."""
        raise Undeclared(f"{type(self).__name__} does not declare reads_runs")


class ChunkSink(Protocol):
    """Which chunks are held, and packs added durably (the write order of invariant 2)."""

    capabilities: BackendCapabilities

    def present(self, chunk_ids: list[bytes]) -> set[bytes]:
        ...

    def present_or_prove(self, chunks: dict[bytes, bytes], firsts: Iterable[bytes] = (),
                         vouched: Callable[[set[bytes]], set[bytes]] | None = None) -> set[bytes]:
        """Which of these chunks (id -> raw bytes) the store holds for this writer. A
        server may hold a chunk that the writer's token cannot see yet; the writer then
        proves it holds the bytes (docs/protocol.md) instead of sending them. `firsts` are
        the pushed files' first chunks: a store that finds what it shares by lookups
        (a bucket's anchors) looks those up too. `vouched(doubtful)` names which of the chunks
        a store would have to read before trusting them (a bucket's, in packs this machine did
        not write) a landed commit of the writer's history reaches: those are trusted by id
        (trust by history, docs/protocol.md); a store that decides trust elsewhere (a server)
        ignores it."""
        return self.present(list(chunks))

    def begin_push(self) -> None:
        ...

    def tmp_path(self) -> str:
        """A new temp file where a pack is built before `add_pack`."""
        ...

    def add_pack(self, tmp: str, name: str, entries: list[PackEntry]) -> concurrent.futures.Future[Any] | None:
        """Store a finished pack; returns None when it is durable on return, or a future
        that completes when it is (a background upload)."""
        ...

    def flush(self) -> None:
        """Wait until every added pack is durable in the store (uploads finished). The default
        has nothing in flight: its `add_pack` returns once the pack is durable."""
        return None


class MetadataStore(Protocol):
    """Manifests, trees and commits: immutable objects named by their hashes."""

    def put_manifests(self, manifests: list[Manifest]) -> list[str]:
        ...

    def get_manifest(self, name: str, repo: str | None = None) -> Manifest:
        ...

    def get_manifest_located(self, name: str, repo: str | None = None) -> tuple[Manifest, Located]:
        """A manifest and where its chunks are, as `locate` answers (a server: one round trip
        for both). The default locates nothing: the reader locates as it reads."""
        return self.get_manifest(name, repo), {}

    def get_manifests_located(self, names: list[str], repo: str | None = None, tail: int = 0,
                              chunks: dict[bytes, Raw] | None = None) -> dict[str, tuple[Manifest, Located]]:
        """`get_manifest_located` of each of `names`, by name (a server: many in one request). A
        store that fetches chunks may also fetch those holding each file's last `tail` bytes (a
        Parquet footer) with them: verified, into `chunks` (id -> raw bytes) when given, or kept
        and located where it keeps them (the chunk cache). The default fetches no chunks."""
        return {n: self.get_manifest_located(n, repo) for n in dict.fromkeys(names)}

    def manifests_present(self, repo: str, names: list[str]) -> set[str]:
        """Which of these manifests the store holds (as `repo` may read them). The default
        knows of none, so a writer reads and sends those files again."""
        return set()

    def get_commit(self, repo: str, commit_id: str) -> Commit:
        ...

    def get_tree(self, name: str, repo: str | None = None) -> treeobj.Tree:
        """A stored tree, verified against its name (a server: one `repo` reaches)."""
        raise Undeclared(f"{type(self).__name__} does not store trees")

    def put_trees(self, trees: dict[str, treeobj.Tree]) -> None:
        """Store trees (id -> Tree) durably, each written once; before a commit names them."""
        raise Undeclared(f"{type(self).__name__} does not store trees")


class RefStore(Protocol):
    """Repos, branches and tags; `commit` moves a branch by compare-and-swap."""

    def commit(self, commit: Commit, branch: str, expected: str | None) -> str:
        ...

    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        ...

    def branches(self, repo: str) -> dict[str, str]:
        ...

    def tags(self, repo: str) -> dict[str, str]:
        ...

    def create_tag(self, repo: str, name: str, commit_id: str) -> None:
        """A new tag; RefExistsError if the name is taken by a tag or a branch."""
        ...

    def delete_tag(self, repo: str, name: str) -> str:
        ...

    def create_branch(self, repo: str, name: str, commit_id: str) -> None:
        ...

    def delete_branch(self, repo: str, name: str) -> str:
        """Remove a branch (never the last one of a repo); returns the commit it named."""
        ...

    def has_repo(self, repo: str) -> bool:
        ...

    def repos(self) -> list[str]:
        ...

    def forgotten(self, repo: str) -> set[str] | None:
        """The commits of `repo` that `forget` dropped, or None where the store cannot list
        them (the default; a commit is then known forgotten once its files are gone)."""
        return None


class Upkeep(Protocol):
    """Push sessions, job journals and maintenance, where the store is: in this process
    (`capabilities.runs_here`) or on a server (`capabilities.remote_admin`). The defaults are
    a store that keeps none (a push then runs without a session)."""

    location: str
    capabilities: BackendCapabilities

    def push_session(self) -> ContextManager[object]:
        """The marker of a push in flight: a gc deletes nothing while it is open."""
        return contextlib.nullcontext()

    def journal(self) -> Any:  # staging.Journal here, client.journal.RemoteJournal on a server
        """The journal role (open, add, batches, close: repo, job id; storage/staging.py)."""
        raise InvalidAddressError(f"{self.location} keeps no job journals: use a directory, a bucket or a server")

    def admin(self, command: str, **options: Any) -> Any:
        """Run a maintenance command (gc, check, forget, delete-repo; in this process also
        rebuild-index and recover) with its options; its report (a dict; `recover`: a count)."""
        raise InvalidAddressError(f"{command} works on a store directory, a bucket or a server, "
                                  f"not {self.location}")


class ViaRefStore:
    """The `RefStore` calls of a store whose refs are a role object of its own (`ref_store`),
    passed on to it, written out once (`Repository` and `RemoteStore`; put it before `Backend`
    among the bases)."""

    ref_store: RefStore

    def commit(self, commit: Commit, branch: str, expected: str | None) -> str:
        return self.ref_store.commit(commit, branch, expected)

    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        return self.ref_store.resolve_ref(repo, rev)

    def branches(self, repo: str) -> dict[str, str]:
        return self.ref_store.branches(repo)

    def tags(self, repo: str) -> dict[str, str]:
        return self.ref_store.tags(repo)

    def create_tag(self, repo: str, name: str, commit_id: str) -> None:
        self.ref_store.create_tag(repo, name, commit_id)

    def create_branch(self, repo: str, name: str, commit_id: str) -> None:
        self.ref_store.create_branch(repo, name, commit_id)

    def delete_tag(self, repo: str, name: str) -> str:
        return self.ref_store.delete_tag(repo, name)

    def delete_branch(self, repo: str, name: str) -> str:
        return self.ref_store.delete_branch(repo, name)

    def has_repo(self, repo: str) -> bool:
        return self.ref_store.has_repo(repo)

    def repos(self) -> list[str]:
        return self.ref_store.repos()

    def forgotten(self, repo: str) -> set[str] | None:
        return self.ref_store.forgotten(repo)

"""Overlays: a backend in front of another, that passes every call through unless it overrides it.

The read cache (`cache.CachedBackend`) and the local seed of a pull (`engine.pull.LocalSeed`) are
overlays: each writes out only the methods it changes (where chunks are, how they are read, what
it keeps) and the rest reach the backend it wraps (`inner`, or `unwrap()`), by a
pass-through each, written out in `Overlay`: the calls a backend answers from its own state.
The rest of `Backend` is built on these and runs on the overlay, so that an overlay's answers
are the ones used (`bound`, `view`, `log`, ...).

A chunk an overlay holds itself is located at a `Held` place instead of a pack: a location is
either a pack name (a string) or a `Held` kind, which no pack name can be, so the wrapped
backend never sees one and nobody takes a cached chunk for a pack called "cache". Locations
stay in memory: no on-disk or wire format names them.
"""
from __future__ import annotations

import concurrent.futures
import enum
from typing import Any, Callable, ContextManager, Iterable, Mapping, Sequence

from ..core import treeobj
from ..core.commit import Commit
from ..core.manifest import Manifest
from ..core.pack import PackEntry
from .backend import Backend, BackendCapabilities
from .roles import Located, Places, Raw


class Held(str, enum.Enum):
    """Where an overlay keeps a chunk when it is not in a pack of the store. A `str`, so that a
    location is typed as a pack name is; always compared by identity (`p is Held.CACHE`), and
    its value is a sentence, which no pack name (hex digits) is."""

    CACHE = "the machine's chunk cache"
    LOCAL_FILE = "a local file (an older copy of the file being pulled)"


class Overlay(Backend):
    """A backend that wraps `inner` and delegates to it by default. `uncached()` is the inner
    one's (an overlay is never the store's own answer); `unwrap()` is `inner` itself."""

    def __init__(self, inner: Backend):
        self.inner = inner

    def unwrap(self) -> Backend:
        return self.inner

    @property
    def location(self) -> str:  # type: ignore[override]
        return self.inner.location

    @property
    def identity(self) -> str:
        return self.inner.identity

    @property
    def capabilities(self) -> BackendCapabilities:  # type: ignore[override]
        return self.inner.capabilities

    # -- passed through to `inner` (what an overlay does not override) --------------------------
    def present(self, chunk_ids: list[bytes]) -> set[bytes]:
        return self.inner.present(chunk_ids)

    def present_or_prove(self, chunks: dict[bytes, bytes], firsts: Iterable[bytes] = (),
                         vouched: Callable[[set[bytes]], set[bytes]] | None = None) -> set[bytes]:
        return self.inner.present_or_prove(chunks, firsts, vouched)

    def begin_push(self) -> None:
        self.inner.begin_push()

    def tmp_path(self) -> str:
        return self.inner.tmp_path()

    def add_pack(self, tmp: str, name: str,
                 entries: list[PackEntry]) -> concurrent.futures.Future[Any] | None:
        return self.inner.add_pack(tmp, name, entries)

    def flush(self) -> None:
        self.inner.flush()

    def locate(self, chunk_ids: Iterable[bytes], repo: str | None = None) -> Located:
        return self.inner.locate(chunk_ids, repo)

    def read_chunk(self, pack: str, entry: PackEntry, repo: str | None = None) -> Raw:
        return self.inner.read_chunk(pack, entry, repo)

    def read_chunks(self, items: list[tuple[str, PackEntry]], repo: str | None = None,
                    stored: dict[bytes, bytes] | None = None) -> Mapping[bytes, Raw]:
        return self.inner.read_chunks(items, repo, stored)

    def read_chunks_into(self, items: list[tuple[str, PackEntry]], places: Places, out: memoryview,
                         repo: str | None = None, *, stored: dict[bytes, bytes] | None = None,
                         keep: memoryview | None = None) -> None:
        self.inner.read_chunks_into(items, places, out, repo, stored=stored, keep=keep)

    def read_run_into(self, pack: str, offset: int, out: memoryview, chunk_ids: Sequence[bytes],
                      lengths: Sequence[int], checks: Sequence[int | None] | None = None) -> None:
        self.inner.read_run_into(pack, offset, out, chunk_ids, lengths, checks)

    def read_mixed_into(self, pack: str, parts: Sequence[tuple[int, PackEntry]], out: memoryview) -> None:
        self.inner.read_mixed_into(pack, parts, out)

    def index_stamp(self) -> tuple[object, ...]:
        return self.inner.index_stamp()

    def put_manifests(self, manifests: list[Manifest]) -> list[str]:
        return self.inner.put_manifests(manifests)

    def get_manifest(self, name: str, repo: str | None = None) -> Manifest:
        return self.inner.get_manifest(name, repo)

    def get_tree(self, name: str, repo: str | None = None) -> treeobj.Tree:
        return self.inner.get_tree(name, repo)

    def put_trees(self, trees: dict[str, treeobj.Tree]) -> None:
        self.inner.put_trees(trees)

    def commit(self, commit: Commit, branch: str, expected: str | None) -> str:
        return self.inner.commit(commit, branch, expected)

    def get_commit(self, repo: str, commit_id: str) -> Commit:
        return self.inner.get_commit(repo, commit_id)

    def resolve_ref(self, repo: str, rev: str) -> tuple[str, str]:
        return self.inner.resolve_ref(repo, rev)

    def branches(self, repo: str) -> dict[str, str]:
        return self.inner.branches(repo)

    def tags(self, repo: str) -> dict[str, str]:
        return self.inner.tags(repo)

    def create_tag(self, repo: str, name: str, commit_id: str) -> None:
        self.inner.create_tag(repo, name, commit_id)

    def delete_tag(self, repo: str, name: str) -> str:
        return self.inner.delete_tag(repo, name)

    def create_branch(self, repo: str, name: str, commit_id: str) -> None:
        self.inner.create_branch(repo, name, commit_id)

    def delete_branch(self, repo: str, name: str) -> str:
        return self.inner.delete_branch(repo, name)

    def has_repo(self, repo: str) -> bool:
        return self.inner.has_repo(repo)

    def repos(self) -> list[str]:
        return self.inner.repos()

    def totals(self) -> dict[str, int]:
        return self.inner.totals()

    def counters(self) -> dict[str, int]:
        return self.inner.counters()

    def cache_counters(self) -> dict[str, int]:
        return self.inner.cache_counters()

    def uncached(self) -> Backend:
        return self.inner.uncached()

    def close(self) -> None:
        self.inner.close()

    def admin(self, command: str, **options: Any) -> Any:
        return self.inner.admin(command, **options)

    def push_session(self) -> ContextManager[object]:
        return self.inner.push_session()

    def journal(self) -> Any:
        return self.inner.journal()

    def forgotten(self, repo: str) -> set[str] | None:
        return self.inner.forgotten(repo)

    def manifests_present(self, repo: str, names: list[str]) -> set[str]:
        return self.inner.manifests_present(repo, names)

"""Metadata a process keeps, in one place, with one invalidation rule.

Two kinds, two rules:

- **Immutable objects** (manifests, trees, commits), named by the hash of their bytes and checked
  against it before they are kept: kept for good (`Objects`, least recently used out past
  `OBJECTS_MAX`), per *scope* (the store's identity and the token), so that another token still
  asks the server, which checks it.
- **Heads** (branch -> commit): a tag or a commit id is kept for good; a branch head is served
  only to the `cdc://` filesystem instance that asked for it, for its `head_ttl` (fs.py): every
  other resolve asks the store. The one invalidation rule: a write through this process (a
  commit, a branch or tag made or deleted) drops the heads of that branch at once.

Heads are keyed by the store's **identity**: a server names its store (`X-Cdc-Store`, a random id
kept in the store) on every answer, and `saw_store` records it per URL. When another store
answers on a URL (a server restarted over another store on the same port), every head of the
old one is unreachable at once. Until a process has heard a URL's store id, its identity is the
URL alone.

Machine-wide copies (the chunk cache's `objects` and `heads` tables, shared by a machine's
processes) sit behind this module: `CachedBackend` asks here first, then the table, then the
store. `counters()` says which layer answered (`heads_memory`, `heads_machine`, `heads_server`
and the same for `objects_`).

The chunk bytes a `FileReader` keeps for one open file (its LRU) and a local store's file plans
(`_Plans`, keyed by the store's index stamp) are not metadata: they stay with the reader.
"""
from __future__ import annotations

import collections
import re
import time
from typing import Any, Callable, TypeVar

from .. import runtime
from ..core import ids

HEAD_TTL = 5.0  # seconds a branch head resolved by this process (or, through the cache, this machine) serves
OBJECTS_MAX = 512  # immutable objects this process keeps in memory
_STORE_ID = re.compile(r"[0-9A-Za-z_.-]{8,128}")
T = TypeVar("T")
HeadKey = tuple[str, ...]  # (identity, scope, repo, rev)
ObjectKey = tuple[str | None, ...]  # (scope, kind, repo or None, name)

_lock = runtime.Lock()
_store_ids: dict[str, str] = {}  # location -> the store id its server named last
_counts: collections.Counter[str] = collections.Counter()


def count(what: str, n: int = 1) -> None:
    """Note that `what` (e.g. "heads_machine") answered `n` reads."""
    with _lock:
        _counts[what] += n


def counters() -> dict[str, int]:
    """Reads answered by each layer since the process started: `heads_memory`, `heads_machine`,
    `heads_server`, `objects_memory`, `objects_machine`, `objects_server`."""
    with _lock:
        base = {f"{k}_{w}": 0 for k in ("heads", "objects") for w in ("memory", "machine", "server")}
        return base | dict(_counts)


def saw_store(location: str, store_id: str) -> None:
    """A server at `location` named its store `store_id`. Another id than before: the heads of the
    old store are dropped (its objects may stay: they are named by their bytes)."""
    if not isinstance(store_id, str) or not _STORE_ID.fullmatch(store_id):
        raise ValueError(f"the server at {location} sent an invalid store id {store_id!r}: "
                         f"is it a cdcstore server?")
    with _lock:
        old = _store_ids.get(location)
        if old == store_id:
            return
        _store_ids[location] = store_id
    if old is not None:
        heads().forget_identity(f"{location}#{old}")


def store_id(location: str) -> str | None:
    """The store id the server at `location` named last in this process (None: not heard yet)."""
    return _store_ids.get(location)


def scope(ident: str, token: str | None) -> str:
    """What objects and heads are kept per: a store (its `Backend.identity`) and a token."""
    return ids.weak_hexdigest(f"{ident}\n{token or ''}".encode())[:16]


def identity(location: str) -> str:
    """The key of a store's heads: its location and, once heard, the store id its server names."""
    sid = _store_ids.get(location)
    return f"{location}#{sid}" if sid else location


class Heads:
    """Branch and tag heads by (identity, scope, repo, rev): (commit id, kind, when)."""

    def __init__(self) -> None:
        self._lock = runtime.Lock()
        self._heads: dict[HeadKey, tuple[str, str, float]] = {}

    def get(self, key: HeadKey, ttl: float = HEAD_TTL) -> tuple[str, str] | None:
        """(commit id, kind) of a head kept for `key`: a branch's for `ttl` seconds, a tag's or a
        commit id's for good."""
        with self._lock:
            got = self._heads.get(key)
        if got is None:
            return None
        cid, kind, at = got
        if kind == "branch" and time.monotonic() - at > ttl:
            return None
        count("heads_memory")
        return cid, kind

    def put(self, key: HeadKey, commit_id: str, kind: str, at: float | None = None) -> None:
        with self._lock:
            self._heads[key] = (commit_id, kind, time.monotonic() if at is None else at)

    def forget_branch(self, ident: str, repo: str, rev: str) -> None:
        """A write through this process moved or removed `rev`: its heads go, whatever the scope."""
        with self._lock:
            for k in [k for k in self._heads if k[0] == ident and k[2] == repo and k[3] == rev]:
                del self._heads[k]

    def forget_identity(self, ident: str) -> None:
        with self._lock:
            for k in [k for k in self._heads if k[0] == ident]:
                del self._heads[k]

    def clear(self) -> None:
        with self._lock:
            self._heads.clear()


class Objects:
    """Immutable objects (already verified) by (scope, kind, name), least recently used out."""

    def __init__(self, most: int = OBJECTS_MAX):
        self._lock = runtime.Lock()
        self._most = most
        # values: whatever kind of object the key names (a manifest, tree, commit ...)
        self._objects: collections.OrderedDict[ObjectKey, Any] = collections.OrderedDict()

    def get(self, key: ObjectKey) -> Any:
        with self._lock:
            obj = self._objects.get(key)
            if obj is not None:
                self._objects.move_to_end(key)
        if obj is not None:
            count("objects_memory")
        return obj

    def has(self, key: ObjectKey) -> bool:
        with self._lock:
            return key in self._objects

    def put(self, key: ObjectKey, obj: object) -> None:
        with self._lock:
            self._objects[key] = obj
            self._objects.move_to_end(key)
            while len(self._objects) > self._most:
                self._objects.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._objects.clear()

    def remembered(self, key: ObjectKey, fetch: Callable[[], T]) -> T:
        """The object kept for `key`, else `fetch()`'s (verified by the caller), kept. Whoever
        fetches from the store counts `objects_server`."""
        obj: T | None = self.get(key)
        if obj is None:
            obj = fetch()
            self.put(key, obj)
        return obj


_heads = Heads()
_objects = Objects()


def heads() -> Heads:
    """This process's heads (a forked child keeps what its parent knew: heads carry their time)."""
    return _heads


def objects() -> Objects:
    """This process's immutable objects."""
    return _objects


_written: dict[tuple[str, str, str], float] = {}  # (identity, repo, rev) -> when this process last moved it


def wrote(ident: str, repo: str, rev: str) -> None:
    """The invalidation rule: a write through this process moved (or removed) `rev` of `repo`:
    its heads here go, and a machine-wide copy older than the write is not used (`written_at`)."""
    with _lock:
        _written[(ident, repo, rev)] = time.time()
    _heads.forget_branch(ident, repo, rev)


def written_at(ident: str, repo: str, rev: str) -> float:
    """When this process last moved `rev` (wall clock; 0 if never): older machine-wide heads are stale."""
    return _written.get((ident, repo, rev), 0.0)


def clear() -> None:
    """Forget everything this process keeps (a measurement of a cold start; tests)."""
    _heads.clear()
    _objects.clear()
    with _lock:
        _store_ids.clear()
        _written.clear()

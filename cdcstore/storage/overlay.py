"""Overlays: a backend in front of another, that passes every call through unless it overrides it.

The read cache (`cache.CachedBackend`) and the local seed of a pull (`engine.pull.LocalSeed`) are
overlays: each writes out only the methods it changes (where chunks are, how they are read, what
it keeps) and the rest reach the backend it wraps (`inner`, or `unwrap()`), by one generic
delegation rather than a pass-through per method.

A chunk an overlay holds itself is located at a `Held` place instead of a pack: a location is
either a pack name (a string) or a `Held` kind, which no pack name can be, so the wrapped
backend never sees one and nobody takes a cached chunk for a pack called "cache". Locations
stay in memory: no on-disk or wire format names them.
"""
from __future__ import annotations

import enum

from .backend import Backend, BackendCapabilities


class Held(enum.Enum):
    """Where an overlay keeps a chunk when it is not in a pack of the store."""

    CACHE = "the machine's chunk cache"
    LOCAL_FILE = "a local file (an older copy of the file being pulled)"


# every call a backend answers from its own state (the rest of `Backend` is built on these and
# runs on the overlay, so that an overlay's answers are the ones used: `bound`, `view`, `log`, ...)
DELEGATED = (
    "present", "present_or_prove", "begin_push", "tmp_path", "add_pack", "flush",
    "locate", "read_chunk", "read_chunks", "read_chunks_into", "read_run_into", "index_stamp",
    "put_manifests", "get_manifest", "get_tree", "put_trees", "commit", "get_commit",
    "resolve_ref", "branches", "tags", "create_tag", "delete_tag", "create_branch", "delete_branch",
    "has_repo", "repos", "totals", "counters", "cache_counters", "uncached", "close",
    "admin", "push_session", "journal", "forgotten", "manifests_present",  # upkeep: the inner store's, as of now
)


def _forward(name: str):
    def forward(self, *args, **kwargs):
        return getattr(self.inner, name)(*args, **kwargs)
    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"`inner.{name}` (passed through)."
    return forward


class Overlay(Backend):
    """A backend that wraps `inner` and delegates to it by default. `uncached()` is the inner
    one's (an overlay is never the store's own answer); `unwrap()` is `inner` itself."""

    locals().update({_name: _forward(_name) for _name in DELEGATED})

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

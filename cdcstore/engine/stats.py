"""What `Store.stats` answers: a store's totals over every version it keeps, or one revision's
size and what it added over its parent (new chunks, their stored bytes)."""
from __future__ import annotations

import time

from ..core.address import Address
from ..core.errors import CdcError
from ..storage.backend import Backend
from .history import History, as_address


def stats(be: Backend, location: str, addr: str | Address | None) -> dict:
    """`Store.stats` (its docstring says what each figure means)."""
    t0 = time.perf_counter()
    totals = be.totals()
    out: dict = {"store": location, "repos": len(be.repos()), **totals}
    out.update(_revision(be, as_address(addr)) if addr is not None else _store(be, totals))
    out["seconds"] = time.perf_counter() - t0
    return out


def _revision(be: Backend, a: Address) -> dict:
    cid, view, found = History(be).files(a)
    commit = be.get_commit(a.repo, cid)
    chunks = _chunk_sizes(be, found.values(), a.repo)
    parent = {}
    if commit.parent:
        pview = be.view(a.repo, be.get_commit(a.repo, commit.parent))
        parent = _chunk_sizes(be, pview.under(a.path).values(), a.repo)
    new = [c for c in chunks if c not in parent]
    return {"commit": cid, "files": len(found), "bytes": sum(f.size for f in found.values()),
            "unique_bytes": sum(chunks.values()), "new_bytes": sum(chunks[c] for c in new),
            "stored_bytes": sum(e.stored_len for _, e in be.locate(new, a.repo).values())}


def _store(be: Backend, totals: dict) -> dict:
    history = History(be)
    heads = [(r, c) for r in be.repos() for c in set(be.branches(r).values())]
    files = bytes_ = 0
    for repo, cid in heads:
        view = be.view(repo, be.get_commit(repo, cid))
        files += view.file_count()
        bytes_ += view.size()
    versions = kept = 0
    for r in be.repos():  # every version the store keeps: what storing each in full would take
        seen: set[str] = set()
        forgotten = history.forgotten(r) or set()
        for head in set(be.branches(r).values()) | set(be.tags(r).values()):
            for cid, c in be.log(r, head):
                if cid in seen:
                    break
                seen.add(cid)
                if cid in forgotten:
                    continue  # history only: its files are not kept
                try:
                    kept += be.view(r, c).size()
                except CdcError:
                    if not history.was_forgotten(r, cid):
                        raise
                    forgotten.add(cid)
        versions += len(seen - forgotten)
    # a token limited to some repos sees the chunks they reach, not the store's packs
    hidden = [k for k in ("packs", "pack_bytes") if k not in totals]
    stored = totals["chunk_stored_bytes"] if hidden else totals["pack_bytes"]
    out = {"commit": None, "files": files, "bytes": bytes_,
           "new_bytes": totals["chunk_raw_bytes"], "stored_bytes": totals["chunk_stored_bytes"],
           "versions": versions, "history_bytes": kept,
           "dedup_ratio": kept / stored if stored else 0.0}
    if hidden:
        out["hidden"] = hidden
    return out


def _chunk_sizes(be: Backend, entries, repo: str) -> dict[bytes, int]:
    sizes: dict[bytes, int] = {}
    for f in entries:
        m = be.get_manifest(f.manifest, repo)
        sizes.update(zip(m.chunk_ids, m.lengths))
    return sizes

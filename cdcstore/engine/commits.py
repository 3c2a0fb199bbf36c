"""The write path of a `Store`: files ingested (`push.Ingest`), entries checked, one commit made
and landed (`Commits`), and `TransferResult`, what a push says it did.

Every write runs inside a push session where the store is, so a gc deletes nothing under it;
manifests are stored only after their chunks are durable, and the commit only after them.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, AbstractSet, Callable, ContextManager, Iterable, Mapping, Sequence, cast

from .. import runtime
from ..core import ids, treeobj
from ..core.address import (DEFAULT_BRANCH, Address, check_name, check_write_path, check_write_target,
                            normalize_path)
from ..core.commit import FileEntry, check_author as _check_author
from ..core.errors import CdcError, CorruptionError, InvalidAddressError, MissingChunksError
from ..storage import memo
from ..storage import staging, statcache
from ..storage.backend import Backend
from ..storage.repository import no_such_path
from ..storage.statcache import Seen, StatCache
from .history import History
from .ingest import Ingest, IngestOptions, Prehashed, manifest_of

PREPASS_MIN = 8  # pushed files from which a push compares content ids before it ingests

if TYPE_CHECKING:
    from typing import Protocol

    class _Bundled(Protocol):
        """What a backend whose `capabilities.bundles` is set answers besides `Backend`
        (storage/roles.py: `BackendCapabilities.bundles`)."""

        def learn_bundles(self, pairs: Iterable[tuple[str, str | None]]) -> None: ...

        def bundle_of(self, name: str) -> str | None: ...

        def bundle_run(self) -> ContextManager[object]: ...


def check_author(author) -> str:
    """`author` as given, or InvalidAddressError saying what an author may be."""
    try:
        return _check_author(author)
    except ValueError as e:
        raise InvalidAddressError(str(e)) from None


def _clash(paths: list[str]) -> InvalidAddressError:
    return InvalidAddressError(f"{sorted(paths)[0]!r} would be both a file and a folder: "
                               f"push to another path or remove one of them")


@dataclass
class TransferResult:
    """What a push or pull did. `new_bytes` counts raw bytes of chunks the target lacked."""

    files: int
    bytes: int
    new_bytes: int
    stored_bytes: int  # chunk records written into packs (compressed chunks), as `stats` counts them
    seconds: float
    commit: str | None
    chunks: int = 0
    pack_bytes: int = 0  # the pack files written: stored_bytes plus each pack's header, index and trailer
    new_chunks: int = 0
    changed: bool = True
    sent_bytes: int = 0  # on the wire, bodies and headers (remote stores)
    received_bytes: int = 0
    requests: int = 0
    files_detail: dict | None = None  # per pushed file: bytes, new_bytes, chunks, chunking
    unread_files: int = 0  # files the push stat cache vouched for: not read (statcache.py)

    @property
    def new_bytes_by_file(self) -> dict[str, int]:
        """Where the new bytes of a push landed, largest first (files with none left out).
        A chunk new to the store counts for the first file that contains it."""
        d = self.files_detail or {}
        return dict(sorted(((p, f["new_bytes"]) for p, f in d.items() if f["new_bytes"]),
                           key=lambda kv: (-kv[1], kv[0])))

    def to_dict(self, detail: bool = False) -> dict:
        d = asdict(self)
        d["new_bytes_by_file"] = self.new_bytes_by_file
        if not detail or d["files_detail"] is None:
            del d["files_detail"]
        return d


def wire_since(backend: Backend, before: dict) -> dict:
    """Bytes and requests on the wire since `before` (`backend.counters()` then)."""
    now = backend.counters()
    return {k: now[k] - before[k] for k in ("sent_bytes", "received_bytes", "requests")}


class Commits:
    """The write path over one backend. `author()` names who a commit is by when the call
    does not (asked only once the repo and branch are checked)."""

    def __init__(self, backend: Backend, location: str, author: Callable[[], str]):
        self.backend, self.location, self.author = backend, location, author

    def push(self, a: Address, pairs: list[tuple[str, str]], message: str, *, delete: bool,
             keep: Callable[[str], bool] | None, stat_cache: bool, **kw) -> TransferResult:
        """`Store.push` once its sources are planned into `pairs` (and picked by `keep`)."""
        under = (a.path + "/" if a.path else "") if delete else None
        cache = StatCache() if stat_cache else None
        identity = self.identity()
        seen_ns = statcache.now_ns()  # before any stat: the racy-file reference (statcache.py)
        seen = {os.path.abspath(f): Seen.of(f, seen_ns) for f, _ in pairs}
        hits = cache.lookup(identity, {f: s for f, s in seen.items() if s is not None}) if cache else {}
        known = {p: hits[os.path.abspath(f)] for f, p in pairs if os.path.abspath(f) in hits}
        try:
            result = self.commit_files(a.repo, a.ref, pairs, message, remove_under=under, remove_filter=keep,
                                       known=known, **kw)
            if cache is not None:
                read = getattr(result, "_read", {})
                cache.record(identity, [(os.path.abspath(f), s, read[p]) for f, p in pairs
                                        if p in read and (s := seen[os.path.abspath(f)]) is not None])
            return result
        finally:
            if cache is not None:
                cache.close()

    def identity(self) -> str:
        """The store's identity for caches on this machine: its location (a real path for a
        directory) and, for a bucket, the endpoint (two services may share a bucket name)."""
        inner = self.backend.uncached()
        return statcache.store_identity(type(inner).__name__, self.location, inner.identity)

    def doubted(self) -> set[bytes]:
        """The chunks a check or rebuild-index here found gone from this store that it still
        lacks (statcache.py, "Lost chunks"): a push reads and stores again every file naming
        one. Those stored again since are no longer recorded. Empty unless a check found loss."""
        cache = StatCache(create=False)
        try:
            key = self.identity()
            lost = cache.lost(key)
            if not lost:
                return set()
            back = self.backend.uncached().present(sorted(lost))
            cache.stored_again(key, back)
            return lost - back
        finally:
            cache.close()

    def manifests_present(self, repo: str, names: list[str]) -> set[str]:
        """Which of these manifests the store holds, in one request to a server (protocol 1.5;
        an older server: none, so the files are read) or a look at each object here."""
        names = list(dict.fromkeys(names))
        return self.backend.uncached().manifests_present(repo, names) if names else set()

    def commit_files(self, repo: str, branch: str, pairs: list[tuple[str, str]], message: str = "",
                     **kw) -> TransferResult:
        """`Store.commit_files`: pushed once more, every file read, when a chunk is gone."""
        try:
            return self._commit_files(repo, branch, pairs, message, **kw)
        except MissingChunksError:
            kw.pop("known", None)  # a file the stat cache vouched for may name the gone chunks
            return self._commit_files(repo, branch, pairs, message, **kw)

    def _commit_files(self, repo: str, branch: str, pairs: list[tuple[str, str]], message: str = "", *,
                      remove: Iterable[str] = (), remove_under: str | None = None,
                      entries: dict[str, FileEntry] | None = None, options: IngestOptions | None = None,
                      progress: Callable[[int], None] | None = None, parent: str | None = None,
                      remove_filter: Callable[[str], bool] | None = None,
                      known: dict[str, FileEntry] | None = None, author: str | None = None) -> TransferResult:
        t0, c0 = time.perf_counter(), self.backend.counters()
        check_name("repo", repo)
        check_write_target(branch)
        author = check_author(author or self.author())  # before any work
        for path in [p for _, p in pairs] + list(entries or ()):  # names a pull can write, before any read
            check_write_path(path)
        be = self.backend
        branches = be.branches(repo) if be.has_repo(repo) else {}
        if branches and branch not in branches and branch in be.tags(repo):
            raise InvalidAddressError(f"{branch!r} is a tag of repo {repo!r}: a tag is immutable: push to a branch")
        expected = branches.get(branch)
        if parent is not None:  # the change is made against PARENT; newer commits rebase it or conflict
            # a branch that does not exist yet is made from PARENT (must-not-exist compare-and-swap:
            # one another writer made meanwhile rebases the commit, or conflicts on the same paths)
            parent = History(be).resolve_now(repo, parent)
            expected = parent if expected is not None else None
        else:
            parent = expected or branches.get(DEFAULT_BRANCH)
        base = be.get_commit(repo, parent) if parent else None
        view = be.view(repo, base) if base else None
        removed: set[str] = set()
        for path in remove:
            p = normalize_path(path)
            if view is None or view.get(p) is None:
                raise no_such_path(repo, branch, path)
            removed.add(p)

        # chunks a check here found lost: a file naming one is read and stored again, never skipped
        doubt = self.doubted() if pairs else set()
        # the pushed files the base holds already, found by content ids: only changed paths' trees read
        same, extra = self.unchanged(view, pairs, known or {}, options, remove_under, doubt) if view else ({}, None)
        inner = be.uncached()
        bundled = cast("_Bundled", inner)  # its bundle calls are made only when `capabilities.bundles`
        if inner.capabilities.bundles:  # the bundles the caller's entries name (a hint for reading them)
            bundled.learn_bundles([(e.manifest, e.bundle)
                                   for e in [*(entries or {}).values(), *(known or {}).values()]])
        runs = bundled.bundle_run() if inner.capabilities.bundles and inner.capabilities.runs_here \
            else contextlib.nullcontext()
        with self.session(), runs:  # a gc deletes nothing while this push is in flight; a bundle is read once
            # manifests the base names at the pushed paths are in the store (reachable): not re-put
            held = ({e.manifest for e in (view.get(p) for _, p in pairs if p not in same) if e is not None}
                    if view is not None else set())
            unread = {**same, **self.vouched(repo, {p: e for p, e in (known or {}).items() if p not in same}, held,
                                             doubt)}
            todo = [(f, p) for f, p in pairs if p not in unread]
            ingest, added, per_file = self.ingest(todo, options, progress, skip=held, history=self.history(view))
            read = {**added, **{p: e for p, e in same.items() if p not in (known or {})}}
            added.update(unread)
            per_file.update({p: {"bytes": e.size, "new_bytes": 0, "chunks": None, "chunking": "unchanged"}
                             for p, e in unread.items()})  # not read: the stat cache vouched for them
            if progress and unread:
                progress(sum(e.size for e in unread.values()))
            folder = (remove_under or "").rstrip("/")
            if remove_under is not None and view is not None and view.kind(folder) == "directory":
                adding = set(added)
                gone = extra if extra is not None else (p for p, _ in view.walk(folder))
                removed.update(p for p in gone if p not in adding and (remove_filter is None or remove_filter(p)))
            updates = dict(added)
            for path, entry in (entries or {}).items():
                updates[normalize_path(path)] = entry
            removed -= set(updates)
            updates = {p: e for p, e in updates.items()  # what the base holds already is no update
                       if view is None or (p not in same or p in (entries or {})) and view.get(p) != e}
            if inner.capabilities.bundles:  # an entry without its bundle gets the one this store knows
                updates = {p: e if e.bundle else FileEntry(e.manifest, e.size, bundled.bundle_of(e.manifest))
                           for p, e in updates.items()}
            changed = base is None or bool(updates) or bool(removed) or expected is None
            commit_id = parent
            if changed:
                try:
                    commit = be.make_commit(repo, parent, message, time.time(), updates, removed, base=base,
                                            author=author)
                except treeobj.Clash as e:
                    raise _clash(e.paths) from None
                commit_id = be.commit(commit, branch, expected)
                memo.wrote(memo.identity(be.identity), repo, branch)  # the one invalidation rule (storage/memo.py)
        result = TransferResult(
            files=len(pairs), bytes=ingest.bytes + sum(e.size for e in unread.values()), new_bytes=ingest.new_bytes,
            stored_bytes=ingest.stored_bytes, pack_bytes=ingest.pack_bytes, seconds=time.perf_counter() - t0,
            commit=commit_id,
            chunks=ingest.chunks, new_chunks=ingest.new_chunks, changed=changed,
            files_detail=per_file, unread_files=len(unread) - len(read.keys() & unread.keys()), **wire_since(be, c0))
        setattr(result, "_read", read)  # what was read, for the stat cache (not a field: `to_dict` leaves it out)
        return result

    def remove(self, a: Address, recursive: bool, message: str) -> TransferResult:
        """`Store.remove`: a commit without a file, or (recursive) without a folder."""
        _, view, found = History(self.backend).files(a)
        if not recursive and view.get(a.path) is None:
            raise IsADirectoryError(f"{a} is a folder: remove it with recursive=True")
        return self.commit_files(a.repo, a.ref, [], message or f"remove {a.path}", remove=list(found))

    def copy(self, s: Address, d: Address, message: str) -> TransferResult:
        """`Store.copy`: SRC's file or folder at DST, from its manifests (no data read)."""
        _, view, found = History(self.backend).files(s)
        if view.get(s.path) is not None:
            entries = {d.path: found[s.path]}
        else:
            cut = len(s.path) + 1 if s.path else 0
            entries = {"/".join(q for q in (d.path, p[cut:]) if q): f for p, f in found.items()}
        if not all(entries):
            raise InvalidAddressError(f"copy {s} to a file path, not to the root of {d.repo}")
        return self.commit_files(d.repo, d.ref, [], message or f"copy {s} to {d}", entries=entries)

    def unchanged(self, view: treeobj.View, pairs: list[tuple[str, str]], known: dict[str, FileEntry],
                  options: IngestOptions | None, remove_under: str | None, doubt: AbstractSet[bytes] = frozenset()
                  ) -> tuple[dict[str, FileEntry], set[str] | None]:
        """(path -> entry of each pushed file the base holds with the same content, the base's
        files under `remove_under` that the push lacks, or None when not found here). When the
        base has the folder the push writes into, the files are chunked and hashed here, with no
        store I/O, and compared by content ids (`treeobj.same_files`): the store's trees are read
        only on the changed paths, so a new machine's push reads what it changes, not the whole
        tree. A changed or new file is hashed again by the ingest (local work, faster than
        sending it); below PREPASS_MIN files, lookups path by path cost less. Where the stat cache
        knows files (a machine that pushed before), the ones it does not know are the changed
        ones and are not read twice: that push goes path by path, as its trees are cached. A file
        naming a chunk in `doubt` (lost from the store: `doubted`) is never one the base holds."""
        if known:
            return {}, None
        cand = list(pairs)
        common = os.path.commonpath([p.rpartition("/")[0] or "." for _, p in cand]) if cand else "."
        if len(cand) < PREPASS_MIN or view.kind("" if common == "." else common) != "directory":
            return {}, None  # nothing to compare with: the base has no folder the push writes into
        opts = options or IngestOptions()
        local: dict[str, FileEntry] = {}
        hurt: set[str] = set()
        pool = runtime.pool("chunk", max(1, opts.file_threads))
        for (_, p), m in zip(cand, pool.map(lambda fp: manifest_of(fp[0], opts), cand)):
            local[p] = FileEntry(ids.hexdigest(m.encode()), m.size)
            if doubt and not doubt.isdisjoint(m.chunk_ids):
                hurt.add(p)
        folder = None if remove_under is None else remove_under.rstrip("/")
        same, extra = treeobj.same_files(view, treeobj.View.of_files(local), folder)
        return {p: local[p] for p in same if p not in hurt}, extra if folder is not None else None

    def vouched(self, repo: str, known: dict[str, FileEntry], held: set[str],
                doubt: AbstractSet[bytes] = frozenset()) -> dict[str, FileEntry]:
        """The stat cache's entries whose manifests the store holds: those the commit being
        built on names (reachable, so kept), and those one presence batch answers for. Where
        chunks are `doubt`ed (lost: `doubted`), an entry whose manifest names one, or cannot be
        read, is not vouched for: holding a manifest is not holding its chunks."""
        if doubt:
            known = {p: e for p, e in known.items() if not self.names_any(e.manifest, doubt)}
        ok = {p: e for p, e in known.items() if e.manifest in held}
        rest = {p: e for p, e in known.items() if p not in ok}
        if rest:
            present = self.manifests_present(repo, [e.manifest for e in rest.values()])
            ok.update({p: e for p, e in rest.items() if e.manifest in present})
        return ok

    def names_any(self, manifest: str, chunk_ids: AbstractSet[bytes]) -> bool:
        """Whether the stored manifest names one of these chunks (True when it cannot be read)."""
        try:
            return not chunk_ids.isdisjoint(self.backend.get_manifest(manifest).chunk_ids)
        except (CdcError, OSError):
            return True

    def session(self):
        """The marker of a push in flight, where the store is (a directory, a bucket, or a
        server's side): a gc deletes nothing while it is open."""
        return self.backend.uncached().push_session()

    def history(self, view: treeobj.View | None) -> Callable[[str], Iterable[bytes]] | None:
        """Trust by history (docs/protocol.md): path -> the chunk ids of the file the landed
        commit being built on holds there (its manifest read only when a push doubts one of the
        file's chunks, so the cost follows the files that share chunks with packs this machine
        did not write). None where nothing is doubted: a store that reads nothing to trust it."""
        inner = self.backend.uncached()
        if view is None or not inner.capabilities.doubts_foreign_packs:
            return None

        def held(path: str) -> Iterable[bytes]:
            try:
                e = view.get(path)
                return inner.get_manifest(e.manifest).chunk_ids if e is not None else ()
            except (CdcError, OSError):  # unreadable: it vouches for nothing, the chunks are read
                return ()
        return held

    def ingest(self, pairs: list[tuple[str, str]], options: IngestOptions | None,
               progress: Callable[[int], None] | None,
               skip: AbstractSet[str] = frozenset(),
               history: Callable[[str], Iterable[bytes]] | None = None,
               prehashed: Mapping[str, Prehashed] | None = None) -> tuple[Ingest, dict[str, FileEntry], dict]:
        """Store the files' chunks (durable) and then their manifests: (ingest, path ->
        entry, per-file detail). Nothing is committed. Manifests named in `skip` (the store
        holds them: the commit being built on names them) are not stored again; `history`
        (`Commits.history`) vouches for chunks the landed commit holds at a file's path;
        `prehashed` (path -> chunks this process hashed from the same bytes: `Ingest.add_file`)."""
        ingest = Ingest(self.backend, options, progress, history)
        try:
            manifests = list(zip([p for _, p in pairs], ingest.add_files(pairs, prehashed)))
            ingest.finish()
        finally:
            ingest.close()
        per_file = {path: {"bytes": m.size, "new_bytes": ingest.file_new[path], "chunks": len(m.chunk_ids),
                           "chunking": ingest.file_mode[path]} for path, m in manifests}
        names = [ids.hexdigest(m.encode()) for _, m in manifests]
        todo = {n: m for (_, m), n in zip(manifests, names) if n not in skip}
        if todo:  # only after their chunks are durable
            stored = self.backend.put_manifests(list(todo.values()))
            if stored != list(todo):
                raise CorruptionError("the store named the manifests differently than their hashes")
        inner = self.backend.uncached()
        where = cast("_Bundled", inner).bundle_of if inner.capabilities.bundles else (lambda _: None)
        added = {path: FileEntry(name, m.size, where(name)) for (path, m), name in zip(manifests, names)}
        return ingest, added, per_file

    def upload(self, pairs: list[tuple[str, str]], options: IngestOptions | None,
               progress: Callable[[int], None] | None,
               prehashed: Mapping[str, Prehashed] | None = None) -> dict[str, FileEntry]:
        """`Store.upload` once its sources are planned (`prehashed`: as `ingest`)."""
        with self.session():  # a gc deletes nothing while chunks are being deduplicated against
            return self.ingest(pairs, options, progress, prehashed=prehashed)[1]

    def journal(self):
        """The journal role where the store is (`Store.journal`)."""
        return self.backend.uncached().journal()

    def stage(self, repo: str, job: str, pairs: Sequence[tuple[str, str]], entries: dict[str, FileEntry] | None,
              remove: Iterable[str], options: IngestOptions | None) -> dict[str, FileEntry]:
        """`Store.stage`: one journal entry object, written inside the push session."""
        check_name("repo", repo)
        staging.check_job(job)
        batch: dict[str, FileEntry | None] = {normalize_path(p): None for p in remove}
        with self.session():
            added = self.ingest(list(pairs), options, None)[1] if pairs else {}
            batch.update({normalize_path(p): e for p, e in (entries or {}).items()})
            batch.update(added)
            if batch:
                self.journal().add(repo, job, batch)
        return {p: e for p, e in batch.items() if e is not None}

    def land(self, a: Address, job: str, message: str, parent: str | None,
             exclusive: Iterable[str]) -> TransferResult | None:
        """`Store.land`: the job's entries merged, checked and committed; the job closed."""
        journal = self.journal()
        try:
            files, removed = staging.merge(journal.batches(a.repo, job))
            if not files and not removed:
                return None
            taken = [p for p in exclusive if p in files]
            if taken and self.backend.has_repo(a.repo):
                head = self.backend.uncached().branches(a.repo).get(a.ref)
                now = self.backend.get_commit(check_name("repo", a.repo), head).files if head else {}
                if any(p in now for p in taken):
                    raise FileExistsError(f"cdc://{a.repo}@{a.ref}/{next(p for p in taken if p in now)} exists "
                                          f"(mode 'xb'): nothing was committed")
            if files:
                self.check_entries(a.repo, files)
            names = sorted(files) or removed
            message = message or f"write {len(files)} files: {', '.join(names[:3])}" + (" ..." if len(names) > 3 else "")
            return self.commit_files(a.repo, a.ref, [], message, remove=removed, entries=files, parent=parent)
        finally:
            journal.close(a.repo, job)

    def check_entries(self, repo: str, entries: dict[str, FileEntry]) -> None:
        """Each entry names a manifest this store holds, of the entry's size. A server
        checks this itself when it receives the commit (uncommitted manifests are not
        readable through a repo), so only local and object stores are read here."""
        inner = self.backend.uncached()
        if not inner.capabilities.runs_here:
            return
        if inner.capabilities.bundles:
            cast("_Bundled", inner).learn_bundles([(e.manifest, e.bundle) for e in entries.values()])
        sizes: dict[str, set[int]] = {}
        for path, e in entries.items():
            sizes.setdefault(e.manifest, set()).add(e.size)
        def fetch(name):
            try:
                return inner.get_manifest(name)
            except (CdcError, OSError):
                return None

        names = list(sizes)
        found = map(fetch, names) if len(names) <= 4 else runtime.pool("io", 8).map(fetch, names)
        for name, m in zip(names, list(found)):
            wanted = sizes[name]
            if m is None:
                path = next(p for p, e in entries.items() if e.manifest == name)
                raise InvalidAddressError(f"{path!r}: manifest {name} is not in the store {self.location}: "
                                          f"upload the file to this store first (Store.upload)")
            if wanted != {m.size}:
                path = next(p for p, e in entries.items() if e.manifest == name and e.size != m.size)
                raise InvalidAddressError(f"{path!r}: the entry says {entries[path].size} bytes but manifest "
                                          f"{name} holds {m.size}: pass the entries `upload` returned, unchanged")

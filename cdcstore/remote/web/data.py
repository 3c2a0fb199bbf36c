"""What the web view shows, computed from a repository through its public API (remote/web/view.py).

Everything here is blocking store work (the web view runs it on the server's pool). A commit's
files are read through `treeobj.View` (listing, get, walk, changes), file bytes through the one
read core (`storage.reader.FileReader`) over a `CountingSource`, which forwards to the store and
counts the chunks and bytes a read fetched: the Parquet preview reports what it read.

New bytes per version: the store keeps no record of what each push stored, so the view computes
it: walking a repo's history from its first commit, a version's new bytes are the bytes of the
chunks of its added and changed files that no earlier version of the repo held (raw, and as
stored: compressed lengths from the index). Only the repo's own history counts: what another
repo shares is neither shown nor subtracted (a scoped token learns nothing of other repos). The
walk reads each changed file's manifest once; its figures are kept per commit (immutable), and
the chunk set of the last head walked is kept per repo, so a newer head walks only what is new.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Sequence

from ... import runtime
from ...core import ids, pages, treeobj
from ...core.address import DEFAULT_BRANCH
from ...core.commit import FileEntry
from ...core.errors import CdcError, RevisionNotFoundError
from ...core.pack import PackEntry
from ...core.thrift import ThriftError
from ...storage.reader import FileReader
from ...storage.roles import BackendCapabilities

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
PREVIEW_ROWS = 20
PREVIEW_COLUMNS = 40  # columns shown in the rows table (all are in the schema)
PREVIEW_PAGE_BYTES = 16 << 20  # a column whose first pages decode to more is not previewed
PREVIEW_HEADER_BYTES = 64 << 10  # a page header read to check it (statistics can make one long)
CELL_CHARS = 200  # characters of a value shown in a cell
PREVIEW_BUFFER = 64 * 1024  # pyarrow reads a column chunk in pieces this large: the first rows read little
PREVIOUS_WALK = 200  # commits walked back to find a file's previous version
DIFF_ALL_FILES = 5000  # a diff's old revision with at most this many files: new bytes against all of them
FIGURES_KEPT = 200_000  # commits whose figures are kept
COMMITS_KEPT = 100_000  # decoded commits kept (a few hundred bytes each)
WALKS_KEPT = 8  # repos whose last walked head's chunk set is kept
WALK_CHUNKS_KEPT = 4_000_000  # a chunk set larger than this is not kept (about 200 MB)


class CountingSource:
    """A chunk source over the store that counts what reads through it fetch (chunks, raw and
    stored bytes). It declares no capability (no runs, no read-into, no local reads), so the
    reader fetches exactly the chunks each read touches and locates them by blocks of chunks
    around them, not the whole file (a 1 GB file's 9,233 chunks: locating all of them took as
    long as the rest of the preview)."""

    def __init__(self, store):
        self.store = store
        # declared remote-like: the reader locates the blocks of chunks it reads, not the whole file
        self.capabilities = BackendCapabilities()
        self.chunks = self.raw_bytes = self.stored_bytes = self.calls = 0

    def locate(self, chunk_ids, repo=None):
        return self.store.locate(chunk_ids, repo)

    def read_chunk(self, pack, entry, repo=None):
        return self.read_chunks([(pack, entry)], repo)[entry.chunk_id]

    def read_chunks(self, items, repo=None, stored=None):
        self.calls += 1
        self.chunks += len(items)
        self.raw_bytes += sum(e.raw_len for _, e in items)
        self.stored_bytes += sum(e.stored_len for _, e in items)
        return self.store.read_chunks(items, repo)

    def read_chunks_into(self, items, places, out, repo=None, keep=None, *, stored=None):
        for cid, raw in self.read_chunks(items, repo).items():
            for dest, lo, hi in places.get(cid, ()):
                out[dest:dest + hi - lo] = raw[lo:hi]

    def read_run_into(self, pack: str, offset: int, out: memoryview, chunk_ids: Sequence[bytes],
                      lengths: Sequence[int], checks: Sequence[int | None] | None = None) -> None:
        """Never asked: this source declares no `reads_runs` (the role's default)."""
        raise NotImplementedError(f"{type(self).__name__} does not declare reads_runs")

    def index_stamp(self) -> tuple[object, ...]:
        """Never asked: this source declares no `reads_runs` (the role's default)."""
        raise NotImplementedError(f"{type(self).__name__} does not declare reads_runs")

    def read_mixed_into(self, pack: str, parts: Sequence[tuple[int, PackEntry]], out: memoryview) -> None:
        """Never asked: this source declares no `reads_runs` (the role's default)."""
        raise NotImplementedError(f"{type(self).__name__} does not declare reads_runs")


@dataclass
class Figures:
    """One version of a repo: its files and bytes, what changed from its parent, and the bytes of
    chunks no earlier version of the repo held (a commit whose files are gone has none)."""
    files: int
    logical: int
    added: int
    changed: int
    removed: int
    new_raw: int | None
    new_stored: int | None


class Walk:
    """The chunks and manifests a repo's history held up to `tip`."""

    def __init__(self):
        self.tip: str | None = None
        self.view: treeobj.View | None = None
        self.chunks: set[bytes] = set()
        self.manifests: set[str] = set()


class Browser:
    """The web view's reads of one repository (a `storage.repository.Repository`)."""

    def __init__(self, store):
        self.store = store
        self._figures: collections.OrderedDict[tuple[str, str], Figures] = collections.OrderedDict()
        self._walks: collections.OrderedDict[tuple[str, str], Walk] = collections.OrderedDict()  # by (repo, tip)
        self._commits: collections.OrderedDict[tuple[str, str], object] = collections.OrderedDict()  # `_commit`
        self._commits_lock = runtime.Lock()
        self._lock = runtime.Lock()

    # -- repos and refs ---------------------------------------------------------------------
    def repos(self, grant: dict) -> list[str]:
        names = sorted(self.store.repos())
        return names if "*" in grant["repos"] else [r for r in names if r in grant["repos"]]

    def refs(self, repo: str) -> tuple[dict[str, str], dict[str, str]]:
        return dict(sorted(self.store.branches(repo).items())), dict(sorted(self.store.tags(repo).items()))

    def default_branch(self, repo: str) -> str | None:
        branches = self.store.branches(repo)
        return DEFAULT_BRANCH if DEFAULT_BRANCH in branches else (min(branches) if branches else None)

    def repo_summary(self, repo: str) -> dict:
        branch = self.default_branch(repo)
        out = {"repo": repo, "branch": branch, "branches": len(self.store.branches(repo)),
               "tags": len(self.store.tags(repo)), "commit": None}
        if branch is not None:
            cid, commit = self.resolve(repo, branch)
            view = self.store.view(repo, commit)
            out.update(commit=cid, time=commit.time, message=commit.message, author=commit.author,
                       files=view.file_count(), bytes=view.size())
        return out

    def resolve(self, repo: str, rev: str):
        cid, _ = self.store.resolve_ref(repo, rev)
        return cid, self.store.get_commit(repo, cid)

    def commit(self, repo: str, rev: str) -> tuple[str, object, bool]:
        """(id, commit, forgotten) of a revision; a forgotten commit (`cdcstore forget`: its files
        are freed or about to be) is still shown, by its full id, history only."""
        try:
            cid, commit = self.resolve(repo, rev)
        except RevisionNotFoundError:
            if not ids.is_hex_id(rev) or rev not in (self.store.forgotten(repo) or ()):
                raise
            return rev, self.store.get_commit(repo, rev), True
        return cid, commit, False

    def view(self, repo: str, rev: str):
        cid, commit = self.resolve(repo, rev)
        return cid, commit, self.store.view(repo, commit)

    # -- history ----------------------------------------------------------------------------
    def log(self, repo: str, rev: str, skip: int, limit: int) -> tuple[list[dict], bool]:
        """Commits from `rev` back, newest first, `limit` of them after `skip`; and whether more
        follow. Each with its `Figures`."""
        cid = self.store.resolve_ref(repo, rev)[0]
        figures = self.figures(repo, cid)
        forgotten = self.store.forgotten(repo) or set()
        out: list[dict] = []
        more = False
        for i, (c_id, c) in enumerate(self._history(repo, cid)):
            if i < skip:
                continue
            if len(out) == limit:
                more = True
                break
            out.append({"commit": c_id, "commit_obj": c, "figures": figures.get(c_id),
                        "forgotten": c_id in forgotten})
        return out, more

    def _history(self, repo: str, cid: str | None):
        while cid:
            c = self._commit(repo, cid)
            yield cid, c
            cid = c.parent

    def _commit(self, repo: str, cid: str):
        """A commit, kept decoded (immutable: named by its bytes; at most COMMITS_KEPT): the log
        and store pages walk a history on every view, which read every commit object again
        (issue 42: 82 s a store page over 2,000 commits under 50 parallel views)."""
        with self._commits_lock:
            c = self._commits.get((repo, cid))
            if c is not None:
                self._commits.move_to_end((repo, cid))
                return c
        c = self.store.get_commit(repo, cid)
        with self._commits_lock:
            self._commits[(repo, cid)] = c
            while len(self._commits) > COMMITS_KEPT:
                self._commits.popitem(last=False)
        return c

    def figures(self, repo: str, head: str) -> dict[str, Figures]:
        """`Figures` of every commit from `head` back to the first (see the module's docstring):
        a kept walk whose tip is an ancestor of `head` goes on from there, else one starts at the
        first commit."""
        with self._lock:
            chain, walk = [], None
            for cid, c in self._history(repo, head):
                walk = self._walks.pop((repo, cid), None)
                if walk is not None:
                    break
                chain.append((cid, c))
            walk = walk or Walk()
            for cid, c in reversed(chain):
                walk.view, fig = self._step(repo, walk, c)
                walk.tip = cid
                if fig is not None:
                    self._figures[(repo, cid)] = fig
                    self._figures.move_to_end((repo, cid))
            while len(self._figures) > FIGURES_KEPT:
                self._figures.popitem(last=False)
            if len(walk.chunks) <= WALK_CHUNKS_KEPT:
                self._walks[(repo, head)] = walk
                while len(self._walks) > WALKS_KEPT:
                    self._walks.popitem(last=False)
            return {cid: f for cid, _ in self._history(repo, head)
                    if (f := self._figures.get((repo, cid))) is not None}

    def _step(self, repo: str, walk: Walk, commit) -> tuple[treeobj.View | None, Figures | None]:
        view = self.store.view(repo, commit)
        try:
            changed, removed = treeobj.changes(walk.view, view)
            old = walk.view
            added = sum(1 for p in changed if old is None or old.get(p) is None)
            new_ids: dict[bytes, int] = {}
            for entry in changed.values():
                if entry.manifest in walk.manifests:
                    continue
                walk.manifests.add(entry.manifest)
                m = self.store.get_manifest(entry.manifest, repo)
                for cid, n in zip(m.chunk_ids, m.lengths):
                    if cid not in walk.chunks:
                        new_ids[cid] = n
                        walk.chunks.add(cid)
            stored = self._stored(list(new_ids), repo)
            fig = Figures(view.file_count(), view.size(), added, len(changed) - added, len(removed),
                          sum(new_ids.values()), stored)
        except CdcError:  # a forgotten commit: its files are gone, history only
            return walk.view, None
        return view, fig

    def _stored(self, chunk_ids: list[bytes], repo: str) -> int | None:
        """The stored (compressed) bytes of these chunks, from the index; None if one is missing."""
        total = 0
        for i in range(0, len(chunk_ids), 10_000):
            part = chunk_ids[i:i + 10_000]
            found = self.store.locate(part, repo)
            if len(found) < len(part):
                return None
            total += sum(entry.stored_len for _, entry in found.values())
        return total

    def series(self, repo: str) -> tuple[str | None, list[dict]]:
        """The default branch's versions, oldest first: logical bytes of each version, what keeping
        every version whole would take (cumulative logical) and what the store keeps for them
        (cumulative new stored bytes)."""
        branch = self.default_branch(repo)
        if branch is None:
            return None, []
        head = self.store.resolve_ref(repo, branch)[0]
        figures = self.figures(repo, head)
        chain = list(self._history(repo, head))[::-1]
        out, whole, kept, raw = [], 0, 0, 0
        for cid, c in chain:
            f = figures.get(cid) or Figures(0, 0, 0, 0, 0, 0, 0)  # forgotten: its files are gone
            whole += f.logical
            kept += f.new_stored or 0
            raw += f.new_raw or 0
            out.append({"commit": cid, "time": c.time, "message": c.message, "logical": f.logical,
                        "whole": whole, "stored": kept, "unique": raw, "new_stored": f.new_stored})
        return branch, out

    def totals(self, grant: dict, access) -> dict:
        """Chunk totals of the whole store, or of what a scoped token's repos reach."""
        if "*" in grant["repos"]:
            return self.store.totals()
        return access.totals(list(grant["repos"]))

    # -- files ------------------------------------------------------------------------------
    def file(self, repo: str, rev: str, path: str) -> dict:
        """A file's page: its entry, chunks, stored bytes, and its previous version (the last
        commit back from `rev` where the file differed) with the bytes the two share."""
        cid, commit, view = self.view(repo, rev)
        entry = view.get(path)
        if entry is None:
            raise FileNotFoundError(f"no file {path!r} at {rev}")
        m = self.store.get_manifest(entry.manifest, repo)
        unique = dict(zip(m.chunk_ids, m.lengths))
        out = {"commit": cid, "entry": entry, "chunks": len(m.chunk_ids), "unique_chunks": len(unique),
               "unique_bytes": sum(unique.values()), "stored": self._stored(list(unique), repo),
               "previous": None, "changed_in": cid}
        changed_in, prev = self._previous(repo, cid, commit, path, entry)
        out["changed_in"] = changed_in
        if prev is not None:
            pm = self.store.get_manifest(prev[1].manifest, repo)
            held = set(pm.chunk_ids)
            shared = sum(n for c, n in zip(m.chunk_ids, m.lengths) if c in held)
            out["previous"] = {"commit": prev[0], "entry": prev[1], "shared": shared}
        return out

    def _previous(self, repo: str, cid: str, commit, path: str, entry: FileEntry):
        """(commit that last changed the file, (commit id, entry) of the version before or None).
        The walk stops at a forgotten commit (its files are freed or about to be)."""
        forgotten = self.store.forgotten(repo) or set()
        for _ in range(PREVIOUS_WALK):
            if not commit.parent or commit.parent in forgotten:
                return cid, None
            parent = self.store.get_commit(repo, commit.parent)
            try:
                before = self.store.view(repo, parent).get(path)
            except CdcError:
                return cid, None
            if before != entry:
                return cid, ((commit.parent, before) if before is not None else None)
            cid, commit = commit.parent, parent
        return cid, None

    def reader(self, repo: str, entry: FileEntry, name: str) -> tuple[FileReader, CountingSource]:
        source = CountingSource(self.store)
        m = self.store.get_manifest(entry.manifest, repo)
        return FileReader(source, m, name, repo=repo, readahead_bytes=0), source

    def parquet(self, repo: str, rev: str, path: str, rows: int = PREVIEW_ROWS) -> dict:
        """Schema, row groups and the first rows of a Parquet file, read through the chunk-aware
        reader: the footer, then the first pages of the first row group's column chunks (pyarrow
        reads a column chunk `PREVIEW_BUFFER` bytes at a time, without pre-buffering). Returns
        what it read: chunks and bytes fetched, against the footer and first row group sizes."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        began = time.perf_counter()
        _, _, view = self.view(repo, rev)
        entry = view.get(path)
        if entry is None:
            raise FileNotFoundError(f"no file {path!r} at {rev}")
        reader, source = self.reader(repo, entry, path)
        try:
            pf = pq.ParquetFile(reader, pre_buffer=False, buffer_size=PREVIEW_BUFFER)
            md = pf.metadata
            schema = [(f.name, str(f.type), f.nullable) for f in pf.schema_arrow]
            groups = []
            for i in range(md.num_row_groups):
                rg = md.row_group(i)
                groups.append({"rows": rg.num_rows, "bytes": rg.total_byte_size, "span": _rg_span(rg)})
            columns = [f[0] for f in schema[:PREVIEW_COLUMNS]]
            skipped: dict[str, str] = {}
            batch = pa.RecordBatch.from_pylist([], schema=pa.schema([]))
            if md.num_row_groups and md.row_group(0).num_rows:
                skipped = _too_large(reader, md.row_group(0), columns)
                keep = [c for c in columns if c not in skipped]
                if keep:  # strings stay dictionaries: a row names a value, never a copy of it
                    texts = [f.name for f in pf.schema_arrow if f.name in keep and _is_text(f.type)]
                    pf = pq.ParquetFile(reader, metadata=md, pre_buffer=False, buffer_size=PREVIEW_BUFFER,
                                        read_dictionary=texts or None)
                    batch = next(pf.iter_batches(batch_size=rows, row_groups=[0], columns=keep, use_threads=False))
                    batch = batch.slice(0, rows)
            cells = [_cells(batch.column(i)) for i in range(batch.num_columns)]
            table = [[c[r] for c in cells] for r in range(batch.num_rows)]
        finally:
            reader.close()
        footer = md.serialized_size + 8
        first = groups[0]["span"][1] - groups[0]["span"][0] if groups else 0
        return {"schema": schema, "groups": groups, "rows": table, "columns": [c for c in columns if c not in skipped],
                "skipped": skipped, "num_rows": md.num_rows,
                "created_by": md.created_by, "footer": footer, "first_group": first, "size": entry.size,
                "fetched_chunks": source.chunks, "fetched_bytes": source.raw_bytes,
                "fetched_stored": source.stored_bytes, "seconds": time.perf_counter() - began}

    # -- diffs ------------------------------------------------------------------------------
    def diff(self, repo: str, old: str, new: str) -> dict:
        """Files added, removed and changed from `old` to `new`, each with its new bytes: the bytes
        of its chunks that `old` does not hold (all of old's files when it has at most
        `DIFF_ALL_FILES`, else old's versions of the changed and removed paths: said on the page)."""
        a_id, _, a = self.view(repo, old)
        b_id, _, b = self.view(repo, new)
        changed, removed = treeobj.changes(a, b)
        whole = a.file_count() <= DIFF_ALL_FILES
        held: set[bytes] = set()
        olds = (e for _, e in a.walk()) if whole else (a.get(p) for p in [*changed, *removed])
        for e in olds:
            if e is not None:
                held.update(self.store.get_manifest(e.manifest, repo).chunk_ids)
        rows = []
        for p in sorted(removed):
            rows.append({"path": p, "change": "removed", "bytes": a.get(p).size, "new": 0})
        for p, e in sorted(changed.items()):
            m = self.store.get_manifest(e.manifest, repo)
            seen: set[bytes] = set()
            new_bytes = 0
            for cid, n in zip(m.chunk_ids, m.lengths):
                if cid not in held and cid not in seen:
                    seen.add(cid)
                    new_bytes += n
            rows.append({"path": p, "change": "changed" if a.get(p) is not None else "added", "bytes": e.size,
                         "new": new_bytes})
        rows.sort(key=lambda r: r["path"])
        return {"old": a_id, "new": b_id, "rows": rows, "whole": whole, "new_bytes": sum(r["new"] for r in rows)}


def _is_text(t) -> bool:
    import pyarrow as pa
    return pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)


def _too_large(reader, rg, columns: list[str]) -> dict[str, str]:
    """Columns of row group `rg` the preview must not decode (issue 43: a 2 KB file of one 48 MiB
    dictionary string took the server to 1.3 GB, one 512 MiB value to 2.1 GB): a column whose
    first pages (its dictionary, its first data page), as their own headers say, decode to more
    than PREVIEW_PAGE_BYTES, or whose headers cannot be read within PREVIEW_HEADER_BYTES. The
    preview decodes only those pages; a footer may lie about sizes, a page header is what a
    decoder allocates by. {column: why}."""
    wanted = set(columns)
    out: dict[str, str] = {}
    for j in range(rg.num_columns):
        c = rg.column(j)
        name = c.path_in_schema.split(".", 1)[0]
        if name not in wanted or name in out:
            continue
        start = c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset
        end = start + c.total_compressed_size
        pos = start
        for _ in range(2):  # the dictionary page (if any) and the first data page
            if pos >= end:
                break
            reader.seek(pos)
            head = reader.read(min(PREVIEW_HEADER_BYTES, end - pos))
            try:
                hlen, ptype, size, raw = pages.read_page_sizes(head)
            except ThriftError:
                out[name] = "its page header does not read within the preview's bounds"
                break
            if raw > PREVIEW_PAGE_BYTES:
                out[name] = f"a page decodes to {raw:,} bytes, over the preview's {PREVIEW_PAGE_BYTES:,}"
                break
            if ptype != pages.DICTIONARY_PAGE:
                break
            pos += hlen + size
    return out


def _cells(column) -> list[str]:
    """A column's values as table cells: a dictionary's value is cut (or, for bytes, measured)
    before it is taken, so a row costs its cell, not its value."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if not (pa.types.is_dictionary(column.type) and _is_text(column.type.value_type)):
        return [_cell(v, CELL_CHARS) for v in column.to_pylist()]
    values, text = column.dictionary, pa.types.is_string(column.type.value_type) or \
        pa.types.is_large_string(column.type.value_type)
    out = []
    for i in column.indices.to_pylist():
        if i is None:
            out.append(_cell(None))
            continue
        one = values.slice(i, 1)
        if text:
            out.append(_cell(pc.utf8_slice_codeunits(one, 0, CELL_CHARS + 1)[0].as_py(), CELL_CHARS))
        else:
            n = pc.binary_length(one)[0].as_py()
            out.append(_cell(one[0].as_py(), CELL_CHARS) if n <= 64 else f"<{n} bytes>")
    return out


def _rg_span(rg) -> tuple[int, int]:
    """[first byte, end) of a row group's column chunks in the file."""
    lo, hi = None, 0
    for j in range(rg.num_columns):
        c = rg.column(j)
        start = c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset
        start = min(start, c.data_page_offset)
        lo = start if lo is None else min(lo, start)
        hi = max(hi, start + c.total_compressed_size)
    return (lo or 0, hi)


def _cell(value, most: int = 200) -> str:
    text = "null" if value is None else value.hex() if isinstance(value, bytes) and len(value) <= 64 else (
        f"<{len(value)} bytes>" if isinstance(value, bytes) else str(value))
    return text if len(text) <= most else text[:most - 1] + "…"

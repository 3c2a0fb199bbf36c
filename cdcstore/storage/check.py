"""Check and rebuild-index of a repository (`cdcstore check`, `cdcstore rebuild-index`).

- check: each pack's footer against the index rows, the rows against present packs, every commit,
  tree and manifest that a branch or tag reaches (a tree must exist, match its name and parse); with `read_data` (or a deterministic `subset` of
  packs) each pack's hash and every chunk. A damaged chunk loses its index row (the next push of
  its file stores it again). Each problem names the files it affects.
- rebuild_index: the chunk index again from the pack footers and the landed commits, in one
  transaction; rows of a damaged pack that still verify are kept, and copies known damaged
  (recorded by the read or check that found them) stay out unless they verify now.

Both tell this machine's pushes which chunks commits use that the store lacks (`_note_lost`), so
pushing the original files again stores them again even where a file's stat is unchanged.
"""
from __future__ import annotations

import collections
import sqlite3
from typing import cast

from ..core import ids, treeobj
from ..core.address import check_name
from ..core.commit import Commit
from ..core.errors import CdcError, CorruptionError, InvalidAddressError
from ..core.manifest import Manifest
from ..core.pack import PackEntry, decode_chunk
from . import bundles, reach, statcache
from .maintenance import UpkeepHost
from .names import bundle_name

#: The repair of chunks that failed verification (the stat cache would skip an unchanged file).
REPUSH = "push the original files again (`cdcstore push --no-stat-cache`)"
#: A problem `check` found: its text, and what it affects: chunk ids (the files that use them are
#: named) or the files themselves.
Finding = tuple[str, set[bytes] | set[str]]

def _sample(names: list[str], fraction: float) -> set[str]:
    """A deterministic pseudo-random sample of about `fraction` of `names` (at least one
    when fraction > 0): those whose xxh3 is lowest."""
    if fraction <= 0 or not names:
        return set()
    k = max(1, round(len(names) * min(fraction, 1.0)))
    return set(sorted(names, key=lambda n: ids.weak_hexdigest(n.encode()))[:k])


def rebuild_index(store: UpkeepHost, read_data: bool = False) -> dict[str, object]:
    """Recreate the chunk index from the packs and commits, in one transaction (a
    served store's readers see the old index until the new one is complete).

    A damaged pack is reported and skipped, but its old index rows that still
    verify are kept, so nothing readable becomes unreadable. A copy known damaged (a
    read or `check` found it failing verification) is admitted only if it verifies
    now: a footer lists a damaged chunk as well as a sound one, so the footers alone
    would make damage readable again. `read_data` verifies every chunk before it is
    admitted (all data is read: for an index lost with its damage record). A garbage
    index file is moved aside to <index>.damaged and a new one is built."""
    with store.bundle_run():  # each manifest bundle read once
        return _rebuild_index(store, read_data)


def _rebuild_index(store: UpkeepHost, read_data: bool) -> dict[str, object]:
    try:
        old_rows = _safe_rows(store)
        known = _safe_damaged(store)
    except CorruptionError:
        old_rows, known = {}, set()
        store.packs.replace_damaged_index()
    bad: list[str] = []
    packs = []
    damaged: set[tuple[str, bytes]] = set()
    for name, size in sorted(store.packs.pack_sizes().items()):
        try:
            entries = store.packs.read_pack_index(name, size)
        except CorruptionError as e:
            entries = [en for en in old_rows.get(name, ()) if _verifies(store, name, en)]
            bad.append(f"{e}; kept {len(entries)} chunks whose old index rows still verify")
        suspect = [en for en in entries if read_data or (name, en.chunk_id) in known]
        failed = {en.chunk_id for en in suspect if not _verifies(store, name, en)}
        damaged.update((name, c) for c in failed)
        packs.append((name, size, [en for en in entries if en.chunk_id not in failed]))
    grants, chunk_grants = _grants_from_commits(store, bad)
    store.index.replace_all(packs, grants, chunk_grants, damaged)
    needed = {c for _, c in chunk_grants}
    _note_lost(store, needed - store.index.present(needed))
    return {"packs": len(packs), "bad_packs": bad, "damaged_chunks": len(damaged), **store.index.totals()}


def _note_lost(store: UpkeepHost, lost: set[bytes]) -> None:
    """Record for this machine's pushes the chunks commits use that the store lacks (all of
    them: the record is replaced), so a push reads and stores again every file that names one,
    whatever the stat cache or the base's content ids say (statcache.py, "Lost chunks")."""
    cache = statcache.StatCache(create=bool(lost))  # nothing lost and no cache file: none is made
    try:
        cache.set_lost(statcache.store_identity(type(store).__name__, store.location, store.objects.identity), lost)
    finally:
        cache.close()


def _safe_damaged(store: UpkeepHost) -> set[tuple[str, bytes]]:
    try:
        return store.index.damaged()
    except sqlite3.DatabaseError:
        return set()

def _safe_rows(store: UpkeepHost) -> dict[str, list[PackEntry]]:
    """The current index rows by pack ({} if sqlite cannot read them)."""
    out: dict[str, list[PackEntry]] = collections.defaultdict(list)
    try:
        for pack, e in store.index.rows().values():
            out[pack].append(e)
    except sqlite3.DatabaseError:
        return {}
    return out

def _grants_from_commits(store: UpkeepHost, bad: list[str]) -> tuple[list[tuple[str, str, str]], set[tuple[str, bytes]]]:
    """What each repo reaches through the commits its branches and tags name (`reach.walk`;
    commits that never landed grant nothing): (repo, "manifest" or "tree", name) and (repo, chunk id)."""
    out: set[tuple[str, str, str]] = set()
    chunks: set[tuple[str, bytes]] = set()
    manifests: dict[str, Manifest | None] = {}
    for repo in store.repos():
        damaged: list[CorruptionError] = []
        for f in reach.walk(store, repo, store.ref_store.refs(repo, damaged), problem=lambda k, r, w, e: bad.append(str(e))):
            if f.kind == "tree":
                out.add((repo, "tree", f.name))
            elif f.kind == "file" and (repo, "manifest", f.name) not in out:
                if f.name not in manifests:
                    try:
                        manifests[f.name] = store.metadata.read_manifest(f.name)  # never a memo: check reads the store
                    except CdcError as e:
                        manifests[f.name] = None
                        bad.append(str(e))
                m = manifests[f.name]
                out.add((repo, "manifest", f.name))
                chunks.update((repo, c) for c in (m.chunk_ids if m else ()))
        bad.extend(str(e) for e in damaged)
    return sorted(out), chunks


class _Stored:
    """The store as `check` walks it: trees read from the store, never a memo (a gone tree is found)."""

    def __init__(self, store: UpkeepHost):
        self.store = store
        self.forgotten, self.get_commit = store.forgotten, store.get_commit

    def view(self, repo: str, commit: Commit) -> treeobj.View:
        if commit.tree is None:
            return self.store.view(repo, commit)
        return treeobj.View(self.store.metadata.read_tree, commit.tree)


def check(store: UpkeepHost, read_data: bool = False, subset: float | None = None) -> dict[str, object]:
    """Verify the store; returns {"packs", "chunks", "problems", "details"}.

    Always: each pack's footer, every index row against a present pack and its
    footer, and every commit and manifest that a branch or tag reaches (parses,
    and its chunks are indexed). `read_data` also hashes every pack and decodes
    every chunk; `subset` (0..1) does so for a deterministic sample of packs. A
    chunk whose stored copy fails verification loses its index row, so the next
    push of its file stores it again. Each problem names the files it affects.
    Durable packs that a killed push left unindexed are indexed first (`recover`)."""
    with store.bundle_run():  # each manifest bundle read once
        return _check(store, read_data, subset)


def _check(store: UpkeepHost, read_data: bool, subset: float | None) -> dict[str, object]:
    if subset is not None and not (isinstance(subset, (int, float)) and not isinstance(subset, bool)
                                   and 0 <= subset <= 1):
        raise InvalidAddressError(f"check's subset is the share of packs to read, 0 to 1 (0.1 = 10%), not {subset!r}")
    found: list[Finding] = []  # (problem, chunk ids or files it affects)
    # One listing for the whole check, so a pack that lands later (a killed writer's request
    # still on the wire) is out of view, not half in it. The packs indexed before it were put
    # before it; one indexed after it (a push right now) is out of view too, never "missing".
    known = store.index.packs()
    sizes = store.packs.pack_sizes()
    recovered = store.packs.index_listed(sizes)  # durable packs a killed push left unindexed: not damage
    rows = store.index.rows()
    names = sorted(sizes)
    sample = _sample(names, 1.0 if read_data else subset or 0.0)
    by_pack: dict[str, dict[bytes, PackEntry]] = collections.defaultdict(dict)
    for cid, (pack, e) in rows.items():
        by_pack[pack][cid] = e
    chunks = 0
    for name in names:
        chunks += _check_pack(store, name, sizes[name], name in sample, rows, by_pack.get(name, {}), found)
    lost = collections.defaultdict(set)
    for cid, (pack, _) in rows.items():
        if pack not in sizes and pack in known:
            lost[pack].add(cid)
    for pack, cids in sorted(lost.items()):
        store.index.drop_chunks(pack, cids)
        found.append((f"pack {pack} is missing: {len(cids)} indexed chunks are lost "
                      f"({REPUSH}, or restore the pack)", cids))
    for obj in store.packs.foreign_objects():
        found.append((f"object {obj} is named like no pack of this store (a stray or foreign object; "
                      f"it is ignored): remove it", set()))
    _check_bundles(store, found)
    _check_repo_folders(store, found)
    older: set[str] = set()
    absent: set[bytes] = set()
    users = _check_reachable(store, found, older, absent)
    _note_lost(store, absent)
    problems, details = [], []
    for text, affected in found:
        files = sorted({f for c in affected for f in ((c,) if isinstance(c, str) else users.get(c, ()))})
        shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        if REPUSH in text and older.intersection(files):
            text += OLDER
        problems.append(text + (f"; affects {shown}" if files else ""))
        details.append({"problem": text, "files": files})
    return {"packs": len(names), "chunks": chunks, "read_packs": len(sample), "recovered_packs": recovered,
            "problems": problems, "details": details}

def _check_pack(store: UpkeepHost, name: str, size: int, read: bool, rows: dict[bytes, tuple[str, PackEntry]],
                indexed: dict[bytes, PackEntry], found: list[Finding]) -> int:
    """Check one pack's footer against the index rows (`indexed`: its own), and its
    bytes when `read`."""
    try:
        entries = store.packs.read_pack_index(name, size)
    except CorruptionError as e:
        entries = None
        found.append((f"{e}; run `cdcstore rebuild-index` (rows that still verify are kept)",
                       set(indexed)))
    if entries is not None:
        by_id = {e.chunk_id: e for e in entries}
        missing = {c for c in by_id if c not in rows and _verifies(store, name, by_id[c])}
        wrong = {c for c, e in indexed.items()  # the checksum too: local reads trust the row's
                 if by_id.get(c) != e or (e.check is not None and by_id[c].check != e.check)}
        if missing:
            found.append((f"the index lacks {len(missing)} chunks of pack {name}: "
                          f"run `cdcstore rebuild-index`", missing))
        if wrong:
            store.index.drop_chunks(name, wrong)
            found.append((f"{len(wrong)} index rows of pack {name} do not match its footer "
                          f"(dropped): run `cdcstore rebuild-index`", wrong))
    if not read:
        return len(entries or ())
    try:
        named_right = store.packs.pack_hash(name) == name
    except CorruptionError as e:
        if entries is not None:  # else reported above
            found.append((f"pack {name}: {e}", set(indexed)))
        return len(indexed)
    bad = {e.chunk_id for e in (entries if entries is not None else indexed.values())
           if not _verifies(store, name, e)}
    shadowed = bad - set(indexed)  # copies no read goes to: another pack's copy is read
    if shadowed and named_right:  # a damaged pack's line is above; this one is well formed, wrong inside
        found.append((f"{len(shadowed)} chunks of pack {name} do not match their ids although the pack matches "
                      f"its name (written wrong, or forged by a co-tenant of the bucket); reads use other packs' "
                      f"copies: remove the pack", set()))
    bad &= set(indexed)
    if bad:
        store.index.drop_chunks(name, bad, damaged=True)
        found.append((f"{len(bad)} chunks of pack {name} fail verification (their index rows are "
                      f"dropped: {REPUSH} to repair them)", bad))
    if not named_right and entries is not None:  # a damaged footer's line is above (rebuild-index)
        found.append(_damaged_pack(store, name, set(indexed) - bad))
    return len(entries or indexed)


def _damaged_pack(store: UpkeepHost, name: str, sound: set[bytes]) -> tuple[str, set[bytes]]:
    """The problem of a pack whose bytes do not match its name, with the chunks still read from it
    (the files they belong to are named) and its one fix: gc rewrites a pack with known damaged
    copies (`maintenance.plan`); damage outside every chunk is known to no record."""
    hurt = {c for pack, c in store.index.damaged() if pack == name}
    if not hurt:
        return (f"pack {name} does not match its name (damaged), yet each of its chunks verifies: "
                f"reads are unaffected; restore the pack from a copy", sound)
    first = "" if store.index.present(hurt) == hurt else f"{REPUSH}, then "
    return (f"pack {name} does not match its name (damaged; {len(sound)} sound chunks are still read from "
            f"it): {first}run `cdcstore gc`: it copies them into a new pack and deletes this one", sound)


def _verifies(store: UpkeepHost, pack: str, e: PackEntry) -> bool:
    try:
        decode_chunk(store.packs.read_stored(pack, e.offset, e.stored_len), e.codec, e.raw_len, e.chunk_id, e.check)
        return True
    except CorruptionError:
        return False

def _check_repo_folders(store: UpkeepHost, found: list[Finding]) -> None:
    """Folders under repos/ that are no repo: a name no repo can have (a stray object), or
    a repo whose refs remain but whose commit files are all gone (`ls` says "no repo")."""
    for folder in store.objects.folders("repos/"):
        try:
            check_name("repo", folder)
        except CdcError:
            found.append((f"folder repos/{folder}/ is not a repo (no repo may be named {folder!r}; it is "
                          f"ignored): remove it", set()))
            continue
        if store.has_repo(folder):
            continue
        refs = store.ref_store.ref_names(folder)
        if refs:
            found.append((f"repo {folder!r} has {len(refs)} branches or tags but no commit files (deleted?): "
                          f"it reads as no repo; restore repos/{folder}/commits/ from a copy, or delete the repo",
                          {f"cdc://{folder}@{r}" for r in refs}))


def _check_reachable(store: UpkeepHost, found: list[Finding], older: set[str],
                     lost: set[bytes] | None = None) -> dict[bytes, set[str]]:
    """Walk every commit that a branch or tag reaches (`reach.walk`); returns chunk id -> the
    files that use it: cdc://repo@ref/path for a branch or tag's head, cdc://repo@commit/path
    for a file first met in an older commit (those labels go to `older` too). Adds problems for
    what does not parse or is not indexed; the chunks commits use that the index lacks go to `lost`."""
    users: dict[bytes, set[str]] = collections.defaultdict(set)
    manifests: dict[str | tuple[str, str], Manifest | set[str] | None] = {}  # and ("problem", name): its files
    graph = _Stored(store)
    for repo in store.repos():
        damaged: list[CorruptionError] = []
        refs = store.ref_store.refs(repo, damaged)
        found.extend((str(e), set()) for e in damaged)

        def problem(kind: str, ref: str, where: str, e: Exception, repo: str = repo) -> None:
            at = f"cdc://{repo}@{ref.removeprefix('tag:')}"
            found.append((f"{e}: restore it from a copy", {at if kind == "commit" or not where else f"{at}/{where}"}))

        at = f_commit = ""
        for f in reach.walk(graph, repo, refs, by_path=True, problem=problem):
            if f.kind == "commit":  # a file first met in an older commit is named by that commit's id
                at = f.ref.removeprefix("tag:") if f.name == refs[f.ref] else f.name
                f_commit = f.name
            elif f.kind == "file":
                label = f"cdc://{repo}@{at}/{f.path}"
                if at == f_commit:
                    older.add(label)
                m = _check_manifest(store, f.name, label, manifests, found)
                for c in m.chunk_ids if m else ():
                    users[c].add(label)
    needed = set(users)
    absent = needed - store.index.present(needed)
    if lost is not None:
        lost.update(absent)
    hurt = {c for _, c in store.index.damaged()} & absent
    if hurt:  # a read or an earlier check found these copies damaged (rebuild-index leaves them out)
        found.append((f"{len(hurt)} chunks that commits use failed verification earlier (a read or "
                      f"`check` found their stored copies damaged): {REPUSH} to "
                      f"repair them", hurt))
    if absent - hurt:
        found.append((f"{len(absent - hurt)} chunks that commits use are not in the index: run "
                      f"`cdcstore rebuild-index` (it reads the pack footers); if they stay missing, "
                      f"{REPUSH}", absent - hurt))
    return users

OLDER = ("; a file named at a commit id is an older version: push that version of the file to a scratch "
         "branch (`cdcstore push FILE cdc://REPO@scratch/PATH`, then `cdcstore branch REPO scratch --delete`), "
         "or restore the pack from a copy")


def _check_bundles(store: UpkeepHost, found: list[Finding]) -> None:
    """Every manifest bundle reads and holds true manifests (gc keeps a damaged one: it cannot
    tell which manifests it held)."""
    for bid, _ in bundles.listing(store.objects):
        try:
            store.metadata.read_bundle(bid)
        except CorruptionError as e:
            found.append((f"{e}: a file whose manifest only it held is reported below; push such files "
                          f"again, then delete {bundle_name(bid)}", set()))


def _check_manifest(store: UpkeepHost, name: str, label: str,
                    cache: dict[str | tuple[str, str], Manifest | set[str] | None],
                    found: list[Finding]) -> Manifest | None:
    """The parsed manifest, or None after recording the problem (with `label` among
    the files it affects)."""
    if name not in cache:
        try:
            cache[name] = store.metadata.read_manifest(name)  # never a memo: check reads the store
        except CdcError as e:
            cache[name] = None
            affected: set[str] = set()
            found.append((f"{e}: restore it from a copy, or push the file again", affected))
            cache[("problem", name)] = affected
    if cache[name] is None:
        cast("set[str]", cache[("problem", name)]).add(label)
    return cast("Manifest | None", cache[name])  # under a name, never the ("problem", name) set

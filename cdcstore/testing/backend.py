"""The conformance suite of a `Backend` (cdcstore.storage.backend): chunks and packs, manifests,
commits with compare-and-swap and rebase, refs, names. A third-party backend subclasses
`BackendTests` and overrides its `case` fixture, which yields a `Case` over a fresh repo:

    from cdcstore.testing.backend import BackendTests, Case

    class TestMyBackend(BackendTests):
        @pytest.fixture
        def case(self, tmp_path):
            b = MyBackend(...)
            yield Case("mine", b, "repo1", location="my://...", damage=flip_one_stored_byte)
            b.close()

cdcstore's own tests run it over every built-in backend (tests/test_backend_conformance.py);
docs/backends.md says more. Importing this module imports pytest.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Callable

import pytest

from ..api import Store
from ..core import ids
from ..core.commit import Commit, FileEntry
from ..core.errors import (ConflictError, CorruptionError, InvalidAddressError, RefExistsError,
                           RepoNotFoundError, RevisionNotFoundError)
from ..core.manifest import Manifest
from ..core.pack import PackEntry, PackWriter, encode_chunk
from ..storage.backend import Backend, BackendCapabilities  # the suite checks the role's own types
from . import in_threads

__all__ = ["BackendTests", "Case", "put_pack", "put_file", "commit", "base_commit", "unique", "SIZES"]


@dataclass
class Case:
    """One backend under test, over a fresh repo of its own (`repo`: no other test sees its refs).

    `location`: what `Store()` opens to reach the same storage as a second client ("": none, the
    facade is `Store.over(backend)`). `damage(pack, offset)`: flip one stored byte of a pack.
    `expect`: capability values the backend must declare (e.g. {"local_reads": True}).
    `keeps_resolved_tags`: a tag resolved once keeps its commit on this client even if another
    client deletes and remakes it (a caching backend's documented difference)."""

    kind: str
    backend: Backend
    repo: str
    location: str
    damage: Callable[[str, int], None]
    expect: dict = field(default_factory=dict)
    keeps_resolved_tags: bool = False

    def facade(self, **kw) -> Store:
        """A `Store` over the same storage (a second client, unless `location` is "")."""
        if not self.location:
            return Store.over(self.backend)
        return Store(self.location, **kw)


# -- helpers: write through the Backend protocol ------------------------------------------------
def put_pack(b, chunks: list[bytes]) -> tuple[str, list[PackEntry]]:
    tmp = b.tmp_path()
    with open(tmp, "wb") as f:
        w = PackWriter(f)
        for raw in chunks:
            cid = ids.digest(raw)
            codec, stored = encode_chunk(raw, cid)
            w.add(cid, codec, stored, len(raw))
        name = w.finish()
    b.add_pack(tmp, name, w.entries)
    b.flush()
    return name, w.entries


def put_file(b, data: bytes, parts: int = 3) -> tuple[str, Manifest]:
    """Store `data` as `parts` chunks in one pack and its manifest; (manifest name, manifest)."""
    step = -(-len(data) // parts)
    chunks = [data[i:i + step] for i in range(0, len(data), step)]
    put_pack(b, chunks)
    m = Manifest([ids.digest(c) for c in chunks], [len(c) for c in chunks], len(data), ids.legacy_digest(data))
    name = b.put_manifests([m])[0]
    SIZES[name] = m.size
    return name, m


SIZES: dict[str, int] = {}  # manifest name -> file size (a server checks a commit's sizes)


def unique(n: int = 3000) -> bytes:
    return secrets.token_bytes(n)


def commit(b, repo: str, parent: str | None, files: dict[str, str], branch: str = "main",
           expected: str | None = "parent", message: str = "", base: dict | None = None) -> str:
    """Commit files {path: manifest name} over `base` (default: the parent's files)."""
    if base is None:
        base = b.get_commit(repo, parent).files if parent else {}
    entries = {**base, **{p: FileEntry(m, SIZES[m]) for p, m in files.items()}}
    c = Commit(repo, parent, message or f"c {secrets.token_hex(3)}", 1.0, entries)
    return b.commit(c, branch, parent if expected == "parent" else expected)


def base_commit(case: Case, path: str = "base.bin") -> str:
    name, _ = put_file(case.backend, unique())
    return commit(case.backend, case.repo, None, {path: name})


class BackendTests:
    """Every test takes the `case` fixture; override it (see the module's docstring)."""

    @pytest.fixture
    def case(self) -> Case:
        raise NotImplementedError("override the `case` fixture: yield a Case over a fresh repo of your backend")

    # -- capabilities --------------------------------------------------------------------------------
    def test_capabilities_are_declared(self, case):
        caps = case.backend.capabilities
        assert isinstance(caps, BackendCapabilities)
        with pytest.raises(Exception):
            caps.local_reads = not caps.local_reads  # type: ignore[misc]  # frozen: the write must fail
        for name, value in case.expect.items():  # what the case says its backend declares
            assert getattr(caps, name) == value, name
        case.backend.repos()
        c = case.backend.counters()
        assert {"requests", "sent_bytes", "received_bytes"} <= set(c)
        assert (c["requests"] > 0) == caps.counts_requests
        assert set(case.backend.cache_counters()) == {"cache_hits", "cache_misses"}
        assert case.backend.uncached().capabilities.local_reads == caps.local_reads

    # -- chunks and packs ------------------------------------------------------------------------
    def test_round_trip_is_verified(self, case):
        b = case.backend
        chunks = [unique(5000) for _ in range(4)]
        cids = [ids.digest(c) for c in chunks]
        assert b.present(cids) == set()
        pack, entries = put_pack(b, chunks)
        assert b.present(cids + [ids.digest(b"never stored")]) == set(cids)
        m = Manifest(cids, [len(c) for c in chunks], sum(map(len, chunks)), ids.legacy_digest(b"".join(chunks)))
        name = b.put_manifests([m])[0]
        SIZES[name] = m.size
        commit(b, case.repo, None, {"f.bin": name})  # a server shows a repo only what its commits reach
        found = b.locate(cids + [ids.digest(b"absent")], case.repo)
        assert set(found) == set(cids)
        assert {c: e.raw_len for c, (_, e) in found.items()} == {c: len(d) for c, d in zip(cids, chunks)}
        got = b.read_chunks([found[c] for c in reversed(cids)], case.repo)
        assert got == dict(zip(cids, chunks))
        assert b.read_chunk(*found[cids[2]], case.repo) == chunks[2]
        assert b.get_manifest(name, case.repo) == m

    def test_a_damaged_stored_byte_is_corruption_never_wrong_bytes(self, case):
        b = case.backend
        chunks = [unique(4000) for _ in range(3)]
        cids = [ids.digest(c) for c in chunks]
        pack, entries = put_pack(b, chunks)
        m = Manifest(cids, [len(c) for c in chunks], sum(map(len, chunks)), ids.legacy_digest(b"".join(chunks)))
        SIZES[b.put_manifests([m])[0]] = m.size
        commit(b, case.repo, None, {"f.bin": ids.hexdigest(m.encode())})
        found = b.locate(cids, case.repo)
        case.damage(pack, entries[1].offset + entries[1].stored_len // 2)
        with pytest.raises(CorruptionError):
            b.read_chunks([found[cids[1]]], case.repo)
        with pytest.raises(CorruptionError):
            b.read_chunks([found[c] for c in cids], case.repo)  # a merged range with one bad chunk
        assert b.read_chunks([found[cids[0]]], case.repo) == {cids[0]: chunks[0]}  # the rest still reads
        with case.facade(cache=False) as s, pytest.raises(CorruptionError):
            s.cat(f"cdc://{case.repo}/f.bin")

    def test_put_manifests_is_idempotent(self, case):
        b = case.backend
        _, m1 = put_file(b, unique())
        _, m2 = put_file(b, unique())
        first = b.put_manifests([m1, m2])
        assert first == [ids.hexdigest(m1.encode()), ids.hexdigest(m2.encode())]
        assert b.put_manifests([m2, m1, m2]) == [first[1], first[0], first[1]]  # again, and twice in one call
        assert b.put_manifests([]) == []
        commit(b, case.repo, None, {"a": first[0], "b": first[1]})
        assert b.get_manifest(first[1], case.repo) == m2

    # -- commits ----------------------------------------------------------------------------------
    def test_commit_compare_and_swap(self, case):
        b, repo = case.backend, case.repo
        c0 = base_commit(case)
        na, _ = put_file(b, unique())
        nb, _ = put_file(b, unique())
        nc, _ = put_file(b, unique())
        c1 = commit(b, repo, c0, {"a.bin": na})
        assert b.resolve_ref(repo, "main") == (c1, "branch")
        # B was based on c0 too and touches another path: rebased onto c1, nothing lost
        c2 = commit(b, repo, c0, {"b.bin": nb})
        assert c2 not in (c0, c1)
        got = b.get_commit(repo, c2)
        assert got.parent == c1 and set(got.files) == {"base.bin", "a.bin", "b.bin"}
        assert got.files["a.bin"].manifest == na and got.files["b.bin"].manifest == nb
        # C was based on c0 and touches a.bin, which c1 changed: a conflict, and nothing moves
        with pytest.raises(ConflictError, match="a.bin"):
            commit(b, repo, c0, {"a.bin": nc})
        assert case.facade(cache=False).resolve_ref(repo, "main") == (c2, "branch")
        # a writer that saw no branch yet: its overlapping change conflicts too
        with pytest.raises(ConflictError, match="b.bin"):
            commit(b, repo, None, {"b.bin": nc}, expected=None, base={})

    def test_a_retried_commit_lands_once(self, case):
        b, repo = case.backend, case.repo
        c0 = base_commit(case)
        na, _ = put_file(b, unique())
        c = Commit(repo, c0, "once", 2.0, {**b.get_commit(repo, c0).files, "a": FileEntry(na, SIZES[na])})
        c1 = b.commit(c, "main", c0)
        assert b.commit(c, "main", c0) == c1  # the answer was lost; the client sends it again
        nb, _ = put_file(b, unique())
        d = Commit(repo, c0, "rebased", 3.0, {**b.get_commit(repo, c0).files, "b": FileEntry(nb, SIZES[nb])})
        c2 = b.commit(d, "main", c0)  # lands rebased onto c1
        assert b.commit(d, "main", c0) == c2  # and a retry finds the rebased copy
        log = [cid for cid, _ in b.log(repo, "main")]
        assert log == [c2, c1, c0]

    def test_concurrent_commits_to_disjoint_paths_all_land(self, case):
        b, repo = case.backend, case.repo
        c0 = base_commit(case)
        names = [put_file(b, unique())[0] for _ in range(4)]
        base = b.get_commit(repo, c0).files

        def one(i):
            return commit(b, repo, c0, {f"w{i}/f.bin": names[i]}, base=base)

        landed = in_threads(one, 4)
        head = case.facade(cache=False).resolve_ref(repo, "main")[0]
        files = b.get_commit(repo, head).files
        assert {f"w{i}/f.bin" for i in range(4)} <= set(files)
        log = [cid for cid, _ in b.log(repo, head)]
        assert len(log) == 5 and set(landed) <= set(log)
        assert b.resolve_ref(repo, "main")[0] == head  # this client sees the final head, not its own last

    def test_log_walks_parents_newest_first(self, case):
        b, repo = case.backend, case.repo
        c0 = base_commit(case)
        c1 = commit(b, repo, c0, {"x": put_file(b, unique())[0]}, message="second")
        c2 = commit(b, repo, c1, {"y": put_file(b, unique())[0]}, message="third")
        got = list(b.log(repo, "main"))
        assert [cid for cid, _ in got] == [c2, c1, c0]
        assert [c.parent for _, c in got] == [c1, c0, None]
        assert [cid for cid, _ in b.log(repo, c1)] == [c1, c0]
        s = case.facade(cache=False)
        assert [e["commit"] for e in s.log(repo)] == [c2, c1, c0]
        assert [e["message"] for e in s.log(repo, limit=2)] == ["third", "second"]

    # -- refs ---------------------------------------------------------------------------------------
    def test_resolve_ref_branch_tag_and_commit_prefix(self, case):
        b, repo = case.backend, case.repo
        c0 = base_commit(case)
        b.create_tag(repo, "v1", c0)
        assert b.resolve_ref(repo, "main") == (c0, "branch")
        assert b.resolve_ref(repo, "v1") == (c0, "tag")
        assert b.resolve_ref(repo, c0) == (c0, "commit")
        assert b.resolve_ref(repo, c0[:8]) == (c0, "commit")
        assert b.resolve_ref(repo, c0[:6].upper()) == (c0, "commit")
        with pytest.raises(RevisionNotFoundError, match="nope"):
            b.resolve_ref(repo, "nope")
        missing = ("0" if c0[0] != "0" else "1") * 8
        with pytest.raises(RevisionNotFoundError):
            b.resolve_ref(repo, missing)
        assert b.resolve(repo, "v1") == c0

    def test_an_ambiguous_commit_prefix_is_refused(self, case):
        b, repo = case.backend, case.repo
        c0 = base_commit(case)
        base = b.get_commit(repo, c0).files
        n, _ = put_file(b, unique())
        seen: dict[str, Commit] = {}
        for i in range(5000):  # two commits on c0 whose ids share 4 hex digits (a birthday search)
            c = Commit(repo, c0, f"m{i}", 1.0, {**base, "f": FileEntry(n, SIZES[n])})
            other = seen.setdefault(c.id[:4], c)
            if other is not c:
                break
        b.create_branch(repo, "side", c0)
        assert b.commit(other, "main", c0) == other.id
        assert b.commit(c, "side", c0) == c.id
        with pytest.raises(RevisionNotFoundError, match="ambiguous"):
            b.resolve_ref(repo, c.id[:4])
        assert b.resolve_ref(repo, c.id[:12]) == (c.id, "commit")

    def test_tags_are_immutable(self, case):
        b, repo = case.backend, case.repo
        c0 = base_commit(case)
        c1 = commit(b, repo, c0, {"x": put_file(b, unique())[0]})
        b.create_tag(repo, "v1", c0)
        with pytest.raises(RefExistsError, match="v1"):
            b.create_tag(repo, "v1", c1)
        with pytest.raises(RefExistsError, match="v1"):
            b.create_branch(repo, "v1", c1)
        with pytest.raises(InvalidAddressError, match="tag"):
            commit(b, repo, c0, {"y": put_file(b, unique())[0]}, branch="v1", expected=None)
        assert b.tags(repo) == {"v1": c0}
        assert b.resolve_ref(repo, "v1") == (c0, "tag")
        with case.facade(cache=False) as s:
            with pytest.raises(RefExistsError):
                s.tag(repo, "v1", "main")
        assert b.delete_tag(repo, "v1") == c0
        assert b.tags(repo) == {}
        with pytest.raises(RevisionNotFoundError):
            b.delete_tag(repo, "v1")

    def test_branch_create_and_delete_rules(self, case):
        b, repo = case.backend, case.repo
        c0 = base_commit(case)
        b.create_branch(repo, "dev", c0)
        assert b.branches(repo) == {"main": c0, "dev": c0}
        with pytest.raises(RefExistsError, match="dev"):
            b.create_branch(repo, "dev", c0)
        with pytest.raises(RevisionNotFoundError):
            b.create_branch(repo, "ghost", "ab" * 16)  # a commit the repo lacks
        with pytest.raises(RevisionNotFoundError):
            b.delete_branch(repo, "nope")
        assert b.delete_branch(repo, "main") == c0
        with pytest.raises(InvalidAddressError, match="only branch"):
            b.delete_branch(repo, "dev")  # never the last one
        assert b.branches(repo) == {"dev": c0}
        assert b.resolve_ref(repo, "dev") == (c0, "branch")

    def test_a_missing_repo(self, case):
        b = case.backend
        base_commit(case)
        ghost = f"g{secrets.token_hex(4)}"
        assert b.has_repo(case.repo) and not b.has_repo(ghost)
        assert case.repo in b.repos() and ghost not in b.repos()
        for call in (lambda: b.branches(ghost), lambda: b.tags(ghost), lambda: b.resolve_ref(ghost, "main"),
                     lambda: list(b.log(ghost, "main")), lambda: b.get_commit(ghost, "ab" * 16),
                     lambda: b.resolve_ref(ghost, "abcd1234")):
            with pytest.raises(RepoNotFoundError, match=ghost):
                call()
        with case.facade(cache=False) as s, pytest.raises(RepoNotFoundError):
            s.log(ghost)

    def test_bad_names_get_one_clear_error_everywhere(self, case):
        b = case.backend
        c0 = base_commit(case)
        for call in (lambda: b.branches("../x"), lambda: b.tags("a b"), lambda: b.has_repo("a/b"),
                     lambda: b.resolve_ref("..", "main"), lambda: b.get_commit("a b", c0),
                     lambda: b.create_branch(case.repo, "a b", c0), lambda: b.create_tag(case.repo, "-x", c0),
                     lambda: b.resolve_ref(case.repo, "a b")):
            with pytest.raises(InvalidAddressError, match="invalid"):
                call()

    def test_get_commit_needs_a_full_id(self, case):
        b = case.backend
        c0 = base_commit(case)
        for bad in (c0[:8], c0 + "0", "zz" * 16):
            with pytest.raises(RevisionNotFoundError, match="no commit"):
                b.get_commit(case.repo, bad)
        with pytest.raises(RevisionNotFoundError, match="no commit"):
            b.get_commit(case.repo, "ab" * 16)

    def test_a_parent_from_elsewhere_is_refused(self, case):
        """A commit whose parent is not a commit of its repo is refused, and no branch moves."""
        b = case.backend
        c0 = base_commit(case)
        other = f"o{secrets.token_hex(4)}"
        with pytest.raises(InvalidAddressError, match="parent"):
            commit(b, other, c0, {}, base={})  # a new repo whose commit names another repo's commit
        assert not b.has_repo(other)
        with pytest.raises(InvalidAddressError, match="parent"):
            commit(b, case.repo, "ab" * 16, {}, base={}, expected=c0)
        assert b.branches(case.repo) == {"main": c0}

    def test_a_tag_deleted_and_made_again_elsewhere(self, case):
        """Another client deletes tag v1 and makes it again at another commit. Every backend
        then resolves v1 to the new commit, except one that keeps resolved tags (a CachedBackend
        that resolved v1 before keeps the commit it saw, without a request: tags are taken to
        never move; see docs/architecture.md). Its own delete_tag does forget it."""
        b, repo = case.backend, case.repo
        c0 = base_commit(case)
        c1 = commit(b, repo, c0, {"x": put_file(b, unique())[0]})
        b.create_tag(repo, "v1", c0)
        assert b.resolve_ref(repo, "v1") == (c0, "tag")
        with case.facade(cache=False) as other:
            other.delete_tag(repo, "v1")
            other.tag(repo, "v1", c1)
        assert b.resolve_ref(repo, "v1") == ((c0 if case.keeps_resolved_tags else c1), "tag")
        assert b.tags(repo) == {"v1": c1}  # a listing always asks the store
        b.delete_tag(repo, "v1")
        b.create_tag(repo, "v1", c0)
        assert b.resolve_ref(repo, "v1") == (c0, "tag")

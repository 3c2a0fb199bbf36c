"""The server's repos, branches, tags and commits: listing and resolving them, moving refs, and
landing a commit once what it adds to its parent is checked (`RefRoutes`)."""
from __future__ import annotations

from aiohttp import web

from ...core import ids, treeobj
from ...core.address import check_name, check_ref_name, check_write_target
from ...core.commit import Commit
from ...core.errors import CdcError, CorruptionError, InvalidAddressError
from ...storage.manifest_file import ManifestFile
from .auth import Scope
from .routes import HTTPError, RouteGroup

REF_KINDS = {"tags": "tag", "branches": "branch"}  # URL segment -> kind of name


def _uploaded_commit(text) -> Commit:
    """The commit of a POST body, fully validated (a bad one is a 400)."""
    if not isinstance(text, str):
        raise HTTPError(400, '"commit" must be the commit\'s JSON, as a string')
    try:
        return Commit.decode(text.encode(), "uploaded commit")
    except (CorruptionError, UnicodeError) as e:
        raise HTTPError(400, str(e)) from None


class RefRoutes(RouteGroup):
    """Ref and commit handlers of a `server.Server`; `land` is the commit check."""

    def routes(self, api: str) -> list:
        return [
            web.get(f"{api}/repos", self.list_repos),
            web.get(f"{api}/repos/{{repo}}/branches", self.branches),
            web.get(f"{api}/repos/{{repo}}/resolve/{{rev}}", self.resolve),
            web.get(f"{api}/repos/{{repo}}/forgotten", self.forgotten),
            web.get(f"{api}/repos/{{repo}}/tags", self.tags),
            web.post(f"{api}/repos/{{repo}}/{{kind:tags|branches}}", self.create_ref),
            web.delete(f"{api}/repos/{{repo}}/{{kind:tags|branches}}/{{name}}", self.delete_ref),
            web.get(f"{api}/repos/{{repo}}/commits/{{id}}", self.get_commit),
            web.post(f"{api}/repos/{{repo}}/commits", self.post_commit),
        ]

    async def list_repos(self, request):
        repos = await self.io(self.store.repos)
        return web.json_response({"repos": self.auth.visible(request, repos)})

    async def branches(self, request):
        repo = self.server.checked_repo(request)
        return web.json_response({"branches": await self.io(self.store.branches, repo)})

    async def forgotten(self, request):
        """The repo's forgotten commits (`forget`): history whose files are not kept."""
        repo = self.server.checked_repo(request)
        return web.json_response({"forgotten": sorted(await self.io(self.store.forgotten, repo))})

    async def resolve(self, request):
        repo = self.server.checked_repo(request)
        rev = check_name("revision", request.match_info["rev"])
        cid, kind = await self.io(self.store.resolve_ref, repo, rev)
        return web.json_response({"commit": cid, "kind": kind})

    async def tags(self, request):
        repo = self.server.checked_repo(request)
        return web.json_response({"tags": await self.io(self.store.tags, repo)})

    async def _ref_doc(self, request) -> tuple[str, str]:
        doc = await self.server.read_json(request)
        if not isinstance(doc.get("name"), str) or not isinstance(doc.get("commit"), str):
            raise HTTPError(400, 'expected a JSON object {"name": NAME, "commit": COMMIT_ID}')
        if not ids.is_hex_id(doc["commit"]):
            raise HTTPError(400, f"invalid commit id {doc['commit']!r}: 64 lowercase hex digits (32 for format v1)")
        return doc["name"], doc["commit"]

    async def create_ref(self, request):
        repo = self.server.checked_repo(request, write=True)
        kind = REF_KINDS[request.match_info["kind"]]
        name, cid = await self._ref_doc(request)
        check_ref_name(kind, name)
        await self.io(self.store.ref_store.create_ref, repo, kind, name, cid)
        return web.json_response({kind: name, "commit": cid}, status=201)

    async def delete_ref(self, request):
        repo = self.server.checked_repo(request, write=True)
        kind = REF_KINDS[request.match_info["kind"]]
        name = check_name(kind, request.match_info["name"])
        cid = await self.io(self.store.ref_store.delete_ref, repo, kind, name)
        return web.json_response({kind: name, "commit": cid})

    async def get_commit(self, request):
        repo = self.server.checked_repo(request)
        cid = request.match_info["id"]
        if not ids.is_hex_id(cid):
            raise HTTPError(400, f"invalid commit id {cid!r}")
        commit = await self.io(self.store.get_commit, repo, cid)
        return web.Response(body=commit.encode(), content_type="application/json")

    async def post_commit(self, request):
        repo = self.server.checked_repo(request, write=True)
        doc = await self.server.read_json(request)
        commit = _uploaded_commit(doc.get("commit"))
        branch = check_write_target(doc.get("branch") if isinstance(doc.get("branch"), str) else "")
        expected = doc.get("expected")
        if expected is not None and not (isinstance(expected, str) and ids.is_hex_id(expected)):
            raise HTTPError(400, '"expected" must be null or a commit id (64 lowercase hex digits, 32 for format v1)')
        if commit.repo != repo:
            raise HTTPError(400, f"commit names repo {commit.repo!r} but was sent to {repo!r}")
        author = self.auth.author(request)  # a token push is by the token, whatever the client says
        if author is not None and commit.author != author:
            if commit.tree is None:  # format 1 (an older client): landed as format 3, its trees built here
                commit = await self.io(self._as_format2, commit)
            commit = commit.with_author(author)
        cid = await self.io(self.land, repo, commit, branch, expected, self.auth.scope(request))
        return web.json_response({"commit": cid, "rebased": cid != commit.id, "author": commit.author},
                                 status=201)

    def _parent(self, repo: str, parent) -> Commit | None:
        """The parent commit: a commit id of this repo, never a path (no file-existence oracle)."""
        if parent is None:
            return None
        if not isinstance(parent, str) or not ids.is_hex_id(parent):
            raise InvalidAddressError("commit parent must be a commit id (64 hex digits, 32 for format v1) or null")
        try:
            return self.store.get_commit(repo, parent)
        except (CdcError, OSError):
            raise InvalidAddressError(f"commit parent {parent} is not a commit of repo {repo!r}: "
                                      f"base the commit on the branch head") from None

    def _as_format2(self, commit: Commit) -> Commit:
        try:
            return self.store.as_format2(commit)
        except ValueError as e:  # a path that does not normalize, a file/folder clash
            raise HTTPError(400, f"invalid commit: {e}") from None

    def land(self, repo: str, commit: Commit, branch: str, expected: str | None,
                scope: Scope | None = None) -> str:
        """Check what the commit adds to its parent (its cost follows the change: trees and
        files the parent has are not read again), then store it and move the branch."""
        parent = self._parent(repo, commit.parent)
        base = self.store.view(repo, parent) if parent else None

        def load(tid: str) -> treeobj.Tree:
            try:
                return self.store.get_tree(tid)
            except CorruptionError:
                raise HTTPError(409, f"tree {tid} is not on the server: upload it first (POST /trees)") from None

        view = (treeobj.View.of_files(commit.files, load) if commit.tree is None
                else treeobj.View(load, commit.tree))

        def check_tree(path: str, tree: treeobj.Tree, entry) -> None:
            if entry is not None and (entry.size, entry.files) != (tree.size, tree.file_count):
                raise HTTPError(400, f"folder {path!r} of the commit says {entry.files} files and {entry.size} "
                                     f"bytes, but its tree holds {tree.file_count} and {tree.size}")
            if entry is not None:  # a content id no tree holds would make a new machine skip changed files
                try:
                    treeobj.check_content(f"folder {path!r} of the commit", entry.content, tree)
                except CorruptionError as e:
                    raise HTTPError(400, str(e)) from None

        changed, _ = treeobj.changes(base, view, check=check_tree)
        new_chunks: set[bytes] = set()
        sizes: dict[str, set[int]] = {}
        for f in changed.values():
            if not ids.is_hex_id(f.manifest):
                raise HTTPError(400, f"invalid manifest name {f.manifest!r}")
            sizes.setdefault(f.manifest, set()).add(f.size)
        for name, wanted in sizes.items():  # each manifest read in slices: a huge one is no memory bomb
            try:
                m = ManifestFile(self.store, name)
            except CorruptionError:
                raise HTTPError(409, f"manifest {name} is not on the server: upload it first") from None
            if wanted != {m.size}:
                raise HTTPError(400, f"a file size in the commit does not match manifest {name} ({m.size} bytes)")
            prove = scope is not None and not self.access.reaches(repo, "manifest", name)
            for chunk_ids in m.scan(self.limits.slice_chunks):  # checks its bytes against its name
                if prove:  # what the repo reaches already needs no new proof
                    new_chunks.update(chunk_ids)
                    if len(new_chunks) >= self.limits.slice_chunks:
                        self.server.require_visible(scope, new_chunks, "the commit")
                        new_chunks.clear()
        self.server.require_visible(scope, new_chunks, "the commit")  # manifest names can be guessed or learned
        return self.access.commit(commit, branch, expected)

"""Job journals and manifest presence over the wire (protocol 1.5, additive; docs/protocol.md).

Server routes (a write token with access to REPO; job ids are 32 hex digits):

- `PUT /repos/{repo}/jobs/{job}` opens a job (writes its marker) or touches it (a heartbeat).
- `POST /repos/{repo}/jobs/{job}/entries` with one journal entry object (storage/staging.py's
  JSON): each manifest it names must be on the server (409 otherwise; for a token scoped to some
  repos this is checked when the job lands, as for any commit, so the answer is no oracle of
  other tenants' files); 409 `job_closed` when the job is over (the entry is not kept).
- `GET /repos/{repo}/jobs/{job}/entries`: every entry of the job, `{"batches": [[row, ...], ...]}`.
- `DELETE /repos/{repo}/jobs/{job}` closes it: the marker, then the entries.
- `POST /repos/{repo}/manifests/query` `{"manifests": [names]}` -> `{"present": [names]}`: which
  of these manifests the server holds; a token scoped to some repos learns only of those REPO
  reaches (nothing leaks of other tenants' files).

The client side is `RemoteJournal` (the journal role over a `RemoteStore`) and `manifests_present`.
"""
from __future__ import annotations

import json

from aiohttp import web

from ..core import ids
from ..core.errors import ConflictError, InvalidAddressError, NotFoundError
from ..storage import staging

MAX_PRESENCE_NAMES = 65536


class StagingRoutes:
    """Handlers of the job-journal and manifest-presence routes of one Server."""

    def __init__(self, server):
        self.server = server

    def _job(self, request) -> tuple[str, str]:
        repo = self.server._repo(request, write=True)
        return repo, staging.check_job(request.match_info["job"])

    async def open_job(self, request):
        repo, job = self._job(request)
        await self.server._io(staging.open_job, self.server.store, repo, job)
        return web.json_response({"job": job})

    async def add_entries(self, request):
        repo, job = self._job(request)
        data = await self.server._body(request, self.server.limits.max_json_bytes)
        rows = staging.decode(data, "the uploaded journal entry")
        entries = dict(rows)
        if len(entries) != len(rows):
            raise InvalidAddressError("one journal entry names a path twice")
        if self.server.auth.scope(request) is None:  # a scoped token would learn of other tenants' files:
            await self.server._io(self._check_manifests, entries)  # the commit checks what it may name
        try:
            name = await self.server._io(staging.add, self.server.store, repo, job, entries)
        except staging.JobClosedError as e:
            return web.json_response({"error": str(e), "code": e.code}, status=409)
        return web.json_response({"entry": name.rsplit("/", 1)[1]}, status=201)

    def _check_manifests(self, entries: dict) -> None:
        for path, e in entries.items():
            if e is not None and not self.server.store.has_manifest(e.manifest):
                raise ConflictError(f"{path!r}: manifest {e.manifest} is not on the server: upload the file first")

    async def list_entries(self, request):
        repo, job = self._job(request)
        batches = await self.server._io(staging.batches, self.server.store, repo, job)
        out = [[{"path": p, "remove": True} if e is None else {"path": p, "manifest": e.manifest, "size": e.size}
                for p, e in rows] for rows in batches]
        return web.json_response({"batches": out})

    async def close_job(self, request):
        repo, job = self._job(request)
        n = await self.server._io(staging.close, self.server.store, repo, job)
        return web.json_response({"deleted": n})

    async def manifests_query(self, request):
        repo = self.server._repo(request, write=False)
        doc = await self.server._json(request)
        names = doc.get("manifests")
        if not isinstance(names, list) or len(names) > MAX_PRESENCE_NAMES or \
                not all(isinstance(n, str) and ids.is_hex_id(n) for n in names):
            raise InvalidAddressError(f'expected {{"manifests": [manifest ids]}}, at most {MAX_PRESENCE_NAMES}')
        scope = self.server.auth.scope(request)
        present = await self.server._io(self._present, repo, names, scope)
        return web.json_response({"present": present})

    def _present(self, repo: str, names: list[str], scope) -> list[str]:
        store = self.server.store
        held = [n for n in dict.fromkeys(names) if store.has_manifest(n)]
        if scope is None:
            return held
        access = self.server.access
        seen = [n for n in held if access.reaches(repo, "manifest", n)]
        if len(seen) < len(held) and access.refresh(repo):  # landed through another replica
            seen = [n for n in held if access.reaches(repo, "manifest", n)]
        return seen

    def routes(self, api: str) -> list:
        return [
            web.put(f"{api}/repos/{{repo}}/jobs/{{job}}", self.open_job),
            web.post(f"{api}/repos/{{repo}}/jobs/{{job}}/entries", self.add_entries),
            web.get(f"{api}/repos/{{repo}}/jobs/{{job}}/entries", self.list_entries),
            web.delete(f"{api}/repos/{{repo}}/jobs/{{job}}", self.close_job),
            web.post(f"{api}/repos/{{repo}}/manifests/query", self.manifests_query),
        ]


# -- the client side ---------------------------------------------------------------------------------
class RemoteJournal:
    """The journal role (open, add, batches, close) over a `RemoteStore`."""

    def __init__(self, remote):
        self.remote = remote

    def _path(self, repo: str, job: str) -> str:
        return f"/repos/{repo}/jobs/{staging.check_job(job)}"

    def open(self, repo: str, job: str) -> None:
        try:
            self.remote._json("PUT", self._path(repo, job), body=b"{}", headers={"Content-Type": "application/json"})
        except NotFoundError as e:
            if "no repo" in str(e):
                raise
            raise NotFoundError(f"the server at {self.remote.location} has no job journals (protocol 1.5): "
                                f"upgrade it to run deferred commits and fsspec transactions") from None

    def add(self, repo: str, job: str, entries: dict) -> None:
        self.remote._call("POST", self._path(repo, job) + "/entries", body=staging.encode(entries),
                          headers={"Content-Type": "application/json"})

    def batches(self, repo: str, job: str) -> list:
        doc = self.remote._json("GET", self._path(repo, job) + "/entries")
        out = []  # each batch validated as if read from the store
        for rows in doc.get("batches", []):
            out.append(staging.decode(json.dumps({"format": staging.JOURNAL_VERSION, "entries": rows}).encode(),
                                      "a journal entry from the server"))
        return out

    def close(self, repo: str, job: str) -> None:
        self.remote._call("DELETE", self._path(repo, job))


def manifests_present(remote, repo: str, names: list[str]) -> set[str] | None:
    """Which manifests the server holds (that `repo` reaches, for a scoped token): one request per
    65,536 names; None from a server before protocol 1.5 (no such route)."""
    out: set[str] = set()
    for i in range(0, len(names), MAX_PRESENCE_NAMES):
        part = names[i:i + MAX_PRESENCE_NAMES]
        try:
            doc = remote._json("POST", f"/repos/{repo}/manifests/query", body=json.dumps({"manifests": part}).encode(),
                               headers={"Content-Type": "application/json"})
        except NotFoundError as e:
            if "no repo" in str(e) or getattr(e, "code", "") == "repo_not_found":
                return set()
            return None
        asked = set(part)
        out.update(n for n in doc.get("present", []) if n in asked)
    return out

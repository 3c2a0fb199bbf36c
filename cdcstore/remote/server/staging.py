"""Job journals and manifest presence over the wire (protocol 1.5, additive; docs/protocol.md).

Server routes (a write token with access to REPO; job ids are 32 hex digits):

- `PUT /repos/{repo}/jobs/{job}` opens a job (writes its marker) or touches it (a heartbeat).
- `POST /repos/{repo}/jobs/{job}/entries` with one journal entry object (storage/staging.py's
  JSON): each manifest it names must be on the server (409 otherwise); a token scoped to some
  repos may name only manifests REPO reaches or whose chunks it may see (uploaded), else 403,
  alike whether the manifest exists or not (no oracle of other tenants' files, and no pin on
  their data past its erasure: gc keeps what live jobs name); 409 `job_closed` when the job is
  over (the entry is not kept).
- Each token's journal space (the staging objects of the jobs it opened or wrote to, each
  counted as at least `staging.MIN_CHARGE` bytes) is capped by `max_journal_bytes_per_token`:
  an open or entry past it is a 413 naming the limit; gc frees dead jobs' space (`JournalSpace`).
  An open server (no tokens, loopback) trusts its callers: no cap.
- `GET /repos/{repo}/jobs/{job}/entries`: every entry of the job, `{"batches": [[row, ...], ...]}`.
- `DELETE /repos/{repo}/jobs/{job}` closes it: the marker, then the entries.
- `POST /repos/{repo}/manifests/query` `{"manifests": [names]}` -> `{"present": [names]}`: which
  of these manifests the server holds; a token scoped to some repos learns only of those REPO
  reaches (nothing leaks of other tenants' files).

The client side is `remote/client/journal.py` (it imports no server code).
"""
from __future__ import annotations

import threading
import time

from aiohttp import web

from ...core import ids
from ...core.errors import ConflictError, CorruptionError, InvalidAddressError, NotFoundError
from ...storage import staging
from ...storage.manifest_file import ManifestFile
from ..client.journal import MAX_PRESENCE_NAMES
from .routes import HTTPError

RECOUNT = 30.0  # seconds a token's counted journal space is trusted before the next listing


class JournalSpace:
    """Each token's journal bytes (`staging.usage`), counted from one listing of staging/ at most
    every RECOUNT seconds and kept up to date in between; a request that would go past the limit
    is counted again first (at most once a second: gc may have freed space meanwhile)."""

    def __init__(self, store, limit: int):
        self.store, self.limit = store, limit
        self._lock = threading.Lock()
        self._used: dict[str, int] = {}
        self._jobs: dict[str, int] = {}  # owner -> jobs it holds open (journal jobs and uploads)
        self._at = -RECOUNT

    def forget(self) -> None:
        """Count again at the next request (after a gc on this server)."""
        with self._lock:
            self._at = -RECOUNT

    def _recount(self) -> None:
        (self._used, self._jobs), self._at = staging.usage_and_jobs(self.store), time.monotonic()

    def open_job(self, owner: str, most: int, what: str = "max_open_uploads_per_token") -> None:
        """Count one more open job for `owner`, or a 413 naming `what` when it holds `most` already
        (counted again first, at most once a second: jobs may have ended meanwhile)."""
        with self._lock:
            age = time.monotonic() - self._at
            if age >= RECOUNT or (self._jobs.get(owner, 0) + 1 > most and age >= 1.0):
                self._recount()
            held = self._jobs.get(owner, 0)
            if held + 1 > most:
                raise HTTPError(413, f"this token holds {held} open jobs or uploads, the most it may ({what}: "
                                     f"{most}): complete or abort some first (gc ends abandoned ones)")
            self._jobs[owner] = held + 1

    def reserve(self, owner: str, n: int) -> None:
        """Count `n` more bytes for `owner`, or a 413 when that is past the limit."""
        with self._lock:
            age = time.monotonic() - self._at
            if age >= RECOUNT or (self._used.get(owner, 0) + n > self.limit and age >= 1.0):
                self._recount()
            used = self._used.get(owner, 0)
            if used + n > self.limit:
                raise HTTPError(413, f"this token's job journals hold {used} bytes; one more entry of {n} is over "
                                     f"its limit of {self.limit} (max_journal_bytes_per_token): land or close its "
                                     f"jobs (gc frees the journals of dead ones)")
            self._used[owner] = used + n


class StagingRoutes:
    """Handlers of the job-journal and manifest-presence routes of one Server."""

    def __init__(self, server):
        self.server = server

    def _job(self, request) -> tuple[str, str]:
        repo = self.server.checked_repo(request, write=True)
        return repo, staging.check_job(request.match_info["job"])

    def _owner(self, request) -> str | None:
        """Whose journal space a request uses: its token's (None on an open server: no cap)."""
        return None if self.server.auth.tokens is None else self.server.auth.owner(request)

    async def open_job(self, request):
        repo, job = self._job(request)
        await self.server.io(self._open, repo, job, self._owner(request))
        return web.json_response({"job": job})

    def _open(self, repo: str, job: str, owner: str | None) -> None:
        store = self.server.store
        if owner is not None and not staging.is_open(store, repo, job):  # a heartbeat costs nothing more
            self.server.journals.reserve(owner, 2 * staging.MIN_CHARGE)  # the marker and the owner record
        staging.open_job(store, repo, job)
        if owner is not None:
            staging.claim(store, repo, job, owner)

    async def add_entries(self, request):
        repo, job = self._job(request)
        data = await self.server.read_body(request, self.server.limits.max_json_bytes)
        rows = staging.decode(data, "the uploaded journal entry")
        entries = dict(rows)
        if len(entries) != len(rows):
            raise InvalidAddressError("one journal entry names a path twice")
        scope = self.server.auth.scope(request)
        if scope is None:
            await self.server.io(self._check_manifests, entries)
        else:
            await self.server.io(self._check_readable, repo, scope, entries)
        try:
            name = await self.server.io(self._add, repo, job, entries, self._owner(request))
        except staging.JobClosedError as e:
            return web.json_response({"error": str(e), "code": e.code}, status=409)
        return web.json_response({"entry": name.rsplit("/", 1)[1]}, status=201)

    def _add(self, repo: str, job: str, entries: dict, owner: str | None) -> str:
        if owner is not None:
            self.server.journals.reserve(owner, staging.charge(len(staging.encode(entries))) + staging.MIN_CHARGE)
            staging.claim(self.server.store, repo, job, owner)
        return staging.add(self.server.store, repo, job, entries)

    def _check_manifests(self, entries: dict) -> None:
        for path, e in entries.items():
            if e is not None and not self.server.store.metadata.has_manifest(e.manifest):
                raise ConflictError(f"{path!r}: manifest {e.manifest} is not on the server: upload the file first")

    def _check_readable(self, repo: str, scope, entries: dict) -> None:
        """A scoped token names only manifests `repo` reaches or whose chunks it may see: one 403
        for another tenant's manifest and for one nobody stored (no oracle, no pin on erasure)."""
        server = self.server
        for path, e in entries.items():
            if e is None or server.access.reaches(repo, "manifest", e.manifest):
                continue
            try:
                for chunk_ids in ManifestFile(server.store, e.manifest).scan(server.limits.slice_chunks):
                    server.require_visible(scope, chunk_ids, "a journal entry")
            except (CorruptionError, NotFoundError, HTTPError):
                raise HTTPError(403, f"journal entry {path!r} names manifest {e.manifest}, which this token may "
                                     f"not read or the server lacks: upload the file first") from None

    async def list_entries(self, request):
        repo, job = self._job(request)
        batches = await self.server.io(staging.batches, self.server.store, repo, job)
        out = [[{"path": p, "remove": True} if e is None else {"path": p, "manifest": e.manifest, "size": e.size}
                for p, e in rows] for rows in batches]
        return web.json_response({"batches": out})

    async def close_job(self, request):
        repo, job = self._job(request)
        n = await self.server.io(staging.close, self.server.store, repo, job)
        return web.json_response({"deleted": n})

    async def manifests_query(self, request):
        repo = self.server.checked_repo(request, write=False)
        doc = await self.server.read_json(request)
        names = doc.get("manifests")
        if not isinstance(names, list) or len(names) > MAX_PRESENCE_NAMES or \
                not all(isinstance(n, str) and ids.is_hex_id(n) for n in names):
            raise InvalidAddressError(f'expected {{"manifests": [manifest ids]}}, at most {MAX_PRESENCE_NAMES}')
        scope = self.server.auth.scope(request)
        present = await self.server.io(self._present, repo, names, scope)
        return web.json_response({"present": present})

    def _present(self, repo: str, names: list[str], scope) -> list[str]:
        store = self.server.store
        held = [n for n in dict.fromkeys(names) if store.metadata.has_manifest(n)]
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

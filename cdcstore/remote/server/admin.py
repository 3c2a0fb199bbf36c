"""The server's lifecycle routes: push sessions (any write token) and administration (an admin
token): gc, check, forget, delete-repo run on the server's own store.

- `POST /sessions` opens a push session (the marker gc counts before it marks; it waits a moment
  while a gc runs, then answers 503 busy); `PUT /sessions/{id}` refreshes it, `DELETE` closes it.
  A session is an object of the store, named by its id, so any replica refreshes or closes it.
  A replica keeps at most `ServerLimits.max_sessions` open sessions, `max_sessions_per_token` of
  them for one token (429 past it); a session older than `max_session_life` is refused a refresh
  and removed (409): no client holds gc off forever.
- `POST /admin/{command}` with a JSON object of the command's options. gc's grace window has a
  floor (`ServerConfig.min_gc_grace`): a client cannot know of other clients' uploads in flight
  the way a local gc knows of its own machine's. One gc at a time per server process.
"""
from __future__ import annotations

import asyncio
import json
import re
import secrets
import time

from aiohttp import web

from ...core.address import check_name
from ...core.errors import BusyError, ConflictError, InvalidAddressError
from ...storage import check, maintenance
from ...storage.objects import NotFound, StorageError

SESSION_ID = re.compile(r"^[0-9a-f]{32}$")
SESSION_WAIT = 20.0  # seconds a session request waits for a running gc before 503
_OPTIONS: dict[str, dict[str, tuple[type, ...]]] = {  # command -> option -> accepted types
    "gc": {"grace": (int, float), "dry_run": (bool,), "repack_dead": (int, float), "max_unused": (int, float)},
    "check": {"read_data": (bool,), "subset": (int, float)},
    "forget": {"repo": (str,), "keep_last": (int,), "keep_within": (int, float), "keep_tags": (bool,),
               "dry_run": (bool,)},
    "delete-repo": {"repo": (str,), "dry_run": (bool,)},
}


def options(command: str, doc: dict) -> dict:
    """The options of an admin request, checked (unknown names and wrong types are a 400)."""
    allowed = _OPTIONS.get(command)
    if allowed is None:
        raise InvalidAddressError(f"no admin command {command!r}: one of {', '.join(sorted(_OPTIONS))}")
    out = {}
    for k, v in doc.items():
        if k not in allowed:
            raise InvalidAddressError(f"{command} has no option {k!r}: it takes {', '.join(sorted(allowed))}")
        if v is None:
            continue
        if not isinstance(v, allowed[k]) or (isinstance(v, bool) and bool not in allowed[k]):
            raise InvalidAddressError(f"{command} option {k!r} must be {' or '.join(t.__name__ for t in allowed[k])}")
        out[k] = v
    return out


class Lifecycle:
    """Handlers of the session and admin routes of one Server."""

    def __init__(self, server):
        self.server = server
        self._gc = asyncio.Lock()
        self._open: dict[str, tuple[str, float]] = {}  # session id -> (owner, last open or refresh), this replica

    def _admit(self, owner: str) -> None:
        """Refuse a new session past the limits (sessions not refreshed for a lease are dead)."""
        limits, now = self.server.limits, time.monotonic()
        for sid, (_, seen) in list(self._open.items()):
            if now - seen >= maintenance.SERVER_LEASE:
                del self._open[sid]
        mine = sum(1 for o, _ in self._open.values() if o == owner)
        if len(self._open) >= limits.max_sessions or mine >= limits.max_sessions_per_token:
            raise web.HTTPTooManyRequests(
                reason=f"too many open push sessions ({mine} of this token, {len(self._open)} in all; the limits "
                       f"are {limits.max_sessions_per_token} and {limits.max_sessions}): finish or close a push first",
                headers={"Retry-After": str(int(maintenance.SERVER_REFRESH))})

    # -- push sessions (write scope) ---------------------------------------------------------
    def _session(self, request: web.Request, sid: str | None = None) -> maintenance.PushSession:
        self.server.auth.check(request, None, write=True)
        sid = sid or request.match_info["id"]
        if not SESSION_ID.match(sid):
            raise InvalidAddressError("a session id is 32 hex digits, as `POST /sessions` returned it")
        return maintenance.PushSession(self.server.store, timeout=SESSION_WAIT, name=f"srv-{sid}", heartbeat=False)

    async def open_session(self, request):
        sid = secrets.token_hex(16)
        session = self._session(request, sid)
        owner = self.server.auth.owner(request)  # each session its own on an open server: the total caps them
        self._admit(owner)
        self._open[sid] = (owner, time.monotonic())
        try:
            await self.server.io(session.__enter__)  # BusyError: 503, Retry-After
        except BaseException:
            self._open.pop(sid, None)
            raise
        if self.server.store.shared:  # a bucket: gc or repack through another replica
            await self.server.io(self.server.store.packs.recover)  # what this push is told is present is there now
        return web.json_response({"session": sid, "refresh": maintenance.SERVER_REFRESH})

    async def refresh_session(self, request):
        s = self._session(request)
        sid = request.match_info["id"]
        await self.server.io(self._refresh, s, sid)
        if sid in self._open:
            self._open[sid] = (self._open[sid][0], time.monotonic())
        return web.json_response({"ok": True})

    def _refresh(self, s: maintenance.PushSession, sid: str) -> None:
        """Touch a session, unless it is older than `max_session_life` (then it is removed)."""
        try:
            started = json.loads(self.server.store.session_marker(s.name))["started"]
        except NotFound:
            raise ConflictError(f"push session {sid} is over (expired or closed): open a new one") from None
        except (StorageError, ValueError, KeyError, TypeError):
            started = None
        life = self.server.limits.max_session_life
        if isinstance(started, (int, float)) and time.time() - started > life:
            s.__exit__(None, None, None)
            self._open.pop(sid, None)
            raise ConflictError(f"push session {sid} is older than this server's limit of {life:g} s: it is "
                                f"closed: gc may run, and a push that still runs may have its commit refused (push again)")
        s.refresh()

    async def close_session(self, request):
        s = self._session(request)
        await self.server.io(s.__exit__, None, None, None)
        self._open.pop(request.match_info["id"], None)
        return web.json_response({"ok": True})

    # -- administration (admin scope) --------------------------------------------------------
    async def run(self, request):
        self.server.auth.check_admin(request)
        command = request.match_info["command"]
        opts = options(command, await self.server.read_json(request))
        store = self.server.store
        if command == "gc":
            floor = self.server.config.min_gc_grace
            grace = opts.setdefault("grace", max(floor, maintenance.DEFAULT_GRACE))
            if grace < floor:
                raise InvalidAddressError(f"a grace of {grace:g} s is under this server's minimum of {floor:g} s "
                                          f"(uploads of other clients may be in flight): pass a longer --grace, "
                                          f"or serve with a lower --min-gc-grace")
            if self._gc.locked():
                raise BusyError("a gc is already running on this server: wait for it to finish")
            async with self._gc:
                done = await self.server.io(lambda: maintenance.gc(store, **opts))
            self.server.journals.forget()  # the jobs' journals it freed
            return web.json_response(done)
        if command == "check":
            return web.json_response(await self.server.io(lambda: check.check(store, **opts)))
        repo = check_name("repo", opts.pop("repo", ""))
        if command == "forget":
            return web.json_response(await self.server.io(lambda: maintenance.forget(store, repo, **opts)))
        return web.json_response(await self.server.io(lambda: self.server.access.delete_repo(repo, **opts)))

    def routes(self, api: str) -> list:
        return [
            web.post(f"{api}/sessions", self.open_session),
            web.put(f"{api}/sessions/{{id}}", self.refresh_session),
            web.delete(f"{api}/sessions/{{id}}", self.close_session),
            web.post(f"{api}/admin/{{command}}", self.run),
        ]

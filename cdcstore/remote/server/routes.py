"""What the server's route modules (server, staging, batches, admin, gateway) share, below them
all: the base of a group of handlers, the error a route raises to answer with a status, the app's
keys, and error-message sanitizing."""
from __future__ import annotations

import re

from aiohttp import web


class RouteGroup:
    """A group of a `server.Server`'s handlers (packs, metadata, refs): what each reaches of it."""

    def __init__(self, server):
        self.server, self.store, self.access = server, server.store, server.access
        self.auth, self.limits, self.io = server.auth, server.limits, server.io

    def routes(self, api: str) -> list:
        """The group's aiohttp routes under `api`."""
        raise NotImplementedError


class HTTPError(Exception):
    """An answer with `status` (and `headers`) whose body carries `message`."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


STORE_ROOTS = web.AppKey("store_roots", tuple)
SERVER = web.AppKey("server", object)  # the app's Server (the S3 gateway, remote/gateway/reads.py, serves over it)
_REPO_LIST = re.compile(r" \(repos: [^)]*\)")


def sanitize(message: str, roots: tuple) -> str:
    """An error message without the server's paths or the list of other tenants' repos."""
    for root in roots:
        message = message.replace(f"store {root}", "the server's store").replace(root, "the server's store")
    return _REPO_LIST.sub("", message)

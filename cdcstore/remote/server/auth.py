"""The server's bearer tokens: who a request is by and what it may read or write (`Auth`, `Scope`).

`None` tokens means an open (loopback) server that trusts every client with everything.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web

from .limits import ANONYMOUS
from .routes import HTTPError
from .tokens import TokenFile, default_name, owner_id, refusal

log = logging.getLogger("cdcstore.server")


@dataclass(frozen=True)
class Scope:
    """A token limited to some repos: it sees chunks those repos reach and chunks it uploaded."""

    repos: tuple[str, ...]
    owner: str  # a hash of the token (tokens are never stored)


class Auth:
    """Bearer-token checks; `None` tokens means an open (loopback) server. A `TokenFile`'s
    tokens are looked up at each request: an edit of the file (a revoked token) counts
    from the next request on."""

    def __init__(self, tokens: dict | TokenFile | None):
        self._file = tokens if isinstance(tokens, TokenFile) else None
        self._tokens = None if isinstance(tokens, TokenFile) else tokens  # (that is: `_file` is None)

    @property
    def tokens(self) -> dict | None:
        return self._file.current() if self._file is not None else self._tokens

    def reload(self) -> None:
        """SIGHUP: read the tokens file again (a bad one keeps the tokens in force)."""
        if self._file is None:
            log.warning("SIGHUP: this server has no --tokens file to reload; it goes on serving")
        else:
            self._file.reload()

    def author(self, request: web.Request) -> str | None:
        """Who a push is by: the token's name (None on an open server: the client says)."""
        if self.tokens is None:
            return None
        token = request.headers.get("Authorization", "").strip().partition(" ")[2].strip()
        return self.grant(request).get("name") or default_name(token)

    def grant(self, request: web.Request) -> dict:
        tokens = self.tokens
        if tokens is None:
            return {"scope": "write", "repos": ["*"]}
        scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        grant = tokens.get(token) if token else None
        if grant is None:
            raise HTTPError(401, "this server does not know the token given: check --token or CDCSTORE_TOKEN "
                                 "(mistyped, revoked, or another server's)" if token else
                                 "this server needs a token: pass --token or set CDCSTORE_TOKEN",
                            {"WWW-Authenticate": "Bearer"})
        return grant

    def check_admin(self, request: web.Request) -> None:
        """An admin token (an open loopback server trusts every client with everything)."""
        if self.grant(request)["scope"] != "admin" and self.tokens is not None:
            raise HTTPError(403, "this command needs a token with admin scope (gc, check, forget, delete-repo)")

    def check(self, request: web.Request, repo: str | None, write: bool) -> None:
        problem = refusal(self.grant(request), repo, write)  # the S3 gateway's writes ask it too
        if problem:
            raise HTTPError(403, problem)

    def scope(self, request: web.Request) -> Scope | None:
        """What a request's token may learn of: None for an open server or a "*" token
        (everything), else its repos and an owner id for the chunks it uploads."""
        g = self.grant(request)
        if "*" in g["repos"]:
            return None
        token = request.headers.get("Authorization", "").strip().partition(" ")[2].strip()
        return Scope(tuple(g["repos"]), owner_id(token))

    def owner(self, request: web.Request) -> str:
        """Who holds a slot or a session: a hash of the token (each request on an open server)."""
        if self.tokens is None:
            return f"{ANONYMOUS}{id(request)}"
        token = request.headers.get("Authorization", "").strip().partition(" ")[2].strip()
        return owner_id(token)

    def visible(self, request: web.Request, repos: list[str]) -> list[str]:
        g = self.grant(request)
        return repos if "*" in g["repos"] else [r for r in repos if r in g["repos"]]

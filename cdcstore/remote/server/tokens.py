"""The tokens file of `cdcstore serve --tokens FILE` (docs/protocol.md, "Authentication").

    {"TOKEN": {"scope": "read" | "write" | "admin", "repos": ["*"] | [names], "name": "ci-bot"}}

`name` (optional) is who the token is: the author recorded on every commit pushed with it
(default `token-` and 8 hex digits of a hash of the token; the token itself is never stored).
A running server sees an edit of the file within `CHECK_EVERY` seconds (and at once on
SIGHUP): a token taken out of the file is refused (401) from its next request on, sessions
already open included. A file that does not load (bad JSON, a bad grant, gone) leaves the
tokens loaded before in force, and the server logs why. `revoke` and `add` edit the file
atomically (`cdcstore token revoke|add`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import tempfile
import time

from ... import runtime
from ...core.commit import check_author
from ...core.errors import InvalidAddressError

log = logging.getLogger("cdcstore.server")

CHECK_EVERY = 0.25  # seconds between looks at the file's stat (a revoked token: refused within this)
SCOPES = ("read", "write", "admin")
GRANT_FORM = ('{"scope": "read", "write" or "admin", "repos": ["*"] or a list of repo names, '
              '"name": optional, who the token is}')


def owner_id(token: str) -> str:
    """A hash of the token: who holds slots, sessions and uploads (tokens are never stored)."""
    return hashlib.blake2b(token.encode(), digest_size=16).hexdigest()


def default_name(token: str) -> str:
    return f"token-{owner_id(token)[:8]}"


def refusal(grant: dict, repo: str | None, write: bool) -> str | None:
    """Why a token's grant does not allow a request on `repo` (for writing if `write`); None when
    it does. The native API and the S3 gateway both ask this."""
    if write and grant["scope"] not in ("write", "admin"):
        return "this token may only read: use a token with write scope"
    if repo is not None and "*" not in grant["repos"] and repo not in grant["repos"]:
        return f"this token has no access to repo {repo!r}"
    return None


def load_tokens(path: str) -> dict:
    """Read and check a tokens file: token -> grant, each grant with its `name` filled in
    (admin: write, plus gc, check, forget and delete-repo on the server's store; repos ["*"])."""
    with open(path) as f:
        try:
            doc = json.load(f)
        except ValueError as e:
            raise InvalidAddressError(f"tokens file {path} is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidAddressError(f"tokens file {path} must hold a JSON object of token -> grant")
    out = {}
    for token, grant in doc.items():
        if (not token or not isinstance(grant, dict) or grant.get("scope") not in SCOPES
                or not isinstance(grant.get("repos"), list)):
            raise InvalidAddressError(f"tokens file {path}: the grant of a token must look like {GRANT_FORM}")
        if grant["scope"] == "admin" and grant["repos"] != ["*"]:
            raise InvalidAddressError(f'tokens file {path}: an admin token runs gc over the whole store: '
                                      f'its repos must be ["*"]')
        name = grant.get("name", default_name(token))
        try:
            check_author(name)
        except ValueError as e:
            raise InvalidAddressError(f"tokens file {path}: token name: {e}") from None
        out[token] = {**grant, "name": name}
    return out


def _signature(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino  # ctime: an edit that put mtime back


class TokenFile:
    """The tokens of a file, loaded again when its stat changes (looked at no more than every
    `CHECK_EVERY` s, by `current()`) or on `reload()`. A version of the file that does not
    load keeps the tokens loaded before, logged once with the reason."""

    def __init__(self, path: str):
        self.path = path
        self._sig = _signature(path)
        self.tokens = load_tokens(path)  # a bad file at start: the server does not start
        self._checked = time.monotonic()

    def current(self) -> dict:
        now = time.monotonic()
        if now - self._checked >= CHECK_EVERY:
            self._checked = now
            sig = _signature(self.path)
            if sig != self._sig:
                self._load(sig)
        return self.tokens

    def reload(self) -> bool:
        """Load the file now (SIGHUP); False when it does not load (the old tokens stay)."""
        self._checked = time.monotonic()
        return self._load(_signature(self.path))

    def _load(self, sig) -> bool:
        self._sig = sig
        try:
            tokens = load_tokens(self.path)
        except (OSError, InvalidAddressError) as e:
            log.error("tokens NOT reloaded: %s; the %d tokens loaded before stay in force until the file is "
                      "fixed (it is read again when it changes, or on SIGHUP)", e, len(self.tokens))
            return False
        gone = len(set(self.tokens) - set(tokens))
        self.tokens = tokens
        log.warning("tokens file %s reloaded: %d tokens (%d taken out)", self.path, len(tokens), gone)
        return True


def _read_doc(path: str) -> dict:
    load_tokens(path)  # a file that does not load is never rewritten
    with open(path) as f:
        return json.load(f)


def _write_doc(path: str, doc: dict) -> None:
    """Replace the file atomically (the server never reads half of it), keeping its mode."""
    folder = os.path.dirname(os.path.abspath(path))
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o600
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tokens-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _editing(path: str):
    """Edits of the tokens file take turns (a lock file beside it, `.NAME.lock`): each reads the
    file under the lock and replaces it atomically before letting go, so that concurrent `add`s
    all land and a `revoke` is never undone by an edit that read the file before it."""
    folder, name = os.path.split(os.path.abspath(path))
    return runtime.file_lock(os.path.join(folder, f".{name}.lock"))


def revoke(path: str, who: str) -> list[str]:
    """Take out of the file every token named `who` (or the token `who` itself); the names
    taken out. A running server refuses them within `CHECK_EVERY` s."""
    with _editing(path):
        return _revoke(path, who)


def _revoke(path: str, who: str) -> list[str]:
    doc = _read_doc(path)
    gone = [t for t, g in doc.items() if t == who or g.get("name", default_name(t)) == who]
    if not gone:
        names = sorted(g.get("name", default_name(t)) for t, g in doc.items())
        raise InvalidAddressError(f"no token named {who!r} in {path} (names: {', '.join(names) or 'none'})")
    names = [doc[t].get("name", default_name(t)) for t in gone]
    for t in gone:
        del doc[t]
    _write_doc(path, doc)
    return names


def add(path: str, name: str, scope: str, repos: list[str]) -> str:
    """A new random token named `name` in the file (created if absent); the token."""
    check_author(name)
    with _editing(path):
        return _add(path, name, scope, repos)


def _add(path: str, name: str, scope: str, repos: list[str]) -> str:
    doc = _read_doc(path) if os.path.exists(path) else {}
    if any(g.get("name", default_name(t)) == name for t, g in doc.items()):
        raise InvalidAddressError(f"a token named {name!r} is in {path} already: pick another name, or "
                                  f"`cdcstore token revoke {name} --tokens {path}` first")
    token = secrets.token_urlsafe(32)
    doc[token] = {"scope": scope, "repos": list(repos) or ["*"], "name": name}
    if scope == "admin" and doc[token]["repos"] != ["*"]:
        raise InvalidAddressError('an admin token runs gc over the whole store: its repos must be ["*"]')
    _write_doc(path, doc)
    return token

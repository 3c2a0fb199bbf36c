"""`cdc://REPO[@REV]/PATH` addresses and the names inside them (pure logic)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidAddressError

SCHEME = "cdc://"
DEFAULT_BRANCH = "main"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_name(kind: str, name: str) -> str:
    """A repo or branch name: one path component of letters, digits, '.', '_', '-'."""
    if not _NAME.fullmatch(name or "") or name.endswith(".lock"):
        raise InvalidAddressError(
            f"invalid {kind} name {name!r}: use letters, digits, '.', '_' and '-', "
            f"starting with a letter or digit (at most 128 characters)"
        )
    return name


def is_commit_like(rev: str) -> bool:
    """4 or more hex digits: a commit id or a prefix of one, never a branch or tag."""
    return len(rev) >= 4 and all(c in "0123456789abcdefABCDEF" for c in rev)


def check_ref_name(kind: str, name: str) -> str:
    """A branch or tag name: a valid name that cannot be mistaken for a commit id."""
    check_name(kind, name)
    if is_commit_like(name):
        raise InvalidAddressError(
            f"invalid {kind} name {name!r}: 4 or more hex digits name a commit; "
            f"add a letter g-z, '.', '_' or '-' (e.g. 'v-{name}')")
    return name


def check_write_target(name: str) -> str:
    """The branch a write goes to: refuses a commit id (commits never change)."""
    if is_commit_like(name):
        raise InvalidAddressError(f"cannot write to {name!r}: a commit is immutable: push to a branch")
    return check_ref_name("branch", name)


def normalize_path(path: str) -> str:
    """A path inside a revision: '/'-separated, relative, no '.', '..' or empty parts.

    Returns '' for the root.
    """
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    for p in parts:
        if p == ".." or "\x00" in p:
            raise InvalidAddressError(f"invalid path {path!r}: '..' and NUL are not allowed in store paths")
        if _CONTROL.search(p):
            raise InvalidAddressError(f"invalid path {path!r}: control characters (tab, newline, ...) are not "
                                      f"allowed in store paths (S3 listings and terminals cannot show them): "
                                      f"rename the file")
        try:
            p.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidAddressError(f"invalid path {path!r}: not valid UTF-8 (the local file name's bytes are "
                                      f"not UTF-8): rename the file") from None
    return "/".join(parts)


MAX_NAME_BYTES = 255  # one path part (Linux's NAME_MAX: a pull must be able to write the file)
MAX_PATH_BYTES = 1024  # a whole path (S3 caps a key at 1,024 bytes)


def check_write_path(path: str) -> str:
    """A path a commit may add (normalized): within MAX_NAME_BYTES a part and MAX_PATH_BYTES in
    all, UTF-8. Paths already in a store are read whatever their length; only new ones are held
    to this (issue 43: a 2,000-byte name was stored, then no pull could write it)."""
    p = normalize_path(path)
    if len(p.encode()) > MAX_PATH_BYTES:
        raise InvalidAddressError(f"path {p[:60]!r}... is {len(p.encode())} bytes: at most {MAX_PATH_BYTES} "
                                  f"(S3's key limit): shorten it")
    for part in p.split("/"):
        if len(part.encode()) > MAX_NAME_BYTES:
            raise InvalidAddressError(f"name {part[:60]!r}... is {len(part.encode())} bytes: at most "
                                      f"{MAX_NAME_BYTES} a name (no file system could hold it): shorten it")
    return p


@dataclass(frozen=True)
class Address:
    repo: str
    rev: str | None  # None means the default branch
    path: str  # '' is the root of the revision

    @property
    def ref(self) -> str:
        return self.rev or DEFAULT_BRANCH

    def __str__(self) -> str:
        rev = f"@{self.rev}" if self.rev else ""
        return f"{SCHEME}{self.repo}{rev}/{self.path}"


def parse(url: str) -> Address:
    """Parse `cdc://REPO[@REV]/PATH` (the scheme may be omitted)."""
    rest = url[len(SCHEME):] if url.startswith(SCHEME) else url
    if "://" in rest:
        raise InvalidAddressError(f"not a cdc:// address: {url!r} (expected cdc://REPO[@REV]/PATH)")
    head, _, path = rest.partition("/")
    repo, at, rev = head.partition("@")
    if not repo:
        raise InvalidAddressError(f"address {url!r} names no repo (expected cdc://REPO[@REV]/PATH)")
    check_name("repo", repo)
    if at and not rev:
        raise InvalidAddressError(f"address {url!r} has an empty revision after '@'")
    if rev:
        check_name("revision", rev)
    return Address(repo, rev or None, normalize_path(path))

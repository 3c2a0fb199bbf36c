"""Errors that name the problem and the fix.

Each subclasses the built-in exception a Python user would expect to catch
(FileNotFoundError for a missing repo, revision or path, FileExistsError for a
lost race, ValueError for malformed input) as well as `CdcError`.
"""
from __future__ import annotations

from typing import Iterator


class CdcError(Exception):
    """Base class of every error cdcstore raises on purpose. `code` names the kind on the
    wire (an error body's "code"), so a client maps it back without reading the message."""

    code = "error"


class NotAStoreError(CdcError, FileNotFoundError):
    """A path that should hold a store does not."""

    code = "not_a_store"


class StoreFormatError(CdcError, ValueError):
    """A store written by an incompatible version of cdcstore."""

    code = "store_format"


class NotFoundError(CdcError, FileNotFoundError):
    """Something named does not exist (a remote 404 maps here)."""

    code = "not_found"


class RepoNotFoundError(NotFoundError):
    code = "repo_not_found"


class RevisionNotFoundError(NotFoundError):
    code = "revision_not_found"


class PathNotFoundError(NotFoundError):
    """A path that is not in a revision, or a local path that does not exist."""

    code = "path_not_found"


class InvalidAddressError(CdcError, ValueError):
    """A malformed cdc:// address, repo, branch or path name."""

    code = "invalid"


class ConflictError(CdcError, FileExistsError):
    """A commit lost a race: the branch moved since the push started."""

    code = "conflict"


class CorruptionError(CdcError, OSError):
    """Stored bytes do not match their hash or their format."""

    code = "corrupt"


class PackMissingError(CorruptionError):
    """A pack the index names is gone: damage, or a gc that moved its chunks since they
    were located (a reader locates them again once)."""
    code = "pack_missing"


class MissingChunksError(CdcError, FileNotFoundError):
    """A commit names chunks the store does not hold now (a gc on another machine deleted
    what this machine's index still listed): nothing was committed; pushing again uploads them."""
    code = "missing_chunks"


class AccessDeniedError(CdcError, PermissionError):
    """The server refused the token (401) or its scope (403)."""

    code = "access_denied"


class RemoteError(CdcError, ConnectionError):
    """The server could not be reached or kept failing after retries, or answered
    with an error that has no closer Python equivalent."""

    code = "remote"


class RefExistsError(CdcError, FileExistsError):
    """A branch or tag of that name already exists (tags are never overwritten)."""

    code = "ref_exists"


class BusyError(CdcError, TimeoutError):
    """The store is busy with something that excludes this request (a running gc); try later."""

    code = "busy"


def damaged_message(err: Exception) -> str:
    """The one line for a chunk index sqlite reports as damaged."""
    return f"the chunk index is damaged ({err}): run `cdcstore rebuild-index`"


def _subclasses(cls: type[CdcError]) -> Iterator[type[CdcError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def error_class(code: str) -> type[CdcError] | None:
    """The error class a wire error code names (None for an unknown or generic code)."""
    found: dict[str, type[CdcError]] = {}
    for c in _subclasses(CdcError):  # depth first: a general class before a subclass sharing its code
        found.setdefault(c.code, c)
    return found.get(code)

"""Errors that name the problem and the fix.

Each subclasses the built-in exception a Python user would expect to catch
(FileNotFoundError for a missing repo, revision or path, FileExistsError for a
lost race, ValueError for malformed input) as well as `CdcError`.
"""
from __future__ import annotations


class CdcError(Exception):
    """Base class of every error cdcstore raises on purpose."""


class NotAStoreError(CdcError, FileNotFoundError):
    """A path that should hold a store does not."""


class StoreFormatError(CdcError, ValueError):
    """A store written by an incompatible version of cdcstore."""


class NotFoundError(CdcError, FileNotFoundError):
    """Something named does not exist (a remote 404 maps here)."""


class RepoNotFoundError(NotFoundError):
    pass


class RevisionNotFoundError(NotFoundError):
    pass


class PathNotFoundError(NotFoundError):
    """A path that is not in a revision, or a local path that does not exist."""


class InvalidAddressError(CdcError, ValueError):
    """A malformed cdc:// address, repo, branch or path name."""


class ConflictError(CdcError, FileExistsError):
    """A commit lost a race: the branch moved since the push started."""


class CorruptionError(CdcError, OSError):
    """Stored bytes do not match their hash or their format."""


class AccessDeniedError(CdcError, PermissionError):
    """The server refused the token (401) or its scope (403)."""


class RemoteError(CdcError, ConnectionError):
    """The server could not be reached or kept failing after retries, or answered
    with an error that has no closer Python equivalent."""


class RefExistsError(CdcError, FileExistsError):
    """A branch or tag of that name already exists (tags are never overwritten)."""


def damaged_message(err: Exception) -> str:
    """The one line for a chunk index sqlite reports as damaged."""
    return f"the chunk index is damaged ({err}): run `cdcstore rebuild-index`"

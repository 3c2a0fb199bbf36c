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


class RepoNotFoundError(CdcError, FileNotFoundError):
    pass


class RevisionNotFoundError(CdcError, FileNotFoundError):
    pass


class PathNotFoundError(CdcError, FileNotFoundError):
    """A path that is not in a revision, or a local path that does not exist."""


class InvalidAddressError(CdcError, ValueError):
    """A malformed cdc:// address, repo, branch or path name."""


class ConflictError(CdcError, FileExistsError):
    """A commit lost a race: the branch moved since the push started."""


class CorruptionError(CdcError, OSError):
    """Stored bytes do not match their hash or their format."""

"""The dumb object backend: named byte objects, written once, read whole or by range.

In the spirit of restic's backend and zarr v3's store ABC: a backend knows nothing of
packs, manifests or commits. It puts an object once, reads it whole or by byte range,
stats, lists by prefix, deletes, and makes conditional puts (the compare-and-swap that
moves a ref). Everything above it (formats, the chunk index, refs) is the repository
layer's business.

Names are `/`-separated components of `[A-Za-z0-9._-]`, each starting with a letter or
digit (`packs/ab/<id>.pack`, `repos/r/branches/main`): the same on a disk and in a
bucket, so no backend has to escape anything. Anything else is refused with
InvalidName before any I/O.

A *token* (an ETag) names one version of an object's contents; `put_if_match` succeeds
only while the object still has the token the caller read. Tokens are opaque strings;
equal contents may share a token (an A-B-A write is harmless: the state is the same).

Errors are typed and carry a `code` (for the wire): NotFound, AlreadyExists, Conflict,
InvalidName, StorageFull, Unavailable (transient: retry later), AccessDenied.
"""
from __future__ import annotations

import abc
import builtins
import dataclasses
import re
from typing import Iterator

from ..core import errors

MAX_NAME_BYTES = 1024  # S3's key limit
#: Bytes-like: what a put takes and a read gives (a bucket client may answer a memoryview).
Data = bytes | bytearray | memoryview
_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_PREFIX_CHARS = re.compile(r"[A-Za-z0-9._/-]*")


# -- errors ---------------------------------------------------------------------------------
class StorageError(errors.CdcError, OSError):
    """Base of the object backend's errors; `code` names the kind on the wire."""
    code = "storage_error"
    transient = False


class NotFound(StorageError, errors.NotFoundError):
    code = "not_found"


class AlreadyExists(StorageError, FileExistsError):
    """A create-only put found the name taken (by another object)."""
    code = "already_exists"


class Conflict(StorageError, errors.ConflictError):
    """A conditional put lost a race: the object is there (put_if_absent) or changed
    since its token was read (put_if_match)."""
    code = "conflict"


class InvalidName(StorageError, errors.InvalidAddressError):
    code = "invalid_name"


class StorageFull(StorageError):
    code = "storage_full"


class AccessDenied(StorageError, PermissionError):
    code = "access_denied"


class Unavailable(StorageError, ConnectionError):
    """The storage could not be reached or kept failing after retries; safe to retry."""
    code = "unavailable"
    transient = True


class NoBucket(StorageError):
    """The bucket itself does not exist (a typo, or another endpoint): no object can be absent in it."""
    code = "no_bucket"


ERRORS_BY_CODE = {c.code: c for c in (StorageError, NotFound, AlreadyExists, Conflict, InvalidName,
                                      StorageFull, AccessDenied, Unavailable, NoBucket)}


# -- names ----------------------------------------------------------------------------------
def check_object_name(name: str) -> str:
    """`name` if it is a valid object name, else InvalidName saying what is wrong."""
    if not isinstance(name, str) or not name:
        raise InvalidName(f"object name {name!r} is empty or not a string: give a name like 'packs/ab/x.pack'")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise InvalidName(f"object name {name[:40]!r}... is longer than {MAX_NAME_BYTES} bytes: use a shorter name")
    for part in name.split("/"):
        if not _COMPONENT.fullmatch(part):
            raise InvalidName(f"object name {name!r} has a bad component {part!r}: components are 1-255 "
                              f"characters of [A-Za-z0-9._-] starting with a letter or digit, joined by '/'")
    return name


def check_prefix(prefix: str) -> str:
    """A listing prefix: '' or the start of a valid name (may end with '/')."""
    if not isinstance(prefix, str) or not _PREFIX_CHARS.fullmatch(prefix) or prefix.startswith("/") \
            or "//" in prefix or any(p.startswith(".") for p in prefix.split("/") if p):
        raise InvalidName(f"listing prefix {prefix!r} is not the start of an object name: use '' or e.g. 'packs/ab'")
    return prefix


# -- values ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared instead of discovered with getattr.

    supports_ranges          get_range reads only the range (else it reads the object)
    atomic_conditional_put   put_if_absent/put_if_match are atomic against every other
                             writer of the same storage (other processes and machines)
    local_path               `local_path(name)` gives a file to read in place (zero copy)
    """
    supports_ranges: bool = True
    atomic_conditional_put: bool = True
    local_path: bool = False


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """An object's name and size; `token` is its version token (from stat, always; from
    list, where the listing carries it, else None); `mtime` when it was written (epoch
    seconds, from list; what gc's grace window measures)."""
    name: str
    size: int
    token: str | None = None
    mtime: float | None = None


# -- the protocol ---------------------------------------------------------------------------
class ObjectStore(abc.ABC):
    """A flat namespace of immutable-by-default byte objects.

    Write order is the caller's business: an object is visible only once complete,
    and a put that returns is durable (local: fsynced; S3: acknowledged)."""

    capabilities: Capabilities
    url: str

    @property
    def identity(self) -> str:
        """What tells this store from every other one a machine may reach: the URL, plus
        the endpoint for a bucket (two S3 services may each hold a bucket of one name).
        Per-machine caches of a store are keyed by it."""
        return self.url

    @abc.abstractmethod
    def put(self, name: str, data: Data, *, exist_ok: bool = False) -> bool:
        """Create object `name` holding `data`, never replacing one. An existing object
        is AlreadyExists, or (with `exist_ok`, for content-named objects) left alone.
        Returns whether this call wrote it."""

    def put_file(self, name: str, path: str, *, exist_ok: bool = False) -> bool:
        """`put` of a finished file's contents (a local store links it in place: the file
        must not change afterwards; the caller may remove it)."""
        with open(path, "rb") as f:
            return self.put(name, f.read(), exist_ok=exist_ok)

    def touch(self, name: str) -> None:
        """Make an existing object's write time now (gc's grace window counts from it): a
        content-named object written again is as young as a new one. By default a same-bytes
        conditional rewrite; a lost race means another writer just rewrote it: young too."""
        data, token = self.get_with_token(name)
        try:
            self.put_if_match(name, data, token)
        except Conflict:
            pass

    @abc.abstractmethod
    def get(self, name: str) -> Data:
        """The whole object (bytes-like); NotFound if absent."""

    @abc.abstractmethod
    def get_with_token(self, name: str) -> tuple[Data, str]:
        """(contents, token) read together, for a later put_if_match."""

    @abc.abstractmethod
    def get_range(self, name: str, offset: int, length: int) -> Data:
        """`length` bytes from `offset` (bytes-like); shorter at the end of the object,
        empty from or past its end; NotFound if absent."""

    @abc.abstractmethod
    def stat(self, name: str) -> ObjectInfo:
        """Size and token; NotFound if absent."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects whose name starts with `prefix` (a string prefix), sorted by name."""

    @abc.abstractmethod
    def folders(self, prefix: str = "") -> builtins.list[str]:  # `list` here is the method above
        """The folder names directly under `prefix` ('' or ending with '/'), sorted: the
        next name component of the objects below it that have one more '/' (S3: the
        common prefixes of a delimiter listing). folders("repos/") -> ["a", "b"]."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove the object; an absent one is no error (deletes are retried)."""

    @abc.abstractmethod
    def put_if_absent(self, name: str, data: Data) -> str:
        """Create `name`; Conflict if it exists. Returns the new token.

        A client that retried a request whose answer was lost can get Conflict for a
        write that landed: on Conflict, read the object and compare it with `data`."""

    @abc.abstractmethod
    def put_if_match(self, name: str, data: Data, token: str) -> str:
        """Replace `name` if it still has `token`; Conflict if it changed or is gone
        (the same note on retried requests as put_if_absent). Returns the new token."""

    def counters(self) -> dict[str, int] | None:
        """{"requests", "sent_bytes", "received_bytes"} this process exchanged with the
        service (bodies only), or None for a store with no wire (a directory, memory)."""
        return None

    def clean_tmp(self) -> int:
        """Remove temp files that dead processes left (a directory store); how many."""
        return 0

    def local_path(self, name: str) -> str | None:
        """A file path holding the object, when `capabilities.local_path`."""
        return None

    def exists(self, name: str) -> bool:
        try:
            self.stat(name)
            return True
        except NotFound:
            return False

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def check_folder_prefix(prefix: str) -> str:
    check_prefix(prefix)
    if prefix and not prefix.endswith("/"):
        raise InvalidName(f"folder prefix {prefix!r} must be '' or end with '/': e.g. 'repos/'")
    return prefix


def check_range(offset: int, length: int) -> None:
    if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 0:
        raise ValueError(f"byte range ({offset!r}, {length!r}) is invalid: offset and length are integers >= 0")

"""Storage: the dumb object backend (objects.py) and its implementations.

`open_objects(url)` picks one: `s3://BUCKET/PREFIX` (s3.py), `memory://` (memory.py, a
fresh empty store), anything else a local directory (local.py, `file://` allowed).
"""
from __future__ import annotations

from .objects import (AccessDenied, AlreadyExists, Capabilities, Conflict, InvalidName, NotFound,
                      ObjectInfo, ObjectStore, StorageError, StorageFull, Unavailable,
                      check_object_name)

__all__ = ["open_objects", "ObjectStore", "Capabilities", "ObjectInfo", "StorageError", "NotFound",
           "AlreadyExists", "Conflict", "InvalidName", "StorageFull", "AccessDenied", "Unavailable",
           "check_object_name"]


def open_objects(url: str) -> ObjectStore:
    """The object store a URL or path names."""
    if url.startswith("s3://"):
        from .s3 import S3Objects
        return S3Objects(url)
    if url.startswith("memory://"):
        from .memory import MemoryObjects
        return MemoryObjects(url)
    from .local import LocalObjects
    return LocalObjects(url.removeprefix("file://"))

"""An in-memory object backend, for tests and overlays (one process; threads are safe)."""
from __future__ import annotations

import bisect
import builtins
import threading
import time
from typing import Iterator

from ..core import ids
from .objects import (AlreadyExists, Capabilities, Conflict, Data, NotFound, ObjectInfo, ObjectStore,
                      check_folder_prefix, check_object_name, check_prefix, check_range)


class MemoryObjects(ObjectStore):
    """Objects in a dict under one lock; the token is the xxh3-128 of the contents."""

    capabilities = Capabilities(supports_ranges=True, atomic_conditional_put=True, local_path=False)

    def __init__(self, url: str = "memory://"):
        self.url = url
        self._objects: dict[str, bytes] = {}
        self._times: dict[str, float] = {}
        self._names: list[str] = []  # sorted
        self._lock = threading.Lock()

    def _set(self, name: str, data: bytes) -> str:
        if name not in self._objects:
            bisect.insort(self._names, name)
        self._objects[name] = data
        self._times[name] = time.time()
        return ids.weak_hexdigest(data)

    def _get(self, name: str) -> bytes:
        try:
            return self._objects[check_object_name(name)]
        except KeyError:
            raise NotFound(f"object {name!r} is not in {self.url}") from None

    def put(self, name: str, data: Data, *, exist_ok: bool = False) -> bool:
        check_object_name(name)
        data = bytes(data)
        with self._lock:
            if name in self._objects:
                if exist_ok:
                    return False
                raise AlreadyExists(f"object {name!r} already exists in {self.url}: objects are written once")
            self._set(name, data)
            return True

    def get(self, name: str) -> bytes:
        with self._lock:
            return self._get(name)

    def get_with_token(self, name: str) -> tuple[bytes, str]:
        data = self.get(name)
        return data, ids.weak_hexdigest(data)

    def get_range(self, name: str, offset: int, length: int) -> memoryview:
        check_range(offset, length)
        return memoryview(self.get(name))[offset:offset + length]

    def stat(self, name: str) -> ObjectInfo:
        data = self.get(name)
        return ObjectInfo(name, len(data), ids.weak_hexdigest(data))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        with self._lock:
            lo = bisect.bisect_left(self._names, prefix)
            names = []
            for n in self._names[lo:]:
                if not n.startswith(prefix):
                    break
                names.append((n, len(self._objects[n]), self._times.get(n)))
        for n, size, mtime in names:
            yield ObjectInfo(n, size, None, mtime)

    def folders(self, prefix: str = "") -> builtins.list[str]:  # `list` here is the method above
        check_folder_prefix(prefix)
        return sorted({i.name[len(prefix):].split("/", 1)[0] for i in self.list(prefix)
                       if "/" in i.name[len(prefix):]})

    def delete(self, name: str) -> None:
        check_object_name(name)
        with self._lock:
            self._times.pop(name, None)
            if self._objects.pop(name, None) is not None:
                self._names.pop(bisect.bisect_left(self._names, name))

    def put_if_absent(self, name: str, data: Data) -> str:
        check_object_name(name)
        with self._lock:
            if name in self._objects:
                raise Conflict(f"object {name!r} was created by another writer: read it and try again")
            return self._set(name, bytes(data))

    def put_if_match(self, name: str, data: Data, token: str) -> str:
        check_object_name(name)
        with self._lock:
            current = self._objects.get(name)
            if current is None or ids.weak_hexdigest(current) != token:
                raise Conflict(f"object {name!r} changed since it was read (or is gone): read it and try again")
            return self._set(name, bytes(data))

"""The maintenance commands a store runs in this process (`Repository.admin`), by the names and
options a server's admin route takes (remote/server/admin.py), plus rebuild-index and recover, which
only run where the store's objects are."""
from __future__ import annotations

from typing import Any

from ..core.errors import InvalidAddressError
from . import check, maintenance


def run(store: maintenance.UpkeepHost, command: str, **options: Any) -> dict[str, object] | int:
    """Run `command` on `store` (a `Repository`, as `maintenance.UpkeepHost` knows it) with its
    options; its report."""
    if command == "gc":
        return maintenance.gc(store, **options)
    if command == "check":
        return check.check(store, **options)
    if command == "forget":
        return maintenance.forget(store, options.pop("repo"), **options)
    if command == "delete-repo":
        return store.ref_store.delete_repo(options.pop("repo"), **options)
    if command == "rebuild-index":
        return check.rebuild_index(store, **options)
    if command == "recover":
        return store.packs.recover(**options)
    raise InvalidAddressError(f"no maintenance command {command!r}: one of check, delete-repo, forget, gc, "
                              f"rebuild-index, recover")

"""Where each kind of stored object lives in an object store (the layout of docs/format.md):
named once, for the repository and for the upkeep (gc, check) and readers that work on it."""
from __future__ import annotations

from ..core import ids


def pack_name(name: str) -> str:
    return f"packs/{name[:2]}/{name}.pack"


def pack_of(object_name: str) -> str | None:
    """The pack an object name holds (v2: 64 hex, v1: 32), or None for anything else."""
    base = object_name.rsplit("/", 1)[-1]
    name = base[:-5]
    if base.endswith(".pack") and ids.is_hex_id(name) and object_name == pack_name(name):
        return name
    return None


def manifest_name(name: str) -> str:
    return f"manifests/{name[:2]}/{name}"


def locations_name(manifest: str) -> str:
    return f"locations/{manifest[:2]}/{manifest}"


def bundle_name(name: str) -> str:
    return f"bundles/{name[:2]}/{name}"


def tree_name(name: str) -> str:
    return f"trees/{name[:2]}/{name}"

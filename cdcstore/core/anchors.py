"""Dedup anchors (format v1): how a machine that holds no index of a bucket finds the packs a
new file shares with the store, at a cost that follows the file, not the store.

A chunk is an anchor when its id's last byte is a multiple of 64 (one chunk in 64: ids are
cryptographic hashes, so anchors fall evenly and no writer chooses them), and the first chunk
of every stored file of FIRST_MIN (1 MiB) or more is one too (a smaller file is cheaper to send
again than to look up: it costs a request either way). For each anchor a writer stores, it puts the empty object

    anchors/<id hex, first two digits>/<id hex>/<pack name>

so one listing of `anchors/ab/<id>/` says which packs hold a copy. A pusher looks up the
anchors among the chunks it does not know; a hit names a pack whose footer then lists all of
its chunks, the anchor's neighbours in the file it came from. An anchor is a hint, never the
truth: one naming a gone pack is a miss, every commit checks in the store that the packs it
relies on exist, and a gc deletes the anchors of the packs it deleted by listing them (the
pack is in the name: no object is read). Pure logic, no I/O.
"""
from __future__ import annotations

from . import ids

ANCHORS_VERSION = 1
ANCHOR_EVERY = 64
FIRST_MIN = 1 << 20  # files this large have their first chunk anchored too
PREFIX = "anchors/"


def is_anchor(chunk_id: bytes) -> bool:
    """Whether a chunk is an anchor by the rule: its id's last byte is a multiple of ANCHOR_EVERY."""
    return chunk_id[-1] % ANCHOR_EVERY == 0


def prefix(chunk_id: bytes) -> str:
    """The folder whose listing names the packs holding a copy of this anchor chunk."""
    h = chunk_id.hex()
    return f"{PREFIX}{h[:2]}/{h}/"


def name(chunk_id: bytes, pack: str) -> str:
    return prefix(chunk_id) + pack


def parse(object_name: str) -> tuple[bytes, str] | None:
    """(chunk id, pack) of an anchor's object name; None for a name that is not one."""
    parts = object_name.split("/")
    if len(parts) != 4 or parts[0] + "/" != PREFIX:
        return None
    _, two, cid, pack = parts
    if not (ids.is_hex_id(cid) and cid.startswith(two) and ids.is_hex_id(pack)):
        return None
    return bytes.fromhex(cid), pack

"""Every bound the server puts on what one client can make it hold, in one place.

A server's memory is bounded by these numbers, whatever clients send (docs/protocol.md,
"Limits"): request bodies are streamed to disk or parsed in slices, answers built from
the store are streamed in `send_block` pieces, and every request that decompresses,
parses or reads much takes a slot of a bounded pool. `cdcstore serve --limit NAME=VALUE`
overrides one (tests set small ones to stay fast).

`Slots` is such a pool: `total` requests at once, at most `per_owner` of them for one
token, so no token can take every slot (a slow upload holds its slot until its body rate
falls under the minimum). A pool of reads also keeps one slot per token for that token alone:
slow readers hold their own token's slots, never another token's.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

from ...core import wire
from ...core.errors import InvalidAddressError

MiB = 1024 * 1024


@dataclass
class ServerLimits:
    # request bodies
    max_pack_bytes: int = wire.MAX_PACK_BYTES  # one pack upload (streamed to a temp file)
    max_pack_chunks: int = 65536  # chunks of one uploaded pack (its index is parsed whole; clients write 8,192)
    max_batch_bytes: int = wire.MAX_MANIFEST_BATCH_BYTES  # one manifest or tree batch (spooled to a temp file)
    max_json_bytes: int = wire.MAX_JSON_BYTES  # one JSON body (parsed in memory)
    max_tree_bytes: int = 16 * MiB  # one tree of a batch (JSON, parsed in memory)
    decode_bytes: int = 2 * MiB  # manifests of a batch decoded at once; a larger manifest is checked in slices
    slice_chunks: int = 65536  # chunk ids checked at once when a manifest is checked in slices
    # answers
    max_range_bytes: int = 64 * MiB  # one pack range a client may ask for
    send_block: int = 1 * MiB  # an answer built from the store is sent in pieces of this size
    send_timeout: float = 30.0  # seconds one piece may wait for a client that does not read before it is cut off
    # concurrency
    parse_slots: int = 2  # batches parsed and packs verified at once (the others wait, spooled on disk)
    write_slots: int = 8  # pack uploads, manifest and tree batches at once (429 past it)
    write_slots_per_token: int = 4  # of which one token may hold
    read_slots: int = 8  # masked or bucket pack ranges, located manifests, gateway GETs at once (shared)
    read_slots_per_token: int = 6  # of which one token may hold
    read_wait: float = 10.0  # seconds a read waits in line for a read slot before its 429
    # job journals (remote/server/staging.py)
    max_journal_bytes_per_token: int = 1024 * MiB  # staging objects of the jobs one token opened or wrote to (413 past it)
    max_upload_bytes_per_token: int = 64 * 1024 * MiB  # S3 gateway: multipart parts one token has staged (403 QuotaExceeded)
    max_open_uploads_per_token: int = 1000  # S3 gateway: multipart uploads one token holds open (403 QuotaExceeded)
    gateway_keepalive: float = 5.0  # S3 gateway: a Complete still working after this answers 200 and sends spaces
    prechunked_uploads: int = 8  # S3 gateway: multipart uploads chunked as their parts arrive at once (the rest at Complete)
    prechunk_round_bytes: int = 16 * MiB  # S3 gateway: in-order part bytes gathered before they are chunked ahead
    # push sessions
    max_sessions: int = 256  # open push sessions kept by this server
    max_sessions_per_token: int = 16  # of which one token may hold
    max_session_life: float = 24 * 3600.0  # seconds after which a session is refused a refresh (gc proceeds)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise InvalidAddressError(f"server limit {f.name} must be a number above 0, not {v!r}")

    @classmethod
    def parse(cls, items) -> "ServerLimits":
        """Limits from `NAME=VALUE` strings (sizes in bytes, times in seconds)."""
        names = {f.name: f.type for f in dataclasses.fields(cls)}
        out: dict[str, Any] = {}  # each an int or a float, by its field's type (mypy cannot pair them)
        for item in items or ():
            name, sep, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in names:
                raise InvalidAddressError(f"--limit {item!r}: expected NAME=VALUE, NAME one of {', '.join(names)}")
            try:
                out[name] = int(value) if names[name] in ("int", int) else float(value)
            except ValueError:
                raise InvalidAddressError(f"--limit {item!r}: {value!r} is not a number") from None
        return cls(**out)


class Busy(Exception):
    """No slot: the request gets a 429 with Retry-After."""


ANONYMOUS = "request-"  # an open server's callers: each request its own owner, no slot of its own


class Slots:
    """A pool of `total` shared slots, at most `per_owner` for one owner (a token). With `own`,
    each token also has one slot of its own, taken when the shared ones are all held: a token
    that holds none gets one however many other tokens' slow clients hold (what the pool holds is
    then `total` plus one per token with a request in flight; tokens are the operator's list).
    Reads may wait in line for a slot (first come, first served); uploads, which a slow client
    can hold, do not."""

    def __init__(self, what: str, total: int, per_owner: int, own: bool = False):
        self.what, self.total, self.per_owner, self.own = what, total, min(per_owner, total), own
        self.used = 0  # shared slots held
        self.by_owner: collections.Counter[str] = collections.Counter()
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    def _own_free(self, owner: str) -> bool:
        return self.own and not self.by_owner[owner] and not owner.startswith(ANONYMOUS)

    def _free_for(self, owner: str) -> bool:
        return self.by_owner[owner] < self.per_owner and (self.used < self.total or self._own_free(owner))

    @contextlib.contextmanager
    def take(self, owner: str):
        """A slot for `owner` (a shared one, else its own), or Busy."""
        if self.by_owner[owner] >= self.per_owner:
            raise Busy(f"this token already runs {self.per_owner} {self.what} at once: retry later")
        shared = self.used < self.total
        if not shared and not self._own_free(owner):
            raise Busy(f"server busy ({self.total} {self.what} at once): retry later")
        self.used += shared
        self.by_owner[owner] += 1
        try:
            yield
        finally:
            self.used -= shared
            self.by_owner[owner] -= 1
            if not self.by_owner[owner]:
                del self.by_owner[owner]
            self._wake_all()

    def _wake_all(self) -> None:
        """Wake the waiters in line: each looks again whether a slot is free for its owner."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def wait(self, owner: str, seconds: float) -> None:
        """Wait in line, up to `seconds`, until a slot is free for `owner` (then `take` it at once)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self._free_for(owner) and loop.time() < deadline:
            fut = loop.create_future()
            self._waiters.append(fut)
            try:
                await asyncio.wait([fut], timeout=deadline - loop.time())
            finally:
                if not fut.done():
                    fut.cancel()

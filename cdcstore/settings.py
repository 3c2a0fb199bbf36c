"""Every environment variable cdcstore reads, each named and documented once (the README's
"Settings" table is this module's list, `ALL`). No other module reads the environment.

A setting is read when it is asked for, so a change of the environment (a test, a DataLoader
worker's own) is seen at once; a bad value is an error naming the variable and what it takes.
Tunable constants stay beside the code they tune (each names its unit and its reason there).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .core.errors import InvalidAddressError


class SettingError(InvalidAddressError):
    """An environment variable holds what its setting cannot take."""


@dataclass(frozen=True)
class Setting:
    name: str
    doc: str

    def raw(self) -> str | None:
        """The variable's value, stripped; None when unset or empty."""
        value = os.environ.get(self.name, "").strip()
        return value or None

    def is_set(self) -> bool:
        return self.raw() is not None


@dataclass(frozen=True)
class Text(Setting):
    def get(self, default: str | None = None) -> str | None:
        return self.raw() or default


@dataclass(frozen=True)
class Count(Setting):
    """A whole number; `minimum` the least it may be."""
    minimum: int = 1

    def get(self, default: int) -> int:
        raw = self.raw()
        if raw is None:
            return default
        try:
            n = int(raw)
        except ValueError:
            n = self.minimum - 1
        if n < self.minimum:
            raise SettingError(f"{self.name}={raw!r}: expected a whole number of at least {self.minimum}")
        return n


@dataclass(frozen=True)
class Seconds(Setting):
    """A positive, finite number of seconds."""

    def get(self, default: float) -> float:
        raw = self.raw()
        if raw is None:
            return default
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not 0 < seconds < math.inf:
            raise SettingError(f"{self.name}={raw!r}: give the seconds a request may wait on a stalled endpoint, "
                               f"a positive number (e.g. {self.name}=30)")
        return seconds


# -- the store and its credentials ----------------------------------------------------------------
STORE = Text("CDCSTORE_STORE", "the store when no --store / location is given: a directory, s3://BUCKET/PREFIX "
                               "or a server URL (default: a directory under the XDG data dir)")
TOKEN = Text("CDCSTORE_TOKEN", "the token sent to a server when none is given")
TIMEOUT = Seconds("CDCSTORE_TIMEOUT", "seconds a request may wait on a stalled bucket endpoint or server "
                                      "(a slower transfer fails as a stall)")
S3_CLIENT = Text("CDCSTORE_S3_CLIENT", "obstore or s3fs: the S3 client (default: obstore where it can run)")

# -- this machine's caches -----------------------------------------------------------------------
CACHE = Text("CDCSTORE_CACHE", "the machine's dedup cache file, shared by processes (default under the "
                               "XDG cache dir)")
CACHE_SIZE = Text("CDCSTORE_CACHE_SIZE", "the dedup cache's bound, e.g. 20GB")
STAT_CACHE = Text("CDCSTORE_STAT_CACHE", "the push stat cache file (default under the XDG cache dir)")
INDEX_MAX_CHUNKS = Count("CDCSTORE_INDEX_MAX_CHUNKS", "the most chunk rows a bucket store's index on this machine "
                                                      "keeps (default 2,000,000, ~600 MB): the least recently used "
                                                      "packs' rows go first")

# -- decode bounds (docs/streaming.md "Decode bounds") -------------------------------------------
MAX_DECODED_BYTES = Count("CDCSTORE_MAX_DECODED_BYTES", "the most bytes one Parquet row group may decode to "
                                                        "(default 1 GiB)")
MAX_IMAGE_PIXELS = Count("CDCSTORE_MAX_IMAGE_PIXELS", "the most pixels one decoded image may have (default 2**26)")

# -- read from other tools' conventions -----------------------------------------------------------
RANK = Count("RANK", "this process's rank (torchrun sets it)", minimum=0)
WORLD_SIZE = Count("WORLD_SIZE", "the number of ranks (torchrun sets it)")
AWS_ENDPOINT_URL_S3 = Text("AWS_ENDPOINT_URL_S3", "the S3 endpoint (AWS's name for S3 alone)")
AWS_ENDPOINT_URL = Text("AWS_ENDPOINT_URL", "the S3 endpoint (AWS's name for every service)")
AWS_REGION = Text("AWS_REGION", "the bucket's region")
AWS_DEFAULT_REGION = Text("AWS_DEFAULT_REGION", "the bucket's region, when AWS_REGION is unset")
AWS_ACCESS_KEY_ID = Text("AWS_ACCESS_KEY_ID", "the bucket's access key")
AWS_SECRET_ACCESS_KEY = Text("AWS_SECRET_ACCESS_KEY", "the bucket's secret key")
AWS_SESSION_TOKEN = Text("AWS_SESSION_TOKEN", "the bucket's session token")

ALL: tuple[Setting, ...] = tuple(v for v in globals().values() if isinstance(v, Setting))

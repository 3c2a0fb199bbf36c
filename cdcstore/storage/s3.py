"""Objects in an S3-compatible bucket: `s3://BUCKET/PREFIX`.

The endpoint and credentials come from the standard AWS environment variables
(AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_REGION or AWS_DEFAULT_REGION), so any S3-compatible service works.

Creates are `PUT` with `If-None-Match: *` and ref moves `PUT` with `If-Match: <etag>`:
real conditional writes, atomic in the service, so two writers on two machines cannot
both win. Every put is one PUT (never multipart), and a single PUT is atomic: nothing
partial is ever visible.

A peer that stalls costs seconds, not minutes: a request that waits `$CDCSTORE_TIMEOUT` seconds
(30 by default; the same knob as a server's client) on an endpoint that sends nothing, all its
attempts together, plus the time its body takes at 1 MiB/s (`MIN_RATE`), fails with one `Stalled`
line (an `Unavailable`) naming the endpoint, saying it stalled and naming the knob (`S3Objects._do`).
Each client bounds its requests its own way (`_Obstore`, `_S3fs`).

Two clients, chosen per process (docs/architecture.md, "Object storage", has the figures):
obstore (Rust, 2-6x faster per request here) where it is safe, and s3fs/aiobotocore in
a process forked from one that has started obstore, whose tokio runtime then hangs
(DataLoader workers fork). `CDCSTORE_S3_CLIENT=obstore|s3fs` forces one. Both translate
errors by their kind or S3 error code, never by message text.
"""
from __future__ import annotations

import asyncio
import datetime
import functools
import importlib.util
import math
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Iterator, Literal, TypedDict, TypeVar, cast, overload

from .. import runtime, settings
from ..core.errors import InvalidAddressError
from .objects import (AccessDenied, AlreadyExists, Capabilities, Conflict, Data, InvalidName, NoBucket, NotFound,
                      ObjectInfo, ObjectStore, StorageError, StorageFull, Unavailable,
                      check_folder_prefix, check_object_name, check_prefix, check_range)

if TYPE_CHECKING:
    from obstore import PutMode
    from obstore.store import S3Config, S3Store

T = TypeVar("T")

PAGE = 1000  # keys per listing request with s3fs (S3's maximum; obstore always asks 1000)
CLIENT_ENV = settings.S3_CLIENT.name
#: Seconds a request may wait on an endpoint that sends nothing, all its attempts together (plus the
#: time its body takes at MIN_RATE): the server client's knob and default (remote/client/store.py), one
#: for every peer a store talks to.
ENV_TIMEOUT = settings.TIMEOUT.name
DEFAULT_TIMEOUT = 30.0
MIN_RATE = 1024 * 1024  # bytes/s: a body moving slower than this counts as stalled
LARGEST_BODY = 128 * 1024 * 1024  # the most one request moves (a pack: wire.MAX_PACK_BYTES)
STEP = 1024 * 1024  # s3fs reads a body this much at a time (each read within the stall timeout)
SMALLEST_CLASS = 256 * 1024  # obstore's write clients: one per power of two from here (a few in use)

_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_PRECONDITION = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_DENIED = {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}
_TRANSIENT = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "500", "503"}


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://BUCKET/PREFIX`; the prefix is '' or ends with '/'."""
    if not url.startswith("s3://"):
        raise InvalidName(f"{url!r} is not an S3 URL: write s3://BUCKET/PREFIX")
    bucket, _, prefix = url[5:].partition("/")
    prefix = prefix.strip("/")
    if not bucket:
        raise InvalidName(f"{url!r} names no bucket: write s3://BUCKET/PREFIX")
    if prefix:
        check_object_name(prefix)
    return bucket, prefix + "/" if prefix else ""


class EnvSettings(TypedDict):
    """What the standard AWS environment variables say (`env_settings`)."""

    endpoint: str | None
    region: str | None
    key: str | None
    secret: str | None
    token: str | None


class S3Settings(EnvSettings):
    """What a client is made from: the environment's settings and the store's own."""

    retries: int
    connect_timeout: float
    timeout: float


def env_settings() -> EnvSettings:
    """Endpoint, region and credentials from the standard AWS environment variables."""
    s = settings
    return {"endpoint": s.AWS_ENDPOINT_URL_S3.get() or s.AWS_ENDPOINT_URL.get(),
            "region": s.AWS_REGION.get() or s.AWS_DEFAULT_REGION.get(),
            "key": s.AWS_ACCESS_KEY_ID.get(), "secret": s.AWS_SECRET_ACCESS_KEY.get(),
            "token": s.AWS_SESSION_TOKEN.get()}


class Stalled(Unavailable):
    """A request that waited its budget on an endpoint that sent nothing (on the wire: unavailable)."""


def stall_timeout(timeout: float | None = None) -> float:
    """`timeout`, else $CDCSTORE_TIMEOUT, else DEFAULT_TIMEOUT: seconds, positive and finite."""
    if timeout is None:
        timeout = settings.TIMEOUT.get(DEFAULT_TIMEOUT)
    if not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
        raise InvalidAddressError(f"timeout={timeout!r}: give the seconds a bucket request may wait on a stalled "
                                  f"endpoint, a positive number (e.g. {ENV_TIMEOUT}=30)")
    return float(timeout)


def budget(timeout: float, nbytes: int = 0) -> float:
    """Seconds a request moving `nbytes` may take in all: the stall timeout plus the body at MIN_RATE."""
    return timeout + nbytes / MIN_RATE


def _size_class(nbytes: int) -> int:
    """`nbytes` rounded up to a power of two, SMALLEST_CLASS at least: obstore's write clients."""
    return max(SMALLEST_CLASS, 1 << max(0, nbytes - 1).bit_length())


# -- which client ---------------------------------------------------------------------------------
_OBSTORE_STARTED = False  # some process of this line started obstore's runtime (inherited by fork)
_OBSTORE_HERE = runtime.Local()  # ... and it was this process


def choose_client(forced: str | None = None) -> str:
    """'obstore' or 's3fs' for this process (see the module docstring); `forced` (else
    $CDCSTORE_S3_CLIENT) asks for one."""
    forced = forced or settings.S3_CLIENT.get()
    if forced:
        if forced not in ("obstore", "s3fs"):
            raise InvalidName(f"S3 client {forced!r} is unknown: use obstore or s3fs")
        if forced == "obstore" and not _obstore_usable():
            return "s3fs"  # never hang a forked child, even when asked
        return forced
    return "obstore" if _obstore_installed() and _obstore_usable() else "s3fs"


def _obstore_usable() -> bool:
    """obstore's runtime does not survive a fork: a child of a process that started it uses s3fs."""
    return not _OBSTORE_STARTED or bool(_OBSTORE_HERE.here())


@functools.lru_cache(maxsize=None)
def _obstore_installed() -> bool:
    return importlib.util.find_spec("obstore") is not None


_CLIENTS: dict[tuple[str, str, str, str], runtime.Local] = {}
_CLIENTS_LOCK = runtime.Lock()  # a fork mid-call gets a free one


def _client(kind: str, bucket: str, prefix: str, settings: S3Settings) -> _Obstore | _S3fs:
    """One client per process, kind and settings (an s3fs session costs ~0.5 s to set up;
    a client's connection pool serves many threads)."""
    key = (kind, bucket, prefix, repr(sorted(settings.items())))

    def make() -> _Obstore | _S3fs:
        global _OBSTORE_STARTED
        if kind == "obstore":
            _OBSTORE_STARTED = True
            _OBSTORE_HERE.set(True)
            return _Obstore(bucket, prefix, settings)
        return _S3fs(bucket, prefix, settings)

    with _CLIENTS_LOCK:
        return _CLIENTS.setdefault(key, runtime.Local()).get(make)


# -- the two clients: put / get / head / list / delete of full keys, typed errors -------------------
class _Obstore:
    kind = "obstore"

    def __init__(self, bucket: str, prefix: str, s: S3Settings) -> None:
        import obstore
        import obstore.exceptions as ox
        from obstore.store import S3Store
        self.ob, self.ox, self.S3Store = obstore, ox, S3Store
        self.bucket, self.prefix, self.s = bucket, prefix, s
        self.timeout = s["timeout"]
        # reads, heads, listings, deletes: no byte for `timeout` s (the answer's headers, then
        # between two reads of the body) is a stall; no retry starts after `timeout` s
        self.store = self._store(self.timeout, budget(self.timeout, LARGEST_BODY), self.timeout)
        self._writers: dict[int, S3Store] = {}
        self._lock = threading.Lock()

    def _store(self, idle: float, whole: float, retry: float) -> S3Store:
        """An obstore client whose attempts wait `idle` s for a byte (its read timeout runs from the
        request's start to the answer's headers, then between reads), last `whole` s at most, and
        are retried (errors, or timeouts of reads) only within `retry` s of the first."""
        s = self.s
        # S3Config's keys, those set (a comprehension makes no TypedDict)
        config = cast("S3Config", {k: v for k, v in {
            "endpoint": s["endpoint"], "region": s["region"] or "us-east-1", "access_key_id": s["key"],
            "secret_access_key": s["secret"], "session_token": s["token"]}.items() if v})
        http = bool(s["endpoint"] and s["endpoint"].startswith("http://"))
        return self.S3Store(self.bucket, prefix=self.prefix.rstrip("/") or None, config=config, client_options={
            "allow_http": http, "connect_timeout": datetime.timedelta(seconds=min(s["connect_timeout"], idle)),
            "read_timeout": datetime.timedelta(seconds=idle), "timeout": datetime.timedelta(seconds=whole)},
            retry_config={"max_retries": s["retries"], "retry_timeout": datetime.timedelta(seconds=retry),
                          "backoff": {"init_backoff": datetime.timedelta(milliseconds=100),
                                      "max_backoff": datetime.timedelta(seconds=10), "base": 2}})

    def _writer(self, nbytes: int) -> S3Store:
        """The client for a put of `nbytes`: its read timeout also runs while the body goes up, so
        it is the whole budget of the body's size class (a few clients: 256 KiB, 512 KiB ... 128 MiB)."""
        size = _size_class(nbytes)
        with self._lock:
            store = self._writers.get(size)
            if store is None:
                whole = budget(self.timeout, size)
                store = self._writers[size] = self._store(whole, whole, whole)
            return store

    def error(self, e: Exception, where: str) -> Exception:
        ox = self.ox
        if isinstance(e, (ox.NotFoundError, FileNotFoundError)):  # obstore raises the builtin
            if "<Code>NoSuchBucket</Code>" in str(e):  # a GET's 404 carries S3's error body
                return no_bucket(self.bucket, self.prefix, self.s)
            return NotFound(f"{where}: not found")
        if isinstance(e, (ox.AlreadyExistsError, ox.PreconditionError)):
            return Conflict(f"{where}: changed or created by another writer: read it and try again")
        if isinstance(e, (ox.PermissionDeniedError, ox.UnauthenticatedError)):
            return AccessDenied(f"{where}: access denied: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                                f"and the bucket's policy")
        if isinstance(e, ox.GenericError):  # what obstore's own retries did not cure
            return Unavailable(f"{where}: the S3 service could not be reached or kept failing "
                               f"({str(e).splitlines()[0]}); check AWS_ENDPOINT_URL and that the bucket "
                               f"exists, and try again")
        if isinstance(e, ox.BaseError):
            return StorageError(f"{where}: {type(e).__name__}: {str(e).splitlines()[0]}")
        return e

    def put(self, key: str, data: Data, create: bool, match: str | None) -> str:
        mode: PutMode = "create" if create else {"e_tag": match} if match else "overwrite"
        store = self._writer(memoryview(data).nbytes)
        # S3 answers every PUT with an ETag
        return cast(str, self.ob.put(store, key, data, mode=mode, use_multipart=False)["e_tag"])

    def get(self, key: str, offset: int | None = None, length: int | None = None) -> tuple[memoryview, str | None]:
        if offset is None:
            r = self.ob.get(self.store, key)
            return memoryview(r.bytes()), r.meta["e_tag"]
        return memoryview(self.ob.get_range(self.store, key, start=offset, length=length)), None

    def head(self, key: str) -> tuple[int, str | None]:
        m = self.ob.head(self.store, key)
        return m["size"], m["e_tag"]

    def delete(self, key: str) -> None:
        self.ob.delete(self.store, key)

    def folders(self, prefix: str) -> list[str]:
        found = self.ob.list_with_delimiter(self.store, prefix.rstrip("/") or None)["common_prefixes"]
        return [p[len(prefix):].rstrip("/") for p in found]

    def list(self, prefix: str) -> Iterator[tuple[str, int, str | None, float | None]]:
        """A string prefix over obstore's folder listing: list the prefix's folder, starting
        just before the prefix (names use only characters below '~'), until past it."""
        folder = prefix.rpartition("/")[0] or None
        start = prefix[:-1] + chr(ord(prefix[-1]) - 1) + "~" if prefix else None
        for page in self.ob.list(self.store, prefix=folder, offset=start, chunk_size=PAGE):
            for m in page:
                if m["path"].startswith(prefix):
                    yield m["path"], m["size"], m["e_tag"], _epoch(m.get("last_modified"))
                elif m["path"] > prefix:
                    return


def _epoch(when: object) -> float | None:
    """A listing's last-modified time as epoch seconds."""
    return when.timestamp() if isinstance(when, datetime.datetime) else None


def no_bucket(bucket: str, prefix: str, settings: S3Settings) -> NoBucket:
    """The one error of a store whose bucket does not exist (never "not a store": no store can be there)."""
    return NoBucket(f"bucket {bucket!r} does not exist at {settings['endpoint'] or 'AWS S3'}: check the bucket's "
                    f"name and AWS_ENDPOINT_URL; for a new store in a new bucket: "
                    f"`cdcstore init --create-bucket --store s3://{bucket}/{prefix}`")


def _code(exc: BaseException) -> str | None:
    """The S3 error code behind an s3fs/botocore error (None: no HTTP answer)."""
    for e in (exc, exc.__cause__):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            return str(resp.get("Error", {}).get("Code") or resp.get("ResponseMetadata", {}).get("HTTPStatusCode"))
    return None


class _S3fs:
    kind = "s3fs"

    def __init__(self, bucket: str, prefix: str, s: S3Settings) -> None:
        import s3fs
        self.bucket, self.prefix, self.s = bucket, prefix, s
        self.timeout = t = s["timeout"]
        # botocore's read timeout also runs while a body goes up (after 100-continue): it is only a
        # backstop here; each request is bounded below, by its budget, on the event loop
        self.fs = s3fs.S3FileSystem(
            skip_instance_cache=True, endpoint_url=s["endpoint"], key=s["key"], secret=s["secret"],
            token=s["token"], client_kwargs={"region_name": s["region"]} if s["region"] else {},
            config_kwargs={"retries": {"max_attempts": s["retries"], "mode": "standard"},
                           "connect_timeout": min(s["connect_timeout"], t),
                           "read_timeout": budget(t, LARGEST_BODY)})
        self.fs.retries = 1  # botocore's standard mode retries; s3fs would multiply them

    def error(self, e: Exception, where: str) -> Exception:
        import aiohttp
        import botocore.exceptions
        code = _code(e)
        if code in _NOT_FOUND:
            return NotFound(f"{where}: not found")
        if code in _PRECONDITION:
            return Conflict(f"{where}: changed or created by another writer: read it and try again")
        if code in _DENIED:
            return AccessDenied(f"{where}: access denied ({code}): check AWS_ACCESS_KEY_ID and "
                                f"AWS_SECRET_ACCESS_KEY and the bucket's policy")
        if code == "NoSuchBucket":
            return no_bucket(self.bucket, self.prefix, self.s)
        if code in ("QuotaExceeded", "EntityTooLarge"):
            return StorageFull(f"{where}: refused ({code}): free space or raise the quota")
        if code in _TRANSIENT or code is None and isinstance(
                e, (OSError, TimeoutError, aiohttp.ClientError, botocore.exceptions.BotoCoreError)):
            return Unavailable(f"{where}: the S3 service could not be reached or kept failing "
                               f"({type(e).__name__}: {e}); check AWS_ENDPOINT_URL and try again")
        return StorageError(f"{where}: S3 error {code}: {e}") if code else e  # else a bug: shown as it is

    def _sync(self, coro_fn: Callable[..., Coroutine[Any, Any, T]], *args: object) -> T:
        import fsspec.asyn
        out: T = fsspec.asyn.sync(self.fs.loop, coro_fn, *args)
        return out

    async def _acall(self, method: str, seconds: float, kw: dict[str, Any]) -> dict[str, Any]:
        await self.fs.set_session()  # once: botocore's models load here (~0.5 s), not a stall
        resp: dict[str, Any] = await asyncio.wait_for(self.fs._call_s3(method, Bucket=self.bucket, **kw), seconds)
        return resp

    def call(self, method: str, nbytes: int = 0, **kw: Any) -> dict[str, Any]:
        """One request, all its attempts within its budget (asyncio.TimeoutError past it)."""
        return self._sync(self._acall, method, budget(self.timeout, nbytes), kw)

    def put(self, key: str, data: Data, create: bool, match: str | None) -> str:
        cond = {"IfNoneMatch": "*"} if create else {"IfMatch": match} if match else {}
        body = bytes(data)
        etag: str = self.call("put_object", len(body), Key=self.prefix + key, Body=body, **cond)["ETag"]
        return etag

    async def _aget(self, key: str, rng: str | None) -> tuple[bytes, str]:
        """The answer's headers within the stall timeout, then its body with no
        `timeout` s between two reads and within the budget of its length."""
        loop = asyncio.get_running_loop()
        resp = await self._acall("get_object", self.timeout, {"Key": key, **({"Range": rng} if rng else {})})
        body = resp["Body"]
        try:
            size = resp.get("ContentLength")
            size = size if isinstance(size, int) and size >= 0 else LARGEST_BODY
            deadline = loop.time() + budget(self.timeout, size)
            parts: list[bytes] = []
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise asyncio.TimeoutError()
                part = await asyncio.wait_for(body.read(STEP), min(self.timeout, left))
                if not part:
                    return b"".join(parts), resp["ETag"]
                parts.append(part)
        finally:
            body.close()

    def get(self, key: str, offset: int | None = None, length: int | None = None) -> tuple[bytes, str | None]:
        # a range read passes both (else `offset + None` fails, as before)
        rng = None if offset is None else f"bytes={offset}-{offset + cast(int, length) - 1}"
        try:
            return self._sync(self._aget, self.prefix + key, rng)
        except Exception as e:
            if rng and _code(e) in ("InvalidRange", "416"):
                return b"", None  # the range starts at or past the end
            raise

    def head(self, key: str) -> tuple[int, str | None]:
        h = self.call("head_object", Key=self.prefix + key)
        return int(h["ContentLength"]), h["ETag"]

    def delete(self, key: str) -> None:
        self.call("delete_object", Key=self.prefix + key)

    def folders(self, prefix: str) -> list[str]:
        kw: dict[str, Any] = {"Prefix": self.prefix + prefix, "Delimiter": "/", "MaxKeys": PAGE}
        out: list[str] = []
        while True:
            page = self.call("list_objects_v2", **kw)
            out += [c["Prefix"][len(self.prefix + prefix):].rstrip("/") for c in page.get("CommonPrefixes", ())]
            if not page.get("IsTruncated"):
                return out
            kw["ContinuationToken"] = page["NextContinuationToken"]

    def list(self, prefix: str) -> Iterator[tuple[str, int, str | None, float | None]]:
        kw: dict[str, Any] = {"Prefix": self.prefix + prefix, "MaxKeys": PAGE}
        while True:
            page = self.call("list_objects_v2", **kw)
            for item in page.get("Contents", ()):
                yield item["Key"][len(self.prefix):], int(item["Size"]), item.get("ETag"), _epoch(item.get("LastModified"))
            if not page.get("IsTruncated"):
                return
            kw["ContinuationToken"] = page["NextContinuationToken"]


# -- the backend ------------------------------------------------------------------------------------
class S3Objects(ObjectStore):
    """A bucket prefix as an object store (see the module docstring)."""

    capabilities = Capabilities(supports_ranges=True, atomic_conditional_put=True, local_path=False)

    def __init__(self, url: str, retries: int = 5, connect_timeout: float = 10, client: str | None = None,
                 timeout: float | None = None) -> None:
        self.bucket, self.prefix = parse_url(url)
        self._forced = client
        self._cached = runtime.Local()  # this process's client
        self.url = f"s3://{self.bucket}/{self.prefix}"
        self._settings: S3Settings = {**env_settings(), "retries": retries, "connect_timeout": connect_timeout,
                                      "timeout": stall_timeout(timeout)}
        self._counts = {"requests": 0, "sent_bytes": 0, "received_bytes": 0}
        self._count_lock = threading.Lock()

    def counters(self) -> dict[str, int]:
        with self._count_lock:
            return dict(self._counts)

    def _count(self, sent: int = 0, received: int = 0) -> None:
        with self._count_lock:
            c = self._counts
            c["requests"] += 1
            c["sent_bytes"] += sent
            c["received_bytes"] += received

    @property
    def identity(self) -> str:
        return f"{self._settings['endpoint'] or 'aws'} {self.url}"

    @property
    def client(self) -> _Obstore | _S3fs:
        """This process's client (a forked child picks and builds its own)."""
        return self._cached.get(lambda: _client(choose_client(self._forced), self.bucket, self.prefix, self._settings))

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_count_lock"} | {"_cached": runtime.Local()}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state, _count_lock=threading.Lock())

    @overload
    def _do(self, what: str, op: Literal["put"], name: str, data: Data, create: bool, match: str | None,
            /) -> str: ...

    @overload
    def _do(self, what: str, op: Literal["get"], name: str, offset: int | None = ..., length: int | None = ...,
            /) -> tuple[Data, str | None]: ...

    @overload
    def _do(self, what: str, op: Literal["head"], name: str, /) -> tuple[int, str | None]: ...

    @overload
    def _do(self, what: str, op: Literal["delete"], name: str, /) -> None: ...

    @overload
    def _do(self, what: str, op: Literal["folders"], prefix: str, /) -> list[str]: ...

    def _do(self, what: str, op: str, *args: Any) -> Any:
        """One request; its body bytes are counted (a put's data, a get's answer)."""
        client = self.client
        sent = memoryview(args[1]).nbytes if op == "put" else 0
        began = time.monotonic()
        try:
            out = getattr(client, op)(*args)
        except Exception as e:
            self._count(sent)
            raise self._error(client, e, f"{what} in {self.url}", time.monotonic() - began) from None
        self._count(sent, memoryview(out[0]).nbytes if op == "get" else 0)
        return out

    def _error(self, client: _Obstore | _S3fs, e: Exception, where: str, took: float) -> Exception:
        """The client's typed error; a request that could not be served and waited the stall
        timeout (or more) without an answer is said to have stalled, with the knob to turn."""
        err = client.error(e, where)
        timeout = self._settings["timeout"]
        if isinstance(err, Unavailable) and (isinstance(e, asyncio.TimeoutError) or took >= 0.9 * timeout):
            endpoint = self._settings["endpoint"] or "AWS S3"
            return Stalled(f"{where}: the S3 endpoint {endpoint} stalled: no answer within {took:.1f} s "
                           f"(hung, overloaded or unreachable); set {ENV_TIMEOUT}=SECONDS to wait longer "
                           f"(now {timeout:g})")
        return err

    # -- writes -----------------------------------------------------------------------------------
    def _create(self, name: str, data: Data) -> str:
        try:
            return self._do(f"object {name!r}", "put", check_object_name(name), data, True, None)
        except NotFound:  # a PUT finds no key: the bucket is missing
            raise no_bucket(self.bucket, self.prefix, self._settings) from None

    def create_bucket(self) -> bool:
        """Create the bucket (in $AWS_REGION); False if this account already owns it."""
        s = self._settings
        fs = _S3fs(self.bucket, self.prefix, s)
        region = s["region"]
        conf: dict[str, Any] = ({"CreateBucketConfiguration": {"LocationConstraint": region}}
                                if region and region != "us-east-1" else {})
        try:
            fs.call("create_bucket", **conf)
            return True
        except Exception as e:
            if _code(e) == "BucketAlreadyOwnedByYou":
                return False
            if _code(e) == "BucketAlreadyExists":
                raise AlreadyExists(f"bucket {self.bucket!r} belongs to another account (bucket names are global): "
                                    f"pick another name") from None
            raise fs.error(e, f"creating bucket {self.bucket!r} at {s['endpoint'] or 'AWS'}") from None

    def put(self, name: str, data: Data, *, exist_ok: bool = False) -> bool:
        try:
            self._create(name, data)
            return True
        except Conflict:
            if exist_ok:
                return False
            raise AlreadyExists(f"object {name!r} already exists in {self.url}: objects are written once") from None

    def put_if_absent(self, name: str, data: Data) -> str:
        return self._create(name, data)

    def put_if_match(self, name: str, data: Data, token: str) -> str:
        try:
            return self._do(f"object {name!r}", "put", check_object_name(name), data, False, token)
        except NotFound:  # deleted since its token was read
            raise Conflict(f"object {name!r} in {self.url} is gone since it was read: read it and try again") from None

    def delete(self, name: str) -> None:
        self._do(f"object {name!r}", "delete", check_object_name(name))

    # -- reads ------------------------------------------------------------------------------------
    def get(self, name: str) -> Data:
        return self._do(f"object {name!r}", "get", check_object_name(name))[0]

    def get_with_token(self, name: str) -> tuple[Data, str]:
        # a whole object's answer carries its ETag
        return cast("tuple[Data, str]", self._do(f"object {name!r}", "get", check_object_name(name)))

    def get_range(self, name: str, offset: int, length: int) -> Data:
        check_range(offset, length)
        check_object_name(name)
        if length == 0:
            self.stat(name)  # NotFound for an absent object, as a real read would say
            return b""
        try:
            return self._do(f"object {name!r}", "get", name, offset, length)[0]
        except Stalled:
            raise  # asking the endpoint again would only wait as long once more
        except Unavailable:
            if self.stat(name).size <= offset:  # obstore: 416, the range starts past the end
                return b""
            raise

    def stat(self, name: str) -> ObjectInfo:
        size, token = self._do(f"object {name!r}", "head", check_object_name(name))
        return ObjectInfo(name, size, token)

    def folders(self, prefix: str = "") -> list[str]:
        return sorted(self._do(f"folders under {prefix!r}", "folders", check_folder_prefix(prefix)))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects by name (S3 lists keys in UTF-8 binary order), one page at a time."""
        check_prefix(prefix)
        client = self.client
        it = client.list(prefix)
        while True:
            began = time.monotonic()
            try:
                item = next(it)
            except StopIteration:
                return
            except Exception as e:
                raise self._error(client, e, f"listing {prefix!r} in {self.url}", time.monotonic() - began) from None
            yield ObjectInfo(*item)

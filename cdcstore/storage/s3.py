"""Objects in an S3-compatible bucket: `s3://BUCKET/PREFIX`.

The endpoint and credentials come from the standard AWS environment variables
(AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_REGION or AWS_DEFAULT_REGION), so any S3-compatible service works.

The client is s3fs/aiobotocore (chosen over obstore in docs/architecture.md, "Object
storage": obstore's tokio runtime hangs in a forked child, and DataLoader workers fork).
Every call goes through s3fs's `_call_s3` on fsspec's I/O loop thread; the client is
rebuilt lazily in a forked child. Errors are translated by their S3 error code, never by
message text. Creates are `PUT` with `If-None-Match: *` and ref moves `PUT` with
`If-Match: <etag>`: real conditional writes, atomic in the service, so two writers on
two machines cannot both win. A single PUT is atomic: nothing partial is ever visible.
"""
from __future__ import annotations

import os
import threading
from typing import Iterator

from .objects import (AccessDenied, AlreadyExists, Capabilities, Conflict, InvalidName, NotFound,
                      ObjectInfo, ObjectStore, StorageError, StorageFull, Unavailable,
                      check_object_name, check_prefix, check_range)

PAGE = 1000  # keys per listing request (S3's maximum)

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


def env_config() -> dict:
    """s3fs settings from the standard AWS environment variables."""
    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    cfg: dict = {"client_kwargs": {"region_name": region} if region else {}}
    if endpoint:
        cfg["endpoint_url"] = endpoint
    if env.get("AWS_ACCESS_KEY_ID"):
        cfg.update(key=env["AWS_ACCESS_KEY_ID"], secret=env.get("AWS_SECRET_ACCESS_KEY"),
                   token=env.get("AWS_SESSION_TOKEN"))
    return cfg


def _code(exc: BaseException) -> str | None:
    """The S3 error code behind an s3fs/botocore error (None: no HTTP answer)."""
    for e in (exc, exc.__cause__):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            return str(resp.get("Error", {}).get("Code") or resp.get("ResponseMetadata", {}).get("HTTPStatusCode"))
    return None


def _is_network_error(e: BaseException) -> bool:
    import aiohttp
    import botocore.exceptions
    return isinstance(e, (OSError, TimeoutError, aiohttp.ClientError, botocore.exceptions.BotoCoreError))


_CLIENTS: dict = {}
_CLIENTS_LOCK = threading.Lock()


def _client(key: str, options: dict, retries: int):
    """One s3fs client per process and settings (a client's session costs ~0.5 s to set up;
    its connection pool serves many threads)."""
    with _CLIENTS_LOCK:
        pid, fs = _CLIENTS.get((key, retries), (None, None))
        if pid != os.getpid():
            import s3fs
            fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
            fs.retries = retries
            _CLIENTS[(key, retries)] = (os.getpid(), fs)
        return fs


class S3Objects(ObjectStore):
    """A bucket prefix as an object store (see the module docstring)."""

    capabilities = Capabilities(supports_ranges=True, atomic_conditional_put=True, local_path=False)

    def __init__(self, url: str, retries: int = 5, **s3_options):
        self.bucket, self.prefix = parse_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}"
        self._retries = retries
        self._options = {**env_config(), **s3_options}
        self._fs = None
        self._pid = None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"bucket": self.bucket, "prefix": self.prefix, "url": self.url, "_options": self._options,
                "_retries": self._retries}

    def __setstate__(self, state):
        self.__dict__.update(state, _fs=None, _pid=None, _lock=threading.Lock())

    @property
    def fs(self):
        """The s3fs client of this process (a forked child builds its own)."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._fs = _client(repr(sorted(self._options.items())), self._options, self._retries)
                    self._pid = os.getpid()
        return self._fs

    def _run(self, coro_fn, *args):
        import fsspec.asyn
        fs = self.fs
        return fsspec.asyn.sync(fs.loop, coro_fn, fs, *args)

    def _key(self, name: str) -> str:
        return self.prefix + check_object_name(name)

    def _call(self, what: str, method: str, **kw):
        try:
            return self.fs.call_s3(method, Bucket=self.bucket, **kw)
        except Exception as e:
            raise self._translate(e, what) from None

    def _translate(self, e: Exception, what: str) -> Exception:
        if isinstance(e, StorageError):
            return e
        code = _code(e)
        where = f"{what} in {self.url}"
        if code in _NOT_FOUND:
            return NotFound(f"{where}: not found")
        if code in _PRECONDITION:
            return Conflict(f"{where}: changed or created by another writer: read it and try again")
        if code in _DENIED:
            return AccessDenied(f"{where}: access denied ({code}): check AWS_ACCESS_KEY_ID and "
                                f"AWS_SECRET_ACCESS_KEY and the bucket's policy")
        if code == "NoSuchBucket":
            return NotFound(f"{where}: bucket {self.bucket!r} does not exist: create it first")
        if code in ("QuotaExceeded", "EntityTooLarge"):
            return StorageFull(f"{where}: refused ({code}): free space or raise the quota")
        if code is None and not _is_network_error(e):
            return e  # a bug, not the service: let it show as it is
        if code is None or code in _TRANSIENT:
            return Unavailable(f"{where}: the S3 service could not be reached or kept failing "
                               f"({type(e).__name__}: {e}); check AWS_ENDPOINT_URL and try again")
        return StorageError(f"{where}: S3 error {code}: {e}")

    # -- writes -----------------------------------------------------------------------------
    def put(self, name: str, data, *, exist_ok: bool = False) -> bool:
        try:
            self._call(f"object {name!r}", "put_object", Key=self._key(name), Body=bytes(data), IfNoneMatch="*")
            return True
        except Conflict:
            if exist_ok:
                return False
            raise AlreadyExists(f"object {name!r} already exists in {self.url}: objects are written once") from None

    def put_if_absent(self, name: str, data) -> str:
        return self._call(f"object {name!r}", "put_object", Key=self._key(name), Body=bytes(data),
                          IfNoneMatch="*")["ETag"]

    def put_if_match(self, name: str, data, token: str) -> str:
        try:
            return self._call(f"object {name!r}", "put_object", Key=self._key(name), Body=bytes(data),
                              IfMatch=token)["ETag"]
        except NotFound:  # deleted since its token was read
            raise Conflict(f"object {name!r} in {self.url} is gone since it was read: read it and try again") from None

    def delete(self, name: str) -> None:
        self._call(f"object {name!r}", "delete_object", Key=self._key(name))

    # -- reads ------------------------------------------------------------------------------
    @staticmethod
    async def _aget(fs, bucket: str, key: str, rng: str | None):
        kw = {"Range": rng} if rng else {}
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
        body = resp["Body"]
        try:
            return await body.read(), resp["ETag"]
        finally:
            body.close()

    def _get(self, name: str, rng: str | None = None) -> tuple[bytes, str]:
        key = self._key(name)
        try:
            return self._run(self._aget, self.bucket, key, rng)
        except Exception as e:
            if rng and _code(e) in ("InvalidRange", "416"):
                return b"", ""  # the range starts at or past the end
            raise self._translate(e, f"object {name!r}") from None

    def get(self, name: str):
        return self._get(name)[0]

    def get_with_token(self, name: str) -> tuple[bytes, str]:
        return self._get(name)

    def get_range(self, name: str, offset: int, length: int):
        check_range(offset, length)
        if length == 0:
            self.stat(name)  # NotFound for an absent object, as a real read would say
            return b""
        return self._get(name, f"bytes={offset}-{offset + length - 1}")[0]

    def stat(self, name: str) -> ObjectInfo:
        head = self._call(f"object {name!r}", "head_object", Key=self._key(name))
        return ObjectInfo(name, int(head["ContentLength"]), head["ETag"])

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """One ListObjectsV2 page at a time (S3 lists keys in UTF-8 binary order)."""
        check_prefix(prefix)
        kw = {"Prefix": self.prefix + prefix, "MaxKeys": PAGE}
        while True:
            page = self._call(f"listing {prefix!r}", "list_objects_v2", **kw)
            for item in page.get("Contents", ()):
                yield ObjectInfo(item["Key"][len(self.prefix):], int(item["Size"]), item.get("ETag"))
            if not page.get("IsTruncated"):
                return
            kw["ContinuationToken"] = page["NextContinuationToken"]

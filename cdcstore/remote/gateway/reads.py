"""The S3-compatible gateway of `cdcstore serve --s3-port PORT` (docs/gateway.md): its reads.

Any S3 client reads a store: the bucket is a REPO, the key is REV/PATH (REV a branch, a tag
or a commit id), addressed path-style (`http://HOST:PORT/REPO/REV/PATH`). GetObject (one
Range), HeadObject, ListObjectsV2 (and v1), ListBuckets, HeadBucket and GetBucketLocation are
served here; writes go to the `writes` handler the app is given (remote/gateway/writes.py; 501
without one). Bytes are read through the
read core every reader uses (`storage.reader.FileReader`: each chunk verified by its origin,
docs/protocol.md "Trust by origin"), and are streamed in `ServerLimits.send_block` pieces under
a read slot, as the native API's pack ranges are. The gateway has no read logic or cache of its
own: manifests are kept by the repository (`Repository.get_manifest`, bounded in chunks).

Credentials: the access key id is a token's name (`cdcstore token add NAME`), the secret
access key is the token; the signature (SigV4, header or presigned URL, core/sigv4.py) is
checked with the token, and the token's grant applies as on the native API. A server without
tokens serves anonymous and signed requests alike.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import email.utils
import logging
import re
import secrets
import time
from typing import Iterator
from urllib.parse import quote, unquote
from xml.sax.saxutils import escape

from aiohttp import web

from ... import runtime
from ...core import sigv4
from ...core.commit import FileEntry
from ...core.errors import (BusyError, CdcError, CorruptionError, InvalidAddressError, RepoNotFoundError,
                            RevisionNotFoundError)
from ...core.wire import NATIVE_PORT_HEADER
from ...storage.reader import FileReader
from ..server.limits import Busy
from ..server.routes import SERVER, STORE_ROOTS, sanitize
from ..server.tokens import default_name, owner_id
from .listing import before as _before, tree_keys

log = logging.getLogger("cdcstore.gateway")

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
MAX_KEYS = 1000  # the most keys one listing answers (as S3)
REGION = "us-east-1"
NOBODY = secrets.token_hex(32)  # a token no one holds: unknown access key ids are checked against it
WRITES_LATER = ("this S3 gateway serves reads only; writes come later: push with `cdcstore push` or write "
                "through cdc:// (docs/gateway.md)")
_RANGE = re.compile(r"^bytes=\s*(\d*)\s*-\s*(\d*)\s*$")
_XML_UNFIT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")  # no XML 1.0 char
CONTENT_TYPE = "binary/octet-stream"  # what S3 answers for an object stored without a type (a push stores none)
SIGNED = "cdc_sigv4"  # request key: (sigv4.Signed, token) of a request whose signature was checked


class S3Error(Exception):
    def __init__(self, status: int, code: str, message: str, **extra):
        super().__init__(message)
        self.status, self.code, self.extra = status, code, extra


# -- XML ----------------------------------------------------------------------------------------
def _el(name: str, value) -> str:
    return f"<{name}>{escape(str(value))}</{name}>"


def _xml(root: str, body: str, ns: bool = True) -> web.Response:
    xmlns = f' xmlns="{NS}"' if ns else ""
    text = f'<?xml version="1.0" encoding="UTF-8"?>\n<{root}{xmlns}>{body}</{root}>'
    return web.Response(text=text, content_type="application/xml")


def iso_time(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def http_time(t: float) -> str:
    return email.utils.formatdate(t, usegmt=True)


def etag(entry: FileEntry) -> str:
    """Stable per file content: the file's manifest id (the same bytes, the same manifest)."""
    return f'"{entry.manifest}"'


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """[start, stop) of one `Range: bytes=...`; None for no range or one S3 ignores (malformed,
    several ranges): the whole object. S3Error 416 when no byte of it is in the object."""
    m = _RANGE.match(value.strip()) if value else None
    if m is None or not (m[1] or m[2]):
        return None
    if not m[1] and size == 0:  # a suffix of an empty object: the whole (empty) object, as S3
        return None
    if m[1]:
        start = int(m[1])
        if m[2] and int(m[2]) < start:
            return None
        if start >= size:
            raise S3Error(416, "InvalidRange", "The requested range is not satisfiable", ActualObjectSize=size)
        return start, min(size, int(m[2]) + 1) if m[2] else size
    n = int(m[2])
    if n == 0:
        raise S3Error(416, "InvalidRange", "The requested range is not satisfiable", ActualObjectSize=size)
    return max(0, size - n), size


# -- keys -----------------------------------------------------------------------------------------
def etag_matches(header: str, tag: str) -> bool:
    """Whether an If-Match / If-None-Match value names `tag`: a list of ETags, each quoted or not
    (S3 takes both), or `*`."""
    wanted = {v.strip().removeprefix("W/").strip('"') for v in header.split(",")}
    return "*" in wanted or tag.strip('"') in wanted


def http_date(value: str | None) -> float | None:
    """The time an If-Modified-Since / If-Unmodified-Since value names; None when absent or not a date
    (S3 ignores it then)."""
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def preconditions(headers, tag: str, mtime: float) -> int | None:
    """The status the conditional headers call for (412, 304) or None to answer, in S3's order:
    If-Match, then If-Unmodified-Since unless If-Match was given; If-None-Match, then
    If-Modified-Since unless If-None-Match was given. Times compare at whole seconds, as
    Last-Modified states them."""
    modified = int(mtime)
    match, none_match = headers.get("If-Match"), headers.get("If-None-Match")
    if match is not None and not etag_matches(match, tag):
        return 412
    unmodified_since = http_date(headers.get("If-Unmodified-Since")) if match is None else None
    if unmodified_since is not None and modified > unmodified_since:
        return 412
    if none_match is not None:
        return 304 if etag_matches(none_match, tag) else None
    modified_since = http_date(headers.get("If-Modified-Since"))
    if modified_since is not None and modified <= modified_since:
        return 304
    return None


def encode_token(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode()


def decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise S3Error(400, "InvalidArgument", "The continuation token provided is incorrect") from None


# -- bytes ----------------------------------------------------------------------------------------
class FileBody:
    """A file's bytes [start, stop) for a GET, read through the one read core
    (`storage.reader.FileReader`: locate, relocate once, verify by origin) `piece` bytes per
    `block(lo, hi)` call, off the event loop, one call at a time. While one piece is sent the
    next is read on the runtime's `gateway` pool: at most two pieces held per GET."""

    def __init__(self, reader: FileReader, stop: int, piece: int):
        self.reader, self.stop, self.piece = reader, stop, piece
        # ((lo, hi), future) of the piece being read ahead
        self._ahead: tuple[tuple[int, int], concurrent.futures.Future[bytes]] | None = None

    def block(self, lo: int, hi: int) -> bytes:
        ahead, self._ahead = self._ahead, None
        data = None
        if ahead is not None:
            built = ahead[1].result()  # waited for even when unused: two reads never run at once
            data = built if ahead[0] == (lo, hi) else None
        if data is None:
            data = self.reader.pread(lo, hi - lo)
        if hi < self.stop:
            nxt = (hi, min(self.stop, hi + self.piece))
            self._ahead = (nxt, runtime.pool("gateway", 4).submit(self.reader.pread, nxt[0], nxt[1] - nxt[0]))
        return data

    def close(self) -> None:
        """Wait for a piece still being read (an aborted GET), then let go of the reader."""
        if self._ahead is not None and not self._ahead[1].cancel():
            concurrent.futures.wait([self._ahead[1]])
        self._ahead = None
        self.reader.close()


# -- the gateway ----------------------------------------------------------------------------------
class Gateway:
    """The S3 routes over one `server.Server` (its store, tokens, read slots and limits)."""

    def __init__(self, server, writes=None):
        self.server = server
        self.store = server.store
        self.writes = writes(self) if writes is not None else None  # the write side (remote/gateway/writes.py)

    async def _io(self, fn, *args):
        return await self.server.io(fn, *args)  # the server's blocking-work pool

    # -- authentication ----------------------------------------------------------------------
    def authenticate(self, request: web.Request) -> tuple[dict, str]:
        """(grant, owner) of a request: its SigV4 signature checked with the token its access key
        names. An open server (no tokens) takes every request, signed or not."""
        raw_path, _, raw_query = request.raw_path.partition("?")
        query = dict(sigv4.split_query(raw_query))
        header = request.headers.get("Authorization")
        try:
            if header:
                signed = sigv4.parse_header(header, request.headers.get("X-Amz-Date"))
            elif "X-Amz-Algorithm" in query:
                signed = sigv4.parse_query(query)
            elif "AWSAccessKeyId" in query:
                raise sigv4.SignatureError("this URL is signed with SigV2 (AWSAccessKeyId=...): presign with SigV4 "
                                           "(boto3: Config(signature_version='s3v4'))")
            else:
                signed = None
        except sigv4.SignatureError as e:
            raise S3Error(400, "AuthorizationHeaderMalformed", str(e)) from None
        tokens = self.server.auth.tokens
        if tokens is None:
            return {"scope": "write", "repos": ["*"]}, f"request-{id(request)}"
        if signed is None:
            raise S3Error(403, "AccessDenied", "anonymous requests are refused: sign them with a token "
                                               "(access key id: the token's name, secret access key: the token)")
        candidates = [t for t, g in tokens.items() if (g.get("name") or default_name(t)) == signed.access_key]
        problem = sigv4.time_problem(signed, time.time())
        if problem:
            raise S3Error(403, "AccessDenied" if signed.presigned else "RequestTimeTooSkewed", problem)
        headers = {k.lower(): ",".join(request.headers.getall(k)) for k in set(request.headers.keys())}
        # the payload hash is taken as the client signed it; a write's body is checked against it (bodies.py)
        payload = None if signed.presigned else request.headers.get("X-Amz-Content-Sha256")
        # an unknown name is checked against a token nobody holds: it answers as a wrong secret does,
        # in about the same time, so token names cannot be told by their answers (issue 43)
        for token in candidates or [NOBODY]:
            if sigv4.matches(token, signed, request.method, raw_path, raw_query, headers, payload) and candidates:
                request[SIGNED] = (signed, token)  # a streaming body's chunks are signed in a chain from it
                return tokens[token], owner_id(token)
        raise S3Error(403, "SignatureDoesNotMatch", "The request signature we calculated does not match the "
                                                    "signature you provided: the access key id is a token's name "
                                                    "and the secret access key is that token")

    @staticmethod
    def _may_read(grant: dict, repo: str) -> None:
        if "*" not in grant["repos"] and repo not in grant["repos"]:
            raise S3Error(403, "AccessDenied", f"this token has no access to repo {repo!r}", BucketName=repo)

    # -- dispatch ----------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        grant, owner = self.authenticate(request)
        raw_path, _, raw_query = request.raw_path.partition("?")
        path = unquote(raw_path).lstrip("/")
        bucket, _, key = path.partition("/")
        query = dict(sigv4.split_query(raw_query))
        if request.method not in ("GET", "HEAD") or (request.method == "GET" and ("uploads" in query or
                                                                                  "uploadId" in query)):
            if self.writes is None:
                raise S3Error(501, "NotImplemented", WRITES_LATER)
            return await self.writes.handle(request, grant, bucket, key, query)
        if not bucket:
            return await self.list_buckets(grant)
        self._may_read(grant, bucket)
        if not await self._io(self._has_repo, bucket):
            raise S3Error(404, "NoSuchBucket", "The specified bucket does not exist", BucketName=bucket)
        if key:
            return await self.get_object(request, owner, bucket, key)
        if request.method == "HEAD":
            return web.Response(headers={"x-amz-bucket-region": REGION, "Content-Type": "application/xml",
                                         "Content-Length": "0"})
        if "location" in query:
            return _xml("LocationConstraint", "")  # us-east-1 is said by an empty constraint (as S3)
        unsupported = [k for k in query if k in ("acl", "policy", "versioning", "tagging", "uploads", "versions",
                                                   "lifecycle", "cors", "website", "logging", "notification")]
        if unsupported:
            raise S3Error(501, "NotImplemented", f"?{unsupported[0]} is not served by this gateway")
        return await self.list_objects(bucket, query)

    def _has_repo(self, repo: str) -> bool:
        try:
            return self.store.has_repo(repo)
        except InvalidAddressError:
            return False

    async def list_buckets(self, grant: dict) -> web.Response:
        repos = await self._io(self.store.repos)
        visible = repos if "*" in grant["repos"] else [r for r in repos if r in grant["repos"]]
        created = iso_time(await self._io(self._created))
        buckets = "".join(f"<Bucket>{_el('Name', r)}{_el('CreationDate', created)}</Bucket>"
                          for r in sorted(visible))
        owner = f"<Owner>{_el('ID', 'cdcstore')}{_el('DisplayName', grant.get('name') or 'cdcstore')}</Owner>"
        return _xml("ListAllMyBucketsResult", f"{owner}<Buckets>{buckets}</Buckets>")

    def _created(self) -> float:
        """When the store was made, each repo's CreationDate."""
        return self.store.created() or time.time()

    # -- objects -----------------------------------------------------------------------------
    def _revision(self, repo: str, rev: str):
        """(view, commit time) of a revision, None when it is no revision of the repo."""
        try:
            cid, _ = self.store.resolve_ref(repo, rev)
            commit = self.store.get_commit(repo, cid)
        except (RevisionNotFoundError, RepoNotFoundError, InvalidAddressError):
            return None
        return self.store.view(repo, commit), commit.time

    def _lookup(self, repo: str, key: str) -> tuple[FileEntry, float]:
        rev, _, path = key.partition("/")
        found = self._revision(repo, rev) if path and "" not in path.split("/") else None  # main//a is no key
        if found is None or "\x00" in path or (entry := found[0].get(path)) is None:
            raise S3Error(404, "NoSuchKey", "The specified key does not exist.", Key=key)
        return entry, found[1]

    async def get_object(self, request: web.Request, owner: str, bucket: str, key: str) -> web.StreamResponse:
        entry, mtime = await self._io(self._lookup, bucket, key)
        tag = etag(entry)
        headers = {"ETag": tag, "Last-Modified": http_time(mtime), "Accept-Ranges": "bytes",
                   "Content-Type": CONTENT_TYPE}
        failed = preconditions(request.headers, tag, mtime)
        if failed == 412:
            raise S3Error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold",
                          Condition="If-Match" if "If-Match" in request.headers else "If-Unmodified-Since")
        if failed == 304:
            return web.Response(status=304, headers={"ETag": tag, "Last-Modified": headers["Last-Modified"]})
        rng = parse_range(request.headers.get("Range"), entry.size)
        start, stop = rng if rng is not None else (0, entry.size)
        status = 206 if rng is not None else 200
        if rng is not None:
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{entry.size}"
        if request.method == "HEAD":
            resp = web.StreamResponse(status=status, headers=headers)
            resp.content_length = stop - start
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        manifest = await self._io(self.store.get_manifest, entry.manifest)  # checked against its name
        reader = FileReader(self.store, manifest, f"{bucket}/{key}", readahead_bytes=0)
        body = FileBody(reader, stop, self.server.limits.send_block)
        reads, wait = self.server.reads, self.server.limits.read_wait
        try:
            await reads.wait(owner, wait)
            with reads.take(owner):  # the file is read `send_block` bytes at a time, as pack ranges are
                return await self.server.send_range(request, start, stop, body.block, status=status, headers=headers)
        except Busy as e:
            raise S3Error(503, "SlowDown", str(e)) from None
        finally:
            await self._io(body.close)

    # -- listings ----------------------------------------------------------------------------
    def _keys(self, repo: str, prefix: str, delimiter: str, after: str) -> Iterator[tuple]:
        """(kind, key, entry, time) of the bucket's keys that start with `prefix`, after `after`,
        in key order. With no '/' in the prefix the revisions are the repo's branches and tags."""
        if "/" in prefix:
            rev, _, rest = prefix.partition("/")
            if rest.startswith("/") or "//" in rest:  # a key has no empty folder name: nothing is under it
                return
            revs = [rev]
        else:
            rest = None
            refs = {**self.store.tags(repo), **self.store.branches(repo)}
            revs = [r for r in refs if r.startswith(prefix)]
        for rev in sorted(revs, key=lambda r: r + "/"):
            top = rev + "/"
            if _before(top, after):
                continue
            if rest is None and delimiter:
                if top > after:
                    yield "prefix", top, None, 0.0
                continue
            found = self._revision(repo, rev)
            if found is None:
                continue
            view, mtime = found
            folder, _, name_prefix = (rest or "").rpartition("/")
            tid = view.folder_id(folder)
            if tid is None:
                continue
            base = top + (folder + "/" if folder else "")
            for kind, key, entry in tree_keys(view, tid, base, name_prefix, not delimiter, after):
                yield kind, key, entry, mtime

    def _page(self, repo: str, prefix: str, delimiter: str, after: str, limit: int) -> tuple[list, bool]:
        items: list = []
        if limit == 0:  # max-keys=0: nothing asked, nothing truncated (as S3)
            return items, False
        for item in self._keys(repo, prefix, delimiter, after):
            if len(items) == limit:
                return items, True
            items.append(item)
        return items, False

    async def list_objects(self, bucket: str, query: dict) -> web.Response:
        v2 = query.get("list-type") == "2"
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        if delimiter not in ("", "/"):
            raise S3Error(501, "NotImplemented", f"delimiter {delimiter!r}: this gateway lists with '/' or none")
        try:
            limit = min(MAX_KEYS, int(query.get("max-keys", MAX_KEYS)))
        except ValueError:
            raise S3Error(400, "InvalidArgument", "max-keys must be a number") from None
        if limit < 0:
            raise S3Error(400, "InvalidArgument", "max-keys must not be negative")
        token = query.get("continuation-token") if v2 else None
        if v2 and "continuation-token" in query and not token:
            raise S3Error(400, "InvalidArgument", "The continuation token provided is incorrect")
        if query.get("encoding-type", "url") != "url":
            raise S3Error(400, "InvalidArgument", "Invalid Encoding Method specified in Request")
        start_after = query.get("start-after", "") if v2 else query.get("marker", "")
        after = max(start_after, decode_token(token) if token else "")
        items, truncated = await self._io(self._page, bucket, prefix, delimiter, after, limit)
        url = query.get("encoding-type") == "url"
        enc = (lambda s: quote(s, safe="/")) if url else (lambda s: s)
        if not url:  # XML 1.0 cannot carry some characters at all, not even as references (issue 43)
            bad = next((key for _, key, _, _ in items if _XML_UNFIT.search(key)), None)
            if bad is not None:
                raise S3Error(400, "InvalidArgument", f"key {quote(bad, safe='/')!r} (percent-encoded here) holds "
                                                      f"characters an XML listing cannot carry: list with "
                                                      f"encoding-type=url (the AWS SDKs ask for it by default)")
        parts = [_el("Name", bucket), _el("Prefix", enc(prefix))]
        if v2:
            parts.append(_el("KeyCount", len(items)))
            if token:
                parts.append(_el("ContinuationToken", token))
            if start_after:
                parts.append(_el("StartAfter", enc(start_after)))
        else:
            parts.append(_el("Marker", enc(start_after)))
        parts.append(_el("MaxKeys", limit))
        if delimiter:
            parts.append(_el("Delimiter", enc(delimiter)))
        if url:
            parts.append(_el("EncodingType", "url"))
        parts.append(_el("IsTruncated", "true" if truncated else "false"))
        if truncated and items:
            parts.append(_el("NextContinuationToken", encode_token(items[-1][1])) if v2
                         else _el("NextMarker", enc(items[-1][1])))
        for kind, key, entry, mtime in items:
            if kind == "prefix":
                parts.append(f"<CommonPrefixes>{_el('Prefix', enc(key))}</CommonPrefixes>")
            else:
                parts.append(f"<Contents>{_el('Key', enc(key))}{_el('LastModified', iso_time(mtime))}"
                             f"{_el('ETag', etag(entry))}{_el('Size', entry.size)}"
                             f"{_el('StorageClass', 'STANDARD')}</Contents>")
        return _xml("ListBucketResult", "".join(parts))


# -- the app ----------------------------------------------------------------------------------------
def _error_response(request: web.Request, e: S3Error) -> web.Response:
    rid = secrets.token_hex(8)
    headers = {"x-amz-request-id": rid, NATIVE_PORT_HEADER: str(request.app[NATIVE_PORT])}
    if request.method == "HEAD":  # no body: the status says it (as S3)
        return web.Response(status=e.status, headers={**headers, "Content-Length": "0"})
    message = sanitize(str(e), request.app[STORE_ROOTS])
    extra = "".join(_el(k, v) for k, v in e.extra.items())
    body = (f"{_el('Code', e.code)}{_el('Message', message)}{extra}"
            f"{_el('Resource', unquote(request.raw_path.partition('?')[0]))}{_el('RequestId', rid)}")
    resp = _xml("Error", body, ns=False)
    resp.set_status(e.status)
    resp.headers.update(headers)
    return resp


@web.middleware
async def s3_errors(request: web.Request, handler):
    try:
        return await handler(request)
    except S3Error as e:
        return _error_response(request, e)
    except RepoNotFoundError as e:
        return _error_response(request, S3Error(404, "NoSuchBucket", str(e)))
    except RevisionNotFoundError as e:
        return _error_response(request, S3Error(404, "NoSuchKey", str(e)))
    except BusyError as e:
        return _error_response(request, S3Error(503, "SlowDown", str(e)))
    except CorruptionError as e:  # never a wrong byte: the request fails, naming the damage
        log.error("%s %s: %s", request.method, request.path, e)
        return _error_response(request, S3Error(500, "InternalError", str(e)))
    except (CdcError, ValueError) as e:
        return _error_response(request, S3Error(400, "InvalidArgument", str(e)))
    except asyncio.CancelledError:
        raise
    except ConnectionResetError as e:  # the client hung up (aiohttp's ClientConnectionResetError too): one quiet line
        log.info("%s %s: the client hung up (%s)", request.method, request.path, type(e).__name__)
        return _error_response(request, S3Error(400, "RequestTimeout", "the client hung up"))
    except web.HTTPException as e:
        return _error_response(request, S3Error(e.status, "InvalidRequest", e.reason or "error"))
    except Exception as e:
        log.exception("internal error on %s %s", request.method, request.path)
        return _error_response(request, S3Error(500, "InternalError", f"internal error: {type(e).__name__}"))


NATIVE_PORT = web.AppKey("native_port", object)  # the native API's port, named on errors (wire.NATIVE_PORT_HEADER)


def make_gateway_app(server, roots: tuple = (), native_port: int | None = None, writes=None) -> web.Application:
    """The gateway's app over a `server.Server`; `roots`: the store paths its errors never name;
    `writes(gateway)`: the handler of writes (None: they answer 501)."""
    gateway = Gateway(server, writes)
    app = web.Application(middlewares=[s3_errors])
    app[STORE_ROOTS], app[NATIVE_PORT] = roots, native_port or ""
    app.router.add_route("*", "/{tail:.*}", gateway.handle)
    return app


def listen(app: web.Application, host: str, port: int, native_port: int | None = None, writes=None) -> None:
    """Serve the gateway on `host:port` while `app` (the native API's, `server.make_app`, on
    `native_port`) runs, in its process, over its `Server`."""
    runner = web.AppRunner(make_gateway_app(app[SERVER], app[STORE_ROOTS], native_port, writes),
                           access_log=logging.getLogger("cdcstore.access"),
                           access_log_format='%a "%r" %s %b %Tfs')

    async def start(_app: web.Application) -> None:
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as e:
            raise InvalidAddressError(f"S3 gateway port {port} cannot be bound ({e.strerror or e}): "
                                      f"pick another with --s3-port") from None
        print(f"cdcstore S3 gateway ({'reads and writes' if writes else 'reads'}) on http://{host}:{port}",
              flush=True)

    async def stop(_app: web.Application) -> None:
        await runner.cleanup()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)

"""Writes through the S3 gateway (docs/gateway.md, "Writes"): PutObject (plain, `aws-chunked`),
CopyObject, DeleteObject, DeleteObjects, and (multipart.py) the multipart uploads.

A key of a write is `BRANCH/PATH` in the bucket REPO. The bytes are stored as a push stores a file
(`publish.Publisher`, over the server's repository: the one chunker, Parquet page-aware, only new
chunks packed) and each write lands as one commit on the branch, by the token's name. A tag or a
commit id is refused (403 AccessDenied: they are immutable). A key `BRANCH@JOB/PATH` stages the
write in job JOB's journal instead (nothing visible); writing `BRANCH@JOB/.../_SUCCESS` (what Spark
and Hadoop write when a job commits) lands every staged write of the job as ONE commit, and
`BRANCH@JOB/.cdc-land` does the same without storing a file.

A token writes only where the native API lets it (`tokens.refusal`: write scope, its repos).
"""
from __future__ import annotations

import os
import time
from typing import ContextManager
from urllib.parse import unquote

from aiohttp import web

from ...core.address import check_name, check_ref_name, check_write_path, is_commit_like, normalize_path
from ...core.errors import CdcError, InvalidAddressError, NotFoundError
from ..server.limits import ANONYMOUS, Busy, Slots
from ..server.tokens import owner_id, refusal
from .bodies import read_xml, receive
from .forms import EMPTY_MD5, Target, el, job_id, parse_xml, xml
from .multipart import Multipart
from .reads import S3Error, SIGNED, etag, etag_matches, http_date, iso_time

MAX_PUT_BYTES = 5 * 1024 ** 3  # the largest single PUT (as S3)
MAX_XML_BYTES = 4 << 20  # a DeleteObjects body
MAX_DELETE_KEYS = 1000  # as S3
OBJECT_SUBRESOURCES = ("acl", "tagging", "retention", "legal-hold", "torrent", "restore", "select", "attributes")


def writes_over(publisher):
    """The `writes` factory `gateway.listen` takes: a `GatewayWrites` over each gateway."""
    return lambda gateway: GatewayWrites(gateway, publisher)


class GatewayWrites:
    """The write routes of one `gateway.Gateway`."""

    def __init__(self, gateway, publisher):
        self.gateway, self.server, self.publisher = gateway, gateway.server, publisher
        self.store = gateway.server.store
        limits = gateway.server.limits
        # bodies are chunked here, on the server's cores: a client that sends 10 at once waits in line
        self.slots = Slots("S3 writes", limits.write_slots, limits.write_slots_per_token)
        self.multipart = Multipart(self)

    async def io(self, fn, *args):
        return await self.server.io(fn, *args)

    # -- who, where ------------------------------------------------------------------------------
    @staticmethod
    def owner(request: web.Request) -> str:
        signed = request.get(SIGNED)
        return owner_id(signed[1]) if signed is not None else f"{ANONYMOUS}{id(request)}"

    def author(self, request: web.Request, grant: dict) -> str:
        """The token's name (what a push through the token records); on an open server the access
        key id the client signed with, else `s3-gateway`."""
        if self.server.auth.tokens is not None and grant.get("name"):
            return grant["name"]
        signed = request.get(SIGNED)
        header = request.headers.get("Authorization", "")
        key = signed[0].access_key if signed else header.partition("Credential=")[2].partition("/")[0]
        return key.strip() if key and key.strip().isprintable() and len(key) < 100 else "s3-gateway"

    @staticmethod
    def may(grant: dict, repo: str, write: bool) -> None:
        problem = refusal(grant, repo, write)
        if problem:
            raise S3Error(403, "AccessDenied", problem, BucketName=repo)

    def target(self, repo: str, key: str) -> Target:
        """The branch (or job) and path a write's key names; S3 errors for what cannot be written."""
        rev, _, rest = key.partition("/")
        branch, at, job = rev.partition("@")
        if is_commit_like(branch):
            raise S3Error(403, "AccessDenied", f"{key!r}: {branch!r} names a commit, and a commit is immutable: "
                                               f"write to a branch (KEY = BRANCH/PATH)", Key=key)
        try:
            check_ref_name("branch", branch)
            job_name = check_name("job", job) if at else None
        except InvalidAddressError as e:
            raise S3Error(400, "InvalidArgument", f"{key!r}: {e} (KEY = BRANCH/PATH or BRANCH@JOB/PATH)",
                          Key=key) from None
        folder = rest == "" or rest.endswith("/")
        try:
            path = normalize_path(rest)
        except InvalidAddressError as e:
            raise S3Error(400, "InvalidArgument", f"{key!r}: {e}", Key=key) from None
        parts = rest.rstrip("/").split("/") if rest.rstrip("/") else []
        if path != "/".join(parts) or any(p in ("", ".") for p in parts):
            raise S3Error(400, "InvalidArgument", f"{key!r}: a path in a branch has no empty, '.' or '..' folder "
                                                  f"names", Key=key)
        return Target(repo, key, branch, "" if folder else path,
                      job_id(repo, branch, job_name) if job_name else None)

    def _writable(self, t: Target) -> None:
        """Refuse a tag, or a key no file system could hold, before reading a byte of the body."""
        try:
            check_write_path(t.path)  # `target` normalized it: only its length can fail here
        except InvalidAddressError as e:
            raise S3Error(400, "KeyTooLongError", str(e), Key=t.key) from None
        if self.store.has_repo(t.repo) and t.branch in self.store.tags(t.repo):
            raise S3Error(403, "AccessDenied", f"{t.branch!r} is a tag of repo {t.repo!r}: a tag is immutable: "
                                               f"write to a branch", Key=t.key)

    async def writable(self, t: Target) -> None:
        await self.io(self._writable, t)

    # -- landing -----------------------------------------------------------------------------------
    def land(self, t: Target, entries: dict, removed: list, author: str, message: str,
             expect: dict | None = None) -> str | None:
        """Commit (or stage, for a job) what one write changes; the landed commit id, if any.
        `expect`: the write's conditions (`conditions`), checked against the head it lands on."""
        if t.job is None:
            return self._commit(t, entries, removed, author, message, expect)
        try:
            if entries or removed:
                self.publisher.stage(t.repo, t.job, entries, removed)
            if t.lands:
                return self.publisher.land(t.repo, t.branch, t.job, f"S3 job {t.key.partition('/')[0]}", author)
        except (ValueError, NotFoundError, CdcError) as e:
            raise _refused(t, e) from None
        return None

    def _commit(self, t: Target, entries: dict, removed: list, author: str, message: str,
                expect: dict | None = None) -> str | None:
        try:
            return self.publisher.commit(t.repo, t.branch, entries, removed, message, author, expect)
        except InvalidAddressError as e:
            raise _refused(t, e) from None
        except FileExistsError as e:
            raise S3Error(412, "PreconditionFailed", f"At least one of the pre-conditions you specified did not "
                                                     f"hold: {e}", Condition="If-None-Match" if expect and
                          None in expect.values() else "If-Match", Key=t.key) from None

    @staticmethod
    def conditions(request: web.Request, t: Target) -> dict | None:
        """A write's If-None-Match: * (create only) or If-Match: ETAG (the file as read: a GET's
        ETag, its manifest id) as {path: manifest id or None}; None when it has neither."""
        none_match, match = request.headers.get("If-None-Match"), request.headers.get("If-Match")
        if none_match is None and match is None:
            return None
        if t.job is not None:
            raise S3Error(501, "NotImplemented", f"{t.key!r}: a conditional write to a job (BRANCH@JOB) is not "
                                                 f"served: its condition could only be checked when the job lands")
        if none_match is not None:
            if none_match.strip() != "*":
                raise S3Error(501, "NotImplemented", "If-None-Match on a write takes only '*' (as S3)")
            return {t.path: None}
        assert match is not None  # (neither header: answered above)
        tag = match.strip().strip('"')
        return {t.path: tag}

    # -- dispatch --------------------------------------------------------------------------------
    async def handle(self, request: web.Request, grant: dict, bucket: str, key: str, query: dict):
        method = request.method
        if not bucket:
            raise S3Error(405, "MethodNotAllowed", f"{method} / is not an S3 operation this gateway serves")
        try:
            check_name("repo", bucket)
        except InvalidAddressError as e:
            raise S3Error(400, "InvalidBucketName", str(e), BucketName=bucket) from None
        if method == "GET":  # ?uploads, ?uploadId: uploads in flight are their writers' business
            self.may(grant, bucket, write=True)
            if "uploadId" in query and key:
                return await self.multipart.list_parts(bucket, key, query)
            return await self.multipart.list_uploads(bucket, query)
        self.may(grant, bucket, write=True)
        if "uploads" in query or "uploadId" in query:
            return await self.multipart.handle(request, grant, self.target(bucket, key), query)
        if not key:
            return await self._bucket(request, bucket, query, grant)
        hit = [k for k in query if k in OBJECT_SUBRESOURCES]
        if hit:
            raise S3Error(501, "NotImplemented", f"?{hit[0]} is not served by this gateway")
        t = self.target(bucket, key)
        if method == "PUT":
            await self.writable(t)
            if "x-amz-copy-source" in request.headers:
                return await self.copy_object(request, grant, t)
            return await self.put_object(request, grant, t)
        if method == "DELETE":
            return await self.delete_object(request, grant, t)
        raise S3Error(405, "MethodNotAllowed", f"{method} of an object is not an S3 operation")

    async def _bucket(self, request: web.Request, bucket: str, query: dict, grant: dict):
        if request.method == "POST" and "delete" in query:
            return await self.delete_objects(request, grant, bucket)
        if request.method == "PUT" and not query:  # CreateBucket
            if not await self.io(self.store.has_repo, bucket):  # S3 in us-east-1: 200 for one's own bucket
                await self.io(self.publisher.create, bucket, self.author(request, grant))
            return web.Response(headers={"Location": f"/{bucket}", "Content-Length": "0"})
        raise S3Error(501, "NotImplemented", f"{request.method} of a bucket{' with ?' + next(iter(query)) if query else ''}"
                                             f" is not served by this gateway (repos are deleted with "
                                             f"`cdcstore delete-repo`)")

    # -- objects ---------------------------------------------------------------------------------
    def held(self, request: web.Request):
        """A write slot for the request's token (waited for in line), or 503 SlowDown."""
        return _Held(self, self.owner(request))

    async def put_object(self, request: web.Request, grant: dict, t: Target) -> web.Response:
        async with self.held(request):
            tmp = self.store.tmp_path()
            try:
                expect = self.conditions(request, t) if t.path else None
                got = await receive(self.server, request, tmp, MAX_PUT_BYTES)
                if not t.path:  # a folder marker (pyarrow's create_dir, the console's "folders"): no file
                    if got.size:
                        raise S3Error(400, "InvalidArgument", f"{t.key!r} ends with '/': a folder is no file here "
                                                              f"and cannot hold bytes", Key=t.key)
                    return web.Response(headers={"ETag": f'"{EMPTY_MD5}"', "Content-Length": "0"})
                if t.marker_only:  # BRANCH@JOB/.cdc-land: the job lands, the marker is no file of it
                    cid = await self.io(self.land, t, {}, [], self.author(request, grant), "", expect)
                    return web.Response(headers={"ETag": f'"{got.md5}"', "Content-Length": "0",
                                                 **_commit_header(cid)})
                entry = await self.io(self.publisher.upload, t.repo, t.path, tmp)
                cid = await self.io(self.land, t, {t.path: entry}, [], self.author(request, grant),
                                    f"PUT {t.path} (S3 gateway)", expect)
            finally:
                await self.io(_unlink, tmp)
        return web.Response(headers={"ETag": f'"{got.md5}"', "Content-Length": "0", **_commit_header(cid)})

    async def delete_object(self, request: web.Request, grant: dict, t: Target) -> web.Response:
        if t.path:
            await self.writable(t)
            cid = await self.io(self.land, t, {}, [t.path], self.author(request, grant), f"DELETE {t.path} (S3 gateway)")
            return web.Response(status=204, headers=_commit_header(cid))
        return web.Response(status=204)

    def source(self, request: web.Request, grant: dict, header: str = "x-amz-copy-source"):
        """(repo, key, entry, time) of a copy's source, which the token must be able to read."""
        raw = unquote(request.headers[header].partition("?")[0]).lstrip("/")
        repo, _, key = raw.partition("/")
        if not repo or not key:
            raise S3Error(400, "InvalidArgument", f"{header} must be BUCKET/KEY, not {raw[:200]!r}")
        self.may(grant, repo, write=False)
        return (repo, key, *self.lookup(repo, key))

    def lookup(self, repo: str, key: str):
        """(entry, commit time) of the file REV/PATH names in `repo`, or 404 NoSuchKey."""
        rev, _, path = key.partition("/")
        entry = when = None
        try:
            if path and "" not in path.split("/"):
                cid, _ = self.store.resolve_ref(repo, rev)
                commit = self.store.get_commit(repo, cid)
                entry, when = self.store.view(repo, commit).get(normalize_path(path)), commit.time
        except (NotFoundError, InvalidAddressError):
            entry = None
        if entry is None:
            raise S3Error(404, "NoSuchKey", "The specified key does not exist.", Key=key)
        return entry, when

    async def copy_object(self, request: web.Request, grant: dict, t: Target) -> web.Response:
        if not t.path:
            raise S3Error(400, "InvalidArgument", f"{t.key!r} ends with '/': copy to a file's key", Key=t.key)
        repo, key, entry, when = await self.io(self.source, request, grant)
        _copy_conditions(request.headers, etag(entry), when)
        cid = await self.io(self.land, t, {t.path: entry}, [], self.author(request, grant),
                            f"COPY {repo}/{key} to {t.path} (S3 gateway)")
        body = el("LastModified", iso_time(time.time())) + el("ETag", etag(entry))
        resp = xml("CopyObjectResult", body)
        resp.headers.update(_commit_header(cid))
        return resp

    async def delete_objects(self, request: web.Request, grant: dict, bucket: str) -> web.Response:
        root = parse_xml(await read_xml(self.server, request, MAX_XML_BYTES), "Delete")
        keys = [o.findtext("Key") or "" for o in root.findall("Object")]
        quiet = (root.findtext("Quiet") or "").strip().lower() == "true"
        if not keys or len(keys) > MAX_DELETE_KEYS:
            raise S3Error(400, "MalformedXML", f"a DeleteObjects request names 1 to {MAX_DELETE_KEYS} keys, "
                                               f"not {len(keys)}")
        author = self.author(request, grant)
        deleted, errors = await self.io(self._delete_many, bucket, keys, author)
        body = "" if quiet else "".join(f"<Deleted>{el('Key', k)}</Deleted>" for k in deleted)
        body += "".join(f"<Error>{el('Key', k)}{el('Code', c)}{el('Message', m)}</Error>" for k, c, m in errors)
        return xml("DeleteResult", body)

    def _delete_many(self, bucket: str, keys: list[str], author: str):
        """One commit per branch (or one journal entry per job) for all the keys it holds."""
        groups: dict[tuple, tuple[Target, list[str], list[str]]] = {}
        errors = []
        for k in keys:
            try:
                t = self.target(bucket, k)
                self._writable(t)
            except S3Error as e:
                errors.append((k, e.code, str(e)))
                continue
            group = groups.setdefault((t.branch, t.job), (t, [], []))
            group[1].append(k)
            if t.path:
                group[2].append(t.path)
        deleted = []
        for t, group_keys, paths in groups.values():
            try:
                if paths:
                    self.land(Target(t.repo, t.key, t.branch, "", t.job), {}, paths, author,
                              f"DELETE {len(paths)} files (S3 gateway)")
                deleted.extend(group_keys)
            except S3Error as e:
                errors.extend((k, e.code, str(e)) for k in group_keys)
        return deleted, errors


class _Held:
    """`async with`: a write slot of the gateway's pool for `owner`, waited for in line."""

    def __init__(self, writes: GatewayWrites, owner: str):
        self.writes, self.owner = writes, owner
        self._cm: ContextManager[None] | None = None

    async def __aenter__(self):
        await self.writes.slots.wait(self.owner, self.writes.server.limits.read_wait)
        self._cm = cm = self.writes.slots.take(self.owner)
        try:
            cm.__enter__()
        except Busy as e:
            raise S3Error(503, "SlowDown", str(e)) from None

    async def __aexit__(self, *exc):
        assert self._cm is not None  # taken by __aenter__
        self._cm.__exit__(None, None, None)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _commit_header(cid: str | None) -> dict:
    return {"x-cdc-commit": cid} if cid else {}


def _refused(t: Target, e: Exception) -> S3Error:
    text = str(e)
    if "tag" in text and "immutable" in text:
        return S3Error(403, "AccessDenied", text, Key=t.key)
    if isinstance(e, NotFoundError):
        return S3Error(404, "NoSuchUpload" if "job" in text else "NoSuchKey", text, Key=t.key)
    return S3Error(400, "InvalidArgument", text, Key=t.key)


def _copy_conditions(headers, tag: str, when: float) -> None:
    """x-amz-copy-source-if-(none-)match / -if-(un)modified-since: 412 PreconditionFailed (as S3)."""
    match, none_match = headers.get("x-amz-copy-source-if-match"), headers.get("x-amz-copy-source-if-none-match")
    failed = (match is not None and not etag_matches(match, tag)) or \
             (none_match is not None and etag_matches(none_match, tag))
    since = http_date(headers.get("x-amz-copy-source-if-unmodified-since"))
    if match is None and since is not None and int(when) > since:
        failed = True
    since = http_date(headers.get("x-amz-copy-source-if-modified-since"))
    if none_match is None and since is not None and int(when) <= since:
        failed = True
    if failed:
        raise S3Error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold",
                      Condition="x-amz-copy-source-If-Match")

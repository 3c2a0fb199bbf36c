"""Multipart uploads through the S3 gateway (docs/gateway.md, "Multipart uploads"):
CreateMultipartUpload, UploadPart, UploadPartCopy, CompleteMultipartUpload,
AbortMultipartUpload, ListParts, ListMultipartUploads.

Parts are staged in the store (storage/uploads.py: a job folder under staging/, so every replica
sees them and gc reclaims an upload nobody finishes); nothing is visible until Complete, which
stores the file the parts make as a push stores a file (the same chunks and manifest as
`cdcstore push` of it) and lands it as one commit. On a directory store the parts are chunked
as they arrive in order (`Store.prechunk`: a growing file, its final chunks hashed and stored
ahead), so Complete hashes only what was not guessed right. The answer's ETag is S3's
multipart form: the MD5 of the parts' MD5s, `-N`.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time

from aiohttp import web

from ... import runtime
from ...core.errors import BusyError, NotFoundError
from ...storage import staging, uploads
from ...storage.reader import FileReader
from ...storage.uploads import NoSuchUpload
from ..server.staging import JournalSpace
from .bodies import read_xml, receive
from .forms import Target, el, parse_xml, xml
from .reads import MAX_KEYS, S3Error, iso_time, parse_range

log = logging.getLogger("cdcstore.gateway")

MAX_PART_BYTES = 5 * 1024 ** 3  # as S3
MAX_HELD_PART_BYTES = 64 * 1024 ** 2  # over a bucket a part is put as one object, held in memory while it is
# put (issue 43: 1 GiB parts took a server to +2 GB); clients' parts are 5-64 MiB (boto3 and the AWS CLI 8)
MIN_PART_BYTES = 5 * 1024 ** 2  # every part but the last (as S3)
MAX_COMPLETE_XML = 8 << 20  # 10,000 parts fit
PRECHUNK_NICE = 10  # the priority of chunking ahead below the server's (it only takes idle cores)
PRECHUNK_IDLE = 3600.0  # an upload that got no part for this long stops being chunked ahead (its growing file goes)


class _Ahead:
    """One upload chunked ahead of its Complete (`engine.prechunk`): the growing file, and
    the task that feeds it (one at a time; `again` asks it for another round)."""

    def __init__(self, pre):
        self.pre = pre
        self.task: asyncio.Future | None = None
        self.again = False
        self.dead = False  # the upload ended, or a round failed: Complete does it all
        self.used = time.monotonic()


class Multipart:
    """The multipart routes of one `GatewayWrites`."""

    def __init__(self, writes):
        self.writes = writes
        self.server, self.store = writes.server, writes.store
        self.space = JournalSpace(self.store, self.server.limits.max_upload_bytes_per_token)
        # an upload's Complete or Abort in flight here, registered before either awaits anything, so
        # that the other waits for it and answers what happened (True: the Complete landed)
        self._completing: dict[str, asyncio.Future[bool]] = {}
        self._aborting: dict[str, asyncio.Future[bool]] = {}
        self._landing: set[asyncio.Future[bool]] = set()  # Completes whose landing began (`_tracked`)
        self._ahead: dict[str, _Ahead] = {}  # uploads chunked as their parts arrive (directory stores)

    def _owner(self, request: web.Request) -> str | None:
        """Whose staged bytes a part counts in (None on an open server: no cap)."""
        return None if self.server.auth.tokens is None else self.writes.owner(request)

    async def handle(self, request: web.Request, grant: dict, t: Target, query: dict):
        method = request.method
        if not t.path:
            raise S3Error(400, "InvalidArgument", f"{t.key!r}: a multipart upload writes a file's key, not a folder",
                          Key=t.key)
        if method == "POST" and "uploads" in query:
            await self.writes.writable(t)
            owner = self._owner(request)
            if owner is not None:  # the upload's marker, record and owner record count in its space
                await self.server.io(self._reserve, owner, 3 * staging.MIN_CHARGE)
                await self.server.io(self._open_upload, owner)
            upload = await self.server.io(uploads.create, self.store, t.repo, t.key, owner)
            return xml("InitiateMultipartUploadResult", el("Bucket", t.repo) + el("Key", t.key) + el("UploadId", upload))
        upload = query.get("uploadId", "")
        await self.server.io(self._check, t, upload)
        if method == "PUT":
            if "x-amz-copy-source" in request.headers:
                return await self.upload_part_copy(request, grant, t, upload, query)
            return await self.upload_part(request, t, upload, query)
        if method == "POST":
            return await self.complete(request, grant, t, upload)
        if method == "DELETE":
            return await self.abort(t, upload)
        raise S3Error(405, "MethodNotAllowed", f"{method} with ?uploadId is not an S3 operation")

    def _check(self, t: Target, upload: str) -> dict:
        try:
            record = uploads.info(self.store, t.repo, upload)
        except NotFoundError as e:
            raise S3Error(404, "NoSuchUpload", f"The specified upload does not exist: {e}", UploadId=upload) from None
        if record.get("key") != t.key:
            raise S3Error(404, "NoSuchUpload", f"upload {upload} is of key {record.get('key')!r}, not {t.key!r}",
                          UploadId=upload)
        return record

    @staticmethod
    def _number(query: dict) -> int:
        try:
            n = int(query.get("partNumber", ""))
        except ValueError:
            n = 0
        if not 1 <= n <= uploads.MAX_PART_NUMBER:
            raise S3Error(400, "InvalidArgument", f"Part number must be an integer between 1 and "
                                                  f"{uploads.MAX_PART_NUMBER}, inclusive", ArgumentName="partNumber")
        return n

    async def _stage(self, request: web.Request, t: Target, upload: str, number: int, tmp: str, md5: str,
                     size: int) -> uploads.Part:
        owner = self._owner(request)
        if owner is not None:
            await self.server.io(self._reserve, owner, size)
        try:
            return await self.server.io(uploads.put_part, self.store, t.repo, upload, number, tmp, md5)
        except NotFoundError as e:
            raise S3Error(404, "NoSuchUpload", str(e), UploadId=upload) from None

    def _open_upload(self, owner: str) -> None:
        """One more open upload for `owner`, or 403 QuotaExceeded past max_open_uploads_per_token
        (each costs objects and a place in every listing of uploads, whatever its bytes)."""
        try:
            self.space.open_job(owner, self.server.limits.max_open_uploads_per_token)
        except Exception as e:
            if getattr(e, "status", None) == 413:
                raise S3Error(403, "QuotaExceeded", str(e)) from None
            raise

    def _reserve(self, owner: str, size: int) -> None:
        try:
            self.space.reserve(owner, size)
        except Exception as e:  # the journal space's 413, as S3 says it
            if getattr(e, "status", None) == 413:
                raise S3Error(403, "QuotaExceeded", f"{e} (max_upload_bytes_per_token: complete or abort this "
                                                    f"token's uploads first)") from None
            raise

    async def upload_part(self, request: web.Request, t: Target, upload: str, query: dict) -> web.Response:
        number = self._number(query)
        async with self.writes.held(request):
            tmp = self.store.tmp_path()
            try:
                got = await receive(self.server, request, tmp, self._part_limit())
                await self._stage(request, t, upload, number, tmp, got.md5, got.size)
            finally:
                await self.server.io(_unlink, tmp)
        self._chunk_ahead(t, upload)
        return web.Response(headers={"ETag": f'"{got.md5}"', "Content-Length": "0"})

    def _part_limit(self) -> int:
        """5 GiB where parts are files (a directory store); 1 GiB over a bucket, where a part is
        put and read back as one object in memory (boto3 and the CLI send 8 MiB parts)."""
        return MAX_PART_BYTES if self.store.on_local_disk else MAX_HELD_PART_BYTES

    async def upload_part_copy(self, request: web.Request, grant: dict, t: Target, upload: str,
                               query: dict) -> web.Response:
        number = self._number(query)
        repo, key, entry, when = await self.server.io(self.writes.source, request, grant)
        rng = request.headers.get("x-amz-copy-source-range")
        start, stop = parse_range(rng, entry.size) or (0, entry.size) if rng else (0, entry.size)
        if stop - start > self._part_limit():
            raise S3Error(400, "InvalidRequest", f"a copied part is at most {self._part_limit()} bytes here")
        async with self.writes.held(request):
            tmp = self.store.tmp_path()
            try:
                md5 = await self.server.io(self._copy_range, entry, f"{repo}/{key}", start, stop, tmp)
                await self._stage(request, t, upload, number, tmp, md5, stop - start)
            finally:
                await self.server.io(_unlink, tmp)
        self._chunk_ahead(t, upload)
        return xml("CopyPartResult", el("LastModified", iso_time(time.time())) + el("ETag", f'"{md5}"'))

    def _copy_range(self, entry, label: str, start: int, stop: int, tmp: str) -> str:
        """Bytes [start, stop) of a stored file into `tmp`, read through the one read core; their MD5."""
        reader = FileReader(self.store, self.store.get_manifest(entry.manifest), label, readahead_bytes=0)
        h = hashlib.md5()
        try:
            with open(tmp, "wb") as f:
                at = start
                while at < stop:
                    data = reader.pread(at, min(stop - at, 8 << 20))
                    if not data:
                        break
                    h.update(data)
                    f.write(data)
                    at += len(data)
        finally:
            reader.close()
        return h.hexdigest()

    async def abort(self, t: Target, upload: str) -> web.Response:
        """AbortMultipartUpload. One during a Complete of the same upload waits for it: 404
        NoSuchUpload when its object landed (never 204 for an object that is there)."""
        while (running := self._completing.get(upload)) is not None:
            if await asyncio.shield(running):
                raise S3Error(404, "NoSuchUpload", f"upload {upload} was completed while this abort waited for "
                                                   f"it: its object landed", UploadId=upload)
        ending = self._aborting[upload] = asyncio.get_running_loop().create_future()
        try:
            await self._drop_ahead(upload)
            await self.server.io(uploads.abort, self.store, t.repo, upload)
        finally:
            self._aborting.pop(upload, None)
            ending.set_result(True)
        self.space.forget()  # its place and bytes are free: counted again at the next request
        return web.Response(status=204)

    async def complete(self, request: web.Request, grant: dict, t: Target, upload: str) -> web.StreamResponse:
        """CompleteMultipartUpload. Registered before it awaits anything: an Abort that comes
        meanwhile waits for it; one Complete at a time per upload; during an Abort, NoSuchUpload."""
        while (earlier := self._completing.get(upload)) is not None:
            await asyncio.shield(earlier)  # (a retried Complete: then the upload is gone, or it runs again)
        aborting = self._aborting.get(upload)
        if aborting is not None:
            await asyncio.shield(aborting)
            raise S3Error(404, "NoSuchUpload", f"upload {upload} was aborted", UploadId=upload)
        done = self._completing[upload] = asyncio.get_running_loop().create_future()
        try:
            return await self._complete(request, grant, t, upload, done)
        finally:
            if not done.done() and done not in self._landing:  # refused before its landing began
                self._completing.pop(upload, None)
                done.set_result(False)

    async def _complete(self, request: web.Request, grant: dict, t: Target, upload: str,
                        done: asyncio.Future[bool]) -> web.StreamResponse:
        root = parse_xml(await read_xml(self.server, request, MAX_COMPLETE_XML), "CompleteMultipartUpload")
        asked = []
        for p in root.findall("Part"):
            try:
                asked.append((int(p.findtext("PartNumber") or ""), (p.findtext("ETag") or "").strip().strip('"')))
            except ValueError:
                raise S3Error(400, "MalformedXML", "each Part of CompleteMultipartUpload needs a PartNumber") from None
        if not asked:
            raise S3Error(400, "MalformedXML", "You must specify at least one part")
        if [n for n, _ in asked] != sorted({n for n, _ in asked}):
            raise S3Error(400, "InvalidPartOrder", "The list of parts was not in ascending order. The parts list "
                                                   "must be specified in order by part number.")
        expect = self.writes.conditions(request, t)
        async with self.writes.held(request):
            chosen = await self.server.io(self._chosen, t, upload, asked)
            self._landing.add(done)  # from here `_tracked` says how it ended, even if the client left
            return await answer_slowly(request, self._tracked(upload, done, self._land(request, grant, t, upload,
                                                                                        chosen, expect)),
                                       self.server.limits.gateway_keepalive)

    async def _tracked(self, upload: str, done: asyncio.Future[bool], work):
        """`work` (a Complete's landing); `done` tells an Abort of the same upload that waits
        whether the object landed (the work goes on if the client leaves)."""
        landed = False
        try:
            out = await work
            landed = True
            return out
        finally:
            self._completing.pop(upload, None)
            self._landing.discard(done)
            done.set_result(landed)

    async def _land(self, request: web.Request, grant: dict, t: Target, upload: str, chosen: list,
                    expect: dict | None) -> web.Response:
        """Complete's work once its parts are checked: join, store as a push stores a file, land.
        An upload chunked ahead joins onto its growing file and reuses the chunks hashed there."""
        ahead = await self._stop_ahead(upload)
        tmp = self.store.tmp_path()
        reused = 0
        try:
            if ahead is not None:
                entry, reused = await self.server.io(self._store_ahead, ahead.pre, t, chosen)
            else:
                await self.server.io(uploads.assemble, self.store, chosen, tmp)
                entry = await self.server.io(self.writes.publisher.upload, t.repo, t.path, tmp)
        except NotFoundError as e:
            raise S3Error(404, "NoSuchUpload", str(e), UploadId=upload) from None
        finally:
            await self.server.io(_unlink, tmp)
            if ahead is not None:
                await self.server.io(ahead.pre.close)
        cid = await self.server.io(self.writes.land, t, {t.path: entry}, [], self.writes.author(request, grant),
                                   f"PUT {t.path} (S3 gateway, {len(chosen)} parts)", expect)
        await self.server.io(uploads.abort, self.store, t.repo, upload)  # landed: the parts go
        self.space.forget()
        tag = hashlib.md5(b"".join(bytes.fromhex(p.md5) for p in chosen)).hexdigest() + f"-{len(chosen)}"
        body = el("Location", f"/{t.repo}/{t.key}") + el("Bucket", t.repo) + el("Key", t.key) + el("ETag", f'"{tag}"')
        resp = xml("CompleteMultipartUploadResult", body)
        if cid:
            resp.headers["x-cdc-commit"] = cid
        resp.headers["x-cdc-chunked-ahead"] = str(reused)  # bytes whose chunks were hashed before Complete
        return resp

    # -- chunking ahead (docs/gateway.md "Multipart uploads") -----------------------------------
    def _chunk_ahead(self, t: Target, upload: str) -> None:
        """After a part is staged: grow the upload's file by the parts now in order, and chunk
        what is final of it, in the background (a directory store; at most `prechunked_uploads`)."""
        if not self.store.on_local_disk:
            return
        ahead = self._ahead.get(upload)
        if ahead is None:
            self._prune_ahead()
            if len(self._ahead) >= self.server.limits.prechunked_uploads:
                return
            ahead = self._ahead[upload] = _Ahead(self.writes.publisher.prechunk(t.path))
        if ahead.dead:
            return
        ahead.used, ahead.again = time.monotonic(), True
        if ahead.task is None or ahead.task.done():
            ahead.task = asyncio.ensure_future(self._feed_ahead(t, upload, ahead))

    async def _feed_ahead(self, t: Target, upload: str, ahead: _Ahead) -> None:
        while ahead.again and not ahead.dead:
            ahead.again = False
            try:
                # on a thread of lower priority: guessing takes idle cores, never the parts' receipt
                await asyncio.get_running_loop().run_in_executor(runtime.pool("prechunk", 1, nice=PRECHUNK_NICE),
                                                                 self._grow, t, upload, ahead)
            except Exception as e:  # noqa: BLE001 - only a speed-up: Complete then does all the work
                log.warning("multipart %s: chunking ahead stopped (%s); Complete chunks the whole file", upload, e)
                ahead.dead = True
                await self.server.io(ahead.pre.close)

    def _grow(self, t: Target, upload: str, ahead: _Ahead) -> None:
        """Append the parts that follow in order, then chunk a round if enough is pending."""
        pre = ahead.pre
        if not staging.is_open(self.store, t.repo, upload):  # completed or aborted meanwhile
            ahead.dead = True
            pre.close()
            return
        have = {p.number: p for p in uploads.parts(self.store, t.repo, upload)}
        if any(have.get(s.number) is None or have[s.number].name != s.name for s in pre.sources):
            return  # a part it holds was sent again: nothing more is guessed (Complete keeps what is still true)
        n = len(pre.sources) + 1
        while n in have:
            try:
                path, source = uploads.part_file(self.store, have[n])
                if not pre.append(path, source):
                    break
            except (NoSuchUpload, FileNotFoundError):  # replaced or gone meanwhile: the next part tries again
                break
            n += 1
        pre.advance(self.server.limits.prechunk_round_bytes)

    async def _stop_ahead(self, upload: str) -> _Ahead | None:
        """The upload's chunking ahead, its last round over (None: there is none, or it died)."""
        ahead = self._ahead.pop(upload, None)
        if ahead is None:
            return None
        ahead.again = False
        ahead.pre.stopping = True  # a round in progress stops at its next block: Complete does the rest at once
        if ahead.task is not None:
            await asyncio.shield(ahead.task)
        if ahead.dead:
            await self.server.io(ahead.pre.close)
            return None
        return ahead

    async def _drop_ahead(self, upload: str) -> None:
        ahead = await self._stop_ahead(upload)
        if ahead is not None:
            await self.server.io(ahead.pre.close)

    def _prune_ahead(self) -> None:
        """Stop chunking ahead for uploads that got no part for PRECHUNK_IDLE seconds."""
        now = time.monotonic()
        for upload, ahead in list(self._ahead.items()):
            if now - ahead.used > PRECHUNK_IDLE and (ahead.task is None or ahead.task.done()):
                del self._ahead[upload]
                asyncio.ensure_future(self.server.io(ahead.pre.close))

    def _store_ahead(self, pre, t: Target, chosen: list[uploads.Part]):
        """Complete over a growing file: keep it up to the last chosen part it holds as
        chosen, append the rest, and store it with the chunks hashed ahead."""
        pre.finish()  # what was stored ahead is durable before anything names it
        files = [uploads.part_file(self.store, p) for p in chosen]
        n = pre.covered([source for _, source in files])
        prehashed = pre.keep(n)
        for p, (path, _) in zip(chosen[n:], files[n:]):
            try:
                got = pre.extend(path)
            except FileNotFoundError:
                raise NoSuchUpload(f"part {p.number} is gone (the upload ended meanwhile)") from None
            if got != p.size:
                raise NoSuchUpload(f"part {p.number} changed while it was read: complete the upload again")
        entry = self.writes.publisher.upload(t.repo, t.path, pre.path, prehashed)
        m = self.store.get_manifest(entry.manifest)
        reused, at = 0, 0
        for cid, length in zip(m.chunk_ids, m.lengths):
            if prehashed.get(at) == (length, cid):
                reused += length
            at += length
        return entry, reused

    def _chosen(self, t: Target, upload: str, asked: list[tuple[int, str]]) -> list[uploads.Part]:
        have = {p.number: p for p in uploads.parts(self.store, t.repo, upload)}
        chosen = []
        for i, (n, tag) in enumerate(asked):
            p = have.get(n)
            if p is None or p.md5 != tag:
                raise S3Error(400, "InvalidPart", "One or more of the specified parts could not be found. The part "
                                                  "may not have been uploaded, or the specified entity tag may not "
                                                  f"match the part's entity tag (part {n})", PartNumber=n, ETag=tag)
            if i < len(asked) - 1 and p.size < MIN_PART_BYTES:
                raise S3Error(400, "EntityTooSmall", f"Your proposed upload is smaller than the minimum allowed "
                                                     f"size: part {n} is {p.size} bytes; every part but the last is "
                                                     f"at least {MIN_PART_BYTES}", ProposedSize=p.size,
                              MinSizeAllowed=MIN_PART_BYTES, PartNumber=n)
            chosen.append(p)
        return chosen

    # -- listings ----------------------------------------------------------------------------
    async def list_parts(self, repo: str, key: str, query: dict) -> web.Response:
        t = Target(repo, key, "", "")
        upload = query.get("uploadId", "")
        await self.server.io(self._check, t, upload)
        try:
            limit = min(MAX_KEYS, int(query.get("max-parts", MAX_KEYS)))
            after = int(query.get("part-number-marker", "0") or 0)
        except ValueError:
            raise S3Error(400, "InvalidArgument", "max-parts and part-number-marker are numbers") from None
        parts = [p for p in await self.server.io(uploads.parts, self.store, repo, upload) if p.number > after]
        shown, truncated = parts[:limit], len(parts) > limit
        body = el("Bucket", repo) + el("Key", key) + el("UploadId", upload) + el("PartNumberMarker", after)
        if truncated:
            body += el("NextPartNumberMarker", shown[-1].number)
        body += el("MaxParts", limit) + el("IsTruncated", "true" if truncated else "false")
        body += el("StorageClass", "STANDARD")
        body += "".join(f"<Part>{el('PartNumber', p.number)}{el('LastModified', iso_time(p.mtime or time.time()))}"
                        f"{el('ETag', p.etag)}{el('Size', p.size)}</Part>" for p in shown)
        return xml("ListPartsResult", body)

    async def list_uploads(self, repo: str, query: dict) -> web.Response:
        prefix = query.get("prefix", "")
        found = await self.server.io(uploads.uploads, self.store, repo)
        rows = sorted((r.get("key", ""), u, r) for u, r in found if r.get("key", "").startswith(prefix))
        key_marker, id_marker = query.get("key-marker", ""), query.get("upload-id-marker", "")
        rows = [row for row in rows if (row[0], row[1]) > (key_marker, id_marker)] if key_marker else rows
        try:
            limit = min(MAX_KEYS, int(query.get("max-uploads", MAX_KEYS)))
        except ValueError:
            raise S3Error(400, "InvalidArgument", "max-uploads must be a number") from None
        shown, truncated = rows[:limit], len(rows) > limit
        body = el("Bucket", repo) + el("KeyMarker", key_marker) + el("UploadIdMarker", id_marker)
        if truncated:
            body += el("NextKeyMarker", shown[-1][0]) + el("NextUploadIdMarker", shown[-1][1])
        body += el("Prefix", prefix) + el("MaxUploads", limit) + el("IsTruncated", "true" if truncated else "false")
        body += "".join(f"<Upload>{el('Key', k)}{el('UploadId', u)}"
                        f"<Initiator>{el('ID', r.get('owner') or 'cdcstore')}</Initiator>"
                        f"{el('StorageClass', 'STANDARD')}{el('Initiated', iso_time(r.get('initiated', 0)))}</Upload>"
                        for k, u, r in shown)
        return xml("ListMultipartUploadsResult", body)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


async def answer_slowly(request: web.Request, work, keepalive: float) -> web.StreamResponse:
    """The answer of a long Complete, as S3 gives it: when `work` (a coroutine making the answer)
    takes over `keepalive` seconds, a 200 with the XML declaration goes out at once, then a space
    every `keepalive` seconds (a client's read timeout never fires while a big file is chunked),
    then the answer's XML, or S3's <Error> document in that 200 (the SDKs look for one after
    CompleteMultipartUpload and retry). The work goes on if the client leaves: it lands or not."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait([task], timeout=keepalive)
    if done:
        return task.result()
    resp = web.StreamResponse(status=200, headers={"Content-Type": "application/xml"})
    try:
        await resp.prepare(request)
        await resp.write(b'<?xml version="1.0" encoding="UTF-8"?>\n')
        while not done:
            done, _ = await asyncio.wait([task], timeout=keepalive)
            if not done:
                await resp.write(b" ")
        try:
            answer = task.result()
            text = answer.text.split("?>", 1)[-1].lstrip()
        except S3Error as e:
            text = (f"<Error>{el('Code', e.code)}{el('Message', str(e))}"
                    + "".join(el(k, v) for k, v in e.extra.items()) + "</Error>")
        except Exception as e:  # the status is out: the error goes in the body, as S3 sends it
            log.exception("CompleteMultipartUpload of %s failed", request.path)
            code = "SlowDown" if isinstance(e, BusyError) else "InternalError"
            text = f"<Error>{el('Code', code)}{el('Message', f'{type(e).__name__}: the upload was not completed')}</Error>"
        await resp.write(text.encode())
        await resp.write_eof()
    except ConnectionError:  # the client left: the work still lands (or fails) on its own
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return resp

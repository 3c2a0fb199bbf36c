"""The body of an S3 write (PutObject, UploadPart), received into a file with every check S3 makes.

- `X-Amz-Content-Sha256`: a hex SHA-256 is the signed payload: the body must hash to it
  (400 XAmzContentSHA256Mismatch); `UNSIGNED-PAYLOAD` is taken as is; the `STREAMING-*` forms are
  `aws-chunked` bodies (core/awschunked.py), each chunk's signature checked against the request's.
- `Content-MD5` (400 BadDigest, or InvalidDigest when it is no base64 MD5), and the checksums
  the SDKs add (`x-amz-checksum-crc32`, `-crc32c`, `-crc64nvme`, `-sha1`, `-sha256`, in a header
  or the aws-chunked trailer: 400 BadDigest; CRC-32C and CRC-64/NVME are core/checksums.py, issue 43:
  they were taken unchecked).
- A body over the limit is 400 EntityTooLarge, one that stalls is 400 RequestTimeout (the
  server's `body_idle_timeout`), one that ends early is 400 IncompleteBody.

Hashing and writing run on the server's blocking-work pool a MiB at a time, off the event loop.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import binascii
import hashlib
import re
import zlib
from typing import TYPE_CHECKING, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ...core import awschunked, checksums, sigv4
from ...core.pack import WRITE_BUFFER
from .reads import SIGNED, S3Error

if TYPE_CHECKING:
    from typing import Protocol

    class _Running(Protocol):
        """A running hash or CRC: fed by `update`, read by `digest`."""

        def update(self, data: bytes, /) -> None: ...

        def digest(self) -> bytes: ...


HANDOFF = 1 << 20  # bytes gathered on the event loop before they are hashed and written off it
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class _Crc:
    """A running CRC (`step(data, previous)`) of `width` bytes, digested big-endian as S3 sends it."""

    def __init__(self, step, width: int):
        self.step, self.width, self.value = step, width, 0

    def update(self, data) -> None:
        self.value = self.step(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(self.width, "big")


CHECKSUMS: dict[str, Callable[[], _Running]] = {
    "crc32": lambda: _Crc(zlib.crc32, 4), "crc32c": lambda: _Crc(checksums.crc32c, 4),
    "crc64nvme": lambda: _Crc(checksums.crc64nvme, 8), "sha1": hashlib.sha1, "sha256": hashlib.sha256}


class _Sink:
    """A file being written and the hashes of what goes into it."""

    def __init__(self, path: str, hashes: dict):
        self.f = open(path, "wb", buffering=WRITE_BUFFER)
        self.md5 = hashlib.md5()
        self.hashes = hashes
        self.size = 0

    def write(self, pieces: list) -> None:
        for p in pieces:
            self.md5.update(p)
            for h in self.hashes.values():
                h.update(p)
            self.f.write(p)
            self.size += len(p)

    def close(self) -> None:
        self.f.close()


class Received:
    def __init__(self, size: int, md5: bytes):
        self.size, self.md5_digest = size, md5

    @property
    def md5(self) -> str:
        return self.md5_digest.hex()


def _content_md5(value: str | None) -> bytes | None:
    if value is None:
        return None
    try:
        digest = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        digest = b""
    if len(digest) != 16:
        raise S3Error(400, "InvalidDigest", "The Content-MD5 you specified was invalid (a base64 MD5 of the body)")
    return digest


async def receive(server, request: web.Request, path: str, limit: int) -> Received:
    """Write the request's (decoded) body into `path`, checked as S3 checks it."""
    payload = request.headers.get("X-Amz-Content-Sha256", "")
    want_md5 = _content_md5(request.headers.get("Content-MD5"))
    hashes: dict = {}
    decoder = None
    if payload in awschunked.FORMS:
        decoder = _decoder(request, payload)
    elif _HEX64.match(payload):
        hashes["payload"] = hashlib.sha256()
    elif payload not in ("", sigv4.UNSIGNED):
        raise S3Error(400, "InvalidArgument", f"x-amz-content-sha256 {payload[:80]!r} is neither a SHA-256, "
                                              f"UNSIGNED-PAYLOAD nor a STREAMING-* form")
    declared = _declared_checksums(request.headers)
    for name in declared:
        hashes[name] = CHECKSUMS[name]()
    if decoder is not None:  # a trailer may name a checksum the headers announce (x-amz-trailer)
        for name in _trailer_names(request.headers):
            hashes.setdefault(name, CHECKSUMS[name]())
    size = decoder.expected if decoder is not None else request.content_length
    if size is not None and size > limit:
        raise S3Error(400, "EntityTooLarge", f"Your proposed upload of {size} bytes exceeds the maximum allowed "
                                             f"size of {limit} bytes", ProposedSize=size, MaxSizeAllowed=limit)
    sink = _Sink(path, hashes)
    try:
        await _pump(server, request, sink, decoder, limit)
    finally:
        await server.io(sink.close)
    if "payload" in hashes and hashes["payload"].hexdigest() != payload:
        raise S3Error(400, "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match "
                                                        "what was computed (the body changed on its way)")
    if want_md5 is not None and sink.md5.digest() != want_md5:
        raise S3Error(400, "BadDigest", "The Content-MD5 you specified did not match what we received.")
    trailers = decoder.trailers if decoder is not None else {}
    for name, h in hashes.items():
        if name == "payload":
            continue
        value = declared.get(name) or trailers.get(f"x-amz-checksum-{name}")
        if value is None:
            continue
        if base64.b64encode(h.digest()).decode() != value.strip():
            raise S3Error(400, "BadDigest", f"The {name.upper()} you specified did not match the calculated checksum.")
    return Received(sink.size, sink.md5.digest())


def _decoder(request: web.Request, form: str) -> awschunked.Decoder:
    length = request.headers.get("X-Amz-Decoded-Content-Length")
    try:
        expected = int(length) if length is not None else None
    except ValueError:
        raise S3Error(400, "InvalidArgument", "X-Amz-Decoded-Content-Length must be a number of bytes") from None
    signed = request.get(SIGNED)  # (Signed, token) of a checked signature; None on a server without tokens
    signer = awschunked.Signer(signed[1], signed[0]) if signed is not None else None
    try:
        return awschunked.Decoder(form, signer, expected)
    except awschunked.ChunkError as e:
        raise S3Error(400, e.code, str(e)) from None


def _declared_checksums(headers) -> dict[str, str]:
    out = {}
    for name in CHECKSUMS:
        value = headers.get(f"x-amz-checksum-{name}")
        if value is not None:
            out[name] = value
    return out


def _trailer_names(headers) -> list[str]:
    names = []
    for item in headers.get("x-amz-trailer", "").split(","):
        item = item.strip().lower()
        if item.startswith("x-amz-checksum-") and item[len("x-amz-checksum-"):] in CHECKSUMS:
            names.append(item[len("x-amz-checksum-"):])
    return names


async def _pump(server, request: web.Request, sink: _Sink, decoder, limit: int) -> None:
    """Read the body into `sink`. A MiB gathered is hashed and written on the server's pool while
    the next one is read (one batch in flight: the order holds, and the socket is drained
    meanwhile instead of the client waiting on this request's disk and hashes)."""
    idle = server.config.body_idle_timeout
    pending, pending_bytes, got = [], 0, 0
    inflight = None
    try:
        while True:
            try:
                async with asyncio.timeout(idle):
                    block = await request.content.readany()
            except TimeoutError:
                raise S3Error(400, "RequestTimeout", f"Your socket connection to the server was not read from or "
                                                     f"written to within the timeout period ({idle:g} s)") from None
            except (ConnectionError, HttpProcessingError, RequestPayloadError) as e:
                raise S3Error(400, "IncompleteBody", f"the request body could not be read: {type(e).__name__}") from None
            if not block:
                break
            if decoder is not None:
                try:
                    pieces = decoder.feed(block)
                except awschunked.ChunkError as e:
                    raise S3Error(400 if e.code != "SignatureDoesNotMatch" else 403, e.code, str(e)) from None
            else:
                pieces = [block]
            for p in pieces:
                got += len(p)
                pending.append(p)
                pending_bytes += len(p)
            if got > limit:
                raise S3Error(400, "EntityTooLarge", f"the body is over the maximum allowed size of {limit} bytes",
                              MaxSizeAllowed=limit)
            if pending_bytes >= HANDOFF:
                if inflight is not None:
                    await inflight
                inflight = asyncio.ensure_future(server.io(sink.write, pending))
                pending, pending_bytes = [], 0
        if decoder is not None:
            try:
                decoder.finish()
            except awschunked.ChunkError as e:
                raise S3Error(400, e.code, str(e)) from None
        if inflight is not None:
            await inflight
            inflight = None
        if pending:
            await server.io(sink.write, pending)
    finally:
        if inflight is not None:  # a failed request: its last batch lands before the file is closed
            with contextlib.suppress(Exception):
                await inflight
    if decoder is None and request.content_length is not None and got != request.content_length:
        raise S3Error(400, "IncompleteBody", f"You did not provide the number of bytes specified by the "
                                             f"Content-Length HTTP header ({got} of {request.content_length})")


async def read_xml(server, request: web.Request, limit: int) -> bytes:
    """A small XML body (DeleteObjects, CompleteMultipartUpload) in memory, checked as `receive`
    checks a file's (signed payload, Content-MD5)."""
    payload = request.headers.get("X-Amz-Content-Sha256", "")
    want_md5 = _content_md5(request.headers.get("Content-MD5"))
    if request.content_length is not None and request.content_length > limit:
        raise S3Error(400, "MalformedXML", f"the XML body is over {limit} bytes")
    data = bytearray()
    idle = server.config.body_idle_timeout
    while True:
        try:
            async with asyncio.timeout(idle):
                block = await request.content.readany()
        except TimeoutError:
            raise S3Error(400, "RequestTimeout", f"no body byte for {idle:g} s") from None
        except (ConnectionError, HttpProcessingError, RequestPayloadError) as e:
            raise S3Error(400, "IncompleteBody", f"the request body could not be read: {type(e).__name__}") from None
        if not block:
            break
        data += block
        if len(data) > limit:
            raise S3Error(400, "MalformedXML", f"the XML body is over {limit} bytes")
    if payload in awschunked.FORMS:
        dec = _decoder(request, payload)
        try:
            out = b"".join(dec.feed(bytes(data)))
            dec.finish()
        except awschunked.ChunkError as e:
            raise S3Error(400, e.code, str(e)) from None
        data = bytearray(out)
    elif _HEX64.match(payload) and hashlib.sha256(data).hexdigest() != payload:
        raise S3Error(400, "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match "
                                                        "what was computed")
    if want_md5 is not None and hashlib.md5(data).digest() != want_md5:
        raise S3Error(400, "BadDigest", "The Content-MD5 you specified did not match what we received.")
    return bytes(data)

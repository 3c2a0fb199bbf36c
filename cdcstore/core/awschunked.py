"""`Content-Encoding: aws-chunked` request bodies, as S3 reads them (pure: no I/O).

AWS SDKs send a PUT's or an UploadPart's body in this framing when they stream it (the AWS CLI,
boto3 over HTTPS with its default checksums, the Java SDK behind Spark's s3a):

    <hex size>[;chunk-signature=<64 hex>]\\r\\n<size bytes>\\r\\n ... 0[;chunk-signature=...]\\r\\n
    [<trailer name>:<value>\\r\\n ... [x-amz-trailer-signature:<64 hex>\\r\\n]]\\r\\n

`X-Amz-Content-Sha256` says which form: `STREAMING-AWS4-HMAC-SHA256-PAYLOAD` (each chunk signed,
each signature chained to the one before, the first to the request's own),
`STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER` (the same, and the trailer signed too),
`STREAMING-UNSIGNED-PAYLOAD-TRAILER` (no chunk signatures; a checksum in the trailer). A chunk whose
signature does not match, a malformed frame, or more bytes than `X-Amz-Decoded-Content-Length`
raise `ChunkError` naming the problem; the gateway answers S3's error for it.
"""
from __future__ import annotations

import hashlib
import hmac
import re

from . import sigv4

SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
FORMS = (SIGNED, SIGNED_TRAILER, UNSIGNED_TRAILER)
_HEX_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")  # a chunk's size: at most 2**64 - 1, never read ahead of
MAX_HEADER_LINE = 4096  # a chunk's size line or a trailer line is short; more is no aws-chunked body
MAX_TRAILER_BYTES = 16384


class ChunkError(ValueError):
    """A malformed aws-chunked body (`code`: the S3 error code to answer)."""

    def __init__(self, message: str, code: str = "IncompleteBody"):
        super().__init__(message)
        self.code = code


def chunk_string_to_sign(amz_date: str, scope: str, previous: str, data_sha256: str) -> str:
    return "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous, sigv4.EMPTY_SHA256, data_sha256])


def trailer_string_to_sign(amz_date: str, scope: str, previous: str, trailer: bytes) -> str:
    return "\n".join(["AWS4-HMAC-SHA256-TRAILER", amz_date, scope, previous, hashlib.sha256(trailer).hexdigest()])


class Signer:
    """The chain of chunk signatures of one streaming request: `seed` is the request's signature."""

    def __init__(self, secret: str, signed: sigv4.Signed):
        self.key = sigv4.signing_key(secret, signed.date, signed.region, signed.service)
        self.amz_date, self.scope, self.previous = signed.amz_date, signed.scope, signed.signature

    def _mac(self, text: str) -> str:
        return hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def chunk(self, data_sha256: str, claimed: str) -> None:
        want = self._mac(chunk_string_to_sign(self.amz_date, self.scope, self.previous, data_sha256))
        if not (claimed.isascii() and hmac.compare_digest(want, claimed)):  # (non-ASCII: never compared)
            raise ChunkError("a chunk's signature (aws-chunked chunk-signature) does not match its bytes",
                             "SignatureDoesNotMatch")
        self.previous = want

    def trailer(self, trailer: bytes, claimed: str) -> None:
        want = self._mac(trailer_string_to_sign(self.amz_date, self.scope, self.previous, trailer))
        if not (claimed.isascii() and hmac.compare_digest(want, claimed)):
            raise ChunkError("the trailer's signature (x-amz-trailer-signature) does not match",
                             "SignatureDoesNotMatch")


class Decoder:
    """Feed the raw body piece by piece; get the decoded bytes back. `signer` checks chunk
    signatures (None: none checked, as for the unsigned form, or on a server without tokens,
    which trusts every caller); `trailers` collects the trailing headers."""

    def __init__(self, form: str, signer: Signer | None, decoded_length: int | None):
        if form not in FORMS:
            raise ChunkError(f"unknown streaming payload {form!r}: one of {', '.join(FORMS)}", "InvalidArgument")
        if form == UNSIGNED_TRAILER:
            signer = None  # nothing to check but the trailer's checksum (the caller's)
        self.form, self.signer, self.expected = form, signer, decoded_length
        self.trailers: dict[str, str] = {}
        self.decoded = 0
        self._buf = bytearray()
        self._left = 0  # bytes of the current chunk still to come
        self._sig = ""
        self._hash: hashlib._Hash | None = None
        self._state = "size"  # size -> data -> crlf -> size ... -> trailer -> done
        self._trailer = bytearray()

    @property
    def done(self) -> bool:
        return self._state == "done"

    def feed(self, data: bytes) -> list[bytes]:
        """The decoded bytes `data` completes (a list of pieces)."""
        if self._state == "done":
            if len(data):
                raise ChunkError("bytes after the end of an aws-chunked body")
            return []
        self._buf += data
        out: list[bytes] = []
        while True:
            if self._state == "data":
                if not self._buf:
                    break
                take = min(self._left, len(self._buf))
                piece = bytes(self._buf[:take])
                del self._buf[:take]
                self._left -= take
                if self._hash is not None:
                    self._hash.update(piece)
                self.decoded += len(piece)
                if self.expected is not None and self.decoded > self.expected:
                    raise ChunkError(f"the body decodes to more than X-Amz-Decoded-Content-Length "
                                     f"({self.expected}) bytes")
                out.append(piece)
                if self._left == 0:
                    self._end_chunk()
                    self._state = "crlf"
                continue
            line = self._line()
            if line is None:
                break
            if self._state == "crlf":
                if line:
                    raise ChunkError("an aws-chunked chunk is longer than its size line says")
                self._state = "size"
            elif self._state == "size":
                self._start_chunk(line)
            elif self._state == "trailer":
                if line:
                    self._trailer_line(line)
                else:
                    self._finish_trailer()
                    self._state = "done"
                    if self._buf:
                        raise ChunkError("bytes after the end of an aws-chunked body")
                    break
        return out

    def _line(self) -> bytes | None:
        at = self._buf.find(b"\r\n")
        if at < 0:
            if len(self._buf) > MAX_HEADER_LINE:
                raise ChunkError("an aws-chunked size or trailer line is too long (not an aws-chunked body?)")
            return None
        if at > MAX_HEADER_LINE:  # the same limit however the body was split
            raise ChunkError("an aws-chunked size or trailer line is too long (not an aws-chunked body?)")
        line = bytes(self._buf[:at])
        del self._buf[:at + 2]
        return line

    def _start_chunk(self, line: bytes) -> None:
        size_text, _, ext = line.partition(b";")
        if not _HEX_SIZE.fullmatch(size_text):  # hex digits only: no sign, no 0x, no spaces, no `_`
            raise ChunkError(f"an aws-chunked size line {line[:80]!r} does not start with a hex size")
        size = int(size_text, 16)
        sig = ""
        if ext.startswith(b"chunk-signature="):
            sig = ext[len(b"chunk-signature="):].decode("ascii", "replace").strip()
        if self.signer is not None and not sig:
            raise ChunkError("a chunk of a signed aws-chunked body has no chunk-signature", "SignatureDoesNotMatch")
        self._sig = sig
        self._hash = hashlib.sha256() if self.signer is not None else None
        if size == 0:
            self._end_chunk()
            if self.expected is not None and self.decoded != self.expected:
                raise ChunkError(f"the body decodes to {self.decoded} bytes, X-Amz-Decoded-Content-Length "
                                 f"says {self.expected}")
            self._state = "trailer"  # trailer lines (none for the signed form), then an empty line
            return
        self._left = size
        self._state = "data"

    def _end_chunk(self) -> None:
        if self._hash is not None and self.signer is not None:  # (a hash is kept only for a signer)
            self.signer.chunk(self._hash.hexdigest(), self._sig)
            self._hash = None

    def _trailer_line(self, line: bytes) -> None:
        self._trailer += line + b"\n"
        if len(self._trailer) > MAX_TRAILER_BYTES:
            raise ChunkError("the aws-chunked trailer is too long")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise ChunkError(f"an aws-chunked trailer line {line[:80]!r} is not NAME:VALUE")
        self.trailers[name.strip().lower()] = value.strip()

    def _finish_trailer(self) -> None:
        claimed = self.trailers.pop("x-amz-trailer-signature", None)
        if self.form == SIGNED_TRAILER and self.signer is not None:
            if claimed is None:
                raise ChunkError("a signed trailer has no x-amz-trailer-signature", "SignatureDoesNotMatch")
            text = b"".join(l + b"\n" for l in bytes(self._trailer).split(b"\n")
                            if l and not l.lower().startswith(b"x-amz-trailer-signature"))
            self.signer.trailer(text, claimed)

    def finish(self) -> None:
        """At the end of the raw body: it must have ended where its framing says."""
        if self._state != "done":
            raise ChunkError("the aws-chunked body ended before its last (zero-size) chunk and trailer")

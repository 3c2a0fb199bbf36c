"""AWS Signature Version 4 as an S3 server checks it (pure: no I/O).

The S3 gateway (remote/gateway/reads.py) verifies what clients sign: the `Authorization` header
(`AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request, SignedHeaders=a;b,
Signature=HEX`) or the same fields in a presigned URL's query (`X-Amz-Algorithm`,
`X-Amz-Credential`, `X-Amz-Date`, `X-Amz-Expires`, `X-Amz-SignedHeaders`, `X-Amz-Signature`).
The math follows AWS's published description (canonical request, string to sign, a key
derived by four HMACs); tests/test_gateway.py pins it with AWS's own example figures.
"""
from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
from dataclasses import dataclass
from urllib.parse import quote, unquote

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_SKEW = 15 * 60  # seconds a signed request's date may be off the server's clock (as S3)
MAX_EXPIRES = 7 * 24 * 3600  # the longest a presigned URL may live (as S3)
_SPACES = re.compile(r"\s+")
_DATE = re.compile(r"\d{8}T\d{6}Z")  # (fullmatch; a real date besides: `_date`)
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


class SignatureError(ValueError):
    """A request whose signature fields are malformed (S3: AuthorizationHeaderMalformed)."""


@dataclass(frozen=True)
class Signed:
    """What a request says about its signature."""
    access_key: str
    date: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    amz_date: str  # YYYYMMDDTHHMMSSZ
    presigned: bool
    expires: int | None = None  # seconds (presigned URLs)

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def uri_encode(text: str, slash: bool = True) -> str:
    """Percent-encode all but the unreserved characters (A-Z a-z 0-9 - _ . ~), and '/' when `slash`."""
    return quote(text, safe="-_.~/" if slash else "-_.~")


def canonical_uri(raw_path: str) -> str:
    """The path as S3 signs it: decoded once, then each byte encoded once (no dot-segment removal)."""
    return uri_encode(unquote(raw_path)) or "/"


def split_query(raw_query: str) -> list[tuple[str, str]]:
    """(name, value) pairs of a raw query string, percent-decoded ('+' stays '+', as S3 reads it)."""
    out = []
    for part in raw_query.split("&") if raw_query else ():
        name, _, value = part.partition("=")
        out.append((unquote(name), unquote(value)))
    return out


def canonical_query(pairs: list[tuple[str, str]]) -> str:
    encoded = sorted((uri_encode(k, False), uri_encode(v, False)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def canonical_headers(headers: dict[str, str], signed: tuple[str, ...]) -> str:
    """`name:value\\n` for each signed header (lowercase names; values trimmed, inner spaces folded)."""
    return "".join(f"{h}:{_SPACES.sub(' ', headers.get(h, '').strip())}\n" for h in signed)


def canonical_request(method: str, uri: str, query: str, headers: dict[str, str], signed: tuple[str, ...],
                      payload: str) -> str:
    return "\n".join([method, uri, query, canonical_headers(headers, signed), ";".join(signed), payload])


def string_to_sign(amz_date: str, scope: str, request: str) -> str:
    # a header value that is not UTF-8 reaches us as surrogates (aiohttp): signed as the bytes it was
    return "\n".join([ALGORITHM, amz_date, scope,
                      hashlib.sha256(request.encode("utf-8", "surrogateescape")).hexdigest()])


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(secret: str, signed: Signed, request: str) -> str:
    """The hex signature of a canonical request under `signed`'s scope."""
    key = signing_key(secret, signed.date, signed.region, signed.service)
    return hmac.new(key, string_to_sign(signed.amz_date, signed.scope, request).encode(), hashlib.sha256).hexdigest()


def _credential(text: str) -> tuple[str, str, str, str]:
    parts = text.split("/")
    if len(parts) < 5 or parts[-1] != "aws4_request":
        raise SignatureError(f"the credential {text!r} is not KEY/DATE/REGION/SERVICE/aws4_request")
    key = "/".join(parts[:-4])  # an access key id never holds '/', but split from the end anyway
    return key, parts[-4], parts[-3], parts[-2]


def parse_header(value: str, amz_date: str | None) -> Signed:
    """The fields of an `Authorization: AWS4-HMAC-SHA256 ...` header."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise SignatureError(f"unsupported authorization {algorithm!r}: sign requests with {ALGORITHM} (SigV4)")
    fields = {}
    for item in rest.split(","):
        k, sep, v = item.strip().partition("=")
        if sep:
            fields[k.strip()] = v.strip()
    missing = [k for k in ("Credential", "SignedHeaders", "Signature") if k not in fields]
    if missing:
        raise SignatureError(f"the Authorization header lacks {', '.join(missing)}")
    if not amz_date or not _date(amz_date):
        raise SignatureError("a signed request needs an X-Amz-Date header (YYYYMMDDTHHMMSSZ)")
    key, date, region, service = _credential(fields["Credential"])
    return Signed(key, date, region, service, tuple(fields["SignedHeaders"].split(";")),
                  _signature(fields["Signature"]), amz_date, presigned=False)


def _signature(text: str) -> str:
    """A signature as SigV4 writes it: 64 lowercase hex digits (anything else, non-ASCII included,
    is refused here, never compared)."""
    if not _SIGNATURE.fullmatch(text):
        raise SignatureError("the signature is not 64 lowercase hex digits: sign requests with SigV4")
    return text


def parse_query(params: dict[str, str]) -> Signed:
    """The fields of a presigned URL's query."""
    if params.get("X-Amz-Algorithm") != ALGORITHM:
        raise SignatureError(f"unsupported X-Amz-Algorithm {params.get('X-Amz-Algorithm')!r}: use {ALGORITHM}")
    try:
        key, date, region, service = _credential(params["X-Amz-Credential"])
        amz_date, signature = params["X-Amz-Date"], params["X-Amz-Signature"]
        expires = int(params.get("X-Amz-Expires", "0"))
        signed = tuple(params["X-Amz-SignedHeaders"].split(";"))
    except KeyError as e:
        raise SignatureError(f"a presigned URL needs the query parameter {e.args[0]}") from None
    except ValueError:
        raise SignatureError("X-Amz-Expires must be a number of seconds") from None
    if not _date(amz_date):
        raise SignatureError("X-Amz-Date must be YYYYMMDDTHHMMSSZ")
    if not 1 <= expires <= MAX_EXPIRES:
        raise SignatureError(f"X-Amz-Expires must be 1 to {MAX_EXPIRES} seconds")
    return Signed(key, date, region, service, signed, _signature(signature), amz_date, presigned=True,
                  expires=expires)


def _date(text: str) -> bool:
    """`text` is an X-Amz-Date, YYYYMMDDTHHMMSSZ, of a real day and time (nothing after it)."""
    if not _DATE.fullmatch(text):
        return False
    try:
        time.strptime(text, "%Y%m%dT%H%M%SZ")
    except ValueError:
        return False
    return True


def epoch(amz_date: str) -> float:
    return calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))


def time_problem(signed: Signed, now: float) -> str | None:
    """Why a request's time is not acceptable now (None when it is)."""
    t = epoch(signed.amz_date)
    if signed.amz_date[:8] != signed.date:
        return "the date of X-Amz-Date and of the credential scope differ"
    if signed.presigned:
        if signed.expires is None:  # as `t + None` would: a presigned Signed carries its expiry
            raise TypeError("a presigned request without its expiry (X-Amz-Expires)")
        if now > t + signed.expires:
            return "Request has expired"
        if t > now + MAX_SKEW:
            return "the presigned URL's date is in the future"
        return None
    if abs(now - t) > MAX_SKEW:
        return "The difference between the request time and the server's time is too large"
    return None


def matches(secret: str, signed: Signed, method: str, raw_path: str, raw_query: str,
            headers: dict[str, str], payload: str | None) -> bool:
    """Whether `signed.signature` is right for this request under `secret`. The path is tried as
    S3 canonicalises it and as the client sent it (clients differ in what they encode);
    `headers` has lowercase names; `payload` is X-Amz-Content-Sha256 (None: UNSIGNED-PAYLOAD)."""
    pairs = [(k, v) for k, v in split_query(raw_query) if not (signed.presigned and k == "X-Amz-Signature")]
    query = canonical_query(pairs)
    payload = payload or UNSIGNED
    for uri in dict.fromkeys([canonical_uri(raw_path), raw_path or "/"]):
        request = canonical_request(method, uri, query, headers, signed.signed_headers, payload)
        if hmac.compare_digest(sign(secret, signed, request), signed.signature):
            return True
    return False

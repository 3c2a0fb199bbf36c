"""The forms of S3 write requests at the gateway: where a key writes to, and the XML of the
answers and of the bodies (DeleteObjects, CompleteMultipartUpload). Shared by writes.py and
multipart.py (docs/gateway.md, "Writes")."""
from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from xml.sax.saxutils import escape

from aiohttp import web

from .reads import NS, S3Error

JOB_LANDS = "_SUCCESS"  # the file whose write under BRANCH@JOB/ lands the job
JOB_LANDS_ALONE = ".cdc-land"  # the same, but no file: the job lands and nothing of the marker is kept
EMPTY_MD5 = hashlib.md5(b"").hexdigest()


@dataclass(frozen=True)
class Target:
    """Where a write goes: `path` in `branch` of `repo`, or staged in `job` (a journal job id)."""
    repo: str
    key: str
    branch: str
    path: str  # '' for a folder marker (a key ending in '/')
    job: str | None = None

    @property
    def lands(self) -> bool:
        """Whether this write lands its job (BRANCH@JOB/.../_SUCCESS, or .cdc-land)."""
        return self.job is not None and self.path.rpartition("/")[2] in (JOB_LANDS, JOB_LANDS_ALONE)

    @property
    def marker_only(self) -> bool:
        """A job's landing marker that is no file (BRANCH@JOB/.cdc-land): nothing of it is stored."""
        return self.job is not None and self.path.rpartition("/")[2] == JOB_LANDS_ALONE


def job_id(repo: str, branch: str, name: str) -> str:
    """The journal job of BRANCH@NAME in REPO: the same for every writer that names it."""
    return hashlib.blake2b(f"s3-job/{repo}/{branch}/{name}".encode(), digest_size=16).hexdigest()


def xml(root: str, body: str) -> web.Response:
    text = f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{NS}">{body}</{root}>'
    return web.Response(text=text, content_type="application/xml")


def el(name: str, value) -> str:
    return f"<{name}>{escape(str(value))}</{name}>"


def parse_xml(data: bytes, what: str) -> ET.Element:
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise S3Error(400, "MalformedXML", f"The XML you provided was not well-formed ({what}: {e})") from None
    for node in root.iter():  # S3's namespace or none: compare local names
        node.tag = node.tag.rpartition("}")[2]
    return root

"""Issue 33, "a newcomer's second week": cases 2-9, each through the real CLI in a subprocess,
a real server on loopback, moto's S3 server, or the real API."""
import json
import os
import re
import time

import pytest

from cdcstore import Store
from conftest import served_store
import forker

import cdcstore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cdcstore.__file__)))  # subprocesses run the tree under test


def cdc(*args, env: dict | None = None, timeout: float = 60):
    """One `cdcstore` command in a subprocess; a traceback fails the test."""
    e = {k: v for k, v in os.environ.items() if k not in ("CDCSTORE_STORE", "CDCSTORE_TOKEN")}
    e.update(PYTHONPATH=ROOT, **(env or {}))
    p = forker.cli(args, text=True, env=e, timeout=timeout)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def _file(folder, name: str, data: bytes) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _announced(srv) -> str:
    """The URL `cdcstore serve` printed on its 'serving ... on URL' line."""
    for _ in range(100):
        m = re.search(r"cdcstore serving .* on (http://\S+)", srv.log_text())
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError(srv.log_text())


# -- 3. the URL serve prints works as --store ------------------------------------------------------
def test_the_url_serve_prints_works_as_store(tmp_path):
    with served_store(tmp_path, {"tok": {"scope": "admin", "repos": ["*"]}}) as srv:
        url = _announced(srv)
        assert url.endswith("/v1")
        src = _file(tmp_path / "src", "f.bin", os.urandom(50_000))
        for given in (url, url + "/"):
            p = cdc("push", src, "cdc://ds/", "--store", given, "--token", "tok")
            assert p.returncode == 0, p.stderr  # was: "cdcstore: error: Not Found"
        p = cdc("ls", "cdc://ds/", "--store", url, "--token", "tok")
        assert p.returncode == 0 and "f.bin" in p.stdout, p.stderr
        with Store(url, token="tok", cache=False) as s:
            assert len(s.cat("cdc://ds/f.bin")) == 50_000
        p = cdc("ls", "cdc://ds/", "--store", srv.url + "/nope", "--token", "tok")  # another path: named
        assert p.returncode == 1 and srv.url in p.stderr and "/nope" in p.stderr

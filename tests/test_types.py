"""The type checker runs over the package (pyproject.toml's [tool.mypy]: the whole package with
check_untyped_defs; core/ and storage/ with the strict flags) and finds nothing: the roles, the
stores that answer them and the callers that use them agree on every signature (issue 47)."""
import os

from mypy import api

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# mypy's incremental cache, kept between runs on this machine (it re-checks what changed: a fresh
# clone's first run takes ~25 s, later ones a few seconds)
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cdcstore-tests", "mypy")


def test_mypy_finds_no_errors():
    out, err, status = api.run(["--config-file", os.path.join(ROOT, "pyproject.toml"),
                                "--cache-dir", CACHE, os.path.join(ROOT, "cdcstore")])
    assert status == 0, f"mypy:\n{out}{err}"
    assert "Success: no issues found" in out

"""The type checker runs over the package (pyproject.toml's [tool.mypy]: the whole package with
check_untyped_defs; core/ and storage/ with the strict flags) and finds nothing: the roles, the
stores that answer them and the callers that use them agree on every signature (issue 47)."""
import os

from mypy import api

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mypy_finds_no_errors(tmp_path):
    out, err, status = api.run(["--config-file", os.path.join(ROOT, "pyproject.toml"),
                                "--cache-dir", str(tmp_path / "mypy-cache"), os.path.join(ROOT, "cdcstore")])
    assert status == 0, f"mypy:\n{out}{err}"
    assert "Success: no issues found" in out

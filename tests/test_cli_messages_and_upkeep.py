"""What the command line and maintenance tell a user (found trying it as a newcomer, issue 20:
items 4, 5, 6, 7 and 13): stats under a scoped token, the default store, rebuild-index and found
damage, gc and forget in the grace window, unknown revisions, rm and init messages, a badly deduped
Parquet push; each through the real CLI in a subprocess or the real API."""
import glob
import json
import os
import time

import pytest

from cdcstore import CorruptionError, Store
from cdcstore.testing import ServedStore
from conftest import S3_BUCKET, flip_byte, golden_input
import forker

import cdcstore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cdcstore.__file__)))  # subprocesses run the tree under test


def cdc(*args, env: dict | None = None, cwd=None, timeout: float = 60):
    """One `cdcstore` command in a subprocess; a traceback fails the test."""
    e = {k: v for k, v in os.environ.items() if k not in ("CDCSTORE_STORE", "CDCSTORE_TOKEN")}
    e.update(PYTHONPATH=ROOT, **(env or {}))
    p = forker.cli(args, text=True, env=e, timeout=timeout, cwd=cwd)  # `python -m cdcstore`, forked preloaded
    assert "Traceback" not in p.stderr, p.stderr
    return p


def _file(folder, name: str, data: bytes) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


# -- 4. stats with a repo-scoped token ----------------------------------------------------------
def test_stats_with_a_repo_scoped_token_says_what_it_cannot_see(tmp_path):
    tokens = {"tok-a": {"scope": "write", "repos": ["a"]}, "tok-admin": {"scope": "admin", "repos": ["*"]}}
    with ServedStore(tmp_path, tokens=tokens) as srv:
        src = _file(tmp_path / "src", "f.bin", os.urandom(200_000))
        assert cdc("push", src, "cdc://a/", "--store", srv.url, "--token", "tok-a").returncode == 0
        p = cdc("stats", "--store", srv.url, "--token", "tok-a")
        assert p.returncode == 0, p.stderr  # was: KeyError: 'pack_bytes'
        assert "1 repos" in p.stdout and "not shown" in p.stdout and "pack_bytes" in p.stdout
        p = cdc("stats", "--json", "--store", srv.url, "--token", "tok-a")
        st = json.loads(p.stdout)
        assert p.returncode == 0 and st["hidden"] == ["packs", "pack_bytes"]
        assert st["stored_bytes"] > 190_000 and st["versions"] == 1 and st["dedup_ratio"] > 0.9
        whole = json.loads(cdc("stats", "--json", "--store", srv.url, "--token", "tok-admin").stdout)
        assert "hidden" not in whole and whole["packs"] == 1


# -- 5. every command names its store -------------------------------------------------------------
def test_a_push_without_a_store_says_it_made_the_default_one(tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)}
    src = _file(tmp_path / "src", "f.bin", b"x" * 5000)
    p = cdc("push", src, "cdc://ds/", "--json", env=env)
    default = os.path.join(str(tmp_path / "xdg"), "cdcstore", "store")
    assert p.returncode == 0 and os.path.isdir(default)
    json.loads(p.stdout)  # stdout stays one JSON object
    assert f"created the default store {default}" in p.stderr and "--store" in p.stderr
    assert "CDCSTORE_STORE" in p.stderr and len(p.stderr.splitlines()) == 1
    p = cdc("ls", "cdc://ds/", env=env)  # a read of it names it too, and where the choice came from
    assert p.stderr.splitlines() == [f"cdcstore: store {default} (the default: no --store, no $CDCSTORE_STORE)"]
    p = cdc("rm", "cdc://ds/f.bin", env={**env, "CDCSTORE_STORE": default})
    assert p.returncode == 0 and p.stderr.splitlines() == [f"cdcstore: store {default} ($CDCSTORE_STORE)"]
    p = cdc("log", "ds", "--store", default, env=env)
    assert p.stderr.splitlines() == [f"cdcstore: store {default} (--store)"]
    assert cdc("-q", "log", "ds", "--store", default).stderr == ""  # -q: only the result


# -- 6. one path from damage to repair ------------------------------------------------------------
_flip = flip_byte


def test_damage_found_by_a_read_is_never_hidden_by_rebuild_index(tmp_path):
    root = str(tmp_path / "store")
    data = golden_input(1_000_000)
    src = _file(tmp_path / "src", "a.bin", data)
    with Store.init(root) as s:
        s.push([src], "cdc://ds/a.bin")
    [pack] = glob.glob(os.path.join(root, "packs", "*", "*.pack"))
    _flip(pack, 100_000)
    p = cdc("cat", "cdc://ds/a.bin", "--store", root)
    assert p.returncode == 1 and "cdcstore check" in p.stderr
    p = cdc("cat", "cdc://ds/a.bin", "--store", root)  # the second read: it names check, not rebuild-index
    assert p.returncode == 1 and "cdcstore check" in p.stderr and "rebuild-index" not in p.stderr
    r = cdc("rebuild-index", "--store", root)
    assert r.returncode == 0 and "left out 1 damaged chunks" in r.stdout  # was: the damaged chunk indexed again
    p = cdc("check", "--store", root)  # the fast check after a known damage: not clean
    assert p.returncode == 1 and "failed verification" in p.stdout and "cdc://ds@main/a.bin" in p.stdout
    assert "push the original files again" in p.stdout
    assert cdc("push", src, "cdc://ds/a.bin", "--store", root).returncode == 0  # the fix check named
    assert cdc("check", "--store", root).returncode == 0  # repaired: the new copy is read
    assert cdc("rebuild-index", "--store", root).returncode == 0
    assert cdc("check", "--store", root).returncode == 0  # and a rebuild does not bring the damage back
    with Store(root) as s:
        assert s.cat("cdc://ds/a.bin") == data


def test_rebuild_index_read_data_leaves_out_damage_no_read_has_found(tmp_path):
    root = str(tmp_path / "store")
    src = _file(tmp_path / "src", "a.bin", golden_input(600_000))
    with Store.init(root) as s:
        s.push([src], "cdc://ds/a.bin")
    [pack] = glob.glob(os.path.join(root, "packs", "*", "*.pack"))
    _flip(pack, 50_000)
    r = json.loads(cdc("rebuild-index", "--read-data", "--json", "--store", root).stdout)
    assert r["damaged_chunks"] == 1
    with Store(root) as s:
        assert any("failed verification" in p for p in s.check()["problems"])
        with pytest.raises(CorruptionError, match="cdcstore check"):
            s.cat("cdc://ds/a.bin")


# -- 7. forget, then gc frees at once; log marks forgotten commits; forget --prune -----------------
def _three_versions(tmp_path, root):
    cids = []
    with Store.init(root) as s:
        for i in range(3):
            cids.append(s.push([_file(tmp_path / f"v{i}", "d.bin", os.urandom(300_000))], "cdc://ds/d.bin",
                               message=f"v{i}").commit)
    return cids


def test_gc_after_forget_frees_forgotten_data_inside_the_grace_window(tmp_path):
    root = str(tmp_path / "store")
    cids = _three_versions(tmp_path, root)
    assert cdc("forget", "ds", "--keep-last", "1", "--store", root).returncode == 0
    p = cdc("gc", "--json", "--store", root)  # the default grace: 1 day; everything is minutes old
    g = json.loads(p.stdout)
    assert g["deleted"] and g["delete_packs"] == 2 and g["bytes_freed"] >= 600_000, g  # was: 0 B
    assert g["spared_young"] == 0
    log = cdc("log", "ds", "--store", root)  # was: "tree ... is missing" once gc freed their trees
    assert log.returncode == 0, log.stderr
    lines = log.stdout.splitlines()
    assert len(lines) == 3 and "(forgotten)" not in lines[0] and all("(forgotten)" in x for x in lines[1:])
    entries = json.loads(cdc("log", "ds", "--json", "--store", root).stdout)["commits"]
    assert [e["forgotten"] for e in entries] == [False, True, True] and entries[0]["commit"] == cids[2]
    st = json.loads(cdc("stats", "--json", "--store", root).stdout)
    assert st["versions"] == 1
    assert cdc("rebuild-index", "--store", root).stdout.startswith("indexed")
    assert cdc("check", "--store", root).returncode == 0


def test_gc_still_spares_young_uploads_no_commit_reaches(tmp_path):
    root = str(tmp_path / "store")
    _three_versions(tmp_path, root)
    with Store(root) as s:
        entries = s.upload(_file(tmp_path / "up", "u.bin", os.urandom(200_000)), "cdc://ds/u.bin") or entries
        s.forget("ds", keep_last=1)
        g = s.gc()
        assert g["delete_packs"] == 2 and g["spared_young"] >= 1  # the upload's manifest: a root
        assert g["spared_until"] > time.time() + 3600
        p = cdc("gc", "--dry-run", "--store", root)
        assert "an upload in flight may be about to name them" in p.stdout and "a gc after" in p.stdout
        r = s.commit_entries("cdc://ds/", entries)  # the upload lands after the gc: nothing of it was freed
        assert len(s.cat(f"cdc://ds@{r.commit}/u.bin")) == 200_000


def test_forget_prune_forgets_then_collects(tmp_path):
    root = str(tmp_path / "store")
    _three_versions(tmp_path, root)
    p = cdc("forget", "ds", "--keep-last", "1", "--prune", "--store", root)
    assert p.returncode == 0 and "forgot 2 commits" in p.stdout and "freed" in p.stdout
    assert len(glob.glob(os.path.join(root, "packs", "*", "*.pack"))) == 1
    j = json.loads(cdc("forget", "ds", "--keep-last", "1", "--prune", "--json", "--store", root).stdout)
    assert j["forget"] == [] and j["gc"]["delete_packs"] == 0


def test_a_younger_rewrite_of_a_forgotten_manifest_is_spared(tmp_path):
    """A manifest a forgotten commit reached, stored again since (a new upload of the same
    file, not committed yet), is an upload in flight: gc keeps it and its chunks."""
    root = str(tmp_path / "store")
    data = os.urandom(300_000)
    with Store.init(root) as s:
        s.push([_file(tmp_path / "a", "d.bin", data)], "cdc://ds/d.bin")
        s.push([_file(tmp_path / "b", "d.bin", os.urandom(300_000))], "cdc://ds/d.bin")
        s.forget("ds", keep_last=1)
        time.sleep(0.05)
        entries = s.upload(_file(tmp_path / "c", "again.bin", data), "cdc://ds/again.bin")
        g = s.gc()
        assert g["delete_packs"] == 0 and g["delete_manifests"] == 0
        r = s.commit_entries("cdc://ds/", entries)
        assert s.cat(f"cdc://ds@{r.commit}/again.bin") == data


# -- 13. the small ones ---------------------------------------------------------------------------
@pytest.fixture
def small(tmp_path):
    root = str(tmp_path / "store")
    with Store.init(root) as s:
        s.push([_file(tmp_path / "src" / "dir", "f.bin", b"y" * 3000)], "cdc://ds/dir/f.bin")
        s.tag("ds", "v1")
    return root


def test_an_unknown_revision_lists_tags_too(small):
    p = cdc("ls", "cdc://ds@nope/", "--store", small)
    assert p.returncode == 1 and "branches: main" in p.stderr and "tags: v1" in p.stderr


def test_rm_of_a_folder_names_the_cli_flag(small):
    p = cdc("rm", "cdc://ds/dir", "--store", small)
    assert p.returncode == 1 and "rm -r" in p.stderr and "recursive=True" not in p.stderr


def test_init_create_bucket(s3_env):
    bucket = f"made-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    p = cdc("init", "--store", f"s3://{bucket}/ds", env=s3_env)
    assert p.returncode == 1 and "--create-bucket" in p.stderr
    p = cdc("init", "--create-bucket", "--store", f"s3://{bucket}/ds", env=s3_env)
    assert p.returncode == 0, p.stderr
    assert cdc("ls", "cdc://x/", "--store", f"s3://{bucket}/ds", env=s3_env).returncode == 1  # no repo: a store
    p = cdc("init", "--create-bucket", "--store", f"s3://{S3_BUCKET}/other-{bucket}", env=s3_env)  # exists: fine
    assert p.returncode == 0, p.stderr


def test_a_badly_deduped_parquet_push_points_at_the_writer(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    import numpy as np

    root = str(tmp_path / "store")
    n = 100_000
    rng = np.random.default_rng(1)
    table = pa.table({"id": pa.array(np.arange(n)), "x": pa.array(rng.random(n)),
                      "s": pa.array([f"row-{i}-{i * 31 % 977}" for i in range(n)])})
    path = str(tmp_path / "src" / "t.parquet")
    os.makedirs(os.path.dirname(path))
    pq.write_table(table, path)  # plain pyarrow, its defaults
    with Store.init(root):
        pass
    assert "cdcstore.parquet" not in cdc("push", path, "cdc://ds/", "--store", root).stderr  # a first version
    edited = pa.concat_tables([table.slice(0, 100), table.slice(101)])  # one row of 100,000 deleted
    pq.write_table(edited, path)
    p = cdc("push", path, "cdc://ds/", "--json", "--store", root)
    assert p.returncode == 0 and json.loads(p.stdout)["new_bytes"] > 0.5 * os.path.getsize(path)
    assert "t.parquet" in p.stderr and "cdcstore.parquet.write_table" in p.stderr and "hint" in p.stderr

    from cdcstore.parquet import write_table
    root2 = str(tmp_path / "store2")
    with Store.init(root2):
        pass
    write_table(table, path)
    cdc("push", path, "cdc://ds/", "--store", root2)
    write_table(edited, path)
    p = cdc("push", path, "cdc://ds/", "--store", root2)
    assert p.returncode == 0 and "hint" not in p.stderr  # our writer's files dedup: no hint


def test_forget_prune_and_log_through_a_server(tmp_path):
    tokens = {"tok-admin": {"scope": "admin", "repos": ["*"]}}
    with ServedStore(tmp_path, tokens=tokens) as srv:
        opts = ["--store", srv.url, "--token", "tok-admin"]
        for i in range(3):
            src = _file(tmp_path / f"v{i}", "d.bin", os.urandom(200_000))
            assert cdc("push", "-q", src, "cdc://ds/d.bin", "-m", f"v{i}", *opts).returncode == 0
        p = cdc("forget", "ds", "--keep-last", "1", "--prune", "--json", *opts)
        r = json.loads(p.stdout)
        assert len(r["forget"]) == 2 and r["gc"]["delete_packs"] == 2, r  # the server's gc: at once
        entries = json.loads(cdc("log", "ds", "--json", *opts).stdout)["commits"]
        assert [e["forgotten"] for e in entries] == [False, True, True]
        assert json.loads(cdc("stats", "--json", *opts).stdout)["versions"] == 1

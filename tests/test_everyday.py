"""Everyday commands: rm, diff (with new bytes), log of a path, human sizes."""
import json
import os

import forker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cdc(store, *args):
    p = forker.cli([*args, "--store", store], text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_rm_diff_log_of_a_path_and_human_sizes(store, tmp_path):
    src = tmp_path / "a"
    src.mkdir()
    big = bytearray(os.urandom(400_000))
    (src / "x.bin").write_bytes(bytes(big))
    (src / "y.bin").write_bytes(b"y" * 1000)
    v1 = store.push([str(src)], "cdc://ds/", "v1").commit
    big[100_000:100_050] = b"z" * 50
    (src / "x.bin").write_bytes(bytes(big))
    (src / "y.bin").unlink()
    (src / "n.txt").write_text("new")
    v2 = store.push([str(src)], "cdc://ds/", "v2", delete=True).commit
    loc = store.location

    d = json.loads(cdc(loc, "diff", f"cdc://ds@{v1}", "cdc://ds@main", "--json"))["files"]
    by = {e["path"]: e for e in d}
    assert by["y.bin"]["change"] == "removed" and by["n.txt"]["change"] == "added"
    assert by["n.txt"]["new_bytes"] == 3
    assert by["x.bin"]["change"] == "changed" and 0 < by["x.bin"]["new_bytes"] < 200_000  # only the edit's chunks
    assert "KiB" in cdc(loc, "diff", f"cdc://ds@{v1}", "cdc://ds@main", "-h")

    logged = json.loads(cdc(loc, "log", "ds/n.txt", "--json"))["commits"]
    assert [c["commit"] for c in logged] == [v2]  # only the commit that changed it
    assert len(json.loads(cdc(loc, "log", "ds/x.bin", "--json"))["commits"]) == 2

    assert "390.6 KiB  x.bin" in cdc(loc, "ls", "-h", "cdc://ds/") and "400000  x.bin" in cdc(loc, "ls", "cdc://ds/")
    out = cdc(loc, "rm", "cdc://ds/n.txt", "-m", "drop n")
    assert "removed n.txt" in out
    assert "n.txt" not in cdc(loc, "ls", "cdc://ds/")
    assert store.log("ds", limit=1)[0]["message"] == "drop n"


def test_include_and_exclude_on_push_and_pull(store, tmp_path):
    from cdcstore.core.filemap import selected

    assert selected("a/b.tmp", exclude=["*.tmp"]) is False and selected("a/b.bin", exclude=["*.tmp"])
    assert selected("cache/x", exclude=["cache"]) is False  # a name anywhere in the path
    assert selected("train/p.parquet", include=["train/*"]) and not selected("test/p.parquet", include=["train/*"])
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "cache").mkdir()
    for rel in ("train/a.parquet", "train/b.tmp", "cache/c.parquet", "top.parquet", "notes.txt"):
        (src / rel).write_bytes(rel.encode())
    cdc(store.location, "push", str(src), "cdc://ds/", "--include", "*.parquet", "--exclude", "cache")
    got = sorted(e["name"] for e in store.ls("cdc://ds/", recursive=True))
    assert got == ["top.parquet", "train/a.parquet"]
    # --delete removes only what the globs select: notes.txt pushed later survives a parquet-only sync
    store.push([str(src / "notes.txt")], "cdc://ds/notes.txt")
    (src / "top.parquet").unlink()
    cdc(store.location, "push", str(src), "cdc://ds/", "--include", "*.parquet", "--exclude", "cache", "--delete")
    got = sorted(e["name"] for e in store.ls("cdc://ds/", recursive=True))
    assert got == ["notes.txt", "train/a.parquet"]
    out = tmp_path / "out"
    cdc(store.location, "pull", "cdc://ds/", str(out), "--exclude", "*.txt")
    assert sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs) == \
        ["train/a.parquet"]


def test_stats_counts_dedup_over_all_of_history(store, tmp_path):
    data = bytearray(os.urandom(1 << 20))
    f = tmp_path / "d.bin"
    f.write_bytes(bytes(data))
    store.push([str(f)], "cdc://ds/d.bin")
    data[10:20] = b"x" * 10
    f.write_bytes(bytes(data))
    store.push([str(f)], "cdc://ds/d.bin")
    st = store.stats()
    assert st["versions"] == 2 and st["history_bytes"] == 2 << 20
    assert st["bytes"] == 1 << 20  # the branch head alone
    assert 1.5 < st["dedup_ratio"] < 2.1  # two versions kept for little more than one
    assert "2 versions" in cdc(store.location, "stats")

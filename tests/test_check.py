"""check, repair and rebuild-index on damaged stores: real files, real sqlite, real CLI."""
import glob
import json
import os
import sqlite3
import subprocess
import sys
import threading

import pytest

from cdcstore import CorruptionError, Store
from cdcstore.storage.repository import LocalStore
from conftest import flip_byte, golden_input
import forker


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def packs(store):
    return sorted(glob.glob(os.path.join(store.location, "packs", "*", "*.pack")))


flip = flip_byte


def cli(*args, check=False):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = forker.cli(args, text=True, env=env, timeout=60)  # `python -m cdcstore`, forked preloaded
    assert "Traceback" not in r.stderr, r.stderr
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture
def pushed(store, tmp_path):
    src = tmp_path / "data" / "a.bin"
    write(str(src), golden_input(2_000_000))
    store.push([str(src)], "cdc://ds/a.bin")
    return store, src


def test_push_again_repairs_a_damaged_chunk(pushed):
    store, src = pushed
    [pack] = packs(store)
    flip(pack, 100_000)
    s2 = Store(store.location)
    with pytest.raises(CorruptionError, match="cdcstore check"):
        s2.cat("cdc://ds/a.bin")
    r = s2.push([str(src)], "cdc://ds/a.bin")
    assert r.new_bytes > 0
    assert Store(store.location).cat("cdc://ds/a.bin") == golden_input(2_000_000)


def test_check_read_data_finds_damage_names_files_and_repair_heals(pushed):
    store, src = pushed
    [pack] = packs(store)
    flip(pack, 100_000)
    assert Store(store.location).check()["problems"] == []  # structure only: footers, rows
    r = Store(store.location).check(read_data=True)
    assert any("does not match its name" in p for p in r["problems"])
    assert any("ds" in p and "a.bin" in p for p in r["problems"])
    assert any("fail verification" in p and "cdc://ds@main/a.bin" in p for p in r["problems"])
    assert Store(store.location).push([str(src)], "cdc://ds/a.bin").new_bytes > 0
    r = Store(store.location).check(read_data=True)
    assert [p for p in r["problems"] if "does not match its name" not in p] == []
    assert Store(store.location).cat("cdc://ds/a.bin") == golden_input(2_000_000)


def test_fast_check_finds_deleted_pack_rows_and_objects(pushed, tmp_path):
    store, src = pushed
    [pack] = packs(store)
    os.unlink(pack)
    r = cli("check", "--store", store.location)
    assert r.returncode == 1 and "is missing" in r.stdout and "cdc://ds@main/a.bin" in r.stdout
    Store(store.location).push([str(src)], "cdc://ds/a.bin")  # heals
    r = cli("check", "--store", store.location)
    assert r.returncode == 0, r.stdout
    # a damaged commit and a missing manifest are problems that name their files
    s = Store(store.location)
    commit, _ = s.resolve_ref("ds", "main")
    manifest = s.get_commit("ds", commit).files["a.bin"].manifest
    os.unlink(LocalStore(s.location).manifest_path(manifest))
    r = json.loads(cli("check", "--store", store.location, "--json").stdout)
    assert r["details"][0]["files"] == ["cdc://ds@main/a.bin"] and "manifest" in r["details"][0]["problem"]
    with open(os.path.join(store.location, "repos", "ds", "commits", f"{commit}.json"), "ab") as f:
        f.write(b" ")
    r = cli("check", "--store", store.location)
    assert r.returncode == 1 and f"commit {commit}" in r.stdout


def test_fast_check_finds_missing_and_wrong_index_rows(pushed):
    store, _ = pushed
    idx = LocalStore(store.location).index
    rows = idx.rows()
    first, second = list(rows)[:2]
    with idx.conn:
        idx.conn.execute("DELETE FROM chunks WHERE id=?", (first,))
        idx.conn.execute("UPDATE chunks SET offset=offset+1 WHERE id=?", (second,))
    r = Store(store.location).check()
    text = "\n".join(r["problems"])
    assert "lacks 1 chunks" in text and "do not match its footer" in text and "a.bin" in text


def test_read_data_subset_reads_a_deterministic_sample(store, tmp_path):
    for i in range(4):
        write(str(tmp_path / f"f{i}"), golden_input(100_000 + i))
        store.push([str(tmp_path / f"f{i}")], f"cdc://ds/f{i}")
    r1 = cli("check", "--store", store.location, "--read-data-subset", "50%", "--json", check=True)
    assert json.loads(r1.stdout)["read_packs"] == 2
    r = cli("check", "--store", store.location, "--read-data-subset", "150%")
    assert r.returncode != 0 and "0% and 100%" in r.stderr


def test_truncated_pack_under_a_reader_is_an_error_not_sigbus(pushed, tmp_path):
    store, _ = pushed
    code = f"""
import os, glob, sys
from cdcstore import Store, CorruptionError
s = Store({store.location!r})
f = s.open("cdc://ds/a.bin")
f.read(10)
[pack] = glob.glob(os.path.join({store.location!r}, "packs", "*", "*.pack"))
os.truncate(pack, 4096)
try:
    f.seek(1_500_000); f.read(100_000)
except CorruptionError as e:
    print("ERR", e)
"""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "ERR" in r.stdout and "cdcstore check" in r.stdout


def test_garbage_index_one_line_everywhere_and_rebuild_fixes_it(pushed):
    store, _ = pushed
    store.close()
    path = os.path.join(store.location, "index.sqlite")
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    write(path, os.urandom(50_000))
    for args in (["cat", "cdc://ds/a.bin"], ["check"], ["stats"]):
        r = cli(*args, "--store", store.location)
        assert r.returncode != 0 and "chunk index is damaged" in r.stderr and "rebuild-index" in r.stderr, r.stderr
    opened_before = Store(store.location)  # e.g. a server: it recovers once the index is rebuilt
    cli("rebuild-index", "--store", store.location, check=True)
    assert Store(store.location).cat("cdc://ds/a.bin") == golden_input(2_000_000)
    assert opened_before.cat("cdc://ds/a.bin") == golden_input(2_000_000)


def test_rebuild_keeps_readable_chunks_of_a_pack_with_a_damaged_trailer(pushed):
    store, _ = pushed
    [pack] = packs(store)
    size = os.path.getsize(pack)
    flip(pack, size - 3)  # END magic
    r = Store(store.location).rebuild_index()
    assert r["bad_packs"] and "kept" in r["bad_packs"][0]
    assert Store(store.location).cat("cdc://ds/a.bin") == golden_input(2_000_000)


def test_rebuild_reports_every_damaged_pack_and_goes_on(store, tmp_path):
    for i in range(3):
        write(str(tmp_path / f"f{i}"), golden_input(600_000)[i * 200_000:(i + 1) * 200_000])
        store.push([str(tmp_path / f"f{i}")], f"cdc://ds/f{i}")
    ps = packs(store)
    for p in ps[:2]:
        os.truncate(p, 100)
    r = Store(store.location).rebuild_index()
    assert len(r["bad_packs"]) == 2 and r["packs"] == 3
    readable = 0
    for i in range(3):
        try:
            readable += Store(store.location).cat(f"cdc://ds/f{i}") == golden_input(600_000)[i * 200_000:(i + 1) * 200_000]
        except CorruptionError:
            pass
    assert readable == 1  # the healthy pack's file; the repo still resolves


def test_reads_keep_working_during_rebuild(store, tmp_path):
    for i in range(6):
        write(str(tmp_path / f"f{i}"), golden_input(50_000 + i))
    store.push([str(tmp_path / f"f{i}") for i in range(6)], "cdc://ds/")
    failures, reads = [], [0]
    stop = threading.Event()

    def reader():
        s = Store(store.location)
        while not stop.is_set():
            for i in range(6):
                try:
                    assert s.cat(f"cdc://ds/f{i}") == golden_input(50_000 + i)
                    reads[0] += 1
                except Exception as e:  # noqa: BLE001 - every failure counts
                    failures.append(repr(e))

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(5):
        Store(store.location).rebuild_index()
    while reads[0] < 300:
        Store(store.location).rebuild_index()
    stop.set()
    for t in threads:
        t.join()
    assert failures == [] and reads[0] >= 300


def test_stray_files_and_bad_marker_give_one_line(pushed, tmp_path):
    store, src = pushed
    write(os.path.join(store.location, "packs", "README"), b"x")
    write(os.path.join(store.location, "packs", "ab", "x.txt"), b"y")
    write(os.path.join(store.location, "repos", "stray"), b"z")
    cli("push", str(src), "cdc://other/a.bin", "--store", store.location, check=True)
    assert "no problems" in cli("check", "--store", store.location, check=True).stdout
    cli("rebuild-index", "--store", store.location, check=True)
    r = cli("push", str(src), "cdc://stray/a.bin", "--store", store.location)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    write(os.path.join(store.location, "cdcstore.json"), b"[]")
    r = cli("ls", "cdc://ds/", "--store", store.location)
    assert r.returncode != 0 and "cdcstore.json is damaged" in r.stderr


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 4 MiB filesystem (tmpfs; needs root, as in CI's container)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_and_read_only_store_give_one_line(tiny_fs, tmp_path):
    root = str(tiny_fs / "s")
    cli("init", "--store", root, check=True)
    write(str(tmp_path / "big"), os.urandom(6_000_000))
    write(str(tmp_path / "small"), b"hello\n")
    r = cli("push", str(tmp_path / "big"), "cdc://r/big", "--store", root)
    assert r.returncode != 0 and "disk full" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert os.listdir(os.path.join(root, "tmp")) == []
    cli("push", str(tmp_path / "small"), "cdc://r/small", "--store", root, check=True)
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    for args in (["push", str(tmp_path / "small"), "cdc://r/x"], ["cat", "cdc://r/small"]):
        r = cli(*args, "--store", root)
        assert r.returncode != 0 and "writable" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_broken_cache_warns_once_and_reads_go_on(server, tmp_path, monkeypatch):
    data = golden_input(1_500_000)
    write(str(tmp_path / "a.bin"), data)
    with Store(server.url, cache=False) as s:
        s.push([str(tmp_path / "a.bin")], "cdc://ds/a.bin")
    cache = tmp_path / "cache.sqlite"
    with Store(server.url, cache=str(cache)) as s:
        assert s.cat("cdc://ds/a.bin") == data
        s.cache.wait()
    conn = sqlite3.connect(str(cache))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert os.path.getsize(cache) > 100_000  # pages to lose (the chunk bytes are in cache.sqlite-chunks/)
    os.truncate(cache, os.path.getsize(cache) // 3)  # truncated: header fine, pages gone
    (tmp_path / "folder").mkdir()
    write(str(tmp_path / "garbage"), os.urandom(20_000))
    for path in (str(cache), str(tmp_path / "folder"), str(tmp_path / "garbage")):
        monkeypatch.setenv("CDCSTORE_CACHE", path)
        r = cli("cat", "cdc://ds/a.bin", "--store", server.url)
        warnings = [line for line in r.stderr.splitlines() if "cache" in line]
        assert r.returncode == 0 and len(r.stdout) > 0, r.stderr
        assert len(warnings) == 1 and "reading without it" in warnings[0], r.stderr


def test_check_on_a_url_runs_on_the_server_side():
    r = cli("check", "--store", "http://127.0.0.1:9")
    assert r.returncode != 0 and "cannot connect" in r.stderr and "Traceback" not in r.stderr  # it runs there


def test_a_pack_landing_while_check_lists_is_not_reported_as_unindexed(pushed, tmp_path):
    """A killed writer's last upload can land after it died (its request was already on the
    wire). check lists the packs once: a pack that lands after that listing is not in this
    check's view, never half in it (found by the recovery, missed by the footer scan)."""
    from cdcstore.storage import check as checking

    store, _ = pushed
    other = Store.init(str(tmp_path / "other"))
    write(str(tmp_path / "late" / "b.bin"), os.urandom(700_000))
    other.push([str(tmp_path / "late" / "b.bin")], "cdc://ds/b.bin")
    [late] = packs(other)
    repo = LocalStore(store.location)
    listings, original = [], repo.objects.list

    def list_then_land(prefix=""):
        out = list(original(prefix))
        if prefix == "packs/" and not listings:  # the pack lands right after the first listing
            dest = os.path.join(store.location, os.path.relpath(late, other.location))
            write(dest, open(late, "rb").read())
        listings.append(prefix)
        return iter(out)

    repo.objects.list = list_then_land
    r = checking.check(repo)
    assert r["problems"] == [], r["problems"]
    assert listings.count("packs/") >= 1
    assert Store(store.location).check()["problems"] == []  # the next check indexes it
    assert LocalStore(store.location).index.has_pack(os.path.basename(late)[:-5])


def test_a_pack_pushed_while_check_lists_is_not_reported_missing(pushed, tmp_path):
    """A push on this machine that stores and indexes a pack right after check's listing: its
    rows name a pack the listing lacks, which is not a lost pack (nor are its rows dropped)."""
    from cdcstore.storage import check as checking

    store, _ = pushed
    data = os.urandom(700_000)
    write(str(tmp_path / "now" / "c.bin"), data)
    repo = LocalStore(store.location)
    original, pushed_now = repo.objects.list, []

    def list_then_push(prefix=""):
        out = list(original(prefix))
        if prefix == "packs/" and not pushed_now:
            with Store(store.location) as s:
                pushed_now.append(s.push([str(tmp_path / "now" / "c.bin")], "cdc://ds/c.bin").commit)
        return iter(out)

    repo.objects.list = list_then_push
    r = checking.check(repo)
    assert pushed_now and r["problems"] == [], r["problems"]
    with Store(store.location) as s:
        assert s.cat("cdc://ds/c.bin") == data
        assert s.check()["problems"] == []


def test_damage_only_an_older_commit_reaches_names_that_commit_and_its_fix_works(store, tmp_path):
    """A flipped byte in a chunk only an older commit reaches was reported as affecting the branch
    head's file (`cdc://ds@main/a.bin`), whose re-push changed nothing. check names the commit by
    id, and its advice - push that version again on a scratch branch, then delete the branch -
    repairs it: the old commit reads back."""
    v1, v2 = golden_input(1_000_000), os.urandom(1_000_000)
    src = tmp_path / "a.bin"
    src.write_bytes(v1)
    old = store.push([str(src)], "cdc://ds/a.bin", message="v1").commit
    [pack] = packs(store)
    src.write_bytes(v2)
    store.push([str(src)], "cdc://ds/a.bin", message="v2")
    flip(pack, 100_000)
    r = Store(store.location).check(read_data=True)
    hurt = [p for p in r["problems"] if "fail verification" in p]
    assert hurt and f"cdc://ds@{old}/a.bin" in hurt[0] and "cdc://ds@main/a.bin" not in hurt[0], r["problems"]
    assert "scratch branch" in hurt[0]
    src.write_bytes(v1)  # the fix it names, by the CLI
    Store(store.location).push([str(src)], "cdc://ds@scratch/a.bin", message="repair")
    Store(store.location).delete_branch("ds", "scratch")
    r = Store(store.location).check(read_data=True)
    assert [p for p in r["problems"] if "does not match its name" not in p] == [], r["problems"]
    assert Store(store.location).cat(f"cdc://ds@{old}/a.bin") == v1


def test_a_pull_into_a_read_only_folder_names_the_folder_and_the_fix(store, tmp_path):
    """A pull into a read-only file system printed `[Errno 30] Read-only file system:
    '.../part-0.parquet.cdcstore-10967.part'` (a temp name the user never chose). It names the
    file, the folder and the fix, in one line, and leaves nothing behind. A real read-only tmpfs."""
    write(str(tmp_path / "src" / "part-0.parquet"), b"x" * 1000)
    store.push([str(tmp_path / "src" / "part-0.parquet")], "cdc://ds/part-0.parquet")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)], check=True)
    try:
        r = cli("pull", "cdc://ds/part-0.parquet", str(mnt / "part-0.parquet"), "--store", store.location)
        err = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len([e for e in err if "error" in e]) == 1, r.stderr
        assert f"cannot write part-0.parquet into {mnt}: the folder is on a read-only file system" in r.stderr
        assert ".part" not in r.stderr and "Errno" not in r.stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_bad_cache_size_names_the_variable(tmp_path, monkeypatch):
    """`CDCSTORE_CACHE_SIZE=lots` said "invalid size 'lots'" without naming the variable."""
    from cdcstore.settings import SettingError
    from cdcstore.storage.cache import ChunkCache
    monkeypatch.setenv("CDCSTORE_CACHE_SIZE", "lots")
    with pytest.raises(SettingError, match=r"CDCSTORE_CACHE_SIZE='lots': expected a size such as 20GB"):
        ChunkCache(str(tmp_path / "c.sqlite"))
    monkeypatch.setenv("CDCSTORE_CACHE_SIZE", "2G")
    assert ChunkCache(str(tmp_path / "c2.sqlite")).max_bytes == 2 << 30

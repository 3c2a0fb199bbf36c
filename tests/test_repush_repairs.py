"""Pushing the original files again repairs what check found lost, whatever would skip reading
them: a stat cache entry older than the file's second (the timing that made
test_damage_found_by_a_read_is_never_hidden_by_rebuild_index flaky, forced here), or the
base's equal content ids of a folder push (statcache.py, "Lost chunks")."""
import glob
import os

import pytest

from cdcstore import CorruptionError, Store
from cdcstore.storage import statcache
from conftest import flip_byte, golden_input


def _damage(root: str) -> None:
    [pack] = glob.glob(os.path.join(root, "packs", "*", "*.pack"))
    flip_byte(pack, 50_000)


def test_a_repush_stores_a_lost_chunk_though_the_stat_cache_vouches_for_its_file(tmp_path, monkeypatch):
    root, src = str(tmp_path / "store"), str(tmp_path / "a.bin")
    data = golden_input(600_000)
    with open(src, "wb") as f:
        f.write(data)
    real = statcache.now_ns
    # each push sees the file in a later second than its mtime and ctime: its entry is not racy
    monkeypatch.setattr(statcache, "now_ns", lambda: real() + 2_000_000_000)
    with Store.init(root) as s:
        s.push([src], "cdc://ds/a.bin")
        assert s.push([src], "cdc://ds/a.bin").unread_files == 1  # the bad timing holds: the cache vouches
    _damage(root)
    with Store(root) as s:
        with pytest.raises(CorruptionError, match="cdcstore check"):
            s.cat("cdc://ds/a.bin")
        assert s.rebuild_index()["damaged_chunks"] == 1
        assert any("push the original files again" in p for p in s.check()["problems"])
        r = s.push([src], "cdc://ds/a.bin")  # as the message says, no flag
        assert r.unread_files == 0 and r.new_chunks == 1  # read again; the lost chunk stored again
        assert s.check()["problems"] == [] and s.cat("cdc://ds/a.bin") == data
        assert s.push([src], "cdc://ds/a.bin").unread_files == 1  # repaired: the cache is trusted again


def test_a_folder_repush_stores_a_lost_chunk_its_unchanged_content_ids_would_skip(tmp_path):
    root, src = str(tmp_path / "store"), tmp_path / "src"
    src.mkdir()
    data = golden_input(300_000)
    (src / "f0.bin").write_bytes(data)
    for i in range(1, 8):  # 8 files: the push compares content ids with the base first (PREPASS_MIN)
        (src / f"f{i}.bin").write_bytes(os.urandom(2000))
    with Store.init(root) as s:
        s.push(str(src), "cdc://ds/data/", stat_cache=False)
    _damage(root)
    with Store(root) as s:
        assert s.rebuild_index(read_data=True)["damaged_chunks"] == 1
        assert any("push the original files again" in p for p in s.check()["problems"])
        r = s.push(str(src), "cdc://ds/data/", stat_cache=False)
        assert r.new_chunks == 1
        assert s.check()["problems"] == [] and s.cat("cdc://ds/data/f0.bin") == data

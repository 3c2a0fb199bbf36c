"""check, repair and rebuild-index on damaged stores: real files, real sqlite, real CLI."""
import glob
import json
import os
import subprocess
import sys
import threading

import pytest

from cdcstore import CorruptionError, Store
from conftest import golden_input


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def packs(store):
    return sorted(glob.glob(os.path.join(store.location, "packs", "*", "*.pack")))


def flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


def cli(*args, check=False):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-m", "cdcstore", *args], capture_output=True, text=True,
                       env=env, timeout=60)
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


def test_check_finds_damage_without_read_data_and_repair_heals(pushed):
    store, src = pushed
    [pack] = packs(store)
    flip(pack, 100_000)
    r = Store(store.location).backend.check()
    assert any("does not match its name" in p for p in r["problems"])
    assert any("ds" in p and "a.bin" in p for p in r["problems"])
    Store(store.location).push([str(src)], "cdc://ds/a.bin")
    os.unlink(pack)
    r = Store(store.location).backend.check(read_data=True)
    assert r["problems"] == [], r["problems"]


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

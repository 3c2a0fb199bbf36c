"""Byte accounting (issue 20, item 9): one name means one figure everywhere.

`stored_bytes` is the bytes of chunk records in packs (compressed chunk data, without pack
headers, indexes or trailers), for a push, `stats REV` and `stats`; `pack_bytes` is whole pack
files. `sent_bytes` / `received_bytes` / `requests` count the wire of any store that has one:
a server and an `s3://` bucket alike.
"""
import json
import os
import secrets
import subprocess
import sys

import pytest

from cdcstore import Store
from cdcstore.engine.ingest import IngestOptions
from conftest import S3_BUCKET, golden_input


def _files(folder, **named):
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in named.items():
        (folder / name).write_bytes(data)
    return str(folder)


def _pack_files_bytes(store_dir) -> int:
    total = 0
    for folder, _, files in os.walk(os.path.join(store_dir, "packs")):
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    return total


def _several_packs():
    return IngestOptions(max_pack_bytes=256 * 1024)  # many packs: headers and indexes add up


def test_push_and_stats_agree_on_stored_bytes(tmp_path):
    """Before: push counted whole pack files (headers, indexes) and `stats REV` chunk records."""
    data = golden_input(2 << 20)
    src = _files(tmp_path / "v1", **{"a.bin": data, "b.bin": data[::3]})
    with Store.init(str(tmp_path / "store")) as s:
        r = s.push([src], "cdc://ds/", options=_several_packs())
        st = s.stats(f"cdc://ds@{r.commit}")
        assert r.stored_bytes > 0
        assert st["stored_bytes"] == r.stored_bytes
        # the whole pack files are the other figure, named pack_bytes, also the same everywhere
        on_disk = _pack_files_bytes(str(tmp_path / "store"))
        assert r.pack_bytes == on_disk > r.stored_bytes
        store = s.stats()
        assert store["pack_bytes"] == on_disk
        assert store["stored_bytes"] == r.stored_bytes  # the only push: every chunk record is its
        # a second push that adds one file: its figures are its own chunks only
        src2 = _files(tmp_path / "v2", **{"c.bin": golden_input(700_000)[::-1]})
        r2 = s.push([src2], "cdc://ds/", options=_several_packs())
        assert s.stats(f"cdc://ds@{r2.commit}")["stored_bytes"] == r2.stored_bytes > 0
        assert s.stats()["stored_bytes"] == r.stored_bytes + r2.stored_bytes
        assert r.to_dict()["pack_bytes"] == r.pack_bytes


def test_push_to_a_server_agrees_with_stats_there(tmp_path, server):
    data = golden_input(1 << 20)
    src = _files(tmp_path / "v1", **{"a.bin": data})
    with Store(server.url) as s:
        r = s.push([src], "cdc://ds/", options=_several_packs())
        assert s.stats(f"cdc://ds@{r.commit}")["stored_bytes"] == r.stored_bytes > 0
        assert r.sent_bytes > r.pack_bytes > r.stored_bytes  # every pack went over the wire
    assert r.pack_bytes == _pack_files_bytes(str(tmp_path / "srv"))


@pytest.fixture
def s3_url(s3_env, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-a"))
    url = f"s3://{S3_BUCKET}/acct-{secrets.token_hex(4)}"
    Store.init(url).close()
    return url


def test_push_to_an_s3_store_counts_the_bytes_it_sent(s3_url, tmp_path):
    """Before: `sent_bytes: 0` for a push straight to a bucket."""
    data = golden_input(1 << 20)
    src = _files(tmp_path / "v1", **{"a.bin": data})
    with Store(s3_url) as s:
        r = s.push([src], "cdc://ds/", options=_several_packs())
        assert r.requests > 0
        assert r.sent_bytes >= r.pack_bytes > r.stored_bytes > 0  # packs, then manifests, trees, commit
        assert s.stats(f"cdc://ds@{r.commit}")["stored_bytes"] == r.stored_bytes
        c0 = s.counters()
        assert s.cat("cdc://ds/a.bin") == data
        c1 = s.counters()
        assert c1["received_bytes"] - c0["received_bytes"] > 0 and c1["requests"] > c0["requests"]


def test_cli_push_json_reports_sent_bytes_for_s3(s3_url, tmp_path):
    src = _files(tmp_path / "v1", **{"a.bin": golden_input(300_000)})
    out = subprocess.run([sys.executable, "-m", "cdcstore", "push", src, "cdc://ds/", "--json",
                          "--store", s3_url], capture_output=True, text=True, env=os.environ.copy())
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["sent_bytes"] >= doc["pack_bytes"] > doc["stored_bytes"] > 0

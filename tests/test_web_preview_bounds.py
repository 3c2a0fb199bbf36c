"""Issue 43 case 1: the web view's Parquet preview decoded with no bound. A 2 KB file of 1,000 rows
naming one 48 MiB dictionary string took the server from 46 to 1,297 MiB; a 17 KB file holding one
512 MiB value to 2,146 MiB; 50,000 columns made a 3.7 MB page. The preview now reads a column's
page headers before it decodes a page, keeps strings as dictionaries and cuts each cell, and lists
at most 1,000 schema fields. Each file is previewed in a child process (`Browser.parquet`, what the
file page calls) whose peak RSS is measured."""
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from cdcstore import Store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20

PREVIEW = """
import json, sys
from cdcstore.remote.web.data import Browser
from cdcstore.storage.repository import open_repository
def peak_kib():  # VmHWM: this process's peak RSS (ru_maxrss would carry the parent's over exec)
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
b = Browser(open_repository(sys.argv[1]))
b.parquet("ds", "main", "warm.parquet")  # imports and first use out of the way
before = peak_kib()
got = b.parquet("ds", "main", sys.argv[2])
grew = peak_kib() - before
print(json.dumps({"grew_kib": grew, "skipped": got["skipped"], "columns": got["columns"],
                  "rows": got["rows"][:3], "schema": len(got["schema"])}))
"""


def _preview(store: str, path: str) -> dict:
    p = subprocess.run([sys.executable, "-c", PREVIEW, store, path], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_decode_bombs_are_not_decoded_and_the_rest_of_the_file_is_shown(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"a": [1, 2, 3], "s": ["x", "y", "z"]}), src / "warm.parquet")
    big = pa.array(["q" * (48 * MiB)])
    bomb = pa.DictionaryArray.from_arrays(pa.array([0] * 1000, pa.int32()), big)
    pq.write_table(pa.table({"id": pa.array(range(1000)), "s": bomb}), src / "dict-bomb.parquet",
                   compression="zstd", dictionary_pagesize_limit=1 << 30)
    del bomb, big
    pq.write_table(pa.table({"id": [7], "v": ["w" * (160 * MiB)]}), src / "one-value.parquet",
                   compression="zstd", use_dictionary=False)
    pq.write_table(pa.table({f"c{i}": [i] for i in range(5000)}), src / "wide.parquet")
    pq.write_table(pa.table({"id": [1, 2], "s": ["é" * 300, None]}), src / "long-cell.parquet")
    assert os.path.getsize(src / "dict-bomb.parquet") < 64 * 1024
    store = str(tmp_path / "store")
    with Store.init(store) as s:
        s.push([str(src)], "cdc://ds/")

    got = _preview(store, "dict-bomb.parquet")
    assert got["grew_kib"] < 100 * 1024, got["grew_kib"]  # was 1.25 GiB
    assert "s" in got["skipped"] and "over the preview" in got["skipped"]["s"]
    assert got["columns"] == ["id"] and got["rows"][0] == ["0"]

    got = _preview(store, "one-value.parquet")
    assert got["grew_kib"] < 100 * 1024, got["grew_kib"]
    assert "v" in got["skipped"] and got["columns"] == ["id"] and got["rows"] == [["7"]]

    got = _preview(store, "wide.parquet")
    assert got["schema"] == 5000 and len(got["columns"]) == 40

    got = _preview(store, "long-cell.parquet")  # strings read as dictionaries, cut to a cell
    assert got["rows"][0][1] == "é" * 199 + "…" and got["rows"][1][1] == "null"

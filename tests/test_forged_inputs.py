"""Issue 31 case 8, the rest: forged Parquet footers are a clear cdcstore error naming the file
(never pyarrow's raw OSError), a killed push's temp packs do not outlive the next push, and a
format-1 commit sent with a token lands with the token's author."""
import glob
import io
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.core.errors import CorruptionError
from cdcstore.storage.repository import LocalStore
from cdcstore.streaming.dataset import StreamingDataset
from conftest import raw_call as _call
from test_hostile_inputs import patch_footer

MiB = 1 << 20
# ColumnMetaData fields of row group 0's column b: 4 codec, 11 dictionary_page_offset
FORGED = {"an unknown codec": {(4, 0, 1, 1, 3, 4): 99},
          "a dictionary page after the data": {(4, 0, 1, 1, 3, 11): 10 ** 6}}


@pytest.mark.parametrize("what", sorted(FORGED))
def test_a_forged_footer_is_a_clear_error_naming_the_file(store, tmp_path, what):
    t = pa.table({"a": list(range(1000)), "b": [str(i) * 20 for i in range(1000)]})
    buf = io.BytesIO()
    pq.write_table(t, buf, row_group_size=500)
    (tmp_path / "forged.parquet").write_bytes(patch_footer(buf.getvalue(), FORGED[what]))
    store.push([str(tmp_path / "forged.parquet")], "cdc://r/forged.parquet")
    with pytest.raises(Exception) as e:
        list(StreamingDataset("cdc://r/forged.parquet", store=store, batch_size=100))
    print(f"\n{what}: {type(e.value).__name__}: {e.value}")
    assert isinstance(e.value, CorruptionError) and "forged.parquet" in str(e.value) and "row group 0" in str(e.value)


TOKENS = {"tok-w": {"scope": "write", "repos": ["*"], "name": "writer-ci"}}


@pytest.mark.served(tokens=TOKENS)
def test_a_format_1_commit_lands_with_the_tokens_author(server, tmp_path):
    (tmp_path / "f.bin").write_bytes(os.urandom(50_000))
    with Store(server.url, token="tok-w", cache=False) as s:
        s.push(str(tmp_path / "f.bin"), "cdc://a/f.bin")
        head_id, head = s.resolve("cdc://a/")
    entry = head.files["f.bin"]
    doc = {"format": 1, "repo": "a", "parent": head_id, "message": "an old client", "time": time.time(),
           "files": {"f.bin": {"manifest": entry.manifest, "size": entry.size},
                     "copy.bin": {"manifest": entry.manifest, "size": entry.size}}}
    status, body = _call(server.url + "/v1/repos/a/commits", "tok-w", "POST",
                         json.dumps({"commit": json.dumps(doc), "branch": "main", "expected": head_id}).encode())
    assert status == 201, body
    srv = LocalStore(server.store)
    landed = srv.get_commit("a", srv.resolve("a", "main"))
    print(f"\nformat-1 commit through a token: author {landed.author!r}")
    assert landed.author == "writer-ci" and json.loads(body)["author"] == "writer-ci"
    assert sorted(srv.view("a", landed).files()) == ["copy.bin", "f.bin"] and landed.message == "an old client"
    with Store(server.url, token="tok-w", cache=False) as s:
        assert s.cat("cdc://a/copy.bin") == (tmp_path / "f.bin").read_bytes()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


@pytest.mark.served(tokens=TOKENS)
def test_a_killed_pushs_temp_packs_go_at_the_next_push(server, tmp_path):
    (tmp_path / "tmp").mkdir()
    (tmp_path / "data").mkdir()
    for i in range(3):
        (tmp_path / "data" / f"f{i}.bin").write_bytes(os.urandom(60 * MiB))
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "CDCSTORE_TOKEN": "tok-w",
           "CDCSTORE_CACHE": str(tmp_path / "c.sqlite")}
    push = [sys.executable, "-m", "cdcstore", "push", "--store", server.url]
    p = subprocess.Popen(push + [str(tmp_path / "data"), "cdc://a/"], env=env)
    deadline = time.time() + 60
    while time.time() < deadline and not any(_size(f) > 8 * MiB for f in glob.glob(str(tmp_path / "tmp" / "*"))):
        time.sleep(0.005)  # a temp pack being written
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    left = {f: _size(f) for f in glob.glob(str(tmp_path / "tmp" / "cdcstore-upload-*"))}
    (tmp_path / "small.bin").write_bytes(b"small")
    subprocess.run(push + [str(tmp_path / "small.bin"), "cdc://a/small.bin"], env=env, check=True, capture_output=True)
    after = glob.glob(str(tmp_path / "tmp" / "cdcstore-upload-*"))
    print(f"\nkilled push: {len(left)} temp packs ({sum(left.values()) / MiB:.0f} MiB); "
          f"after the next push: {len(after)}")
    assert left and not after

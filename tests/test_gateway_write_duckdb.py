"""DuckDB writes through the S3 gateway with its own `httpfs` (COPY ... TO 's3://...'), no cdcstore
code on its side. The test extra's DuckDB (2.x) has no `httpfs` the package index carries, so this
test runs DuckDB 1.5.5 with `duckdb-extension-httpfs` 1.5.5 in a venv of its own, made on first use
under ~/.cache/cdcstore-tests (pip, about 30 s; reused after); if it cannot be made, the test fails
saying why (never a skip)."""
import json
import os
import subprocess
import textwrap

import boto3

from cdcstore import Store
from cdcstore.storage.repository import LocalStore
from cdcstore.testing import ServerProcess, free_port
from tool_venvs import tool_venv

DUCKDB = "1.5.5"
TOKEN = "duck-" + "d" * 24


def duckdb_python() -> str:
    """The python of a venv with duckdb and its httpfs extension (tool_venvs), made if absent."""
    probe = f"import duckdb, duckdb_extension_httpfs; assert duckdb.__version__ == {DUCKDB!r}"
    return os.path.join(tool_venv(f"duckdb-{DUCKDB}", [f"duckdb=={DUCKDB}", f"duckdb-extension-httpfs=={DUCKDB}"],
                                  probe), "python")


def test_duckdb_copy_to_s3_lands_and_a_job_lands_once(tmp_path):
    py = duckdb_python()
    LocalStore.init(str(tmp_path / "srv"))
    (tmp_path / "tokens.json").write_text(json.dumps({TOKEN: {"scope": "write", "repos": ["*"], "name": "duck"}}))
    port = free_port()
    srv = ServerProcess(str(tmp_path / "srv"), "--tokens", str(tmp_path / "tokens.json"), "--s3-port", str(port)).start()
    try:
        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="duck",
                     aws_secret_access_key=TOKEN, region_name="us-east-1").create_bucket(Bucket="lake")
        script = textwrap.dedent(f"""
            import duckdb, duckdb_extension_httpfs, glob, os
            ext = glob.glob(os.path.join(os.path.dirname(duckdb_extension_httpfs.__file__), "extensions", "*",
                                         "httpfs.duckdb_extension"))[0]
            con = duckdb.connect()
            con.execute("SET enable_progress_bar = false")  # a slow machine's run draws one on stdout
            con.execute(f"LOAD '{{ext}}'")
            con.execute("CREATE SECRET gw (TYPE s3, KEY_ID 'duck', SECRET '{TOKEN}', REGION 'us-east-1', "
                        "ENDPOINT '127.0.0.1:{port}', URL_STYLE 'path', USE_SSL false)")
            con.execute("CREATE TABLE events AS SELECT range AS id, range % 97 AS k, 'row-' || range AS s "
                        "FROM range(2000000)")
            con.execute("COPY events TO 's3://lake/main/events/part-0.parquet' (FORMAT parquet)")
            print(con.execute("SELECT count(*), sum(id) FROM read_parquet('s3://lake/main/events/part-0.parquet')")
                  .fetchall()[0])
            con.execute("COPY (SELECT * FROM events WHERE k < 10) TO 's3://lake/main@nightly/small/a.parquet' "
                        "(FORMAT parquet)")
            con.execute("COPY (SELECT * FROM events WHERE k >= 90) TO 's3://lake/main@nightly/small/b.parquet' "
                        "(FORMAT parquet)")
            con.execute("COPY (SELECT 1 AS done) TO 's3://lake/main@nightly/small/_SUCCESS' (FORMAT csv)")
        """)
        r = subprocess.run([py, "-c", script], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert str((2_000_000, sum(range(2_000_000)))) in r.stdout.strip().splitlines(), r.stdout[-500:]
        import pyarrow.parquet as pq
        with Store(str(tmp_path / "srv")) as s:
            log = s.log("lake", "main")
            assert [c["message"] for c in log] == ["S3 job main@nightly", "PUT events/part-0.parquet (S3 gateway)",
                                                   "create repo (S3 CreateBucket)"]
            assert {c["author"] for c in log} == {"duck"} and log[0]["files"] == 4
            t = pq.read_table(s.open("cdc://lake/events/part-0.parquet"))
            assert t.num_rows == 2_000_000
            a = pq.read_table(s.open("cdc://lake/small/a.parquet")).column("k").to_pylist()
            assert a and max(a) < 10
    finally:
        srv.stop()

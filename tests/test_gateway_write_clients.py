"""Writes through the S3 gateway by the clients pipelines use, with no cdcstore code on their side:
the AWS CLI (`aws s3 cp`, `aws s3 sync`), pyarrow's `write_dataset` on its S3FileSystem, pandas and
polars `to_parquet`/`write_parquet` to `s3://`, s3fs. Each write is read back and checked row by row;
the dedup test syncs v2 of a Parquet dataset written by plain pyarrow over v1 and compares the new
bytes stored with `cdcstore push` of the same v2 into a store of its own."""
import os
import subprocess
import time

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.storage.repository import LocalStore
from server_util import seeded_gateway
from tool_venvs import aws_cli

WRITER = "writer-" + "w" * 24
TOKENS = {WRITER: {"scope": "write", "repos": ["*"], "name": "pipeline"}}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    srv = seeded_gateway(tmp_path_factory.mktemp("gwclients"), {"README": "datasets\n"}, ["ds", "sync", "jobs"],
                         TOKENS, message="start")
    yield srv
    srv.stop()


def local(gw) -> Store:
    return Store(str(gw.root / "srv"))


def table(n: int, seed: int, start: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(start, start + n)
    return pa.table({"id": ids, "user": pa.array([f"user-{i % 9973:05d}" for i in ids]),
                     "score": rng.random(n), "clicks": rng.integers(0, 1000, n),
                     "day": pa.array((ids // 5000).astype("int32"))})


def aws(gw, *args, timeout=300):
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "pipeline", "AWS_SECRET_ACCESS_KEY": WRITER,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}
    env.pop("AWS_ENDPOINT_URL", None)
    r = subprocess.run([aws_cli(), "--endpoint-url", gw.s3, "s3", *args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr + r.stdout
    return r


def boto(gw):
    return boto3.client("s3", endpoint_url=gw.s3, aws_access_key_id="pipeline", aws_secret_access_key=WRITER,
                        region_name="us-east-1")


def test_aws_cli_cp_a_file_and_a_folder(gw, tmp_path):
    (tmp_path / "one.bin").write_bytes(os.urandom(20 << 20))  # over the CLI's 8 MiB threshold: multipart
    aws(gw, "cp", str(tmp_path / "one.bin"), "s3://ds/main/cli/one.bin")
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    for i in range(5):
        (tmp_path / "tree" / "sub" / f"{i}.txt").write_text(f"file {i}\n")
    aws(gw, "cp", "--recursive", str(tmp_path / "tree"), "s3://ds/main/cli/tree/")
    with local(gw) as s:
        assert s.cat("cdc://ds/cli/one.bin") == (tmp_path / "one.bin").read_bytes()
        assert sorted(e["name"] for e in s.ls("cdc://ds/cli/tree/sub")) == [f"cli/tree/sub/{i}.txt" for i in range(5)]
        ours = [c for c in s.log("ds", "main", limit=20) if "cli/" in c["message"]]
        assert ours and {c["author"] for c in ours} == {"pipeline"}
        assert len(ours) <= 6  # the 5 files the CLI sends at once may land as one group commit
    aws(gw, "rm", "s3://ds/main/cli/one.bin")
    with local(gw) as s:
        assert [e["name"] for e in s.ls("cdc://ds/cli")] == ["cli/tree"]


def _write_v1(folder, files=4, rows=60_000):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        pq.write_table(table(rows, seed=i, start=i * rows), folder / f"part-{i}.parquet")


def _write_v2(folder, rows=60_000):
    """v2: part-1 gets 2,000 rows appended and part-3 has 500 scores changed; the rest unchanged."""
    t1 = pa.concat_tables([table(rows, seed=1, start=rows), table(2000, seed=99, start=10_000_000)])
    pq.write_table(t1, folder / "part-1.parquet")
    t3 = table(rows, seed=3, start=3 * rows)
    scores = t3.column("score").to_numpy().copy()
    scores[20_000:20_500] += 1.0
    pq.write_table(t3.set_column(2, "score", pa.array(scores)), folder / "part-3.parquet")


def test_aws_s3_sync_of_v2_over_v1_stores_only_new_chunks_as_a_push_does(gw, tmp_path):
    data = tmp_path / "data"
    _write_v1(data)
    time.sleep(1.1)  # LastModified is in whole seconds (as S3's): a file written in the second of its upload
    aws(gw, "sync", str(data), "s3://sync/main/events/")  # would look newer than its copy to the next sync
    with local(gw) as s:
        v1 = s.stats()["stored_bytes"]
    _write_v2(data)
    time.sleep(1.1)
    r = aws(gw, "sync", str(data), "s3://sync/main/events/")
    assert r.stdout.count("upload:") == 2  # the two changed files
    with local(gw) as s:
        gateway_new = s.stats()["stored_bytes"] - v1
        for f in sorted(os.listdir(data)):
            assert s.cat(f"cdc://sync/events/{f}") == (data / f).read_bytes()
    # the peer: `cdcstore push` of the same v1 then v2 into a store of its own
    _write_v1(tmp_path / "again")
    LocalStore.init(str(tmp_path / "peer"))
    with Store(str(tmp_path / "peer")) as p:
        p.push([str(tmp_path / "again")], "cdc://sync/events/", message="v1")
        before = p.stats()["stored_bytes"]
        _write_v2(tmp_path / "again")
        p.push([str(tmp_path / "again")], "cdc://sync/events/", message="v2")
        push_new = p.stats()["stored_bytes"] - before
    total = sum(os.path.getsize(data / f) for f in os.listdir(data))
    assert 0 < gateway_new < total / 3, (gateway_new, total)
    assert gateway_new <= 1.1 * push_new, (gateway_new, push_new)


def test_pyarrow_write_dataset_then_read_back(gw):
    from pyarrow import fs as pafs
    import pyarrow.dataset as ds
    s3 = pafs.S3FileSystem(access_key="pipeline", secret_key=WRITER, endpoint_override=gw.hostport, scheme="http",
                           region="us-east-1")
    t = table(50_000, seed=7)
    ds.write_dataset(t, "ds/main/arrow", filesystem=s3, format="parquet", partitioning=["day"],
                     partitioning_flavor="hive", existing_data_behavior="overwrite_or_ignore")
    back = ds.dataset("ds/main/arrow", filesystem=s3, format="parquet", partitioning="hive").to_table()
    assert back.num_rows == 50_000 and sorted(back.column("id").to_pylist()) == list(range(50_000))
    with local(gw) as s:
        names = [e["name"] for e in s.ls("cdc://ds/arrow", recursive=True) if e["type"] == "file"]
        assert len(names) == 10 and all(n.endswith(".parquet") for n in names)


def test_pandas_and_polars_to_parquet_on_s3(gw):
    import pandas as pd
    import polars as pl
    df = table(20_000, seed=11).to_pandas()
    opts = {"key": "pipeline", "secret": WRITER, "client_kwargs": {"endpoint_url": gw.s3, "region_name": "us-east-1"}}
    df.to_parquet("s3://ds/main/frames/pandas.parquet", storage_options=opts)
    back = pd.read_parquet("s3://ds/main/frames/pandas.parquet", storage_options=opts)
    assert back.equals(df)
    popts = {"aws_access_key_id": "pipeline", "aws_secret_access_key": WRITER, "aws_region": "us-east-1",
             "aws_endpoint_url": gw.s3, "aws_allow_http": "true"}
    pdf = pl.from_pandas(df)
    pdf.write_parquet("s3://ds/main/frames/polars.parquet", storage_options=popts)
    assert pl.read_parquet("s3://ds/main/frames/polars.parquet", storage_options=popts).equals(pdf)
    with local(gw) as s:
        assert pq.read_table(s.open("cdc://ds/frames/polars.parquet")).num_rows == 20_000


def test_s3fs_put_pipe_copy_move_and_remove(gw, tmp_path):
    import s3fs
    fs = s3fs.S3FileSystem(key="pipeline", secret=WRITER, endpoint_url=gw.s3, skip_instance_cache=True)
    fs.pipe("ds/main/s3fs/a.txt", b"alpha")
    (tmp_path / "b.bin").write_bytes(os.urandom(3 << 20))
    fs.put(str(tmp_path / "b.bin"), "ds/main/s3fs/b.bin")
    fs.copy("ds/main/s3fs/a.txt", "ds/main/s3fs/c.txt")
    fs.mv("ds/main/s3fs/b.bin", "ds/main/s3fs/moved.bin")
    fs.rm("ds/main/s3fs/a.txt")
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls("ds/main/s3fs")) == ["c.txt", "moved.bin"]
    assert fs.cat("ds/main/s3fs/c.txt") == b"alpha"
    assert fs.cat("ds/main/s3fs/moved.bin") == (tmp_path / "b.bin").read_bytes()


def test_a_job_prefix_lands_many_writes_as_one_commit_on_success(gw, tmp_path):
    """Writes to `BRANCH@JOB/...` are staged (nothing visible); writing `_SUCCESS` under the job,
    as Spark does when a job commits, lands them all as ONE commit."""
    s3 = boto(gw)
    with local(gw) as s:
        before = s.branches("jobs")["main"]
    data = tmp_path / "out"
    _write_v1(data, files=3, rows=10_000)
    aws(gw, "cp", "--recursive", str(data), "s3://jobs/main@nightly-7/out/")
    s3.delete_object(Bucket="jobs", Key="main@nightly-7/README")  # a removal staged in the job too
    with local(gw) as s:
        assert s.branches("jobs")["main"] == before  # nothing visible yet
    s3.put_object(Bucket="jobs", Key="main@nightly-7/out/_SUCCESS", Body=b"")
    with local(gw) as s:
        log = s.log("jobs", "main", limit=2)
        assert log[1]["commit"] == before and log[0]["author"] == "pipeline"
        files = sorted(e["name"] for e in s.ls("cdc://jobs/", recursive=True) if e["type"] == "file")
        assert files == ["out/_SUCCESS"] + [f"out/part-{i}.parquet" for i in range(3)]
        for i in range(3):
            assert s.cat(f"cdc://jobs/out/part-{i}.parquet") == (data / f"part-{i}.parquet").read_bytes()

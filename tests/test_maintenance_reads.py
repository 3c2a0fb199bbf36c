"""Issue 42 item 2: check and gc read each manifest bundle once per run. Before, `check` read a
bundle per manifest (`read(fresh=True)` each time: 2,032 bundle reads for 2,024 manifests at 2,000
files) and gc one per file past a 16-bundle memo (trees walked in hash order). moto behind a
counting proxy; small files in many folders, so each bundle holds files of many trees."""
import secrets

import pytest

from cdcstore import Store
from conftest import S3_BUCKET

FOLDERS, PER = 40, 60  # 2,400 small files: three bundles (1,024 manifests each at most)


@pytest.fixture
def many(counted_bucket, tmp_path):
    _, seen = counted_bucket
    src = tmp_path / "src"
    for d in range(FOLDERS):
        (src / f"d{d:02d}").mkdir(parents=True)
        for f in range(PER):
            (src / f"d{d:02d}" / f"f{f:02d}.txt").write_text(f"folder {d} file {f}\n" * 3)
    url = f"s3://{S3_BUCKET}/maint-{secrets.token_hex(4)}"
    with Store.init(url) as s:
        s.push([str(src)], "cdc://ds/", message="v1")
        (src / "d03" / "f01.txt").write_text("edited\n")
        s.push([str(src)], "cdc://ds/", message="v2")
    return url, seen


def _bundle_gets(seen) -> int:
    return sum(1 for m, p in seen if m == "GET" and "/bundles/" in p)


def _bundles(url) -> int:
    import boto3
    prefix = url.split(f"{S3_BUCKET}/", 1)[1] + "/bundles/"
    return sum(len(page.get("Contents", [])) for page in
               boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=prefix))


@pytest.mark.parametrize("machine", ["same", "new"])
@pytest.mark.parametrize("job", ["check", "gc"])
def test_check_and_gc_read_each_bundle_once(many, tmp_path, monkeypatch, machine, job):
    url, seen = many
    if machine == "new":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))
    n = _bundles(url)
    assert n >= 3
    seen.clear()
    with Store(url) as s:
        if job == "check":
            assert s.check()["problems"] == []
        else:
            s.gc(grace=0)
    assert _bundle_gets(seen) <= n + 1, (_bundle_gets(seen), n)
    with Store(url) as s:  # what gc kept reads back
        assert s.cat("cdc://ds/d03/f01.txt") == b"edited\n"
        assert s.cat("cdc://ds/d39/f59.txt") == b"folder 39 file 59\n" * 3

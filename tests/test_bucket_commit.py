"""A commit to a bucket checks that every chunk it names is stored (the commit point) without
reading back the manifests the same push has just written."""
import os
import secrets

import pytest

from cdcstore.api import Store
from conftest import S3_BUCKET, CountingObjects


@pytest.fixture
def bucket_url(s3_env):
    url = f"s3://{S3_BUCKET}/commit-{secrets.token_hex(4)}"
    Store.init(url).close()
    return url


def test_a_bucket_push_never_reads_back_the_manifests_it_wrote(bucket_url, tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    files = {f"f{i:03d}.bin": os.urandom(3_000 + i) for i in range(40)}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    with Store(bucket_url) as s:
        repo = s.backend.uncached()
        counting = CountingObjects(repo.objects)
        repo.objects = counting
        s.push([str(folder)], "cdc://ds/")
        reads = {k: v for k, v in counting.by_folder.items()
                 if k[1] in ("manifests", "bundles") and k[0] in ("get", "get_range", "stat")}
        assert reads == {}, reads  # before: one ranged read per new manifest (40)
        assert counting.by_folder[("put", "bundles")] == 1  # the 40 manifests in one bundle
        assert counting.by_folder[("put", "manifests")] == 0 and counting.by_folder[("put", "locations")] == 0
    with Store(bucket_url) as fresh:  # what was committed reads back whole
        assert {n: fresh.cat(f"cdc://ds/{n}") for n in files} == files

"""A commit to a bucket checks that every chunk it names is stored (the commit point) without
reading back the manifests the same push has just written."""
import collections
import os
import secrets

import pytest

from cdcstore.api import Store
from conftest import S3_BUCKET


class _Counting:
    """An object store that counts calls by (method, first path segment)."""

    def __init__(self, inner):
        self._inner, self.calls = inner, collections.Counter()

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def counted(*a, **kw):
            if a and isinstance(a[0], str):
                self.calls[(name, a[0].split("/", 1)[0])] += 1
            return attr(*a, **kw)
        return counted


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
        counting = _Counting(repo.objects)
        repo.objects = counting
        s.push([str(folder)], "cdc://ds/")
        reads = {k: v for k, v in counting.calls.items() if k[1] == "manifests" and k[0] in ("get", "get_range", "stat")}
        assert reads == {}, reads  # before: one ranged read per new manifest (40)
        assert counting.calls[("put", "manifests")] == 40
    with Store(bucket_url) as fresh:  # what was committed reads back whole
        assert {n: fresh.cat(f"cdc://ds/{n}") for n in files} == files

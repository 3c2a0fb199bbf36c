"""Issue 31, case 1: a bucket endpoint whose listings hide `branches/` and `tags/` made
`gc --grace 0` count 0 live chunks and delete every pack (2 of 2 runs; the data was gone).

gc now refuses when what it sees contradicts what the store says of itself: a repo that holds
commits has a branch (its last branch is never deleted) unless a delete-repo is under way (whose
tombstone comes first); a ref that a direct read finds; a repo this machine's index records
reach for. The endpoint is a real loopback proxy in front of moto that rewrites list answers."""
import re
import secrets

import pytest

from cdcstore import Store
from cdcstore.core.errors import CdcError
from cdcstore.testing import StallingProxy
from conftest import S3_BUCKET, golden_input

_HIDE = re.compile(rb"<Contents>(?:(?!</Contents>).)*?/(?:branches|tags)/(?:(?!</Contents>).)*?</Contents>"
                   rb"|<CommonPrefixes><Prefix>[^<]*/(?:branches|tags)/</Prefix></CommonPrefixes>", re.S)


def _hide_refs(method: str, path: str, data: bytes) -> bytes:
    if method == "GET" and "list-type=2" in path:
        return _HIDE.sub(b"", data)
    return data


@pytest.fixture
def lying(s3_endpoint, s3_env, tmp_path, monkeypatch):
    """A store with two repos pushed through the proxy (telling the truth), then the proxy made
    to hide refs from listings; yields (url, proxy, files)."""
    proxy = StallingProxy(s3_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine"))
    url = f"s3://{S3_BUCKET}/store-{secrets.token_hex(4)}"
    files = {"a": golden_input(1_500_000), "b": golden_input(700_000)[::-1]}
    with Store.init(url) as s:
        for repo, data in files.items():
            src = tmp_path / repo
            src.mkdir()
            (src / "f.bin").write_bytes(data)
            s.push([str(src)], f"cdc://{repo}/")
        s.tag("a", "v1")
    proxy.rewrite = _hide_refs
    yield url, proxy, files
    proxy.close()


def _objects(endpoint: str, url: str) -> set[str]:
    """Every key under the store's prefix, listed from moto itself (not through the proxy)."""
    import boto3
    prefix = url.split("/", 3)[3] + "/"
    s3 = boto3.client("s3", endpoint_url=endpoint)
    return {o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=prefix)
            for o in page.get("Contents", [])}


def test_gc_refuses_a_listing_that_hides_refs_and_deletes_nothing(lying, s3_endpoint, tmp_path, monkeypatch):
    url, proxy, files = lying
    before = _objects(s3_endpoint, url)
    assert any("/packs/" in k for k in before) and any("/branches/" in k for k in before)
    for machine in ("machine", "fresh-machine"):  # with this machine's index, and with none
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / machine))
        with Store(url) as s:
            with pytest.raises(CdcError, match="listing") as e:
                s.gc(grace=0)
            assert "gc deleted nothing" in str(e.value)
    assert {k for k in _objects(s3_endpoint, url) if "/packs/" in k} == {k for k in before if "/packs/" in k}
    proxy.rewrite = lambda method, path, data: data  # the endpoint tells the truth again
    with Store(url) as s:
        for repo, data in files.items():
            assert s.cat(f"cdc://{repo}/f.bin") == data
        assert s.cat("cdc://a@v1/f.bin") == files["a"]
        assert s.check(read_data=True)["problems"] == []
        assert s.gc(grace=0)["deleted"]  # a truthful gc runs


def test_a_repo_deleted_mid_way_is_not_a_contradiction(lying, tmp_path, monkeypatch):
    """delete-repo writes its tombstone, then deletes refs, then commits: a gc that finds commits
    without refs under a tombstone goes on (a killed delete-repo must not block gc forever)."""
    url, proxy, files = lying
    proxy.rewrite = lambda method, path, data: data
    with Store(url) as s:
        s.delete_repo("b")
        r = s.gc(grace=0)
        assert r["deleted"]
        assert s.cat("cdc://a/f.bin") == files["a"]

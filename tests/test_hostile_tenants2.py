"""Issue 19, "Leaks across tenants": what a scoped token can learn, read, write and hold up
on a shared server (docs/protocol.md "Trust model"); each sentence there has a test here."""
import json
import os
import urllib.error
import urllib.request

import pytest

from cdcstore import ConflictError, Store
from cdcstore.core.commit import Commit
from cdcstore.remote import wire
from cdcstore.storage.repository import LocalStore
from conftest import served_store

ID32 = {"X-Cdc-Id-Bytes": "32"}
TOKENS = {"tok-a": {"scope": "write", "repos": ["a"]}, "tok-b": {"scope": "write", "repos": ["b"]},
          "tok-a-read": {"scope": "read", "repos": ["a"]}, "tok-all": {"scope": "write", "repos": ["*"]},
          "tok-admin": {"scope": "admin", "repos": ["*"]}}


def _call(url, token, method="GET", data=None, headers=None):
    """(status, body) of one raw request."""
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def tenants(tmp_path):
    with served_store(tmp_path, TOKENS) as srv:
        yield srv


def _tree(tmp_path, name: str, files: dict[str, bytes]) -> str:
    d = tmp_path / name
    d.mkdir()
    for n, data in files.items():
        (d / n).write_bytes(data)
    return str(d)


def test_a_commit_that_loses_the_compare_and_swap_race_grants_nothing(store, tmp_path, monkeypatch):
    """The variant: the branch moves between the commit's read of it and its conditional put,
    and the rebase that follows is refused (same path). Nothing may be granted to repo `a`."""
    secret = os.urandom(40_000)
    store.push([_tree(tmp_path, "b", {"secret.bin": secret})], "cdc://b/")
    store.push([_tree(tmp_path, "a", {"x.bin": b"a's first x"})], "cdc://a/")
    be = LocalStore(store.location)
    head_b = be.get_commit("b", be.resolve("b", "main"))
    secret_ids = set(be.get_manifest(head_b.files["secret.bin"].manifest).chunk_ids)
    head_a = be.resolve("a", "main")
    hostile = Commit("a", head_a, "", 0.0, {"x.bin": head_b.files["secret.bin"]})
    real = be.objects.put_if_match

    def racing(name, data, token):  # another writer changes x.bin first
        if name.endswith("branches/main") and "/a/" in name:
            Store(store.location).push([_tree(tmp_path, "a2", {"x.bin": b"another x"})], "cdc://a/")
        return real(name, data, token)
    monkeypatch.setattr(be.objects, "put_if_match", racing)
    with pytest.raises(ConflictError):
        be.commit(hostile, "main", head_a)
    assert not be.index.reached(secret_ids, ["a"], None)
    assert not be.index.reaches("a", "manifest", head_b.files["secret.bin"].manifest)

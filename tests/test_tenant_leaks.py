"""Issue 19, "Leaks across tenants": what a scoped token can learn, read, write and hold up
on a shared server (docs/protocol.md "Trust model"); each sentence there has a test here."""
import json
import os

import pytest

from cdcstore import ConflictError, Store
from cdcstore.core.commit import Commit
from cdcstore.core import wire
from cdcstore.storage.access import AccessRecords
from cdcstore.storage.repository import LocalStore
from conftest import raw_call as _call

ID32 = {"X-Cdc-Id-Bytes": "32"}
TOKENS = {"tok-a": {"scope": "write", "repos": ["a"]}, "tok-b": {"scope": "write", "repos": ["b"]},
          "tok-a-read": {"scope": "read", "repos": ["a"]}, "tok-all": {"scope": "write", "repos": ["*"]},
          "tok-admin": {"scope": "admin", "repos": ["*"]}}




pytestmark = pytest.mark.served(tokens=TOKENS)  # the `server` of every test here


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
        AccessRecords(be).commit(hostile, "main", head_a)  # the server's commit, with its grants
    assert not be.index.reached(secret_ids, ["a"], None)
    assert not be.index.reaches("a", "manifest", head_b.files["secret.bin"].manifest)


def test_a_prove_query_answers_every_unseen_id_alike(server, tmp_path):
    """Learn: with or without X-Cdc-Prove, a scoped token's presence answer for an id it may not
    see is the same whether another tenant stored that chunk or nobody did; a proof answers 0 for
    both."""
    secret = os.urandom(30_000)
    with Store(server.url, token="tok-b", cache=False) as sb:
        sb.push([_tree(tmp_path, "b", {"secret.bin": secret})], "cdc://b/")
    srv = LocalStore(server.store)
    head = srv.get_commit("b", srv.resolve("b", "main"))
    secret_ids = srv.get_manifest(head.files["secret.bin"].manifest).chunk_ids
    candidates = [os.urandom(32) for _ in range(2000)]
    candidates[700:700] = secret_ids  # the secret hides among random guesses
    api = server.url + "/v1"
    body = b"".join(candidates)
    status, plain = _call(api + "/chunks/query", "tok-a", "POST", body, ID32)
    assert status == 200 and plain == bytes(len(candidates))
    status, answer = _call(api + "/chunks/query", "tok-a", "POST", body, {wire.PROVE_HEADER: "1"} | ID32)
    assert (status, answer) == (200, plain), "the flags single out B's chunks"
    nonce = bytes(wire.NONCE)
    forged = wire.encode_proofs(nonce, [(c, bytes(16)) for c in candidates[:4096]])
    assert _call(api + "/chunks/prove", "tok-a", "POST", forged, ID32) == (200, bytes(len(candidates[:4096])))
    # a tenant that holds the bytes uploads them like new data (proofs answer 0 to a scoped token:
    # tests/test_presence_oracle.py); both pushes succeed and read back
    with Store(server.url, token="tok-a", cache=False) as sa:
        r = sa.push([_tree(tmp_path, "a", {"copy.bin": secret, "new.bin": os.urandom(20_000)})], "cdc://a/")
        assert sa.counters()["proven_chunks"] == 0 and r.new_bytes >= 20_000 + len(secret)
        assert sa.cat("cdc://a/copy.bin") == secret


def test_a_reused_repo_name_starts_with_nothing(server, tmp_path):
    """Hold/read: after delete-repo, a token for a new repo of the same name sees neither the
    old repo's totals nor its chunks (no grant survives the repo)."""
    old = os.urandom(60_000)
    with Store(server.url, token="tok-all", cache=False) as s:
        s.push([_tree(tmp_path, "old", {"old.bin": old})], "cdc://a/")
    srv = LocalStore(server.store)
    head = srv.get_commit("a", srv.resolve("a", "main"))
    old_ids = srv.get_manifest(head.files["old.bin"].manifest).chunk_ids
    (old_pack,) = {p for p, _ in srv.locate(old_ids).values()}
    api = server.url + "/v1"
    assert json.loads(_call(api + "/stats", "tok-a")[1])["chunks"] == len(set(old_ids))  # a reaches them now
    status, _ = _call(api + "/admin/delete-repo", "tok-admin", "POST", json.dumps({"repo": "a"}).encode(),
                      {"Content-Type": "application/json"})
    assert status == 200
    with Store(server.url, token="tok-a", cache=False) as sa:  # a new tenant reuses the name
        sa.push([_tree(tmp_path, "new", {"new.bin": b"the new a"})], "cdc://a/")
    stats = json.loads(_call(api + "/stats", "tok-a")[1])
    assert stats["chunks"] == 1 and stats["chunk_raw_bytes"] == len(b"the new a")
    size = os.path.getsize(srv.packs.pack_path(old_pack))
    status, body = _call(f"{api}/repos/a/packs/{old_pack}", "tok-a", headers={"Range": f"bytes=0-{size - 1}"})
    assert status == 404 and old[:1000] not in body
    assert _call(api + "/chunks/query", "tok-a", "POST", b"".join(old_ids), ID32) == (200, bytes(len(old_ids)))
    assert _call(api + "/repos/a/locate", "tok-a", "POST", b"".join(old_ids), ID32) == (200, b"")


def test_another_replica_drops_a_deleted_repos_reach(s3_env, tmp_path):
    """Over a bucket, a delete-repo through one replica leaves a tombstone; every other replica
    drops the repo's records when it sees it (its maintenance round), even if the name is reused."""
    import secrets
    from cdcstore.storage.repository import Repository, open_repository
    from conftest import S3_BUCKET
    url = f"s3://{S3_BUCKET}/store-{secrets.token_hex(4)}"
    Store.init(url).close()
    with Store(url) as s:
        s.push([_tree(tmp_path, "old", {"old.bin": os.urandom(30_000)})], "cdc://a/")
    one = open_repository(url)
    two = Repository(one.objects, str(tmp_path / "replica-two.sqlite"), url)
    access = AccessRecords(two)
    access.refresh("a")
    head = two.get_commit("a", two.resolve("a", "main"))
    old_ids = set(two.get_manifest(head.files["old.bin"].manifest).chunk_ids)
    assert two.index.reached(old_ids, ["a"], None) == old_ids
    one.ref_store.delete_repo("a")
    with Store(url) as s:
        s.push([_tree(tmp_path, "new", {"new.bin": b"the new a"})], "cdc://a/")  # the name is taken again
    assert access.drop_deleted() == ["a"]
    assert not two.index.reached(old_ids, ["a"], None)
    assert access.drop_deleted() == []  # a tombstone is acted on once


def test_what_remains_visible_and_what_a_token_is_refused(server, tmp_path):
    """Learn: GET /v1/repos lists only the token's repos; another repo's refs are 403; a read
    token cannot query presence; HEAD of a pack name (a hash of the pack's bytes) answers for
    any write token, as the trust model says."""
    with Store(server.url, token="tok-b", cache=False) as sb:
        sb.push([_tree(tmp_path, "b", {"s.bin": os.urandom(20_000)})], "cdc://b/")
    with Store(server.url, token="tok-a", cache=False) as sa:
        sa.push([_tree(tmp_path, "a", {"x.bin": b"x"})], "cdc://a/")
    api = server.url + "/v1"
    status, body = _call(api + "/repos", "tok-a")
    assert status == 200 and "b" not in json.loads(body)["repos"] and "a" in json.loads(body)["repos"]
    assert _call(api + "/repos/b/branches", "tok-a")[0] == 403
    assert _call(api + "/repos/b/branches", "tok-a-read")[0] == 403
    assert _call(api + "/chunks/query", "tok-a-read", "POST", bytes(32), ID32)[0] == 403
    srv = LocalStore(server.store)
    b_pack = {p for p, _ in srv.locate(srv.get_manifest(
        srv.get_commit("b", srv.resolve("b", "main")).files["s.bin"].manifest).chunk_ids).values()}.pop()
    assert _call(f"{api}/packs/{b_pack}", "tok-a", "HEAD")[0] == 200
    assert _call(f"{api}/packs/{'0' * 64}", "tok-a", "HEAD")[0] == 404


def test_every_rule_of_the_trust_model_names_a_test_that_exists():
    """docs/protocol.md's trust model: each rule names its test; each named test exists."""
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    doc = open(os.path.join(root, "docs", "protocol.md")).read()
    section = doc[doc.index("### Trust model"):doc.index("## Endpoints")]
    files = {"T2": "test_tenant_leaks.py", "T": "test_tenants.py", "R": "test_replicas.py",
             "G": "test_gc_remote.py", "H": "test_hostile.py"}
    named = re.findall(r"`(T2|T|R|G|H)::(test_\w+)`", section)
    assert len(named) >= 15
    for key, name in named:
        assert f"def {name}(" in open(os.path.join(root, "tests", files[key])).read(), (key, name)
    for heading in ("**learn**", "**read**", "**write**", "**hold up**"):
        assert heading in section

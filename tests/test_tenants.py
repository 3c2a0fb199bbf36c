"""Tenant isolation on a shared store: what a repo's grants may reach."""
import pytest

from cdcstore import ConflictError
from cdcstore.core.commit import Commit
from cdcstore.storage.access import AccessRecords

ID32 = {"X-Cdc-Id-Bytes": "32"}  # requests about 32-byte (BLAKE3) chunk ids


def test_refused_commit_grants_nothing(store, tmp_path):
    """A commit refused by the compare-and-swap must not record any reach for its repo."""
    src = tmp_path / "b"
    src.mkdir()
    (src / "secret.bin").write_bytes(b"B's secret " * 1000)
    store.push([str(src)], "cdc://b/")
    be = LocalStore(store.location)
    commit_b = be.get_commit("b", be.resolve("b", "main"))
    names = {f.manifest for f in commit_b.files.values()}
    be.ref_store.ensure_repo("a")
    access = AccessRecords(be)  # the server's records: a local commit keeps none
    access.refresh("b")
    hostile = Commit("a", None, "", 0.0, commit_b.files)
    with pytest.raises(ConflictError):
        access.commit(hostile, "main", "0" * 32)
    assert not any(be.index.reaches("a", "manifest", n) for n in names)
    packs = {p for p, _ in be.index.locate(
        {c for n in names for c in be.get_manifest(n).chunk_ids}).values()}
    assert packs and not any(be.index.reaches("a", "pack", p) for p in packs)
    chunks = {c for n in names for c in be.get_manifest(n).chunk_ids}
    assert be.index.visible(chunks, ["b"], None) == chunks and not be.index.visible(chunks, ["a"], None)


@pytest.mark.parametrize("parent", ["../../x", "..", "commits", "zz" * 16, "0" * 32, "garbage"])
def test_commit_parent_must_be_a_commit_id_of_this_repo(server, parent):
    """A parent is never used as a path: folders, traversal and garbage give one 400, no 500 or oracle."""
    import json
    import urllib.error
    import urllib.request
    # raw JSON: Commit.encode refuses such a parent, a hostile client does not
    body = json.dumps({"format": 1, "repo": "r", "parent": parent, "message": "", "time": 0.0, "files": {}})
    req = urllib.request.Request(server.url + "/v1/repos/r/commits", method="POST",
                                 data=json.dumps({"commit": body, "branch": "main", "expected": None}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    text = e.value.read().decode()
    assert server.store not in text and "parent" in text


def test_error_bodies_hide_server_paths_and_other_repos(server, tmp_path):
    """A 404 for an unknown repo names neither the store's folder nor the repos of other tenants."""
    import urllib.error
    import urllib.request
    from cdcstore import Store
    src = tmp_path / "b"
    src.mkdir()
    (src / "x.txt").write_bytes(b"x")
    Store(server.store).push([str(src)], "cdc://tenant-b-secret-name/")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + "/v1/repos/nope/branches", timeout=10)
    text = e.value.read().decode()
    assert e.value.code == 404 and "nope" in text
    assert str(tmp_path) not in text and "tenant-b-secret-name" not in text


def test_locate_through_another_repo_reveals_nothing(server, tmp_path):
    """Repo A's locate answers nothing about a chunk that only repo B reaches."""
    import urllib.request
    from cdcstore import Store
    for repo, data in (("b", b"B's secret " * 1000), ("a", b"A's own data")):
        src = tmp_path / repo
        src.mkdir()
        (src / "f.bin").write_bytes(data)
        Store(server.store).push([str(src)], f"cdc://{repo}/")
    be = LocalStore(server.store)
    b = be.get_commit("b", be.resolve("b", "main"))
    chunk = be.get_manifest(b.files["f.bin"].manifest).chunk_ids[0]

    def locate(repo):
        req = urllib.request.Request(f"{server.url}/v1/repos/{repo}/locate", data=chunk, method="POST",
                                     headers={"X-Cdc-Id-Bytes": "32"})
        return urllib.request.urlopen(req, timeout=10).read()
    assert chunk in locate("b") and chunk not in locate("a")


# -- the attack of issue 8 against a real server with tokens ------------------------------------
import json  # noqa: E402
import os  # noqa: E402

from cdcstore import Store  # noqa: E402
from cdcstore.storage.repository import LocalStore  # noqa: E402
from conftest import raw_call as _call  # noqa: E402
from server_util import ServerProcess  # noqa: E402

TOKENS = {"tok-a": {"scope": "write", "repos": ["a"]}, "tok-b": {"scope": "write", "repos": ["b"]},
          "tok-admin": {"scope": "write", "repos": ["*"]}}




@pytest.mark.served(tokens=TOKENS)
def test_a_token_for_repo_a_learns_and_reads_nothing_of_repo_b(server, tmp_path):
    url, api = server.url, server.url + "/v1"
    public, secret = os.urandom(300_000), os.urandom(300_000)
    src = tmp_path / "b"
    src.mkdir()
    (src / "public.bin").write_bytes(public)
    (src / "secret.bin").write_bytes(secret)
    with Store(url, token="tok-b", cache=False) as sb:
        sb.push([str(src)], "cdc://b/")
    srv = LocalStore(server.store)
    head_b = srv.get_commit("b", srv.resolve("b", "main"))
    pub_name = head_b.files["public.bin"].manifest
    pub_ids = srv.get_manifest(pub_name).chunk_ids
    secret_ids = srv.get_manifest(head_b.files["secret.bin"].manifest).chunk_ids
    (b_pack,) = {p for p, _ in srv.locate(pub_ids + secret_ids).values()}
    # the attacker knows public.bin: same bytes, same chunks, same manifest (its name included)
    scratch = Store.init(str(tmp_path / "scratch"))
    scratch.push([str(src / "public.bin")], "cdc://x/public.bin")
    assert scratch.manifest("x", pub_name).chunk_ids == pub_ids
    manifest_bytes = open(LocalStore(scratch.location).manifest_path(pub_name), "rb").read()
    ids_body = b"".join(pub_ids)

    status, body = _call(api + "/chunks/query", "tok-a", "POST", ids_body, ID32)
    assert status == 200 and body == bytes(len(pub_ids)), "presence reveals B's chunks"
    assert _call(api + "/repos/a/locate", "tok-a", "POST", ids_body, ID32) == (200, b"")
    from cdcstore.core.wire import encode_blobs
    status, body = _call(api + "/manifests", "tok-a", "POST", encode_blobs([manifest_bytes]))
    assert status == 403, body
    commit = {"format": 1, "repo": "a", "parent": None, "message": "", "time": 1.0,
              "files": {"stolen.bin": {"manifest": pub_name, "size": len(public)}}}
    for expected in (None, "0" * 32):  # landing or refused by the compare-and-swap: both refused
        status, body = _call(api + "/repos/a/commits", "tok-a", "POST",
                             json.dumps({"commit": json.dumps(commit), "branch": "main",
                                         "expected": expected}).encode())
        assert status in (403, 404), body
    assert not srv.has_repo("a") or "stolen.bin" not in srv.get_commit("a", srv.resolve("a", "main")).files
    pack_size = os.path.getsize(srv.packs.pack_path(b_pack))
    status, _ = _call(f"{api}/repos/a/packs/{b_pack}", "tok-a", headers={"Range": f"bytes=0-{pack_size - 1}"})
    assert status in (403, 404)
    status, body = _call(api + "/stats", "tok-a")
    assert status == 200 and json.loads(body)["chunks"] == 0

    # proofs (issue 31 case 2): a scoped token learns nothing from them, a right proof included
    from cdcstore.core import wire
    status, body = _call(api + "/chunks/query", "tok-a", "POST", ids_body, {wire.PROVE_HEADER: "1"} | ID32)
    assert (status, body) == (200, bytes(len(pub_ids)))
    nonce = bytes(wire.NONCE)
    right = wire.encode_proofs(nonce, [(c, wire.chunk_proof(public[:10], nonce)) for c in pub_ids])
    assert _call(api + "/chunks/prove", "tok-a", "POST", right, ID32) == (200, bytes(len(pub_ids)))
    assert _call(api + "/repos/a/locate", "tok-a", "POST", ids_body, ID32) == (200, b"")

    # A holds public.bin itself: it uploads it (the price of no presence oracle), commits, reads
    with Store(url, token="tok-a", cache=False) as sa:
        r = sa.push([str(src / "public.bin")], "cdc://a/public.bin")
        assert sa.counters()["proven_chunks"] == 0 and r.sent_bytes >= len(public) // 2
        assert sa.cat("cdc://a/public.bin") == public
    # B's pack, read through repo a, shows public.bin's chunks and zeros elsewhere
    status, body = _call(f"{api}/repos/a/packs/{b_pack}", "tok-a", headers={"Range": f"bytes=0-{pack_size - 1}"})
    assert status == 206 and len(body) == pack_size
    for cid, (pack, e) in srv.locate(secret_ids).items():
        assert pack == b_pack and body[e.offset:e.offset + e.stored_len] == bytes(e.stored_len)
    assert secret[:4096] not in body and secret[-4096:] not in body
    status, body = _call(f"{api}/repos/a/packs/{b_pack}", "tok-a")  # no range: refused, never the file
    assert status == 416
    # B still reads everything; each chunk is indexed once
    with Store(url, token="tok-b", cache=False) as sb:
        assert sb.cat("cdc://b/secret.bin") == secret
    assert srv.totals()["chunks"] == len(set(pub_ids) | set(secret_ids))


def test_index_from_before_chunk_reach_is_regranted_at_server_start(tmp_path):
    """A store indexed before schema 2 (no repo_chunks) is regranted from its commits when served."""
    import sqlite3
    root = str(tmp_path / "srv")
    s = Store.init(root)
    src = tmp_path / "d"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(50_000))
    s.push([str(src)], "cdc://a/")
    s.close()
    conn = sqlite3.connect(os.path.join(root, "index.sqlite"))
    conn.execute("DROP TABLE repo_chunks")
    conn.execute("DROP TABLE token_chunks")
    conn.commit()
    conn.close()
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    srv = ServerProcess(root, "--tokens", str(tokens)).start()
    try:
        with Store(srv.url, token="tok-a", cache=False) as sa:
            assert sa.cat("cdc://a/f.bin") == (src / "f.bin").read_bytes()
    finally:
        srv.stop()


@pytest.mark.served(tokens=TOKENS)
def test_scoped_endpoints_answer_garbage_with_4xx(server, tmp_path):
    """Proofs, masked pack ranges and scoped queries under garbage: 4xx, never 5xx, never foreign bytes."""
    src = tmp_path / "b"
    src.mkdir()
    secret = os.urandom(200_000)
    (src / "s.bin").write_bytes(secret)
    with Store(server.url, token="tok-b", cache=False) as sb:
        sb.push([str(src)], "cdc://b/")
    srv = LocalStore(server.store)
    (pack,) = srv.index.packs()
    api = server.url + "/v1"
    answers = []
    for body in (b"", b"x", bytes(15), bytes(16), bytes(16 + 47), bytes(16 + 48 * 5000), os.urandom(16 + 48 * 3)):
        answers.append(_call(api + "/chunks/prove", "tok-a", "POST", body, ID32))
        answers.append(_call(api + "/chunks/query", "tok-a", "POST", body, {"X-Cdc-Prove": "1"} | ID32))
        answers.append(_call(api + "/chunks/query", "tok-a", "POST", body, {"X-Cdc-Id-Bytes": "7"}))
    for rng in ("bytes=0-0", "bytes=-100", "bytes=100-", "bytes=5-1", "bytes=0-99999999999", "bytes=a-b",
                "bytes=0-1,5-9", "items=0-1", "bytes=0-" + "9" * 40, ""):
        for repo in ("a", "b"):
            answers.append(_call(f"{api}/repos/{repo}/packs/{pack}", "tok-a", headers={"Range": rng}))
    assert all(status < 500 for status, _ in answers), [a for a in answers if a[0] >= 500][:3]
    assert all(secret[:1000] not in body and secret[-1000:] not in body for _, body in answers)

"""Revisions that stay pinned: commits and tags are immutable, names never look like
commit ids, an ambiguous revision is an error; locally and over a real server."""
import http.client
import json
import os

import pytest

from cdcstore import AccessDeniedError, InvalidAddressError, RevisionNotFoundError, Store
from cdcstore.core.commit import Commit
from cdcstore.core.errors import CdcError, RefExistsError
from cdcstore.fs import CdcFileSystem
from cdcstore.storage.repository import LocalStore
from server_util import ServerProcess
import forker

IMMUTABLE = "a commit is immutable: push to a branch"


@pytest.fixture(params=["local", "http"])
def location(request, tmp_path):
    """A store location: a local directory, or a real server's URL (the `server` fixture's)."""
    if request.param == "http":
        return request.getfixturevalue("server").url
    LocalStore.init(str(tmp_path / "srv"))
    return str(tmp_path / "srv")


def _file(tmp_path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def test_push_to_a_commit_prefix_is_refused_and_creates_no_branch(location, tmp_path):
    with Store(location) as s:
        v1 = s.push(_file(tmp_path, "a", b"v1"), "cdc://r/x").commit
        for rev in (v1, v1[:4], v1[:9], "abcd", "DEADBEEF"):
            with pytest.raises(CdcError, match=IMMUTABLE):
                s.push(_file(tmp_path, "b", b"other"), f"cdc://r@{rev}/x")
            with pytest.raises(CdcError, match=IMMUTABLE):
                s.commit_files("r", rev, [(str(tmp_path / "b"), "x")])
        assert s.branches("r") == {"main": v1}
        assert s.cat(f"cdc://r@{v1[:4]}/x") == b"v1"


def test_fs_writes_to_a_commit_are_refused(location, tmp_path):
    with Store(location) as s:
        v1 = s.push(_file(tmp_path, "a", b"v1"), "cdc://r/x").commit
    fs = CdcFileSystem(store=location)
    for rev in (v1, v1[:6]):
        with pytest.raises(CdcError, match=IMMUTABLE):
            fs.pipe(f"cdc://r@{rev}/x", b"hijack")
        with pytest.raises(CdcError, match=IMMUTABLE):
            fs.open(f"cdc://r@{rev}/y", "wb")
    with Store(location) as s:
        assert s.branches("r") == {"main": v1}
        assert s.cat(f"cdc://r@{v1}/x") == b"v1"


@pytest.mark.parametrize("name", ["abcd", "deadbeef", "0123456789", "ABCDEF"])
def test_branch_and_tag_names_that_look_like_commit_ids_are_refused(location, tmp_path, name):
    with Store(location) as s:
        s.push(_file(tmp_path, "a", b"v1"), "cdc://r/x")
        with pytest.raises(InvalidAddressError, match="hex digits name a commit"):
            s.create_branch("r", name)
        with pytest.raises(InvalidAddressError, match="hex digits name a commit"):
            s.tag("r", name)
        assert list(s.branches("r")) == ["main"] and s.tags("r") == {}
    if not location.startswith("http"):  # the store refuses it too, below the API
        be = LocalStore(location)
        cid = be.resolve("r", "main")
        with pytest.raises(InvalidAddressError):
            be.create_branch("r", name, cid)
        with pytest.raises(InvalidAddressError, match=IMMUTABLE):
            be.ref_store.update_branch("r", name, None, cid)


def test_tags_are_immutable_named_revisions(location, tmp_path):
    with Store(location) as s:
        v1 = s.push(_file(tmp_path, "a", b"version one"), "cdc://r/x").commit
        assert s.tag("r", "v1") == v1
        assert s.tags("r") == {"v1": v1}
        with pytest.raises(RefExistsError, match="already exists"):
            s.tag("r", "v1")  # never moved, even to the same commit
        with pytest.raises(CdcError, match="a tag is immutable"):
            s.push(_file(tmp_path, "b", b"other"), "cdc://r@v1/x")
        v2 = s.push(_file(tmp_path, "b", b"version two"), "cdc://r/x").commit
        assert s.cat("cdc://r@v1/x") == b"version one" and s.cat("cdc://r/x") == b"version two"
        assert s.tags("r") == {"v1": v1} and s.branches("r") == {"main": v2}
        assert s.tag("r", "v2", v2[:8]) == v2
        assert s.delete_tag("r", "v1") == v1
        assert s.tags("r") == {"v2": v2}
        with pytest.raises(RevisionNotFoundError):
            s.delete_tag("r", "v1")
        with pytest.raises(RevisionNotFoundError):
            s.cat("cdc://r@v1/x")


def test_branches_create_delete_and_names_shared_with_tags(location, tmp_path):
    with Store(location) as s:
        v1 = s.push(_file(tmp_path, "a", b"v1"), "cdc://r/x").commit
        assert s.create_branch("r", "dev") == v1
        with pytest.raises(RefExistsError):
            s.create_branch("r", "dev")
        s.tag("r", "rel")
        with pytest.raises(RefExistsError, match="tag 'rel' already exists"):
            s.create_branch("r", "rel")
        with pytest.raises(RefExistsError, match="branch 'dev' already exists"):
            s.tag("r", "dev")
        assert s.branches("r") == {"dev": v1, "main": v1}
        assert s.delete_branch("r", "dev") == v1
        with pytest.raises(CdcError, match="only branch"):
            s.delete_branch("r", "main", force=True)
        assert s.branches("r") == {"main": v1}


def test_a_name_that_is_both_branch_and_tag_is_ambiguous(tmp_path):
    """Only a hand-edited or old store can hold both; reads refuse to guess."""
    s = Store.init(str(tmp_path / "s"))
    v1 = s.push(_file(tmp_path, "a", b"v1"), "cdc://r/x").commit
    s.create_branch("r", "dev")
    tags = tmp_path / "s" / "repos" / "r" / "tags"
    tags.mkdir()
    (tags / "dev").write_text(v1 + "\n")
    with pytest.raises(RevisionNotFoundError, match="ambiguous.*both a branch and a tag"):
        s.cat("cdc://r@dev/x")


def test_an_ambiguous_commit_prefix_is_an_error_naming_the_count(tmp_path):
    s = Store.init(str(tmp_path / "s"))
    s.push(_file(tmp_path, "a", b"v1"), "cdc://r/x")
    be = LocalStore(s.location)
    seen: dict[str, Commit] = {}
    for i in range(100_000):  # two commits whose ids share 4 hex digits (birthday: ~300 tries)
        c = Commit("r", None, f"m{i}", 0.0, {})
        if c.id[:4] in seen:
            break
        seen[c.id[:4]] = c
    first, second = seen[c.id[:4]], c
    be.put_commit(first)
    be.put_commit(second)
    prefix = c.id[:4]
    with pytest.raises(RevisionNotFoundError, match=r"ambiguous.*\(2 commits match\)"):
        s.ls(f"cdc://r@{prefix}/")
    longer = second.id[:len(os.path.commonprefix([first.id, second.id])) + 1]
    assert s.resolve(f"cdc://r@{longer}/")[0] == second.id
    with pytest.raises(RevisionNotFoundError, match="no commit"):
        s.ls("cdc://r@ffff0000ffff/")


def test_log_limit(location, tmp_path):
    with Store(location) as s:
        for i in range(3):
            s.push(_file(tmp_path, "a", f"v{i}".encode()), "cdc://r/x", message=f"m{i}")
        assert [e["message"] for e in s.log("r", limit=1)] == ["m2"]
        assert [e["message"] for e in s.log("r")] == ["m2", "m1", "m0"]
        assert s.log("r", limit=0) == []


def test_a_cold_cache_gets_exactly_the_pinned_commit(tmp_path):
    """A stale branch head cached under a commit-like name is never served for an id;
    a tag is cached for good (no request on the second resolve)."""
    LocalStore.init(str(tmp_path / "srv"))
    srv = ServerProcess(str(tmp_path / "srv")).start()
    try:
        with Store(srv.url, cache=False) as w:
            v1 = w.push(_file(tmp_path, "a", b"pinned bytes"), "cdc://r/x").commit
            v2 = w.push(_file(tmp_path, "b", b"later bytes"), "cdc://r/x").commit
            w.tag("r", "rel", v1)
        cache_path = str(tmp_path / "cache.sqlite")
        with Store(srv.url, cache=cache_path) as r:
            r.resolve_ref("r", "main")  # the store's id is heard: the heads' key is the store's
            key = r.backend._heads_key("r")
            for rev in (v1, v1[:6]):  # a poisoned head, as an old client pushing to @<id> left
                r.cache.put_head(key, rev, v2)
            assert r.cat(f"cdc://r@{v1[:6]}/x") == b"pinned bytes"
            assert r.cat(f"cdc://r@{v1}/x") == b"pinned bytes"
            assert r.cat("cdc://r@rel/x") == b"pinned bytes"
            before = r.counters()["requests"]
            assert r.resolve_ref("r", "rel")[0] == v1
            assert r.counters()["requests"] == before
            assert r.resolve_ref("r", "main")[0] == v2
            with Store(srv.url, cache=False) as w:
                v3 = w.push(_file(tmp_path, "c", b"third"), "cdc://r/x").commit
            assert r.resolve_ref("r", "main")[0] == v3  # a write through this process: seen at once (meta.py)
            assert r.tag("r", "fresh") == v3  # but a tag names the head the server has now
            assert r.create_branch("r", "exp") == v3
    finally:
        srv.stop()


# -- over HTTP: scopes and status codes ---------------------------------------------------------

SCOPED_TOKENS = {"w-a": {"scope": "write", "repos": ["a"]}, "r-a": {"scope": "read", "repos": ["a"]},
                 "w-b": {"scope": "write", "repos": ["b"]}}


def _http(port: int, method: str, path: str, token: str | None, body=None) -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    c.request(method, path, body=data, headers={"Authorization": f"Bearer {token}"} if token else {})
    r = c.getresponse()
    raw = r.read()
    return r.status, json.loads(raw) if raw else {}


@pytest.mark.served(tokens=SCOPED_TOKENS)
def test_tag_and_branch_scopes_over_http(server, tmp_path):
    with Store(server.url, token="w-a") as s:
        v1 = s.push(_file(tmp_path, "a", b"v1"), "cdc://a/x").commit
    with Store(server.url, token="w-b") as s:
        s.push(_file(tmp_path, "a", b"v1"), "cdc://b/x")
    port = server.port
    writes = [("POST", "/v1/repos/a/tags", {"name": "t", "commit": v1}),
              ("POST", "/v1/repos/a/branches", {"name": "dev", "commit": v1}),
              ("DELETE", "/v1/repos/a/tags/t", None), ("DELETE", "/v1/repos/a/branches/dev", None)]
    for token in ("r-a", "w-b", None):
        for method, path, body in writes:
            status, doc = _http(port, method, path, token, body)
            assert status == (401 if token is None else 403), (token, method, path, doc)
    assert _http(port, "GET", "/v1/repos/a/tags", "r-a") == (200, {"tags": {}})
    assert _http(port, "GET", "/v1/repos/a/tags", "w-b")[0] == 403
    for method, path, body in writes:  # the write token of repo a does all of it
        status, doc = _http(port, method, path, "w-a", body)
        assert status in (200, 201), (method, path, doc)
    assert _http(port, "POST", "/v1/repos/a/tags", "w-a", {"name": "t", "commit": v1})[0] == 201
    status, doc = _http(port, "POST", "/v1/repos/a/tags", "w-a", {"name": "t", "commit": v1})
    assert status == 409 and "already exists" in doc["error"]
    with Store(server.url, token="r-a", retries=0) as s:
        assert s.tags("a") == {"t": v1} and s.cat("cdc://a@t/x") == b"v1"
        with pytest.raises(AccessDeniedError):
            s.tag("a", "t2")
        with pytest.raises(AccessDeniedError):
            s.delete_tag("a", "t")
    with Store(server.url, token="w-b", retries=0) as s, pytest.raises(AccessDeniedError):
        s.tag("a", "t3", v1)


@pytest.mark.parametrize("body", [b"", b"[]", b"{", b'{"name": 1, "commit": "x"}', b'{"name": "t"}',
                                  b'{"name": "t", "commit": "abc"}', b'{"name": "beef", "commit": "' + b"0" * 32 + b'"}',
                                  b'{"name": "t", "commit": "' + b"0" * 32 + b'"}',
                                  b'{"name": "../x", "commit": "' + b"0" * 32 + b'"}'])
def test_garbage_ref_requests_get_a_json_4xx(server, tmp_path, body):
    with Store(server.url) as s:
        s.push(_file(tmp_path, "a", b"v1"), "cdc://a/x")
    for kind in ("tags", "branches"):
        status, doc = _http(server.port, "POST", f"/v1/repos/a/{kind}", None, body)
        assert 400 <= status < 500 and doc["error"], (status, doc)
    assert _http(server.port, "DELETE", "/v1/repos/a/tags/nope", None)[0] == 404
    commit = Commit("a", None, "", 0.0, {}).encode().decode()
    status, doc = _http(server.port, "POST", "/v1/repos/a/commits", None,
                        {"commit": commit, "branch": "abcdef", "expected": None})
    assert status == 400 and IMMUTABLE in doc["error"]
    with Store(server.url) as s:
        assert list(s.branches("a")) == ["main"]


# -- the command line -----------------------------------------------------------------------------

def _cli(*args, store, ok=True):
    p = forker.cli([*args, "--store", store], timeout=120)  # `python -m cdcstore`, forked preloaded
    if ok:
        assert p.returncode == 0, p.stderr.decode()
    else:
        err = p.stderr.decode()
        assert p.returncode != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return p


def test_cli_tag_branch_and_log(tmp_path):
    store = str(tmp_path / "s")
    LocalStore.init(store)
    a = _file(tmp_path, "a", b"one")
    _cli("push", a, "cdc://r/x", "-m", "first", store=store)
    v1 = json.loads(_cli("log", "r", "--json", store=store).stdout)["commits"][0]["commit"]
    _cli("push", _file(tmp_path, "b", b"two"), "cdc://r/x", "-m", "second", store=store)
    log1 = json.loads(_cli("log", "r", "-n", "1", "--json", store=store).stdout)["commits"]
    assert [e["message"] for e in log1] == ["second"]
    assert len(_cli("log", "r", "-n", "1", store=store).stdout.decode().splitlines()) == 1

    _cli("tag", "r", "v1", v1[:8], store=store)
    assert json.loads(_cli("tag", "r", "--json", store=store).stdout)["tags"] == {"v1": v1}
    assert "v1" in _cli("tag", "r", store=store).stdout.decode()
    assert "already exists" in _cli("tag", "r", "v1", store=store, ok=False).stderr.decode()
    assert IMMUTABLE in _cli("push", a, f"cdc://r@{v1[:5]}/y", store=store, ok=False).stderr.decode()
    assert "a tag is immutable" in _cli("push", a, "cdc://r@v1/y", store=store, ok=False).stderr.decode()
    out = tmp_path / "out"
    _cli("pull", "cdc://r@v1/x", str(out), store=store)
    assert out.read_bytes() == b"one"
    # `tag REPO NAME` never deletes: that takes the flag
    _cli("tag", "r", "v1", "--delete", store=store)
    assert json.loads(_cli("tag", "r", "--json", store=store).stdout)["tags"] == {}

    _cli("branch", "r", "dev", v1, store=store)
    branches = json.loads(_cli("branch", "r", "--json", store=store).stdout)["branches"]
    assert branches["dev"] == v1 and set(branches) == {"dev", "main"}
    assert "hex digits" in _cli("branch", "r", "deadbeef", store=store, ok=False).stderr.decode()
    _cli("branch", "r", "dev", "--delete", store=store)
    assert "only branch" in _cli("branch", "r", "main", "--delete", "--force", store=store, ok=False).stderr.decode()
    _cli("tag", "r", "--delete", store=store, ok=False)


def test_deleting_the_default_branch_needs_force(tmp_path):
    """Deleting `main` while other branches lived was allowed, and then every address without a
    revision (`cdc://r/`) failed with "no branch or tag 'main'". It is refused, naming --force."""
    store = str(tmp_path / "s")
    s = Store.init(store)
    v1 = s.push(_file(tmp_path, "a", b"v1"), "cdc://r/x").commit
    s.create_branch("r", "dev")
    with pytest.raises(InvalidAddressError, match="default branch.*--force"):
        s.delete_branch("r", "main")
    err = _cli("branch", "r", "main", "--delete", store=store, ok=False).stderr.decode()
    assert "default branch" in err and "--force" in err and err.count("\n") == 1, err
    assert s.branches("r") == {"dev": v1, "main": v1} and s.cat("cdc://r/x") == b"v1"
    assert _cli("branch", "r", "main", "--delete", "--force", store=store).returncode == 0
    assert s.branches("r") == {"dev": v1}

"""Tokens of a running server and who committed (issue 20, item 10).

A real `cdcstore serve --tokens FILE` throughout: an edit of the file counts without a restart
(a bad one keeps the old tokens and says why), SIGHUP reloads instead of killing, a revoked token
is refused from its next request on (an open push session included), and every commit records
its author: the token's name on a server push, else `--author`, else git's user, else the OS
user (commit format 3, docs/format.md; format 2 and 1 commits stay readable).
"""
import json
import os
import signal
import time

import pytest
from click.testing import CliRunner

from cdcstore import Store
from cdcstore.api import default_author
from cdcstore.cli import cli
from cdcstore.core.commit import Commit
from cdcstore.core.errors import AccessDeniedError, CorruptionError
from cdcstore.remote.server.tokens import default_name
from cdcstore.storage.repository import LocalStore
from cdcstore.testing import ServedStore
from conftest import golden_input, raw_call

WRITE = {"scope": "write", "repos": ["*"]}


def _write(path, doc) -> None:
    """Replace the tokens file the way an operator's tool should: atomically."""
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _status(srv, token, method="GET", path="/v1/repos", data=None) -> int:
    return raw_call(srv.url + path, token, method, data)[0]


def _within(seconds: float, ok) -> float:
    """How long until `ok()` held (polled); fails past `seconds`."""
    t0 = time.monotonic()
    while not ok():
        assert time.monotonic() - t0 < seconds, f"not within {seconds} s"
        time.sleep(0.05)
    return time.monotonic() - t0


class _Ran:
    def __init__(self, result):
        self.returncode, self.stdout, self.stderr = result.exit_code, result.stdout, result.stderr


def _cli(*args, env=None, check=True) -> _Ran:
    """The CLI in this process (a child Python costs a second under load); `env` replaces the
    environment for the call, so git reads only the settings it names."""
    default_author.cache_clear()  # read git's settings again under this environment
    keep = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        out = _Ran(CliRunner().invoke(cli, list(args)))
    finally:
        os.environ.clear()
        os.environ.update(keep)
        default_author.cache_clear()
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def _files(folder, **named) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in named.items():
        (folder / name).write_bytes(data)
    return str(folder)


# -- reload and revocation ------------------------------------------------------------------------
def test_an_edited_tokens_file_counts_without_a_restart(tmp_path):
    """Before: tokens.json was read at start only (a new token: 401 until a restart)."""
    with ServedStore(tmp_path, tokens={"tok-a": WRITE}) as srv:
        path = tmp_path / "tokens.json"
        assert _status(srv, "tok-b") == 401
        _write(path, {"tok-a": WRITE, "tok-b": {"scope": "read", "repos": ["*"]}})
        assert _within(1.5, lambda: _status(srv, "tok-b") == 200) < 1.5
        _write(path, {"tok-b": {"scope": "read", "repos": ["*"]}})  # revoked by an edit
        _within(1.5, lambda: _status(srv, "tok-a") == 401)
        assert _status(srv, "tok-b") == 200
        assert srv.proc.poll() is None
        assert "reloaded" in srv.log_text()


def test_sighup_reloads_the_tokens_and_the_server_lives_on(tmp_path):
    """Before: SIGHUP killed the server."""
    with ServedStore(tmp_path, tokens={"tok-aaaa": WRITE}) as srv:
        path = tmp_path / "tokens.json"
        srv.proc.send_signal(signal.SIGHUP)  # the file did not change: read again all the same
        _within(3, lambda: "reloaded: 1 tokens (0 taken out)" in srv.log_text())
        assert srv.proc.poll() is None and _status(srv, "tok-aaaa") == 200
        before = os.stat(path)
        with open(path, "r+") as f:  # the same size, in place, its mtime put back: still seen
            text = f.read()
            f.seek(0)
            f.write(text.replace("tok-aaaa", "tok-bbbb"))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        srv.proc.send_signal(signal.SIGHUP)
        _within(1.5, lambda: _status(srv, "tok-bbbb") == 200)
        assert _status(srv, "tok-aaaa") == 401
        assert srv.proc.poll() is None


def test_a_bad_tokens_file_keeps_the_old_tokens_and_says_why(tmp_path):
    with ServedStore(tmp_path, tokens={"tok-a": WRITE}) as srv:
        path = tmp_path / "tokens.json"
        path.write_text('{"tok-a": {"scope": "write", "repos": ["*"]}, "tok-b": ')  # half written
        _within(3, lambda: "NOT reloaded" in srv.log_text())
        assert "is not JSON" in srv.log_text()
        assert _status(srv, "tok-a") == 200 and _status(srv, "tok-b") == 401
        _write(path, {"tok-b": {"scope": "everything", "repos": ["*"]}})  # JSON, but a bad grant
        srv.proc.send_signal(signal.SIGHUP)
        _within(3, lambda: "the grant of a token must look like" in srv.log_text())
        assert _status(srv, "tok-a") == 200 and _status(srv, "tok-b") == 401
        assert srv.proc.poll() is None
        _write(path, {"tok-b": WRITE})  # fixed: the new tokens count
        _within(1.5, lambda: _status(srv, "tok-b") == 200)
        assert _status(srv, "tok-a") == 401


def test_a_revoked_token_is_refused_on_a_session_it_already_holds(tmp_path):
    """Before: no revocation short of editing the file and restarting the server."""
    with ServedStore(tmp_path, tokens={"tok-ci": {**WRITE, "name": "ci"},
                                       "tok-ops": {"scope": "admin", "repos": ["*"]}}) as srv:
        path = str(tmp_path / "tokens.json")
        status, body = raw_call(srv.url + "/v1/sessions", "tok-ci", "POST", b"{}",
                                {"Content-Type": "application/json"})
        assert status == 200, body
        sid = json.loads(body)["session"]
        assert _status(srv, "tok-ci", "PUT", f"/v1/sessions/{sid}") == 200
        out = _cli("token", "revoke", "ci", "--tokens", path)
        assert "revoked 1 token(s) named ci" in out.stdout
        took = _within(1.5, lambda: _status(srv, "tok-ci", "PUT", f"/v1/sessions/{sid}") == 401)
        assert took < 1.5
        assert _status(srv, "tok-ops") == 200  # the others stay
        with pytest.raises(AccessDeniedError, match="does not know the token"):
            with Store(srv.url, token="tok-ci", cache=False) as s:
                s.push([_files(tmp_path / "src", **{"a.bin": b"x" * 1000})], "cdc://ds/")
        # a revoke of a name the file does not hold says which names it does
        bad = _cli("token", "revoke", "ci", "--tokens", path, check=False)
        assert bad.returncode == 1 and "no token named 'ci'" in bad.stderr and default_name("tok-ops") in bad.stderr
        # `token add` prints a new token that works without a restart, named as asked
        new = _cli("token", "add", "loader", "--tokens", path, "--scope", "read", "--repo", "ds").stdout.strip()
        assert len(new) >= 32
        _within(1.5, lambda: _status(srv, new, path="/v1/repos/ds/branches") in (200, 404))
        assert _status(srv, new, path="/v1/repos/other/branches") == 403
        assert json.load(open(path))[new] == {"scope": "read", "repos": ["ds"], "name": "loader"}


# -- who committed ------------------------------------------------------------------------------
def test_a_token_push_is_by_the_token_whatever_the_client_says(tmp_path):
    tokens = {"tok-ci": {**WRITE, "name": "ci-bot"}, "tok-anon": WRITE}
    with ServedStore(tmp_path, tokens=tokens) as srv:
        with Store(srv.url, token="tok-ci", author="mallory <m@evil>", cache=False) as s:
            r1 = s.push([_files(tmp_path / "v1", **{"a.bin": golden_input(50_000)})], "cdc://ds/")
            r2 = s.push([_files(tmp_path / "v2", **{"b.bin": golden_input(60_000)})], "cdc://ds/",
                        author="eve")
            assert [e["author"] for e in s.log("ds")] == ["ci-bot", "ci-bot"]
            assert [e["commit"] for e in s.log("ds")] == [r2.commit, r1.commit]
        # another token's commit, rebased onto a moved head by the server, keeps its own author
        with Store(srv.url, token="tok-anon", cache=False) as s:
            f = _files(tmp_path / "v3", **{"c.bin": golden_input(70_000)})
            r3 = s.commit_files("ds", "main", [(os.path.join(f, "c.bin"), "c.bin")], "late", parent=r1.commit)
            head = s.log("ds")[0]
            assert head["commit"] == r3.commit and head["parent"] == r2.commit
            assert head["author"] == default_name("tok-anon") != "tok-anon"  # the token never shows
        stored = LocalStore(str(tmp_path / "srv")).get_commit("ds", r1.commit)  # what the server keeps
        assert stored.format == 3 and stored.author == "ci-bot"
        # the CLI shows the author in both forms of `log`
        env = {**os.environ, "CDCSTORE_TOKEN": "tok-ci"}
        doc = json.loads(_cli("log", "ds", "--store", srv.url, "--json", env=env).stdout)
        assert [c["author"] for c in doc["commits"]] == [default_name("tok-anon"), "ci-bot", "ci-bot"]
        text = _cli("log", "ds", "--store", srv.url, env=env).stdout
        assert "(ci-bot)" in text and "mallory" not in text


def _isolated_git(tmp_path, **user) -> dict:
    """An environment whose git settings are only `user` (none: no user settings)."""
    cfg = tmp_path / f"gitconfig-{len(user)}"
    cfg.write_text("[user]\n" + "".join(f"\t{k} = {v}\n" for k, v in user.items()) if user else "")
    return {**os.environ, "GIT_CONFIG_GLOBAL": str(cfg), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path),
            "LOGNAME": "os-user-7", "USER": "os-user-7", "GIT_DIR": str(tmp_path / "no-repo")}


def test_a_local_push_is_by_author_then_git_user_then_os_user(tmp_path):
    store = str(tmp_path / "store")
    _cli("init", "--store", store)
    git = _isolated_git(tmp_path, name="Ada Lovelace", email="ada@example.org")
    nogit = _isolated_git(tmp_path)
    pushes = [(["--author", "Bob <bob@example.org>"], git, "Bob <bob@example.org>"),
              ([], git, "Ada Lovelace <ada@example.org>"),
              ([], nogit, "os-user-7")]
    for i, (args, env, _) in enumerate(pushes):
        src = _files(tmp_path / f"v{i}", **{f"f{i}.bin": golden_input(20_000 + i)})
        _cli("push", src, "cdc://ds/", "--store", store, *args, env=env)
    doc = json.loads(_cli("log", "ds", "--store", store, "--json").stdout)
    assert [c["author"] for c in doc["commits"]] == [want for _, _, want in reversed(pushes)]
    bad = _cli("push", src, "cdc://ds/", "--store", store, "--author", "two\nlines", check=False)
    assert bad.returncode == 1 and "author" in bad.stderr and "one line" in bad.stderr


# -- the commit format ------------------------------------------------------------------------
TREE = "a" * 64
GOLDEN_COMMIT_V3 = (b'{"author":"Ada Lovelace <ada@example.org>","format":3,"message":"v3","parent":null,'
                    b'"repo":"demo","time":1700000000.0,"tree":"' + TREE.encode() + b'"}')
GOLDEN_COMMIT_V3_ID = "43e0aaf5fab1ea90267c625de7c1f71077c80a86c001651de18c18a855ec8200"
GOLDEN_COMMIT_V2 = (b'{"format":2,"message":"v2","parent":null,"repo":"demo","time":1700000000.0,'
                    b'"tree":"' + TREE.encode() + b'"}')


def test_commit_format_3_is_pinned_and_older_formats_still_read():
    c = Commit("demo", None, "v3", 1700000000.0, None, TREE, "Ada Lovelace <ada@example.org>")
    assert c.format == 3 and c.encode() == GOLDEN_COMMIT_V3 and c.id == GOLDEN_COMMIT_V3_ID
    assert Commit.decode(GOLDEN_COMMIT_V3) == c
    old = Commit.decode(GOLDEN_COMMIT_V2)  # written before authors: read as it is, no author
    assert old.format == 2 and old.author is None and old.encode() == GOLDEN_COMMIT_V2
    assert c.with_author("ci-bot").id != c.id  # the author is part of what the id names
    for bad in (GOLDEN_COMMIT_V2.replace(b'{"format":2', b'{"author":"x","format":2'),  # only format 3 has one
                GOLDEN_COMMIT_V3.replace(b'"author":"Ada Lovelace <ada@example.org>",', b''),  # format 3 needs one
                GOLDEN_COMMIT_V3.replace(b"Ada Lovelace", b"Ada\\nLovelace"),
                GOLDEN_COMMIT_V3.replace(b"Ada Lovelace <ada@example.org>", b"x" * 300),
                b'{"author":"a","files":{},"format":1,"message":"","parent":null,"repo":"demo","time":1.0}'):
        with pytest.raises(CorruptionError, match="author"):
            Commit.decode(bad)


def test_log_of_commits_from_before_authors_shows_none(tmp_path):
    with Store.init(str(tmp_path / "store")) as s:
        be = s.backend
        old = be.make_commit("ds", None, "old", 1700000000.0, {})  # no author: format 2, as before
        assert old.format == 2
        cid = be.commit(old, "main", None)
        r = s.push([_files(tmp_path / "v1", **{"a.bin": b"a" * 100})], "cdc://ds/", author="new")
        assert [(e["commit"], e["author"]) for e in s.log("ds")] == [(r.commit, "new"), (cid, None)]


ADDER = """
import sys
from cdcstore.remote.server import tokens
path, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for k in range(n):
    tokens.add(path, f"{who}-{k}", "read", [])
"""

REVOKER = """
import sys
from cdcstore.remote.server import tokens
print(tokens.revoke(sys.argv[1], "boss"))
"""


def test_concurrent_token_edits_all_land_and_a_revoke_stays_revoked(tmp_path):
    """Real processes edit one tokens file at once (issue 31, case 3: 82 of 120 concurrent adds
    were lost, and a revoked admin token came back in 28 of 40 races): every add lands, and a
    revoke that reported success is never undone by an edit that read the file before it."""
    import json
    import subprocess
    import sys
    from cdcstore.remote.server import tokens

    path = str(tmp_path / "tokens.json")
    for rnd in range(3):
        boss = tokens.add(path, "boss", "admin", [])
        adders = [subprocess.Popen([sys.executable, "-c", ADDER, path, f"r{rnd}p{i}", "10"]) for i in range(6)]
        revoker = subprocess.Popen([sys.executable, "-c", REVOKER, path], stdout=subprocess.PIPE, text=True)
        assert revoker.wait(120) == 0 and "boss" in revoker.stdout.read()
        assert all(p.wait(120) == 0 for p in adders)
        doc = json.load(open(path))
        assert boss not in doc  # revoked, and stayed so
        names = {g["name"] for g in doc.values()}
        assert {f"r{rnd}p{i}-{k}" for i in range(6) for k in range(10)} <= names  # no add lost


def test_a_wrong_token_is_told_apart_from_a_missing_one(tmp_path, monkeypatch):
    """A wrong `--token` was told "missing or unknown token: pass --token or set CDCSTORE_TOKEN",
    advice for someone who passed none. The two cases say what happened."""
    monkeypatch.delenv("CDCSTORE_TOKEN", raising=False)
    with ServedStore(tmp_path, tokens={"tok-a": {"scope": "write", "repos": ["*"]}}) as srv:
        wrong = CliRunner().invoke(cli, ["ls", "cdc://r/", "--store", srv.url, "--token", "tok-typo"])
        none = CliRunner().invoke(cli, ["ls", "cdc://r/", "--store", srv.url])
    assert wrong.exit_code != 0 and "does not know the token given: check --token" in wrong.output, wrong.output
    assert "pass --token" not in wrong.output
    assert none.exit_code != 0 and "needs a token: pass --token or set CDCSTORE_TOKEN" in none.output, none.output

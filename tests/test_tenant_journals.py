"""Issue 31 case 4: a co-tenant's job journal can neither pin another tenant's data past its
erasure nor fill the server's disk. A journal entry may name only manifests its token could
read (403 otherwise, alike whether the manifest exists or not), and each token's journal space
is capped (`max_journal_bytes_per_token`), refused clearly past it and reclaimed by gc."""
import glob
import json
import os
import time

import pytest

from cdcstore import Store
from cdcstore.writers import new_job
from conftest import raw_call as _call

TOKENS = {"tok-a": {"scope": "write", "repos": ["a"]}, "tok-b": {"scope": "write", "repos": ["b"]},
          "tok-admin": {"scope": "admin", "repos": ["*"]}}


# the `server` of every test here: these tokens, and no floor on gc's grace
pytestmark = pytest.mark.served("--min-gc-grace", "0s", tokens=TOKENS)
CAP = 1 << 20  # max_journal_bytes_per_token of the test that caps it


def _entry(rows: list[dict]) -> bytes:
    return json.dumps({"format": 1, "entries": rows}).encode()


def _staging_bytes(root) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(root, "staging", "**"), recursive=True)
               if os.path.isfile(p))


def test_an_entry_naming_another_tenants_manifest_is_refused_and_erasure_holds(server, tmp_path):
    secret = os.urandom(200_000)
    (tmp_path / "secret.bin").write_bytes(secret)
    with Store(server.url, token="tok-b", cache=False) as sb:
        sb.push(str(tmp_path / "secret.bin"), "cdc://b/secret.bin")
        theirs = sb.resolve("cdc://b/")[1].files["secret.bin"]
    api, job = server.url + "/v1", new_job()
    assert _call(f"{api}/repos/a/jobs/{job}", "tok-a", "PUT", b"{}")[0] == 200
    answers = []
    for manifest in (theirs.manifest, "ab" * 32):  # B's manifest, one nobody stored
        status, body = _call(f"{api}/repos/a/jobs/{job}/entries", "tok-a", "POST",
                             _entry([{"path": "x.bin", "manifest": manifest, "size": theirs.size}]))
        answers.append((status, json.loads(body).get("error", "").replace(manifest, "M")))
    print(f"\njournal entry naming B's manifest: {answers[0][0]}; naming none: {answers[1][0]}")
    assert answers[0][0] == 403 and answers[0] == answers[1], answers
    # an honest entry of A's own file still lands through the journal
    (tmp_path / "mine.bin").write_bytes(os.urandom(50_000))
    with Store(server.url, token="tok-a", cache=False) as sa:
        own = new_job()
        sa.journal().open("a", own)
        sa.stage("a", own, [(str(tmp_path / "mine.bin"), "mine.bin")])
        assert sa.land("cdc://a@main/", own) is not None
        assert sa.cat("cdc://a/mine.bin") == (tmp_path / "mine.bin").read_bytes()
    # B erases its repo: nothing of the secret is stored after gc, though A's job is live
    with Store(server.url, token="tok-admin", cache=False) as admin:
        admin.delete_repo("b")
        admin.gc(grace=0)
    packs = [open(p, "rb").read() for p in glob.glob(os.path.join(server.store, "packs", "*", "*"))]
    assert not any(secret[:4096] in p or secret[-4096:] in p for p in packs), "the secret outlived its erasure"
    assert not glob.glob(os.path.join(server.store, "manifests", "*", theirs.manifest))


@pytest.mark.served("--min-gc-grace", "0s", "--limit", f"max_journal_bytes_per_token={CAP}", tokens=TOKENS)
def test_each_tokens_journal_space_is_capped_and_gc_reclaims_it(server, tmp_path):
    cap = CAP
    api = server.url + "/v1"
    rows = [{"path": f"gone/{i:06d}-" + "p" * 40, "remove": True} for i in range(1500)]  # ~100 KB
    accepted, refusal = 0, None
    for _ in range(300):
        job = new_job()
        if _call(f"{api}/repos/a/jobs/{job}", "tok-a", "PUT", b"{}")[0] != 200:
            break
        status, body = _call(f"{api}/repos/a/jobs/{job}/entries", "tok-a", "POST", _entry(rows))
        if status != 201:
            refusal = (status, json.loads(body))
            break
        accepted += 1
    held = _staging_bytes(server.store)
    print(f"\n300 jobs of ~100 KB from one token: {accepted} accepted, staging/ holds {held / 2**20:.1f} MiB")
    assert refusal is not None and refusal[0] == 413, refusal
    assert "max_journal_bytes_per_token" in refusal[1]["error"]
    assert held < 2 * cap
    # another token's journal is not held up by it
    job_b = new_job()
    assert _call(f"{api}/repos/b/jobs/{job_b}", "tok-b", "PUT", b"{}")[0] == 200
    assert _call(f"{api}/repos/b/jobs/{job_b}/entries", "tok-b", "POST", _entry(rows[:10]))[0] == 201
    # A's drivers die (their heartbeats stop): gc frees their journals and A may journal again
    old = time.time() - 7 * 3600
    for p in glob.glob(os.path.join(server.store, "staging", "a", "*", "*")):
        os.utime(p, (old, old))
    with Store(server.url, token="tok-admin", cache=False) as admin:
        admin.gc(grace=3600)
    assert not glob.glob(os.path.join(server.store, "staging", "a", "*", "*"))
    job = new_job()
    assert _call(f"{api}/repos/a/jobs/{job}", "tok-a", "PUT", b"{}")[0] == 200
    assert _call(f"{api}/repos/a/jobs/{job}/entries", "tok-a", "POST", _entry(rows))[0] == 201

"""Issue 31 case 2: no presence oracle through dedup. A scoped token that guesses a co-tenant's
file (a known template with a 4-digit PIN) holds the bytes of every guess; whatever it sends
(presence query, proofs, a manifest naming the ids, then its own query again), the server's
answers for the held guess and the others are identical (docs/protocol.md "Trust model")."""
import json
import os

import pytest

from cdcstore import Store
from cdcstore.core import ids
from cdcstore.core.manifest import Manifest
from cdcstore.core import wire
from conftest import raw_call as _call

ID32 = {"X-Cdc-Id-Bytes": "32"}
TOKENS = {"tok-a": {"scope": "write", "repos": ["a"]}, "tok-b": {"scope": "write", "repos": ["b"]}}
TEMPLATE = b"bank letter\n" + b"x" * 3000 + b"\nyour PIN is %04d\n" + b"y" * 900


pytestmark = pytest.mark.served(tokens=TOKENS)  # the `server` of every test here


def _pin_file(pin: int) -> bytes:
    return TEMPLATE % pin


def _guess_by_proofs(api: str, candidates: dict[bytes, bytes]) -> tuple[bytes, list[bytes]]:
    """The attack: query every candidate id with X-Cdc-Prove, prove every one it is asked to
    (the attacker holds each candidate's bytes), return (query flags, prove answers)."""
    cids = list(candidates)
    status, answer = _call(api + "/chunks/query", "tok-a", "POST", b"".join(cids), {wire.PROVE_HEADER: "1"} | ID32)
    assert status == 200
    flags = answer[:len(cids)]
    nonce = wire.presence_nonce(cids, answer) or bytes(wire.NONCE)
    proved = []
    for j in range(0, len(cids), wire.MAX_PROOFS_PER_REQUEST):
        part = cids[j:j + wire.MAX_PROOFS_PER_REQUEST]
        body = wire.encode_proofs(nonce, [(c, wire.chunk_proof(candidates[c], nonce)) for c in part])
        status, got = _call(api + "/chunks/prove", "tok-a", "POST", body, ID32)
        if status == 200:
            proved += [c for c, ok in zip(part, got) if ok]
    return flags, proved


def test_guessing_a_pin_through_proofs_and_manifests_learns_nothing(server, tmp_path):
    pin = 4821
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "letter.txt").write_bytes(_pin_file(pin))
    with Store(server.url, token="tok-b", cache=False) as sb:
        sb.push([str(tmp_path / "b")], "cdc://b/")
    api = server.url + "/v1"
    candidates = {ids.digest(d): d for d in map(_pin_file, range(10_000))}
    secret = ids.digest(_pin_file(pin))
    assert len(candidates) == 10_000 and secret in candidates

    flags, proved = _guess_by_proofs(api, candidates)
    print(f"\nprove oracle: 10,000 guesses, {len(proved)} proved "
          f"({'the PIN' if secret in proved else 'nothing'}); query flags {sorted(set(flags))}")
    assert len(set(flags)) == 1, "the presence flags single out the held guess"
    assert proved == [], "a proof told the attacker which guess the store holds"

    # naming the id in a manifest (no bytes needed) answers alike for the held and a free guess
    other = ids.digest(_pin_file(1234))
    answers = []
    for cid in (secret, other):
        blob = Manifest([cid], [len(TEMPLATE)], len(TEMPLATE), bytes(16)).encode()
        status, body = _call(api + "/manifests", "tok-a", "POST", wire.encode_blobs([blob]))
        answers.append((status, json.loads(body)["error"].replace(cid.hex(), "ID")))
    print(f"manifest naming the held id vs a free id: {answers[0][0]} vs {answers[1][0]}")
    assert answers[0] == answers[1] and answers[0][0] in (403, 409)

    # after all that, the attacker's own query still says nothing of the held guess
    status, after = _call(api + "/chunks/query", "tok-a", "POST", secret + other, ID32)
    assert (status, after) == (200, b"\x00\x00")


def test_an_honest_client_still_deduplicates(server, tmp_path):
    """Dedup keeps working: a token's second push of its data sends nothing new; a tenant holding
    the same bytes as another pushes them (sent, as every tenant's unseen data is) and reads them."""
    data = os.urandom(300_000)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "shared.bin").write_bytes(data)
    with Store(server.url, token="tok-b", cache=False) as sb:
        first = sb.push([str(tmp_path / "b")], "cdc://b/")
        (tmp_path / "b" / "more.bin").write_bytes(data + b"tail")
        second = sb.push([str(tmp_path / "b")], "cdc://b/")
    assert first.new_bytes >= len(data) and second.new_bytes < len(data) // 2
    with Store(server.url, token="tok-a", cache=False) as sa:
        r = sa.push([str(tmp_path / "b" / "shared.bin")], "cdc://a/shared.bin")
        assert r.sent_bytes >= len(data) // 2 and sa.counters()["proven_chunks"] == 0
        assert sa.cat("cdc://a/shared.bin") == data
        again = sa.push([str(tmp_path / "b" / "more.bin")], "cdc://a/more.bin")
        assert again.sent_bytes < len(data) // 2  # within its own reach, dedup still saves the upload

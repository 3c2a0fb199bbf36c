"""A real `cdcstore serve` against clients that try to take its memory or its slots (issue 19):
every path that decompresses, parses or buffers has one bound (remote/server/limits.py ServerLimits),
each pinned here with small limits (`serve --limit`), so no test allocates more than a few
tens of MiB. Each test measures the server's peak RSS (VmHWM) and counts its hostile requests;
the module prints the totals (peak RSS, requests, 5xx) at the end."""
import io
import json
import os
import socket
import threading
import time

import pytest
import zstandard

from cdcstore.core import ids
from cdcstore.core.manifest import Manifest
from cdcstore.core.pack import CODEC_RAW, CODEC_ZSTD, PackWriter
from cdcstore.core import wire
from cdcstore.storage.repository import LocalStore
from test_hostile import Probe, peak_rss_mb

TOKENS = {"w-a": {"scope": "write", "repos": ["a"]}, "w-b": {"scope": "write", "repos": ["b"]},
          "r-a": {"scope": "read", "repos": ["a"]}, "w-all": {"scope": "write", "repos": ["*"]},
          "admin": {"scope": "admin", "repos": ["*"]}}
ID32 = wire.id_headers(wire.ID)
MiB = 1 << 20
TOTALS = {"requests": 0, "5xx": 0, "peak_rss_mb": 0.0}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(f"\nhostile server bounds: {TOTALS['requests']} hostile requests, {TOTALS['5xx']} x 5xx, "
          f"server peak RSS {TOTALS['peak_rss_mb']:.0f} MB")


def limits(*limits: str, args: tuple = ()):
    """A test's server: TOKENS, these `--limit KEY=VALUE`s and more `serve` options (`args`)."""
    return pytest.mark.served(*(x for lim in limits for x in ("--limit", lim)), *args, tokens=TOKENS)


pytestmark = limits()  # a test that names no limits: the defaults


class Bounded:
    """The test's served store (`server`), probed: `probe` sends raw requests as a token; at the
    end its peak RSS and its hostile requests are counted, and no answer may have been a 5xx."""

    def __init__(self, srv):
        self.srv = srv
        self.probe = Probe(self.srv.port)

    def call(self, token: str, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        return self.probe.request(method, "/v1" + path, body, {"Authorization": f"Bearer {token}", **(headers or {})})

    def rss(self) -> float:
        return peak_rss_mb(self.srv.proc.pid)

    def close(self) -> None:
        rss = self.rss()
        print(f"\n(server peak RSS {rss:.0f} MB after {self.probe.sent} requests)")
        TOTALS["requests"] += self.probe.sent
        TOTALS["5xx"] += len(self.probe.errors_5xx)
        TOTALS["peak_rss_mb"] = max(TOTALS["peak_rss_mb"], rss)
        assert not self.probe.errors_5xx, self.probe.errors_5xx


@pytest.fixture
def bounded(server):
    b = Bounded(server)
    yield b
    b.close()  # before `server` stops


def real_pack(raws: list[bytes], codec: int = CODEC_ZSTD) -> tuple[str, bytes, list[bytes]]:
    """A valid pack of these chunks: (name, bytes, chunk ids)."""
    buf = io.BytesIO()
    w = PackWriter(buf)
    cids = []
    for raw in raws:
        cid = ids.digest(raw)
        stored = zstandard.ZstdCompressor(level=1).compress(raw) if codec == CODEC_ZSTD else raw
        w.add(cid, codec, stored, len(raw), ids.checksum(raw))
        cids.append(cid)
    return w.finish(), buf.getvalue(), cids


def big_manifest(cid: bytes, chunk_len: int, count: int) -> bytes:
    """A valid manifest naming one chunk `count` times (a file of one block repeated)."""
    return Manifest([cid] * count, [chunk_len] * count, chunk_len * count, bytes(16)).encode()


# -- memory a client can take ------------------------------------------------------------------
def test_prove_reads_nothing_for_a_scoped_token(bounded):
    """A small pack of highly compressible 2 MiB chunks, then proofs naming all of them from
    another token: a scoped token's proofs answer 0 without reading a chunk (issue 31 case 2)."""
    s = bounded
    name, pack, cids = real_pack([bytes([i]) * (2 * MiB) for i in range(24)])  # 48 MiB raw
    assert len(pack) < 64 * 1024
    assert s.call("w-a", "PUT", f"/packs/{name}", pack)[0] == 201
    before = s.rss()
    status, flags = s.call("w-b", "POST", "/chunks/query", b"".join(cids), {wire.PROVE_HEADER: "1", **ID32})
    assert (status, flags) == (200, bytes(len(cids)))
    nonce = bytes(wire.NONCE)
    good = [(c, wire.chunk_proof(bytes([i]) * (2 * MiB), nonce)) for i, c in enumerate(cids)]
    for _ in range(2):
        assert s.call("w-b", "POST", "/chunks/prove", wire.encode_proofs(nonce, good), ID32) == (200, bytes(len(cids)))
    grown = s.rss() - before
    print(f"\nprove of 48 MiB of chunks from a {len(pack)}-byte pack: server peak RSS grew {grown:.0f} MB")
    assert grown < 24, f"proof checks held {grown:.0f} MB"


def _store_chunk(s, token: str, raw: bytes) -> bytes:
    name, pack, (cid,) = real_pack([raw], CODEC_RAW)
    assert s.call(token, "PUT", f"/packs/{name}", pack)[0] == 201
    return cid


@limits("decode_bytes=262144", "slice_chunks=4096")
def test_manifest_batches_are_parsed_in_slices(bounded, tmp_path):
    """Three 10 MiB batches at once, each one manifest of 300,000 chunk ids: spooled to disk and
    checked `slice_chunks` ids at a time (the old server decoded each whole: ~80 MB apiece).
    A large manifest naming a missing chunk or with a wrong length is refused and not stored."""
    s = bounded
    cid = _store_chunk(s, "w-a", b"block" * 100)
    blob = big_manifest(cid, 500, 300_000)
    assert len(blob) > 10 * MiB
    body = wire.encode_blobs([blob])
    before = s.rss()
    results = []

    def post():
        results.append(s.call("w-a", "POST", "/manifests", body))

    threads = [threading.Thread(target=post) for _ in range(3)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    seconds = time.time() - t0
    grown = s.rss() - before
    print(f"\n3 manifest batches of {len(body) / MiB:.0f} MiB at once: {seconds:.1f} s, server peak RSS grew "
          f"{grown:.0f} MB")
    assert [st for st, _ in results] == [200] * 3, results
    name = ids.hexdigest(blob)
    assert all(json.loads(b)["manifests"] == [name] for _, b in results)
    srv = LocalStore(s.srv.store)
    assert open(srv.manifest_path(name), "rb").read() == blob
    assert grown < 40, f"manifest batches held {grown:.0f} MB"
    # the batch's other limits and checks still hold for a manifest checked in slices
    missing = big_manifest(ids.digest(b"nobody stored this"), 500, 100_000)
    status, err = s.call("w-all", "POST", "/manifests", wire.encode_blobs([missing]))
    assert status == 409 and b"not on the server" in err
    status, err = s.call("w-a", "POST", "/manifests", wire.encode_blobs([missing]))  # scoped: as if hidden
    assert status == 403 and b"neither uploaded nor may read" in err
    assert not os.path.exists(srv.manifest_path(ids.hexdigest(missing)))
    status, err = s.call("w-a", "POST", "/manifests", wire.encode_blobs([blob[:-1]]))
    assert status == 422 and b"wrong length" in err
    status, err = s.call("w-b", "POST", "/manifests", body)  # another tenant's chunk: not its to name
    assert status == 403, err
    status, err = s.call("w-a", "POST", "/manifests", body + b"\x00" * 3)
    assert status == 400 and b"truncated" in err


@limits("max_batch_bytes=1048576", "max_tree_bytes=1024")
def test_batches_over_the_limit_are_refused_before_being_held(bounded):
    s = bounded
    status, err = s.call("w-a", "POST", "/manifests", b"\x00" * (2 * MiB))
    assert status == 413 and b"limit" in err
    tree = json.dumps({"entries": {f"f{i}": {"manifest": "0" * 64, "size": 1} for i in range(50)},
                       "format": 2, "type": "tree"}, sort_keys=True, separators=(",", ":")).encode()
    status, err = s.call("w-a", "POST", "/trees", wire.encode_blobs([tree]))
    assert status == 413 and b"tree of" in err


@limits("max_pack_chunks=1000")
def test_a_pack_of_too_many_chunks_is_refused_before_its_index_is_parsed(bounded):
    """An uploaded pack's index is parsed whole (a 128 MiB pack of 1-byte chunks would be two
    million entries): over `max_pack_chunks` it is a 413, nothing stored; under it, stored."""
    s = bounded
    name, pack, _ = real_pack([b"%d" % i for i in range(1001)], CODEC_RAW)
    status, err = s.call("w-a", "PUT", f"/packs/{name}", pack)
    assert status == 413 and b"1001 chunks" in err and b"limit is 1000" in err
    assert not os.listdir(os.path.join(s.srv.store, "packs")) or not any(
        files for _, _, files in os.walk(os.path.join(s.srv.store, "packs")))
    name, pack, _ = real_pack([b"%d" % i for i in range(1000)], CODEC_RAW)
    assert s.call("w-a", "PUT", f"/packs/{name}", pack)[0] == 201


def _commit_large_file(s, tmp_path, count: int) -> tuple[str, bytes, bytes]:
    cid = _store_chunk(s, "w-a", b"block" * 100)
    blob = big_manifest(cid, 500, count)
    status, body = s.call("w-a", "POST", "/manifests", wire.encode_blobs([blob]))
    assert status == 200, body
    name = json.loads(body)["manifests"][0]
    commit = json.dumps({"format": 1, "repo": "a", "parent": None, "message": "m", "time": 1.0,
                         "files": {"big.bin": {"manifest": name, "size": 500 * count}}})
    status, body = s.call("w-a", "POST", "/repos/a/commits",
                          json.dumps({"commit": commit, "branch": "main", "expected": None}).encode())
    assert status == 201, body
    return name, blob, cid


@limits("decode_bytes=262144", "send_block=262144")
def test_located_manifest_of_a_large_file_is_streamed(bounded, tmp_path):
    """A commit of a file whose manifest is 10 MiB, then four concurrent `?locations=1` reads of
    it by a read token: the manifest is never decoded whole (the old server held ~80 MB for the
    commit and per read); the answer is the same."""
    s = bounded
    name, blob, cid = _commit_large_file(s, tmp_path, 300_000)
    assert s.rss() < 100, f"the commit of a large file took the server to {s.rss():.0f} MB"
    before = s.rss()
    results = []

    def get():
        results.append(s.call("r-a", "GET", f"/repos/a/manifests/{name}?locations=1"))

    threads = [threading.Thread(target=get) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    grown = s.rss() - before
    print(f"\n4 located reads of a {len(blob) / MiB:.0f} MiB manifest: server peak RSS grew {grown:.0f} MB")
    assert len(results) == 4
    for status, body in results:
        assert status == 200
        manifest, found = wire.decode_located(body)
        assert manifest == blob and set(found) == {cid}
    assert grown < 40, f"located manifests held {grown:.0f} MB"
    status, _ = s.call("r-a", "GET", f"/repos/b/manifests/{name}?locations=1")
    assert status == 403


def _hold_range(port: int, token: str, path: str, size: int) -> socket.socket:
    """A GET of a pack range whose answer is never read."""
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    c.sendall(f"GET /v1{path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
              f"Range: bytes=0-{size - 1}\r\n\r\n".encode())
    return c


def _drain(c: socket.socket) -> int:
    got = 0
    c.settimeout(10)
    try:
        while block := c.recv(1 << 20):
            got += len(block)
    except OSError:
        pass
    c.close()
    return got


@limits("send_block=65536", "send_timeout=1", args=("--min-body-rate", "1000000"))
def test_readers_that_never_read_hold_little_and_are_cut_off(bounded):
    """Eight scoped readers ask for a 12 MiB masked range each and read nothing: the server
    builds each answer `send_block` at a time (the old one built all 96 MiB at once, and kept
    it as long as the readers kept their connections), cuts them off after `send_timeout`, and
    serves an honest reader meanwhile."""
    s = bounded
    name, pack, cids = real_pack([os.urandom(2 * MiB) for _ in range(6)], CODEC_RAW)
    assert s.call("w-a", "PUT", f"/packs/{name}", pack)[0] == 201
    before = s.rss()
    size = 12 * MiB
    held = [_hold_range(s.srv.port, "w-a", f"/repos/a/packs/{name}", size) for _ in range(8)]
    s.probe.sent += len(held)
    time.sleep(0.5)
    t0 = time.time()
    status, body = s.call("w-a", "GET", f"/repos/a/packs/{name}", headers={"Range": "bytes=4096-4195"})
    assert status == 206 and body == pack[4096:4196] and time.time() - t0 < 5
    time.sleep(2.0)  # past send_timeout: every held reader is cut off
    grown = s.rss() - before
    got = [_drain(c) for c in held]
    print(f"\n8 readers of 12 MiB ranges that never read: server peak RSS grew {grown:.0f} MB; "
          f"they got {max(got) / MiB:.1f} MiB at most before being cut off")
    assert all(g < size for g in got), got
    assert grown < 40, f"unread ranges held {grown:.0f} MB"
    assert "too slowly: cut off" in s.srv.log_text()


# -- a write token that denies service to everyone --------------------------------------------
def _dribble(port: int, token: str, name: str, stop: threading.Event, replies: list) -> None:
    """A pack upload that sends one byte every 0.1 s until `stop` (then reads its answer)."""
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    c.sendall(f"PUT /v1/packs/{name} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
              f"Content-Length: 100000\r\n\r\n".encode())
    c.setblocking(False)
    reply = b""
    try:
        while not stop.is_set() and not reply:
            try:
                c.send(b"x")
                reply = c.recv(4096)
            except BlockingIOError:
                time.sleep(0.1)
            except OSError:
                break
    finally:
        c.close()
    replies.append(reply.split(b"\r\n")[0])


@limits("write_slots=4", "write_slots_per_token=2", "read_slots=4",
        args=("--min-body-rate", "1", "--body-timeout", "30"))
def test_slow_uploads_of_one_token_leave_slots_to_others_and_to_reads(bounded):
    """One write token starts six slow uploads (above the minimum rate) into a server with 4
    upload slots: it gets its share (2), the rest are 429 at once; another token still uploads,
    and scoped reads are served from their own slots at once."""
    s = bounded
    name, pack, _ = real_pack([os.urandom(5000)], CODEC_RAW)
    assert s.call("w-b", "PUT", f"/packs/{name}", pack)[0] == 201
    stop, replies = threading.Event(), []
    slow_name = ids.hexdigest(b"slow")
    threads = [threading.Thread(target=_dribble, args=(s.srv.port, "w-a", slow_name, stop, replies))
               for _ in range(6)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        assert sum(b" 429 " in r for r in replies) == 4, replies  # past the token's share: refused at once
        other, pack2, _ = real_pack([os.urandom(5000)], CODEC_RAW)
        t0 = time.time()
        assert s.call("w-b", "PUT", f"/packs/{other}", pack2)[0] == 201
        status, body = s.call("w-b", "GET", f"/repos/b/packs/{name}", headers={"Range": "bytes=1000-1099"})
        assert status == 206 and body == pack[1000:1100]
        assert time.time() - t0 < 3
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    s.probe.sent += len(threads)


def _chunked_put(port: int, token: str, name: str, blocks: int, block: bytes) -> tuple[bytes, int]:
    """A chunked PUT of a pack (no Content-Length), sending until the server answers: (status
    line, blocks sent)."""
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    c.sendall(f"PUT /v1/packs/{name} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
              f"Transfer-Encoding: chunked\r\n\r\n".encode())
    sent, reply = 0, b""
    c.settimeout(0.05)
    try:
        while not reply and sent < blocks:
            try:
                reply = c.recv(4096)
                break
            except TimeoutError:
                pass
            c.sendall(b"%x\r\n" % len(block) + block + b"\r\n")
            sent += 1
        c.settimeout(10)
        while not reply:
            reply = c.recv(4096)
            if not reply:
                break
    except (ConnectionResetError, BrokenPipeError):
        pass
    finally:
        c.close()
    return reply.split(b"\r\n")[0], sent


@limits("max_pack_bytes=1048576")
def test_a_put_to_a_stored_pack_is_not_drained(bounded):
    """A PUT to a pack name the server holds: a "*" token (nothing to prove) is answered at once
    without its body being read; a scoped one (which may prove it holds the bytes) is cut off with
    a 413 past the pack limit. The old server read any size (300 MiB) and answered 200."""
    s = bounded
    name, pack, _ = real_pack([os.urandom(50_000)], CODEC_RAW)
    assert s.call("w-a", "PUT", f"/packs/{name}", pack)[0] == 201
    block = b"z" * 65536
    line, sent = _chunked_put(s.srv.port, "w-all", name, 4096, block)  # up to 256 MiB offered
    assert b" 200 " in line and sent < 64, (line, sent)
    line, sent = _chunked_put(s.srv.port, "w-b", name, 4096, block)
    assert b" 413 " in line and sent < 128, (line, sent)
    s.probe.sent += 2
    status, body = s.call("w-b", "PUT", f"/packs/{name}", pack)  # an honest retry of the same bytes
    assert status == 200 and json.loads(body)["stored"] is False


@limits("max_sessions=5", "max_sessions_per_token=3", "max_session_life=1", args=("--min-gc-grace", "0s"))
def test_push_sessions_are_capped_per_token_and_in_all_and_their_life_is_bounded(bounded):
    s = bounded
    opened = []
    for token, want in [("w-a", 200), ("w-a", 200), ("w-a", 200), ("w-a", 429), ("w-b", 200), ("w-b", 200),
                        ("w-b", 429), ("w-all", 429)]:
        status, body = s.call(token, "POST", "/sessions", b"{}", {"Content-Type": "application/json"})
        assert status == want, (token, status, body)
        if status == 200:
            opened.append((token, json.loads(body)["session"]))
        else:
            assert b"too many open push sessions" in body
    sessions = os.path.join(s.srv.store, "sessions")
    assert len(os.listdir(sessions)) == 5
    status, body = s.call("admin", "POST", "/admin/gc", b'{"grace": 0}')
    assert status == 200 and json.loads(body)["open_sessions"] == 5  # the open sessions hold gc off
    assert json.loads(body)["deleted"] is False
    token, sid = opened[0]
    assert s.call(token, "DELETE", f"/sessions/{sid}")[0] == 200  # a closed one frees its place
    assert s.call("w-all", "POST", "/sessions", b"{}")[0] == 200
    time.sleep(1.5)  # past max_session_life: renewing is refused and the session is removed
    for token, sid in opened[1:]:
        status, body = s.call(token, "PUT", f"/sessions/{sid}")
        assert status == 409 and b"older than" in body, body
    assert len(os.listdir(sessions)) == 1  # the one w-all opened last, not refreshed yet
    assert s.call("w-a", "POST", "/sessions", b"{}")[0] == 200  # places are free again


# -- the pieces, without a server ----------------------------------------------------------------
def test_limits_are_named_and_checked():
    from cdcstore.core.errors import InvalidAddressError
    from cdcstore.remote.server.limits import ServerLimits
    lim = ServerLimits.parse(["send_block=4096", "send-timeout=2.5"])
    assert (lim.send_block, lim.send_timeout, lim.write_slots) == (4096, 2.5, 8)
    for bad, why in [("nope=1", "NAME one of"), ("send_block", "NAME=VALUE"), ("read_slots=x", "not a number"),
                     ("read_slots=0", "above 0")]:
        with pytest.raises(InvalidAddressError, match=why):
            ServerLimits.parse([bad])


@pytest.mark.parametrize("count", [3, 200_000])  # one read, then ranges
def test_a_manifest_file_is_read_in_slices_and_checked_against_its_name(tmp_path, count):
    from cdcstore.core.errors import CorruptionError
    from cdcstore.storage.manifest_file import ManifestFile, ManifestMissing
    from cdcstore.storage.repository import manifest_name
    store = LocalStore.init(str(tmp_path / "s"))
    chunk_ids = [ids.digest(b"%d" % i) for i in range(count)]
    m = Manifest(chunk_ids, [10] * count, 10 * count, bytes(16))
    data = m.encode()
    (name,) = store.put_manifests([m])
    f = ManifestFile(store, name)
    assert (f.count, f.size, f.bytes) == (count, 10 * count, len(data))
    assert (f.data is None) == (len(data) > 256 * 1024)
    assert [c for part in f.scan(1000) for c in sorted(part)] == [c for i in range(0, count, 1000)
                                                                  for c in sorted(chunk_ids[i:i + 1000])]
    n = min(512, count)
    assert f.ends(512) == chunk_ids[:n] + chunk_ids[-n:]
    path = store.objects.local_path(manifest_name(name))
    os.chmod(path, 0o644)
    with open(path, "r+b") as out:  # one chunk id damaged: the scan says so at its end
        out.seek(len(data) - 10)
        out.write(b"\xff")
    with pytest.raises(CorruptionError, match="does not match its name"):
        list(ManifestFile(store, name).scan(1000))
    with open(path, "ab") as out:
        out.write(b"x")
    with pytest.raises(CorruptionError, match="damaged"):
        ManifestFile(store, name)
    with pytest.raises(ManifestMissing):
        ManifestFile(store, "ab" * 32)


@pytest.mark.parametrize("lie", [True, False])
def test_a_folder_claiming_content_its_tree_does_not_hold_is_refused(bounded, lie):
    """A folder entry's content id is what a new machine's push trusts to skip unchanged files
    (tree format 4): a writer claiming another folder's content would make others' pushes keep its
    files. The server checks each new folder's claim against its tree when the commit lands."""
    from cdcstore.core import treeobj
    from cdcstore.core.commit import FileEntry
    s = bounded
    cid = _store_chunk(s, "w-a", b"block" * 100)
    status, body = s.call("w-a", "POST", "/manifests", wire.encode_blobs([big_manifest(cid, 500, 1)]))
    assert status == 200, body
    name = json.loads(body)["manifests"][0]
    sub = treeobj.Tree({"x.bin": FileEntry(name, 500)})
    root = treeobj.Tree({"d": treeobj.Folder(sub.id, 500, 1, "ab" * 32 if lie else sub.content)})
    assert s.call("w-a", "POST", "/trees", wire.encode_blobs([sub.encode(), root.encode()]))[0] == 200
    commit = json.dumps({"format": 2, "repo": "a", "parent": None, "message": "m", "time": 1.0, "tree": root.id})
    status, body = s.call("w-a", "POST", "/repos/a/commits",
                          json.dumps({"commit": commit, "branch": "main", "expected": None}).encode())
    if lie:
        assert status == 400 and b"claims content" in body, (status, body)
    else:
        assert status == 201, body

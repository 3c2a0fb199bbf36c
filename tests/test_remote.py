"""A real server in a subprocess on loopback, driven by the real client."""
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from cdcstore import AccessDeniedError, ConflictError, Store
from cdcstore.core import ids
from cdcstore.core.pack import CODEC_RAW, PackWriter
from cdcstore.storage.check import check
from cdcstore.storage.repository import LocalStore
from cdcstore.engine.ingest import IngestOptions
from conftest import golden_input
from server_util import ServerProcess


def test_push_pull_over_http_moves_only_new_chunks(server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(golden_input(4_000_000))
    (data / "b.txt").write_bytes(b"hello over http\n")
    with Store(server.url) as s:
        v1 = s.push([str(data)], "cdc://ds/", message="v1")
        assert v1.new_bytes == v1.bytes and v1.requests > 0
        assert v1.sent_bytes >= v1.stored_bytes
        edited = bytearray(golden_input(4_000_000))
        edited[2_000_000:2_000_004] = b"EDIT"
        (data / "a.bin").write_bytes(bytes(edited))
        v2 = s.push([str(data)], "cdc://ds/", message="v2")
        assert 0 < v2.new_bytes < 600_000
        assert v2.sent_bytes <= 1.05 * v2.new_bytes + 64 * 1024  # ids + headers
        assert s.cat("cdc://ds/a.bin") == bytes(edited)
        assert s.cat(f"cdc://ds@{v1.commit[:6]}/a.bin") == golden_input(4_000_000)
        s.cache.wait()  # cache writes happen in the background
        out = tmp_path / "out"
        p = s.pull("cdc://ds/", str(out))
        assert (out / "b.txt").read_bytes() == b"hello over http\n"
        assert p.received_bytes < 64 * 1024  # the reads above filled the local cache
    with Store(server.url, cache=False) as s:
        p = s.pull("cdc://ds/", str(tmp_path / "out2"))
        assert p.received_bytes >= p.bytes
        assert [e["message"] for e in s.log("ds")] == ["v2", "v1"]
        assert s.ls("cdc://ds/")[0]["name"] == "a.bin"
    # the server's store is an ordinary local store
    local = Store(server.store)
    assert local.cat("cdc://ds/a.bin") == bytes(edited) and local.check()["problems"] == []


def test_conflict_over_http(server, tmp_path):
    f = tmp_path / "f.txt"
    f.write_bytes(b"one")
    with Store(server.url) as a, Store(server.url) as b:
        a.push([str(f)], "cdc://r/f.txt")
        raced = []

        def race(_n):
            if not raced:
                raced.append(b.push([str(f)], "cdc://r/g.txt"))

        landed = a.push([str(f)], "cdc://r/h.txt", progress=race)  # disjoint: rebased onto g.txt's commit
        assert a.branches("r")["main"] == landed.commit and a.log("r")[1]["commit"] == raced[0].commit
        assert {e["name"] for e in a.ls("cdc://r/")} == {"f.txt", "g.txt", "h.txt"}
        g = tmp_path / "g2.txt"
        g.write_bytes(b"two")
        raced.clear()

        def race_same(_n):
            if not raced:
                raced.append(b.push([str(g)], "cdc://r/same.txt"))

        with pytest.raises(ConflictError, match="same.txt"):  # overlapping: the loser is told which path
            a.push([str(f)], "cdc://r/same.txt", progress=race_same)


CLIENT_PUSH = textwrap.dedent("""
    import sys
    from cdcstore import Store
    from cdcstore.engine.ingest import IngestOptions
    s = Store(sys.argv[1], retries=0)
    s.push([sys.argv[2]], "cdc://big/big.bin", options=IngestOptions(max_pack_bytes=1 << 20))
""")


def test_server_sigkill_mid_push_then_push_again(tmp_path):
    LocalStore.init(str(tmp_path / "srv"))
    server = ServerProcess(str(tmp_path / "srv")).start()
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(40 << 20))
    packs_dir = tmp_path / "srv" / "packs"

    def packs():
        return [p for d in packs_dir.iterdir() for p in d.iterdir()] if packs_dir.exists() else []

    client = subprocess.Popen([sys.executable, "-c", CLIENT_PUSH, server.url, str(big)],
                              stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while len(packs()) < 3 and time.time() < deadline and client.poll() is None:
        time.sleep(0.005)
    server.kill()
    assert client.wait(60) != 0  # the client could not finish without its server
    assert len(packs()) >= 3
    server.start()  # same store, same port
    try:
        local = LocalStore(str(tmp_path / "srv"))
        assert check(local)["problems"] == []
        local.packs.recover()
        durable = local.totals()["chunk_raw_bytes"]
        assert durable > 0
        with Store(server.url) as s:
            r = s.push([str(big)], "cdc://big/big.bin", options=IngestOptions(max_pack_bytes=1 << 20))
            assert r.new_bytes == big.stat().st_size - durable  # nothing stored is sent twice
            assert r.sent_bytes < r.new_bytes + 256 * 1024 + durable // 100
            assert s.cat("cdc://big/big.bin") == big.read_bytes()
    finally:
        server.stop()


AUTH_TOKENS = {
    "w-all": {"scope": "write", "repos": ["*"]},
    "r-all": {"scope": "read", "repos": ["*"]},
    "w-a": {"scope": "write", "repos": ["a"]},
    "r-a": {"scope": "read", "repos": ["a"]},
}


@pytest.mark.served(tokens=AUTH_TOKENS)
def test_auth_matrix(server, tmp_path):
    f = tmp_path / "f.txt"
    f.write_bytes(b"secret")
    url = server.url
    with Store(url, token="w-all") as s:
        s.push([str(f)], "cdc://a/f.txt")
        s.push([str(f)], "cdc://b/f.txt")
    cases = [  # (token, operation, allowed)
        (None, "read-a", False), ("bogus", "read-a", False),
        ("r-all", "read-a", True), ("r-all", "read-b", True), ("r-all", "write-a", False),
        ("r-a", "read-a", True), ("r-a", "read-b", False), ("r-a", "write-a", False),
        ("w-a", "read-a", True), ("w-a", "write-a", True), ("w-a", "read-b", False), ("w-a", "write-b", False),
        ("w-all", "write-b", True),
    ]
    for token, op, allowed in cases:
        with Store(url, token=token, retries=0) as s:
            kind, repo = op.split("-")

            def run():
                if kind == "read":
                    return s.cat(f"cdc://{repo}/f.txt")
                return s.push([str(f)], f"cdc://{repo}/g-{token}.txt")

            if allowed:
                run()
            else:
                with pytest.raises(AccessDeniedError) as e:
                    run()
                assert ("401" in str(e.value) or "token" in str(e.value)), str(e.value)
    with Store(url, token="r-a") as s:
        assert s.repos() == ["a"]
    # status codes on the wire
    def status(token, method="GET", path="/v1/repos/a/branches"):
        c = http.client.HTTPConnection("127.0.0.1", server.port)
        c.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
        r = c.getresponse()
        body = r.read()
        return r.status, json.loads(body) if body else None

    assert status(None)[0] == 401
    assert status("r-a", "GET", "/v1/repos/b/branches")[0] == 403
    assert status("r-a", "POST", "/v1/chunks/query")[0] == 403


def test_serving_open_on_a_public_address_needs_a_flag(tmp_path):
    LocalStore.init(str(tmp_path / "srv"))
    p = subprocess.run([sys.executable, "-m", "cdcstore", "serve", "--store", str(tmp_path / "srv"),
                        "--host", "0.0.0.0", "--port", "0"], capture_output=True, timeout=60)
    assert p.returncode != 0 and b"--tokens" in p.stderr and b"Traceback" not in p.stderr


def raw(server, method, path, body=b"", headers=None):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def make_pack(chunks, lie=False):
    buf = io.BytesIO()
    w = PackWriter(buf)
    for c in chunks:
        cid = ids.digest(c if not lie else c + b"x")
        w.add(cid, CODEC_RAW, c, len(c))
    name = w.finish()
    return name, buf.getvalue()


def test_bad_input_gets_4xx_with_json(server):
    name, pack = make_pack([golden_input(5000), b"abc"])
    cases = [
        ("PUT", f"/v1/packs/{name}", pack[:-10], {}, 422),  # truncated
        ("PUT", "/v1/packs/" + make_pack([b"hello"], lie=True)[0], make_pack([b"hello"], lie=True)[1], {}, 422),
        ("PUT", "/v1/packs/nothex", pack, {}, 400),
        ("PUT", f"/v1/packs/{name}", b"", {"Content-Length": str(10**12)}, 413),
        ("POST", "/v1/chunks/query", b"x" * 17, {}, 400),
        ("GET", "/v1/repos/..%2F..%2Fetc/branches", b"", {}, 400),
        ("GET", "/v1/repos/%2Fetc/branches", b"", {}, 400),
        ("GET", "/v1/repos/a/resolve/..", b"", {}, 400),
        ("POST", "/v1/repos/a/commits", b"{not json", {}, 400),
        ("POST", "/v1/repos/a/commits", json.dumps({"commit": "{}", "branch": "main"}).encode(), {}, 400),
        ("POST", "/v1/manifests", b"\xff\xff\xff\xff", {}, 400),
        ("GET", "/v1/repos/a/packs/" + name, b"", {}, 404),
    ]
    for method, path, body, headers, expect in cases:
        if headers.get("Content-Length"):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {10**12}\r\n\r\n".encode())
            reply = s.recv(4096)
            s.close()
            assert f" {expect} ".encode() in reply.split(b"\r\n")[0], reply[:200]
            continue
        status, data = raw(server, method, path, body, headers)
        assert status == expect, (method, path, status, data[:200])
        assert "error" in json.loads(data)
    # a commit with '..' in a file path is refused
    commit = json.dumps({"format": 1, "repo": "a", "parent": None, "message": "m", "time": 0.0,
                         "files": {"../evil": {"manifest": "0" * 32, "size": 1}}})
    doc = json.dumps({"commit": commit, "branch": "main", "expected": None}).encode()
    status, data = raw(server, "POST", "/v1/repos/a/commits", doc)
    assert status == 400 and b"'..'" in data
    # and the server is still healthy
    assert raw(server, "GET", "/v1/health")[0] == 200


def test_429_retry_after_is_waited_out(tmp_path):
    LocalStore.init(str(tmp_path / "srv"))
    server = ServerProcess(str(tmp_path / "srv"), "--max-heavy", "1").start()
    try:
        name, pack = make_pack([golden_input(100_000)])
        # hold the only heavy slot with an upload that sends half its body, then waits
        hold = socket.create_connection(("127.0.0.1", server.port))
        hold.sendall(f"PUT /v1/packs/{name} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(pack)}\r\n\r\n".encode()
                     + pack[:1000])
        time.sleep(0.3)
        f = tmp_path / "f.bin"
        f.write_bytes(golden_input(300_000))
        release = threading.Timer(1.5, lambda: hold.sendall(pack[1000:]))
        release.start()
        t0 = time.time()
        with Store(server.url) as s:
            r = s.push([str(f)], "cdc://r/f.bin")
        elapsed = time.time() - t0
        release.join()
        assert r.changed and elapsed >= 1.0
        assert '" 429 ' in server.log_text()
        hold.recv(4096)
        hold.close()
    finally:
        server.stop()


def test_a_store_filled_locally_is_readable_through_its_server(server, tmp_path):
    f = tmp_path / "local.bin"
    f.write_bytes(golden_input(300_000))
    with Store(server.store) as local:
        local.push([str(f)], "cdc://loc/local.bin")
        local.rebuild_index()  # and the access records survive an index rebuild
    with Store(server.url) as s:
        assert s.cat("cdc://loc/local.bin") == f.read_bytes()


def test_pull_over_an_older_copy_fetches_only_changed_chunks(server, tmp_path):
    f = tmp_path / "src" / "a.bin"
    f.parent.mkdir()
    f.write_bytes(golden_input(6_000_000))
    out = tmp_path / "out"
    with Store(server.url) as s:
        s.push([str(f.parent)], "cdc://r/")
        s.pull("cdc://r/", str(out))
        edited = bytearray(golden_input(6_000_000))
        edited[3_000_000:3_000_003] = b"new"
        f.write_bytes(bytes(edited))
        v2 = s.push([str(f.parent)], "cdc://r/")
        p = s.pull("cdc://r/", str(out))
    assert (out / "a.bin").read_bytes() == bytes(edited)
    assert p.received_bytes < v2.new_bytes + 64 * 1024  # not the whole 6 MB file


def test_a_stalled_server_times_out_with_an_error(tmp_path):
    from cdcstore import RemoteError

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = []
    stop = threading.Event()

    def accept_and_stall():  # reads requests, never answers
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
                accepted.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept_and_stall, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.time()
        with Store(url, timeout=1.0, retries=1, backoff=0.05) as s:
            with pytest.raises(RemoteError, match="timed out"):
                s.ls("cdc://r/")
        assert time.time() - t0 < 15 and accepted
    finally:
        stop.set()
        t.join()
        for c in accepted:
            c.close()
        listener.close()


def test_a_damaged_range_among_many_is_an_error_and_never_cached(server, tmp_path):
    """A read of several 8 MiB ranges verifies each as it lands: one flipped byte in the
    server's pack gives CorruptionError, and no damaged chunk reaches the cache."""
    import glob

    from cdcstore import CorruptionError
    from cdcstore.storage.cache import ChunkCache
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(20_000_000)  # incompressible: about 20 MB of pack, three ranges
    (src / "f.bin").write_bytes(data)
    with Store(server.url, cache=False) as s:
        s.push([str(src)], "cdc://r/")
    pack, = glob.glob(os.path.join(server.store, "**", "*.pack"), recursive=True)
    with open(pack, "r+b") as f:
        f.seek(13_000_000)
        byte = f.read(1)
        f.seek(13_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    cache = ChunkCache(str(tmp_path / "c.sqlite"))
    with Store(server.url, cache=cache) as s:
        with pytest.raises(CorruptionError):
            s.cat("cdc://r/f.bin")
    cache.wait()
    rows = [(cid, codec, open(f"{cache.path}-chunks/{seg}.seg", "rb").read()[off:off + size])
            for cid, codec, seg, off, size in cache.conn.execute("SELECT id, codec, seg, off, size FROM chunks")]
    assert all(codec == CODEC_RAW and ids.digest(d) == cid for cid, codec, d in rows)  # random data: stored raw
    assert sum(len(d) for _, _, d in rows) < len(data)  # not the damaged chunk, at least


def test_a_pinned_commit_asks_for_its_metadata_once(server, tmp_path):
    """Commits and manifests are immutable: a second read of the same pinned file skips
    resolve, commit and manifest requests (only locate and the chunk ranges remain); a
    branch is still resolved every time (it moves)."""
    (tmp_path / "a.bin").write_bytes(golden_input(500_000))
    with Store(server.url, cache=False) as s:
        v1 = s.push([str(tmp_path / "a.bin")], "cdc://pin/")
        first = s.counters()["requests"]
        assert s.cat(f"cdc://pin@{v1.commit}/a.bin") == golden_input(500_000)
        second = s.counters()["requests"]
        assert s.cat(f"cdc://pin@{v1.commit}/a.bin") == golden_input(500_000)
        third = s.counters()["requests"]
        assert third - second <= second - first - 2
        s.cat("cdc://pin/a.bin")
        fourth = s.counters()["requests"]
        s.cat("cdc://pin/a.bin")
        assert s.counters()["requests"] - fourth >= 1 + (third - second)  # the branch is asked again


def test_a_folder_pull_locates_all_its_files_at_once(server, tmp_path):
    """A pull of a folder asks for its manifests together and locates every file's
    chunks in one request, not one locate per file; the files are still exact."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}.bin").write_bytes(golden_input(200_000 + i)[::-1] + bytes([i]) * 1000)
    with Store(server.url, cache=False) as s:
        s.push([str(src)], "cdc://many/")
        before = server.log_text().count("/locate")
        p = s.pull("cdc://many/", str(tmp_path / "out"))
        assert server.log_text().count("/locate") - before == 1
        assert p.written_files == 6
    for i in range(6):
        assert (tmp_path / "out" / f"f{i}.bin").read_bytes() == (src / f"f{i}.bin").read_bytes()


def test_a_reused_readinto_buffer_never_reaches_the_chunk_cache(server, tmp_path):
    """readinto lands a server's chunks in the caller's buffer, and the chunk cache stores them in
    the background: it must store its own copy, so that a caller who writes the buffer again at once
    (a buffer reused for every read, or libfuse's reply buffer, freed when the callback returns)
    cannot change what the cache holds. A second reader then finds every chunk in the cache, right."""
    data = os.urandom(6 << 20)
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    with Store(server.url) as up:
        up.push([str(p)], "cdc://r/f.bin", options=IngestOptions(zstd_level=0))
    cache = str(tmp_path / "cache")
    got = bytearray()
    with Store(server.url, cache=cache) as s:
        buf = bytearray(1 << 20)
        with s.open("cdc://r/f.bin") as f:
            while n := f.readinto(buf):
                got += buf[:n]
                buf[:] = b"\xff" * len(buf)  # the caller's buffer, written again at once
    assert bytes(got) == data
    with Store(server.url, cache=cache) as s:
        assert s.cat("cdc://r/f.bin") == data
        assert s.cache_counters()["cache_misses"] == 0, s.cache_counters()
        assert s.counters()["received_bytes"] < len(data) // 10

"""A real `cdcstore serve` under hostile input: bombs, slow clients, garbage on every
endpoint, a full disk, damaged stores. The server must answer every request with a
JSON 4xx (never a 5xx), keep its memory bounded, and keep serving honest clients."""
import http.client
import io
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
import zstandard

from cdcstore import Store
from cdcstore.core import ids
from cdcstore.core.chunker import MAX_CHUNK_BYTES
from cdcstore.remote.client.store import RemoteStore, UPLOAD_PREFIX
from cdcstore.core.commit import Commit, FileEntry
from cdcstore.core.errors import CorruptionError, RemoteError
from cdcstore.core.manifest import Manifest
from cdcstore.core.pack import CODEC_RAW, CODEC_ZSTD, PackWriter
from cdcstore.storage.check import check as check_store
from cdcstore.storage.repository import LocalStore
from conftest import golden_input
from server_util import ServerProcess

ZERO_ID = "0" * 32


class Probe:
    """Raw HTTP requests to a server, counting how many were sent and how many got a 5xx."""

    def __init__(self, port: int):
        self.port = port
        self.sent = 0
        self.errors_5xx: list[tuple] = []

    def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, bytes]:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
        finally:
            c.close()
        return self._count(method, path, r.status, data)

    def raw(self, payload: bytes, close_after: bool = False) -> tuple[int, bytes]:
        """Send bytes as they are; the status of the reply (0: the server closed without one)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        try:
            s.sendall(payload)
            if close_after:
                s.shutdown(socket.SHUT_WR)
            reply = b""
            while b"\r\n\r\n" not in reply:
                block = s.recv(65536)
                if not block:
                    break
                reply += block
        except (ConnectionResetError, BrokenPipeError):
            reply = b""
        finally:
            s.close()
        status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else 0
        return self._count("RAW", payload[:60], status, reply)

    def _count(self, method, path, status, data) -> tuple[int, bytes]:
        self.sent += 1
        if status >= 500:
            self.errors_5xx.append((method, path, status, data[:200]))
        return status, data


def peak_rss_mb(pid: int) -> float:
    """The peak resident set size of a process (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def make_pack(chunks: list[tuple[bytes, int, bytes, int]]) -> tuple[str, bytes]:
    """A pack of (chunk id, codec, stored bytes, raw length) records, as given (lies included)."""
    buf = io.BytesIO()
    w = PackWriter(buf)
    for cid, codec, stored, raw_len in chunks:
        w.add(cid, codec, stored, raw_len)
    return w.finish(), buf.getvalue()


def zeros_frame(size: int, content_size: bool = True) -> bytes:
    """A small zstd frame that decompresses to `size` zero bytes (built in 1 MiB steps)."""
    c = zstandard.ZstdCompressor(level=1, write_content_size=content_size)
    obj = c.compressobj(size=size if content_size else -1)
    block = bytes(1 << 20)
    out = [obj.compress(block[:min(len(block), size - i)]) for i in range(0, size, len(block))]
    return b"".join(out) + obj.flush()


def commit_json(**fields) -> str:
    doc = {"format": 1, "repo": "a", "parent": None, "message": "m", "time": 1.0,
           "files": {"f": {"manifest": ZERO_ID, "size": 1}}}
    doc.update(fields)
    return json.dumps(doc)


# -- 1. zstd bombs --------------------------------------------------------------------------
def test_zstd_bombs_are_refused_before_decompressing_with_bounded_memory(server, record_property):
    """100 uploads of small packs whose chunks decompress to 1 GiB (declared, undeclared,
    and behind an honest-looking raw length): each is a 422, nothing is stored, and the
    server's peak RSS stays far below one bomb."""
    bomb = zeros_frame(1 << 30)
    hidden = zeros_frame(256 << 20, content_size=False)
    assert len(bomb) < 64 * 1024 and len(hidden) < 64 * 1024
    probe = Probe(server.port)
    kinds = [
        lambda i: [(ids.digest(b"%d" % i), CODEC_ZSTD, bomb, 1 << 30)],  # claims 1 GiB
        lambda i: [(ids.digest(b"%d" % i), CODEC_ZSTD, bomb, 1000)],  # frame claims 1 GiB
        lambda i: [(ids.digest(b"%d" % i), CODEC_ZSTD, hidden, MAX_CHUNK_BYTES)],  # size not declared
        lambda i: [(ids.digest(b"%d" % i), CODEC_RAW, b"x" * 10, 1 << 31)],
    ]
    statuses = []
    for i in range(100):
        name, pack = make_pack(kinds[i % len(kinds)](i))
        status, body = probe.request("PUT", f"/v1/packs/{name}", pack)
        statuses.append(status)
        assert status == 422, body
        assert "error" in json.loads(body)
    rss = peak_rss_mb(server.proc.pid)
    print(f"\nzstd bombs: {len(statuses)} uploads, all 422; server peak RSS {rss:.0f} MB")
    record_property("bomb_uploads", len(statuses))
    record_property("server_peak_rss_mb", round(rss))
    assert rss < 300
    assert not probe.errors_5xx
    assert json.loads(probe.request("GET", "/v1/stats")[1])["chunks"] == 0


def test_decode_refuses_raw_lengths_over_the_format_maximum():
    from cdcstore.core.pack import decode_chunk, read_index
    cid = ids.digest(b"x")
    with pytest.raises(CorruptionError, match="maximum chunk size"):
        decode_chunk(zeros_frame(1 << 20), CODEC_ZSTD, MAX_CHUNK_BYTES + 1, cid)
    _, pack = make_pack([(cid, CODEC_RAW, b"x", MAX_CHUNK_BYTES + 1)])
    with pytest.raises(CorruptionError, match="maximum chunk size"):
        read_index(io.BytesIO(pack), len(pack))


# -- 2. slow clients -------------------------------------------------------------------------
def test_slow_uploads_lose_their_slots_and_honest_pushes_go_on(tmp_path):
    """8 uploads dribbling one byte every 0.3 s into a server with 4 slots: those that
    got a slot get a 408 once under the minimum rate, and a real push meanwhile succeeds."""
    LocalStore.init(str(tmp_path / "srv"))
    server = ServerProcess(str(tmp_path / "srv"), "--max-heavy", "4", "--body-timeout", "1",
                           "--min-body-rate", "1000").start()
    try:
        name, pack = make_pack([(ids.digest(b"slow"), CODEC_RAW, b"slow", 4)])
        results = []

        def dribble():
            s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            s.sendall(f"PUT /v1/packs/{name} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n".encode())
            reply, t0 = b"", time.time()
            try:
                s.setblocking(False)
                while time.time() - t0 < 20 and not reply:
                    try:
                        s.send(b"x")
                        reply = s.recv(4096)
                    except BlockingIOError:
                        time.sleep(0.3)
                    except OSError:
                        break
            finally:
                s.close()
            results.append(reply.split(b"\r\n")[0])

        threads = [threading.Thread(target=dribble) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # every slot is taken by now
        data = tmp_path / "data"
        data.mkdir()
        (data / "f.bin").write_bytes(golden_input(300_000))
        t0 = time.time()
        with Store(server.url, cache=False, retries=8, max_backoff=1.0) as s:
            s.push([str(data)], "cdc://ds/")
            assert s.cat("cdc://ds/f.bin") == golden_input(300_000)
        push_seconds = time.time() - t0
        for t in threads:
            t.join(30)
        assert len(results) == 8
        assert all(b" 408 " in r or b" 429 " in r for r in results), results  # 429: no slot left
        assert sum(b" 408 " in r for r in results) >= 4, results
        assert push_seconds < 15
    finally:
        server.stop()


def test_an_idle_body_gets_408(tmp_path):
    LocalStore.init(str(tmp_path / "srv"))
    server = ServerProcess(str(tmp_path / "srv"), "--body-timeout", "0.5").start()
    try:
        t0 = time.time()
        status, body = Probe(server.port).raw(
            b"POST /v1/manifests HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        assert status == 408 and time.time() - t0 < 5
    finally:
        server.stop()


# -- 3. manifest batches ---------------------------------------------------------------------
def empty_manifests(n: int) -> list[Manifest]:
    return [Manifest([], [], 0, ids.legacy_digest(b"%d" % i)) for i in range(n)]


def test_manifest_batches_are_capped_and_the_client_splits_them(server):
    from cdcstore.core import wire
    n = wire.MAX_MANIFESTS_PER_REQUEST + 1
    manifests = empty_manifests(n)
    body = wire.encode_blobs([m.encode() for m in manifests])
    status, data = Probe(server.port).request("POST", "/v1/manifests", body)
    assert status == 413 and b"limit" in data
    assert not os.listdir(os.path.join(server.store, "manifests"))
    r = RemoteStore(server.url)
    try:
        names = r.put_manifests(manifests)
        assert len(names) == n and r.counters()["requests"] == 2
    finally:
        r.close()


def test_put_manifests_syncs_only_its_own_files(tmp_path):
    s = LocalStore.init(str(tmp_path / "s"))
    real_sync = os.sync
    os.sync = lambda: (_ for _ in ()).throw(AssertionError("system-wide sync"))
    try:
        names = s.put_manifests(empty_manifests(100))
    finally:
        os.sync = real_sync
    assert all(os.path.isfile(s.manifest_path(n)) for n in names)
    assert not os.listdir(os.path.join(s.root, "tmp"))
    s.close()


# -- 4. garbage on every endpoint ------------------------------------------------------------
def garbage_requests(pack_name: str, pack: bytes, cid: str) -> list[tuple[str, str, bytes, dict]]:
    """(method, path, body, headers) for every endpoint, each broken in its own way."""
    out = []
    names = ["x", "..", "%2e%2e", "%2F", "a" * 300, "0" * 31, "0" * 33, "G" * 32, "%00", "%C3%A9", "%ff", "a%20b", "-a",
             "a.lock", "%25", ZERO_ID, pack_name]
    for n in names:
        for method in ("GET", "HEAD", "PUT", "POST", "DELETE", "PATCH"):
            out += [(method, f"/v1/packs/{n}", b"", {}),
                    (method, f"/v1/repos/{n}/branches", b"", {}),
                    (method, f"/v1/repos/a/resolve/{n}", b"", {}),
                    (method, f"/v1/repos/a/commits/{n}", b"", {}),
                    (method, f"/v1/repos/a/manifests/{n}", b"", {}),
                    (method, f"/v1/repos/a/packs/{n}", b"", {}),
                    (method, f"/v1/repos/{n}/locate", b"", {})]
    for path in ("/v1/health", "/v1/stats", "/v1/repos", "/v1/chunks/query", "/v1/chunks/prove", "/v1/manifests",
                 "/v1/repos/a/commits", "/v1/repos/a/tags", "/v1/repos/a/branches", "/v1/", "/", "/v1/packs/", "/v2/health", "/v1/../etc/passwd"):
        for method in ("GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"):
            out.append((method, path, b"", {}))
    bodies = [b"", b"x", b"x" * 17, b"\xff" * 1000, b"\x00\x00\x00\xff" + b"x" * 10, b"{}", b"[]", b"null",
              b"[" * 100_000, b"{\"a\":" * 50_000, b"1" * 100_000, b"\"\\ud800\"", os.urandom(70_000),
              bytes(16 * 70_000), b"1e400", b"-0", b"\xef\xbb\xbf{}"]
    for body in bodies:
        for path in ("/v1/chunks/query", "/v1/chunks/prove", "/v1/manifests", "/v1/repos/a/commits",
                     "/v1/repos/a/locate", "/v1/repos/a/tags", "/v1/repos/a/branches"):
            out.append(("POST", path, body, {}))
        out.append(("PUT", f"/v1/packs/{pack_name}", body, {}))
    # wrong JSON shapes and types for a commit
    commits = [123, None, [], {}, "", "{}", "[]", "null", commit_json(time=float("nan")).replace("NaN", "NaN"),
               commit_json(time=1e300), commit_json(time="now"), commit_json(time=True), commit_json(time=-1),
               commit_json(parent="x"), commit_json(parent=ZERO_ID[:-1] + "/"), commit_json(parent=123),
               commit_json(parent="../../packs"), commit_json(parent="packs"), commit_json(repo="b"),
               commit_json(repo=5), commit_json(message=5), commit_json(message="x" * 100_000),
               commit_json(files=[]), commit_json(files={"f": 1}), commit_json(files={"f": {}}),
               commit_json(files={"f": {"manifest": 5, "size": 1}}),
               commit_json(files={"f": {"manifest": ZERO_ID, "size": "1"}}),
               commit_json(files={"f": {"manifest": ZERO_ID, "size": -1}}),
               commit_json(files={"f": {"manifest": ZERO_ID, "size": 2 ** 64}}),
               commit_json(files={"/abs": {"manifest": ZERO_ID, "size": 1}}),
               commit_json(files={"a/../b": {"manifest": ZERO_ID, "size": 1}}),
               commit_json(files={"": {"manifest": ZERO_ID, "size": 1}}),
               commit_json(files={"a": {"manifest": ZERO_ID, "size": 1}, "a/b": {"manifest": ZERO_ID, "size": 1}}),
               commit_json(format=2), commit_json(format="1"),
               commit_json().replace('"size":1', '"size":1e400').replace('"size": 1', '"size": 1e400'),
               commit_json().replace('"time": 1.0', '"time": ' + "9" * 5000),
               commit_json().replace('"time": 1.0', '"time": Infinity'),
               commit_json().replace('"time": 1.0', '"time": ' + "[" * 10_000 + "]" * 10_000)]
    for c in commits:
        for extra in ({"branch": "main"}, {"branch": 5}, {"branch": "../x"}, {"branch": "main", "expected": 5},
                      {"branch": "main", "expected": "nothex"}, {}):
            out.append(("POST", "/v1/repos/a/commits", json.dumps({"commit": c, **extra}).encode(), {}))
    out.append(("POST", "/v1/repos/a/commits", b'{"commit": 1e400, "branch": "main"}', {}))
    # header tricks
    for headers in ({"Authorization": "Bearer"}, {"Authorization": "bearer \x7f"}, {"Range": "bytes=999999999-"},
                    {"Range": "bytes=5-1"}, {"Range": "garbage"}, {"Content-Type": "application/json; charset=x"},
                    {"Transfer-Encoding": "gzip"}, {"Content-Encoding": "gzip"}, {"Expect": "100-continue"}):
        for method, path in (("GET", f"/v1/repos/a/packs/{pack_name}"), ("PUT", f"/v1/packs/{pack_name}"),
                             ("POST", "/v1/repos/a/commits"), ("GET", "/v1/stats")):
            out.append((method, path, b"{}", headers))
    # packs that lie
    out += [("PUT", f"/v1/packs/{pack_name}", pack[:-1], {}), ("PUT", f"/v1/packs/{pack_name}", pack + b"x", {}),
            ("PUT", f"/v1/packs/{pack_name}", pack[:16] + pack[-32:], {})]
    return out


def raw_requests(port: int, pack_name: str, pack: bytes) -> list[tuple[bytes, bool]]:
    """Requests that http.client would not send: wrong lengths, chunked garbage, aborts."""
    head = f"PUT /v1/packs/{pack_name} HTTP/1.1\r\nHost: x\r\n".encode()
    return [
        (head + b"Content-Length: 100\r\n\r\n" + pack[:10], True),  # aborted mid-body
        (head + f"Content-Length: {len(pack)}\r\n\r\n".encode() + pack[:len(pack) // 2], True),
        (head + b"Content-Length: -5\r\n\r\n", True),
        (head + b"Content-Length: 99999999999999999999999\r\n\r\n", True),
        (head + b"Content-Length: abc\r\n\r\n", True),
        (head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n", True),
        (head + b"Transfer-Encoding: chunked\r\n\r\n" + b"5\r\nabcde\r\n", True),  # aborted chunked
        (head + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nabcde", True),
        (b"POST /v1/manifests HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n\x00\x00\x00\x10abc", True),
        (b"POST /v1/repos/a/commits HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"commit\"", True),
        (b"GET /v1/health HTTP/9.9\r\n\r\n", True),
        (b"GARBAGE\r\n\r\n", True),
        (b"GET " + b"/a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 100_000 + b"\r\n\r\n", True),
        (b"GET /v1/repos/\xff\xfe/branches HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", True),  # a TLS hello
    ]


def test_garbage_on_every_endpoint_never_gets_a_5xx(server, tmp_path, record_property):
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.bin").write_bytes(golden_input(100_000))
    with Store(server.url, cache=False) as s:
        s.push([str(data)], "cdc://a/")
    with open(os.path.join(server.store, "repos", "a", "branches", "main")) as f:
        head = f.read().strip()
    probe = Probe(server.port)
    cid = ids.digest(b"g")
    pack_name, pack = make_pack([(cid, CODEC_RAW, b"g", 1)])
    t0 = time.time()
    not_json = []
    for method, path, body, headers in garbage_requests(pack_name, pack, cid.hex()):
        status, reply = probe.request(method, path, body, headers)
        parser_400 = status == 400 and headers  # aiohttp's own HTTP parser refused a header, in plain text
        if status >= 400 and method != "HEAD" and not reply.startswith(b"{") and not parser_400:
            not_json.append((method, path, status, reply[:100]))
    for payload, close in raw_requests(server.port, pack_name, pack):
        probe.raw(payload, close)
    # a parent that is a folder on the server, and one that names a real commit of another repo
    for parent in ("commits", head):
        probe.request("POST", "/v1/repos/a/commits",
                      json.dumps({"commit": commit_json(parent=parent), "branch": "main"}).encode())
    seconds = time.time() - t0
    log = server.log_text()
    print(f"\nhostile requests: {probe.sent} sent in {seconds:.1f} s, {len(probe.errors_5xx)} answered 5xx")
    record_property("hostile_requests", probe.sent)
    record_property("hostile_5xx", len(probe.errors_5xx))
    assert not probe.errors_5xx, probe.errors_5xx[:5]
    assert not not_json, not_json
    assert "Traceback" not in log and "internal error" not in log
    assert "client went away mid-body" in log
    # and the server still serves honest clients
    with Store(server.url, cache=False) as s:
        assert s.cat("cdc://a/f.bin") == golden_input(100_000)


# -- 4b. a full disk -------------------------------------------------------------------------
def _limit_file_size():
    """preexec_fn: files over 1 MB fail with EFBIG (a full disk, where no tmpfs can be mounted)."""
    import resource
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))


def start_server(store: str, *args: str, log_dir: str, preexec_fn=None) -> ServerProcess:
    """ServerProcess.start, with a preexec_fn for the server process and its log in `log_dir`."""
    from server_util import wait_until_up
    import urllib.request
    server = ServerProcess(store, *args)
    server.log_path = os.path.join(log_dir, f"server-{server.port}.log")
    server.log = open(server.log_path, "ab")
    server.proc = subprocess.Popen(
        [sys.executable, "-m", "cdcstore", "serve", "--store", store, "--port", str(server.port), *args],
        stdout=server.log, stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
    wait_until_up(server.proc, urllib.request.Request(server.url + "/v1/health"), server.log_text)
    return server


def test_a_full_disk_is_a_507_that_the_client_does_not_retry(tmp_path):
    """The store on a 2 MB tmpfs (or, without one, under RLIMIT_FSIZE): a 4 MB push
    gets 507 "disk full" at once, leaves no temp files, and the server goes on."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                             capture_output=True).returncode == 0
    LocalStore.init(str(mnt / "srv"))
    server = start_server(str(mnt / "srv"), log_dir=str(tmp_path), preexec_fn=None if mounted else _limit_file_size)
    try:
        data = tmp_path / "data"
        data.mkdir()
        (data / "big.bin").write_bytes(os.urandom(4_000_000))
        t0 = time.time()
        with Store(server.url, cache=False) as s:
            with pytest.raises(RemoteError, match="disk is full") as e:
                s.push([str(data)], "cdc://ds/")
        assert time.time() - t0 < 10 and "507" in str(e.value)
        assert not os.listdir(mnt / "srv" / "tmp"), "temp files left on the full disk"
        assert Probe(server.port).request("GET", "/v1/health")[0] == 200
        log = server.log_text()
        assert "Traceback" not in log and "disk full" in log
        print(f"\n{log.count('disk full on')} requests answered 507")
        assert log.count("disk full on") <= 4  # no retries: one per upload slot at most
        print(f"\nfull disk via {'tmpfs' if mounted else 'RLIMIT_FSIZE'}: 507, not retried")
    finally:
        server.stop()
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)])


# -- 5. commit validation --------------------------------------------------------------------
BAD_COMMITS = {
    "NaN time": commit_json().replace('"time": 1.0', '"time": NaN'),
    "infinite time": commit_json().replace('"time": 1.0', '"time": -Infinity'),
    "time 1e300": commit_json(time=1e300),
    "file and folder": commit_json(files={"a": {"manifest": ZERO_ID, "size": 1},
                                          "a/b": {"manifest": ZERO_ID, "size": 1}}),
    "'..'": commit_json(files={"../x": {"manifest": ZERO_ID, "size": 1}}),
    "absolute": commit_json(files={"/etc/x": {"manifest": ZERO_ID, "size": 1}}),
    "bad manifest": commit_json(files={"x": {"manifest": "zz", "size": 1}}),
    "float size": commit_json(files={"x": {"manifest": ZERO_ID, "size": 1.5}}),
    "huge size": commit_json(files={"x": {"manifest": ZERO_ID, "size": 2 ** 53}}),
    "bad parent": commit_json(parent="commits"),
    "bad repo": commit_json(repo="../x"),
    "long message": commit_json(message="x" * 70_000),
    "not an object": "[1]",
}


@pytest.mark.parametrize("why", sorted(BAD_COMMITS))
def test_invalid_commits_are_refused_when_decoded(why):
    with pytest.raises(CorruptionError, match="not a valid commit"):
        Commit.decode(BAD_COMMITS[why].encode())


def test_invalid_commits_are_never_encoded():
    for bad in (Commit("a", None, "m", math.nan, {}), Commit("a", None, "m", 1.0, {"../x": FileEntry(ZERO_ID, 1)}),
                Commit("a", "folder", "m", 1.0, {}), Commit("a", None, "m", 1.0, {"x": FileEntry(ZERO_ID, -1)})):
        with pytest.raises(ValueError):
            bad.encode()
    assert Commit.decode(Commit("a", None, "m", 1.5, {"d/x": FileEntry(ZERO_ID, 3)}).encode()).time == 1.5


def tamper_head(store: str, repo: str, text: str) -> str:
    """Write an invalid commit into a store (named by its hash) and point main at it."""
    cid = ids.hexdigest(text.encode())
    with open(os.path.join(store, "repos", repo, "commits", f"{cid}.json"), "w") as f:
        f.write(text)
    with open(os.path.join(store, "repos", repo, "branches", "main"), "w") as f:
        f.write(cid)
    return cid


@pytest.mark.parametrize("remote", [False, True])
def test_log_and_pull_of_a_tampered_commit_give_one_clear_line(tmp_path, remote):
    st = LocalStore.init(str(tmp_path / "srv"))
    st.close()
    data = tmp_path / "data"
    data.mkdir()
    (data / "f").write_bytes(b"hello")
    with Store(str(tmp_path / "srv")) as s:
        s.push([str(data)], "cdc://a/")
    tamper_head(str(tmp_path / "srv"), "a", commit_json(time=1e300))
    server = ServerProcess(str(tmp_path / "srv")).start() if remote else None
    try:
        where = server.url if remote else str(tmp_path / "srv")
        for args in (["log", "a"], ["pull", "cdc://a/", str(tmp_path / "out")]):
            p = subprocess.run([sys.executable, "-m", "cdcstore", *args, "--store", where],
                               capture_output=True, timeout=60)
            err = p.stderr.decode()
            assert p.returncode != 0 and "Traceback" not in err, err
            assert len(err.strip().splitlines()) == 1 and "time" in err, err
    finally:
        if server:
            server.stop()


# -- 6. recovery -----------------------------------------------------------------------------
def test_a_durable_unindexed_pack_is_indexed_by_push_and_at_start(tmp_path):
    """A server killed between making a pack durable and indexing it: the next push of
    the same content succeeds (HEAD/PUT index the found pack), and a restart indexes it."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.bin").write_bytes(golden_input(500_000))
    with Store(str(tmp_path / "twin"), create=True) as s:  # the same pack, built by a local push
        s.push([str(data)], "cdc://ds/")
    twin = LocalStore(str(tmp_path / "twin"))
    packs = list(twin.packs.iter_pack_names())
    for stage in ("running", "restart"):
        root = tmp_path / f"srv-{stage}"
        srv = LocalStore.init(str(root))
        for name in packs:  # durable, never indexed
            os.makedirs(os.path.dirname(srv.packs.pack_path(name)), exist_ok=True)
            shutil.copy(twin.packs.pack_path(name), srv.packs.pack_path(name))
        srv.close()
        server = ServerProcess(str(root), "--maintenance-interval", "3600")
        if stage == "running":
            server.start()
            server.kill()  # a kill -9 leaves the pack unindexed
        server.start()
        try:
            stats = json.loads(Probe(server.port).request("GET", "/v1/stats")[1])
            assert stats["packs"] == len(packs)  # recovered at start
            with Store(server.url, cache=False) as s:
                s.push([str(data)], "cdc://ds/")
                assert s.cat("cdc://ds/f.bin") == golden_input(500_000)
        finally:
            server.stop()
        check = check_store(LocalStore(str(root)))
        assert not check.get("problems"), check
    twin.close()


def test_head_and_put_index_a_pack_found_on_disk(server, tmp_path):
    cid = ids.digest(b"found")
    name, pack = make_pack([(cid, CODEC_RAW, b"found", 5)])
    probe = Probe(server.port)
    st = LocalStore(server.store)
    os.makedirs(os.path.dirname(st.packs.pack_path(name)), exist_ok=True)
    with open(st.packs.pack_path(name), "wb") as f:
        f.write(pack)
    assert probe.request("HEAD", f"/v1/packs/{name}")[0] == 200
    assert st.index.present([cid]) == {cid}
    # a damaged found pack counts as absent, and a PUT of the real bytes replaces it
    name2, pack2 = make_pack([(ids.digest(b"other"), CODEC_RAW, b"other", 5)])
    os.makedirs(os.path.dirname(st.packs.pack_path(name2)), exist_ok=True)
    with open(st.packs.pack_path(name2), "wb") as f:
        f.write(pack2[:20] + b"X" + pack2[21:])
    assert probe.request("HEAD", f"/v1/packs/{name2}")[0] == 404
    assert probe.request("PUT", f"/v1/packs/{name2}", pack2)[0] == 201
    st.close()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_dead_temp_files_are_removed_on_server_and_client(tmp_path):
    import tempfile
    LocalStore.init(str(tmp_path / "srv"))
    tmpdir = tmp_path / "srv" / "tmp"
    dead = _dead_pid()
    (tmpdir / f"{dead}-0123456789abcdef.tmp").write_bytes(b"x" * 1000)
    server = ServerProcess(str(tmp_path / "srv"), "--maintenance-interval", "0.3").start()
    try:
        assert not os.listdir(tmpdir)  # at start
        (tmpdir / f"{dead}-later.tmp").write_bytes(b"x")
        deadline = time.time() + 10
        while os.listdir(tmpdir) and time.time() < deadline:
            time.sleep(0.1)
        assert not os.listdir(tmpdir)  # periodically
        client_dead = os.path.join(tempfile.gettempdir(), f"{UPLOAD_PREFIX}{dead}-abc.pack")
        client_live = os.path.join(tempfile.gettempdir(), f"{UPLOAD_PREFIX}{os.getpid()}-abc.pack")
        for p in (client_dead, client_live):
            with open(p, "wb") as f:
                f.write(b"x")
        try:
            RemoteStore(server.url).close()
            assert not os.path.exists(client_dead) and os.path.exists(client_live)
        finally:
            for p in (client_dead, client_live):
                if os.path.exists(p):
                    os.unlink(p)
    finally:
        server.stop()


# -- 7. auth scheme and missing packs --------------------------------------------------------
def test_bearer_in_any_case_and_a_json_404_for_a_missing_pack(tmp_path):
    LocalStore.init(str(tmp_path / "srv"))
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"secret": {"scope": "write", "repos": ["*"]}}))
    server = ServerProcess(str(tmp_path / "srv"), "--tokens", str(tokens)).start()
    try:
        probe = Probe(server.port)
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
            assert probe.request("GET", "/v1/stats", headers={"Authorization": f"{scheme} secret"})[0] == 200
        assert probe.request("GET", "/v1/stats", headers={"Authorization": "Basic secret"})[0] == 401
        data = tmp_path / "data"
        data.mkdir()
        (data / "f.bin").write_bytes(golden_input(50_000))
        with Store(server.url, token="secret", cache=False) as s:
            s.push([str(data)], "cdc://ds/")
        st = LocalStore(str(tmp_path / "srv"))
        for name in list(st.packs.iter_pack_names()):
            os.unlink(st.packs.pack_path(name))
            status, body = probe.request("GET", f"/v1/repos/ds/packs/{name}", headers={"Authorization": "bearer secret"})
            assert status == 404 and "missing" in json.loads(body)["error"]
        st.close()
    finally:
        server.stop()

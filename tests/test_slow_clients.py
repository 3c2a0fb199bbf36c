"""Issue 31 case 6: denial of service by slowness. Slow readers hold read slots of their own
token only: 8 that never read (4 on each of two tokens) leave a third token's GETs answered at
once; a server that drips an answer fails the read like a stall; and the DataLoader workers of a
rank whose main process is SIGKILLed exit. Real server, real sockets, real loader processes."""
import os
import signal
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.storage.repository import LocalStore
from cdcstore.testing import FaultProxy
from conftest import raw_call as _call

TOKENS = {"tok-w": {"scope": "write", "repos": ["a"]}, "tok-r1": {"scope": "read", "repos": ["a"], "name": "r1"},
          "tok-r2": {"scope": "read", "repos": ["a"], "name": "r2"},
          "tok-r3": {"scope": "read", "repos": ["a"], "name": "r3"}}
MiB = 1 << 20


pytestmark = pytest.mark.served(tokens=TOKENS)  # the `server` of every test here


def _slow_reader(port: int, token: str, path: str, size: int) -> socket.socket:
    """A GET of `size` bytes whose answer is never read (its receive window stays tiny)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
              f"Range: bytes=0-{size - 1}\r\n\r\n".encode())
    return s


def test_slow_readers_of_two_tokens_leave_a_third_tokens_reads_alone(server, tmp_path):
    readers = []
    try:
        (tmp_path / "big.bin").write_bytes(os.urandom(40 * MiB))
        with Store(server.url, token="tok-w", cache=False) as s:
            s.push(str(tmp_path / "big.bin"), "cdc://a/big.bin")
        (pack,) = LocalStore(server.store).index.packs()
        path = f"/v1/repos/a/packs/{pack}"
        size = os.path.getsize(LocalStore(server.store).packs.pack_path(pack))
        for token in ("tok-r1", "tok-r2"):
            readers += [_slow_reader(server.port, token, path, min(size, 32 * MiB)) for _ in range(4)]
        time.sleep(1.5)  # each holds a read slot, blocked on a full socket
        answers = []
        for _ in range(3):
            t0 = time.monotonic()
            status, _ = _call(server.url + path, "tok-r3", headers={"Range": "bytes=0-1023"})
            answers.append((status, round(time.monotonic() - t0, 1)))
        refused = sum(st != 206 for st, _ in answers)
        print(f"\n8 slow readers on 2 tokens; a third token's 3 range GETs: {answers} ({refused} refused)")
        assert refused == 0 and all(t < 5 for _, t in answers), answers
    finally:
        for r in readers:
            r.close()


@pytest.mark.served(tokens=TOKENS, gateway=True)
def test_slow_gateway_readers_of_two_tokens_leave_a_third_tokens_gets_alone(server, tmp_path):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    s3_port, endpoint = server.s3_port, server.s3

    def s3(name: str, token: str):
        return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=name, aws_secret_access_key=token,
                            region_name="us-east-1", config=Config(retries={"max_attempts": 1}, signature_version="s3v4"))

    readers = []
    try:
        (tmp_path / "big.bin").write_bytes(os.urandom(40 * MiB))
        with Store(server.url, token="tok-w", cache=False) as s:
            s.push(str(tmp_path / "big.bin"), "cdc://a/big.bin")
        for name in ("r1", "r2"):
            url = s3(name, f"tok-{name}").generate_presigned_url(
                "get_object", Params={"Bucket": "a", "Key": "main/big.bin"}, ExpiresIn=600)
            target = url.split(endpoint, 1)[1]
            for _ in range(4):
                r = socket.socket()
                r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                r.connect(("127.0.0.1", s3_port))
                r.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{s3_port}\r\n\r\n".encode())
                readers.append(r)
        time.sleep(1.5)
        head = readers[0].recv(2000)
        assert head.startswith(b"HTTP/1.1 200"), head  # each is being answered, blocked on its socket
        victim, answers = s3("r3", "tok-r3"), []
        for _ in range(3):
            t0 = time.monotonic()
            try:
                body = victim.get_object(Bucket="a", Key="main/big.bin", Range="bytes=0-1023")["Body"].read()
                answers.append((len(body), round(time.monotonic() - t0, 1)))
            except ClientError as e:
                answers.append((e.response["Error"]["Code"], round(time.monotonic() - t0, 1)))
        refused = sum(a != 1024 for a, _ in answers)
        print(f"\n8 slow gateway readers on 2 tokens; a third token's 3 GETs: {answers} ({refused} refused)")
        assert refused == 0 and all(t < 5 for _, t in answers), answers
    finally:
        for r in readers:
            r.close()


def test_a_dripping_answer_fails_like_a_stall(server, tmp_path):
    """A proxy (a lying or broken middlebox) passes each answer's first 64 KiB at once, then drips
    the rest at 100 bytes/s: the client gives up as on a stall."""
    proxy = FaultProxy(server.port, drip_after=64 * 1024, drip_rate=100)
    try:
        data = os.urandom(2 * MiB)
        (tmp_path / "f.bin").write_bytes(data)
        with Store(server.url, token="tok-w", cache=False) as s:
            s.push(str(tmp_path / "f.bin"), "cdc://a/f.bin")
        env = {**os.environ, "CDCSTORE_TIMEOUT": "5", "CDCSTORE_TOKEN": "tok-r1",
               "CDCSTORE_CACHE": str(tmp_path / "c.sqlite")}
        t0 = time.monotonic()
        try:
            out = subprocess.run([sys.executable, "-m", "cdcstore", "cat", "cdc://a/f.bin",
                                  "--store", f"http://127.0.0.1:{proxy.port}"],
                                 capture_output=True, timeout=60, env=env)
            code, err = out.returncode, out.stderr.decode()
        except subprocess.TimeoutExpired:
            code, err = None, "still running after 60 s"
        took = time.monotonic() - t0
        print(f"\ncat through a 100 B/s drip (CDCSTORE_TIMEOUT=5): exit {code} after {took:.0f} s: "
              f"{err.strip().splitlines()[-1] if err.strip() else ''}")
        assert code not in (None, 0) and "stalled" in err and took < 40, (code, err[-500:])
    finally:
        proxy.close()


KILLED_RANK = """
import os, sys, time
import torch.utils.data as torch_data
from cdcstore.streaming.dataset import StreamingDataset
ds = StreamingDataset(sys.argv[2], store=sys.argv[1], batch_size=20_000, shuffle=True, seed=1)
it = iter(torch_data.DataLoader(ds.as_torch(), batch_size=None, num_workers=2))  # batches by value
next(it)
print(os.getpid(), flush=True)
time.sleep(600)
"""


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_the_workers_of_a_sigkilled_rank_exit(tmp_path):
    (tmp_path / "data").mkdir()
    for i in range(4):
        pq.write_table(pa.table({"x": list(range(i * 200_000, (i + 1) * 200_000)),
                                 "s": [f"row {j} of file {i}" for j in range(200_000)]}),
                       tmp_path / "data" / f"p{i}.parquet", row_group_size=20_000)
    store = str(tmp_path / "store")
    with Store.init(store) as s:
        s.push([str(tmp_path / "data")], "cdc://ds/train/")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RANK, store, "cdc://ds/train/"], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "CDCSTORE_CACHE": str(tmp_path / "c.sqlite")})
    try:
        assert int(proc.stdout.readline()) == proc.pid
        workers = [p for p in _children(proc.pid) if open(f"/proc/{p}/cmdline", "rb").read().startswith(
            open(f"/proc/{proc.pid}/cmdline", "rb").read().split(b"\0")[0])]
        assert len(workers) >= 2, workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 20
        while any(map(_alive, workers)) and time.time() < deadline:
            time.sleep(0.2)
        left = [p for p in workers if _alive(p)]
        print(f"\n{len(workers)} DataLoader workers of a SIGKILLed rank: {len(left)} alive "
              f"{20 - max(0, deadline - time.time()):.1f} s later")
        assert not left, "the workers outlive their rank"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in locals().get("left", []):
            os.kill(p, signal.SIGKILL)

"""obstore vs s3fs for cdcstore's object backend, against one moto S3 server on loopback.

Runs both clients side by side on the same server (moto 5.x in its own process, the
server the tests use: a correctness server that re-reads a whole object for each ranged
GET, so figures compare the clients, not S3). Both are measured through
cdcstore.storage.s3.S3Objects (what cdcstore ships), with the client forced.

Operations (each run alternates which client goes first; medians over RUNS runs):
  put_big     8 objects of 8 MiB, one after another (MB/s)
  put_small   200 objects of 4 KiB (ms each: manifests, commits)
  get_big     the 8 MiB objects read whole (MB/s)
  get_range   200 ranges of 64 KiB from a 2 MiB object (ms each)
  list        a listing of 2000 keys (ms per listing; 2 pages)
  create      100 create-only puts, If-None-Match: * (ms each)
  cas         100 compare-and-swaps of one ref, If-Match: etag (ms each)
  fork        a client used in the parent, then used in a forked child (works / hangs):
              obstore's own store, and S3Objects (which falls back to s3fs there)

Usage: python bench/objects.py [--runs N]. The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # cdcstore of this tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/harness.py

from harness import code_version, finish, med, rounds, start  # noqa: E402

BUCKET = "cdcstore-bench"
MB = 1 << 20
SERVER = ("from moto.server import ThreadedMotoServer; import time; "
          "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False); s.start(); "
          "print(s.get_host_and_port()[1], flush=True); time.sleep(1e9)")


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}"


class Client:
    """The operations through cdcstore.storage.s3.S3Objects with one client forced."""

    def __init__(self, name: str, endpoint: str, prefix: str):
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing",
                          AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        from cdcstore.storage.s3 import S3Objects
        self.name = name
        self.s = S3Objects(f"s3://{BUCKET}/{prefix}", client=name)

    def put(self, k, b):
        self.s.put(k, b)

    def get(self, k):
        return bytes(self.s.get(k))

    def get_range(self, k, off, n):
        return bytes(self.s.get_range(k, off, n))

    def list(self, prefix):
        return [i.name for i in self.s.list(prefix + "/")]

    def create(self, k, b):
        return self.s.put_if_absent(k, b)

    def cas(self, k, b, token):
        return self.s.put_if_match(k, b, token)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def one_run(client, run: int, big: bytes, small: bytes) -> dict:
    """Every operation once on a fresh prefix; returns the figures of this run."""
    p = f"r{run}"
    out = {}
    t = timed(lambda: [client.put(f"{p}/big/{i}", big) for i in range(8)])
    out["put_big_mb_s"] = 8 * len(big) / MB / t
    t = timed(lambda: [client.put(f"{p}/small/{i:04d}", small) for i in range(200)])
    out["put_small_ms"] = t / 200 * 1e3
    t = timed(lambda: [client.get(f"{p}/big/{i}") for i in range(8)])
    out["get_big_mb_s"] = 8 * len(big) / MB / t
    client.put(f"{p}/two", big[:2 * MB])
    offs = [(i * 7919 * 4096) % (2 * MB - 65536) for i in range(200)]
    got = []
    t = timed(lambda: got.extend(client.get_range(f"{p}/two", o, 65536) for o in offs))
    assert all(g == big[o:o + 65536] for g, o in zip(got, offs))
    out["get_range_ms"] = t / 200 * 1e3
    names = []
    t = timed(lambda: names.extend(client.list("listing")))
    assert len(names) == 2000, len(names)
    out["list_2000_ms"] = t * 1e3
    t = timed(lambda: [client.create(f"{p}/refs/{i:03d}", b"c") for i in range(100)])
    out["create_ms"] = t / 100 * 1e3
    token = client.create(f"{p}/head", b"0")

    def cas_chain():
        nonlocal token
        for i in range(100):
            token = client.cas(f"{p}/head", str(i + 1).encode(), token)
    out["cas_ms"] = timed(cas_chain) / 100 * 1e3
    return out


FORK_PROBE = """
import os, sys
sys.path.insert(0, {root!r})
import obstore
from obstore.store import S3Store
from cdcstore.storage.s3 import S3Objects
c = S3Objects("s3://{bucket}/forkprobe", client="{name}")
c.put("k-" + str(os.getpid()), b"x")
raw = S3Store("{bucket}", config=dict(endpoint={endpoint!r}, region="us-east-1", access_key_id="testing",
              secret_access_key="testing"), client_options=dict(allow_http=True))
pid = os.fork()
if pid == 0:
    if {raw}:
        obstore.get(raw, "forkprobe/k-" + str(os.getppid())).bytes()
    else:
        c.get("k-" + str(os.getppid()))
    os._exit(0)
os.waitpid(pid, 0)
print("ok")
"""


def fork_works(name: str, endpoint: str, raw: bool) -> bool:
    """Whether a client used before fork() still works in the child (10 s limit); `raw`:
    obstore's own store object, else S3Objects (which falls back to s3fs in the child)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = FORK_PROBE.format(root=root, name=name, bucket=BUCKET, endpoint=endpoint, raw=raw)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": root}, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=10)
        return out.strip() == "ok"
    except subprocess.TimeoutExpired:
        return False
    finally:  # the hung forked child too: the probe runs in its own process group
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    opening = start("objects")  # the load average before the run
    import boto3
    proc, endpoint = start_server()
    try:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        clients = [Client("obstore", endpoint, "ob"), Client("s3fs", endpoint, "fs")]
        for c in clients:  # the listing fixture: 2000 keys per client prefix
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: c.put(f"listing/{i:05d}", b"x"), range(2000)))
        big = os.urandom(8 * MB)
        small = os.urandom(4096)
        runs: dict[str, list[dict]] = {c.name: [] for c in clients}
        for run, c in rounds(clients, args.runs):
            runs[c.name].append(one_run(c, run, big, small))
        fig = {**opening, "server": "moto 5.x ThreadedMotoServer, own process, 127.0.0.1", "runs": args.runs,
               "code": code_version()}
        print(f"{'operation':<16}{'obstore':>12}{'s3fs':>12}{'obstore/s3fs':>14}")
        for key in runs["obstore"][0]:
            a, b = med([r[key] for r in runs["obstore"]]), med([r[key] for r in runs["s3fs"]])
            fig[key] = {"obstore": round(a, 3), "s3fs": round(b, 3), "ratio": round(a / b, 3)}
            print(f"{key:<16}{a:>12.2f}{b:>12.2f}{a / b:>14.2f}")
        fig["fork_works"] = {"obstore_raw": fork_works("obstore", endpoint, True),
                             "s3objects_obstore": fork_works("obstore", endpoint, False),
                             "s3fs": fork_works("s3fs", endpoint, False)}
        print(f"in a forked child: {fig['fork_works']} (s3objects_obstore: S3Objects falls back to s3fs)")
        print("(MB/s: higher is better; ms: lower is better; medians of the runs)")
    finally:
        proc.kill()
        proc.wait()
    finish(fig)


if __name__ == "__main__":
    main()

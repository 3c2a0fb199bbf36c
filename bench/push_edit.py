"""A one-file edit of a 2,000-file folder, pushed again: requests and seconds, through a
`cdcstore serve` and on a directory store, against the first push and the file pushed alone.

    PYTHONPATH=. python3 bench/push_edit.py [--files 2000] [--size 4096]
Run it with another tree first on PYTHONPATH to measure that tree (it uses only `Store.push`)."""
from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
import time

import harness
from cdcstore import Store
from cdcstore.storage.repository import LocalStore
from cdcstore.testing import ServerProcess


BUCKET_CALLS = [0]  # object-store calls (each one request or more) on a bucket


def count_bucket_calls() -> None:
    """Count the S3 client's calls (put, get, head, delete, list, folders) in this process."""
    from cdcstore.storage import s3

    for cls in (s3._Obstore, s3._S3fs):
        for name in ("put", "get", "head", "delete", "folders", "list"):
            real = getattr(cls, name)

            def counted(self, *a, _real=real, **kw):
                BUCKET_CALLS[0] += 1
                return _real(self, *a, **kw)

            setattr(cls, name, counted)


def run(location: str, folder: str, files: int) -> dict:
    has_cache = "stat_cache" in inspect.signature(Store.push).parameters
    out = {}
    with Store(location, cache=False) as s:
        def requests():
            return s.counters()["requests"] + BUCKET_CALLS[0]

        def push(label, src, dest, **kw):
            c0, t0 = requests(), time.perf_counter()
            r = s.push(src, dest, **kw)
            out[label] = {"requests": requests() - c0, "seconds": round(time.perf_counter() - t0, 2),
                          "unread_files": getattr(r, "unread_files", 0)}

        push("first push", folder, "cdc://ds/data/")
        with open(os.path.join(folder, "f00007.bin"), "r+b") as f:  # a one-file edit
            f.write(os.urandom(64))
        push("one-file edit", folder, "cdc://ds/data/")
        if has_cache:
            with open(os.path.join(folder, "f00008.bin"), "r+b") as f:
                f.write(os.urandom(64))
            push("one-file edit, --no-stat-cache", folder, "cdc://ds/data/", stat_cache=False)
        push("that one file alone", os.path.join(folder, "f00007.bin"), "cdc://ds/alone/f00007.bin")
    return out


def run_bucket(tmp: str, folder: str, files: int) -> dict:
    """The same on moto's S3 server (object-store calls counted)."""
    import boto3
    from moto import server as moto_server

    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    try:
        host, port = srv.get_host_and_port()
        os.environ.update({"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"})
        boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket="bench")
        Store.init("s3://bench/store").close()
        return run("s3://bench/store", folder, files)
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args()
    fig = harness.start("push_edit")
    fig["code"] = harness.code_version()
    results = {}
    count_bucket_calls()
    for where in ("server", "directory", "bucket"):
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
            folder = os.path.join(tmp, "src")
            os.makedirs(folder)
            for i in range(args.files):
                with open(os.path.join(folder, f"f{i:05d}.bin"), "wb") as f:
                    f.write(os.urandom(args.size))
            time.sleep(1.1)  # files older than the push's second: not racy
            if where != "bucket":
                LocalStore.init(os.path.join(tmp, "store")).close()
            if where == "server":
                srv = ServerProcess(os.path.join(tmp, "store")).start()
                try:
                    results[where] = run(srv.url, folder, args.files)
                finally:
                    srv.stop()
            elif where == "bucket":
                results[where] = run_bucket(tmp, folder, args.files)
            else:
                results[where] = run(os.path.join(tmp, "store"), folder, args.files)
    goals = []
    for where, r in results.items():
        edit, alone = r["one-file edit"], r["that one file alone"]
        if where != "directory":
            goals.append(harness.Goal(f"{where}_edit_requests_over_alone",
                                      harness.ratio(edit["requests"], alone["requests"]), 2.0, "<="))
        goals.append(harness.Goal(f"{where}_edit_seconds_over_alone",
                                  harness.ratio(edit["seconds"], alone["seconds"]), 2.0, "<="))
    for g in goals:
        print(g.line())
    fig.update({"files": args.files, "size": args.size, "tree": os.path.dirname(sys.modules["cdcstore"].__file__),
                **results})
    harness.finish(fig, goals)


if __name__ == "__main__":
    main()

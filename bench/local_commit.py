"""What a local commit costs (`Repository.commit`: check the chunks are stored, put the commit,
move the branch, and before issue 22 record a server's access grants): seconds and bucket
requests of a commit of N new files, on a directory store and on a bucket store (moto's S3).

    PYTHONPATH=. python3 bench/local_commit.py [--files 1000] [--reps 5] [--stores directory,bucket]
Run it with another tree first on PYTHONPATH to measure that tree (it wraps only
`Repository.commit` and reads the bucket's request counter)."""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import harness
from cdcstore import Store
from cdcstore.storage import repository

SPENT: list[tuple[float, int]] = []  # (seconds, bucket requests) of each Repository.commit


def wrap_commit() -> None:
    real = repository.Repository.commit

    def timed(self, *a, **kw):
        before = (self.objects.counters() or {}).get("requests", 0)
        t = time.perf_counter()
        try:
            return real(self, *a, **kw)
        finally:
            SPENT.append((time.perf_counter() - t, (self.objects.counters() or {}).get("requests", 0) - before))
    repository.Repository.commit = timed


def run(location: str, files: int, reps: int, tmp: str) -> dict:
    Store.init(location).close()
    SPENT.clear()
    with Store(location) as s:
        for r in range(reps + 1):  # the first push makes the repo: not counted
            d = os.path.join(tmp, f"{abs(hash(location))}-{r}")
            os.makedirs(d)
            for i in range(files):
                with open(os.path.join(d, f"f{i:05}.bin"), "wb") as f:
                    f.write(os.urandom(2048))
            s.push([d], "cdc://bench/")
    runs = SPENT[1:]
    return {"files": files, "reps": len(runs), "median_s": round(harness.med(t for t, _ in runs), 4),
            "requests": sorted({n for _, n in runs})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--stores", default="directory,bucket", help="which of directory,bucket to measure")
    args = ap.parse_args()
    wrap_commit()
    out = harness.start("local_commit")
    out["tree"] = os.path.dirname(os.path.dirname(os.path.abspath(repository.__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
        if "directory" in args.stores:
            out["directory"] = run(os.path.join(tmp, "store"), args.files, args.reps, tmp)
        if "bucket" not in args.stores:
            return harness.finish(out)
        from moto import server as moto_server
        import boto3
        srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        srv.start()
        host, port = srv.get_host_and_port()
        env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
        os.environ.update(env)
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket="bench")
        try:
            out["bucket"] = run("s3://bench/store", args.files, args.reps, tmp)
        finally:
            srv.stop()
    harness.finish(out)


if __name__ == "__main__":
    main()

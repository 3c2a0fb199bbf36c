"""TAR shard dedup benchmark (issue 49): what a rewritten WebDataset shard stores, side by side.

    python bench/tar.py [--work /tmp/cdcbench-tar] [--repeat 3] [--quick]

Shards are written by webdataset 1.0.2's own `TarWriter`, as a new user writes them: the default
writer stamps the current time into every member (a pax `mtime` record each, since the time is a
float), so a rewrite changes every header even where no sample changed. Samples are made from fixed
seeds (`jpg`: incompressible bytes, as JPEG is; `json`: a short text; `cls`: a number), so a rewrite
writes the same samples again unless a scenario changes one.

Shapes:
  small   one shard of 450 samples of ~25 KB (~11.5 MB), as in the issue
  large   4 shards of 100 samples of ~250 KB (~100 MB)

Scenarios (each: version 1 pushed to a fresh store, then version 2; the figure is what version 2
adds):
  one_changed       one sample's jpg replaced, shard rewritten by the default writer (new mtimes)
  rewritten         the same samples in the same order, rewritten by the default writer (new mtimes)
  one_changed_mtime0  one sample changed, both versions written with `mtime=0` (for information)

Sides:
  hf_xet   hf_xet `local://` CAS (bench/dedup.py's child-process upload): DeduplicationMetrics.new_bytes
  v2       cdcstore with chunk format v2's rule for tar files (byte CDC: IngestOptions(tar_members=False))
  v3       cdcstore with TAR member cuts (the default): TransferResult.new_bytes (raw bytes of new
           chunks) and stored_bytes (as written into packs, zstd where it pays)

Also: chunks per 100 MB of TAR (each shape); push and read speed of the large shape, v3 against
v2 (a fresh store each, push in process, then every file read back through `Store.open`; medians of
--repeat runs, sides alternated); and random access as a shuffled loader does it: the small shape
pushed both ways to a real `cdcstore serve` on loopback, then 100 random samples' `jpg` members read
by byte range through `Store(server)` with a fresh chunk cache from files opened once (as a loader
keeps them), bytes received and requests per sample after the opens. The last line is one JSON object of every figure.

Goals (issue 49; reported, never tuned to): small one_changed <= 0.2 MB; large one_changed <= 1 MB;
rewritten <= 2% of the shard; <= 2,000 chunks per 100 MB; push and read no slower than v2.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Goal, code_version, finish, start  # noqa: E402 - bench/ on the path first

SHAPES = {"small": dict(shards=1, samples=450, jpg=24_500), "large": dict(shards=4, samples=100, jpg=250_000)}
DEST = "wds@main/shards/"


def sample(i: int, jpg: int, changed: bool = False) -> dict:
    rnd = random.Random(i * 7919 + (1 if changed else 0))
    return {"__key__": f"{i:08d}", "jpg": rnd.randbytes(jpg), "cls": str(i % 1000).encode(),
            "json": json.dumps({"id": i, "caption": f"sample {i} of the set", "w": 640, "h": 480}).encode()}


def write_shards(folder: str, shape: str, change: int | None = None, mtime: float | None = None) -> list[str]:
    import webdataset as wds
    s = SHAPES[shape]
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    paths = []
    for k in range(s["shards"]):
        path = os.path.join(folder, f"shard-{k:06d}.tar")
        with wds.TarWriter(path, **({} if mtime is None else {"mtime": mtime})) as w:
            for j in range(s["samples"]):
                i = k * s["samples"] + j
                w.write(sample(i, s["jpg"], changed=(i == change)))
        paths.append(path)
    return paths


def tar_bytes(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths)


def push_two(v1: list[str], v2: list[str], work: str, tar_members: bool) -> dict:
    from cdcstore.api import Store
    from cdcstore.engine.ingest import IngestOptions
    target = os.path.join(work, "store")
    shutil.rmtree(target, ignore_errors=True)
    opts = IngestOptions(tar_members=tar_members)
    store = Store.init(target)
    try:
        r1 = store.push(v1, DEST, options=opts, stat_cache=False)
        r2 = store.push(v2, DEST, options=opts, stat_cache=False)
        for p in v2:  # the figure means nothing if the store does not give the files back
            with store.open(DEST + os.path.basename(p)) as f, open(p, "rb") as g:
                if f.read() != g.read():
                    raise SystemExit(f"{p}: read back differs")
    finally:
        store.close()
    shutil.rmtree(target, ignore_errors=True)
    return {"new_bytes": r2.new_bytes, "stored_bytes": r2.stored_bytes, "chunks_v1": r1.chunks,
            "modes": sorted({d["chunking"] for d in (r1.files_detail or {}).values()})}


def xet_two(v1: list[str], v2: list[str], work: str) -> int:
    """hf_xet's new bytes for version 2 (files uploaded one child each, as bench/dedup.py does)."""
    import dedup
    target, cache = os.path.join(work, "xet-cas"), os.path.join(work, "xet-cache")
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    for p in v1:
        dedup.xet_upload(p, target, cache)
    new = sum(dedup.xet_upload(p, target, cache)["new_bytes"] for p in v2)
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return new


def speed(paths: list[str], work: str, tar_members: bool) -> dict:
    from cdcstore.api import Store
    from cdcstore.engine.ingest import IngestOptions
    target = os.path.join(work, "speed-store")
    shutil.rmtree(target, ignore_errors=True)
    store = Store.init(target)
    try:
        t = time.perf_counter()
        r = store.push(paths, DEST, options=IngestOptions(tar_members=tar_members), stat_cache=False)
        push = time.perf_counter() - t
        t = time.perf_counter()
        n = 0
        for p in paths:
            with store.open(DEST + os.path.basename(p)) as f:
                while block := f.read(1 << 20):
                    n += len(block)
        read = time.perf_counter() - t
    finally:
        store.close()
    shutil.rmtree(target, ignore_errors=True)
    assert n == tar_bytes(paths)
    return {"push_s": push, "read_s": read, "chunks": r.chunks}


def random_samples(paths: list[str], work: str, tar_members: bool, picks: int = 100) -> dict:
    """Bytes a cold client receives to read `picks` random members' data from a served store."""
    from cdcstore.api import Store
    from cdcstore.core import tar
    from cdcstore.engine.ingest import IngestOptions
    from cdcstore.testing.served import ServedStore
    root = os.path.join(work, "served")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    with ServedStore(root) as srv:
        with Store(srv.url) as up:
            up.push(paths, DEST, options=IngestOptions(tar_members=tar_members), stat_cache=False)
        rnd = random.Random(49)
        members: list = []
        for p in paths:
            data = open(p, "rb").read()
            members += [(p, m) for m in tar.walk(lambda o, n: data[o:o + n], len(data)) if m.name.endswith(".jpg")]
        chosen = rnd.sample(members, picks)
        with Store(srv.url, cache=os.path.join(root, "client-cache")) as down:
            files = {p: down.open(DEST + os.path.basename(p)) for p in paths}  # as a loader keeps them
            opened = down.counters()
            for p, m in chosen:
                f = files[p]
                f.seek(m.data)
                got = f.read(m.size)
                with open(p, "rb") as g:
                    g.seek(m.data)
                    assert got == g.read(m.size)
            c = {k: down.counters()[k] - opened[k] for k in ("received_bytes", "requests")}
            for f in files.values():
                f.close()
    shutil.rmtree(root, ignore_errors=True)
    return {"received_per_sample": c["received_bytes"] / picks, "requests_per_sample": c["requests"] / picks,
            "member_bytes": sum(m.size for _, m in chosen) / picks}


def mb(n: float) -> str:
    return f"{n / 1e6:,.3f} MB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/cdcbench-tar")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-xet", action="store_true", help="skip the hf_xet side")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    out: dict = {**start("tar"), "code": code_version(), "dedup": {}, "chunks_per_100mb": {}, "speed": {}}
    for shape in SHAPES:
        n = SHAPES[shape]["samples"] * SHAPES[shape]["shards"]
        change = n // 2
        base = write_shards(os.path.join(args.work, shape, "v1"), shape)
        cases = {
            "one_changed": (base, write_shards(os.path.join(args.work, shape, "v2a"), shape, change=change)),
            "rewritten": (base, write_shards(os.path.join(args.work, shape, "v2b"), shape)),
            "one_changed_mtime0": (write_shards(os.path.join(args.work, shape, "v1z"), shape, mtime=0),
                                   write_shards(os.path.join(args.work, shape, "v2z"), shape, change=change, mtime=0)),
        }
        size = tar_bytes(base)
        print(f"\n{shape}: {len(base)} shard(s), {n} samples, {mb(size)}")
        print(f"  {'scenario':<20} {'hf_xet':>14} {'v2 (bytes)':>14} {'v3 new':>14} {'v3 stored':>14} {'v3/xet':>7}")
        for name, (v1, v2) in cases.items():
            xet = None if args.no_xet else xet_two(v1, v2, args.work)
            old = push_two(v1, v2, args.work, tar_members=False)
            new = push_two(v1, v2, args.work, tar_members=True)
            ratio = f"{new['new_bytes'] / xet:.2f}x" if xet else "-"
            print(f"  {name:<20} {mb(xet) if xet is not None else '-':>14} {mb(old['new_bytes']):>14} "
                  f"{mb(new['new_bytes']):>14} {mb(new['stored_bytes']):>14} {ratio:>7}")
            out["dedup"][f"{shape}/{name}"] = {"tar_bytes": size, "hf_xet_new": xet, "v2_new": old["new_bytes"],
                                               "v2_stored": old["stored_bytes"], "v3_new": new["new_bytes"],
                                               "v3_stored": new["stored_bytes"], "v3_modes": new["modes"]}
            if name == "one_changed":
                out["chunks_per_100mb"][shape] = {"v2": old["chunks_v1"] * 1e8 / size,
                                                  "v3": new["chunks_v1"] * 1e8 / size}
        c = out["chunks_per_100mb"][shape]
        print(f"  chunks per 100 MB: v2 {c['v2']:,.0f}, v3 {c['v3']:,.0f} (goal <= 2,000)")
    small = write_shards(os.path.join(args.work, "small", "v1"), "small")
    out["random_reads"] = {side: random_samples(small, args.work, members)
                           for side, members in (("v2", False), ("v3", True))}
    r2, r3 = out["random_reads"]["v2"], out["random_reads"]["v3"]
    print(f"\nrandom samples, small shape, cold client of a loopback server (jpg of {r3['member_bytes']:,.0f} B avg):")
    print(f"  received per sample: v2 {r2['received_per_sample']:,.0f} B, v3 {r3['received_per_sample']:,.0f} B "
          f"(v3/v2 {r3['received_per_sample'] / r2['received_per_sample']:.2f}x); requests per sample "
          f"v2 {r2['requests_per_sample']:.2f}, v3 {r3['requests_per_sample']:.2f}")
    paths = write_shards(os.path.join(args.work, "large", "v1"), "large")
    runs: dict = {"v2": [], "v3": []}
    for _ in range(args.repeat):
        for side, members in (("v3", True), ("v2", False)):
            runs[side].append(speed(paths, args.work, members))
    for side in runs:
        out["speed"][side] = {k: statistics.median(r[k] for r in runs[side]) for k in ("push_s", "read_s", "chunks")}
    size = tar_bytes(paths)
    s2, s3 = out["speed"]["v2"], out["speed"]["v3"]
    print(f"\nspeed, large shape ({mb(size)}), medians of {args.repeat}:")
    print(f"  push  v2 {size / s2['push_s'] / 1e6:,.0f} MB/s   v3 {size / s3['push_s'] / 1e6:,.0f} MB/s   "
          f"v3/v2 {s2['push_s'] / s3['push_s']:.2f}x")
    print(f"  read  v2 {size / s2['read_s'] / 1e6:,.0f} MB/s   v3 {size / s3['read_s'] / 1e6:,.0f} MB/s   "
          f"v3/v2 {s2['read_s'] / s3['read_s']:.2f}x")
    out["speed"]["push_v3_over_v2"] = s2["push_s"] / s3["push_s"]
    out["speed"]["read_v3_over_v2"] = s2["read_s"] / s3["read_s"]
    d = out["dedup"]
    goals = [
        Goal("small_one_changed_stored_mb", d["small/one_changed"]["v3_stored"] / 1e6, 0.2, "<="),
        Goal("small_one_changed_new_mb", d["small/one_changed"]["v3_new"] / 1e6, 0.2, "<="),
        Goal("large_one_changed_stored_mb", d["large/one_changed"]["v3_stored"] / 1e6, 1.0, "<="),
        Goal("large_one_changed_new_mb", d["large/one_changed"]["v3_new"] / 1e6, 1.0, "<="),
        Goal("small_rewritten_stored_fraction", d["small/rewritten"]["v3_stored"] / d["small/rewritten"]["tar_bytes"],
             0.02, "<="),
        Goal("small_rewritten_new_fraction", d["small/rewritten"]["v3_new"] / d["small/rewritten"]["tar_bytes"],
             0.02, "<="),
        Goal("small_chunks_per_100mb", out["chunks_per_100mb"]["small"]["v3"], 2000, "<="),
        Goal("large_chunks_per_100mb", out["chunks_per_100mb"]["large"]["v3"], 2000, "<="),
        Goal("push_v3_over_v2", out["speed"]["push_v3_over_v2"], 1.0, ">="),
        Goal("read_v3_over_v2", out["speed"]["read_v3_over_v2"], 1.0, ">="),
        Goal("random_sample_received_v3_over_v2", r3["received_per_sample"] / r2["received_per_sample"], 0, "reported"),
    ]
    print()
    for g in goals:
        print(g.line())
    finish(out, goals)


if __name__ == "__main__":
    main()

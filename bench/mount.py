"""Mount benchmark: a file read through `cdcstore mount` against the same file on local disk and
through `cdc://` (fsspec), side by side.

    python bench/mount.py [--size-mb 140] [--repeat 3] [--data-dir /tmp/cdcbench]

Writes (once, cached under --data-dir) one real-shaped Parquet file of about --size-mb MB with
plain pyarrow (bench/data.py's generator: int, float and text columns, zstd), pushes it into a
fresh local store and tags it, then per repetition (sides rotated):

  local        open(copy).read(1 MiB) to the end; copy is a fresh shutil.copyfile (page cache warm)
  cdc://       fsspec's CdcFileSystem open().read(1 MiB) to the end (the one read core, in process)
  mount        a fresh `cdcstore mount --background` of the tag, then read(1 MiB) to the end:
               every byte through FUSE and our reader (the store's packs in the page cache)
  mount again  the same file read again: a tag never changes, so the kernel keeps what it read

and pyarrow `read_table(columns=[one])` of the file by path: local, and through the mount (fresh).
Then a folder of --wide (20,000) tiny files, one commit (five small files uploaded, committed
under every name): `ls -R` of a fresh mount of it (first: every tree read from the local store),
and again (warm: the trees kept by the mount), median of the repetitions; goal < 1 s warm.
Every side's bytes are checked against the source once (xxh3-128), outside the timings. Medians of
the repetitions; MB = 1e6 bytes. Goal (issue 48): a sequential read through the mount, warm cache,
>= 0.8x the same file on local disk. The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import make_table, write_parquet  # noqa: E402
from harness import Goal, code_version, finish, med, ratio, rotated, start  # noqa: E402

BLOCK = 1 << 20
SIDES = ("local", "cdc://", "mount", "mount again")


def read_all(open_file) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = 0
    with open_file() as f:
        while b := f.read(BLOCK):
            n += len(b)
    return time.perf_counter() - t0, n


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "cdcstore", *args], check=True, capture_output=True)


def wide_listing(work: str, files: int, repeat: int) -> dict[str, float | int]:
    """Seconds of `ls -R` over a fresh mount of a folder of `files` tiny files (the first, and the
    median of `repeat` more), and the lines it printed."""
    from cdcstore.api import Store

    up, store, mnt = os.path.join(work, "wide-up"), os.path.join(work, "wide-store"), os.path.join(work, "wide-mnt")
    os.makedirs(up)
    os.makedirs(mnt)
    for k in range(5):
        with open(os.path.join(up, f"u{k}.bin"), "wb") as f:
            f.write(bytes(7 * k + 1))
    with Store.init(store) as s:
        small = list(s.upload([up + "/"], "cdc://wide/u/").values())
        s.commit_entries("cdc://wide/", {f"big/f{i:07d}.bin": small[i % 5] for i in range(files)}, "wide")
        s.tag("wide", "v1")
    cli("mount", "cdc://wide@v1/", mnt, "--store", store, "--background", "-q")
    try:
        runs = []
        for _ in range(1 + repeat):
            t0 = time.perf_counter()
            out = subprocess.run(["ls", "-R", mnt], check=True, capture_output=True).stdout
            runs.append(time.perf_counter() - t0)
        lines = out.count(b"\n")
    finally:
        cli("unmount", mnt)
    return {"files": files, "first_s": runs[0], "warm_s": med(runs[1:]), "lines": lines}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=140)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data-dir", default="/tmp/cdcbench")
    ap.add_argument("--wide", type=int, default=20_000, help="files of the folder `ls -R` lists (0: skip)")
    a = ap.parse_args()
    import fsspec
    import pyarrow.parquet as pq
    import xxhash

    from cdcstore.api import Store

    fig = start("mount")
    fig["code"] = code_version()
    os.makedirs(a.data_dir, exist_ok=True)
    src = os.path.join(a.data_dir, f"mount-{int(a.size_mb)}mb.parquet")
    if not os.path.exists(src):
        rows = int(a.size_mb * 1e6 / 60)  # about 60 bytes a row, compressed
        write_parquet(make_table(7, rows), src)
    size = os.path.getsize(src)
    want = xxhash.xxh3_128_hexdigest(open(src, "rb").read())
    work = tempfile.mkdtemp(prefix="mount-", dir=a.data_dir)
    store, mnt, copy = os.path.join(work, "store"), os.path.join(work, "mnt"), os.path.join(work, "copy.parquet")
    os.makedirs(mnt)
    with Store.init(store) as s:
        s.push([src], "cdc://bench/data.parquet")
        s.tag("bench", "v1")
    fs = fsspec.filesystem("cdc", store=store)
    column = pq.ParquetFile(src).schema_arrow.names[1]
    times: dict[str, list[float]] = {k: [] for k in (*SIDES, "pyarrow local", "pyarrow mount")}
    try:
        for rep in range(a.repeat):
            shutil.copyfile(src, copy)
            cli("mount", "cdc://bench@v1/", mnt, "--store", store, "--background", "-q")
            try:
                for side in rotated(SIDES[:3], rep) + ["mount again"]:
                    path = {"local": copy, "mount": f"{mnt}/data.parquet", "mount again": f"{mnt}/data.parquet"}
                    opener = (lambda: fs.open("bench@v1/data.parquet", "rb")) if side == "cdc://" else \
                        (lambda p=path[side]: open(p, "rb", buffering=0))
                    seconds, n = read_all(opener)
                    assert n == size, (side, n, size)
                    times[side].append(seconds)
            finally:
                cli("unmount", mnt)
            cli("mount", "cdc://bench@v1/", mnt, "--store", store, "--background", "-q")
            try:
                for side in rotated(["pyarrow local", "pyarrow mount"], rep):
                    p = copy if side == "pyarrow local" else f"{mnt}/data.parquet"
                    t0 = time.perf_counter()
                    pq.read_table(p, columns=[column])
                    times[side].append(time.perf_counter() - t0)
                got = xxhash.xxh3_128_hexdigest(open(f"{mnt}/data.parquet", "rb").read())
                assert got == want, "the mount read other bytes than the file's"
            finally:
                cli("unmount", mnt)
        wide = wide_listing(work, a.wide, a.repeat) if a.wide else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mbps = {k: size / 1e6 / med(v) for k, v in times.items() if k in SIDES}
    fig.update({"size_mb": size / 1e6, "repeat": a.repeat, "seconds": {k: med(v) for k, v in times.items()},
                "runs": times, "mb_per_s": mbps, "wide_listing": wide})
    print(f"{size / 1e6:.0f} MB Parquet, medians of {a.repeat}, 1 MiB reads:")
    for k in SIDES:
        print(f"  {k:12} {mbps[k]:8.0f} MB/s   {ratio(mbps[k], mbps['local']):.2f}x local")
    print(f"  pyarrow one column: local {med(times['pyarrow local']):.3f} s, mount "
          f"{med(times['pyarrow mount']):.3f} s ({ratio(med(times['pyarrow local']), med(times['pyarrow mount'])):.2f}x)")
    goals = [Goal("mount_first_read_over_local", ratio(mbps["mount"], mbps["local"]), 0.8, ">="),
             Goal("mount_again_over_local", ratio(mbps["mount again"], mbps["local"]), 0.8, ">="),
             Goal("mount_over_cdc_fsspec", ratio(mbps["mount"], mbps["cdc://"]), 0.0, "reported"),
             Goal("pyarrow_column_mount_over_local",
                  ratio(med(times["pyarrow local"]), med(times["pyarrow mount"])), 0.0, "reported")]
    if wide is not None:
        print(f"  ls -R of a folder of {wide['files']:,} files: first {wide['first_s']:.3f} s, "
              f"warm {wide['warm_s']:.3f} s ({wide['lines']:,} lines)")
        goals.append(Goal("ls_R_wide_warm_seconds", float(wide["warm_s"]), 1.0, "<"))
    for g in goals:
        print(g.line())
    finish(fig, goals)


if __name__ == "__main__":
    main()

"""Profile one cold full read from `cdcstore serve`, stage by stage, in one process.

    python bench/cold_profile.py [--data-dir DIR] [--cprofile N]

Pushes bench/transfer.py's v2 folder into a temp store, serves it, and reads every file whole
(`Store.cat`) with a fresh empty cache, timing per file: metadata (resolve + commit +
manifest), locate, chunk fetch + verify + placing into the result; then fsspec HTTP `cat_file` of the same files
from an aiohttp static server, same run. With --cprofile N, the N heaviest functions of the
cold read by cumulative time. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from data import list_files, transfer_dataset  # noqa: E402
from harness import code_version, finish, start  # noqa: E402
from servers import ServerProcess, StaticServer  # noqa: E402


def staged_read(url: str, commit: str, files: list[str], cache_path: str) -> dict:
    """Cold read of every file with per-stage wall-clock sums (seconds)."""
    from cdcstore import Store
    from cdcstore.storage.cache import ChunkCache
    st = dict.fromkeys(["metadata", "locate", "fetch_verify_place", "total"], 0.0)
    with Store(url, cache=ChunkCache(cache_path)) as s:
        b = s.backend
        t0 = time.perf_counter()
        for p in files:
            a = time.perf_counter()
            cid, commit_obj = s.resolve(f"cdc://bench@{commit}/{p}")
            m = b.get_manifest(commit_obj.files[p].manifest, "bench")
            c = time.perf_counter()
            st["metadata"] += c - a
            with s.reader("bench", m, p) as f:
                f._plan.locate(list(range(len(m.chunk_ids))))
                d = time.perf_counter()
                st["locate"] += d - c
                data = f.read()  # fetch, verify, place into one buffer (storage/reader.py _pread_direct)
                st["fetch_verify_place"] += time.perf_counter() - d
            assert len(data) == m.size
        st["total"] = time.perf_counter() - t0
        st["requests"] = s.counters()["requests"]
    return st


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/tmp/cdcbench-transfer")
    ap.add_argument("--size-mb", type=float, default=100)
    ap.add_argument("--cprofile", type=int, default=0)
    args = ap.parse_args()
    opening = start("cold_profile")  # the load average before the run
    from cdcstore import Store
    from cdcstore.storage.repository import LocalStore
    import fsspec
    _, v2, _ = transfer_dataset(args.data_dir, args.size_mb)
    files = list_files(v2)
    work = tempfile.mkdtemp(prefix="cdcbench-prof-")
    try:
        store = os.path.join(work, "store")
        LocalStore.init(store)
        with Store(store) as s:
            commit = s.push([v2], "cdc://bench/").commit
        srv = ServerProcess(store, "--allow-no-auth").start()
        static = StaticServer(os.path.dirname(v2), f"v2/{files[0]}").start()
        try:
            url = srv.url
            st = staged_read(url, commit, files, os.path.join(work, "c0.sqlite"))
            fs = fsspec.filesystem("http", skip_instance_cache=True)
            t0 = time.perf_counter()
            n = sum(len(fs.cat_file(f"{static.url}/v2/{p}")) for p in files)
            st["fsspec_total"] = time.perf_counter() - t0
            st["mb"] = n / 1e6
            t0 = time.perf_counter()
            with Store(url, cache=os.path.join(work, "c1.sqlite")) as s:
                for p in files:
                    s.cat(f"cdc://bench@{commit}/{p}")
            st["store_cat_total"] = time.perf_counter() - t0
            print(", ".join(f"{k} {v:.3f}" for k, v in st.items()))
            if args.cprofile:
                prof = cProfile.Profile()
                with Store(url, cache=os.path.join(work, "c2.sqlite")) as s:
                    prof.enable()
                    for p in files:
                        s.cat(f"cdc://bench@{commit}/{p}")
                    prof.disable()
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.cprofile)
                print(out.getvalue())
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.cprofile)
                print(out.getvalue())
        finally:
            srv.stop()
            static.stop()
        finish({**opening, "code": code_version(), **st})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

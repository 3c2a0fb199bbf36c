"""A one-file edit of a 2,000-file folder, pushed again: requests and seconds, through a
`cdcstore serve` and on a directory store, against the first push and the file pushed alone.

    PYTHONPATH=. python3 bench/push_edit.py [--files 2000] [--size 4096]
Run it with another tree first on PYTHONPATH to measure that tree (it uses only `Store.push`)."""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time

from cdcstore import Store
from cdcstore.storage.repository import LocalStore
from cdcstore.testing import ServerProcess


def run(location: str, folder: str, files: int) -> dict:
    has_cache = "stat_cache" in inspect.signature(Store.push).parameters
    out = {}
    with Store(location, cache=False) as s:
        def push(label, src, dest, **kw):
            c0, t0 = s.counters()["requests"], time.perf_counter()
            r = s.push(src, dest, **kw)
            out[label] = {"requests": s.counters()["requests"] - c0, "seconds": round(time.perf_counter() - t0, 2),
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args()
    results = {}
    for where in ("server", "directory"):
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
            folder = os.path.join(tmp, "src")
            os.makedirs(folder)
            for i in range(args.files):
                with open(os.path.join(folder, f"f{i:05d}.bin"), "wb") as f:
                    f.write(os.urandom(args.size))
            time.sleep(1.1)  # files older than the push's second: not racy
            LocalStore.init(os.path.join(tmp, "store")).close()
            if where == "server":
                srv = ServerProcess(os.path.join(tmp, "store")).start()
                try:
                    results[where] = run(srv.url, folder, args.files)
                finally:
                    srv.stop()
            else:
                results[where] = run(os.path.join(tmp, "store"), folder, args.files)
    print(json.dumps({"files": args.files, "size": args.size, "tree": os.path.dirname(sys.modules["cdcstore"].__file__),
                      **results}, indent=1))


if __name__ == "__main__":
    main()

"""Read benchmark over a shaped link: cdcstore serve vs fsspec HTTP from an aiohttp static server.

    python bench/link.py [--size-mb 100] [--repeat 3] [--links loopback,1g,100m] [--data-dir DIR]

Needs root for the shaped links (it makes a network namespace; loopback runs without).

Links
-----
  loopback  both servers on 127.0.0.1, no shaping
  1g        1 Gbit/s, 2 ms RTT     } a network namespace "cdclink" with a veth pair
  100m      100 Mbit/s, 20 ms RTT  } (10.77.0.1 here, 10.77.0.2 there), `tc netem delay RTT/2 rate R`
                                     on both ends; both servers run inside the namespace
A kernel without sch_netem (`tc` says "Specified qdisc kind is unknown") gets the rate alone
from a token bucket (`tbf rate R burst 256kb latency 50ms`) and no added delay; the figures
then say "delay": false.
The namespace and the veth pair are deleted on exit, on error and on Ctrl-C (and a stale one
left by a killed run is deleted before the run).

Data: bench/transfer.py's dataset (v1: 6 Parquet files of --size-mb in all; v2: an edit of
1% of one file, 2% appended to another, one new small file), pushed once into a local store
that `cdcstore serve` serves; the static server serves the v2 folder (and v1 for the peer of
"v2 after v1").

Each repetition, per link (the order of the sides rotates):
  ours cold      a fresh Store(url) with a fresh empty cache reads every v2 file whole into memory
                 (one file after another, `read()` of the whole file: chunks verified, cache written;
                 timed through the Store's close, which waits for the cache writes: until stop 30
                 the timer stopped before it, so writes deferred past the reads went untimed)
  ours no cache  the same with cache=False
  fsspec         fsspec HTTPFileSystem `cat_file` of every v2 file, one after another, from the
                 static server (one GET per file)
  v2 after v1    a fresh cache warmed by reading v1 (untimed), then v2 read whole, timed: only
                 the changed chunks cross the link; its peer is fsspec reading v2 (no dedup)
  warm           v2 again from the cache warmed by "v2 after v1": the bytes (warm_read, no peer), and
                 pyarrow.parquet.read_table through Store.open (warm_arrow_ours), whose peer is
                 read_table of the v2 files on local disk (arrow_local, page cache warm)
Every read is checked against the file's xxh3-64 outside the timings. Medians of --repeat.
MB = 1e6 bytes. The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import atexit
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
from data import list_files, transfer_dataset  # noqa: E402
import harness  # noqa: E402
from harness import code_version, finish, loadavg_text, med, rotated  # noqa: E402
from servers import stop_process, wait_until_up  # noqa: E402

NS, HOST_IF, NS_IF = "cdclink", "cdcl-h", "cdcl-n"
HOST_IP, NS_IP = "10.77.0.1", "10.77.0.2"
LINKS = {"loopback": None, "1g": ("1gbit", 2.0), "100m": ("100mbit", 20.0)}  # rate, RTT ms
REPO = "bench"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


class Link:
    """A network namespace with a shaped veth pair; `close` removes it (idempotent)."""

    def __init__(self, rate: str, rtt_ms: float):
        self.rate, self.rtt = rate, rtt_ms
        self.up = False

    def open(self) -> "Link":
        self.close(force=True)
        self.up = True
        atexit.register(self.close)
        sh("ip", "netns", "add", NS)
        sh("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
        sh("ip", "link", "set", NS_IF, "netns", NS)
        sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", HOST_IF)
        sh("ip", "link", "set", HOST_IF, "up")
        self.ns("ip", "addr", "add", f"{NS_IP}/24", "dev", NS_IF)
        self.ns("ip", "link", "set", NS_IF, "up")
        self.ns("ip", "link", "set", "lo", "up")
        half = f"{self.rtt / 2:g}ms"
        self.delayed = True
        for prefix, dev in (((), HOST_IF), (("ip", "netns", "exec", NS), NS_IF)):
            tc = (*prefix, "tc", "qdisc", "add", "dev", dev, "root")
            if sh(*tc, "netem", "delay", half, "rate", self.rate, "limit", "100000", check=False).returncode:
                # a kernel without sch_netem: the rate alone, with a token bucket (no added delay)
                self.delayed = False
                sh(*tc, "tbf", "rate", self.rate, "burst", "256kb", "latency", "50ms")
        return self

    def ns(self, *cmd: str) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", NS, *cmd)

    def close(self, force: bool = False) -> None:
        if self.up or force:
            sh("ip", "link", "del", HOST_IF, check=False)
            sh("ip", "netns", "del", NS, check=False)
            self.up = False


def start(cmd: list[str], url_probe: str, netns: bool, log_path: str) -> subprocess.Popen:
    """A server child, its output (access log included) to a file: a pipe nobody reads
    would fill and stop the server."""
    import urllib.request
    full = (["ip", "netns", "exec", NS] if netns else []) + cmd
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT)
    wait_until_up(proc, urllib.request.Request(url_probe),
                                lambda: open(log_path, errors="replace").read()[-2000:])
    return proc


def xxh(data) -> str:
    import xxhash
    return xxhash.xxh3_64_hexdigest(data)


def read_ours(url: str, commit: str, files: list[str], cache) -> tuple[float, dict]:
    from cdcstore import Store
    with Store(url, cache=cache) as s:
        t0 = time.perf_counter()
        got = {p: s.cat(f"cdc://{REPO}@{commit}/{p}") for p in files}
        wire = s.counters()
    dt = time.perf_counter() - t0  # through close: the cache writes of a cold read are part of its cost
    return dt, {"digests": {p: xxh(d) for p, d in got.items()}, "received_bytes": wire["received_bytes"],
                "requests": wire["requests"]}


def read_fsspec(url: str, files: list[str]) -> tuple[float, dict]:
    import fsspec
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    t0 = time.perf_counter()
    got = {p: fs.cat_file(f"{url}/{p}") for p in files}
    dt = time.perf_counter() - t0
    return dt, {"digests": {p: xxh(d) for p, d in got.items()}}


def read_arrow_local(root: str, files: list[str]) -> float:
    import pyarrow.parquet as pq
    t0 = time.perf_counter()
    for p in files:
        pq.read_table(os.path.join(root, p))
    return time.perf_counter() - t0


def read_arrow_ours(url: str, commit: str, files: list[str], cache) -> float:
    import pyarrow.parquet as pq
    from cdcstore import Store
    with Store(url, cache=cache) as s:
        t0 = time.perf_counter()
        for p in files:
            with s.open(f"cdc://{REPO}@{commit}/{p}") as f:
                pq.read_table(f)
        return time.perf_counter() - t0


def one_link(name: str, args, work: str, store: str, v1: str, v2: str, commits: dict, expect: dict) -> dict:
    from cdcstore.storage.cache import ChunkCache
    shaped = LINKS[name]
    link = Link(*shaped).open() if shaped else None
    host = NS_IP if link else "127.0.0.1"
    port_ours, port_static = 18471, 18472
    procs = []
    try:
        procs.append(start([sys.executable, "-m", "cdcstore", "serve", "--store", store, "--host", host,
                            "--port", str(port_ours), "--allow-no-auth"],
                           f"http://{host}:{port_ours}/v1/health", bool(link), os.path.join(work, "serve.log")))
        procs.append(start([sys.executable, os.path.join(HERE, "servers.py"), "--_static", os.path.dirname(v2),
                            str(port_static), "-", host], f"http://{host}:{port_static}/v2/{list_files(v2)[0]}", bool(link),
                           os.path.join(work, "static.log")))
        ours_url, static_url = f"http://{host}:{port_ours}", f"http://{host}:{port_static}"
        f1, f2 = list_files(v1), list_files(v2)
        times: dict[str, list[float]] = {}
        wire: dict = {}
        for rep in range(args.repeat):
            sides = ["ours_cold", "ours_nocache", "fsspec", "v2_after_v1"]
            sides = rotated(sides, rep)
            for side in sides:
                cache_path = os.path.join(work, f"cache-{name}-{rep}-{side}.sqlite")
                if side == "fsspec":
                    dt, info = read_fsspec(f"{static_url}/v2", f2)
                elif side == "ours_nocache":
                    dt, info = read_ours(ours_url, commits["v2"], f2, False)
                elif side == "ours_cold":
                    dt, info = read_ours(ours_url, commits["v2"], f2, ChunkCache(cache_path))
                else:
                    cache = ChunkCache(cache_path)
                    read_ours(ours_url, commits["v1"], f1, cache)
                    cache.wait()
                    dt, info = read_ours(ours_url, commits["v2"], f2, cache)
                    cache.wait()
                    times.setdefault("warm_read", []).append(read_ours(ours_url, commits["v2"], f2, cache)[0])
                    times.setdefault("warm_arrow_ours", []).append(
                        read_arrow_ours(ours_url, commits["v2"], f2, cache))
                    times.setdefault("arrow_local", []).append(read_arrow_local(v2, f2))
                if info["digests"] != expect:
                    raise SystemExit(f"{name} {side}: the bytes read differ from the v2 files")
                times.setdefault(side, []).append(dt)
                wire.setdefault(side, {k: v for k, v in info.items() if k != "digests"})
                for p in os.listdir(work):
                    if p.startswith(f"cache-{name}-{rep}-{side}"):  # the sqlite file and its segments folder
                        path = os.path.join(work, p)
                        shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
            print(f"  {name} rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                  flush=True)
        return {"delay_applied": link.delayed if link else None, "times_s": times, "median_s": {k: med(v) for k, v in times.items()}, "wire": wire}
    finally:
        for p in procs:
            stop_process(p)
        if link:
            link.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--links", default="loopback,1g,100m")
    ap.add_argument("--data-dir", default="/tmp/cdcbench-transfer")
    args = ap.parse_args()
    opening = harness.start("link")  # the load average before the run
    links = args.links.split(",")
    if any(LINKS.get(n, 0) == 0 for n in links):
        raise SystemExit(f"unknown link in {args.links!r}: use {', '.join(LINKS)}")
    if any(LINKS[n] for n in links) and os.geteuid() != 0:
        raise SystemExit("shaped links need root (a network namespace and tc): run as root, "
                         "or pass --links loopback")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(1))  # atexit then removes the namespace
    from cdcstore import Store
    from cdcstore.storage.repository import LocalStore
    v1, v2, info = transfer_dataset(args.data_dir, args.size_mb)
    work = tempfile.mkdtemp(prefix="cdcbench-link-")
    try:
        store = os.path.join(work, "store")
        LocalStore.init(store)
        with Store(store) as s:
            commits = {"v1": s.push([v1], f"cdc://{REPO}/").commit, "v2": s.push([v2], f"cdc://{REPO}/").commit}
        f2 = list_files(v2)
        expect = {p: xxh(open(os.path.join(v2, p), "rb").read()) for p in f2}
        nbytes = sum(os.path.getsize(os.path.join(v2, p)) for p in f2)
        print(f"link benchmark: v2 {nbytes / 1e6:.1f} MB in {len(f2)} files; {args.repeat} repetitions; "
              f"python {platform.python_version()}, {os.cpu_count()} cpus; load {loadavg_text()}", flush=True)
        fig: dict = {**opening, "bytes": nbytes, "repeat": args.repeat, "links": {}, "code": code_version()}
        for name in links:
            r = one_link(name, args, work, store, v1, v2, commits, expect)
            m = r["median_s"]
            r["mb_s"] = {k: nbytes / v / 1e6 for k, v in m.items()}
            r["ratios"] = {"cold_ours_over_fsspec": m["fsspec"] / m["ours_cold"],
                           "nocache_ours_over_fsspec": m["fsspec"] / m["ours_nocache"],
                           "v2_after_v1_over_fsspec": m["fsspec"] / m["v2_after_v1"],
                           "warm_arrow_ours_over_arrow_local": m["arrow_local"] / m["warm_arrow_ours"]}
            fig["links"][name] = r
            print(f"{name}: " + ", ".join(f"{k} {v:.0f} MB/s" for k, v in r["mb_s"].items()))
            print(f"{name}: " + ", ".join(f"{k} {v:.2f}x" for k, v in r["ratios"].items()), flush=True)
        finish(fig)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

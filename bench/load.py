"""Load: many concurrent streaming readers against one `cdcstore serve` on loopback (issue 9).

    python bench/load.py                      # 8 processes x 32 readers = 256, for 60 s
    python bench/load.py --processes 2 --threads 32 --seconds 8     # the size of tests/test_load.py

Setup (outside the timing): --files Parquet files of --rows-per-group x --groups rows (bench/data.py
load_files, zstd, CDC), pushed straight into a fresh store that one `python -m cdcstore serve
--tokens FILE --max-heavy N` then serves on 127.0.0.1 with two read tokens: one for every repo ("*":
pack ranges are sent by aiohttp from the file) and one limited to the repo (every pack range is
built masked in memory inside a heavy slot: past --max-heavy of them at once the server answers 429
with Retry-After, which the clients must wait out).

Readers: --processes child processes (`python bench/load.py --_reader JSON`), each with --threads
reader threads. Reader i of a process uses the scoped token when i is odd, the "*" one when even
(--scoped picks: "half", "all", "none"), its own Store with no cache (every read goes to the server),
and does one of two jobs in a loop until the deadline:
  stream   StreamingDataset("cdc://load/data/", batch_size=1024, shuffle=True, seed, a small
           shuffle buffer and prefetch budget), epoch after epoch; a whole epoch must yield every
           row exactly once (ids checked)
  ranges   random 64 KiB reads through Store.open() of random files, each compared with the local
           file's bytes
(i % 4 == 3: ranges, else stream). All readers start together once every process is ready (the
clock starts then); each stops at its first batch or read after --seconds; a process that does not
report within --seconds + 120 s is killed and counts as errors.

Figures: client errors (any exception or wrong data, with the first messages), batches, rows,
range reads, MB read; server-side from its access log: requests by route and status (5xx, 429);
client-side the retries logged as "server busy" (cdcstore.remote.client.store notes each retry that waits
>= 1 s, which every Retry-After: 1 does); the server's VmRSS sampled every 0.25 s (peak) and its
VmHWM at the end. The last line is one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # bench/harness.py, data.py, servers.py
from data import load_files as make_files  # noqa: E402
from harness import Goal, code_version, finish, loadavg_text, start  # noqa: E402
from servers import ServerProcess, cdc_requests, stop_process  # noqa: E402

REPO = "load"
TOKENS = {"star": "load-star-token", "scoped": "load-scoped-token"}
RANGE_LEN = 64 * 1024
BATCH = 1024


# ---------------------------------------------------------------------------------------------
# setup
# ---------------------------------------------------------------------------------------------

def setup(work: str, args) -> tuple:
    """The data folder, the server (started) and the row count."""
    from cdcstore.api import Store
    from cdcstore.storage.repository import LocalStore
    data = os.path.join(work, "data")
    total = make_files(data, args.files, args.groups, args.rows_per_group)
    srv = os.path.join(work, "srv")
    LocalStore.init(srv)
    s = Store(srv)
    s.push([data], f"cdc://{REPO}/data/", message="load data")
    s.close()
    tokens = os.path.join(work, "tokens.json")
    with open(tokens, "w") as f:
        json.dump({TOKENS["star"]: {"scope": "read", "repos": ["*"]},
                   TOKENS["scoped"]: {"scope": "read", "repos": [REPO]}}, f)
    server = ServerProcess(srv, "--tokens", tokens, "--max-heavy", str(args.max_heavy)).start()
    return data, server, total


# ---------------------------------------------------------------------------------------------
# a reader process
# ---------------------------------------------------------------------------------------------

class BusyCounter:
    """Counts the client's retry notes caused by 429 ("server busy")."""

    def __init__(self):
        import logging
        self.n = 0
        self.other = 0
        handler = logging.Handler()
        handler.emit = self._emit
        lg = logging.getLogger("cdcstore.remote.client.store")
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False

    def _emit(self, record) -> None:
        if "server busy" in record.getMessage():
            self.n += 1
        else:
            self.other += 1


def stream_job(a: dict, i: int, store, deadline: float, out: dict) -> None:
    """Epochs of a shuffled StreamingDataset until the deadline; a whole epoch must hold every id once."""
    import numpy as np
    from cdcstore.stream import StreamingDataset
    ds = StreamingDataset(f"cdc://{REPO}/data/", columns=["id", "value", "text"], batch_size=BATCH,
                          shuffle=True, seed=a["proc"] * 1000 + i, shuffle_buffer=a["shuffle_buffer"],
                          store=store, prefetch_bytes=a["prefetch_bytes"], prefetch_row_groups=2)
    epoch = 0
    while time.monotonic() < deadline:
        ds.set_epoch(epoch)
        seen = np.zeros(a["total"], dtype=np.uint8)
        whole = True
        for batch in ds:
            np.add.at(seen, batch["id"], 1)
            out["batches"] += 1
            out["rows"] += len(batch["id"])
            if time.monotonic() >= deadline:
                whole = False
                break
        if whole:
            if not (seen == 1).all():
                raise AssertionError(f"epoch {epoch}: {(seen == 0).sum()} ids missing, "
                                     f"{(seen > 1).sum()} repeated")
            out["epochs"] += 1
        epoch += 1


def ranges_job(a: dict, i: int, store, deadline: float, out: dict) -> None:
    """Random 64 KiB reads of random files until the deadline, each checked against the local file."""
    rng = random.Random(a["proc"] * 1000 + i)
    names = sorted(os.listdir(a["data"]))
    while time.monotonic() < deadline:
        name = rng.choice(names)
        local = os.path.join(a["data"], name)
        size = os.path.getsize(local)
        with store.open(f"cdc://{REPO}/data/{name}") as r, open(local, "rb") as f:
            for _ in range(8):
                off = rng.randrange(0, max(1, size - RANGE_LEN))
                r.seek(off)
                got = r.read(RANGE_LEN)
                f.seek(off)
                if got != f.read(RANGE_LEN):
                    raise AssertionError(f"wrong bytes at {name}:{off}")
                out["reads"] += 1
                out["bytes"] += len(got)
                if time.monotonic() >= deadline:
                    return


def reader(a: dict, i: int, deadline: float, out: dict) -> None:
    from cdcstore.api import Store
    scoped = {"all": True, "none": False}.get(a["scoped"], i % 2 == 1)
    out["token"] = "scoped" if scoped else "star"
    out["job"] = "ranges" if i % 4 == 3 else "stream"
    try:
        store = Store(a["url"], token=TOKENS["scoped" if scoped else "star"], cache=False)
        try:
            (ranges_job if out["job"] == "ranges" else stream_job)(a, i, store, deadline, out)
        finally:
            out["requests"] = store.counters().get("requests", 0)
            store.close()
    except Exception as e:  # every failure a client sees is a figure
        out["errors"].append(f"{type(e).__name__}: {str(e)[:300]}")


def reader_main(a: dict) -> None:
    """Child: wait for "go" on stdin, run a["threads"] readers until the deadline, print one JSON line."""
    import numpy  # noqa: F401  (imports before the clock)
    import pyarrow.parquet  # noqa: F401
    import cdcstore.stream  # noqa: F401
    busy = BusyCounter()
    print("ready", flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + a["seconds"]
    outs = [{"batches": 0, "rows": 0, "epochs": 0, "reads": 0, "bytes": 0, "errors": []} for _ in range(a["threads"])]
    threads = [threading.Thread(target=reader, args=(a, i, deadline, outs[i]), daemon=True)
               for i in range(a["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline + 90 - time.monotonic()))
    hung = sum(t.is_alive() for t in threads)
    print(json.dumps({"readers": outs, "hung": hung, "busy_retries": busy.n, "other_retries": busy.other}),
          flush=True)
    os._exit(0)  # hung reader threads must not keep the process


# ---------------------------------------------------------------------------------------------
# the parent
# ---------------------------------------------------------------------------------------------

class RssSampler(threading.Thread):
    """VmRSS of a pid every `every` seconds (peak kept), and VmHWM on demand."""

    def __init__(self, pid: int, every: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak = self.last = 0
        self._halt = threading.Event()

    def status(self, key: str) -> int:
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith(key + ":"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def run(self) -> None:
        while not self._halt.is_set():
            self.last = self.status("VmRSS")
            self.peak = max(self.peak, self.last)
            self._halt.wait(self.every)

    def stop(self) -> dict:
        self._halt.set()
        self.join()
        return {"peak_rss_mb": self.peak / 1e6, "hwm_mb": self.status("VmHWM") / 1e6, "end_rss_mb": self.last / 1e6}


def run_load(url: str, data: str, total: int, server_pid: int, log_path: str, args) -> dict:
    """Start the readers, release them together, collect their figures and the server's."""
    a = {"url": url, "data": data, "total": total, "threads": args.threads, "seconds": args.seconds,
         "scoped": args.scoped, "shuffle_buffer": args.shuffle_buffer, "prefetch_bytes": args.prefetch_mb << 20}
    procs = []
    for p in range(args.processes):
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_reader",
                                       json.dumps(dict(a, proc=p))], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        for p in procs:  # ready lines (imports done)
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"reader process failed to start: {line}{p.stderr.read()[-2000:]}")
        sampler = RssSampler(server_pid)
        sampler.start()
        with open(log_path, "rb") as f:
            log_start = f.seek(0, 2)
        t0 = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [collect(p, args.seconds + 120) for p in procs]
        elapsed = time.monotonic() - t0
        time.sleep(0.5)  # the server logs a request after its answer
        rss = sampler.stop()
    finally:
        for p in procs:
            stop_process(p)
    with open(log_path, "rb") as f:
        f.seek(log_start)
        lines = f.read().decode(errors="replace").splitlines()
    return summarize(results, lines, rss, elapsed, args)


def collect(p: subprocess.Popen, timeout: float) -> dict:
    """A reader process's JSON line, or a record of its failure (killed past the timeout)."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return {"failed": f"reader process did not finish within {timeout:.0f} s"}
    last = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        return json.loads(last)
    except ValueError:
        return {"failed": f"reader process exited {p.returncode}: {err[-1000:]}"}


def summarize(results: list[dict], lines: list[str], rss: dict, elapsed: float, args) -> dict:
    readers = [r for res in results for r in res.get("readers", [])]
    errors = [e for r in readers for e in r["errors"]] + [res["failed"] for res in results if "failed" in res]
    req = cdc_requests(lines)
    statuses = req["statuses"]
    server_errors = sum(n for s, n in statuses.items() if s.startswith("5"))
    internal = sum("internal error" in line or "Traceback" in line for line in lines)
    rows = sum(r["rows"] for r in readers)
    return {
        "readers": args.processes * args.threads, "processes": args.processes, "threads": args.threads,
        "seconds": args.seconds, "elapsed_s": elapsed, "scoped": args.scoped, "max_heavy": args.max_heavy,
        "readers_reported": len(readers), "hung_threads": sum(res.get("hung", 0) for res in results),
        "client_errors": len(errors), "error_samples": errors[:5],
        "stream_readers": sum(r.get("job") == "stream" for r in readers),
        "range_readers": sum(r.get("job") == "ranges" for r in readers),
        "batches": sum(r["batches"] for r in readers), "rows": rows, "rows_per_s": rows / elapsed,
        "whole_epochs_checked": sum(r["epochs"] for r in readers),
        "range_reads": sum(r["reads"] for r in readers),
        "client_requests": sum(r.get("requests", 0) for r in readers),
        "server_requests": req["total"], "server_requests_per_s": req["total"] / elapsed,
        "by_route": req["by_kind"], "statuses": statuses, "server_5xx": server_errors,
        "server_internal_error_lines": internal, "server_429": int(statuses.get("429", 0)),
        "client_busy_retries": sum(res.get("busy_retries", 0) for res in results),
        "client_other_retries": sum(res.get("other_retries", 0) for res in results),
        "server_rss": rss,
    }


def report(fig: dict) -> None:
    print(f"{fig['readers']} readers ({fig['processes']} processes x {fig['threads']} threads; "
          f"{fig['stream_readers']} streaming, {fig['range_readers']} random ranges; tokens: {fig['scoped']} scoped) "
          f"for {fig['seconds']:g} s (elapsed {fig['elapsed_s']:.1f} s)")
    print(f"  client errors: {fig['client_errors']}  hung threads: {fig['hung_threads']}  "
          f"readers reported: {fig['readers_reported']}")
    for e in fig["error_samples"]:
        print(f"    {e}")
    print(f"  streamed {fig['rows']:,} rows in {fig['batches']:,} batches ({fig['rows_per_s']:,.0f} rows/s), "
          f"{fig['whole_epochs_checked']} whole epochs checked exactly-once; {fig['range_reads']:,} range reads checked")
    print(f"  server: {fig['server_requests']:,} requests ({fig['server_requests_per_s']:,.0f}/s), "
          f"statuses {fig['statuses']}, by route {fig['by_route']}")
    print(f"  5xx: {fig['server_5xx']}  internal-error log lines: {fig['server_internal_error_lines']}  "
          f"429: {fig['server_429']} (client retries noted as 'server busy': {fig['client_busy_retries']}, "
          f"other retries: {fig['client_other_retries']})")
    r = fig["server_rss"]
    print(f"  server RSS: peak sampled {r['peak_rss_mb']:.0f} MB, VmHWM {r['hwm_mb']:.0f} MB, "
          f"at end {r['end_rss_mb']:.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--threads", type=int, default=32, help="reader threads per process")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--groups", type=int, default=4, help="row groups per file")
    ap.add_argument("--rows-per-group", type=int, default=8192)
    ap.add_argument("--shuffle-buffer", type=int, default=2048)
    ap.add_argument("--prefetch-mb", type=int, default=8, help="prefetch budget of each streaming reader")
    ap.add_argument("--max-heavy", type=int, default=8, help="the server's --max-heavy")
    ap.add_argument("--scoped", choices=("half", "all", "none"), default="half",
                    help="which readers use the token limited to the repo (masked ranges, heavy slots)")
    ap.add_argument("--work-dir", default=None, help="default: a new temporary folder, removed after")
    args = ap.parse_args()
    opening = start("load")  # the load average before the run
    work = args.work_dir or tempfile.mkdtemp(prefix="cdcbench-load-")
    server = None
    try:
        t0 = time.perf_counter()
        data, server, total = setup(work, args)
        print(f"setup: {args.files} files x {args.groups} row groups x {args.rows_per_group:,} rows "
              f"({sum(os.path.getsize(os.path.join(data, n)) for n in os.listdir(data)) / 1e6:.1f} MB) pushed, "
              f"server up in {time.perf_counter() - t0:.1f} s; load average {loadavg_text()}", flush=True)
        fig = run_load(server.url, data, total, server.proc.pid, server.log_path, args)
        fig["server_alive_after"] = server.proc.poll() is None
    finally:
        if server is not None:
            server.stop()
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    report(fig)
    goals = [Goal("client_errors_0", fig["client_errors"] + fig["hung_threads"], 0, "=="),
             Goal("server_5xx_0", fig["server_5xx"], 0, "=="),
             Goal("every_429_waited_out", fig["server_429"] - fig["client_busy_retries"], 0, "<=",
                  met=fig["client_errors"] == 0 and fig["server_429"] <= fig["client_busy_retries"])]
    fig["goals"] = {g.name: g.met for g in goals}
    fig = {**opening, **fig, "code": code_version()}
    finish(fig, goals)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--_reader":
        reader_main(json.loads(sys.argv[2]))
    else:
        main()

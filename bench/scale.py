"""Scale benchmark: what one operation costs as a store grows (issue 17, "costs that grow with the store").

    python bench/scale.py [--files 100,2000] [--versions 1,4,16,64] [--big-versions 1] [--repeat 3]
                          [--stores bucket,dir] [--quick] [--data-dir /tmp/cdcbench-scale]
    python bench/scale.py --files 100,2000,20000    # issue 17's whole matrix (20,000 files: see below)

Two stores side by side:
  bucket  moto's S3 server (its own process) reached THROUGH a request-counting HTTP proxy
          (`python bench/scale.py --_proxy UPSTREAM PORT`, aiohttp: forwards every request, counts
          requests and body bytes by method; GET /__scale_counts__ answers the counts); every client,
          writer and replica has AWS_ENDPOINT_URL pointed at the proxy
  dir     a store directory (requests are not counted: time and index size only)

Data: datasets of N small files (1 KiB +-50% of random bytes, 100 a folder; --small-bytes). A
store is grown to each version count of --versions (--big-versions for datasets of 10,000 files
or more): version 1 is a push of the folder, each later version an upload + one commit of 3
edited files. The ops measured at a point that commit (edit push, one-file push, upload + commit)
count as versions too. A dataset of --big (10,000) files or more is measured at --big-versions (1),
its reads once (--big-repeat) and without edit_push (a whole-folder push is ~3 requests a file
today, measured on the smaller datasets; --big-edit-push adds it): today its first push alone is
~40,000 requests, and a new replica's first read walks 20,000 manifests. Run time: the default (100
and 2,000 files) about 10 min on a quiet 2-core machine, 25 min at load average 10; 20,000 files
add roughly 10-20 min. A failed operation is recorded as {"error": ...} and the run goes on.

Measured at every (store, files, versions) point:
  open_new    open and read one file on a NEW machine (a child process with a fresh
              XDG_CACHE_HOME): Store(store).open(file).read()
  ls_new      `ls` of one folder on a new machine
  index       the reader's per-machine cache on disk after open_new (everything under its
              XDG_CACHE_HOME/cdcstore: the chunk index of a bucket store lives there), and the
              writer's (the machine that pushed every version); for a directory, the store's index;
              a sqlite file by its logical size (page_count x page_size: pages still in its WAL count)
  edit_push   one file of the folder edited, the whole folder pushed (Store.push), by the writer
  one_push    one edited file pushed alone to its path (the goal's reference: edit_push <= 2x this)
  edit_new    one edited file pushed alone to its path by a NEW machine (fresh XDG_CACHE_HOME): what
              dedup costs without an index of the store (before dedup anchors: every pack's footer)
  upload / commit   --commit-files new files: Store.upload, then ONE Store.commit_entries
  replica     `cdcstore serve` over the store with a fresh cache dir (cdcstore.testing.ServerProcess):
              bucket requests of its start, then time and bucket requests of the first read of a
              file through it (a client without a cache)
The read-only ops (open_new, ls_new, replica) run --repeat times (medians); the others once a point.
Time is wall seconds inside the operation (Store constructed and closed inside; the child's
imports outside). Only the public API is used (Store, push/upload/commit_entries/open/ls,
ServerProcess). The last line printed is one JSON object; figures.py renders docs/scale.md from it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # bench/harness.py, bench/data.py
from harness import ROOT, Goal, code_version, finish, med, run_dir, start  # noqa: E402

sys.path.insert(0, ROOT)  # cdcstore of this tree (children get PYTHONPATH=ROOT too)

BUCKET = "cdcstore-scale"
COUNTS_PATH = "/__scale_counts__"  # answered by the proxy itself (no bucket name has underscores)
REPO = "ds"
GROW_EDITS = 3  # files edited per grown version
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
MOTO = ("from moto.server import ThreadedMotoServer; import time; "
        "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False); s.start(); "
        "print(s.get_host_and_port()[1], flush=True); time.sleep(1e9)")


# ---------------------------------------------------------------------------------------------
# the request-counting proxy (a child process)
# ---------------------------------------------------------------------------------------------

_HOP = {"host", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
        "proxy-authorization", "proxy-authenticate", "content-length"}


KINDS = ("packs", "manifests", "bundles", "trees", "locations", "anchors", "repos", "grants", "sessions", "gc", "server",
         "cdcstore.json")


def object_kind(path: str, prefix: str = "") -> str:
    """The store folder a bucket request is about (packs, manifests, repos, ...), from its key or,
    for a listing, its prefix= parameter; "other" when none is named."""
    for part in (path + "/" + prefix).split("/"):
        if part in KINDS:
            return part
    return "other"


def proxy_main(upstream: str, port: int) -> None:
    """Child: forward every request to `upstream` unchanged (method, raw path and query, headers,
    body) and its answer back; count requests, request body bytes and answer body bytes by
    method. GET COUNTS_PATH answers the counts as JSON (not forwarded, not counted)."""
    import aiohttp
    from aiohttp import web
    from yarl import URL

    counts: dict = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == COUNTS_PATH:
            return web.json_response(counts)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        c = counts.setdefault(request.method, {"requests": 0, "bytes_in": 0, "bytes_out": 0, "kinds": {}})
        c["requests"] += 1
        c["bytes_in"] += len(body)
        kind = object_kind(request.path, request.query.get("prefix", ""))
        c["kinds"][kind] = c["kinds"].get(kind, 0) + 1
        session: aiohttp.ClientSession = request.app["session"]
        async with session.request(request.method, URL(upstream + request.raw_path, encoded=True),
                                   headers=headers, data=body if body else None,
                                   allow_redirects=False) as up:
            data = await up.read()
            c["bytes_out"] += len(data)
            resp = web.Response(status=up.status, body=None if request.method == "HEAD" else data)
            for k, v in up.headers.items():
                if k.lower() not in _HOP:
                    resp.headers.add(k, v)
            if request.method == "HEAD" and "Content-Length" in up.headers:
                resp.headers["Content-Length"] = up.headers["Content-Length"]
            return resp

    async def session_ctx(app):
        app["session"] = aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=("User-Agent",
                                               "Accept-Encoding", "Content-Type"),
                                               connector=aiohttp.TCPConnector(limit=64))
        yield
        await app["session"].close()

    app = web.Application(client_max_size=1 << 31)
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


class Proxy:
    """proxy_main in a child on a free loopback port; counts() reads its tallies."""

    def __init__(self, upstream: str):
        from cdcstore.testing import free_port
        self.upstream = upstream
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> "Proxy":
        from cdcstore.testing import wait_until_up
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_proxy", self.upstream,
                                      str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_until_up(self.proc, urllib.request.Request(self.url + COUNTS_PATH),
                      lambda: self.proc.stderr.read().decode(errors="replace"))
        return self

    def counts(self) -> dict:
        with urllib.request.urlopen(self.url + COUNTS_PATH, timeout=30) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        from cdcstore.testing import stop_process
        stop_process(self.proc)


def diff_counts(before: dict, after: dict) -> dict:
    """{requests, bytes_in, bytes_out, by_method: {GET: n, ...}, by_kind: {"GET packs": n, ...}}
    between two counts() snapshots."""
    out = {"requests": 0, "bytes_in": 0, "bytes_out": 0, "by_method": {}, "by_kind": {}}
    for method, c in after.items():
        b = before.get(method, {})
        n = c["requests"] - b.get("requests", 0)
        if n:
            out["by_method"][method] = n
        for kind, k in c.get("kinds", {}).items():
            if k - b.get("kinds", {}).get(kind, 0):
                key = f"{method} {kind}"
                out["by_kind"][key] = k - b.get("kinds", {}).get(kind, 0)
        out["requests"] += n
        out["bytes_in"] += c["bytes_in"] - b.get("bytes_in", 0)
        out["bytes_out"] += c["bytes_out"] - b.get("bytes_out", 0)
    out["by_method"] = dict(sorted(out["by_method"].items()))
    out["by_kind"] = dict(sorted(out["by_kind"].items()))
    return out


class Counter:
    """Counts of the proxy over a window (`with counter.window() as w: ...; w.result`); a
    directory store has no proxy: every window is None."""

    def __init__(self, proxy: Proxy | None):
        self.proxy = proxy

    def window(self) -> "_Window":
        return _Window(self.proxy)


class _Window:
    def __init__(self, proxy):
        self.proxy, self.result = proxy, None

    def __enter__(self):
        self.before = self.proxy.counts() if self.proxy else None
        return self

    def __exit__(self, *exc):
        if self.proxy and exc[0] is None:
            self.result = diff_counts(self.before, self.proxy.counts())


# ---------------------------------------------------------------------------------------------
# the moto server (a child process)
# ---------------------------------------------------------------------------------------------

class Moto:
    def __init__(self):
        self.proc = None
        self.url = None

    def start(self) -> "Moto":
        self.proc = subprocess.Popen([sys.executable, "-c", MOTO], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise SystemExit("moto's server did not start: pip install 'moto[server]' (the test extra has it)")
        self.url = f"http://127.0.0.1:{int(line)}"
        import boto3
        boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
        return self

    def stop(self) -> None:
        from cdcstore.testing import stop_process
        stop_process(self.proc)


# ---------------------------------------------------------------------------------------------
# operations on a new machine: a child process with its own XDG_CACHE_HOME
# ---------------------------------------------------------------------------------------------

def op_main(kind: str, location: str, addr: str) -> None:
    """Child: one operation on a fresh machine; prints {"seconds", "bytes"|"entries"}."""
    import cdcstore
    from cdcstore import Store
    if location.startswith("s3://"):
        import cdcstore.storage.s3  # noqa: F401 - the client library is imported outside the timing
    t0 = time.perf_counter()
    with Store(location) as s:
        if kind == "open":
            with s.open(addr) as f:
                out = {"bytes": len(f.read())}
        elif kind == "ls":
            out = {"entries": len(s.ls(addr))}
        elif kind == "push":  # addr is "local path|cdc:// destination"
            path, dest = addr.split("|", 1)
            out = {"new_bytes": s.push([path], dest, "edit on a new machine").new_bytes}
        else:
            raise SystemExit(f"unknown op {kind!r}")
    out["seconds"] = time.perf_counter() - t0
    out["cdcstore"] = os.path.dirname(cdcstore.__file__)
    print(json.dumps(out))


def sqlite_bytes(path: str) -> int:
    """The logical size of a sqlite database (page_count x page_size: its pages still in the WAL
    counted, unused journal space not); the file's size when sqlite cannot read it."""
    import sqlite3
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            return con.execute("PRAGMA page_count").fetchone()[0] * con.execute("PRAGMA page_size").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return os.path.getsize(path)


def du(path: str) -> int:
    """Bytes of the files under path (0 when it does not exist); a sqlite database by its
    logical size (sqlite_bytes), its -wal/-shm files left out (a WAL holds up to ~4 MB of pages
    not yet checkpointed, copies of pages already counted)."""
    total = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            p = os.path.join(d, f)
            try:
                if f.endswith(("-wal", "-shm", "-journal")):
                    continue
                total += sqlite_bytes(p) if f.endswith((".sqlite", ".db")) else os.path.getsize(p)
            except OSError:
                pass
    return total


class Machines:
    """Environments of simulated machines: each a folder holding its XDG_CACHE_HOME."""

    def __init__(self, root: str, s3_endpoint: str | None):
        self.root = root
        self.n = 0
        self.base = {k: v for k, v in os.environ.items() if not k.startswith(("CDCSTORE_", "XDG_CACHE"))}
        self.base["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
        if s3_endpoint:
            self.base.update(AWS, AWS_ENDPOINT_URL=s3_endpoint)

    def new(self) -> tuple[str, dict]:
        self.n += 1
        home = os.path.join(self.root, f"machine-{self.n}")
        os.makedirs(home)
        return home, {**self.base, "XDG_CACHE_HOME": os.path.join(home, "cache")}


def child_op(machines: Machines, counter: Counter, kind: str, location: str, addr: str) -> dict:
    """One op in a child on a new machine: seconds, requests (bucket), the machine's cache bytes."""
    home, env = machines.new()
    with counter.window() as w:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--_op", kind, location, addr],
                           capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode:
        raise RuntimeError(f"{kind} of {addr} on a new machine failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["requests"] = w.result
    out["cache_bytes"] = du(os.path.join(env["XDG_CACHE_HOME"], "cdcstore"))
    shutil.rmtree(home, ignore_errors=True)
    return out


def replica_read(machines: Machines, counter: Counter, location: str, addr: str) -> dict:
    """A new `cdcstore serve` over the store (fresh cache dir): requests of its start, then the
    time and requests of the first read of `addr` through it (a client without a cache)."""
    from cdcstore import Store
    from cdcstore.testing import ServerProcess
    home, env = machines.new()
    server = ServerProcess(location, env=env)
    server.log_path = os.path.join(home, "server.log")  # never beside the store or in /tmp
    out: dict = {}
    try:
        with counter.window() as w:
            t0 = time.perf_counter()
            server.start()
            out["start_seconds"] = time.perf_counter() - t0
        out["start_requests"] = w.result
        with counter.window() as w:
            t0 = time.perf_counter()
            with Store(server.url, cache=False) as s, s.open(addr) as f:
                out["bytes"] = len(f.read())
            out["seconds"] = time.perf_counter() - t0
        out["requests"] = w.result
    except Exception as e:
        log = server.log_text() if os.path.exists(server.log_path) else ""
        raise RuntimeError(f"replica read of {addr} failed: {e}\n{log[-3000:]}") from e
    finally:
        if server.proc is not None:
            server.stop()
        shutil.rmtree(home, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------
# the writer machine (this process) and one store's run
# ---------------------------------------------------------------------------------------------

def attempt(name: str, fn) -> dict:
    """fn()'s figures, or {"error": ...} when the operation failed: a failure is a finding, recorded
    in the JSON and printed, and the run goes on (a broken store or server is not: see main)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any failure of the code measured
        text = str(e) or type(e).__name__
        print(f"  {name} FAILED: {text.splitlines()[0][:300]}", flush=True)
        return {"error": f"{type(e).__name__}: {text[:3000]}"}


def timed(counter: Counter, fn) -> dict:
    """fn() on the writer (this process): seconds and the proxy's counts."""
    with counter.window() as w:
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "requests": w.result}


def summary(runs: list[dict]) -> dict:
    """The median of repeated runs of one op (its counts: those of the run with the median total)."""
    out = {"seconds": med(r["seconds"] for r in runs), "seconds_all": [round(r["seconds"], 4) for r in runs]}
    counted = [r for r in runs if r.get("requests")]
    if counted:
        by_total = sorted(counted, key=lambda r: r["requests"]["requests"])
        out["requests"] = by_total[len(by_total) // 2]["requests"]
    for key in ("cache_bytes", "start_seconds", "bytes", "entries"):
        if key in runs[0]:
            out[key] = med(r[key] for r in runs)
    starts = [r["start_requests"] for r in runs if r.get("start_requests")]
    if starts:
        out["start_requests"] = sorted(starts, key=lambda c: c["requests"])[len(starts) // 2]
    return out


def objects_by_kind(store: str, location: str, moto_url: str | None) -> dict:
    """Objects in the store by top-level folder (packs, manifests, commits, ...), not through the proxy."""
    kinds: dict = {}
    if store == "bucket":
        import boto3
        s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        prefix = location.split("/", 3)[3].rstrip("/") + "/"
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            for o in page.get("Contents", []):
                k = o["Key"][len(prefix):].split("/")[0]
                kinds[k] = kinds.get(k, 0) + 1
    else:
        for entry in os.listdir(location):
            p = os.path.join(location, entry)
            kinds[entry] = sum(len(fs) for _, _, fs in os.walk(p)) if os.path.isdir(p) else 1
    return dict(sorted(kinds.items()))


def writer_index_bytes(store: str, location: str, writer_cache: str) -> int:
    """The writer's chunk index: its cache dir (bucket) or the store's index files (directory)."""
    if store == "bucket":
        return du(os.path.join(writer_cache, "cdcstore"))
    return sqlite_bytes(os.path.join(location, "index.sqlite"))


def run_store(store: str, location: str, files: int, versions: list[int], a, counter: Counter,
              machines: Machines, work: str, moto_url: str | None) -> tuple[dict, list[dict]]:
    """Grow one store of `files` files through `versions`, measuring at each; (first push, points)."""
    from cdcstore import Store
    from data import scale_edit, scale_files, scale_path
    folder = os.path.join(work, f"data-{files}")
    scale_files(folder, files, a.small_bytes)
    target = scale_path(files - 1)  # the file read and the folder listed
    dest = f"cdc://{REPO}/"
    now = 0
    edits = iter(range(10**9))

    def edit() -> str:
        i = (next(edits) * 7919) % files
        scale_edit(folder, i, now + 1, a.small_bytes)
        return scale_path(i)

    def push_folder():
        with Store(location) as s:
            s.push(folder, dest, "push")

    first = timed(counter, push_folder)
    now = 1
    print(f"  {store}: {files} files, first push {first['seconds']:.2f} s"
          + (f", {first['requests']['requests']:,} requests" if first["requests"] else ""), flush=True)
    repeat = a.repeat if files < a.big else a.big_repeat
    points = []
    for goal in versions:
        t0 = time.perf_counter()
        while now < goal:  # grow: GROW_EDITS files edited, uploaded, one commit
            with Store(location) as s:
                entries = {}
                for _ in range(GROW_EDITS):
                    rel = edit()
                    entries.update(s.upload(os.path.join(folder, rel), dest + rel))
                s.commit_entries(f"cdc://{REPO}", entries, f"version {now + 1}")
            now += 1
        grow_s = time.perf_counter() - t0
        p: dict = {"store": store, "files": files, "versions": now, "grow_seconds": round(grow_s, 3),
                   "objects": objects_by_kind(store, location, moto_url)}
        addr = f"cdc://{REPO}/{target}"
        ops: dict = {}
        ops["open_new"] = attempt("open_new", lambda: summary(
            [child_op(machines, counter, "open", location, addr) for _ in range(repeat)]))
        ops["ls_new"] = attempt("ls_new", lambda: summary(
            [child_op(machines, counter, "ls", location, f"cdc://{REPO}/{os.path.dirname(target)}")
             for _ in range(repeat)]))
        ops["replica"] = attempt("replica", lambda: summary(
            [replica_read(machines, counter, location, addr) for _ in range(repeat)]))
        p["index"] = {"reader_bytes": ops["open_new"].get("cache_bytes"),
                      "writer_bytes": writer_index_bytes(store, location, os.environ["XDG_CACHE_HOME"])}
        if files < a.big or a.big_edit_push:
            edit()
            ops["edit_push"] = attempt("edit_push", lambda: timed(counter, push_folder))
            now += 1
        else:  # O(files) requests today (measured on the smaller datasets): skipped to keep the run short
            ops["edit_push"] = None
        one = edit()

        def push_one():
            with Store(location) as s:
                s.push(os.path.join(folder, one), dest + one, "one file")
        ops["one_push"] = attempt("one_push", lambda: timed(counter, push_one))
        now += 1

        def edit_new():
            runs = []
            for _ in range(repeat):
                rel = edit()
                runs.append(child_op(machines, counter, "push", location,
                                     f"{os.path.join(folder, rel)}|{dest + rel}"))
            return summary(runs)
        ops["edit_new"] = attempt("edit_new", edit_new)
        now += repeat
        new = os.path.join(work, f"new-{files}-{now}")
        os.makedirs(new)
        for i in range(a.commit_files):
            with open(os.path.join(new, f"n{i:04d}.bin"), "wb") as f:
                f.write(os.urandom(a.small_bytes))
        held: dict = {}

        def upload():
            with Store(location) as s:
                held.update(s.upload(new, f"{dest}new/{now}/"))

        def commit():
            with Store(location) as s:
                s.commit_entries(f"cdc://{REPO}", held, f"{len(held)} uploaded files")
        ops["upload"] = attempt("upload", lambda: timed(counter, upload))
        ops["commit"] = attempt("commit", lambda: timed(counter, commit)) if held else {"error": "nothing uploaded"}
        now += 1
        shutil.rmtree(new, ignore_errors=True)
        p["ops"] = ops
        points.append(p)
        print("  " + row(p), flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return first, points


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

TABLE_OPS = ("open_new", "ls_new", "edit_push", "one_push", "edit_new", "upload", "commit", "replica")
HEAD = (f"{'store':<7}{'files':>7}{'vers':>5} | " + " | ".join(f"{o:>15}" for o in TABLE_OPS)
        + f" | {'repl.start':>10} | {'reader idx':>10} | {'writer idx':>10}")


def _cell(op: dict | None) -> str:
    if op is None:
        return "skipped"
    if "error" in op:
        return "FAILED"
    n = op.get("requests")
    return f"{(str(n['requests']) + ' r ') if n else ''}{op['seconds']:.2f} s"


def row(p: dict) -> str:
    o = p["ops"]
    start = o["replica"].get("start_requests")
    return (f"{p['store']:<7}{p['files']:>7}{p['versions']:>5} | " + " | ".join(f"{_cell(o[k]):>15}" for k in TABLE_OPS)
            + f" | {(str(start['requests']) + ' r') if start else '':>10} | {_kb(p['index']['reader_bytes']):>10}"
            + f" | {_kb(p['index']['writer_bytes']):>10}")


def _kb(n) -> str:
    return "" if n is None else f"{n / 1e3:.0f}kB"


def growth(points: list[dict], store: str, files: int, key) -> float | None:
    """key(point) at the most versions over key(point) at the fewest, for one store and dataset."""
    ps = sorted((p for p in points if p["store"] == store and p["files"] == files), key=lambda p: p["versions"])
    if len(ps) < 2:
        return None
    lo, hi = key(ps[0]), key(ps[-1])
    return hi / lo if lo else None


def _value(fn):
    """fn() or None when a figure it needs is missing (an op failed or was skipped)."""
    try:
        return fn()
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def goals_of(points: list[dict]) -> list[Goal]:
    """The issue's goals, on the bucket and the largest dataset grown through every version count."""
    bucket = [p for p in points if p["store"] == "bucket"]
    if not bucket:
        return []
    counts: dict = {}
    for p in bucket:
        counts.setdefault(p["files"], set()).add(p["versions"])
    full = max(counts, key=lambda f: (len(counts[f]), f))
    last = max((p for p in bucket if p["files"] == full), key=lambda p: p["versions"])
    req = lambda op: (lambda p: p["ops"][op]["requests"]["requests"])  # noqa: E731
    sec = lambda op: (lambda p: p["ops"][op]["seconds"])  # noqa: E731
    few = min(bucket, key=lambda p: (p["files"], p["versions"]))
    most = max(bucket, key=lambda p: (p["files"], p["versions"]))
    return [
        Goal(f"open_new_requests_growth_{full}_files", _value(lambda: growth(points, "bucket", full, req("open_new"))),
             1.0, "<="),
        Goal(f"edit_push_over_one_push_requests_{full}_files",
             _value(lambda: req("edit_push")(last) / req("one_push")(last)), 2.0, "<="),
        Goal(f"replica_first_read_seconds_growth_{full}_files",
             _value(lambda: growth(points, "bucket", full, sec("replica"))), 1.5, "<="),
        Goal("reader_index_bytes_largest_over_smallest_store",
             _value(lambda: most["index"]["reader_bytes"] / few["index"]["reader_bytes"]), 2.0, "<="),
        Goal("commit_bytes_largest_over_smallest_store",
             _value(lambda: most["ops"]["commit"]["requests"]["bytes_in"]
                    / max(1, few["ops"]["commit"]["requests"]["bytes_in"])), 2.0, "<="),
    ]


def parse_list(text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"{text!r}: give whole numbers separated by commas, e.g. 1,4,16") from None
    if not out or out[0] < 1:
        raise SystemExit(f"{text!r}: every number must be 1 or more")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", default="100,2000", help="dataset sizes (files), comma-separated "
                    "(issue 17's matrix: 100,2000,20000)")
    ap.add_argument("--versions", default="1,4,16,64", help="version counts measured at")
    ap.add_argument("--big-versions", default="1", help="version counts for datasets of >= --big files")
    ap.add_argument("--big-repeat", type=int, default=1, help="runs of each read-only op on big datasets")
    ap.add_argument("--big", type=int, default=10_000, help="datasets of this many files or more are big")
    ap.add_argument("--big-edit-push", action="store_true",
                    help="also push the whole folder after a one-file edit on big datasets (skipped by default: "
                         "~3 requests a file, ~7 ms each on moto here)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each read-only op (medians)")
    ap.add_argument("--stores", default="bucket,dir")
    ap.add_argument("--small-bytes", type=int, default=1024, help="mean file size (files are 0.5-1.5x this)")
    ap.add_argument("--commit-files", type=int, default=20, help="files of the upload + commit op")
    ap.add_argument("--quick", action="store_true", help="CI size: 30 and 200 files at 1 and 4 versions, 1 run")
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "cdcbench-scale"))
    ap.add_argument("--keep", action="store_true", help="keep the run's folder (stores, data) for inspection")
    a = ap.parse_args()
    if a.quick:
        a.files, a.versions, a.big_versions, a.repeat, a.big_repeat = "30,200", "1,4", "1", 1, 1
    stores = [s.strip() for s in a.stores.split(",") if s.strip()]
    if not stores or set(stores) - {"bucket", "dir"}:
        raise SystemExit(f"--stores {a.stores!r}: name bucket, dir or both")
    if a.repeat < 1 or a.big_repeat < 1 or a.commit_files < 1 or a.small_bytes < 2:
        raise SystemExit("--repeat, --big-repeat and --commit-files must be 1 or more, --small-bytes 2 or more")
    files, versions, big_versions = parse_list(a.files), parse_list(a.versions), parse_list(a.big_versions)
    opening = start("scale")
    work = run_dir(a.data_dir, "scale")
    writer_cache = os.path.join(work, "writer-cache")
    procs: list = []
    fig = {**opening, "args": vars(a), "code": code_version(), "points": [], "first_push": {}}

    def stop_all(*_):
        for p in reversed(procs):
            p.stop()
        procs.clear()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally: below stops the children
    try:
        os.environ["XDG_CACHE_HOME"] = writer_cache  # this process is the writer machine
        for var in [k for k in os.environ if k.startswith("CDCSTORE_")]:
            del os.environ[var]
        moto = proxy = None
        if "bucket" in stores:
            moto = Moto()
            procs.append(moto)
            moto.start()
            proxy = Proxy(moto.url)
            procs.append(proxy)
            proxy.start()
            os.environ.update(AWS, AWS_ENDPOINT_URL=proxy.url)
        print(f"scale: {', '.join(stores)}; datasets of {files} files of ~{a.small_bytes} B; versions "
              f"{versions} ({big_versions} for >= {a.big:,} files); {a.repeat} run(s) of each read", flush=True)
        from cdcstore import Store
        for n in files:
            vs = big_versions if n >= a.big else versions
            for store in stores:
                if store == "bucket":
                    location = f"s3://{BUCKET}/s{n}"
                    counter = Counter(proxy)
                else:
                    location = os.path.join(work, f"store-{n}")
                    counter = Counter(None)
                Store.init(location).close()
                machines = Machines(os.path.join(work, f"machines-{store}-{n}"),
                                    proxy.url if store == "bucket" else None)
                first, points = run_store(store, location, n, vs, a, counter, machines, work,
                                          moto.url if moto else None)
                fig["first_push"].setdefault(store, {})[str(n)] = first
                fig["points"] += points
                if store == "dir" and not a.keep:
                    shutil.rmtree(location, ignore_errors=True)
    finally:
        stop_all()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print("r: requests to the bucket (through the proxy); s: seconds (medians of the repeated reads)")
    print(HEAD)
    for p in fig["points"]:
        print(row(p))
    goals = goals_of(fig["points"])
    for g in goals:
        print(g.line(spec=".2f"))
    finish(fig, goals)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--_proxy":
        proxy_main(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 5 and sys.argv[1] == "--_op":
        op_main(*sys.argv[2:])
    else:
        main()

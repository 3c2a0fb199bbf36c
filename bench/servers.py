"""The servers of the bench scripts, owned by bench/ (it imports nothing from tests/).

  ServerProcess  a real `python -m cdcstore serve` subprocess on a free loopback port
                 (`cdcstore.testing`, the starter the tests use too; bench never loads tests/)
  StaticServer   a plain aiohttp static file server (transfer.py, fs.py, streaming/dataset.py,
                 cold_profile.py), a child running this file:
                 `python bench/servers.py --_static ROOT PORT [LOG [HOST]]` (link.py runs it in
                 a network namespace with HOST)
  logs           LogWindow (the lines a server appended since a point), the request counts of
                 the static server's and of cdcstore's access log lines

Children inherit PYTHONPATH, which chooses the cdcstore measured.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time


_STARTER = ("ServerProcess", "free_port", "stop_process", "wait_until_up")


def __getattr__(name: str):
    """The server starter is `cdcstore.testing`'s (the tests use it too), imported on first use:
    a static-server child loads only the standard library."""
    if name in _STARTER:
        import cdcstore.testing
        return getattr(cdcstore.testing, name)
    raise AttributeError(name)


# static file server

STATIC_FORMAT = '"%r" %s %b %{Content-Length}o'  # the access log line of StaticServer (fs.py parses it)


def static_main(root: str, port: int, log_path: str | None = None, host: str = "127.0.0.1") -> None:
    """Child: a plain aiohttp static file server over `root` on host:port (sendfile, Range
    support); with a log_path, it logs each request there with its status, bytes written and
    Content-Length (STATIC_FORMAT)."""
    from aiohttp import web
    access = None
    if log_path:
        import logging
        handler = logging.StreamHandler(open(log_path, "a", buffering=1))
        handler.setFormatter(logging.Formatter("%(message)s"))
        access = logging.getLogger("static.access")
        access.addHandler(handler)
        access.setLevel(logging.INFO)
    app = web.Application()
    app.router.add_static("/", root)
    if access is None:
        web.run_app(app, host=host, port=port, print=None, access_log=None)
    else:
        web.run_app(app, host=host, port=port, print=None, access_log=access,
                    access_log_format=STATIC_FORMAT)


class StaticServer:
    """static_main in a child process (`python bench/servers.py --_static ROOT PORT [LOG]`) on a
    free loopback port; start() returns once a HEAD of `probe` (a file under root) answers 200."""

    def __init__(self, root: str, probe: str, log_path: str | None = None):
        from cdcstore.testing import free_port
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.probe = probe
        self.log_path = log_path
        self.proc = None

    def start(self) -> StaticServer:
        import urllib.request

        from cdcstore.testing import wait_until_up
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_static", self.root,
                                      str(self.port)] + ([self.log_path] if self.log_path else []),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_until_up(self.proc, urllib.request.Request(f"{self.url}/{self.probe}", method="HEAD"),
                         lambda: self.proc.stderr.read().decode(errors="replace"))
        return self

    def stop(self) -> None:
        from cdcstore.testing import stop_process
        stop_process(self.proc)


# access logs (fs.py, streaming/dataset.py)

class LogWindow:
    """The lines a server appended to its log file between start() and lines()."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0

    def start(self) -> "LogWindow":
        self.offset = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        return self

    def lines(self, settle: float = 0.3) -> list[str]:
        time.sleep(settle)  # a server logs a request after its response went out
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace").splitlines()


# a line of STATIC_FORMAT ('"%r" %s %b %{Content-Length}o'), and one of cdcstore's access log
_STATIC_LINE = re.compile(r'"(\S+) (\S+) [^"]*" (\d{3}) (\d+) (\S+)')
_CDC_LINE = re.compile(r'cdcstore\.access \S+ "(\S+) (\S+) [^"]*" (\d{3}) (\d+) ')


def static_log(lines: list[str]) -> dict:
    """Requests and statuses in the static server's access log lines (aborted requests included)."""
    n = 0
    statuses: dict = {}
    for line in lines:
        m = _STATIC_LINE.search(line)
        if m:
            n += 1
            statuses[m.group(3)] = statuses.get(m.group(3), 0) + 1
    return {"server_requests": n, "statuses": statuses}




def cdc_kind(path: str) -> str:
    m = re.match(r"/v1/repos/[^/]+/(\w+)", path)
    if m:
        return m.group(1)
    return "repos" if path.rstrip("/") == "/v1/repos" else path.split("/")[2] if path.count("/") >= 2 else path


def cdc_requests(lines: list[str]) -> dict:
    """Request counts by kind (resolve, commits, manifests, locate, packs, ...) in the cdcstore
    server's access log lines. (Its %b is no byte count: headers only for files sent by
    sendfile, and short of the body for large answers.)"""
    kinds: dict = {}
    statuses: dict = {}
    for line in lines:
        m = _CDC_LINE.search(line)
        if not m:
            continue
        method, path, status, _ = m.groups()
        k = cdc_kind(path)
        kinds[k] = kinds.get(k, 0) + 1
        statuses[status] = statuses.get(status, 0) + 1
    return {"by_kind": dict(sorted(kinds.items())), "statuses": dict(sorted(statuses.items())),
            "total": sum(kinds.values())}


def main(argv: list[str]) -> None:
    """The child of StaticServer.start: --_static ROOT PORT [LOG [HOST]] (LOG "-": no access log)."""
    if len(argv) in (3, 4, 5) and argv[0] == "--_static":
        log = argv[3] if len(argv) > 3 and argv[3] != "-" else None
        static_main(argv[1], int(argv[2]), log, *argv[4:])
    else:
        sys.exit("usage: python bench/servers.py --_static ROOT PORT [LOG [HOST]] (StaticServer's child; "
                 "the benchmarks are the other scripts here)")


if __name__ == "__main__":
    main(sys.argv[1:])

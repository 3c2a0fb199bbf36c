"""A real `cdcstore serve` in a subprocess on a free loopback port (`ServerProcess`), and the
pieces it is made of (a free port, waiting for a health check, stopping a process). Exported by
`cdcstore.testing`; the served store of a test (`cdcstore.testing.served`) builds on it."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import IO, Any, Callable, Self


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until_up(proc: subprocess.Popen[Any], request: urllib.request.Request, exited: Callable[[], str],
                  timeout: float = 30) -> None:
    """Poll `request` until it answers 200; `exited()` describes a process that died."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {exited()}")
        try:
            with urllib.request.urlopen(request, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not come up")


def stop_process(proc: subprocess.Popen[Any] | None) -> None:
    """Terminate, then kill if it does not exit within 10 s."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _peak_rss_kib(pid: int) -> int | None:
    """A live process's peak resident set (VmHWM), in KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), None)
    except OSError:
        return None


class ServerProcess:
    def __init__(self, store: str, *args: str, port: int | None = None, env: dict[str, str] | None = None):
        self.store = store
        self.env = env  # the server's environment (None: this process's)
        self.args = args
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None
        folder = os.path.join(store, "..") if "://" not in store else tempfile.gettempdir()
        self.log_path = os.path.join(folder, f"server-{self.port}.log")

    def start(self) -> Self:
        self.log = open(self.log_path, "ab")
        self.proc = proc = subprocess.Popen(
            [sys.executable, "-m", "cdcstore", "serve", "--store", self.store, "--port", str(self.port), *self.args],
            stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        wait_until_up(proc, urllib.request.Request(self.url + "/v1/health"), self.log_text)
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        figures = os.environ.get("CDCSTORE_SERVER_FIGURES")  # a file: one JSON line per server stopped
        peak = _peak_rss_kib(self.proc.pid) if figures and self.proc and self.proc.poll() is None else None
        stop_process(self.proc)
        if self.log is not None:
            self.log.close()
        if figures:
            statuses = re.findall(r'" (\d{3}) ', self.log_text())
            with open(figures, "a") as f:
                f.write(json.dumps({"store": self.store, "peak_rss_kib": peak, "requests": len(statuses),
                                    "5xx": {c: statuses.count(c) for c in set(statuses) if c.startswith("5")}}) + "\n")

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def __enter__(self) -> Self:
        return self if self.proc else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

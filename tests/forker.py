"""Child processes without the interpreter start: a preloaded Python ("zygote") forks each child.

Tests that start dozens of short Python processes (CLI pushes, workers killed at random points)
spent most of each child's life importing: ~0.3-0.5 s of CPU a child on the CI machine. A
`Forker` imports the package once, then forks a child per `run()`: the child sets `sys.argv`,
redirects its stdout/stderr to files and runs the code or module as `python -c` / `python -m`
would, then exits through the interpreter's normal shutdown (atexit handlers, thread joins), or
dies of the signal the test sends. Children are real processes: a SIGKILL is a SIGKILL.

    with Forker(tmp_path) as fk:
        p = fk.run(["push", src, dest, "--store", root], module="cdcstore")
        assert p.wait() == 0, p.stderr()
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ZYGOTE = r"""
import gc, json, os, runpy, sys, threading
freeze, preload = sys.argv[1] == "freeze", sys.argv[2:]
for name in preload:
    __import__(name)
sys.modules["cdcstore.runtime"].finish_preloads()  # the package's own background imports end first
assert threading.active_count() == 1, "a preload started a thread: children would inherit a broken copy"
if freeze:
    # the collector leaves what the preload made alone: a child's exit no longer walks (and so
    # copies, page by page) the whole inherited heap, ~0.5-2 s of each child's exit under load
    gc.collect()
    gc.freeze()
commands, replies = sys.stdin, sys.stdout
for line in commands:
    cmd = json.loads(line)
    if "wait" in cmd:
        _, status = os.waitpid(cmd["wait"], 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        replies.write(json.dumps({"code": code}) + "\n")
        replies.flush()
        continue
    # made before the fork: a child killed at once still leaves its (empty) output files
    out = os.open(cmd["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(cmd["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    pid = os.fork()
    if pid:
        os.close(out)
        os.close(err)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        continue
    # the child: what `python -c CODE ARGS` or `python -m MODULE ARGS` would be
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, to in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, to)
        os.close(fd)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False, buffering=1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    if cmd.get("cwd"):
        os.chdir(cmd["cwd"])
    if cmd.get("environ") is not None:  # the whole environment, as subprocess's env= gives it
        os.environ.clear()
        os.environ.update(cmd["environ"])
    if cmd.get("env"):
        os.environ.update(cmd["env"])
    del commands, replies, line
    if cmd.get("module"):
        sys.argv = [cmd["module"], *cmd["argv"]]
        runpy.run_module(cmd["module"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *cmd["argv"]]
        exec(compile(cmd["code"], "<string>", "exec"), {"__name__": "__main__"})
    sys.exit(0)  # the interpreter's own shutdown, as at the end of a script
"""


class Child:
    """A forked child: its pid, exit code (negative: the signal that ended it) and output."""

    def __init__(self, forker: "Forker", pid: int, out: str, err: str):
        self.forker, self.pid, self.out_path, self.err_path = forker, pid, out, err
        self.returncode = None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; after `timeout` seconds the child is killed and TimeoutExpired raised."""
        if self.returncode is None and timeout is not None:
            end = time.monotonic() + timeout
            while not self.exited():
                if time.monotonic() > end:
                    self.send_signal(signal.SIGKILL)
                    self.wait()
                    raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
                time.sleep(0.005)
        if self.returncode is None:
            self.returncode = self.forker._ask({"wait": self.pid})["code"]
        return self.returncode

    def exited(self) -> bool:
        """Whether the child has ended (it stays a zombie until the forker reaps it in wait())."""
        if self.returncode is not None:
            return True
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    def stdout(self) -> str:
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def stderr(self) -> str:
        with open(self.err_path, errors="replace") as f:
            return f.read()


class Forker:
    def __init__(self, folder, preload=("cdcstore", "cdcstore.cli", "cdcstore.remote.client.store", "tqdm"),
                 env: dict | None = None, freeze: bool = True):
        """`freeze`: the preloaded objects are out of the collector's sight in the children
        (`gc.freeze`); False when a test is about the interpreter's own teardown."""
        self.folder, self.n = str(folder), 0
        env = {**os.environ, **(env or {}), "PYTHONPATH": ROOT}
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE, "freeze" if freeze else "-", *preload],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)
        self.children: list[Child] = []
        self.lock = threading.Lock()

    def _ask(self, cmd: dict) -> dict:
        with self.lock:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the forker exited ({self.proc.wait()})")
        return json.loads(line)

    def run(self, argv: list[str], code: str | None = None, module: str | None = None, cwd=None,
            env: dict | None = None, environ: dict | None = None) -> Child:
        """Start a child running `code` (as `python -c code *argv`) or `module` (`python -m`), with
        `environ` as its whole environment (default: the forker's) and `env` added to it (both read
        by what runs; the preloaded modules are imported already)."""
        assert (code is None) != (module is None)
        self.n += 1
        out, err = (os.path.join(self.folder, f"child-{self.n}.{k}") for k in ("out", "err"))
        reply = self._ask({"argv": [str(a) for a in argv], "code": code, "module": module, "out": out,
                           "err": err, "cwd": str(cwd) if cwd else None, "env": env, "environ": environ})
        child = Child(self, reply["pid"], out, err)
        self.children.append(child)
        return child

    def close(self) -> None:
        for c in self.children:
            if c.returncode is None:
                c.send_signal(signal.SIGKILL)
                c.wait()
        self.proc.stdin.close()
        self.proc.wait(30)

    def __enter__(self) -> "Forker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_shared: Forker | None = None
_shared_lock = threading.Lock()
# what commands import late, at a cost each: the S3 clients; pyarrow for Parquet pushes. None starts
# a thread. Only what the package or its test extra installs: a missing module ends the forker.
CLI_PRELOAD = ("cdcstore", "cdcstore.cli", "cdcstore.remote.client.store", "tqdm",
               "cdcstore.storage.s3", "s3fs", "obstore", "pyarrow.parquet")


def cli(args, env: dict | None = None, cwd=None, text: bool = False, timeout: float = 120,
        module: str = "cdcstore") -> subprocess.CompletedProcess:
    """`python -m cdcstore ARGS` with its output captured, as `subprocess.run(..., capture_output=True)`
    gives it, but forked from one preloaded Python shared by the session (~0.35 s of CPU less a
    command). `env`: the child's whole environment (default: this process's, as now). Stdin is
    /dev/null and stdout a file: commands that read stdin or care what stdout is use subprocess."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.proc.poll() is not None:
            folder = tempfile.mkdtemp(prefix="cdcstore-cli-forker-")
            _shared = Forker(folder, preload=CLI_PRELOAD)
            import atexit
            atexit.register(_close_shared, _shared, folder)
        fk = _shared
    child = fk.run([str(a) for a in args], module=module, cwd=cwd or os.getcwd(),
                   environ=dict(os.environ if env is None else env))
    try:
        code = child.wait(timeout)
    finally:
        fk.children.remove(child)
    with open(child.out_path, "rb") as f:
        out = f.read()
    with open(child.err_path, "rb") as f:
        err = f.read()
    os.unlink(child.out_path)
    os.unlink(child.err_path)
    if text:
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
    return subprocess.CompletedProcess([sys.executable, "-m", module, *map(str, args)], code, out, err)


def _close_shared(fk: Forker, folder: str) -> None:
    fk.close()
    shutil.rmtree(folder, ignore_errors=True)

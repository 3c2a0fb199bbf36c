"""The runtime: the process's thread pools, its event loop thread, and fork handling, in one place.

Storage, remote and engine code asks for a pool by name (`pool("encode", 4)`) or for the loop
(`loop()`), and never starts its own. Everything here belongs to one process: a forked child
(a DataLoader worker, a dask process) starts with none of its parent's threads, so the state is
dropped in the child (`os.register_at_fork`) and rebuilt on first use. `per_process(key, make)`
gives the same guarantee to other per-process values, `Local` to an object's own (its sqlite
connections, its HTTP session, its open descriptors), and `Lock` to its locks: no other module
compares process ids (tests/test_layers.py checks).

This module sits under the I/O layers (storage, remote, engine import it); it imports nothing
of cdcstore's.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import functools
import importlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Iterable, Iterator, TypeVar

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

_lock = threading.RLock()
_pid = os.getpid()
_pools: dict[tuple[str, int], concurrent.futures.ThreadPoolExecutor] = {}
_loop = None  # asyncio.AbstractEventLoop: asyncio is imported on first use (22 ms a start)
_values: dict[object, object] = {}


def _reset_after_fork() -> None:
    """In a forked child: forget the parent's threads (they do not exist here)."""
    global _lock, _pid, _pools, _loop, _values
    _lock = threading.RLock()  # the parent's lock may have been held by a thread that is gone
    _pid, _pools, _loop, _values = os.getpid(), {}, None, {}
    _preloads.clear()  # finished before the fork (`finish_preloads`)


os.register_at_fork(after_in_child=_reset_after_fork)


def around_fork(before: Callable[[], None], after: Callable[[], None]) -> None:
    """Run `before` in the parent just before each fork and `after` in both processes just after.
    For work inside a C library (sqlite) on a background thread: a fork in the middle of it would
    leave the library's own mutexes locked in the child, whose first call then hangs."""
    os.register_at_fork(before=before, after_in_parent=after, after_in_child=after)


_preloads: dict[str, threading.Thread] = {}  # module -> the thread importing it (this process)


def preload(*modules: str) -> None:
    """Import `modules` on a background thread, once per process, so that their first use later
    finds them loaded (pyarrow imports pandas, about 1 s, at a process's first `to_numpy`). A fork
    waits for these imports to finish: a child forked mid-import would inherit a half-made module."""
    with _lock:
        names = [m for m in modules if m not in sys.modules and m not in _preloads]
        for name in names:
            thread = threading.Thread(target=_import_quietly, args=(name,), daemon=True, name=f"cdcstore-import-{name}")
            _preloads[name] = thread
            thread.start()


def _import_quietly(name: str) -> None:
    with contextlib.suppress(Exception):  # absent or broken: its first real use says so
        importlib.import_module(name)


def finish_preloads() -> None:
    """Wait for the background imports `preload` started (a fork does, before it forks)."""
    for thread in list(_preloads.values()):
        thread.join(60)


os.register_at_fork(before=finish_preloads)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (the owner of a leftover temp file or shared folder)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_elsewhere(pid: int) -> bool:
    """Whether `pid` (from a leftover temp file's name) is another process that is gone."""
    return pid != os.getpid() and not pid_alive(pid)


def is_this_process(pid: int | None) -> bool:
    """Whether `pid` is this process (the owner check of a finalizer that a fork inherits)."""
    return pid == os.getpid()


def clean_dead_temps(folder: str, pid_of: Callable[[str], str | None] = lambda name: name.split("-", 1)[0]) -> int:
    """Remove the files of `folder` whose name says (`pid_of`) they belong to a process of
    this host that is gone (killed mid-write); returns how many."""
    n = 0
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for fn in names:
        pid = pid_of(fn) or ""
        if pid.isdigit() and dead_elsewhere(int(pid)):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(os.path.join(folder, fn))
                n += 1
    return n



_UNSET = object()


class Local:
    """One object's value that belongs to the process that made it: `get(make)` gives it, calling
    `make()` first in a process that has none yet (a forked child starts with none: the parent's
    threads, locks, sockets, sqlite connections and event loops are no use there). A pickled
    `Local` arrives empty. `stale(value)`, when given to `get`, receives the parent's value as it is
    dropped in a child (sqlite asks that an inherited connection be kept, never used or closed).
    The one place, with `Lock` and the pools, where code asks which process it is in."""

    __slots__ = ("_pid", "_value")
    _pid: int | None  # the process that made `_value` (None: none made yet)
    _value: object

    def __init__(self, value: object = _UNSET) -> None:
        self._pid, self._value = (None, None) if value is _UNSET else (os.getpid(), value)

    def get(self, make: Callable[[], T], stale: Callable[[object], None] | None = None) -> T:
        if self._pid != os.getpid():
            if self._pid is not None and stale is not None:
                stale(self._value)
            self._value, self._pid = make(), os.getpid()
        return self._value  # type: ignore[return-value]

    def here(self) -> Any:  # (whatever this Local holds: it is not generic)
        """The value made in this process, or None."""
        return self._value if self._pid == os.getpid() else None

    def set(self, value: object) -> None:
        self._value, self._pid = value, os.getpid()

    def clear(self) -> None:
        self._value, self._pid = None, None

    def __reduce__(self) -> tuple[type[Local], tuple[()]]:
        return Local, ()


def _check_pid() -> None:
    if _pid != os.getpid():  # a fork that bypassed register_at_fork (e.g. os.fork from C)
        _reset_after_fork()


def pool(name: str, workers: int, nice: int = 0) -> concurrent.futures.ThreadPoolExecutor:
    """The process's pool `name` with `workers` threads (created on first use, shared after).
    Callers wait for their own futures; nobody shuts a shared pool down. `nice` > 0: its threads
    run at that lower priority (Linux; work that should only take idle cores)."""
    key = (name, max(1, int(workers)))
    with _lock:
        _check_pid()
        p = _pools.get(key)
        if p is None:
            lower = functools.partial(_lowered, nice) if nice > 0 else None
            p = _pools[key] = concurrent.futures.ThreadPoolExecutor(
                key[1], thread_name_prefix=f"cdcstore-{name}", initializer=lower)
        return p


def _lowered(nice: int) -> None:
    """Lower the calling thread's priority by `nice` (on Linux a thread has its own)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (OSError, AttributeError):  # not Linux, or not allowed: the thread runs as the others
        pass


def loop() -> asyncio.AbstractEventLoop:
    """The process's event loop, running in a daemon thread (the HTTP client's)."""
    global _loop
    with _lock:
        _check_pid()
        if _loop is None:
            import asyncio

            lp = asyncio.new_event_loop()
            threading.Thread(target=lp.run_forever, name="cdcstore-loop", daemon=True).start()
            _loop = lp
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Run a coroutine on the process's loop; a future for its result."""
    import asyncio

    return asyncio.run_coroutine_threadsafe(coro, loop())


def per_process(key: object, make: Callable[[], T]) -> T:
    """The value `make()` built for `key` in this process (built again in a forked child)."""
    with _lock:
        _check_pid()
        if key not in _values:
            _values[key] = make()
        return _values[key]  # type: ignore[return-value]


class Lock:
    """A threading lock (or, `reentrant`, an RLock) that a forked child gets afresh: a copy of a
    lock that another thread held at the fork would never be released in the child (that thread
    does not exist there), and the child's first use would hang. For objects that cross a fork
    (a Store in DataLoader workers)."""

    __slots__ = ("_pid", "_lock", "_kind")

    def __init__(self, reentrant: bool = False):
        self._kind = threading.RLock if reentrant else threading.Lock
        self._pid, self._lock = os.getpid(), self._kind()

    def _current(self) -> threading.Lock | threading.RLock:
        if self._pid != os.getpid():
            self._pid, self._lock = os.getpid(), self._kind()
        return self._lock

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._current().acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> "Lock":
        self._current().acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if absent) for the block: the processes of a
    machine take turns (a ref move of a directory store, the tokens file, a cache's first fetch).
    The lock goes with the process: a SIGKILLed holder never leaves it taken."""
    import fcntl

    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def every(seconds: float, fn: Callable[[], object], name: str = "heartbeat") -> Callable[[], None]:
    """Call `fn` every `seconds` in a daemon thread until the returned `stop()` is called (a
    heartbeat: a long push keeps its session marker fresh). An exception in `fn` is kept out of
    the caller's way; the next beat tries again."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(seconds):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a missed beat is retried; the marker ages meanwhile
                pass

    thread(beat, name=name)
    return stop.set


def thread(target: Callable[..., object], *args, name: str = "thread", daemon: bool = True) -> threading.Thread:
    """Start `target(*args)` on a thread of its own, `cdcstore-NAME` (a daemon unless told), and
    return it: every thread the package starts outside the pools and the loop starts here."""
    t = threading.Thread(target=target, args=args, name=f"cdcstore-{name}", daemon=daemon)
    t.start()
    return t


def wait(futures: Iterable[concurrent.futures.Future]) -> None:
    """Wait until these futures are done (cancelled ones that had started finish first)."""
    concurrent.futures.wait(list(futures))


def stats() -> dict:
    """What runs in this process: pool names and sizes, and whether the loop runs."""
    with _lock:
        _check_pid()
        return {"pools": {f"{n}/{w}": w for n, w in _pools}, "loop": _loop is not None}


@atexit.register
def _shutdown() -> None:
    """At exit: let queued pool work finish quietly and stop the loop."""
    with _lock:
        if _pid != os.getpid():
            return
        for p in _pools.values():
            p.shutdown(wait=False, cancel_futures=True)
        if _loop is not None:
            _loop.call_soon_threadsafe(_loop.stop)


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_malloc_bounded = False


def bound_malloc(threshold: int = 4 << 20) -> bool:
    """In a process of our own (a DataLoader worker): allocations of `threshold` bytes or more
    get their own mapping, given back when freed. glibc otherwise raises its threshold to the
    largest block freed (up to 32 MiB), so a stream's row-group-sized buffers end up in arenas
    that keep their pages. True when set (glibc only; once per process)."""
    global _malloc_bounded
    if _malloc_bounded:
        return True
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _malloc_bounded = bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):  # not glibc
        _malloc_bounded = False
    return _malloc_bounded

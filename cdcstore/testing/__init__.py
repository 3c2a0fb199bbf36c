"""Testing helpers for your own code and your own backends.

Run a real `cdcstore serve` in a subprocess on a free loopback port: for tests of your own
pipelines against a server, and for cdcstore's own tests and benchmarks (one starter for both).

    with ServerProcess(store_dir).start() as server:   # or .start() ... .stop()
        Store(server.url).push(...)

`ServedStore(folder, tokens=..., gateway=...)` makes the store in a folder of the test's and
serves it (the fixtures `server` and `module_server` of cdcstore's own tests); `FaultProxy` (TCP:
cut or drip connections) and `StallingProxy` (HTTP: stall or rewrite answers) put faults between a
client and a server.

Conformance suites a third-party backend subclasses (they import pytest; this module does not):
`cdcstore.testing.backend.BackendTests` (a `Backend`: chunks, packs, manifests, commits, refs) and
`cdcstore.testing.objects.ObjectStoreTests` (an `ObjectStore`: names, ranges, listing,
conditional writes, processes). docs/backends.md shows how.
"""
from typing import Any, Callable

from .. import runtime
from .faults import FaultProxy, StallingProxy
from .process import ServerProcess, free_port, stop_process, wait_until_up
from .served import ServedStore

__all__ = ["FaultProxy", "ServedStore", "ServerProcess", "StallingProxy", "free_port", "in_threads", "stop_process",
           "wait_until_up"]


def in_threads(fn: Callable[[int], Any], n: int) -> list[Any]:
    """`fn(i)` for i in 0..n-1, each on a thread of its own, all at once: their results in order
    (the first error is raised once all are done)."""
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(e)
    threads = [runtime.thread(run, i, name=f"test-{i}", daemon=False) for i in range(n)]
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out

"""A served store: what a test of a client, the web UI or the S3 gateway starts from. A directory
store in a folder of the test's, with the tokens the test gives, served by a real `cdcstore serve`
on a free loopback port (a `ServerProcess`: the store, its tokens file and the server's log all
sit in that folder).

    with ServedStore(tmp_path, tokens={"tok": {"scope": "write", "repos": ["*"]}}) as srv:
        Store(srv.url, token="tok").push(...)

cdcstore's own tests take it as the pytest fixtures `server` (one a test) and `module_server`
(one a module), configured with a `served` marker (tests/conftest.py).
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Self

from ..api import Store
from .process import ServerProcess, free_port


class ServedStore(ServerProcess):
    """`cdcstore serve` over the directory store `root/<name>` (made empty when there is none
    there yet; a store the test filled first is served as it is), on a free loopback port.

    tokens: written to `root/tokens.json` and served (`--tokens`); None: an open server
    gateway: the S3 gateway too, on a free port of its own (`s3`: its URL, `hostport`)
    args: more `cdcstore serve` options (`--limit KEY=VALUE`, `--min-gc-grace 0`, ...)
    env: the server's whole environment (None: this process's)

    `root` is the folder (a Path), `store` the served store's path; start() and stop() as a
    ServerProcess's, or `with` (started on entry, stopped on exit)."""

    def __init__(self, root: str | os.PathLike[str], *args: str, tokens: dict[str, dict] | None = None,
                 gateway: bool = False, env: dict[str, str] | None = None, port: int | None = None,
                 name: str = "srv"):
        self.root = pathlib.Path(root)
        self.tokens = tokens
        self.tokens_path = str(self.root / "tokens.json") if tokens is not None else None
        self.s3_port = free_port() if gateway else None
        self.s3 = f"http://127.0.0.1:{self.s3_port}" if self.s3_port else None
        self.hostport = f"127.0.0.1:{self.s3_port}" if self.s3_port else None
        options = list(args)
        if self.tokens_path is not None:
            options = ["--tokens", self.tokens_path, *options]
        if self.s3_port is not None:
            options += ["--s3-port", str(self.s3_port)]
        super().__init__(str(self.root / name), *options, port=port, env=env)

    def start(self) -> Self:
        if not os.path.exists(self.store):
            Store.init(self.store).close()
        if self.tokens_path is not None:
            with open(self.tokens_path, "w") as f:
                json.dump(self.tokens, f)
        super().start()
        return self

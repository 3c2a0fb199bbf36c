"""`cdcstore serve`: one process serving a store, the native protocol's routes (server/), the
read-only web view (web/) and, with `--s3-port`, the S3 gateway (gateway/), over one `Server`."""
from __future__ import annotations

import errno
import logging
import os
from typing import cast

from aiohttp import web

from ..core import ids, wire
from ..core.errors import CdcError, InvalidAddressError
from ..storage.repository import Repository, open_repository
from .server.admin import Lifecycle
from .server.app import Server, ServerConfig, errors_middleware
from .server.limits import ServerLimits
from .server.routes import SERVER, STORE_ROOTS
from .server.staging import StagingRoutes
from .server.tokens import TokenFile
from .web.view import WebView

log = logging.getLogger("cdcstore.server")


def _store_id(store: Repository) -> str:
    """The id every answer names the store by (`wire.STORE_HEADER`): its `store-id`, made now for a
    store that has none; a store that cannot be written gets a stable one from its identity."""
    try:
        return store.store_id()
    except (OSError, CdcError):
        return ids.weak_hexdigest(store.identity.encode())


async def _name_store(response: web.StreamResponse, sid: str) -> None:
    response.headers[wire.STORE_HEADER] = sid


@web.middleware
async def _serving_middleware(request: web.Request, handler):
    with cast(Server, request.app[SERVER]).serving():  # (the key holds a Server: `make_app`)
        return await handler(request)


def make_app(store: Repository, config: ServerConfig | None = None) -> web.Application:
    config = config or ServerConfig()
    s = Server(store, config)
    app = web.Application(middlewares=[_serving_middleware, errors_middleware],
                          client_max_size=config.limits.max_json_bytes)
    app.on_startup.append(s.on_startup)
    app.on_cleanup.append(s.on_cleanup)
    roots = {store.location} | ({os.path.realpath(store.location)} if os.path.isdir(store.location) else set())
    app[STORE_ROOTS] = tuple(sorted(roots, key=len, reverse=True))
    app[SERVER] = s
    sid = _store_id(store)
    app.on_response_prepare.append(lambda request, response: _name_store(response, sid))
    api = wire.API
    app.add_routes([
        web.get(f"{api}/health", s.health),
        web.get(f"{api}/stats", s.stats),
        *s.packs.routes(api),
        *s.metadata.routes(api),
        *s.refs.routes(api),
        *Lifecycle(s).routes(api),
        *StagingRoutes(s).routes(api),
        *WebView(s).routes(),  # the read-only web view under /ui/ (remote/web/view.py)
    ])
    return app


LOOPBACK = ("127.0.0.1", "::1", "localhost")


class OneLineErrors(logging.Filter):
    """aiohttp logs each malformed request with a traceback: keep one line that names it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            e = record.exc_info[1]
            text = " ".join(str(e).split())[:200]
            record.msg, record.args = f"{record.getMessage()}: {type(e).__name__}: {text}", ()
            record.exc_info = record.exc_text = None
        return True


def serve(store_path: str, host: str, port: int, tokens_file: str | None = None,
          allow_open: bool = False, max_heavy: int | None = None, limit_items=(), s3_port: int | None = None,
          publisher=None, **limits) -> None:
    """Run the server until interrupted. Without tokens it only binds loopback,
    unless `allow_open` says otherwise explicitly. `limit_items`: NAME=VALUE overrides
    of `ServerLimits` (`cdcstore serve --limit`). `s3_port`: also serve the S3 read
    gateway (remote/gateway/reads.py) on that port of `host`; `publisher(repository)` (publish.Publisher)
    is what its writes store and commit through (None: writes answer 501)."""
    tokens = TokenFile(tokens_file) if tokens_file else None
    if tokens is None:
        if host not in LOOPBACK and not allow_open:
            raise InvalidAddressError(
                f"refusing to serve {host} without --tokens: anyone could read and write. "
                f"Pass --tokens FILE, bind 127.0.0.1, or add --allow-no-auth to accept the risk")
    # said at once: opening a large store (its index, packs a killed push left) and binding can take a while
    print(f"cdcstore serve: opening {store_path} and starting on {host}:{port} ...", flush=True)
    store = open_repository(store_path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiohttp.server").addFilter(OneLineErrors())
    config = ServerConfig(tokens=tokens, max_heavy=max_heavy, limits=ServerLimits.parse(limit_items), **limits)
    app = make_app(store, config)
    if s3_port is not None:
        from .gateway.reads import listen
        from .gateway.writes import writes_over
        listen(app, host, s3_port, native_port=port, writes=writes_over(publisher(store)) if publisher else None)

    def announce(_msg: str) -> None:  # run_app calls this only once it listens: bind first, announce after
        if tokens is None:
            log.warning("serving without authentication (no --tokens): anyone who can connect can write")
        print(f"cdcstore serving {store.location} on http://{host}:{port}{wire.API}", flush=True)
        print(f"cdcstore web view (read-only) on http://{host}:{port}/ui/", flush=True)

    try:
        web.run_app(app, host=host, port=port, print=announce,
                    access_log=logging.getLogger("cdcstore.access"), access_log_format='%a "%r" %s %b %Tfs')
    except OSError as e:
        if e.errno == errno.EADDRINUSE or "address already in use" in str(e):
            raise InvalidAddressError(f"port {port} is in use: pick another with --port") from None
        raise
    finally:
        store.close()

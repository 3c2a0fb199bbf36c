"""A server that lies to the client: a small real aiohttp proxy on loopback, in front of a real
`cdcstore serve`, that forwards every request and answers some of them wrongly (a huge range, an
HTML page, silence, flipped bytes). The client must bound what it accepts, give up on a stalled
server in seconds, and say so in one clear line (issue 19)."""
import asyncio
import os
import random
import subprocess
import sys
import threading
import time

import aiohttp
import pytest
from aiohttp import web

from cdcstore import Store
from cdcstore.core.errors import CorruptionError, RemoteError
import forker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LyingProxy:
    """Forwards to `upstream`; `lie(request, body)` may return a response (or a coroutine that
    does), else the upstream's answer is passed on. `sent` counts the bytes of lying bodies sent."""

    def __init__(self, upstream: str, lie):
        self.upstream, self.lie = upstream, lie
        self.sent = 0
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "LyingProxy":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _stop(self) -> None:
        await self.session.close()
        await self.runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        answer = self.lie(self, request, body)
        if asyncio.iscoroutine(answer):
            answer = await answer
        if answer is not None:
            return answer
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self.session.request(request.method, self.upstream + request.path_qs, data=body,
                                        headers=headers) as r:
            data = await r.read()
            keep = {k: v for k, v in r.headers.items()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection")}
            return web.Response(status=r.status, body=data, headers=keep)


def _is_range(request) -> bool:
    return request.method == "GET" and "/packs/" in request.path and "Range" in request.headers


def _pushed(server, tmp_path, data: bytes, name: str = "f.bin") -> bytes:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / name).write_bytes(data)
    with Store(server.url, cache=False) as s:
        s.push([str(src)], "cdc://r/")
    return data


def _text(n: int, seed: int = 1) -> bytes:
    """Compressible but not trivially so: zstd chunks, read through decoded (not landed) ranges."""
    return random.Random(seed).randbytes((n + 1) // 2).hex().encode()[:n]


def _cli(*args, env=None, timeout=60):
    return forker.cli(args, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})


def test_a_range_answer_longer_than_asked_is_refused_without_reading_it(server, tmp_path):
    """A 206 that claims (and streams) 64 MiB for a range of a few KiB: the client refuses it once
    it passes the range's length, and never holds it (old: resp.read() took it all)."""
    data = _pushed(server, tmp_path, _text(200_000))

    async def huge(proxy, request, body):
        if not _is_range(request):
            return None
        total = 64 << 20
        resp = web.StreamResponse(status=206, headers={"Content-Length": str(total)})
        await resp.prepare(request)
        piece = b"\0" * (1 << 20)
        try:
            for _ in range(total // len(piece)):
                await resp.write(piece)
                proxy.sent += len(piece)
        except (ConnectionError, aiohttp.ClientError, asyncio.CancelledError):
            pass
        return resp

    with LyingProxy(server.url, huge) as proxy:
        with Store(proxy.url, cache=False, retries=0) as s:
            with pytest.raises((CorruptionError, RemoteError), match="more than|longer|bytes"):
                s.cat("cdc://r/f.bin")
    assert proxy.sent < 16 << 20, f"the client read {proxy.sent} bytes of a lying answer"
    assert len(data) == 200_000


def test_an_html_page_instead_of_json_is_one_clear_line_naming_the_server(server, tmp_path):
    _pushed(server, tmp_path, _text(50_000))

    def html(proxy, request, body):
        if request.method == "GET" and request.path != "/v1/health":
            return web.Response(status=200, text="<html><body>Welcome to nginx!</body></html>",
                                content_type="text/html")
        return None

    with LyingProxy(server.url, html) as proxy:
        for cmd in (["ls", "cdc://r/"], ["cat", "cdc://r/f.bin"]):
            p = _cli(*cmd, "--store", proxy.url)
            assert p.returncode == 1, p
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in p.stderr and "JSONDecode" not in p.stderr, p.stderr
            assert proxy.url in lines[0] and "not" in lines[0], lines[0]


def test_a_stalled_server_is_given_up_on_in_seconds_in_total(server, tmp_path):
    """A server that accepts and never answers: the whole request (all retries) gives up after the
    configured timeout, not after retries x timeout (old: 7 x 60 s by default)."""
    _pushed(server, tmp_path, _text(50_000))

    async def stall(proxy, request, body):
        if request.path != "/v1/health":
            await asyncio.sleep(3600)
        return None

    with LyingProxy(server.url, stall) as proxy:
        t0 = time.monotonic()
        p = _cli("ls", "cdc://r/", "--store", proxy.url, env={"CDCSTORE_TIMEOUT": "2"})
        took = time.monotonic() - t0
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "stalled" in p.stderr and "CDCSTORE_TIMEOUT" in p.stderr, p.stderr
    assert took < 8, f"gave up after {took:.1f} s"


def test_the_default_timeout_for_a_stalled_server_is_seconds():
    from cdcstore.remote.client.store import Transport

    t = Transport("http://127.0.0.1:1")
    assert t.timeout <= 30  # the whole budget of a stalled request, retries included


def test_a_corruption_error_is_one_line_and_no_task_left_unretrieved(server, tmp_path):
    """Every range answer of a many-range read cut short: `cat` says CorruptionError in one line;
    no asyncio "Task exception was never retrieved" traceback follows it (old: 8 of 8 runs)."""
    _pushed(server, tmp_path, _text(1_000_000, seed=2))

    async def cut(proxy, request, body):
        if not _is_range(request):
            return None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with proxy.session.get(proxy.upstream + request.path_qs, headers=headers) as r:
            data = bytearray(await r.read())
        if not request.headers["Range"].startswith("bytes=0-"):
            await asyncio.sleep(0.3)  # the others fail after the client gave up on the read
        return web.Response(status=r.status, body=bytes(data[:len(data) // 2]),
                            headers={"Content-Range": r.headers["Content-Range"]})

    script = ("import sys\nfrom cdcstore import Store\nfrom cdcstore.core.errors import CdcError\n"
              "try:\n"
              "    with Store(sys.argv[1], cache=False, range_bytes=64 << 10) as s:\n"
              "        s.cat('cdc://r/f.bin')\n"
              "except CdcError as e:\n"
              "    print('error:', type(e).__name__, file=sys.stderr)\n"
              "import gc, time\n"
              "time.sleep(1)  # a training job that caught the error goes on\n"
              "gc.collect()\n")
    with LyingProxy(server.url, cut) as proxy:
        p = subprocess.run([sys.executable, "-c", script, proxy.url], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": ROOT})
        c = _cli("cat", "cdc://r/f.bin", "--store", proxy.url)
    assert p.stderr.strip() == "error: CorruptionError", p.stderr
    assert c.returncode == 1 and len(c.stderr.strip().splitlines()) == 1, c.stderr
    assert "never retrieved" not in c.stderr + p.stderr


def test_a_raw_range_answer_longer_than_asked_is_refused_too(server, tmp_path):
    """The same lie on a range received straight into the reader's buffer (raw chunks)."""
    _pushed(server, tmp_path, os.urandom(300_000))

    async def huge(proxy, request, body):
        if not _is_range(request):
            return None
        resp = web.StreamResponse(status=206)  # no Content-Length: the client must count
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            for _ in range(64):
                await resp.write(b"\0" * (1 << 20))
                proxy.sent += 1 << 20
        except (ConnectionError, aiohttp.ClientError, asyncio.CancelledError):
            pass
        return resp

    with LyingProxy(server.url, huge) as proxy:
        with Store(proxy.url, cache=False, retries=0) as s:
            with pytest.raises((CorruptionError, RemoteError)):
                s.cat("cdc://r/f.bin")
    assert proxy.sent < 16 << 20, f"the client read {proxy.sent} bytes of a lying answer"


def test_locations_claiming_a_huge_chunk_are_refused_before_any_range_is_asked(server, tmp_path):
    """A lying `locate` answer (a 4 GiB stored length) would make the client ask for, and accept,
    a 4 GiB range: the locations are refused first."""
    from cdcstore.core import wire

    _pushed(server, tmp_path, _text(50_000))
    ranges = []

    async def lie(proxy, request, body):
        if _is_range(request):
            ranges.append(request.headers["Range"])
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        if "locations" in request.query:  # answer as a server before protocol 1.3: the reader then locates
            async with proxy.session.get(proxy.upstream + request.path, headers=headers) as r:
                return web.Response(status=r.status, body=await r.read())
        if request.method != "POST" or not request.path.endswith("/locate"):
            return None
        async with proxy.session.post(proxy.upstream + request.path_qs, data=body, headers=headers) as r:
            data = bytearray(await r.read())
        rec = wire.LOCATE
        for k in range(len(data) // rec.size):
            cid, pack, off, slen, rlen, codec = rec.unpack_from(data, k * rec.size)
            rec.pack_into(data, k * rec.size, cid, pack, off, 0xFFFFFFF0, rlen, codec)
        return web.Response(status=200, body=bytes(data))

    with LyingProxy(server.url, lie) as proxy:
        with Store(proxy.url, cache=False, retries=0) as s:
            with pytest.raises(CorruptionError, match="location answer"):
                s.cat("cdc://r/f.bin")
    assert not ranges

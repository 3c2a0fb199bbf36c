"""Issue 43 case 9: a client hanging up mid-GET was logged as `500 internal error` with a
traceback (`ClientConnectionResetError`). A hang-up is the client's choice: one quiet line, no
500, no traceback, and the server serves the next request. A real `cdcstore serve` with its
gateway; raw sockets hang up after the headers."""
import os
import socket
import time
import urllib.parse

import requests

from server_util import seeded_gateway


def _hang_up(url: str, path: str, wait: float = 0.0) -> None:
    u = urllib.parse.urlsplit(url)
    with socket.create_connection((u.hostname, u.port)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\n\r\n".encode())
        s.recv(4096)  # the headers and a little of the body, then gone
        time.sleep(wait)  # the server blocked on a full socket meanwhile
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST


def test_a_client_hanging_up_mid_get_is_not_a_500(tmp_path):
    big = os.urandom(24 << 20).hex()  # 48 MB of text: far more than a socket buffer holds
    srv = seeded_gateway(tmp_path, {"big.txt": big}, ["ds"])
    pack = next(f[:-5] for _, _, fs in os.walk(tmp_path / "srv" / "packs") for f in fs if f.endswith(".pack"))
    try:
        for wait in (0.0, 0.3, 1.0):
            _hang_up(srv.s3, "/ds/main/big.txt", wait)
            _hang_up(srv.url, "/ui/r/ds/raw/main/big.txt", wait)
            _hang_up(srv.url, f"/v1/repos/ds/packs/{pack}", wait)
        time.sleep(1.0)
        assert requests.get(srv.s3 + "/ds/main/big.txt", headers={"Range": "bytes=0-9"}).content == big[:10].encode()
        log = srv.log_text()
        assert "internal error" not in log and "Traceback" not in log, log[-3000:]
        assert '" 500 ' not in log
    finally:
        srv.stop()

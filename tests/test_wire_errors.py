"""Errors cross the wire as codes: the client raises the server's exception class, and never
guesses it from the message text when a code is there."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cdcstore import RepoNotFoundError, Store
from cdcstore.core.errors import RefExistsError, RemoteError, RevisionNotFoundError


def _pushed(server, tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"x" * 1000)
    s = Store(server.url, cache=False)
    s.push([str(f)], "cdc://r/a.bin")
    return s


def test_server_errors_arrive_as_their_classes(server, tmp_path):
    s = _pushed(server, tmp_path)
    s.tag("r", "v1")
    with pytest.raises(RefExistsError):
        s.tag("r", "v1")
    with pytest.raises(RepoNotFoundError):
        s.branches("nope")
    with pytest.raises(RevisionNotFoundError):
        s.resolve("cdc://r@nobranch/")
    s.close()


class _Fixed(BaseHTTPRequestHandler):
    """Answers every request with one fixed error body."""
    answer: tuple[int, dict] = (409, {})

    def _send(self):
        status, doc = self.answer
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _send

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("doc, expected", [
    # a code wins over the words in the message
    ({"error": "tag v1 already exists", "status": 409, "code": "refused"}, RemoteError),
    ({"error": "no repo 'x'", "status": 404, "code": "revision_not_found"}, RevisionNotFoundError),
    # an old server (no code): the status and the message, as before protocol 1.2
    ({"error": "tag v1 already exists", "status": 409}, RefExistsError),
    # an unknown code falls back to the status
    ({"error": "something", "status": 409, "code": "from_the_future"}, RemoteError),
])
def test_the_client_maps_codes_not_messages(doc, expected):
    handler = type("H", (_Fixed,), {"answer": (doc["status"], doc)})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        s = Store(f"http://127.0.0.1:{srv.server_address[1]}", cache=False, retries=0)
        with pytest.raises(expected) as e:
            s.branches("x")
        assert type(e.value) is expected
        assert doc["error"] in str(e.value)
        s.close()
    finally:
        srv.shutdown()

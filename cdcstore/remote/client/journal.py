"""Job journals and manifest presence over the wire, the client side (protocol 1.5; the routes are
`remote/server/staging.py`'s): `RemoteJournal`, the journal role over a `RemoteStore`, and
`manifests_present`. Kept apart from the routes so that a client imports no server code."""
from __future__ import annotations

import json

from ...core.errors import NotFoundError
from ...storage import staging

MAX_PRESENCE_NAMES = 65536  # manifest names a presence query carries (the server's bound too)


class RemoteJournal:
    """The journal role (open, add, batches, close) over a `RemoteStore`."""

    def __init__(self, remote):
        self.remote = remote

    def _path(self, repo: str, job: str) -> str:
        return f"/repos/{repo}/jobs/{staging.check_job(job)}"

    def open(self, repo: str, job: str) -> None:
        try:
            self.remote._json("PUT", self._path(repo, job), body=b"{}", headers={"Content-Type": "application/json"})
        except NotFoundError as e:
            if "no repo" in str(e):
                raise
            raise NotFoundError(f"the server at {self.remote.location} has no job journals (protocol 1.5): "
                                f"upgrade it to run deferred commits and fsspec transactions") from None

    def add(self, repo: str, job: str, entries: dict) -> None:
        self.remote._call("POST", self._path(repo, job) + "/entries", body=staging.encode(entries),
                          headers={"Content-Type": "application/json"})

    def batches(self, repo: str, job: str) -> list:
        doc = self.remote._json("GET", self._path(repo, job) + "/entries")
        out = []  # each batch validated as if read from the store
        for rows in doc.get("batches", []):
            out.append(staging.decode(json.dumps({"format": staging.JOURNAL_VERSION, "entries": rows}).encode(),
                                      "a journal entry from the server"))
        return out

    def close(self, repo: str, job: str) -> None:
        self.remote._call("DELETE", self._path(repo, job))


def manifests_present(remote, repo: str, names: list[str]) -> set[str] | None:
    """Which manifests the server holds (that `repo` reaches, for a scoped token): one request per
    65,536 names; None from a server before protocol 1.5 (no such route)."""
    out: set[str] = set()
    for i in range(0, len(names), MAX_PRESENCE_NAMES):
        part = names[i:i + MAX_PRESENCE_NAMES]
        try:
            doc = remote._json("POST", f"/repos/{repo}/manifests/query", body=json.dumps({"manifests": part}).encode(),
                               headers={"Content-Type": "application/json"})
        except NotFoundError as e:
            if "no repo" in str(e) or getattr(e, "code", "") == "repo_not_found":
                return set()
            return None
        asked = set(part)
        out.update(n for n in doc.get("present", []) if n in asked)
    return out

import os
import sys

import pytest
import xxhash

sys.path.insert(0, os.path.dirname(__file__))

from cdcstore import Store  # noqa: E402
from cdcstore.storage.repository import LocalStore  # noqa: E402
from server_util import ServerProcess  # noqa: E402


def golden_input(n: int) -> bytes:
    """Deterministic pseudo-random bytes, defined by xxh3-128 of a counter."""
    return b"".join(xxhash.xxh3_128_digest(i.to_bytes(8, "little")) for i in range((n + 15) // 16))[:n]


@pytest.fixture
def store(tmp_path):
    s = Store.init(str(tmp_path / "store"))
    yield s
    s.close()


@pytest.fixture
def server(tmp_path):
    """A real `cdcstore serve` on a free loopback port, over a fresh store."""
    LocalStore.init(str(tmp_path / "srv"))
    s = ServerProcess(str(tmp_path / "srv")).start()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _isolated_default_store(tmp_path, monkeypatch):
    """Never touch the user's real default store from tests."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for var in ("CDCSTORE_STORE", "CDCSTORE_CACHE", "CDCSTORE_CACHE_SIZE", "CDCSTORE_TOKEN"):
        monkeypatch.delenv(var, raising=False)

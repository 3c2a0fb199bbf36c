"""Issue 19, "a stalled server: the client gives up after 437 s", for buckets: an S3 endpoint that
accepts a request and then never answers (or answers its headers and stalls the body) fails the
request in about $CDCSTORE_TIMEOUT seconds with one line naming the endpoint, saying it stalled and
naming the knob, with both S3 clients; a push it stalls leaves nothing half-visible.

The endpoint is a real loopback HTTP proxy in front of moto's S3 server that passes requests on
until the test tells it to stall some of them (cdcstore.testing.StallingProxy)."""
import secrets
import time

import pytest
from click.testing import CliRunner

from cdcstore import Store
from cdcstore.cli import cli
from cdcstore.storage import s3
from cdcstore.testing import StallingProxy
from conftest import S3_BUCKET, golden_input

CLIENTS = ["obstore", "s3fs"]


@pytest.fixture
def proxy(s3_endpoint):
    p = StallingProxy(s3_endpoint)
    yield p
    p.close()


@pytest.fixture(params=CLIENTS)
def stalling(request, s3_env, proxy, tmp_path, monkeypatch):
    """A store in the bucket with repo ds (a.bin, 300 KB), reached through the proxy with
    CDCSTORE_TIMEOUT=1 and one S3 client; yields (url, data)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "writer"))
    url = f"s3://{S3_BUCKET}/stall-{secrets.token_hex(4)}"
    data = golden_input(300_000)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(data)
    with Store.init(url) as s:
        s.push([str(src)], "cdc://ds/")
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv(s3.CLIENT_ENV, request.param)
    monkeypatch.setenv("CDCSTORE_TIMEOUT", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "reader"))  # a machine that has read nothing
    Store(url).close()  # this process's client for the proxy is made (and the proxy passes requests)
    yield url, data


def _assert_clear(message: str, proxy: StallingProxy) -> None:
    assert "stalled" in message, message
    assert proxy.url in message, message  # names the endpoint
    assert "CDCSTORE_TIMEOUT" in message, message  # names the knob
    assert "\n" not in message.strip() and "Traceback" not in message, message


def test_a_silent_endpoint_fails_a_read_in_seconds(stalling, proxy):
    """Every request stalls: `cat` gives up in about CDCSTORE_TIMEOUT (1 s here), one line, exit 1."""
    url, _ = stalling
    proxy.rule = lambda method, path: "silent"
    began = time.monotonic()
    r = CliRunner().invoke(cli, ["cat", "cdc://ds/a.bin", "--store", url])
    took = time.monotonic() - began
    assert r.exit_code == 1, (r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    _assert_clear(r.output, proxy)
    assert proxy.stalled and took < 2.5, (took, proxy.stalled)


def test_a_body_that_stalls_mid_stream_fails_a_read_in_seconds(stalling, proxy):
    """The store opens; then each pack range answers its headers and half its bytes, and stops:
    Store.open().read() gives up in seconds with the clear error, never a short read."""
    url, data = stalling
    with Store(url) as s:
        assert s.ls("cdc://ds/")  # the store and repo open through the proxy
        proxy.rule = lambda method, path: "body" if method == "GET" and "/packs/" in path else None
        began = time.monotonic()
        with pytest.raises(OSError) as e:
            with s.open("cdc://ds/a.bin") as f:
                got = f.read()
                assert got == data  # never reached: a stalled body is not a short read
        took = time.monotonic() - began
    _assert_clear(str(e.value), proxy)
    assert any(a == "body" for _, _, a in proxy.stalled) and took < 2.5, (took, proxy.stalled)


def test_a_push_to_a_stalled_endpoint_fails_in_seconds_and_leaves_nothing_half_visible(stalling, proxy, tmp_path):
    """Pack uploads stall (the endpoint reads the pack and never answers): the push fails in
    seconds with the clear error; the branch still names the old commit, check finds nothing
    wrong, and the same push made later (endpoint well again) lands whole."""
    url, data = stalling
    src = tmp_path / "v2"
    src.mkdir()
    new = golden_input(700_000)[400_000:]
    (src / "b.bin").write_bytes(new)
    with Store(url) as s:
        before = s.log("ds")
        proxy.rule = lambda method, path: "silent" if method == "PUT" and "/packs/" in path else None
        began = time.monotonic()
        with pytest.raises(OSError) as e:
            s.push([str(src)], "cdc://ds/")
        took = time.monotonic() - began
        _assert_clear(str(e.value), proxy)
        assert proxy.stalled and took < 2.5, (took, proxy.stalled)
        proxy.rule = lambda method, path: None
        assert s.log("ds") == before  # nothing half-visible: no commit, no moved branch
        assert [e["name"] for e in s.ls("cdc://ds/")] == ["a.bin"]
        assert s.check()["problems"] == []
        s.push([str(src)], "cdc://ds/")
        assert s.cat("cdc://ds/b.bin") == new and s.cat("cdc://ds/a.bin") == data


def test_a_slow_upload_that_keeps_moving_is_not_a_stall(stalling, proxy):
    """A 2.5 MiB put taken in at 2 MiB/s answers after 1.25 s, more than CDCSTORE_TIMEOUT (1 s):
    a put's budget grows with its body (1 MiB/s), so it lands."""
    url, _ = stalling
    objects = s3.S3Objects(url)
    data = golden_input(5 << 19)
    proxy.rule = lambda method, path: "slow" if method == "PUT" else None
    began = time.monotonic()
    objects.put("probe/slow.bin", data)
    assert time.monotonic() - began > 1.1  # it did wait past the stall timeout
    proxy.rule = lambda method, path: None
    assert bytes(objects.get("probe/slow.bin")) == data


def test_a_bad_timeout_setting_is_a_clear_error(s3_env, monkeypatch):
    monkeypatch.setenv("CDCSTORE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="CDCSTORE_TIMEOUT"):
        s3.S3Objects(f"s3://{S3_BUCKET}/x")
    monkeypatch.setenv("CDCSTORE_TIMEOUT", "-1")
    with pytest.raises(ValueError, match="CDCSTORE_TIMEOUT"):
        s3.S3Objects(f"s3://{S3_BUCKET}/x")

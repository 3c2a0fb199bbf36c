"""Issue 43 case 4: web sign-in. All tokens shared one pool of 10,000 sessions, oldest dropped, so
100,000 sign-ins by a read-only token signed the admin out; 2,000 wrong tokens were all answered
401 at 142/s; a cross-site form POST (Origin: evil) signed a browser in as the attacker. Now each
token has its own bound, failed sign-ins are limited per address, and a cross-site sign-in is
refused. A real `cdcstore serve` with a tokens file on loopback."""
import pytest
import requests

from cdcstore import Store
from cdcstore.remote.web import view as web
from cdcstore.testing import ServedStore

ADMIN = "signin-admin-" + "a" * 24
READER = "signin-reader-" + "b" * 24
TOKENS = {ADMIN: {"scope": "admin", "repos": ["*"], "name": "admin"},
          READER: {"scope": "read", "repos": ["*"], "name": "reader"}}


@pytest.fixture
def site(tmp_path):
    src = tmp_path / "f.txt"
    src.write_text("hello\n")
    with Store.init(str(tmp_path / "srv")) as s:
        s.push([str(src)], "cdc://ds/")
    with ServedStore(tmp_path, tokens=TOKENS) as srv:  # that store, as it is
        yield srv


def _sign_in(site, token: str, **headers) -> requests.Response:
    return requests.post(site.url + "/ui/login", data={"token": token, "next": "/ui/"}, headers=headers,
                         allow_redirects=False)


def _page(site, cookies) -> int:
    return requests.get(site.url + "/ui/", cookies=cookies, allow_redirects=False).status_code


def test_a_token_signing_in_again_and_again_signs_only_itself_out(site):
    admin = _sign_in(site, ADMIN)
    assert admin.status_code == 303 and _page(site, admin.cookies) == 200
    first = _sign_in(site, READER)
    for _ in range(web.MAX_SESSIONS_PER_TOKEN + 5):
        assert _sign_in(site, READER).status_code == 303
    assert _page(site, admin.cookies) == 200  # the admin stays signed in
    assert _page(site, first.cookies) in (303, 401)  # the reader's oldest session went


def test_failed_sign_ins_are_limited_per_address(site):
    codes = [_sign_in(site, f"guess-{i}-" + "x" * 30).status_code for i in range(web.SIGNIN_FAILURES + 5)]
    assert codes[:web.SIGNIN_FAILURES] == [401] * web.SIGNIN_FAILURES
    assert set(codes[web.SIGNIN_FAILURES:]) == {429}
    r = _sign_in(site, ADMIN)  # the address waits, even with a real token: guessing gains nothing
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1


def test_a_cross_site_sign_in_is_refused(site):
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "cross-site"}):
        r = _sign_in(site, READER, **headers)
        assert r.status_code == 403 and web.COOKIE not in r.cookies, headers
    same = _sign_in(site, READER, Origin=site.url, **{"Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 303 and _page(site, same.cookies) == 200

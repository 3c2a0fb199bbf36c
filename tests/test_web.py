"""The web view (`cdcstore serve`, /ui/; remote/web/view.py) over HTTP: a real server on loopback over a
real store, Parquet written by plain pyarrow. Every link from the index resolves; a scoped token
never sees another repo's name or bytes; names from the store are escaped; the Parquet preview
reads the footer and the first row group's chunks, no more. The browser tests are in
test_web_browser.py."""
import html
import json
import os
import re
import secrets
import time
from urllib.parse import urljoin, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests

from cdcstore import Store
from cdcstore.remote.web import data as web_data
from cdcstore.storage.repository import LocalStore, open_repository
from cdcstore.testing import ServedStore
from conftest import S3_BUCKET
from server_util import ServerProcess

ALL = "web-all-" + "a" * 24
SCOPED = "web-scoped-" + "b" * 24
TOKENS = {ALL: {"scope": "read", "repos": ["*"], "name": "everyone"},
          SCOPED: {"scope": "read", "repos": ["ds"], "name": "ds-only"}}
SECRET_REPO = "hidden-zebra-repo"
SECRET_FILE = "quartz-secret-file.txt"
SECRET_BYTES = b"the hidden repo's own bytes\n" * 100
XSS = "<script>alert(1)</script>"  # a folder `<script>alert(1)<` holding a file `script>`
XSS_ATTR = '"><img src=x onerror=alert(2)>'
ROWS = 400_000
GROUP = 100_000


def table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(n), "score": rng.random(n),
                     "label": pa.array([f"label-{i % 977}-{i}" for i in range(n)])})


def make_store(root):
    data = root / "data"
    (data / "sub" / "<script>alert(1)<").mkdir(parents=True)
    (data / "sub" / "<script>alert(1)<" / "script>").write_text("hostile name\n")
    (data / "sub" / XSS_ATTR).write_text("hostile attribute\n")
    t = table(ROWS)
    pq.write_table(t, data / "big.parquet", row_group_size=GROUP)
    (data / "notes.txt").write_text("v1\n")
    LocalStore.init(str(root / "srv"))
    with Store(str(root / "srv")) as s:
        s.push([str(data / "big.parquet"), str(data / "notes.txt"), str(data / "sub")], "cdc://ds/",
               message="first <b>bold</b> & more")
        s.tag("ds", "v1")
        pq.write_table(t.slice(0, ROWS - 1000), data / "big.parquet", row_group_size=GROUP)  # rows at the end go
        (data / "notes.txt").write_text("v2\n")
        s.push([str(data / "big.parquet"), str(data / "notes.txt")], "cdc://ds/", message="drop the last rows")
        s.push([str(data / "notes.txt")], "cdc://ds/copy/", message="a copy of the notes")
        secret = data / SECRET_FILE
        secret.write_bytes(SECRET_BYTES)
        s.push([str(secret)], f"cdc://{SECRET_REPO}/", message="hidden")
    return data


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("web")
    data = make_store(root)
    with ServedStore(root, tokens=TOKENS) as srv:  # the store make_store filled, as it is
        srv.data = data
        yield srv


def session(site, token: str) -> requests.Session:
    """A browser-like session: signed in through the form, the cookie kept."""
    s = requests.Session()
    r = s.post(site.url + "/ui/login", data={"token": token, "next": "/ui/"}, allow_redirects=False)
    assert r.status_code == 303, r.text
    return s


def links(page: str, base: str) -> list[str]:
    out = []
    for href in re.findall(r'href="([^"]*)"', page):
        u = urljoin(base, html.unescape(href))
        if urlsplit(u).path.startswith("/ui/"):
            out.append(u)
    return out


def crawl(site, s: requests.Session) -> dict[str, requests.Response]:
    seen, todo = {}, [site.url + "/ui/"]
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        r = s.get(u, allow_redirects=True)
        seen[u] = r
        if r.headers.get("Content-Type", "").startswith("text/html"):
            todo += [v for v in links(r.text, u) if v not in seen]
    return seen


def test_pages_ask_for_a_token_and_the_cookie_is_httponly(site):
    r = requests.get(site.url + "/ui/r/ds/", allow_redirects=False)
    assert r.status_code == 303 and r.headers["Location"].startswith("/ui/login")
    assert requests.get(site.url + "/ui/r/ds/raw/main/notes.txt").status_code == 401
    bad = requests.post(site.url + "/ui/login", data={"token": "nope"}, allow_redirects=False)
    assert bad.status_code == 401 and "no token" in bad.text
    r = requests.post(site.url + "/ui/login", data={"token": ALL, "next": "/ui/store"}, allow_redirects=False)
    assert r.status_code == 303 and r.headers["Location"] == "/ui/store"
    cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
    assert ALL not in cookie  # the browser holds a session id, never the token
    offsite = requests.post(site.url + "/ui/login", data={"token": ALL, "next": "https://evil.example/"},
                            allow_redirects=False)
    assert offsite.headers["Location"] == "/ui/"
    s = session(site, ALL)
    assert s.get(site.url + "/ui/r/ds/").status_code == 200
    # a bearer header works as well (scripts, curl)
    assert requests.get(site.url + "/ui/r/ds/", headers={"Authorization": f"Bearer {ALL}"}).status_code == 200
    s.post(site.url + "/ui/logout")
    assert s.get(site.url + "/ui/r/ds/", allow_redirects=False).status_code == 303


def test_every_link_from_the_index_resolves(site):
    pages = crawl(site, session(site, ALL))
    bad = {u: r.status_code for u, r in pages.items() if r.status_code != 200}
    assert bad == {}
    paths = {urlsplit(u).path for u in pages}
    for kind in ("/ui/store", "/ui/r/ds/log/main", "/ui/r/ds/tree/main/", "/ui/r/ds/file/main/big.parquet",
                 "/ui/r/ds/raw/main/notes.txt", f"/ui/r/{SECRET_REPO}/"):
        assert kind in paths, kind
    assert any("/commit/" in p for p in paths) and any("/file/v1/" in p for p in paths)
    assert len(pages) >= 30
    for u, r in pages.items():  # no page carries a script: they all work without JavaScript
        if r.headers["Content-Type"].startswith("text/html"):
            assert "<script" not in r.text.lower(), u
            assert "script-src" not in r.headers["Content-Security-Policy"]  # default-src 'none': no script runs


def test_a_scoped_token_never_sees_another_repo(site):
    s = session(site, SCOPED)
    pages = crawl(site, s)
    assert pages and all(r.status_code == 200 for r in pages.values())
    for u, r in pages.items():
        assert SECRET_REPO not in r.text and SECRET_FILE not in r.text, u
        assert SECRET_BYTES[:20] not in r.content, u
    assert any("/ui/r/ds/" in u for u in pages)
    # asked directly: answered as a repo that does not exist, the same page either way
    for rest in ("", "/", "/log/main", "/tree/main/", f"/file/main/{SECRET_FILE}", f"/raw/main/{SECRET_FILE}",
                 "/diff?a=main&b=main", "/commit/main"):
        hidden = s.get(f"{site.url}/ui/r/{SECRET_REPO}{rest}")
        missing = s.get(f"{site.url}/ui/r/no-such-repo{rest}")
        assert hidden.status_code == missing.status_code == 404, rest
        assert SECRET_BYTES[:20] not in hidden.content and SECRET_FILE not in hidden.text.replace(rest, "")
        assert hidden.text.replace(SECRET_REPO, "X") == missing.text.replace("no-such-repo", "X"), rest
    store = s.get(site.url + "/ui/store").text
    assert "Your repos" in store and SECRET_REPO not in store
    # the everything token does see it, bytes included
    r = requests.get(f"{site.url}/ui/r/{SECRET_REPO}/raw/main/{SECRET_FILE}", headers={"Authorization": f"Bearer {ALL}"})
    assert r.status_code == 200 and r.content == SECRET_BYTES


def test_names_from_the_store_are_escaped(site):
    s = session(site, ALL)
    tree = s.get(site.url + "/ui/r/ds/tree/main/sub/")
    assert tree.status_code == 200
    assert XSS not in tree.text and "<img src=x" not in tree.text
    assert "&lt;script&gt;alert(1)&lt;/" in tree.text and "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in tree.text
    for href in links(tree.text, tree.url):  # the hostile names' own pages load, escaped
        if "script" in href or "img" in href:
            r = s.get(href)
            assert r.status_code == 200 and "<script>" not in r.text and "<img" not in r.text, href
    page = s.get(site.url + "/ui/r/ds/file/main/sub/" + requests.utils.quote(XSS, safe="/"))
    assert page.status_code == 200 and "hostile name" not in page.text  # its page, not its bytes
    assert "&lt;script&gt;alert(1)&lt;" in page.text and XSS not in page.text
    log = s.get(site.url + "/ui/r/ds/log/main").text
    assert "first &lt;b&gt;bold&lt;/b&gt; &amp; more" in log and "<b>bold</b>" not in log
    raw = s.get(site.url + "/ui/r/ds/raw/main/sub/" + requests.utils.quote(XSS, safe="/"))
    assert raw.content == b"hostile name\n" and raw.headers["X-Content-Type-Options"] == "nosniff"
    assert raw.headers["Content-Type"] == "application/octet-stream"


def preview_figures(page: str) -> dict:
    m = re.search(r'id="preview-figures">Read for this preview: ([\d,]+) chunks, ([\d,]+) bytes .*? of the file'
                  r"(?:&#x27;|')s ([\d,]+); its footer is ([\d,]+) bytes and its first row group ([\d,]+) .*? in (\d+) ms", page)
    assert m, page[-3000:]
    n = [int(x.replace(",", "")) for x in m.groups()]
    return dict(zip(("chunks", "bytes", "size", "footer", "first_group", "ms"), n))


def test_parquet_preview_reads_the_footer_and_first_row_group_only(site):
    s = session(site, ALL)
    began = time.perf_counter()
    r = s.get(site.url + "/ui/r/ds/file/main/big.parquet")
    seconds = time.perf_counter() - began
    assert r.status_code == 200
    f = preview_figures(r.text)
    local = pq.ParquetFile(site.data / "big.parquet")
    md = local.metadata
    assert f["size"] == (site.data / "big.parquet").stat().st_size
    assert f["footer"] == md.serialized_size + 8 and md.num_row_groups == 4
    assert 0 < f["bytes"] <= 2 * (f["footer"] + f["first_group"])  # the goal
    assert f["bytes"] < f["size"] / 2  # three of four row groups never read
    first = local.read_row_group(0).slice(0, 20).to_pylist()
    for row in first[:5]:
        assert f"<td>{row['label']}</td>" in r.text and f"<td>{row['id']}</td>" in r.text
    assert f"<td>{first[19]['label']}</td>" in r.text and f"<td>{local.read_row_group(0).column('label')[20]}</td>" \
        not in r.text
    print(f"parquet preview: {seconds * 1000:.0f} ms page, {f['ms']} ms preview; fetched {f['bytes']:,} bytes in "
          f"{f['chunks']} chunks, footer {f['footer']:,} + first row group {f['first_group']:,} "
          f"({f['bytes'] / (f['footer'] + f['first_group']):.2f}x) of {f['size']:,}")


def test_the_counting_source_counts_what_the_reader_fetched(site):
    """In process, over the same store: the preview's chunks are those of the byte ranges pyarrow
    asked for (the footer's tail, the first row group's column chunks), counted at the store."""
    store = open_repository(str(site.root / "srv"))
    try:
        b = web_data.Browser(store)
        got = b.parquet("ds", "main", "big.parquet")
        view = store.view("ds", store.get_commit("ds", store.resolve_ref("ds", "main")[0]))
        m = store.get_manifest(view.get("big.parquet").manifest, "ds")
        md = pq.ParquetFile(site.data / "big.parquet").metadata
        lo, hi = web_data._rg_span(md.row_group(0))
        allowed = set(m.span(max(0, m.size - 64 * 1024 - md.serialized_size - 8), m.size)) | set(m.span(lo, hi))
        assert got["fetched_chunks"] <= len(allowed)
        assert got["fetched_bytes"] <= sum(m.lengths[i] for i in allowed)
        assert got["rows"][0][0] == "0" and len(got["rows"]) == web_data.PREVIEW_ROWS
    finally:
        store.close()


def test_new_bytes_per_version_come_from_the_history(site):
    store = open_repository(str(site.root / "srv"))
    try:
        b = web_data.Browser(store)
        entries, more = b.log("ds", "main", 0, 10)
        assert not more and len(entries) == 3
        copy, drop, first = (e["figures"] for e in entries)
        assert (first.added, first.changed, first.removed) == (4, 0, 0)
        assert (drop.added, drop.changed) == (0, 2)
        # the copy holds bytes an earlier version held: nothing new
        assert (copy.added, copy.new_raw, copy.new_stored) == (1, 0, 0)
        v1 = store.view("ds", store.get_commit("ds", store.resolve_ref("ds", "v1")[0]))
        distinct = {}
        for _, e in v1.walk():
            m = store.get_manifest(e.manifest, "ds")
            distinct.update(zip(m.chunk_ids, m.lengths))
        assert first.new_raw == sum(distinct.values())
        assert 0 < drop.new_raw < first.new_raw / 4  # dropping rows at the end rewrites the last row group
        # the file page: the commit that last changed big.parquet, its previous version, the bytes they share
        f = b.file("ds", "main", "big.parquet")
        assert f["changed_in"] == entries[1]["commit"] and f["previous"]["commit"] == entries[2]["commit"]
        now = store.get_manifest(f["entry"].manifest, "ds")
        before = set(store.get_manifest(f["previous"]["entry"].manifest, "ds").chunk_ids)
        shared = sum(n for c, n in zip(now.chunk_ids, now.lengths) if c in before)
        assert f["previous"]["shared"] == shared and 0.75 * now.size < shared < now.size
        assert b.file("ds", "main", "notes.txt")["previous"]["shared"] == 0  # v1 -> v2: no byte kept
        assert b.file("ds", "main", "copy/notes.txt")["previous"] is None  # new in the last commit
        # figures kept: a second call walks nothing new, and agrees
        again = b.figures("ds", entries[0]["commit"])
        assert again[entries[2]["commit"]] == first
        branch, series = b.series("ds")
        assert branch == "main" and [s["logical"] for s in series] == [first.logical, drop.logical, copy.logical]
        assert series[-1]["stored"] == first.new_stored + drop.new_stored
        assert series[-1]["whole"] == first.logical + drop.logical + copy.logical
    finally:
        store.close()


def test_diff_store_and_commit_pages(site):
    s = session(site, ALL)
    d = s.get(site.url + "/ui/r/ds/diff", params={"a": "v1", "b": "main"}).text
    assert re.search(r'<span class="changed">changed</span></td><td><a href="[^"]*big.parquet">big.parquet', d)
    assert re.search(r'<span class="added">added</span></td><td><a href="[^"]*copy/notes.txt"', d)
    assert "0 added" not in d and "1 added, 2 changed, 0 removed" in d
    back = s.get(site.url + "/ui/r/ds/diff", params={"a": "main", "b": "v1"}).text
    assert "0 added, 2 changed, 1 removed" in back
    store = s.get(site.url + "/ui/store").text
    assert store.count("<svg") == 2 and "<polyline" in store  # ds and the hidden repo: one chart each
    assert "every version whole (logical)" in store
    commit = s.get(site.url + "/ui/r/ds/commit/v1").text
    assert "Changes from the parent" not in commit and "first &lt;b&gt;" in commit
    main = s.get(site.url + "/ui/r/ds/commit/main").text
    assert "Changes from the parent" in main and "copy/notes.txt" in main
    assert s.get(site.url + "/ui/r/ds/tree/nope/").status_code == 404
    assert s.get(site.url + "/ui/r/ds/file/main/no-such.txt").status_code == 404
    assert s.get(site.url + "/ui/r/ds/tree/main/big.parquet", allow_redirects=False).status_code == 302


def test_a_revoked_token_stops_at_once(site, tmp_path):
    s = session(site, SCOPED)
    assert s.get(site.url + "/ui/r/ds/").status_code == 200
    tokens = site.root / "tokens.json"
    try:
        tokens.write_text(json.dumps({ALL: TOKENS[ALL]}))
        deadline = time.time() + 10
        while time.time() < deadline and s.get(site.url + "/ui/r/ds/", allow_redirects=False).status_code == 200:
            time.sleep(0.2)
        assert s.get(site.url + "/ui/r/ds/", allow_redirects=False).status_code == 303
    finally:
        tokens.write_text(json.dumps(TOKENS))


def test_an_open_server_shows_everything_without_signing_in(tmp_path):
    (tmp_path / "a.txt").write_text("open\n")
    LocalStore.init(str(tmp_path / "srv"))
    with Store(str(tmp_path / "srv")) as s:
        s.push([str(tmp_path / "a.txt")], "cdc://one/", message="m")
        s.push([str(tmp_path / "a.txt")], "cdc://two/", message="m")
    with ServerProcess(str(tmp_path / "srv")) as srv:
        index = requests.get(srv.url + "/ui/")
        assert index.status_code == 200 and "open server" in index.text and "sign out" not in index.text
        assert 'href="/ui/r/one/"' in index.text and 'href="/ui/r/two/"' in index.text
        assert requests.get(srv.url + "/ui/r/two/raw/main/a.txt").content == b"open\n"
        assert "no tokens" in requests.get(srv.url + "/ui/login").text
        assert requests.get(srv.url + "/", allow_redirects=False).headers["Location"] == "/ui/"


class CountingStore:
    """The real store, with its manifest reads counted (what a history walk costs)."""

    def __init__(self, store):
        self._store, self.manifest_reads = store, 0

    def get_manifest(self, name, repo=None):
        self.manifest_reads += 1
        return self._store.get_manifest(name, repo)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_a_newer_head_walks_only_what_it_adds_and_forgotten_commits_show_as_such(tmp_path):
    LocalStore.init(str(tmp_path / "srv"))
    with Store(str(tmp_path / "srv")) as s:
        for i in range(6):
            for k in range(3):
                (tmp_path / f"f{k}.bin").write_bytes(np.random.default_rng(i * 10 + k).bytes(20_000) if k == i % 3
                                                     or i == 0 else (tmp_path / f"f{k}.bin").read_bytes())
            s.push([str(tmp_path / f"f{k}.bin") for k in range(3)], "cdc://r/", message=f"v{i}")
        counted = CountingStore(open_repository(str(tmp_path / "srv")))
        try:
            b = web_data.Browser(counted)
            heads = [cid for cid, _ in counted.log("r", "main")]
            figs = b.figures("r", heads[1])  # all but the newest
            assert len(figs) == 5 and counted.manifest_reads == 3 + 4  # v0: 3 files, then one a commit
            assert all(f.new_raw == 20_000 for cid, f in figs.items() if cid != heads[-1])
            assert figs[heads[-1]].new_raw == 60_000
            before = counted.manifest_reads
            figs = b.figures("r", heads[0])
            assert counted.manifest_reads == before + 1 and figs[heads[0]].new_raw == 20_000
            assert b.figures("r", heads[0]) == figs and counted.manifest_reads == before + 1  # all kept
        finally:
            counted.close()
        s.forget("r", keep_last=2)
        s.gc(grace=0)
    with ServerProcess(str(tmp_path / "srv")) as srv:
        log = requests.get(srv.url + "/ui/r/r/log/main")
        assert log.status_code == 200 and log.text.count("forgotten") >= 4
        pages = crawl(srv, requests.Session())
        assert {u: r.status_code for u, r in pages.items() if r.status_code != 200} == {}


def test_the_preview_of_wide_nested_and_odd_columns(tmp_path):
    n = 300
    cols = {"text": pa.array(["<td>x</td>" if i == 0 else "y" * 500 for i in range(n)]),
            "nested": pa.array([{"a": i, "b": [i, i + 1]} for i in range(n)]),
            "when": pa.array(np.arange(n).astype("datetime64[s]")),
            "blob": pa.array([bytes([i % 256]) * 100 for i in range(n)])}
    cols.update({f"c{i:02d}": np.arange(n) * i for i in range(45)})  # wider than the rows table shows
    pq.write_table(pa.table(cols), tmp_path / "odd.parquet", row_group_size=100)
    (tmp_path / "fake.parquet").write_bytes(b"not parquet at all" * 10)
    LocalStore.init(str(tmp_path / "srv"))
    with Store(str(tmp_path / "srv")) as s:
        s.push([str(tmp_path / "odd.parquet"), str(tmp_path / "fake.parquet")], "cdc://odd/", message="m")
    with ServerProcess(str(tmp_path / "srv")) as srv:
        page = requests.get(srv.url + "/ui/r/odd/file/main/odd.parquet").text
        assert "300 rows in 3 row groups, 49 columns" in page and "(the first 40 of 49 columns)" in page
        assert "&lt;td&gt;x&lt;/td&gt;" in page and "<td>x</td>" not in page
        assert "y" * 199 + "…" in page and "y" * 201 not in page  # long values cut
        assert "<th>nested</th>" in page and "{&#x27;a&#x27;: 0, &#x27;b&#x27;: [0, 1]}" in page
        assert "<td>1970-01-01 00:00:00</td>" in page and "<td>" + "00" * 64 + "</td>" not in page
        assert "<td>c44</td>" in page and "<th>c44</th>" not in page  # in the schema, past the 40 shown
        fake = requests.get(srv.url + "/ui/r/odd/file/main/fake.parquet")
        assert fake.status_code == 200 and "not read as Parquet" in fake.text


def test_the_view_of_a_store_in_a_bucket(s3_env, tmp_path, monkeypatch):
    """The same pages over a store in a bucket (moto's S3 server): a crawl of every link, the
    Parquet preview within its bound, the scoped token kept out."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "writer"))
    url = f"s3://{S3_BUCKET}/web-{secrets.token_hex(4)}"
    Store.init(url).close()
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(table(60_000), data / "t.parquet", row_group_size=20_000)
    (data / SECRET_FILE).write_bytes(SECRET_BYTES)
    with Store(url) as s:
        s.push([str(data / "t.parquet")], "cdc://ds/", message="one")
        pq.write_table(table(59_000), data / "t.parquet", row_group_size=20_000)
        s.push([str(data / "t.parquet")], "cdc://ds/", message="two")
        s.push([str(data / SECRET_FILE)], f"cdc://{SECRET_REPO}/", message="hidden")
    (tmp_path / "tokens.json").write_text(json.dumps(TOKENS))
    env = {**os.environ, **s3_env, "XDG_CACHE_HOME": str(tmp_path / "server")}
    with ServerProcess(url, "--tokens", str(tmp_path / "tokens.json"), env=env) as srv:
        pages = crawl(srv, session(srv, ALL))
        assert {u: r.status_code for u, r in pages.items() if r.status_code != 200} == {}
        assert any(urlsplit(u).path == f"/ui/r/{SECRET_REPO}/" for u in pages) and len(pages) >= 15
        f = preview_figures(pages[srv.url + "/ui/r/ds/file/main/t.parquet"].text)
        assert 0 < f["bytes"] <= 2 * (f["footer"] + f["first_group"]) and f["bytes"] < f["size"] / 2
        for u, r in crawl(srv, session(srv, SCOPED)).items():
            assert r.status_code == 200 and SECRET_REPO not in r.text and SECRET_FILE not in r.text, u
        s = session(srv, SCOPED)
        assert s.get(f"{srv.url}/ui/r/{SECRET_REPO}/raw/main/{SECRET_FILE}").status_code == 404

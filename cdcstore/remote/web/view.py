"""The read-only web view of `cdcstore serve`, on the native API's port under /ui/ (docs/web.md).

Pages: the repos; a repo's branches and tags; a commit log (author, message, files changed, new
bytes); a commit; the file tree at any revision; a file (size, chunks, bytes shared with its
previous version; for Parquet the schema, row groups and first rows); a diff between two
revisions; the store (logical against stored bytes over each repo's history, as a chart). Plus a
file's raw bytes. What is shown is computed by `data.Browser`; the HTML is `pages`'.

Tokens: the server's own. A browser signs in once with a form (POST /ui/login): the token is
checked, kept in this server's memory under a random session id, and the browser gets only that
id, in an HttpOnly, SameSite=Strict cookie; each request looks the token up again, so a token
revoked in the tokens file stops working at once. A client may send `Authorization: Bearer`
instead. A token limited to some repos sees only those: another repo is answered as one that does
not exist (404, the same page), in every page and for its bytes. An open server (no tokens)
shows everything, as its API does.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
from urllib.parse import quote, urlsplit

from aiohttp import web

from ... import runtime
from ...core.address import check_name
from ...core.errors import BusyError, CdcError, InvalidAddressError, RepoNotFoundError, RevisionNotFoundError
from ..gateway.reads import FileBody
from ..server.limits import Busy
from ..server.routes import STORE_ROOTS, HTTPError, sanitize
from ..server.tokens import default_name, owner_id
from . import data
from . import pages as P
from .pages import esc, join, link, size, tag, url

log = logging.getLogger("cdcstore.web")

COOKIE = "cdcstore_ui"
SESSION_SECONDS = 12 * 3600
MAX_SESSIONS_PER_TOKEN = 64  # sessions one token keeps (its oldest goes: it signs only itself out)
SIGNIN_FAILURES = 20  # failed sign-ins an address may make in SIGNIN_WINDOW seconds before 429
SIGNIN_WINDOW = 60.0
THROTTLED_ADDRESSES = 100_000  # addresses whose failures are remembered (oldest out first)
LOG_PAGE = 50
TREE_PAGE = 1000
OPEN = {"scope": "read", "repos": ["*"], "name": None}


class NotHere(Exception):
    """A page that does not exist for this token (a repo it may not see answers the same)."""


class Sessions:
    """Session id -> (token, expiry), in this server's memory (a restart signs everyone out).
    Each token keeps at most MAX_SESSIONS_PER_TOKEN, its oldest dropped first, so no token's
    sign-ins can sign another token out (issue 43: one pool of 10,000 for all tokens let a
    read-only token sign the admin out); the tokens file bounds how many tokens there are."""

    def __init__(self):
        self._by_id: dict[str, tuple[str, float]] = {}
        self._of: dict[str, collections.OrderedDict[str, None]] = {}  # token -> its session ids, oldest first

    def new(self, token: str) -> str:
        sid = secrets.token_urlsafe(32)
        self._by_id[sid] = (token, time.time() + SESSION_SECONDS)
        mine = self._of.setdefault(token, collections.OrderedDict())
        mine[sid] = None
        while len(mine) > MAX_SESSIONS_PER_TOKEN:
            self._by_id.pop(mine.popitem(last=False)[0], None)
        return sid

    def token(self, sid: str | None) -> str | None:
        got = self._by_id.get(sid) if sid else None
        if got is None:
            return None
        if got[1] < time.time():
            self.drop(sid)
            return None
        return got[0]

    def drop(self, sid: str | None) -> None:
        if not sid:
            return
        got = self._by_id.pop(sid, None)
        if got is not None:
            mine: dict[str, None] = self._of.get(got[0], {})
            mine.pop(sid, None)
            if not mine:
                self._of.pop(got[0], None)


class Throttle:
    """Failed sign-ins by address: more than SIGNIN_FAILURES within SIGNIN_WINDOW seconds and the
    address waits (429 with Retry-After) for every sign-in, a real token's too, so guessing gains
    nothing (issue 43: 2,000 wrong tokens at 142/s, all answered)."""

    def __init__(self):
        self._fails: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()

    def wait(self, address: str) -> float:
        """Seconds this address must wait before it may sign in (0: now)."""
        fails = self._fails.get(address)
        now = time.monotonic()
        while fails and now - fails[0] >= SIGNIN_WINDOW:
            fails.popleft()
        if fails is not None and not fails:
            del self._fails[address]
            return 0.0
        if fails is None or len(fails) < SIGNIN_FAILURES:
            return 0.0
        return SIGNIN_WINDOW - (now - fails[0])

    def failed(self, address: str) -> None:
        fails = self._fails.setdefault(address, collections.deque())
        self._fails.move_to_end(address)
        fails.append(time.monotonic())
        while len(fails) > SIGNIN_FAILURES:
            fails.popleft()
        while len(self._fails) > THROTTLED_ADDRESSES:
            self._fails.popitem(last=False)


def cross_site(request: web.Request) -> bool:
    """Whether a form POST comes from another site (login CSRF): the browser says so in
    Sec-Fetch-Site, or its Origin names another host. `Origin: null` alone is not taken for one:
    these pages send `Referrer-Policy: no-referrer`, under which a browser's own same-origin form
    sends it (with `Sec-Fetch-Site: same-origin`). A client that sends neither (curl, an older
    browser) is not taken for one."""
    fetch_site = request.headers.get("Sec-Fetch-Site", "").lower()
    if fetch_site == "cross-site":
        return True
    origin = request.headers.get("Origin", "").strip()
    if not origin or origin.lower() == "null":
        return False
    return urlsplit(origin).netloc.lower() != request.host.lower()


class WebView:
    """The /ui/ routes over one `server.Server` (its store, tokens, pool, read slots)."""

    def __init__(self, server):
        self.server = server
        self.browse = data.Browser(server.store)
        self.sessions = Sessions()
        self.throttle = Throttle()

    def routes(self) -> list:
        h = self._page
        return [
            web.get("/", self.root),
            web.get("/ui", self.root),
            web.get("/ui/", h(self.repos)),
            web.get("/ui/login", self.login_form),
            web.post("/ui/login", self.login),
            web.post("/ui/logout", self.logout),
            web.get("/ui/store", h(self.store_page)),
            web.get("/ui/r/{repo}", h(self.repo)),
            web.get("/ui/r/{repo}/", h(self.repo)),
            web.get("/ui/r/{repo}/log/{rev}", h(self.log_page)),
            web.get("/ui/r/{repo}/commit/{rev}", h(self.commit_page)),
            web.get("/ui/r/{repo}/tree/{rev}/{path:.*}", h(self.tree)),
            web.get("/ui/r/{repo}/file/{rev}/{path:.+}", h(self.file)),
            web.get("/ui/r/{repo}/raw/{rev}/{path:.+}", self.raw),
            web.get("/ui/r/{repo}/diff", h(self.diff_page)),
        ]

    # -- who is asking ------------------------------------------------------------------------
    def grant(self, request: web.Request) -> tuple[dict, str | None, str]:
        """(grant, token or None, owner) of a request: its bearer token, else its session's.
        HTTPError 401 when the server has tokens and the request brings none that is valid."""
        tokens = self.server.auth.tokens
        if tokens is None:
            return OPEN, None, f"web-{id(request)}"
        scheme, _, bearer = request.headers.get("Authorization", "").strip().partition(" ")
        token = bearer.strip() if scheme.lower() == "bearer" else self.sessions.token(request.cookies.get(COOKIE))
        if not token or (g := tokens.get(token)) is None:
            raise HTTPError(401, "sign in with a token of this server")
        return g, token, owner_id(token)

    @staticmethod
    def visible(grant: dict, repo: str) -> str:
        """`repo` if the grant covers it, else NotHere (as for a repo that does not exist)."""
        try:
            check_name("repo", repo)
        except InvalidAddressError:
            raise NotHere(f"no repo {repo!r} here") from None
        if "*" not in grant["repos"] and repo not in grant["repos"]:
            raise NotHere(f"no repo {repo!r} here")
        return repo

    def _who(self, grant: dict, token: str | None) -> str:
        if token is None:
            return "open server"
        return f"signed in as {grant.get('name') or default_name(token)}"

    def _page(self, handler):
        """A page handler (request, grant) -> (title, body HTML), answered as an HTML page; errors
        as HTML pages too; a request without a valid token goes to the sign-in form."""
        async def run(request: web.Request) -> web.Response:
            runtime.preload("pyarrow.parquet")  # once: a Parquet preview later finds it imported
            try:
                grant, token, _ = self.grant(request)
            except HTTPError:
                raise web.HTTPSeeOther(url("login", query={"next": request.path_qs})) from None
            who, out = self._who(grant, token), token is not None
            try:
                title, body = await handler(request, grant)
                status = 200
            except web.HTTPException:
                raise
            except Exception as e:  # noqa: BLE001 - each kind answered as a page below
                status, message = self._status(request, e)
                title, body = None, None
            if body is None:
                text = P.error_page(status, message, who, out)
            else:
                text = P.page(title, body, who, out)
            return web.Response(text=text, status=status, content_type="text/html", headers=_headers())
        return run

    @staticmethod
    def _status(request: web.Request, e: Exception) -> tuple[int, str]:
        if isinstance(e, asyncio.CancelledError):
            raise e
        if isinstance(e, (NotHere, RepoNotFoundError)):
            return 404, str(e) if isinstance(e, NotHere) else "no such repo here"
        if isinstance(e, (RevisionNotFoundError, FileNotFoundError)):
            return 404, sanitize(str(e), request.app[STORE_ROOTS])
        if isinstance(e, HTTPError):
            return e.status, sanitize(str(e), request.app[STORE_ROOTS])
        if isinstance(e, (BusyError, Busy)):
            return 503, "the server is busy: try again in a moment"
        if isinstance(e, (CdcError, ValueError)):
            return 400, sanitize(str(e), request.app[STORE_ROOTS])
        if isinstance(e, ConnectionResetError):  # the client hung up: nobody reads the answer
            log.info("web view: %s %s: the client hung up", request.method, request.path)
            return 400, "the client hung up"
        log.exception("web view: %s %s", request.method, request.path)
        return 500, f"internal error: {type(e).__name__}"

    async def io(self, fn, *args):
        return await self.server.io(fn, *args)

    # -- signing in ---------------------------------------------------------------------------
    async def root(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(url(""))

    async def login_form(self, request: web.Request) -> web.Response:
        nxt = _local(request.query.get("next", ""))
        text = P.login_page(None, self.server.auth.tokens is None, nxt)
        return web.Response(text=text, content_type="text/html", headers=_headers())

    async def login(self, request: web.Request) -> web.Response:
        if cross_site(request):
            text = P.login_page("a sign-in from another site is refused: sign in on this server's own page",
                                False, "")
            return web.Response(text=text, status=403, content_type="text/html", headers=_headers())
        address = request.remote or ""
        wait = self.throttle.wait(address)
        if wait > 0:
            text = P.login_page(f"too many failed sign-ins from this address: try again in {wait:.0f} s",
                                False, "")
            return web.Response(text=text, status=429, content_type="text/html",
                                headers={**_headers(), "Retry-After": str(max(1, int(wait + 0.999)))})
        form = await request.post()
        token, nxt = str(form.get("token", "")).strip(), _local(str(form.get("next", "")))
        tokens = self.server.auth.tokens
        if tokens is None:
            raise web.HTTPSeeOther(nxt or url(""))
        if not token or tokens.get(token) is None:
            self.throttle.failed(address)
            text = P.login_page("that is no token of this server", False, nxt)
            return web.Response(text=text, status=401, content_type="text/html", headers=_headers())
        resp = web.HTTPSeeOther(nxt or url(""))
        resp.set_cookie(COOKIE, self.sessions.new(token), httponly=True, samesite="Strict", path=P.PREFIX,
                        max_age=SESSION_SECONDS, secure=request.secure)
        raise resp

    async def logout(self, request: web.Request) -> web.Response:
        self.sessions.drop(request.cookies.get(COOKIE))
        resp = web.HTTPSeeOther(url("login"))
        resp.del_cookie(COOKIE, path=P.PREFIX)
        raise resp

    # -- pages --------------------------------------------------------------------------------
    async def repos(self, request, grant):
        names = await self.io(self.browse.repos, grant)
        rows = []
        for name in names:
            s = await self.io(self.browse.repo_summary, name)
            head = link(url("r", name, "commit", s["commit"]), P.short(s["commit"])) if s["commit"] else ""
            rows.append([link(url("r", name, ""), name), s["branches"], s["tags"], s.get("files", ""),
                         size(s.get("bytes")), head, P.first_line(s.get("message") or "", 60),
                         P.when(s.get("time"))])
        body = join(tag("h1", "Repos"),
                    P.table(["repo", "branches", "tags", "files", "bytes", "head", "message", "time"], rows)
                    if rows else tag("p", "No repos here yet.", class_="dim"),
                    tag("p", link(url("store"), "Stored against logical bytes over the history"), class_="note"))
        return "Repos", body

    async def repo(self, request, grant):
        repo = self.visible(grant, request.match_info["repo"])
        branches, tags = await self.io(self.browse.refs, repo)
        default = await self.io(self.browse.default_branch, repo)

        def refs(kind: str, names: dict) -> Markup:
            rows = [[tag("span", n, class_="mono"), link(url("r", repo, "commit", c), P.short(c)),
                     join(link(url("r", repo, "tree", n, ""), "files"), " · ", link(url("r", repo, "log", n), "log"))]
                    for n, c in names.items()]
            return P.table([kind, "commit", ""], rows) if rows else tag("p", f"no {kind}es" if kind == "branch"
                                                                        else f"no {kind}s", class_="dim")
        diff_form = _diff_form(repo, "", default or "")
        body = join(tag("h1", "Repo ", tag("span", repo, class_="mono")),
                    tag("p", link(url("r", repo, "tree", default, ""), "Files"), " · ",
                        link(url("r", repo, "log", default), "Log"), " of ", tag("b", default))
                    if default else "",
                    tag("h2", "Branches"), refs("branch", branches), tag("h2", "Tags"), refs("tag", tags),
                    tag("h2", "Compare two revisions"), diff_form)
        return repo, body

    async def log_page(self, request, grant):
        repo = self.visible(grant, request.match_info["repo"])
        rev = request.match_info["rev"]
        skip = _count(request.query.get("skip"), 0)
        entries, more = await self.io(self.browse.log, repo, rev, skip, LOG_PAGE)
        rows = []
        for e in entries:
            c, f = e["commit_obj"], e["figures"]
            files = join(tag("span", f"+{f.added}", class_="added"), " ", tag("span", f"~{f.changed}",
                         class_="changed"), " ", tag("span", f"-{f.removed}", class_="removed")) if f else ""
            gone = e["forgotten"] or f is None
            cid = tag("span", P.short(e["commit"]), class_="mono") if e["forgotten"] else \
                link(url("r", repo, "commit", e["commit"]), P.short(e["commit"]), class_="mono")
            rows.append([cid, c.author or tag("span", "(none)", class_="dim"), P.first_line(c.message),
                         P.when(c.time), files, f.files if f else "", size(f.logical if f else None),
                         size(f.new_raw if f else None), size(f.new_stored if f else None),
                         tag("span", "forgotten", class_="dim", title="`cdcstore forget`: its files are freed "
                                                                      "or about to be") if gone
                         else link(url("r", repo, "tree", e["commit"], ""), "files")])
        nav = link(url("r", repo, "log", rev, query={"skip": skip + LOG_PAGE}), "older commits") if more else ""
        body = join(crumbs(repo, rev, None), tag("h1", "Log of ", tag("span", rev, class_="mono")),
                    P.table(["commit", "author", "message", "time", "files changed", "files", "bytes",
                             "new bytes", "new stored"], rows),
                    tag("p", nav),
                    tag("p", "Files changed: added, changed, removed against the parent. New bytes: bytes of "
                             "the chunks of the added and changed files that no earlier commit of this repo "
                             "held; new stored: the same chunks as the store keeps them (compressed). Computed "
                             "from the history (the store keeps no per-push record); chunks another repo "
                             "shares are not subtracted.", class_="note"))
        return f"{repo} log", body

    async def commit_page(self, request, grant):
        repo = self.visible(grant, request.match_info["repo"])
        cid, c, forgotten = await self.io(self.browse.commit, repo, request.match_info["rev"])
        parent = c.parent
        files = tag("span", "forgotten (`cdcstore forget`): its files are freed or about to be", class_="dim") \
            if forgotten else link(url("r", repo, "tree", cid, ""), "browse the files at this commit")
        info = [["commit", tag("span", cid, class_="mono")], ["author", c.author or "(none)"],
                ["time", P.when(c.time)], ["message", tag("pre", c.message)],
                ["parent", link(url("r", repo, "commit", parent), parent, class_="mono") if parent else "(none)"],
                ["files", files]]
        body = [crumbs(repo, None if forgotten else cid, None),
                tag("h1", "Commit ", tag("span", P.short(cid), class_="mono")),
                tag("table", join(*(tag("tr", tag("td", k), tag("td", v)) for k, v in info)), class_="figs")]
        if parent and not forgotten:
            try:
                d = await self.io(self.browse.diff, repo, parent, cid)
            except CdcError:  # the parent was forgotten: its files are gone
                body.append(tag("p", "The parent was forgotten: no diff.", class_="dim"))
            else:
                body += [tag("h2", "Changes from the parent"), diff_table(repo, d)]
        return f"{repo} {P.short(cid)}", join(*body)

    async def tree(self, request, grant):
        repo = self.visible(grant, request.match_info["repo"])
        rev, path = request.match_info["rev"], request.match_info["path"].strip("/")
        skip = _count(request.query.get("skip"), 0)

        def listing():
            cid, commit, view = self.browse.view(repo, rev)
            kind = view.kind(path)
            return cid, commit, kind, (view.listing(path) if kind == "directory" else [])
        cid, commit, kind, entries = await self.io(listing)
        if kind == "file":
            raise web.HTTPFound(url("r", repo, "file", rev, path))
        if kind is None:
            raise FileNotFoundError(f"no folder {path!r} at {rev}")
        rows = []
        for e in entries[skip:skip + TREE_PAGE]:
            name = e["name"].rpartition("/")[2]
            if e["type"] == "directory":
                rows.append([link(url("r", repo, "tree", rev, e["name"] + "/"), name + "/"), "folder",
                             size(e["size"])])
            else:
                rows.append([link(url("r", repo, "file", rev, e["name"]), name), "file", size(e["size"])])
        more = link(url("r", repo, "tree", rev, path + "/" if path else "", query={"skip": skip + TREE_PAGE}),
                    "more") if len(entries) > skip + TREE_PAGE else ""
        body = join(crumbs(repo, rev, path), tag("h1", "Files at ", tag("span", rev, class_="mono"),
                                                 tag("span", f" ({P.short(cid)})", class_="dim")),
                    P.table(["name", "type", "bytes"], rows) if rows else tag("p", "(empty)", class_="dim"),
                    tag("p", more), tag("p", link(url("r", repo, "log", rev), "log"), " · ",
                                        link(url("r", repo, "commit", cid), "this commit")))
        return f"{repo}/{path}", body

    async def file(self, request, grant):
        repo = self.visible(grant, request.match_info["repo"])
        rev, path = request.match_info["rev"], request.match_info["path"]
        parquet = path.lower().endswith(data.PARQUET_SUFFIXES)
        f, preview = await asyncio.gather(self.io(self.browse.file, repo, rev, path),
                                          self._parquet(repo, rev, path) if parquet else _nothing())
        e, prev = f["entry"], f["previous"]
        figs = [["size", size(e.size)], ["chunks", f"{f['chunks']:,} ({f['unique_chunks']:,} distinct)"],
                ["distinct chunk bytes", size(f["unique_bytes"])], ["stored (compressed)", size(f["stored"])],
                ["manifest", tag("span", e.manifest, class_="mono")],
                ["last changed in", link(url("r", repo, "commit", f["changed_in"]), P.short(f["changed_in"]),
                                         class_="mono")]]
        if prev:
            pct = 100 * prev["shared"] / e.size if e.size else 100.0
            figs += [["previous version", join(link(url("r", repo, "file", prev["commit"], path),
                                                    P.short(prev["commit"]), class_="mono"), " ", size(prev["entry"].size))],
                     ["bytes shared with it", join(size(prev["shared"]), f" ({pct:.1f}% of this version)")],
                     ["bytes new in this version", size(e.size - prev["shared"])]]
        else:
            figs.append(["previous version", tag("span", "none (the file is new here)", class_="dim")])
        body = [crumbs(repo, rev, path), tag("h1", tag("span", path.rpartition("/")[2], class_="mono")),
                tag("table", join(*(tag("tr", tag("td", k), tag("td", v)) for k, v in figs)), class_="figs"),
                tag("p", link(url("r", repo, "raw", rev, path), "raw bytes"), " · ",
                    link(url("r", repo, "log", rev), "log"))]
        if parquet:
            body.append(preview)
        return f"{repo}/{path}", join(*body)

    async def _parquet(self, repo: str, rev: str, path: str):
        try:
            pq = await self.io(self.browse.parquet, repo, rev, path)
        except (OSError, ValueError) as e:  # pyarrow: not a Parquet file
            return join(tag("h2", "Parquet"), tag("p", f"not read as Parquet: {e}", class_="err"))
        return parquet_section(pq)

    async def diff_page(self, request, grant):
        repo = self.visible(grant, request.match_info["repo"])
        old, new = request.query.get("a", "").strip(), request.query.get("b", "").strip()
        body = [crumbs(repo, None, None), tag("h1", "Compare"), _diff_form(repo, old, new)]
        if old and new:
            d = await self.io(self.browse.diff, repo, old, new)
            body += [tag("p", "From ", link(url("r", repo, "commit", d["old"]), P.short(d["old"]), class_="mono"),
                         " to ", link(url("r", repo, "commit", d["new"]), P.short(d["new"]), class_="mono")),
                     diff_table(repo, d)]
        elif old or new:
            body.append(tag("p", "Name both revisions: a branch, a tag or a commit id.", class_="err"))
        return f"{repo} diff", join(*body)

    async def store_page(self, request, grant):
        repos = await self.io(self.browse.repos, grant)
        totals = await self.io(self.browse.totals, grant, self.server.access)
        whole = "*" in grant["repos"]
        figs = [["distinct chunks", f"{totals.get('chunks', 0):,}"],
                ["their bytes (logical, each once)", size(totals.get("chunk_raw_bytes"))],
                ["as stored (compressed)", size(totals.get("chunk_stored_bytes"))]]
        if whole:
            figs.append(["packs", join(f"{totals.get('packs', 0):,} ", size(totals.get("pack_bytes")))])
        parts = [tag("h1", "Store" if whole else "Your repos in this store"),
                 tag("table", join(*(tag("tr", tag("td", k), tag("td", v)) for k, v in figs)), class_="figs")]
        for repo in repos:
            branch, series = await self.io(self.browse.series, repo)
            if not series:
                continue
            labels = [f"v{i + 1}" for i in range(len(series))]
            svg = P.chart([("every version whole (logical)", "#0550ae", [s["whole"] for s in series]),
                           ("stored (new chunks, compressed)", "#1a7f37", [s["stored"] for s in series])],
                          labels, title=f"{repo}: logical against stored bytes")
            rows = [[labels[i], link(url("r", repo, "commit", s["commit"]), P.short(s["commit"]), class_="mono"),
                     P.first_line(s["message"], 50), size(s["logical"]), size(s["whole"]), size(s["new_stored"]),
                     size(s["stored"]),
                     f"{s['whole'] / s['stored']:.1f}x" if s["stored"] else ""] for i, s in enumerate(series)]
            parts += [tag("h2", link(url("r", repo, ""), repo), tag("span", f" ({branch})", class_="dim")), svg,
                      P.table(["version", "commit", "message", "bytes", "all versions whole", "new stored",
                               "stored so far", "ratio"], rows)]
        parts.append(tag("p", "All versions whole: what keeping every version of the branch as full copies "
                              "would take. Stored so far: the compressed bytes of the chunks each version "
                              "added that no earlier version of the repo held (computed from the history).",
                         class_="note"))
        return "Store", join(*parts)

    # -- bytes --------------------------------------------------------------------------------
    async def raw(self, request: web.Request) -> web.StreamResponse:
        """A file's bytes, streamed through the read core under a read slot (as the S3 gateway)."""
        try:
            grant, _, owner = self.grant(request)
            repo = self.visible(grant, request.match_info["repo"])
            rev, path = request.match_info["rev"], request.match_info["path"]
            _, _, view = await self.io(self.browse.view, repo, rev)
            entry = view.get(path)
            if entry is None:
                raise FileNotFoundError(f"no file {path!r} at {rev}")
            reader, _ = await self.io(self.browse.reader, repo, entry, path)
        except Exception as e:  # noqa: BLE001
            status, message = (401, "sign in with a token of this server") if isinstance(e, HTTPError) and \
                e.status == 401 else self._status(request, e)
            return web.Response(text=message, status=status, headers={"X-Content-Type-Options": "nosniff"})
        name = path.rpartition("/")[2]
        headers = {"Content-Disposition": f"attachment; filename*=UTF-8''{quote(name, safe='')}",
                   "X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-store"}
        body = FileBody(reader, entry.size, self.server.limits.send_block)
        reads = self.server.reads
        try:
            await reads.wait(owner, self.server.limits.read_wait)
            with reads.take(owner):
                return await self.server.send_range(request, 0, entry.size, body.block, status=200, headers=headers)
        except Busy as e:
            return web.Response(text=str(e), status=503, headers={"Retry-After": "1"})
        finally:
            await self.io(body.close)


Markup = P.Markup


async def _nothing() -> str:
    return ""


def _headers() -> dict:
    return {"Content-Security-Policy": P.CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "Cache-Control": "private, no-store", "X-Frame-Options": "DENY"}


def _local(target: str) -> str:
    """A redirect target only within this view (never another site)."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith(P.PREFIX + "/") or "\\" in target:
        return ""
    return target


def _count(value: str | None, default: int) -> int:
    try:
        return max(0, int(value)) if value else default
    except ValueError:
        return default


def crumbs(repo: str, rev: str | None, path: str | None) -> Markup:
    parts = [link(url(""), "repos"), " / ", link(url("r", repo, ""), repo)]
    if rev is not None:
        parts += [" @ ", link(url("r", repo, "tree", rev, ""), rev, class_="mono")]
    if path:
        at = ""
        for name in path.split("/")[:-1]:
            at = f"{at}{name}/"
            if rev is None:  # (no page shows a folder's crumbs without its revision)
                raise TypeError("a folder's crumb links to a revision: none given")
            parts += [" / ", link(url("r", repo, "tree", rev, at), name)]
        parts += [" / ", tag("span", path.rpartition("/")[2], class_="mono")]
    return tag("div", *parts, class_="crumbs")


def _diff_form(repo: str, old: str, new: str) -> Markup:
    return tag("form", tag("label", "from ", tag("input", name="a", value=old, size=20)), " ",
               tag("label", "to ", tag("input", name="b", value=new, size=20)), " ",
               tag("button", "compare", type="submit"), method="get", action=url("r", repo, "diff"))


def diff_table(repo: str, d: dict) -> Markup:
    rows = []
    for r in d["rows"]:
        rev = d["old"] if r["change"] == "removed" else d["new"]
        rows.append([tag("span", r["change"], class_=r["change"]), link(url("r", repo, "file", rev, r["path"]), r["path"]),
                     size(r["bytes"]), size(r["new"])])
    note = ("New bytes: bytes of the file's chunks that the old revision does not hold (any of its files)."
            if d["whole"] else "New bytes: bytes of the file's chunks that the old revision's versions of the "
                               "changed and removed paths do not hold (the old revision has too many files to "
                               "read them all here).")
    counts = collections.Counter(r["change"] for r in d["rows"])
    summary = tag("p", f"{counts['added']} added, {counts['changed']} changed, {counts['removed']} removed; new bytes ",
                  size(d["new_bytes"]))
    return join(summary, P.table(["change", "path", "bytes", "new bytes"], rows) if rows
                else tag("p", "no changes", class_="dim"), tag("p", note, class_="note"))


SCHEMA_SHOWN = 1000  # schema fields listed on a file's page (a 50,000-column file made a 3.7 MB page)


def parquet_section(pq: dict) -> Markup:
    groups = [[i, f"{g['rows']:,}", size(g["bytes"]), size(g["span"][1] - g["span"][0])]
              for i, g in enumerate(pq["groups"][:200])]
    more_groups = tag("p", f"... and {len(pq['groups']) - 200} more row groups", class_="dim") \
        if len(pq["groups"]) > 200 else ""
    schema = [[f[0], tag("span", f[1], class_="mono"), "yes" if f[2] else "no"] for f in pq["schema"][:SCHEMA_SHOWN]]
    more_fields = tag("p", f"... and {len(pq['schema']) - SCHEMA_SHOWN:,} more columns", class_="dim") \
        if len(pq["schema"]) > SCHEMA_SHOWN else ""
    skipped = tag("p", "Not shown: " + "; ".join(f"{name}: {why}" for name, why in pq["skipped"].items()),
                  class_="note") if pq.get("skipped") else ""
    bound = pq["footer"] + pq["first_group"]
    read = (f"Read for this preview: {pq['fetched_chunks']:,} chunks, {pq['fetched_bytes']:,} bytes "
            f"({pq['fetched_stored']:,} as stored) of the file's {pq['size']:,}; its footer is {pq['footer']:,} "
            f"bytes and its first row group {pq['first_group']:,} ({pq['fetched_bytes'] / bound:.2f}x the two) "
            f"in {pq['seconds'] * 1000:.0f} ms.") if bound else ""
    cols = pq["columns"]
    more_cols = f" (the first {len(cols)} of {len(pq['schema'])} columns)" if len(cols) < len(pq["schema"]) else ""
    return join(tag("h2", "Parquet"),
                tag("p", f"{pq['num_rows']:,} rows in {len(pq['groups']):,} row groups, {len(pq['schema'])} "
                         f"columns; written by {pq['created_by'] or 'unknown'}."),
                tag("p", read, class_="note", id="preview-figures"),
                tag("h2", f"First {len(pq['rows'])} rows{more_cols}"),
                P.table(cols, pq["rows"], class_="rows"), skipped,
                tag("h2", "Schema"), P.table(["column", "type", "nullable"], schema), more_fields,
                tag("h2", "Row groups"), P.table(["#", "rows", "bytes (uncompressed)", "bytes in the file"], groups),
                more_groups)


__all__ = ["WebView", "esc"]

"""The web view's HTML (remote/web/view.py serves it): server-rendered pages, no build step, no script.

Every name that comes from the store (repos, branches, tags, paths, commit messages, authors,
Parquet column names and values) is untrusted: it reaches the page only through `esc` or `tag`,
which escape text and attribute values (a `Markup` string is HTML this module built itself).
URLs are built by `url`, which percent-encodes each part. The one chart is an SVG drawn here,
so every page, the chart included, works without JavaScript; the pages are sent with a
Content-Security-Policy that allows no script at all.
"""
from __future__ import annotations

import html
import time
from urllib.parse import quote, urlencode

CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
PREFIX = "/ui"


class Markup(str):
    """HTML built by this module: `esc` passes it through unchanged."""


def esc(value) -> Markup:
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value), quote=True))


def join(*parts) -> Markup:
    return Markup("".join(esc(p) for p in parts if p is not None))


def tag(element: str, /, *children, **attrs) -> Markup:
    """<element attr="...">children</element>: attribute values and text children escaped. A trailing
    '_' in an attribute name is dropped (class_); None or False leaves the attribute out."""
    out = [f"<{element}"]
    for k, v in attrs.items():
        if v is None or v is False:
            continue
        k = k.rstrip("_").replace("_", "-")
        out.append(f" {k}" if v is True else f' {k}="{esc(v)}"')
    out.append(">")
    if element in ("input", "br", "meta"):
        return Markup("".join(out))
    return Markup("".join(out) + join(*children) + f"</{element}>")


def url(*parts: str, query: dict | None = None) -> str:
    """/ui/PART/PART...: each part percent-encoded (a part may hold '/': a path, kept as folders)."""
    segs = [quote(p, safe="/") if i == len(parts) - 1 else quote(p, safe="") for i, p in enumerate(parts)]
    u = PREFIX + "/" + "/".join(segs)
    q = {k: v for k, v in (query or {}).items() if v not in (None, "")}
    return u + ("?" + urlencode(q) if q else "")


def link(href: str, text, **attrs) -> Markup:
    return tag("a", text, href=href, **attrs)


def size(n: int | None) -> Markup:
    """Bytes for people (exact bytes in the title)."""
    if n is None:
        return Markup('<span class="dim">n/a</span>')
    v, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            break
        v /= 1024
    text = f"{int(v)} B" if unit == "B" else f"{v:.1f} {unit}"
    return tag("span", text, title=f"{n:,} bytes")


def when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t is not None else ""


def short(cid: str) -> str:
    return cid[:12]


def first_line(text: str, most: int = 120) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= most else line[:most - 1] + "…"


def table(head: list, rows: list[list], **attrs) -> Markup:
    th = join(*(tag("th", h) for h in head))
    body = join(*(tag("tr", *(tag("td", c) for c in r)) for r in rows))
    return tag("table", tag("thead", tag("tr", th)), tag("tbody", body), **attrs)


STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1b1f24;background:#fafbfc}
header{background:#24292f;color:#fff;padding:8px 20px;display:flex;gap:18px;align-items:center}
header a{color:#fff;text-decoration:none}header .who{margin-left:auto;opacity:.8}
header form{display:inline;margin:0}header button{font-size:12px}
main{padding:14px 20px;max-width:1200px}h1{font-size:20px;margin:8px 0 12px}h2{font-size:16px;margin:18px 0 8px}
table{border-collapse:collapse;background:#fff;margin:6px 0 14px}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f6}td.num,th.num{text-align:right}
a{color:#0550ae}.dim{color:#656d76}.added{color:#1a7f37}.removed{color:#cf222e}.changed{color:#9a6700}
code,.mono{font-family:ui-monospace,monospace;font-size:13px}
.crumbs{margin:4px 0 10px}.note{color:#656d76;font-size:13px;max-width:900px}
.figs td:first-child{color:#656d76}.err{color:#cf222e}
.rows td{font-family:ui-monospace,monospace;font-size:12px;white-space:pre;max-width:360px;overflow:hidden}
"""


def page(title: str, body, who: str | None, logout: bool) -> str:
    """A whole page: header (repos, store, who is signed in), then `body`."""
    out = tag("form", tag("button", "sign out", type="submit"), method="post", action=url("logout")) \
        if logout else ""
    head = tag("header", link(url(""), tag("b", "cdcstore")), link(url(""), "repos"), link(url("store"), "store"),
               tag("span", join(who or "", " ", out), class_="who"))
    return ("<!doctype html>\n" + tag("html", tag("head", Markup('<meta charset="utf-8">'),
                                                  tag("title", f"{title} · cdcstore"),
                                                  tag("style", Markup(STYLE))),
                                       tag("body", head, tag("main", body)), lang="en"))


def login_page(problem: str | None, open_server: bool, next_url: str) -> str:
    if open_server:
        body = join(tag("h1", "Sign in"), tag("p", "This server has no tokens: every page is open. ",
                                              link(url(""), "Go to the repos")))
    else:
        form = tag("form", tag("label", "Token ", tag("input", type="password", name="token", autocomplete="off",
                                                      required=True, size=48)),
                   tag("input", type="hidden", name="next", value=next_url), " ",
                   tag("button", "Sign in", type="submit"), method="post", action=url("login"))
        body = join(tag("h1", "Sign in"), tag("p", problem, class_="err") if problem else "",
                    tag("p", "Paste a token of this server (`cdcstore token add NAME`). It is kept in this "
                             "server's memory, not in the browser: the browser gets a session cookie "
                             "(HttpOnly, SameSite=Strict) until you sign out.", class_="note"), form)
    return page("Sign in", body, None, False)


def error_page(status: int, message: str, who: str | None, logout: bool) -> str:
    return page(f"{status}", join(tag("h1", f"{status}"), tag("p", message, class_="err"),
                                  tag("p", link(url(""), "Back to the repos"))), who, logout)


# -- the chart ----------------------------------------------------------------------------------------
def chart(series: list[tuple[str, str, list[float]]], labels: list[str], width: int = 720, height: int = 240,
          title: str = "") -> Markup:
    """Lines over the versions as an inline SVG (no script): `series` are (name, colour, values),
    one value per label. The y axis starts at 0; each point has a <title> with its value."""
    left, right, top, bottom = 70, 16, 24, 40
    n = max((len(v) for _, _, v in series), default=0)
    peak = max((x for _, _, v in series for x in v), default=0) or 1
    w, h = width - left - right, height - top - bottom

    def xy(i: int, v: float) -> tuple[float, float]:
        x = left + (w * i / (n - 1) if n > 1 else w / 2)
        return round(x, 1), round(top + h - h * v / peak, 1)

    parts = [tag("title", title or "chart"),
             Markup(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fff" stroke="#d0d7de"/>')]
    for k in range(5):  # y grid and labels
        v = peak * k / 4
        y = round(top + h - h * k / 4, 1)
        parts.append(Markup(f'<line x1="{left}" x2="{left + w}" y1="{y}" y2="{y}" stroke="#eaeef2"/>'))
        parts.append(tag("text", _axis_bytes(v), x=left - 6, y=y + 4, text_anchor="end", font_size="11",
                         fill="#656d76"))
    step = max(1, n // 10)
    for i in range(0, n, step):  # x labels (at most about ten)
        x, _ = xy(i, 0)
        parts.append(tag("text", labels[i] if i < len(labels) else str(i + 1), x=x, y=top + h + 16,
                         text_anchor="middle", font_size="11", fill="#656d76"))
    for k, (name, colour, values) in enumerate(series):
        pts = " ".join(f"{x},{y}" for x, y in (xy(i, v) for i, v in enumerate(values)))
        parts.append(Markup(f'<polyline fill="none" stroke="{esc(colour)}" stroke-width="2" points="{pts}"/>'))
        for i, v in enumerate(values):
            x, y = xy(i, v)
            label = labels[i] if i < len(labels) else str(i + 1)
            parts.append(tag("circle", tag("title", f"{name}, {label}: {int(v):,} bytes"), cx=x, cy=y, r=3,
                             fill=colour))
        lx = left + 8 + k * 220
        parts.append(Markup(f'<rect x="{lx}" y="6" width="12" height="4" fill="{esc(colour)}"/>'))
        parts.append(tag("text", name, x=lx + 16, y=12, font_size="12"))
    return tag("svg", *parts, xmlns="http://www.w3.org/2000/svg", width=width, height=height,
               viewBox=f"0 0 {width} {height}", role="img", class_="chart")


def _axis_bytes(v: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return ""

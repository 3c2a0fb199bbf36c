"""The `cdcstore` command line (click). Errors print one line and exit non-zero."""
from __future__ import annotations

import datetime
import errno
import functools
import json
import logging
import os
import sqlite3
import sys
from typing import Callable, Mapping

import click

from . import settings
from .api import ENV_STORE, ChunkCache, Store, default_store_path, is_url, parse_size, plan_sources
from .core.address import DEFAULT_BRANCH, parse
from .core.errors import CdcError, InvalidAddressError, damaged_message

EXIT_ERROR = 1


def _as_json() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.params.get("as_json"))


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7f, 0xa0)]}


def shown(text: str) -> str:
    """Text from a store (file names, messages) as printed: control characters (terminal
    escape sequences, newlines) as \\xNN, so a name cannot move the cursor or fake a line."""
    return text.translate(_CONTROL)


def _fail(message: str, exc: BaseException | None = None) -> None:
    """One error line on stderr; with --json, one JSON object on stdout instead."""
    if _as_json():
        click.echo(json.dumps({"error": message, "type": type(exc).__name__ if exc else "Error"}))
    else:
        click.echo(f"cdcstore: error: {shown(message)}", err=True)
    sys.exit(EXIT_ERROR)


def _stdout_closed() -> None:
    """The reader of stdout went away (`| head`): stop quietly, as `cat` does."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    sys.exit(0)


def handle_errors(fn):
    """Turn expected failures into one line on stderr (or JSON with --json) and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            try:
                out = fn(*args, **kwargs)
            except SystemExit:  # a result that exits non-zero (check found problems): not an error line
                _say_store()
                raise
            _say_store()
            return out
        except CdcError as e:
            _fail(str(e), e)
        except BrokenPipeError:
            _stdout_closed()
        except sqlite3.OperationalError as e:
            _fail(f"the chunk index cannot be used ({e}): check the store's permissions and free disk space", e)
        except sqlite3.DatabaseError as e:
            _fail(damaged_message(e), e)
        except (IsADirectoryError, NotADirectoryError, PermissionError, FileExistsError,
                FileNotFoundError) as e:
            _fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e), e)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                _fail(f"disk full ({e.strerror}{': ' + str(e.filename) if e.filename else ''}): "
                      f"free space and run the command again (nothing half-written is kept)", e)
            _fail(f"{e}", e)
        except KeyboardInterrupt:
            click.echo("cdcstore: interrupted", err=True)
            sys.exit(130)

    return wrapper


def _quiet() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().meta.get("cdcstore.quiet"))


def _set_quiet(ctx, _param, value) -> None:
    if value:
        ctx.find_root().meta["cdcstore.quiet"] = True
    _route_retry_notes(quiet=_quiet())


def _route_retry_notes(quiet: bool) -> None:
    """Retry notes of the HTTP client (logger cdcstore.client) go to stderr unless quiet."""
    log = logging.getLogger("cdcstore.client")
    log.propagate = False
    log.handlers = [] if quiet else [_stderr_handler]
    log.setLevel(logging.CRITICAL if quiet else logging.INFO)


_stderr_handler = logging.StreamHandler(sys.stderr)
_stderr_handler.setFormatter(logging.Formatter("cdcstore: %(message)s"))

quiet_option = click.option("-q", "--quiet", is_flag=True, expose_value=False, is_eager=True,
                            callback=_set_quiet, help="No progress bars or retry notes: only the result or error.")


_store_opt = click.option(
    "--store", "store_path", metavar="PATH|URL", default=None,
    help="Store directory, bucket (s3://BUCKET/PREFIX) or server URL "
         "(default: $CDCSTORE_STORE, else the user data dir).")
_token_opt = click.option("--token", default=None, metavar="TOKEN",
                          help="Token for a server store (default: $CDCSTORE_TOKEN).")


_filter_opts = [
    click.option("--include", multiple=True, metavar="GLOB",
                 help="Only files matching (path below the folder, or any name in it for a glob without '/'); repeatable."),
    click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files matching; repeatable; wins over --include."),
]


def filter_options(fn):
    for opt in reversed(_filter_opts):
        fn = opt(fn)
    return fn


def store_option(fn):
    return quiet_option(_store_opt(_token_opt(fn)))


def local_store_option(fn):
    return quiet_option(_store_opt(fn))


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON object (an error too: {\"error\", \"type\"} on stdout).")


def _store(path: str | None, token: str | None = None, announce: bool = True) -> Store:
    s = Store(path, token=token)
    click.get_current_context().call_on_close(s.close)
    if announce:
        _announce(s, path)
    return s


def _announce(s: Store, path: str | None) -> None:
    """Name the store a command uses, and where that choice came from, in one line on stderr
    (never on stdout: --json output stays one object) once the command has succeeded (an
    error stays one line; errors about a store name it). Creating the default store is said
    at once, -q or not: data should never land somewhere nobody named."""
    if s.created:
        click.echo(f"cdcstore: created the default store {s.location} (no --store given and $CDCSTORE_STORE "
                   f"is not set); to use another, pass --store DIR|s3://BUCKET/PREFIX|URL or "
                   f"export CDCSTORE_STORE", err=True)
    elif not _quiet():
        why = "--store" if path else "$CDCSTORE_STORE" if settings.STORE.is_set() else \
            "the default: no --store, no $CDCSTORE_STORE"
        click.get_current_context().find_root().meta["cdcstore.store_line"] = \
            f"cdcstore: store {shown(s.location)} ({why})"


def _say_store() -> None:
    ctx = click.get_current_context(silent=True)
    line = ctx.find_root().meta.pop("cdcstore.store_line", None) if ctx else None
    if line:
        click.echo(line, err=True)


def _local(path: str | None, command: str = "this command") -> Store:
    """The store directory at `path` (a server's store is administered on the server)."""
    given, path = path, path or default_store_path()
    if is_url(path):
        raise CdcError(f"`cdcstore {command}` works on a store directory or bucket, not {path}: "
                       f"run `cdcstore {command} --store DIR` on the server")
    s = Store(path, create=False)
    click.get_current_context().call_on_close(s.close)
    if command != "serve":  # serve announces what it serves on stdout
        _announce(s, given)
    return s


class _NoBar:
    """What `_progress` gives when no bar is drawn: nothing to import, nothing to count."""

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None


def _progress(total: Callable[[], int], desc: str, quiet: bool):
    """A progress bar on stderr of `total()` bytes, drawn only on a terminal (as tqdm's
    `disable=None` would); quiet, or stderr not a terminal, tqdm is not even imported (~25 ms
    of a start) and `total` is not asked (a folder walk, or a listing of the store)."""
    if quiet or _quiet() or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm  # here: most commands never draw a bar
    return tqdm(total=total(), desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, leave=False)


def _print_json(obj: Mapping[str, object]) -> None:
    click.echo(json.dumps(obj, sort_keys=True))


def _short(commit: str | None) -> str:
    """A commit id's first 12 digits (a write that changed something names its commit)."""
    if commit is None:
        raise TypeError("the write names no commit")
    return commit[:12]


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cdcstore")
@quiet_option
def cli() -> None:
    """Content-defined-chunking, deduplicating store for dataset versions."""


@cli.command()
@local_store_option
@click.option("--create-bucket", is_flag=True,
              help="For s3://BUCKET/PREFIX: create the bucket first (in $AWS_REGION) if it does not exist.")
@handle_errors
def init(store_path, create_bucket):
    """Create an empty store (a directory, or a prefix of an S3 bucket)."""
    s = Store.init(store_path, create_bucket=create_bucket)
    click.get_current_context().call_on_close(s.close)
    click.echo(f"created store at {s.location}")


@cli.command()
@click.argument("sources", nargs=-1, required=True, metavar="LOCAL...")
@click.argument("dest", metavar="cdc://REPO[@BRANCH]/DEST")
@click.option("-m", "--message", default="", help="Commit message.")
@click.option("--delete", is_flag=True, help="Remove files under DEST that are not being pushed.")
@click.option("--detail", is_flag=True, help="With --json, add bytes, new bytes and chunking per file.")
@click.option("--no-stat-cache", "no_stat_cache", is_flag=True,
              help="Read every file, even those whose size, mtime, inode and ctime match their last push.")
@click.option("--author", default=None, metavar="'NAME <EMAIL>'",
              help="Who the commit is by [default: git's user.name and user.email, else the OS user; "
                   "a server with tokens records the token's name].")
@filter_options
@store_option
@json_option
@handle_errors
def push(sources, dest, message, delete, detail, no_stat_cache, author, include, exclude, store_path, token,
         as_json):
    """Publish local files and folders as one commit."""
    s = _store(store_path, token)
    skipped: list[str] = []
    def total() -> int:
        return sum(os.path.getsize(f) for f, _ in plan_sources(sources, "", True, lambda *_: None))

    with _progress(total, "push", as_json) as bar:
        r = s.push(list(sources), dest, message, delete=delete, progress=bar.update,
                   on_skip=lambda path, why: skipped.append(f"{path} ({why})"), include=include, exclude=exclude,
                   stat_cache=not no_stat_cache, author=author)
    _warn_skipped(skipped)
    _hint_parquet(s, r, sources, dest)
    if as_json:
        _print_json(r.to_dict(detail=detail))
        return
    where = parse(dest)
    state = f"commit {_short(r.commit)} on {where.repo}@{where.ref}" if r.changed else "no changes; nothing committed"
    unread = f" ({r.unread_files} unchanged since their last push, not read)" if r.unread_files else ""
    click.echo(f"{state}\n  {r.files} files{unread}, {_human(r.bytes)}; new {_human(r.new_bytes)} "
               f"({r.new_chunks}/{r.chunks} chunks), stored {_human(r.stored_bytes)} in {r.seconds:.2f}s")
    if r.requests:
        click.echo(f"  sent {_human(r.sent_bytes)}, received {_human(r.received_bytes)} in {r.requests} requests")
    top = list(r.new_bytes_by_file.items())
    for path, n in top[:10]:
        click.echo(f"  new {_human(n):>10}  {shown(path)}")
    if len(top) > 10:
        click.echo(f"  ... and {len(top) - 10} more files with new bytes (see --json)")


HINT_MIN_BYTES = 256 * 1024  # a Parquet file smaller than this is not worth a hint
HINT_NEW_SHARE = 0.5  # a replaced Parquet file that stored more than this share of its bytes anew


def _hint_parquet(s: Store, r, sources, dest: str) -> None:
    """A hint on stderr when a push replaced a Parquet file and stored more than half of it
    anew, unless our writer wrote it. A new version of a table written at the same path
    usually differs little; a plain writer's pages and row groups shift with any insert or
    delete, so most of the file looks new. cdcstore.parquet.write_table keeps them in place."""
    if _quiet() or not r.changed or not r.commit or not r.files_detail:
        return
    bad = {p: d for p, d in r.files_detail.items() if d.get("chunking") == "parquet-pages"
           and d["bytes"] >= HINT_MIN_BYTES and d["new_bytes"] > HINT_NEW_SHARE * d["bytes"]}
    if not bad:
        return
    a = parse(dest)
    try:  # a hint never fails a push that landed
        replaced = s.replaced_paths(a.repo, r.commit, list(bad)[:50])
        local = {p: f for f, p in plan_sources(sources, a.path, dest.endswith("/"), lambda *_: None)}
    except (CdcError, OSError):
        return
    hinted = [p for p in sorted(replaced) if not _our_writer(local.get(p))]
    if not hinted:
        return
    worst = max(hinted, key=lambda p: bad[p]["new_bytes"] / bad[p]["bytes"])
    share = bad[worst]["new_bytes"] / bad[worst]["bytes"]
    more = f" and {len(hinted) - 1} more Parquet files" if len(hinted) > 1 else ""
    click.echo(f"cdcstore: hint: {shown(worst)}{more} stored {share:.0%} of its bytes anew although it replaces a "
               f"stored version: a plain Parquet writer moves every page after an edit. Files written with "
               f"cdcstore.parquet.write_table (or write_dataset) store about what changed (docs/parquet.md)",
               err=True)


def _our_writer(path: str | None) -> bool:
    """Whether cdcstore.parquet wrote this local Parquet file (its schema metadata key)."""
    if path is None:
        return False
    try:
        import pyarrow.parquet as pq

        from .parquet import WRITER_METADATA_KEY

        return WRITER_METADATA_KEY in (pq.read_metadata(path).metadata or {})
    except Exception:  # unreadable here (changed since, not Parquet after all): hint anyway
        return False


def _warn_skipped(skipped: list[str], show: int = 5) -> None:
    """One warning line per skipped special file (the first few), then the count."""
    if not skipped:
        return
    for line in skipped[:show]:
        click.echo(f"cdcstore: warning: skipped {shown(line)}", err=True)
    click.echo(f"cdcstore: warning: skipped {len(skipped)} files that are not regular files "
               f"(FIFOs, sockets, devices, folder symlinks)", err=True)


@cli.command()
@click.argument("src", metavar="cdc://REPO[@REV]/PATH")
@click.argument("local", metavar="LOCAL")
@filter_options
@store_option
@json_option
@handle_errors
def pull(src, local, include, exclude, store_path, token, as_json):
    """Write a file or folder of a revision to local disk."""
    s = _store(store_path, token)
    with _progress(lambda: sum(e["size"] for e in s.ls(src, recursive=True)), "pull", as_json) as bar:
        r = s.pull(src, local, progress=bar.update, include=include, exclude=exclude)
    if as_json:
        _print_json(r.to_dict())
        return
    click.echo(f"{r.files} files, {_human(r.bytes)} from commit {r.commit[:12]}; wrote "
               f"{r.written_files} files, {_human(r.written_bytes)} in {r.seconds:.2f}s")


@cli.command(name="ls")
@click.argument("addr", metavar="cdc://REPO[@REV]/PATH")
@click.option("-r", "--recursive", is_flag=True, help="List every file below PATH.")
@click.option("-h", "--human", is_flag=True, help="Sizes as 1.2 MiB.")
@store_option
@json_option
@handle_errors
def ls_cmd(addr, recursive, human, store_path, token, as_json):
    """List a folder of a revision."""
    entries = _store(store_path, token).ls(addr, recursive=recursive)
    if as_json:
        _print_json({"entries": entries})
        return
    for e in entries:
        name = e["name"] + ("/" if e["type"] == "directory" else "")
        size = _human(e["size"]) if human else e["size"]
        click.echo(f"{size:>14}  {shown(name)}")


@cli.command()
@click.argument("addr", metavar="cdc://REPO[@BRANCH]/PATH")
@click.option("-r", "--recursive", is_flag=True, help="Remove a folder and everything in it.")
@click.option("-m", "--message", default="", help="Commit message.")
@store_option
@json_option
@handle_errors
def rm(addr, recursive, message, store_path, token, as_json):
    """Remove a file (or, with -r, a folder) from a branch: one commit."""
    try:
        r = _store(store_path, token).remove(addr, recursive=recursive, message=message)
    except IsADirectoryError as e:
        raise InvalidAddressError(f"{addr} is a folder: remove it and everything in it with "
                                  f"`cdcstore rm -r {addr}`") from e
    if as_json:
        _print_json(r.to_dict())
        return
    where = parse(addr)
    click.echo(f"commit {_short(r.commit)} on {where.repo}@{where.ref}: removed {where.path}")


@cli.command()
@click.argument("old", metavar="cdc://REPO@REV1[/PATH]")
@click.argument("new", metavar="cdc://REPO@REV2[/PATH]")
@click.option("-h", "--human", is_flag=True, help="Sizes as 1.2 MiB.")
@store_option
@json_option
@handle_errors
def diff(old, new, human, store_path, token, as_json):
    """Files added, removed and changed between two revisions, with the new bytes of each
    (bytes of chunks the old revision does not hold)."""
    entries = _store(store_path, token).diff(old, new)
    if as_json:
        _print_json({"old": old, "new": new, "files": entries})
        return
    mark = {"added": "+", "removed": "-", "changed": "M"}
    size = _human if human else str
    for e in entries:
        click.echo(f"{mark[e['change']]} {size(e['bytes']):>12} {size(e['new_bytes']):>12} new  {shown(e['path'])}")
    total = sum(e["new_bytes"] for e in entries)
    click.echo(f"{len(entries)} files differ; {size(total)} new")


@cli.command()
@click.argument("addr", metavar="cdc://REPO[@REV]/PATH")
@store_option
@handle_errors
def cat(addr, store_path, token):
    """Write a file of a revision to stdout."""
    out = sys.stdout.buffer
    s = _store(store_path, token, announce=False)  # stdout is the file: the store is named only if made
    if s.created:
        _announce(s, store_path)
    with s.open(addr) as f:
        while pieces := f.read_pieces(8 * 1024 * 1024):
            for p in pieces:
                out.write(p)
    out.flush()


@cli.command()
@click.argument("repo", metavar="REPO[@REV][/PATH]")
@click.option("-n", "--max-count", "limit", type=click.IntRange(min=0), default=None,
              help="Show at most N commits.")
@store_option
@json_option
@handle_errors
def log(repo, limit, store_path, token, as_json):
    """Show the commits of a revision, newest first; with a PATH, those that changed it."""
    a = parse(repo)
    entries = _store(store_path, token).log(a.repo, a.ref, limit=limit, path=a.path or None)
    if as_json:
        _print_json({"repo": a.repo, "rev": a.ref, "commits": entries})
        return
    for e in entries:
        when = datetime.datetime.fromtimestamp(e["time"]).strftime("%Y-%m-%d %H:%M:%S")
        by = f"  ({shown(e['author'])})" if e.get("author") else ""
        if e.get("forgotten"):  # history only: `forget` dropped its files
            click.echo(f"{e['commit'][:12]}  {when}  {'(forgotten)':>23}  {shown(e['message'])}{by}")
        else:
            click.echo(f"{e['commit'][:12]}  {when}  {e['files']:>6} files {_human(e['bytes']):>10}  "
                       f"{shown(e['message'])}{by}")


def _refs_command(kind: str, repo: str, name: str | None, rev: str | None, delete: bool,
                  store_path, token, as_json, force: bool = False) -> None:
    """List, create or delete the branches or tags of a repo (one code path for both)."""
    s = _store(store_path, token)
    if name is None:
        if delete or rev:
            raise InvalidAddressError(f"name the {kind} to {'delete' if delete else 'create'}: "
                                      f"cdcstore {kind} {repo} NAME")
        refs = s.tags(repo) if kind == "tag" else s.branches(repo)
        if as_json:
            _print_json({"repo": repo, "tags" if kind == "tag" else "branches": refs})
            return
        for n, cid in refs.items():
            click.echo(f"{cid[:12]}  {n}")
        return
    if delete:
        if rev:
            raise InvalidAddressError(f"--delete takes no revision: cdcstore {kind} {repo} {name} --delete")
        cid = s.delete_tag(repo, name) if kind == "tag" else s.delete_branch(repo, name, force)
        action = "deleted"
    else:
        rev = rev or DEFAULT_BRANCH
        cid = s.tag(repo, name, rev) if kind == "tag" else s.create_branch(repo, name, rev)
        action = "created"
    if as_json:
        _print_json({"repo": repo, kind: name, "commit": cid, "action": action})
    else:
        click.echo(f"{action} {kind} {repo}@{name} at commit {cid[:12]}")


@cli.command()
@click.argument("repo", metavar="REPO")
@click.argument("name", required=False)
@click.argument("rev", required=False, metavar="[REV]")
@click.option("--delete", is_flag=True, help="Delete the tag NAME (tags are otherwise never changed).")
@store_option
@json_option
@handle_errors
def tag(repo, name, rev, delete, store_path, token, as_json):
    """List tags; with NAME, tag REV (default: main) forever; NAME --delete removes it."""
    _refs_command("tag", repo, name, rev, delete, store_path, token, as_json)


@cli.command()
@click.argument("repo", metavar="REPO")
@click.argument("name", required=False)
@click.argument("rev", required=False, metavar="[REV]")
@click.option("--delete", is_flag=True, help="Delete the branch NAME (its commits stay reachable by id).")
@click.option("--force", is_flag=True, help="With --delete: delete even the default branch (main).")
@store_option
@json_option
@handle_errors
def branch(repo, name, rev, delete, force, store_path, token, as_json):
    """List branches; with NAME, create a branch at REV (default: main); NAME --delete removes it."""
    _refs_command("branch", repo, name, rev, delete, store_path, token, as_json, force)


@cli.command()
@click.argument("addr", required=False, metavar="[cdc://REPO[@REV]/PATH]")
@store_option
@json_option
@handle_errors
def stats(addr, store_path, token, as_json):
    """Store totals, or what a revision holds and added over its parent."""
    st = _store(store_path, token).stats(addr)
    if as_json:
        _print_json(st)
        return
    if addr:
        click.echo(f"{addr}: {st['files']} files, {_human(st['bytes'])}; unique chunks "
                   f"{_human(st['unique_bytes'])}; new over parent {_human(st['new_bytes'])}, "
                   f"stored {_human(st['stored_bytes'])}")
    else:
        kept = (f"stored {_human(st['stored_bytes'])}" if st.get("hidden") else
                f"in {st['packs']} packs {_human(st['pack_bytes'])}")
        click.echo(f"store {st['store']}: {st['repos']} repos, branch heads {st['files']} files "
                   f"{_human(st['bytes'])}; {st['versions']} versions {_human(st['history_bytes'])} in all, "
                   f"kept as {st['chunks']} unique chunks {_human(st['chunk_raw_bytes'])} {kept} "
                   f"(x{st['dedup_ratio']:.2f} against full copies)")
        if st.get("hidden"):
            click.echo(f"  (your token reaches only some repos: these figures count what they reach; "
                       f"{' and '.join(st['hidden'])} of the whole store are not shown to it)")


def _percent(value: str | None, option: str = "--read-data-subset", zero: bool = False) -> float | None:
    if value is None:
        return None
    try:
        n = float(value.rstrip("%"))
    except ValueError:
        n = -1.0
    if not (0 <= n if zero else 0 < n) or n > 100:
        raise CdcError(f"{option} wants a percentage between 0% and 100%{'' if zero else ' (above 0%)'}, not {value!r}")
    return n / 100


@cli.command()
@store_option
@click.option("--read-data", is_flag=True, help="Also hash every pack and decode every chunk (reads all data).")
@click.option("--read-data-subset", metavar="N%", default=None,
              help="Read and decode a deterministic sample of N% of the packs.")
@json_option
@handle_errors
def check(store_path, token, read_data, read_data_subset, as_json):
    """Verify the store's structure: every pack footer, every index row against its
    pack, and every commit and manifest that a branch or tag reaches. Fast: no chunk
    is decoded unless --read-data or --read-data-subset is given. A chunk that fails
    verification is forgotten, so pushing its file again repairs it. Runs on a store
    directory or bucket, or on a server's side (a token with admin scope)."""
    r = _store(store_path, token).check(read_data=read_data, subset=_percent(read_data_subset))
    if as_json:
        _print_json(r)
    else:
        for p in r["problems"]:
            click.echo(f"problem: {p}")
        click.echo(f"checked {r['packs']} packs ({r['read_packs']} read), {r['chunks']} chunks: "
                   f"{len(r['problems']) or 'no'} problems")
    if r["problems"]:
        sys.exit(EXIT_ERROR)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(value: str, option: str = "--grace") -> float:
    """Seconds of "90", "90s", "30m", "12h" or "7d"."""
    text = value.strip().lower()
    unit = _UNITS.get(text[-1:], None)
    try:
        n = float(text[:-1] if unit else text)
    except ValueError:
        n = -1.0
    if not 0 <= n < float("inf"):  # NaN and infinity too
        raise CdcError(f"{option} wants a duration like 90s, 30m, 12h or 7d, not {value!r}")
    return n * (unit or 1)


@cli.command(name="delete-repo")
@click.argument("repo", metavar="REPO")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; change nothing.")
@store_option
@json_option
@handle_errors
def delete_repo(repo, dry_run, store_path, token, as_json):
    """Remove a repo: its branches, tags and history. `gc` then frees the data only it used."""
    r = _store(store_path, token).delete_repo(repo, dry_run=dry_run)
    if as_json:
        _print_json(r)
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} repo {repo}: {r['refs']} branches and tags, {r['commits']} commits"
               + ("; run `cdcstore gc` to free its data" if not dry_run else ""))


@cli.command()
@click.argument("repo", metavar="REPO")
@click.option("--keep-last", type=int, default=None, metavar="N", help="Keep the N newest commits of each branch.")
@click.option("--keep-within", default=None, metavar="DURATION", help="Keep commits younger than this (30d, 12h).")
@click.option("--keep-tags", is_flag=True, help="Accepted for older scripts: tagged commits are always kept.")
@click.option("--dry-run", is_flag=True, help="Print what would be forgotten; change nothing.")
@click.option("--prune", is_flag=True, help="Then run gc: free the data only forgotten commits used (restic's "
                                            "forget --prune).")
@store_option
@json_option
@handle_errors
def forget(repo, keep_last, keep_within, keep_tags, dry_run, prune, store_path, token, as_json):
    """Retention: forget old commits of REPO (branch heads are always kept); `gc` (or --prune)
    then frees the data only they used, at once: the grace window spares uploads in flight, and
    what a landed commit reached is none. Forgotten commits stay in the log, marked; reading one
    is an error."""
    within = _duration(keep_within, "--keep-within") if keep_within is not None else None
    s = _store(store_path, token)
    r = s.forget(repo, keep_last, within, keep_tags, dry_run)
    g = s.gc(dry_run=dry_run) if prune else None
    if as_json:
        _print_json({**r, "gc": g} if prune else r)
        return
    verb = "would forget" if dry_run else "forgot"
    tagged = r.get("kept_tagged") or []
    click.echo(f"{verb} {len(r['forget'])} commits of {repo}; {r['kept']} kept"
               + (f" ({len(tagged)} only because tagged: {', '.join(tagged[:5])}; a tagged commit is never "
                  f"forgotten: delete the tag first)" if tagged else "")
               + ("; run `cdcstore gc` (or `forget --prune`) to free their data"
                  if r["forget"] and not dry_run and not prune else ""))
    for cid in r["forget"][:20]:
        click.echo(f"  {cid[:12]}")
    if g is not None:
        _gc_report(g, dry_run)


@cli.command()
@store_option
@click.option("--grace", default="1d", show_default=True, metavar="DURATION",
              help="Spare objects younger than this (a push in flight may be about to name them).")
@click.option("--dry-run", is_flag=True, help="Print the plan; delete nothing.")
@click.option("--repack-dead", type=float, default=0.5, show_default=True, metavar="SHARE",
              help="Rewrite a pack when more than this share of it is dead.")
@click.option("--max-unused", default="5%", show_default=True, metavar="PERCENT|none",
              help="Then rewrite the most dead packs until the dead bytes left are at most this share "
                   "of the live ones ('none': never).")
@json_option
@handle_errors
def gc(store_path, token, grace, dry_run, repack_dead, max_unused, as_json):
    """Delete packs, manifests and commits that no branch or tag reaches (mark, plan, execute).
    Nothing is deleted while a push is in flight. Runs on a store directory or bucket, or on a
    server's side (a token with admin scope)."""
    unused = None if max_unused.strip().lower() == "none" else _percent(max_unused, "--max-unused", zero=True)
    r = _store(store_path, token).gc(grace=_duration(grace), dry_run=dry_run, repack_dead=repack_dead,
                                     max_unused=unused)
    if as_json:
        _print_json(r)
        return
    _gc_report(r, dry_run)


def _gc_report(r: dict, dry_run: bool) -> None:
    verb = "would free" if dry_run or not r["deleted"] else "freed"
    click.echo(f"{verb} {_human(r['bytes_freed'])}: {r['delete_packs']} packs ({r['repack_packs']} rewritten), "
               f"{r['delete_manifests']} manifests, {r.get('delete_trees', 0)} trees, "
               f"{r['delete_commits']} commits; kept {r['live_packs']} packs with {r['live_chunks']} live chunks; "
               f"{r['spared_young']} younger objects spared")
    if r["spared_young"]:
        until = r.get("spared_until")
        when = (f"; a gc after {datetime.datetime.fromtimestamp(until).strftime('%Y-%m-%d %H:%M')} frees them if "
                f"nothing names them by then" if until else "")
        held = f", {_human(r['spared_bytes'])} of packs" if r.get("spared_bytes") else ""
        click.echo(f"  spared{held}: written within the grace window and "
                   f"reached by no commit, so an upload in flight may be about to name them{when}")
    if r["open_sessions"] and not dry_run:
        click.echo(f"{r['open_sessions']} pushes are in flight: nothing was deleted; run gc again later")


@cli.command(name="rebuild-index")
@local_store_option
@click.option("--read-data", is_flag=True, help="Verify every chunk before indexing it (reads all data).")
@json_option
@handle_errors
def rebuild_index(store_path, read_data, as_json):
    """Recreate the chunk index from the pack footers. Chunks a read or `check` found damaged
    stay out unless they verify now, so the index never makes damage readable again."""
    r = _local(store_path, "rebuild-index").rebuild_index(read_data=read_data)
    if as_json:
        _print_json(r)
    else:
        click.echo(f"indexed {r['chunks']} chunks from {r['packs']} packs"
                   + (f"; {len(r['bad_packs'])} problems (damaged packs, commits or manifests)"
                      if r["bad_packs"] else ""))
        for line in r["bad_packs"][:10]:
            click.echo(f"  problem: {shown(line)}")
        if r["damaged_chunks"]:
            click.echo(f"left out {r['damaged_chunks']} damaged chunks (they fail verification): run `cdcstore "
                       f"check` for the files they affect, then push those files again to repair them")


@cli.group()
def cache():
    """The local dedup cache of chunks read from servers."""


_cache_opt = click.option("--cache", "cache_path", default=None, metavar="PATH",
                          help="Cache file (default: $CDCSTORE_CACHE, else the user cache dir).")


@cache.command(name="stats")
@_cache_opt
@json_option
@handle_errors
def cache_stats(cache_path, as_json):
    """Size and contents of the cache."""
    st = ChunkCache(cache_path).stats()
    if as_json:
        _print_json(st)
    else:
        click.echo(f"{st['path']}: {st['chunks']} chunks, {_human(st['bytes'])} stored "
                   f"({_human(st['raw_bytes'])} raw) in {st['segments']} segment files of "
                   f"{_human(st['segment_bytes'])}, {st['objects']} manifests and commits; "
                   f"limit {_human(st['max_bytes'])}")


@cache.command(name="prune")
@_cache_opt
@click.option("--max-size", default=None, metavar="SIZE", help="Prune down to 90% of this (e.g. 5G).")
@handle_errors
def cache_prune(cache_path, max_size):
    """Evict least recently used chunks down to the size limit."""
    c = ChunkCache(cache_path)
    freed = c.prune(parse_size(max_size) if max_size else None)
    click.echo(f"freed {_human(freed)}; {_human(c.bytes())} left")


@cache.command(name="clear")
@_cache_opt
@handle_errors
def cache_clear(cache_path):
    """Empty the cache."""
    c = ChunkCache(cache_path)
    c.clear()
    click.echo(f"cleared {c.path}")


@cli.command()
@local_store_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8470, show_default=True, type=int, help="Port to bind (0: any free port).")
@click.option("--tokens", "tokens_file", default=None, metavar="FILE",
              help='JSON file: {"TOKEN": {"scope": "read"|"write"|"admin", "repos": ["*"] or [names]}} '
                   '(admin: gc, check, forget, delete-repo; repos ["*"]).')
@click.option("--allow-no-auth", is_flag=True, help="Serve a non-loopback address without --tokens.")
@click.option("--max-heavy", default=None, type=int,
              help="Concurrent uploads, and concurrent pack-range reads, before the server answers 429 "
                   "with Retry-After  [default: 8].")
@click.option("--body-timeout", default=30.0, show_default=True, type=float,
              help="Seconds without a request body byte before the server answers 408.")
@click.option("--min-body-rate", default=16384.0, show_default=True, type=float,
              help="Bytes/s a request body must average once past --body-timeout (else 408).")
@click.option("--maintenance-interval", default=600.0, show_default=True, type=float,
              help="Seconds between removing dead temp files and indexing unindexed packs.")
@click.option("--min-gc-grace", default="1h", show_default=True, metavar="DURATION",
              help="The shortest --grace an admin's remote gc may ask for (uploads of other clients may be "
                   "in flight).")
@click.option("--limit", "limit_items", multiple=True, metavar="NAME=VALUE",
              help="Override one of the server's limits (remote/server/limits.py ServerLimits; bytes, seconds), "
                   "e.g. --limit max_sessions_per_token=4. Repeatable.")
@click.option("--s3-port", default=None, type=int, metavar="PORT",
              help="Also serve the S3-compatible gateway (reads, and writes into branches) on this port of "
                   "--host: bucket = repo, key = REV/PATH; access key id = a token's name, secret = the token "
                   "(docs/gateway.md).")
@handle_errors
def serve(store_path, host, port, tokens_file, allow_no_auth, max_heavy, body_timeout, min_body_rate,
          maintenance_interval, min_gc_grace, limit_items, s3_port):
    """Serve a store over HTTP (protocol v1, docs/protocol.md)."""
    from .publish import Publisher
    from .remote.serve import serve as run_server

    run_server(_local(store_path, "serve").location, host, port, tokens_file, allow_no_auth, max_heavy,
               body_idle_timeout=body_timeout, min_body_rate=min_body_rate,
               maintenance_interval=maintenance_interval,
               min_gc_grace=_duration(min_gc_grace, "--min-gc-grace"), limit_items=limit_items, s3_port=s3_port,
               publisher=Publisher)


@cli.group()
def token():
    """Add or revoke a token of a server's --tokens file (the server sees the edit within a second)."""


@token.command("revoke")
@click.argument("who", metavar="NAME_OR_TOKEN")
@click.option("--tokens", "tokens_file", required=True, metavar="FILE", help="The server's --tokens file.")
@handle_errors
def token_revoke(who, tokens_file):
    """Take the tokens named NAME (or the token itself) out of FILE: refused from their next request."""
    from .remote.server.tokens import revoke as revoke_token

    names = revoke_token(tokens_file, who)
    click.echo(f"revoked {len(names)} token(s) named {', '.join(sorted(set(names)))} in {tokens_file}")


@token.command("add")
@click.argument("name")
@click.option("--tokens", "tokens_file", required=True, metavar="FILE", help="The server's --tokens file.")
@click.option("--scope", type=click.Choice(["read", "write", "admin"]), default="read", show_default=True)
@click.option("--repo", "repos", multiple=True, metavar="REPO", help="A repo it may use (repeatable) [default: all].")
@handle_errors
def token_add(name, tokens_file, scope, repos):
    """Add a new random token named NAME to FILE and print it (NAME: the author of its pushes)."""
    from .remote.server.tokens import add as add_token

    click.echo(add_token(tokens_file, name, scope, list(repos)))


@cli.command()
@click.option("--size-mb", default=64, show_default=True, help="Size of the generated dataset.")
@click.option("--workdir", default=None, help="Where to put the demo files (default: a temp dir).")
@handle_errors
def demo(size_mb, workdir):
    """Publish a Parquet dataset, publish an edited version, read it back, report."""
    from .demo import run

    run(size_mb=size_mb, workdir=workdir)


@cli.command()
@click.argument("addr", metavar="cdc://REPO[@REV]/[PATH]")
@click.argument("mountpoint", type=click.Path(file_okay=False))
@click.option("--refresh", type=float, default=30.0, show_default=True,
              help="Seconds between looks at a mounted branch's head (a commit id or tag never changes).")
@click.option("--background", is_flag=True,
              help="Return once the folder shows the revision; the mount goes on in a process of its own.")
@store_option
@handle_errors
def mount(addr, mountpoint, refresh, background, store_path, token):
    """Show a revision as a read-only folder (FUSE) until `cdcstore unmount MOUNTPOINT` or Ctrl-C."""
    from .mount import check_mountpoint, mount as serve_mount

    if background:
        _mount_in_background(addr, mountpoint, refresh, store_path, token)
        return
    s = _store(store_path, token)
    check_mountpoint(mountpoint)
    serve_mount(addr, mountpoint, s, refresh=refresh)


def _mount_in_background(addr, mountpoint, refresh, store_path, token) -> None:
    """The same command in foreground in a new session, its log in MOUNTPOINT's sibling file;
    returns once the folder is a mount point, or fails with the child's error."""
    import subprocess
    import time

    from .mount import MountError, check_mountpoint

    path = check_mountpoint(mountpoint)
    args = [sys.executable, "-m", "cdcstore", "mount", addr, path, "-q", "--refresh", str(refresh)]
    args += ["--store", store_path] if store_path else []
    args += ["--token", token] if token else []
    log_path = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.cdcstore-mount.log")
    with open(log_path, "ab") as log:
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 60
    while not os.path.ismount(path):
        if child.poll() is not None:
            with open(log_path, errors="replace") as f:
                said = f.read().strip().splitlines()
            last = said[-1].removeprefix("cdcstore: error: ") if said else ""
            raise MountError(last or f"the mount process exited ({child.returncode}); log: {log_path}")
        if time.monotonic() > deadline:
            child.terminate()
            raise MountError(f"{mountpoint} did not show the revision within 60 s (log: {log_path})")
        time.sleep(0.05)
    if not _quiet():
        click.echo(f"cdcstore: mounted {addr} on {path} (process {child.pid}; log {log_path}); "
                   f"`cdcstore unmount {mountpoint}` ends it", err=True)


@cli.command()
@click.argument("mountpoint", type=click.Path(file_okay=False))
@click.option("--lazy", is_flag=True, help="Detach now even if a reader still has a file open in it.")
@handle_errors
def unmount(mountpoint, lazy):
    """End a `cdcstore mount` (also when its process or its store is gone)."""
    from .mount import unmount as end_mount

    end_mount(mountpoint, lazy)


def main() -> None:
    cli(prog_name="cdcstore")


if __name__ == "__main__":
    main()

"""webdataset reads `cdc://` shards: a `cdc` handler in webdataset's `gopen_schemes`.

    import cdcstore.gopen                    # once, at the top of the training script
    import webdataset as wds
    ds = wds.WebDataset("cdc://lake@main/wds/shard-{000000..000003}.tar")

Why an import, and why this one. webdataset 1.0.2 opens every shard through `webdataset.gopen.gopen`,
which looks the URL's scheme up in the module-level dict `gopen_schemes` and raises "no gopen
handler defined" for any scheme not in it. It offers no other hook: no entry points (it never calls
`importlib.metadata`), no fsspec fallback (it never imports fsspec), and its environment variables
only rewrite URLs to its own schemes (`GOPEN_REWRITE`, `USE_AIS_FOR`: `pipe:cdcstore -q cat ...`,
the glue this module replaces). So some code of ours must run in the process before the first shard
is opened, and the one thing a user can be asked to write is an import. An import, not a call to
`register()` inside `main()`: a DataLoader worker started by `spawn` or `forkserver` runs the
script's top-level imports again, not `main()`, so the handler is there in every worker (with
`fork` the workers inherit it either way).

`import cdcstore` stays cheap (webdataset pulls in torch): it never imports webdataset, but when
webdataset is already imported it registers this handler too, since that costs nothing then. That
covers `import webdataset` followed by `import cdcstore`; the other order needs `import
cdcstore.gopen` (or `cdcstore.gopen.register()`), which works in every order and is what the docs
show (docs/formats.md, "Reading shards from cdc://"). A post-import hook in `sys.meta_path` would
cover the other order too, but it would put cdcstore in every later import of the process; not
worth it for one line.

Shards are read through `cdcstore.fs.CdcFileSystem` (the one read core: chunks verified, the
machine's dedup cache shared). The store is `$CDCSTORE_STORE` (and `$CDCSTORE_TOKEN`), or fsspec's
configuration for `cdc` (`fsspec.config.conf["cdc"] = {"store": ...}`, or `FSSPEC_CDC_STORE`), or
`store=` / `token=` passed to `webdataset.gopen.gopen` directly. A branch is resolved again after the
filesystem's `head_ttl` (5 s), as every `cdc://` read is: name a tag or a commit for an epoch that
must not see a push land halfway. Writing is refused: the handler names what to do instead.
"""
from __future__ import annotations

import errno
import sys
from typing import IO, Any

from . import settings
from .core.errors import CdcError

SCHEME = "cdc"
STORAGE_OPTIONS = ("store", "token", "cache")  # the keywords of `gopen(url, **kw)` that pick the store


def open_shard(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[bytes]:
    """webdataset's handler signature: a binary stream of the file `url` names, read-only."""
    if not mode.startswith("r"):
        raise ValueError(
            f"{url}: webdataset cannot write cdc:// shards through gopen (mode {mode!r}); write the shards to "
            f"a local folder and `cdcstore push FOLDER cdc://REPO@BRANCH/PATH/` (one commit), or hand "
            f"TarWriter a file opened on the store: `with fsspec.open(url, 'wb') as f, wds.TarWriter(f) as "
            f"sink: ...` (one commit per file)")
    from .fs import CdcFileSystem  # only when a shard is opened: importing this module stays cheap

    options = {k: kw[k] for k in STORAGE_OPTIONS if kw.get(k) is not None}
    # the environment as it is now: fsspec keeps one instance per set of arguments, and an instance
    # made with no store keeps the store it first saw
    for key, setting in (("store", settings.STORE), ("token", settings.TOKEN)):
        if key not in options and setting.is_set():
            options[key] = setting.get()
    fs = CdcFileSystem(**options)
    try:
        f: IO[bytes] = fs.open(url, "rb")
    except FileNotFoundError as e:  # say what the folder holds: a brace range one too long is the usual cause
        if isinstance(e, CdcError):  # no such repo or revision: its own message says what there is
            raise
        raise FileNotFoundError(errno.ENOENT, _missing(fs, url), url) from e
    return f


def _missing(fs: Any, url: str) -> str:
    folder = url.rstrip("/").rsplit("/", 1)[0]
    try:
        names = sorted(str(n).rsplit("/", 1)[-1] for n in fs.ls(folder, detail=False))
    except (FileNotFoundError, NotADirectoryError):
        return f"no such shard: the revision has no folder {folder}/"
    if not names:
        return f"no such shard: {folder}/ is empty"
    if len(names) == 1:
        return f"no such shard in the revision: {folder}/ holds one entry ({names[0]})"
    return f"no such shard in the revision: {folder}/ holds {len(names)} entries ({names[0]} ... {names[-1]})"


def register() -> None:
    """Add the `cdc` scheme to webdataset's `gopen_schemes` (again is harmless)."""
    try:  # by name: the package's `webdataset.gopen` attribute is the function, not the module
        from webdataset.gopen import gopen_schemes
    except ImportError as e:
        raise ImportError(f"cdcstore.gopen registers a handler with webdataset, which is not installed "
                          f"(`pip install webdataset`): {e}") from e
    gopen_schemes[SCHEME] = open_shard


def registered() -> bool:
    """Whether webdataset is imported and opens `cdc://` with this module's handler."""
    mod = sys.modules.get("webdataset.gopen")
    return mod is not None and getattr(mod, "gopen_schemes", {}).get(SCHEME) is open_shard


register()

"""The tests' server starter is the package's own (`cdcstore.testing`), shared with bench/."""
from cdcstore.testing import ServedStore, ServerProcess, free_port, stop_process, wait_until_up  # noqa: F401


def seeded_gateway(root, files: dict, repos, tokens: dict | None = None, message: str = "v1",
                   folder: str = "seed", tag: str | None = None) -> ServedStore:
    """A directory store under `root/srv` whose `repos` each got the folder `root/<folder>` of
    `files` (name -> text) pushed (the first repo tagged `tag` after), served
    with its S3 gateway on a free port (`tokens`: a tokens file; None: an open server). The
    process has `s3` (the gateway's URL), `hostport` and `root` set; the caller stops it."""
    from cdcstore import Store
    seed = root / folder
    seed.mkdir()
    for name, text in files.items():
        (seed / name).write_text(text)
    with Store.init(str(root / "srv")) as s:
        for repo in repos:
            s.push([str(seed)], f"cdc://{repo}/", message=message)
        if tag:
            s.tag(repos[0], tag)
    return ServedStore(root, tokens=tokens, gateway=True).start()

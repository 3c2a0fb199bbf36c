"""The tests' server starter is the package's own (`cdcstore.testing`), shared with bench/."""
from cdcstore.testing import ServerProcess, free_port, stop_process, wait_until_up  # noqa: F401


def seeded_gateway(root, files: dict, repos, tokens: dict | None = None, message: str = "v1",
                   folder: str = "seed", tag: str | None = None) -> ServerProcess:
    """A directory store under `root/srv` whose `repos` each got the folder `root/<folder>` of
    `files` (name -> text) pushed (the first repo tagged `tag` after), served
    with its S3 gateway on a free port (`tokens`: a tokens file; None: an open server). The
    process has `s3` (the gateway's URL), `hostport` and `root` set; the caller stops it."""
    import json

    from cdcstore import Store
    from cdcstore.storage.repository import LocalStore
    seed = root / folder
    seed.mkdir()
    for name, text in files.items():
        (seed / name).write_text(text)
    LocalStore.init(str(root / "srv"))
    with Store(str(root / "srv")) as s:
        for repo in repos:
            s.push([str(seed)], f"cdc://{repo}/", message=message)
        if tag:
            s.tag(repos[0], tag)
    args = []
    if tokens is not None:
        (root / "tokens.json").write_text(json.dumps(tokens))
        args = ["--tokens", str(root / "tokens.json")]
    port = free_port()
    srv = ServerProcess(str(root / "srv"), *args, "--s3-port", str(port)).start()
    srv.s3, srv.hostport, srv.root = f"http://127.0.0.1:{port}", f"127.0.0.1:{port}", root
    return srv

"""Trees, not flat file maps (issue 17): a commit names a root tree, a tree lists one folder,
a one-file edit writes only the trees on its path, and listing a folder reads only those."""
import json
import os
import random
import subprocess
import sys
import time

import pytest

from cdcstore import Store
from cdcstore.core import treeobj
from cdcstore.core.commit import Commit, FileEntry, changes as flat_changes, rebase_files
from cdcstore.core.errors import CorruptionError
from cdcstore.fs import CdcFileSystem
from cdcstore.storage import memo
from cdcstore.storage.maintenance import gc
from cdcstore.storage.repository import LocalStore

FOLDERS, PER_FOLDER = 40, 48  # 1,920 files; a folder of 48 is one page (wide folders: test_split_trees.py)
DEPTH = 2  # data/dNN/fNNNN.bin: the root, data, dNN


def objects(root, kind) -> set[str]:
    out = set()
    for d, _, files in os.walk(os.path.join(root, kind)):
        out.update(os.path.join(d, f) for f in files)
    return out


def commits(root) -> set[str]:
    out = set()
    for repo in os.listdir(os.path.join(root, "repos")):
        out |= objects(os.path.join(root, "repos", repo), "commits")
    return out


def big_repo(s: Store, tmp_path, repo="ds") -> dict[str, FileEntry]:
    """1,920 files in 40 folders, made from a few uploaded files (entries point at their manifests)."""
    src = tmp_path / f"seed-{repo}"
    src.mkdir()
    for i in range(5):
        (src / f"s{i}.bin").write_bytes(os.urandom(1000 + i))
    seeds = list(s.upload([str(src)], f"cdc://{repo}/").values())
    entries = {f"data/d{d:02}/f{d * PER_FOLDER + i:04}.bin": seeds[(d + i) % len(seeds)]
               for d in range(FOLDERS) for i in range(PER_FOLDER)}
    s.commit_entries(f"cdc://{repo}/", entries, "1,920 files")
    return entries


def test_a_one_file_edit_writes_only_the_trees_on_its_path(store, tmp_path):
    big_repo(store, tmp_path)
    root = store.location
    trees0, commits0 = objects(root, "trees"), commits(root)
    assert len(trees0) == FOLDERS + 2  # every folder once, and the root
    edit = tmp_path / "edit.bin"
    edit.write_bytes(b"an edited file")
    r = store.push([str(edit)], "cdc://ds/data/d07/f0351.bin")
    new_trees, new_commits = objects(root, "trees") - trees0, commits(root) - commits0
    assert len(new_trees) <= DEPTH + 1 and len(new_commits) == 1
    commit_bytes = os.path.getsize(next(iter(new_commits)))
    assert commit_bytes < 400  # a commit names its root tree: no file map
    assert store.cat("cdc://ds/data/d07/f0351.bin") == b"an edited file"
    assert store.ls("cdc://ds/data/d08")[0]["name"] == f"data/d08/f{8 * PER_FOLDER:04}.bin"
    doc = json.loads(open(next(iter(new_commits)), "rb").read())
    assert doc["format"] == 3 and doc["author"] and "files" not in doc and doc["tree"] and r.changed


def test_listing_a_folder_reads_only_the_trees_on_its_path(store, tmp_path):
    big_repo(store, tmp_path)
    be = LocalStore(store.location)  # nothing read yet
    got = []
    real = be.objects.get

    def get(name):
        if name.startswith("trees/"):
            got.append(name)
        return real(name)

    be.objects.get = get
    s = Store.over(be)
    listing = s.ls("cdc://ds/data/d13")
    assert len(listing) == PER_FOLDER and listing[0] == {"name": f"data/d13/f{13 * PER_FOLDER:04}.bin", "type": "file",
                                                       "size": listing[0]["size"]}
    assert len(got) == DEPTH + 1
    folders = s.ls("cdc://ds/data")
    assert len(folders) == FOLDERS and folders[0]["type"] == "directory"
    assert folders[0]["size"] == sum(e["size"] for e in s.ls("cdc://ds/data/d00"))
    assert s.ls(f"cdc://ds/data/d13/f{13 * PER_FOLDER:04}.bin") == [listing[0]]
    assert len(got) <= DEPTH + 3  # the root and data were read once (kept, immutable), then d00
    fs = CdcFileSystem(store=store.location)
    assert len(fs.ls("ds/data/d02", detail=False)) == PER_FOLDER


def _flat_v1_commit(be, repo, files, parent=None, message="written by cdcstore before trees"):
    c = Commit(repo, parent, message, 1700000000.0, files)  # format 1: the whole map
    assert json.loads(c.encode())["format"] == 1
    return be.commit(c, "main", parent)


def test_format_1_commits_still_read_and_a_push_on_one_writes_format_2(store, tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.bin").write_bytes(os.urandom(5000))
    (src / "b.bin").write_bytes(b"b" * 3000)
    entries = store.upload([str(src)], "cdc://old/")
    be = LocalStore(store.location)
    old = _flat_v1_commit(be, "old", dict(sorted(entries.items())))
    assert store.ls("cdc://old/") == [{"name": "a", "type": "directory", "size": 5000},
                                      {"name": "b.bin", "type": "file", "size": 3000}]
    assert store.cat("cdc://old/b.bin") == b"b" * 3000
    out = tmp_path / "out"
    assert store.pull("cdc://old/", str(out)).files == 2 and (out / "a" / "x.bin").read_bytes() == (
        src / "a" / "x.bin").read_bytes()
    (src / "c.bin").write_bytes(b"c")
    r = store.push([str(src / "c.bin")], "cdc://old/a/c.bin")
    new = be.get_commit("old", r.commit)
    assert new.tree is not None and new.parent == old
    assert store.view("old", new).files() == {**entries, "a/c.bin": new.files["a/c.bin"]}
    assert [d["path"] for d in store.diff(f"cdc://old@{old}/", f"cdc://old@{r.commit}/")] == ["a/c.bin"]
    assert [e["commit"] for e in store.log("old", path="a")] == [r.commit, old]
    assert store.check()["problems"] == []
    gc(be, grace=0)
    assert store.cat(f"cdc://old@{old}/a/x.bin") == (src / "a" / "x.bin").read_bytes()
    assert store.cat("cdc://old/a/c.bin") == b"c"


def test_gc_keeps_live_trees_and_removes_dead_ones(store, tmp_path):
    for repo in ("keep", "drop"):
        src = tmp_path / repo
        (src / "deep" / "er").mkdir(parents=True)
        (src / "deep" / "er" / "f.bin").write_bytes(repo.encode() * 100)
        store.push([str(src)], f"cdc://{repo}/")
    be = LocalStore(store.location)
    live = set(be.view("keep", be.get_commit("keep", be.resolve("keep", "main"))).tree_ids())
    dead = set(be.view("drop", be.get_commit("drop", be.resolve("drop", "main"))).tree_ids())
    assert len(live) == 3 and not live & dead  # the root, deep/, deep/er/
    be.ref_store.delete_repo("drop")
    report = gc(be, grace=0)
    assert report["delete_trees"] == 3 and report["deleted"]
    stored = set(be.metadata.tree_names())
    assert live <= stored and not dead & stored
    assert store.cat("cdc://keep/deep/er/f.bin") == b"keep" * 100


def test_a_young_unreachable_tree_keeps_what_it_names(store, tmp_path):
    """A commit about to land names a young tree: gc keeps it, its subtrees and its manifests."""
    src = tmp_path / "s"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(4000))
    entries = store.upload([str(src)], "cdc://r/")
    be = LocalStore(store.location)
    c = be.make_commit("r", None, "not landed yet", time.time(), {"x/" + p: e for p, e in entries.items()})
    report = gc(be, grace=3600)
    assert report["delete_trees"] == 0 and report["delete_manifests"] == 0
    assert be.commit(c, "main", None) == c.id
    assert store.cat("cdc://r/x/f.bin") == (src / "f.bin").read_bytes()


def test_check_finds_a_missing_and_a_damaged_tree(store, tmp_path):
    src = tmp_path / "s"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.bin").write_bytes(b"f" * 100)
    (src / "g.bin").write_bytes(b"g" * 100)
    store.push([str(src)], "cdc://ds/")
    assert store.check()["problems"] == []
    be = LocalStore(store.location)
    commit = be.get_commit("ds", be.resolve("ds", "main"))
    sub = be.view("ds", commit).entry("sub").tree
    path = be.objects.local_path(f"trees/{sub[:2]}/{sub}")
    os.unlink(path)
    r = Store(store.location).check()
    assert r["problems"]
    text = json.dumps(r)
    assert f"tree {sub} is missing" in text and "cdc://ds@main/sub" in text
    with open(path, "wb") as f:
        f.write(b'{"format": 2, "type": "tree", "entries": {}}')
    assert "does not match its name" in json.dumps(Store(store.location).check())
    cli = subprocess.run([sys.executable, "-m", "cdcstore", "check", "--store", store.location],
                         capture_output=True, text=True)
    assert cli.returncode == 1 and "tree" in cli.stdout


TOKENS = {"tok-a": {"scope": "write", "repos": ["a"]}, "tok-b": {"scope": "write", "repos": ["b"]}}


@pytest.mark.served(tokens=TOKENS)
def test_through_a_server_with_scoped_tokens(server, tmp_path):
    import urllib.error
    import urllib.request
    with Store(server.url, token="tok-a", cache=False) as sa:
        big_repo(sa, tmp_path, "a")
        root = server.store
        trees0 = objects(root, "trees")
        edit = tmp_path / "e.bin"
        edit.write_bytes(b"edited through the server")
        c0 = sa.counters()["requests"]
        sa.push([str(edit)], f"cdc://a/data/d03/f{3 * PER_FOLDER:04}.bin")
        assert len(objects(root, "trees") - trees0) <= DEPTH + 1
        assert sa.counters()["requests"] - c0 < 20  # within 2x of pushing one file, whatever the folder size
    memo.clear()  # a new machine: nothing remembered (the process keeps immutable objects: storage/memo.py)
    with Store(server.url, token="tok-a", cache=False) as fresh:
        c0 = fresh.counters()["requests"]
        assert len(fresh.ls("cdc://a/data/d21")) == PER_FOLDER
        assert fresh.counters()["requests"] - c0 == 2 + DEPTH + 1  # resolve, commit, the trees on the path
        assert fresh.cat(f"cdc://a/data/d03/f{3 * PER_FOLDER:04}.bin") == b"edited through the server"
        fs = CdcFileSystem(store=server.url, token="tok-a", cache=False)
        memo.clear()
        c0 = fs.store.counters()["requests"]
        assert len(fs.ls("a/data/d05", detail=False)) == PER_FOLDER
        assert fs.store.counters()["requests"] - c0 == 2 + DEPTH + 1
    srv = LocalStore(server.store)
    tree = srv.view("a", srv.get_commit("a", srv.resolve("a", "main"))).root

    def get(token, repo, name):
        req = urllib.request.Request(f"{server.url}/v1/repos/{repo}/trees/{name}",
                                     headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    status, body = get("tok-a", "a", tree)
    assert status == 200 and treeobj.Tree.decode(body).entries
    assert get("tok-b", "a", tree)[0] == 403  # another repo's token
    assert get("tok-b", "b", tree)[0] in (404, 403)  # repo b reaches no such tree
    # tok-b names a's tree (learned somehow) in its own commit: refused, a's chunks are not b's
    with Store(server.url, token="tok-b", cache=False) as sb:
        stolen = Commit("b", None, "steal", time.time(), None, tree)
        with pytest.raises(Exception, match="403|neither uploaded nor may read|tree"):
            sb.backend.commit(stolen, "main", None)
        assert not sb.backend.has_repo("b") or not sb.ls("cdc://b/")


def test_server_checks_only_the_new_entries_of_a_commit(tmp_path, monkeypatch):
    """The server's commit check reads the manifests of what changed, not of every file."""
    from cdcstore.remote.server.app import Server, ServerConfig
    from cdcstore.storage.manifest_file import ManifestFile
    s = Store.init(str(tmp_path / "srv"))
    big_repo(s, tmp_path)
    repo = LocalStore(str(tmp_path / "srv"))
    server = Server(repo, ServerConfig())
    head = repo.resolve("ds", "main")
    src = tmp_path / "one"
    src.mkdir()
    (src / "n.bin").write_bytes(b"new")
    [entry] = s.upload([str(src)], "cdc://ds/").values()
    c = repo.make_commit("ds", head, "one file", time.time(), {f"data/d01/f{PER_FOLDER:04}.bin": entry})  # replaced: the folder stays one page
    read, real = [], repo.get_manifest
    repo.get_manifest = lambda name, r=None: (read.append(name), real(name))[1]
    real_open = ManifestFile.__init__  # the commit's checks read manifests in slices
    monkeypatch.setattr(ManifestFile, "__init__", lambda f, store, name: (read.append(name), real_open(f, store, name))[1])
    trees_read, real_tree = [], repo.get_tree
    repo.get_tree = lambda name, r=None: (trees_read.append(name), real_tree(name))[1]
    assert server.refs.land("ds", c, "main", head) == c.id
    assert set(read) == {entry.manifest}  # checked, then granted
    assert len(trees_read) < 20  # the changed paths in both commits: never the 40 folders
    bad = repo.make_commit("ds", c.id, "a lie", time.time(), {"data/d02/lie.bin": FileEntry(entry.manifest, 999)})
    with pytest.raises(Exception, match="does not match manifest"):
        server.refs.land("ds", bad, "main", c.id)
    missing = Commit("ds", c.id, "names a tree never uploaded", time.time(), None, "ab" * 16)
    with pytest.raises(Exception, match="not on the server"):
        server.refs.land("ds", missing, "main", c.id)


# -- the pure tree logic against the flat-map logic it replaces ----------------------------------------
def _random_files(rng, n):
    names = ["a", "b", "c", "d"]
    files = {}
    for _ in range(n):
        path = "/".join(rng.choice(names) for _ in range(rng.randint(1, 4)))
        files[path + ".f"] = FileEntry(f"{rng.randrange(16):032x}", rng.randrange(100))
    return files


@pytest.mark.parametrize("seed", range(40))
def test_trees_agree_with_flat_maps(seed):
    rng = random.Random(seed)
    old, new = _random_files(rng, 30), _random_files(rng, 30)
    for p in rng.sample(sorted(old), 10):
        new[p] = old[p]
    if seed % 3 == 0:  # a file becomes a folder and back
        new.pop("a.f", None)
        new["x"] = FileEntry("1" * 32, 1)
        old["x/y.f"] = FileEntry("2" * 32, 2)
    ov, nv = treeobj.View.of_files(old), treeobj.View.of_files(new)
    assert ov.files() == dict(sorted(old.items())) and nv.size() == sum(f.size for f in new.values())
    changed, removed = treeobj.changes(ov, nv)
    assert (changed, removed) == flat_changes(old, new)
    root, nodes = treeobj.apply(ov, changed, removed)
    assert root == nv.root  # the same files, the same root: rebuilt only where they changed
    for path in {p.rsplit("/", 1)[0] for p in new if "/" in p}:
        assert nv.listing(path) == treeobj.View.of_files(new).listing(path)
    # a rebase: ours applied on a head that changed other paths, as the flat logic does
    head = dict(old)
    head["zz/other.f"] = FileEntry("3" * 32, 3)
    theirs = {"zz/other.f"}
    flat, overlap = rebase_files((changed, removed), theirs, head)
    try:
        got, _ = treeobj.apply(treeobj.View.of_files(head), changed, removed)
    except treeobj.Clash:
        got = None
    assert (got is None) == (flat is None)
    if flat is not None:
        assert got == treeobj.View.of_files(flat).root


def test_a_clash_names_the_path():
    v = treeobj.View.of_files({"a/b.f": FileEntry("1" * 32, 1)})
    with pytest.raises(treeobj.Clash) as e:
        treeobj.apply(v, {"a": FileEntry("2" * 32, 2)})
    assert e.value.paths == ["a"]
    with pytest.raises(treeobj.Clash):
        treeobj.apply(v, {"a/b.f/c": FileEntry("2" * 32, 2)})


def test_a_path_too_deep_is_refused_not_a_crash():
    from cdcstore.core.errors import InvalidAddressError
    deep = "/".join(["d"] * 300) + "/f"
    with pytest.raises(InvalidAddressError, match="folders deep"):
        treeobj.apply(None, {deep: FileEntry("1" * 32, 1)})
    with pytest.raises(ValueError, match="folders deep"):
        Commit("r", None, "", 0.0, {deep: FileEntry("1" * 32, 1)}).validate()
    # a hostile chain of nested trees (uploaded to a server) is refused when walked, not a RecursionError
    nodes, tid = {}, None
    leaf = treeobj.Tree({"f": FileEntry("1" * 32, 1)})
    tid = leaf.id
    nodes[tid] = leaf
    for _ in range(300):
        t = treeobj.Tree({"d": treeobj.Folder(tid, 1, 1)})
        tid = t.id
        nodes[tid] = t
    view = treeobj.View(nodes.__getitem__, tid)
    with pytest.raises(CorruptionError, match="folders deep"):
        view.files()
    with pytest.raises(CorruptionError, match="folders deep"):
        treeobj.changes(None, view)


def test_a_tree_naming_a_lone_surrogate_is_refused():
    """Issue 43 case 8: a name holding a lone surrogate (JSON's "\\ud800" escape) made every
    listing of its folder fail (boto3's ListObjectsV2: 400). A tree holding one does not decode:
    a server refuses it at upload, a reader names it damaged."""
    import json

    from cdcstore.core import treeobj
    from cdcstore.core.errors import CorruptionError
    m = "ab" * 32
    good = {"entries": {"ok.txt": {"manifest": m, "size": 1}}, "format": 2, "type": "tree"}
    treeobj.Tree.decode(json.dumps(good).encode())
    bad = {"entries": {"x\ud800y": {"manifest": m, "size": 1}}, "format": 2, "type": "tree"}
    data = json.dumps(bad).encode()  # ensure_ascii: the surrogate travels as an escape
    assert b"\\ud800" in data
    with pytest.raises(CorruptionError, match="not UTF-8"):
        treeobj.Tree.decode(data, "tree t")

"""Wide folders split by their names' hashes (tree format 3, issue 32): a commit under a folder
of any width rewrites a bounded page and the split nodes above it, reads only those, and the
same files always make the same trees however they were reached."""
import json
import os
import random
import time

import boto3
import pytest

from cdcstore import Store
from cdcstore.core import treeobj
from cdcstore.core.commit import FileEntry, changes as flat_changes
from cdcstore.core.errors import CorruptionError
from cdcstore.storage import memo
from cdcstore.storage.check import check
from cdcstore.storage.maintenance import gc
from cdcstore.storage.repository import LocalStore
from cdcstore.testing import ServedStore, ServerProcess, free_port

TOKEN = "writer-token-" + "w" * 20


def _m(i: int) -> str:
    return f"{i:064x}"


def _wide(n: int, folder: str = "", name: str = "f{:06d}.bin") -> dict[str, FileEntry]:
    base = f"{folder}/" if folder else ""
    return {base + name.format(i): FileEntry(_m(i), 1000 + i) for i in range(n)}


class Counted:
    """A loader over built nodes that counts the nodes read."""

    def __init__(self, nodes):
        self.nodes, self.read = dict(nodes), []

    def __call__(self, tid):
        self.read.append(tid)
        try:
            return self.nodes[tid]
        except KeyError:
            raise CorruptionError(f"tree {tid} is missing") from None


def _stored_view(files):
    rid, nodes = treeobj.build(files)
    load = Counted(nodes)
    return treeobj.View(load, rid), load


def _random_change(rng, files: dict, wide: str) -> tuple[dict, set]:
    new = dict(files)
    for p in rng.sample(sorted(files), min(len(files), rng.randrange(0, 40))):
        if rng.random() < 0.5:
            del new[p]
        else:
            new[p] = FileEntry(_m(rng.randrange(10 ** 9)), rng.randrange(10 ** 6))
    for _ in range(rng.randrange(0, 60)):
        new[f"{wide}/n{rng.randrange(10 ** 6)}.bin"] = FileEntry(_m(rng.randrange(10 ** 9)), rng.randrange(99))
    if rng.random() < 0.3:  # a file of the wide folder becomes a folder
        victim = next((p for p in sorted(new) if p.startswith(wide + "/")), None)
        if victim:
            new.pop(victim)
            new[victim + "/inner.bin"] = FileEntry(_m(7), 7)
    return new


@pytest.mark.parametrize("leaf_max", [2, 5, 48])
@pytest.mark.parametrize("seed", range(12))
def test_split_trees_agree_with_flat_maps(monkeypatch, leaf_max, seed):
    """Applying a change set to a tree gives the tree built from the changed files (one shape
    for one set of entries: grown, shrunk and collapsed folders included), and diffs, listings
    and lookups agree with the flat maps."""
    monkeypatch.setattr(treeobj, "LEAF_MAX", leaf_max)
    rng = random.Random(seed * 31 + leaf_max)
    wide = "w"
    old = _wide(rng.randrange(0, 160), wide)
    old.update(_wide(rng.randrange(0, 20), "", "top{}.txt"))
    old.update(_wide(rng.randrange(0, 30), "w/sub/deep"))
    new = _random_change(rng, old, wide)
    if seed % 4 == 0:  # most of the wide folder removed: split nodes collapse into one page
        new = {p: f for p, f in new.items() if not p.startswith("w/") or rng.random() < 0.05}
    ov, ol = _stored_view(old)
    nv = treeobj.View.of_files(new)
    assert ov.files() == dict(sorted(old.items()))
    changed, removed = treeobj.changes(ov, nv)
    assert (changed, removed) == flat_changes(old, new)
    root, nodes = treeobj.apply(ov, changed, removed)
    assert root == nv.root  # the same files, the same root, however it was reached
    got = treeobj.View(Counted({**ol.nodes, **nodes}), root)
    assert got.files() == dict(sorted(new.items()))
    for path in sorted(new)[:50]:
        assert got.get(path) == new[path]
    assert got.get("w/no-such-file") is None and got.kind("w") == ("directory" if any(
        p.startswith("w/") for p in new) else None)
    for folder in ("", "w", "w/sub/deep"):
        assert got.listing(folder) == treeobj.View.of_files(new).listing(folder)
    for t in nodes.values():  # every node written is canonical and decodes to itself
        assert treeobj.Tree.decode(t.encode()) == t
        assert t.entry_count <= leaf_max or t.split


def test_a_one_file_edit_in_a_wide_folder_costs_a_bounded_path():
    """The cost of a commit follows the change, not the folder's width: one file edited in
    a folder of 2,000 and of 200,000 files reads and writes a page and the split nodes above
    it, a few kB in all (a format-2 page of 200,000 entries was ~22 MB)."""
    cost = {}
    for n in (2_000, 200_000):
        files = _wide(n, "data")
        view, load = _stored_view(files)
        depth = 0
        t = view.node(view.node(view.root).entries["data"].tree)
        while t.split:
            depth += 1
            t = view.node(next(iter(t.slots.values())).tree)
        load.read.clear()
        root, nodes = treeobj.apply(view, {"data/f000123.bin": FileEntry(_m(9), 9)})
        written = sum(len(t.encode()) for t in nodes.values())
        cost[n] = written
        assert len(nodes) <= depth + 2  # the root, the folder's split nodes on the path, one page
        assert len(load.read) <= depth + 2  # and only those were read
        assert written < 12_000, (n, written)
        assert treeobj.View(Counted({**load.nodes, **nodes}), root).get("data/f000123.bin") == FileEntry(_m(9), 9)
    assert cost[200_000] <= 2 * cost[2_000]


def test_golden_split_node():
    """Tree formats 3 and 5 are a contract: 49 files in one folder (one more than a page
    holds). cdcstore writes format 5 (slots with content ids); format 3 is still read."""
    files = {f"f{i:02d}.bin": FileEntry("2e3f0b72e8ae23128bc34f11d52cd1b1", i) for i in range(49)}
    rid, nodes = treeobj.build(files)
    root = nodes[rid]
    assert root.split and root.prefix == "" and treeobj.LEAF_MAX == 48
    assert treeobj.name_digits("f00.bin") == GOLDEN_DIGITS
    assert json.loads(root.encode())["slots"]["0"]["content"] == GOLDEN_SLOT0_CONTENT
    assert rid == GOLDEN_SPLIT5_ID and root.content == GOLDEN_SPLIT_CONTENT
    assert treeobj.Tree.decode(root.encode()) == root
    old = treeobj.Tree.decode(GOLDEN_SPLIT)  # format 3: the same folder, with no content ids
    assert old.id == GOLDEN_SPLIT_ID and old.content is None
    assert {d: sl.tree for d, sl in old.slots.items()} == {d: sl.tree for d, sl in root.slots.items()}
    # one file fewer: a page of 48 entries, the format-2 tree it always was
    del files["f48.bin"]
    rid, nodes = treeobj.build(files)
    assert not nodes[rid].split and json.loads(nodes[rid].encode())["format"] == 2


GOLDEN_DIGITS = '4777521125222743312331403143143101137241400213354005474167106153502065511130404031752'  # name_digits("f00.bin")
GOLDEN_SPLIT = (b'{"format":3,"prefix":"","slots":{"0":{"entries":8,"files":8,"size":192,"tree":"0890987cd1e07d622f7e8'
                b'f23f889b713a242827476702c5aed8702f557a19943"},"1":{"entries":8,"files":8,"size":156,"tree":"4f831680'
                b'87fbce0226a97a78745df8430fcfdc24eaf83c2750ce32d3d4832336"},"2":{"entries":2,"files":2,"size":58,"tre'
                b'e":"661e536fd25d0399a4431e5308f0ed3239a32eb2da14c604c79c34b18ca6fbc7"},"3":{"entries":5,"files":5,"s'
                b'ize":139,"tree":"2833e49ba29c58db2c670878ac183538065cae584c7d110d288d8f1d0eda722b"},"4":{"entries":1'
                b'1,"files":11,"size":210,"tree":"4195cc4552bbabc50e4f98a938005e6268d737a8fd023c21492e11de0564c455"},"'
                b'5":{"entries":4,"files":4,"size":141,"tree":"528654bfd2293dd34fcbeb6fcd870746b814c053c93ed9b5cc0cbc2'
                b'95ec0ffbd"},"6":{"entries":4,"files":4,"size":103,"tree":"ba5bd50087dbb134f1383bf28f13a24ce3b11cf095'
                b'8d2521d3a4c9aca819a686"},"7":{"entries":7,"files":7,"size":177,"tree":"ef100774d67ea0e069cb23db1bb91'
                b'c28e45b0f2a52d83c1199d5bf450f91af3a"}},"type":"tree"}')
GOLDEN_SPLIT_ID = 'e77b4a4b516a25af942f60b97a482e92b9c62aa459b0b0805e880bd072fba7f4'
GOLDEN_SPLIT5_ID = 'b81806b4b2925ae9e58da2e28a1ea9fcdcf8e27156c46d2c008ecd9d83288591'
GOLDEN_SPLIT_CONTENT = '2af011ad736c490350ff552697a2c2b3edd8572e5a1d86c94e27e7c3dbeb168e'
GOLDEN_SLOT0_CONTENT = '525b7c44539eae7662f4dbd6bd09158da3eb6d01e6aced3a7dcc69b2c15c7ddd'
GOLDEN_PAGE4 = (b'{"entries":{"a":{"content":"4f432e450956af0ba4cd1c3634c62e439c1c55d02e35703c0df8d5d7ad4375a4","files":'
                b'1,"size":3,"tree":"157f859d2a571faccd4bf21e4acb3e638acdd4455e6f2ae7fa38e033f221a0f1"},"b.bin":{"bun'
                b'dle":"abababababababababababababababababababababababababababababababab","manifest":"2e3f0b72e8ae23128'
                b'bc34f11d52cd1b1","size":4}},"format":4,"type":"tree"}')


def test_golden_content_page():
    """Tree format 4 is a contract: a page whose folder entries carry content ids. A content
    id leaves out trees' ids and bundle hints: the same files hashed on any machine give it."""
    m = "2e3f0b72e8ae23128bc34f11d52cd1b1"
    rid, nodes = treeobj.build({"a/x.bin": FileEntry(m, 3), "b.bin": FileEntry(m, 4, "ab" * 32)})
    assert nodes[rid].encode() == GOLDEN_PAGE4
    assert treeobj.Tree.decode(GOLDEN_PAGE4) == nodes[rid]
    assert nodes[rid].content == '9452cea20ad351681318d58e4eb3dd1cf94aaa0fcb1abd1b70fbf5a9d403886b'
    bare, _ = treeobj.build({"a/x.bin": FileEntry(m, 3), "b.bin": FileEntry(m, 4)})  # no bundle hint
    assert bare != rid and _[bare].content == nodes[rid].content


@pytest.mark.parametrize("doc", [
    {"format": 2, "type": "tree", "entries": {"a": {"tree": "00" * 32, "files": 1, "size": 1, "content": "11" * 32}}},
    {"format": 4, "type": "tree", "entries": {"a": {"tree": "00" * 32, "files": 1, "size": 1}}},
    {"format": 4, "type": "tree", "entries": {"a": {"tree": "00" * 32, "files": 1, "size": 1, "content": "xyz"}}},
    {"format": 6, "type": "tree", "entries": {}}])
def test_content_ids_only_where_the_format_says(doc):
    """Content ids appear in formats 4 and 5 only (and those carry one at least): each tree
    has one encoding. An unknown format names the upgrade."""
    with pytest.raises(CorruptionError, match="tree"):
        treeobj.Tree.decode(json.dumps(doc).encode())


@pytest.mark.parametrize("lie", ["counts", "misplaced", "small split", "wrong prefix", "missing part", "content"])
def test_a_forged_split_folder_is_refused_when_read(lie):
    """A split node whose part is not what its slot says (counts), a page holding a name that
    hashes elsewhere, a split node small enough to be a page, a part of the wrong prefix, a
    part that is gone, a slot claiming another part's content id: each is a CorruptionError
    when read, never a silent wrong answer."""
    files = _wide(100)  # one split node over 8 pages of ~12 entries
    rid, nodes = treeobj.build(files)
    root = nodes[rid]
    assert root.split and not any(nodes[sl.tree].split for sl in root.slots.values())
    slots = dict(root.slots)
    d, sl = next(iter(slots.items()))
    page = nodes[sl.tree]
    if lie == "counts":
        slots[d] = treeobj.Slot(sl.tree, sl.entries, sl.files + 1, sl.size)
    elif lie == "content":  # what a writer would claim to make a new machine skip its changed files
        slots[d] = treeobj.Slot(sl.tree, sl.entries, sl.files, sl.size, "ab" * 32)
    elif lie == "misplaced":  # a name of another slot moved into this page; the counts kept true
        other = next(n for n in files if not treeobj.name_digits(n).startswith(d))
        entries = dict(page.entries)
        entries[other] = files[other]
        leaf = treeobj.Tree(dict(sorted(entries.items())))
        nodes[leaf.id] = leaf
        slots[d] = treeobj.Slot(leaf.id, leaf.entry_count, leaf.file_count, leaf.size)
    elif lie == "small split":
        with pytest.raises(ValueError, match="one page"):
            treeobj.Tree({}, {"0": treeobj.Slot(sl.tree, 2, 2, 2)}, "").encode()
        raw = json.dumps({"format": 3, "type": "tree", "prefix": "", "slots": {
            "0": {"tree": sl.tree, "entries": 2, "files": 2, "size": 2}}}).encode()
        with pytest.raises(CorruptionError, match="one page"):
            treeobj.Tree.decode(raw)
        return
    elif lie == "wrong prefix":
        inner = treeobj.Tree({}, {str(i): sl for i in range(8)}, "7")
        nodes[inner.id] = inner
        slots[d] = treeobj.Slot(inner.id, inner.entry_count, inner.file_count, inner.size)
    else:
        del nodes[sl.tree]
    forged = treeobj.Tree({}, slots, "")
    nodes[forged.id] = forged
    with pytest.raises(CorruptionError):
        treeobj.View(Counted(nodes), forged.id).files()
    with pytest.raises(CorruptionError):
        treeobj.changes(None, treeobj.View(Counted(nodes), forged.id))
    with pytest.raises(CorruptionError):  # the lookup of a name in the forged part
        v = treeobj.View(Counted(nodes), forged.id)
        for name in page.entries:
            v.get(name)
        v.get(other if lie == "misplaced" else "nothing")
        if lie == "misplaced":
            raise AssertionError("unreachable")


def _write_files(folder, n, version=0):
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        with open(os.path.join(folder, f"img{i:05d}.bin"), "wb") as f:
            f.write(random.Random(i * 7 + version).randbytes(200 + i % 50))


def test_a_wide_folder_across_two_machines_through_a_server(tmp_path):
    """Machine A pushes a folder of 1,500 files through a server; machine B (its own cache)
    lists it, reads a file, edits one file and pushes it alone: B reads and writes only the
    nodes on that file's path. A reads B's edit, gc keeps every part of the live folder and
    keeps the history's, check finds nothing wrong, and the gateway lists the folder
    in key order page by page."""
    n = 1500
    src = tmp_path / "a" / "images"
    _write_files(str(src), n)
    tokens = {TOKEN: {"scope": "write", "repos": ["ds"], "name": "tok"}}
    with ServedStore(tmp_path, tokens=tokens) as srv:
        with Store(srv.url, token=TOKEN, cache=str(tmp_path / "cache-a")) as a:
            a.push([str(src)], "cdc://ds/images/")
        root = str(tmp_path / "srv")
        trees0 = set(_objects(root, "trees"))
        memo.clear()  # machine B: nothing remembered
        with Store(srv.url, token=TOKEN, cache=str(tmp_path / "cache-b")) as b:
            listing = b.ls("cdc://ds/images/")
            assert [e["name"] for e in listing] == [f"images/img{i:05d}.bin" for i in range(n)]
            assert b.cat("cdc://ds/images/img00077.bin") == (src / "img00077.bin").read_bytes()
        memo.clear()
        with Store(srv.url, token=TOKEN, cache=str(tmp_path / "cache-c")) as c:  # a third, cold machine
            edit = tmp_path / "edit.bin"
            edit.write_bytes(b"edited on machine C")
            r0 = c.counters()["requests"]
            c.push([str(edit)], "cdc://ds/images/img00042.bin")
            requests = c.counters()["requests"] - r0
        new_trees = set(_objects(root, "trees")) - trees0
        print("one-file push into the wide folder:", len(new_trees), "trees,", requests, "requests")
        assert 2 <= len(new_trees) <= 6, len(new_trees)  # the root, split nodes on the path, one page
        assert requests <= 30, requests  # a one-file push into a 1,500-file folder stays small
        memo.clear()
        with Store(srv.url, token=TOKEN, cache=str(tmp_path / "cache-a")) as a:
            assert a.cat("cdc://ds/images/img00042.bin") == b"edited on machine C"
            assert len(a.ls("cdc://ds/images/")) == n
        # the S3 gateway lists the wide folder in key order, 400 keys a page
        gw = ServerProcess(root, "--tokens", str(tmp_path / "tokens.json"), "--s3-port", str(free_port()))
        gw_port = int(gw.args[-1])
        gw.start()
        try:
            s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{gw_port}", aws_access_key_id="tok",
                              aws_secret_access_key=TOKEN, region_name="us-east-1")
            pages = s3.get_paginator("list_objects_v2").paginate(
                Bucket="ds", Prefix="main/images/", PaginationConfig={"PageSize": 400})
            keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        finally:
            gw.stop()
        assert keys == [f"main/images/img{i:05d}.bin" for i in range(n)]
    store = LocalStore(root)
    before = set(_objects(root, "trees"))
    gc(store, grace=0)
    after = set(_objects(root, "trees"))
    view = store.view("ds", store.get_commit("ds", store.resolve("ds", "main")))
    live = {os.path.basename(p) for p in after}
    assert set(view.tree_ids()) <= live  # every part of the live folder kept
    head = store.get_commit("ds", store.resolve("ds", "main"))
    old = store.view("ds", store.get_commit("ds", head.parent))
    assert set(old.tree_ids()) <= live and before == after  # history is live: its parts too
    assert old.get("images/img00042.bin") != view.get("images/img00042.bin")
    report = check(store)
    assert not report["problems"], report["problems"]
    assert len(view.files()) == n


def _objects(root, kind):
    for d, _, files in os.walk(os.path.join(root, kind)):
        for f in files:
            yield os.path.join(d, f)


def test_a_server_refuses_a_commit_of_a_forged_part(tmp_path):
    """A writer uploads a split folder whose part lies about its files: the server's commit
    check refuses it (400) and the branch does not move."""
    tokens = {TOKEN: {"scope": "write", "repos": ["ds"], "name": "tok"}}
    with ServedStore(tmp_path, tokens=tokens) as srv:
        with Store(srv.url, token=TOKEN, cache=False) as s:
            src = tmp_path / "one"
            src.mkdir()
            (src / "x.bin").write_bytes(b"x" * 100)
            [entry] = s.upload([str(src)], "cdc://ds/").values()
            files = {f"w/f{i:03d}": entry for i in range(100)}
            rid, nodes = treeobj.build(files)
            root_tree = nodes[rid]
            wid = root_tree.entries["w"].tree
            w = nodes[wid]
            d, sl = next(iter(w.slots.items()))
            slots = dict(w.slots)
            slots[d] = treeobj.Slot(sl.tree, sl.entries, sl.files, sl.size + 1)  # a lie about bytes
            forged = treeobj.Tree({}, slots, "")
            top = treeobj.Tree({"w": treeobj.Folder(forged.id, forged.size, forged.file_count)})
            nodes.update({forged.id: forged, top.id: top})
            s.backend.put_trees(nodes)
            from cdcstore.core.commit import Commit
            c = Commit("ds", None, "forged part", time.time(), None, top.id)
            with pytest.raises(Exception, match="400|holds|says"):
                s.backend.commit(c, "main", None)
            assert not s.backend.has_repo("ds") or s.backend.resolve("ds", "main") != c.id


def test_a_wide_folder_is_listed_level_by_level():
    """Listing a split folder reads each level's parts in one `load_many` call (a remote
    store's reads go out together), and gets what the one-by-one reads give."""
    files = _wide(5_000, "w")
    rid, nodes = treeobj.build(files)
    one = treeobj.View(Counted(nodes), rid)
    batches = []
    load = Counted(nodes)

    def load_many(tids):
        batches.append(len(tids))
        return [load(t) for t in tids]

    many = treeobj.View(load, rid, load_many=load_many)
    assert many.listing("w") == one.listing("w") and len(many.listing("w")) == 5_000
    parts = sum(1 for t in nodes.values() if not t.split) - 1  # the pages of w (not the root page)
    assert len(batches) <= 5 and sum(batches) >= parts  # a few levels, not one call per page
    assert max(batches) >= 8


def test_a_wide_page_written_before_splits_is_read_and_split_by_its_next_commit(monkeypatch):
    """A folder of 500 entries stored as one format-2 page (as every cdcstore before tree
    format 3 wrote it) reads as it is; the first commit that changes it writes the canonical
    split folder, the tree a fresh build of the new files gives."""
    files = _wide(500, "old")
    monkeypatch.setattr(treeobj, "LEAF_MAX", 10 ** 9)
    rid, nodes = treeobj.build(files)
    monkeypatch.undo()
    assert treeobj.LEAF_MAX == 48 and not any(t.split for t in nodes.values())
    view = treeobj.View(Counted(nodes), rid)
    assert view.get("old/f000499.bin") == files["old/f000499.bin"] and len(view.listing("old")) == 500
    new = dict(files)
    new["old/f000007.bin"] = FileEntry(_m(77), 77)
    root, written = treeobj.apply(view, {"old/f000007.bin": new["old/f000007.bin"]})
    assert root == treeobj.View.of_files(new).root
    assert treeobj.changes(view, treeobj.View(Counted({**nodes, **written}), root)) == (
        {"old/f000007.bin": new["old/f000007.bin"]}, set())


def test_a_cold_listing_of_a_wide_folder_through_a_server_asks_for_a_level_at_a_time(tmp_path):
    """A new machine lists a folder of 3,000 files through a server: each level of its split
    reaches the server as one POST .../trees/get, not one GET a page; the answer is the same as
    one by one (a server before protocol 2.1), and another repo's token gets none of its trees."""
    import urllib.error
    import urllib.request
    n = 3000
    src = tmp_path / "images"
    _write_files(str(src), n)
    other = "other-token-" + "o" * 20
    tokens = {TOKEN: {"scope": "write", "repos": ["ds"], "name": "tok"},
              other: {"scope": "write", "repos": ["elsewhere"], "name": "other"}}
    with ServedStore(tmp_path, tokens=tokens) as srv:
        with Store(srv.url, token=TOKEN, cache=False) as a:
            a.push([str(src)], "cdc://ds/images/")
        counts = {}
        for batched in (True, False):
            memo.clear()
            with Store(srv.url, token=TOKEN, cache=str(tmp_path / f"cache-{batched}")) as b:
                b.backend.uncached().batch_trees = batched
                r0 = b.counters()["requests"]
                names = [e["name"] for e in b.ls("cdc://ds/images/")]
                counts[batched] = b.counters()["requests"] - r0
            assert names == [f"images/img{i:05d}.bin" for i in range(n)]
        store = LocalStore(str(tmp_path / "srv"))
        view = store.view("ds", store.get_commit("ds", store.resolve("ds", "main")))
        parts = sum(1 for _ in view.tree_ids())
        assert counts[False] >= parts  # one GET a tree
        assert counts[True] <= 12, counts  # resolve, commit, the root, the folder, a POST a level
        print("cold ls of 3,000 files:", counts[True], "requests batched,", counts[False], "one by one;", parts, "trees")

        def post(token, body):
            req = urllib.request.Request(f"{srv.url}/v1/repos/ds/trees/get", data=body, method="POST",
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        some = json.dumps({"names": list(view.tree_ids())[:20]}).encode()
        status, body = post(TOKEN, some)
        from cdcstore.core import wire
        assert status == 200 and all(wire.decode_blobs(body))
        assert post(other, some)[0] == 403  # a token of another repo: refused before any tree is read
        assert post(TOKEN, json.dumps({"names": ["ab" * 32] * 2000}).encode())[0] == 400  # too many
        assert post(TOKEN, b"{not json")[0] == 400
        status, body = post(TOKEN, json.dumps({"names": ["ab" * 32]}).encode())
        assert status == 200 and wire.decode_blobs(body) == [b""]  # not reached: empty, asked alone after


@pytest.mark.parametrize("content_ids", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_same_files_matches_a_flat_comparison_and_reads_only_changed_paths(seed, content_ids, monkeypatch):
    """`same_files` (a push from a new machine) against a flat reference, on random edits of a
    wide folder and small ones, with trees written with content ids (format 4/5) and without
    (format 2/3, a store from before them: everything is read, and the answer is the same).
    Bundle hints differ between the store's entries and the machine's: they are not content."""
    rng = random.Random(seed)
    old = {**_wide(400, "wide"), **{f"d{d}/f{i}.bin": FileEntry(_m(d * 100 + i), i) for d in range(12)
                                    for i in range(rng.randrange(1, 30))}}
    stored = {p: FileEntry(e.manifest, e.size, "cd" * 32) for p, e in old.items()}
    if not content_ids:
        monkeypatch.setattr(treeobj.Tree, "content", property(lambda self: None))
    view, load = _stored_view(stored)
    monkeypatch.undo()
    new = _random_change(rng, old, "wide")
    mine = treeobj.View.of_files(new)
    for under in (None, "", "wide", "d3"):
        load.read.clear()
        same, extra = treeobj.same_files(view, mine, under)
        assert same == {p for p, e in new.items() if p in old and (old[p].manifest, old[p].size) == (e.manifest, e.size)}
        want = set() if under is None else {p for p in old if p not in new and (not under or p.startswith(under + "/"))}
        assert extra == want, (under, extra ^ want)
    load.read.clear()
    view = treeobj.View(load, view.root)  # a new machine: nothing read yet
    one = {**old, "wide/f000123.bin": FileEntry(_m(10 ** 9), 5)}  # a one-file edit in the wide folder
    same, _ = treeobj.same_files(view, treeobj.View.of_files(one))
    assert same == set(old) - {"wide/f000123.bin"}
    if content_ids:  # a content descent: the root, the wide folder's split nodes on the name's path, a page
        assert len(load.read) <= 5, len(load.read)
    else:  # no content ids: every node is read
        assert len(load.read) == len(load.nodes)

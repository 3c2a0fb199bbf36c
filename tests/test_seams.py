"""Public seams: modules reach one another through public names only.

- Only remote/server/app.py uses private members of the server (`server._x`, `self.server._x`, `srv._x`).
"""
import ast

from test_layers import modules

SERVER_NAMES = {"server", "srv"}


def _is_server(node) -> bool:
    """`server`, `srv`, or `<anything>.server` (e.g. `self.server`)."""
    if isinstance(node, ast.Name):
        return node.id in SERVER_NAMES
    return isinstance(node, ast.Attribute) and node.attr in SERVER_NAMES


def private_server_uses():
    found = []
    for mod, path in modules():
        if mod == "remote.server.app":
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and _is_server(node.value):
                found.append(f"{mod}:{node.lineno} uses server.{node.attr}")
    return found


def test_no_private_server_names_outside_server_py():
    found = private_server_uses()
    assert found == [], "give the Server a public method instead:\n" + "\n".join(found)


def test_the_seam_check_sees_a_private_use():
    tree = ast.parse("self.server._io(f)\nsrv._send(r)\nserver._json(r)\nself.server.io(f)\n")
    hits = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
            and _is_server(n.value)]
    assert sorted(hits) == ["_io", "_json", "_send"]


def test_the_repository_is_what_upkeep_asks_for():
    """gc and check know the repository by `maintenance.UpkeepHost` (not by import): it must
    keep every member the protocol names."""
    from cdcstore.storage.maintenance import UpkeepHost
    from cdcstore.storage.repository import Repository

    methods = {n for n, v in vars(UpkeepHost).items() if callable(v) and not n.startswith("__")}
    roles = {n for n, v in vars(UpkeepHost).items() if isinstance(v, property)}
    assert len(methods) >= 10 and set(UpkeepHost.__annotations__) >= {"objects", "location"}
    assert roles >= {"index", "packs", "metadata", "ref_store"}  # what else it needs, it asks of a role
    missing = sorted(n for n in methods | roles | set(UpkeepHost.__annotations__) if not hasattr(Repository, n)
                     and n not in ("objects", "location", "packs", "metadata", "ref_store"))
    assert missing == []
    repo_attrs = {"objects", "location", "packs", "metadata", "ref_store"}  # set in Repository.__init__
    assert repo_attrs <= set(Repository.__init__.__code__.co_names)


def private_uses(names: set[str], exempt: set[str]) -> list[str]:
    """`x._attr` where `x` is a name in `names` (or `<anything>.x`), outside the modules `exempt`."""
    found = []
    for mod, path in modules():
        if mod in exempt:
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                v = node.value
                if (isinstance(v, ast.Name) and v.id in names) or (isinstance(v, ast.Attribute) and v.attr in names):
                    found.append(f"{mod}:{node.lineno} uses .{node.attr}")
    return found


def test_sources_use_the_dataset_through_its_public_surface():
    """A source (streaming/sources.py, streaming/decoded.py, a plug-in) asks the dataset only what `SourceContext`
    names: settings, `counts`, `yielded`, `in_worker`; no private field of StreamingDataset."""
    found = private_uses({"ds", "_ds", "dataset"}, {"streaming.dataset"})
    assert found == [], "use sources.SourceContext's members:\n" + "\n".join(found)


def test_the_dataset_is_a_source_context():
    from cdcstore.streaming.sources import SourceContext
    from cdcstore.streaming.dataset import StreamingDataset

    members = {n for n, v in vars(SourceContext).items() if not n.startswith("_") and (callable(v) or
                                                                                         isinstance(v, property))}
    assert members == {"counts", "yielded", "in_worker", "store"}
    assert all(hasattr(StreamingDataset, n) for n in members)


def test_faces_reach_the_store_through_store_not_its_backend():
    """fs, cli, stream, sources and the other faces use `Store`'s own methods (`identity`, `cache`,
    `reader`, ...), never `store.backend`; nor do they import a private name of `api`. The
    conformance suite (testing/) is the exception: it checks a backend itself."""
    from test_layers import FACE, layer

    found = []
    for mod, path in modules():
        if layer(mod)[1] != FACE or mod == "api" or mod.startswith("testing."):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Attribute) and node.attr == "backend":
                found.append(f"{mod}:{node.lineno} uses .backend")
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("api"):
                found += [f"{mod}:{node.lineno} imports api.{a.name}" for a in node.names if a.name.startswith("_")]
    assert found == [], "give Store a public method instead:\n" + "\n".join(found)

"""The folders are the layers: each module imports only from its own layer and those below.

core (pure formats, no I/O) < runtime (pools, loop, fork) < storage < remote, engine < the faces
(api, fs, cli, stream, ...).
The faces other than `api` reach the store only through `api` (and the formats in core); any
module may use the runtime. Only the runtime asks which process it is in.
"""
import ast
import os

import cdcstore

ROOT = os.path.dirname(cdcstore.__file__)
RANK = {"core": 0, "runtime": 0.5, "settings": 0.5, "storage": 1, "remote": 2, "engine": 2}
BASE = ("runtime", "settings")  # modules every layer above core may use
FACE = 3
# a face may import api, other faces and core; these are the named exceptions, each with its reason
FACE_EXCEPTIONS = {
    ("cli", "remote.serve"),  # `cdcstore serve` starts the server in this process
    ("cli", "remote.server"),  # `cdcstore token` edits a server's tokens file
    ("testing.backend", "storage.backend"),  # the backend conformance suite checks the role's own types
}
# imports that stdlib-only purity forbids in core (I/O and concurrency live above it)
CORE_FORBIDDEN = {"sqlite3", "aiohttp", "socket", "concurrent", "asyncio", "fcntl", "sqlite_utils"}


def modules():
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].replace(os.sep, ".")
                yield rel, os.path.join(folder, f)


def layer(mod: str) -> tuple[str, float]:
    head = mod.split(".")[0]
    return (head, RANK[head]) if head in RANK else (mod, FACE)


def imports(mod: str, path: str):
    """(target module relative to cdcstore, or None for outside imports, absolute name)."""
    tree = ast.parse(open(path).read())
    pkg = mod.split(".")[:-1] if not mod.endswith("__init__") else mod.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                for a in node.names:  # `from ..core import ids` imports the module core.ids
                    sub = os.path.join(ROOT, *[p for p in target.split(".") if p], a.name + ".py")
                    n = f"{target}.{a.name}".lstrip(".") if os.path.exists(sub) else target
                    yield n, n
            else:
                yield None, node.module or ""
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield None, a.name


def test_imports_only_go_down():
    wrong = []
    for mod, path in modules():
        name, rank = layer(mod)
        for target, absolute in imports(mod, path):
            if target is None:
                if rank == 0 and absolute.split(".")[0] in CORE_FORBIDDEN:
                    wrong.append(f"{mod} imports {absolute} (core is pure)")
                continue
            t = target.split(".")
            if t[0] in RANK and (len(t) > 1 or t[0] in BASE):
                t_name, t_rank = t[0], RANK[t[0]]
                target_mod = ".".join(t[:2])
            else:
                t_name, t_rank, target_mod = t[0], FACE, t[0]
            if target_mod == "" or t_name == name:
                continue
            if rank < FACE and t_rank >= rank and t_name != name:
                wrong.append(f"{mod} imports {target_mod} (same or higher layer)")
            if rank == FACE and mod not in ("api", "__init__") and 0 < t_rank < FACE and t_name not in BASE \
                    and (mod, target_mod) not in FACE_EXCEPTIONS:
                wrong.append(f"face {mod} imports {target_mod} (faces use api and core)")
    assert wrong == [], "\n".join(wrong)


def test_every_module_sits_in_a_layer_or_is_a_face():
    faces = {m for m, _ in modules() if layer(m)[1] == FACE}
    assert faces <= {"__init__", "__main__", "api", "fs", "cli", "stream", "demo", "parquet",
                     "writers", "testing.__init__", "testing.backend", "testing.objects", "testing.process",
                     "testing.served", "testing.faults", "spark", "mount", "gopen",
                     "publish",  # publish: the write path the S3 gateway's writes are handed (cli -> serve)
                     *(f"streaming.{m}" for m in ("__init__", "dataset", "sources", "decoded", "order", "shards",
                                                  "decoders", "handover"))}, faces


def test_no_module_starts_its_own_pool_or_loop():
    """Pools (the server's blocking work too: no asyncio default executor), the event loop thread
    and fork handling belong to runtime.py alone."""
    starters = ("ThreadPoolExecutor(", "new_event_loop(", "register_at_fork(", "run_in_executor(None")
    found = [f"{mod}: {s}" for mod, path in modules() if mod != "runtime"
             for s in starters if s in open(path).read()]
    assert found == [], found


def test_threads_start_in_the_runtime():
    """A thread of its own starts through `runtime.thread` (or `runtime.every`): no module but
    runtime.py calls `threading.Thread(...)` or `threading.Timer(...)`, however imported."""
    found = []
    for mod, path in modules():
        if mod == "runtime":
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name in ("Thread", "Timer"):
                    found.append(f"{mod}:{node.lineno} starts a {name}")
    assert found == [], "use runtime.thread:\n" + "\n".join(found)


def _compares_pid(node) -> bool:
    """A comparison with `os.getpid()` on either side (or inside a tuple or call there)."""
    if not isinstance(node, ast.Compare):
        return False
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "getpid"
               for side in [node.left, *node.comparators] for n in ast.walk(side))


def test_only_the_runtime_asks_which_process_it_is_in():
    """Fork handling lives in runtime.py (`Local`, `Lock`, `per_process`, the pools and the loop):
    a module that keeps its own pid to notice a fork is one more place where a forked child can
    inherit a parent's thread, lock or socket. Naming files by pid is fine; comparing pids is not.
    Pids kept in a field are caught by name (`_pid`, `*_pid`)."""
    wrong = []
    for mod, path in modules():
        if mod == "runtime":
            continue
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if _compares_pid(node):
                wrong.append(f"{mod}:{node.lineno} compares os.getpid()")
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    (node.attr == "_pid" or node.attr.endswith("_pid")):
                wrong.append(f"{mod}:{node.lineno} keeps a pid in .{node.attr}")
    assert wrong == [], "use runtime.Local / runtime.Lock instead:\n" + "\n".join(wrong)


def internal_imports(mod: str, path: str, typing_only: bool = True) -> set[str]:
    """The cdcstore modules `mod` imports anywhere in it (top level or inside a function),
    relative or absolute (`cdcstore.x`); a package as `pkg.__init__`. Without `typing_only`,
    imports under `if TYPE_CHECKING:` (for annotations; never run) are left out."""
    known = {m for m, _ in modules()}
    tree = ast.parse(open(path).read())
    skipped = set()
    if not typing_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test).split(".")[-1] == "TYPE_CHECKING":
                skipped |= {id(n) for b in node.body for n in ast.walk(b)}

    def resolve(name: str) -> str | None:
        return next((c for c in (name, f"{name}.__init__".lstrip(".")) if c in known), None)

    pkg = mod.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(pkg[: len(pkg) - (node.level - 1)] + ([node.module] if node.module else []))
            elif node.module == "cdcstore" or (node.module or "").startswith("cdcstore."):
                base = node.module[len("cdcstore."):]
            else:
                continue
            for a in node.names:  # `from ..core import ids` imports the module core.ids
                out.add(resolve(f"{base}.{a.name}".lstrip(".")) or resolve(base))
        elif isinstance(node, ast.Import):
            out |= {resolve(a.name[len("cdcstore."):]) for a in node.names if a.name.startswith("cdcstore.")}
    return out - {None, mod}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm), sorted."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def test_no_circles_of_imports():
    """No modules import one another in a loop, counting imports inside functions (a lazy import
    hides a circle; it does not break it): a shared piece goes down into a module both import.
    Imports for annotations only (`if TYPE_CHECKING:`) are not counted: they never run."""
    graph = {mod: internal_imports(mod, path, typing_only=False) for mod, path in modules()}
    circles = import_circles(graph)
    assert circles == [], "circles of imports:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_sees_a_lazy_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_only_the_settings_module_reads_the_environment():
    """Every environment variable is named and documented once (cdcstore/settings.py); the
    README's settings table lists each of them."""
    readers = []
    for mod, path in modules():
        if mod == "settings" or mod.startswith("testing"):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os":
                readers.append(f"{mod}:{node.lineno}")
    assert readers == [], "read the environment through cdcstore.settings: " + ", ".join(readers)
    from cdcstore import settings
    readme = open(os.path.join(os.path.dirname(ROOT), "README.md")).read()
    missing = [s.name for s in settings.ALL if f"`{s.name}`" not in readme]
    assert missing == [], f"the README's settings table lacks {missing}"


# A role is what a third party implements to plug a store in (storage/roles.py): past this many
# methods it is two roles, and an implementer writes code it never needed. 12 leaves the largest,
# RefStore (11: the ref verbs a server route or a CLI command names one by one), one to grow.
MAX_ROLE_METHODS = 12


def test_roles_stay_small():
    """Each Protocol of storage/roles.py declares at most `MAX_ROLE_METHODS` methods."""
    import typing

    from cdcstore.storage import roles
    sizes = {}
    for name, cls in vars(roles).items():
        if isinstance(cls, type) and getattr(cls, "_is_protocol", False) and cls.__module__ == roles.__name__:
            sizes[name] = len([n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")])
    assert set(sizes) >= {"ChunkSource", "ChunkSink", "MetadataStore", "RefStore", "Upkeep"}, sizes
    big = {n: c for n, c in sizes.items() if c > MAX_ROLE_METHODS}
    assert big == {}, f"roles past {MAX_ROLE_METHODS} methods (split them): {big}"
    assert typing.Protocol  # (the roles are typing.Protocols: implemented by shape)


def test_no_forwarding_generated_at_run_time():
    """Every method a store, an overlay or a cache answers is written out where grep and a type
    checker find it: no class decorator that adds methods from strings, no `locals().update` in a
    class body, no `__getattr__` forwarding on a class (a module's lazy `__getattr__` is allowed)."""
    found = []
    for mod, path in modules():
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__getattr__":
                        found.append(f"{mod}.{node.name}.__getattr__")
                    if isinstance(item, ast.Expr) and "locals()" in ast.unparse(item):
                        found.append(f"{mod}.{node.name}: {ast.unparse(item)[:60]}")
                for d in node.decorator_list:
                    target = d.func if isinstance(d, ast.Call) else d
                    if ast.unparse(target).split(".")[-1] == "delegate":
                        found.append(f"{mod}.{node.name}: @{ast.unparse(target)}")
    assert found == [], "forwarding generated at run time:\n" + "\n".join(found)


# the rooms of the remote floor, lowest first: a room imports only the rooms before it (remote/__init__.py)
ROOMS = ["remote.client", "remote.server", "remote.gateway", "remote.web", "remote.serve"]


def room(mod: str) -> int | None:
    return next((i for i, r in enumerate(ROOMS) if mod == r or mod.startswith(r + ".")), None)


def test_rooms_of_the_remote_floor_import_only_rooms_before_them():
    """client/ < server/ < gateway/ < web/ < serve.py, and the client imports no other room and no
    server library: a process that only reads a server loads no server code."""
    wrong = []
    for mod, path in modules():
        mine = room(mod)
        if mine is None:
            continue
        for target in internal_imports(mod, path):
            theirs = room(target)
            if theirs is not None and theirs > mine:
                wrong.append(f"{mod} imports {target} (a later room)")
            if mine == 0 and theirs not in (None, 0):
                wrong.append(f"{mod} imports {target} (the client imports no other room)")
        if mine == 0:
            wrong += [f"{mod} imports {a}" for t, a in imports(mod, path) if t is None and a.startswith("aiohttp.web")]
    assert wrong == [], "\n".join(wrong)
    assert {room(m) for m, _ in modules() if m.startswith("remote.") and not m.endswith("__init__")} == \
        set(range(len(ROOMS))), "every module of remote/ sits in a room"


def test_the_public_stream_module_names_the_streaming_room():
    """`cdcstore.stream` stays the public import path of the loader that lives in streaming/."""
    import cdcstore.stream as public
    from cdcstore.streaming import dataset, sources
    assert public.StreamingDataset is dataset.StreamingDataset and public.Loader is dataset.Loader
    assert public.interleave is dataset.interleave and public.SampleSource is sources.SampleSource
    assert callable(public.__getattr__) and public.__getattr__ is dataset.__getattr__  # TorchStreamingDataset, lazily

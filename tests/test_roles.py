"""The roles a store plays (storage/roles.py) are what the code above storage relies on.

- No module of api, engine/, remote/ or the faces asks a store what it is: no isinstance or
  issubclass against a store class, no hasattr or getattr on a store, backend, source or
  repository (the way test_layers greps imports). What differs is declared in `capabilities`.
- The roles are protocols a third party implements: an in-memory chunk source feeds the reader.
- The capabilities are what the API branches on.
"""
import ast
import dataclasses
import os
import re
import typing

import pytest

import cdcstore
from cdcstore.api import Store
from cdcstore.core.errors import InvalidAddressError
from cdcstore.core.pack import CODEC_RAW, PackEntry
from cdcstore.engine.ingest import Ingest, PackSink
from cdcstore.storage.reader import FileReader
from cdcstore.storage.backend import Backend
from cdcstore.storage.repository import LocalStore
from cdcstore.storage.roles import BackendCapabilities, ChunkSink, ChunkSource, MetadataStore, RefStore, Upkeep

ROOT = os.path.dirname(cdcstore.__file__)
# the layers below the rule: they implement the roles (a cache wraps a store, a check reads a repository);
# and the conformance suites (cdcstore/testing), which look inside the built-in stores to test them
BELOW = ("core", "storage", "runtime", "testing")
# a class that is a store, a backend, a chunk source or sink, or what one is made of
STORE_CLASS = re.compile(r"(Store|Backend|Repository|Objects|Seed|Source|Sink|Index|Cache)$")
# a value that holds one: the names the code gives them
STORE_WORDS = {"store", "backend", "inner", "source", "src", "repo", "repository", "remote", "seed", "be",
               "objects", "index", "cache", "target", "wrapped"}


def scoped_files(root: str):
    """The modules of api, engine/, remote/ and the faces under `root` (a cdcstore package), and
    the read core (storage/reader.py: it reads every store through the role alone)."""
    for folder, _, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel.split(os.sep)[0] in BELOW:
            if rel == "storage" and "reader.py" in files:
                yield os.path.join(folder, "reader.py")
            continue
        for f in sorted(files):
            if f.endswith(".py") and not (rel == "." and f in ("runtime.py", "__init__.py", "__main__.py")):
                yield os.path.join(folder, f)


def _names(node) -> list[str]:
    """The identifiers an expression is built from (`self.backend.uncached()`: self, backend, uncached)."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
    return out


def _is_store_word(name: str) -> bool:
    name = name.lower().lstrip("_")
    return name in STORE_WORDS or any(name.endswith("_" + w) for w in STORE_WORDS)


def probes(source: str) -> list[tuple[int, str]]:
    """(line, text) of each probe of a store in Python `source`: isinstance/issubclass against a
    store class, `type(x) is/== StoreClass`, or hasattr/getattr on a value named as a store."""
    found = []
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            fn = node.func.id
            if fn in ("isinstance", "issubclass") and len(node.args) == 2:
                hit = any(STORE_CLASS.search(n) for n in _names(node.args[1]))
            elif fn in ("hasattr", "getattr"):
                hit = any(_is_store_word(n) for n in _names(node.args[0]))
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and \
                isinstance(node.left.func, ast.Name) and node.left.func.id == "type":
            hit = any(STORE_CLASS.search(n) for c in node.comparators for n in _names(c))
        if hit:
            found.append((node.lineno, lines[node.lineno - 1].strip()))
    return found


def probes_under(root: str) -> list[str]:
    out = []
    for path in scoped_files(root):
        with open(path) as f:
            out += [f"{os.path.relpath(path, root)}:{line}: {text}" for line, text in probes(f.read())]
    return out


def test_no_module_above_storage_probes_a_store():
    found = probes_under(ROOT)
    assert not found, ("a store is asked what it is; declare it in BackendCapabilities or give the role a "
                       "method with a default body (storage/roles.py):\n" + "\n".join(found))


def test_the_rule_sees_the_scope():
    files = {os.path.relpath(p, ROOT) for p in scoped_files(ROOT)}
    for f in ("api.py", "fs.py", "streaming/dataset.py", "cli.py", "writers.py", "parquet.py", "spark.py",
              os.path.join("storage", "reader.py"), os.path.join("engine", "ingest.py"),
              os.path.join("remote", "server", "app.py"), os.path.join("remote", "client", "store.py")):
        assert f in files
    assert not any(f.startswith(("storage", "core")) for f in files if f != os.path.join("storage", "reader.py"))


@pytest.mark.parametrize("line", [  # the probes main had before the roles (api.py, engine/read.py, streaming/dataset.py)
    "if isinstance(inner, Repository): pass",
    "if not isinstance(self.backend, LocalStore): pass",
    "look = getattr(self.backend.uncached(), 'forgotten', None)",
    "located = getattr(self.backend, 'get_manifest_located', None)",
    "ok = hasattr(self._src, 'read_run_into')",
    "where = getattr(store, 'location', store)",
    "local = isinstance(store, Store)",
    "same = type(b) is CachedBackend",
])
def test_the_rule_catches_a_probe(line):
    assert probes(line)


@pytest.mark.parametrize("line", [  # probes of values that are not stores
    "if isinstance(sources, str): pass",
    "code = getattr(e, 'code', '')",
    "ok = isinstance(doc, dict) and isinstance(doc.get('error'), str)",
    "handler = getattr(fs, 'FSSpecHandler', None)",
    "if hasattr(signal, 'SIGHUP'): pass",
])
def test_the_rule_leaves_other_values_alone(line):
    assert not probes(line)


# -- the roles are protocols ---------------------------------------------------------------
def test_backend_is_the_composition_of_the_roles():
    for role in (ChunkSource, ChunkSink, MetadataStore, RefStore, Upkeep):
        assert typing.Protocol in role.__mro__ and getattr(role, "_is_protocol", False), role
        assert role in Backend.__mro__
    # the consumers name the narrowest role they use (a type checker holds them to it)
    assert typing.get_type_hints(FileReader.__init__)["source"] is ChunkSource
    assert typing.get_type_hints(Ingest.__init__)["store"] is ChunkSink
    assert typing.get_type_hints(PackSink.__init__)["store"] is ChunkSink


def manifest_of(store: Store, path: str):
    _, commit = store.resolve("cdc://ds")
    return store.manifest("ds", store.view("ds", commit).get(path).manifest)


class MemorySource(ChunkSource):
    """A third party's chunk source: chunks in a dict; only `locate` and `read_chunk` written."""

    def __init__(self, chunks: dict[bytes, bytes], reads_into: bool):
        self.chunks = chunks
        self.capabilities = BackendCapabilities(local_reads=True, reads_into=reads_into)
        self.asked: list[int] = []

    def locate(self, chunk_ids, repo=None):
        return {c: ("memory", PackEntry(c, 0, len(self.chunks[c]), len(self.chunks[c]), CODEC_RAW))
                for c in chunk_ids if c in self.chunks}

    def read_chunk(self, pack, entry, repo=None):
        self.asked.append(len(self.chunks[entry.chunk_id]))
        return self.chunks[entry.chunk_id]


@pytest.mark.parametrize("reads_into", [False, True])
def test_a_third_party_chunk_source_feeds_the_reader(store, tmp_path, reads_into):
    data = os.urandom(300_000) + bytes(200_000) + os.urandom(100_000)
    (tmp_path / "f.bin").write_bytes(data)
    store.push([str(tmp_path / "f.bin")], "cdc://ds/f.bin")
    m = manifest_of(store, "f.bin")
    held = store.backend.locate(m.chunk_ids)
    chunks = {c: store.backend.read_chunk(p, e) for c, (p, e) in held.items()}
    src = MemorySource(chunks, reads_into)
    with FileReader(src, m, "f.bin", "ds") as f:
        assert f.read() == data
        assert f.pread(250_000, 100_000) == data[250_000:350_000]
    assert sum(src.asked) >= len(data)  # every byte came from the third party's source


# -- the capabilities are what the API branches on ---------------------------------------------
class Recorded(LocalStore):
    """A directory store whose maintenance calls are recorded (its capabilities set per test)."""

    def __init__(self, root, **caps):
        super().__init__(root)
        self.capabilities = dataclasses.replace(self.capabilities, **caps)
        self.calls: list[tuple[str, dict]] = []
        self.read_items = 0

    def admin(self, command, **options):
        self.calls.append((command, options))
        return super().admin(command, **options)

    def read_chunks(self, items, repo=None, stored=None):
        self.read_items += len(items)
        return super().read_chunks(items, repo, stored)


def test_maintenance_runs_where_the_capabilities_say(tmp_path):
    LocalStore.init(str(tmp_path / "s"))
    here = Recorded(str(tmp_path / "s"))
    s = Store.over(here)
    assert s.gc(dry_run=True)["dry_run"] is True
    assert s.check()["problems"] == []
    assert s.recover() == 0
    assert [c for c, _ in here.calls] == ["gc", "check", "recover"]  # through the role, by the capability
    here.close()

    nowhere = Recorded(str(tmp_path / "s"), runs_here=False)  # declares neither runs_here nor remote_admin
    s = Store.over(nowhere)
    with pytest.raises(InvalidAddressError, match="gc works on a store directory, a bucket or a server"):
        s.gc()
    with pytest.raises(InvalidAddressError, match="rebuild-index works on a store directory or a bucket"):
        s.rebuild_index()
    assert nowhere.calls == []
    nowhere.close()


def test_a_pull_seeds_from_the_old_copy_by_capability(tmp_path):
    LocalStore.init(str(tmp_path / "s"))
    v1 = os.urandom(2_000_000)
    src = tmp_path / "f.bin"
    src.write_bytes(v1)
    s = Store.over(Recorded(str(tmp_path / "s")))
    s.push([str(src)], "cdc://ds/f.bin")
    src.write_bytes(v1 + os.urandom(50_000))
    s.push([str(src)], "cdc://ds/f.bin")
    s.close()

    for reads_runs in (True, False):
        out = tmp_path / f"copy-{reads_runs}.bin"
        out.write_bytes(v1)
        be = Recorded(str(tmp_path / "s"), reads_runs=reads_runs)
        Store.over(be).pull("cdc://ds/f.bin", str(out))
        assert out.read_bytes() == src.read_bytes()
        chunks = len(manifest_of(Store.over(be), "f.bin").chunk_ids)
        if reads_runs:  # a directory store: its packs are local files; no seed, every chunk from the store
            assert be.read_items >= chunks
        else:  # the old copy seeds the pull: only the changed tail is read from the store
            assert 0 < be.read_items < chunks
        be.close()


def test_defaults_of_the_roles(tmp_path):
    """A backend that leaves the optional role methods out gets working defaults."""
    LocalStore.init(str(tmp_path / "s"))
    be = LocalStore(str(tmp_path / "s"))
    assert Backend.forgotten(be, "ds") is None
    assert Backend.manifests_present(be, "ds", ["00" * 32]) == set()
    with Backend.push_session(be):
        pass
    with pytest.raises(InvalidAddressError, match="keeps no job journals"):
        Backend.journal(be)
    with pytest.raises(InvalidAddressError, match="gc works on"):
        Backend.admin(be, "gc")
    be.close()


def test_a_cache_in_front_passes_upkeep_through(tmp_path):
    """A CachedBackend declares the inner store's runs_here, and does what it declares."""
    from cdcstore.storage.cache import CachedBackend, ChunkCache

    LocalStore.init(str(tmp_path / "s"))
    inner = Recorded(str(tmp_path / "s"))
    cached = CachedBackend(inner, ChunkCache(str(tmp_path / "c.sqlite")))
    assert cached.capabilities.runs_here
    assert cached.admin("recover") == 0 and inner.calls == [("recover", {})]
    assert cached.forgotten("ds") == set()  # the inner store's answer, not the default None
    with cached.push_session():
        assert cached.journal() is not None
    inner.close()


def reaches(source: str) -> list[tuple[int, str]]:
    """(line, text) of each reach into a store's chunk index or objects (`store.index`, `x.store.objects`)."""
    lines = source.splitlines()
    return [(n.lineno, lines[n.lineno - 1].strip()) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Attribute) and n.attr in ("index", "objects")
            and any(_is_store_word(w) for w in _names(n.value))]


def reaches_under(root: str) -> list[str]:
    out = []
    for path in scoped_files(root):
        with open(path) as f:
            out += [f"{os.path.relpath(path, root)}:{line}: {text}" for line, text in reaches(f.read())]
    return out


def test_the_server_asks_its_repository_by_name():
    found = reaches_under(ROOT)
    assert not found, "give Repository a named method for what is needed:\n" + "\n".join(found)
    assert reaches("size = self.store.objects.stat(pack_name(name)).size")
    assert reaches("if self.server.store.index.reach_stale(): pass")
    assert not reaches("i = entries.index(x)")

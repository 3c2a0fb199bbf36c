"""Shard readers read a cdcstore store with no glue a user writes (issue 49, part 2).

webdataset 1.0.2 opens `cdc://` through `cdcstore.gopen`'s handler in its `gopen_schemes`; litdata
0.2.76 reads an optimized dataset through a mounted commit (`cdcstore mount cdc://REPO@COMMIT/`):
its `StreamingDataset` takes no `cdc://` URL and memory-maps chunk files, which a branch mount's
direct I/O refuses (docs/formats.md, "Reading shards from cdc://"). Real writers only: webdataset's
`TarWriter` with its defaults (the current time in every header), litdata's own `BinaryWriter`
(what `litdata.optimize` writes with). Every sample is compared exactly, keys and bytes."""
import importlib
import os
import random
import shutil
import sys

import fsspec
import pytest
import webdataset as wds
from webdataset.gopen import gopen_schemes

import cdcstore
import cdcstore.gopen
from cdcstore import Store

SHARDS, PER_SHARD = 4, 5


def make_samples(seed=0):
    """PER_SHARD samples for each of SHARDS shards: text, a label and a random blob of 20-150 KB
    (so members span chunk boundaries), keyed as webdataset keys them."""
    rng = random.Random(seed)
    shards = []
    for k in range(SHARDS):
        shards.append([{"__key__": f"s{k}/{i:04d}", "txt": f"caption {k} {i}".encode(),
                        "cls": str(rng.randrange(10)).encode(), "bin": rng.randbytes(rng.randrange(20_000, 150_000))}
                       for i in range(PER_SHARD)])
    return shards


def write_shards(folder, shards):
    folder.mkdir(parents=True, exist_ok=True)
    for k, samples in enumerate(shards):
        with wds.TarWriter(str(folder / f"shard-{k:06d}.tar")) as sink:  # webdataset's defaults
            for s in samples:
                sink.write(s)


def plain(got):
    """A sample as webdataset yields it, less the `__url__` it adds: the dict that was written."""
    return {k: v for k, v in got.items() if k != "__url__"}


@pytest.fixture
def lake(tmp_path, monkeypatch):
    """The shards written by TarWriter and pushed to a local store as cdc://lake/wds/; the store is
    the process's by `$CDCSTORE_STORE`, as a training job's would be."""
    shards = make_samples()
    write_shards(tmp_path / "wds", shards)
    location = str(tmp_path / "store")
    with Store.init(location) as s:
        s.push([str(tmp_path / "wds")], "cdc://lake/wds/", message="shards")
    monkeypatch.setenv("CDCSTORE_STORE", location)
    return shards


# -- webdataset ----------------------------------------------------------------------------------
def test_importing_cdcstore_gopen_registers_the_cdc_scheme():
    assert gopen_schemes["cdc"] is cdcstore.gopen.open_shard
    assert cdcstore.gopen.registered()


def test_webdataset_reads_one_cdc_shard_exactly(lake):
    url = "cdc://lake@main/wds/shard-000002.tar"
    got = list(wds.WebDataset(url, shardshuffle=False))
    assert [plain(s) for s in got] == lake[2]
    assert {s["__url__"] for s in got} == {url}


def test_webdataset_reads_a_brace_expanded_cdc_url_exactly_in_order(lake):
    got = list(wds.WebDataset("cdc://lake@main/wds/shard-{000000..000003}.tar", shardshuffle=False))
    assert [plain(s) for s in got] == [s for shard in lake for s in shard]
    assert [s["__url__"] for s in got][::PER_SHARD] == [f"cdc://lake@main/wds/shard-{k:06d}.tar"
                                                          for k in range(SHARDS)]


def test_webdataset_reads_a_commit_and_a_listed_folder(lake):
    """A commit id pins the snapshot; a folder is listed through fsspec (webdataset takes a list)."""
    commit = Store(os.environ["CDCSTORE_STORE"]).resolve_ref("lake", "main")[0]
    urls = fsspec.filesystem("cdc", store=os.environ["CDCSTORE_STORE"]).glob(f"cdc://lake@{commit[:12]}/wds/*.tar")
    assert len(urls) == SHARDS
    got = list(wds.WebDataset(sorted(urls), shardshuffle=False))
    assert [plain(s) for s in got] == [s for shard in lake for s in shard]


def test_a_missing_shard_is_a_clear_error(lake):
    with pytest.raises(FileNotFoundError) as e:  # a brace range one too long
        list(wds.WebDataset("cdc://lake@main/wds/shard-{000000..000004}.tar", shardshuffle=False))
    said = str(e.value)
    assert "cdc://lake@main/wds/shard-000004.tar" in said
    assert "cdc://lake@main/wds/ holds 4 entries (shard-000000.tar ... shard-000003.tar)" in said
    with pytest.raises(FileNotFoundError, match="the revision has no folder cdc://lake@main/nowhere/"):
        list(wds.WebDataset("cdc://lake@main/nowhere/shard-000000.tar", shardshuffle=False))
    with pytest.raises(cdcstore.RevisionNotFoundError, match="'v9'"):
        list(wds.WebDataset("cdc://lake@v9/wds/shard-000000.tar", shardshuffle=False))


def test_writing_through_gopen_is_refused_naming_what_works(lake, tmp_path):
    with pytest.raises(ValueError, match=r"cdcstore push FOLDER cdc://REPO@BRANCH/PATH/") as e:
        wds.TarWriter("cdc://lake@main/wds/new.tar")
    assert "fsspec.open(url, 'wb')" in str(e.value)
    # ... and the route it names works: TarWriter over a file opened on the store, one commit
    url = "cdc://lake@main/wds/new.tar"
    with fsspec.open(url, "wb") as f, wds.TarWriter(f) as sink:
        for s in lake[0]:
            sink.write(s)
    assert [plain(s) for s in wds.WebDataset(url, shardshuffle=False)] == lake[0]


def test_dataloader_workers_read_every_sample_once(lake):
    import torch.utils.data

    ds = wds.WebDataset("cdc://lake@main/wds/shard-{000000..000003}.tar", shardshuffle=False)
    got = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    want = [s for shard in lake for s in shard]
    assert sorted((plain(s) for s in got), key=lambda s: s["__key__"]) == want


def test_import_cdcstore_after_webdataset_registers_with_no_other_line(monkeypatch):
    """`import webdataset` then `import cdcstore`: the package registers the handler itself (and never
    imports webdataset when it is not imported already: cdcstore/gopen.py says why)."""
    monkeypatch.delitem(gopen_schemes, "cdc")
    monkeypatch.delitem(sys.modules, "cdcstore.gopen")
    monkeypatch.delattr(cdcstore, "gopen")
    assert "cdc" not in gopen_schemes
    importlib.reload(cdcstore)  # runs the package's __init__ again, webdataset imported
    assert gopen_schemes["cdc"] is sys.modules["cdcstore.gopen"].open_shard
    monkeypatch.setitem(gopen_schemes, "cdc", cdcstore.gopen.open_shard)  # undone with the rest


# -- litdata, through a mounted commit ------------------------------------------------------------
def cdcstore_cli(*args):
    """The `cdcstore` command, in this process (`mount --background` starts the mount's own)."""
    from cdcstore.cli import cli

    cli.main(list(args), prog_name="cdcstore", standalone_mode=False)


@pytest.mark.heavy  # starts a mount process
def test_litdata_reads_an_optimized_dataset_through_a_mounted_commit(tmp_path):
    from litdata.streaming.writer import BinaryWriter

    if shutil.which("fusermount3") is None or not os.path.exists("/dev/fuse"):
        pytest.fail("the mount needs fusermount3 and /dev/fuse: `apt-get install -y fuse3` (tests/test_mount.py "
                    "installs it as root)")
    rng = random.Random(1)
    items = [{"index": i, "caption": f"caption {i}", "image": rng.randbytes(rng.randrange(1_000, 30_000))}
             for i in range(60)]
    writer = BinaryWriter(str(tmp_path / "optimized"), chunk_size=10)  # 10 items a chunk file
    for i, item in enumerate(items):
        writer[i] = item
    writer.done()
    writer.merge()
    assert len([n for n in os.listdir(tmp_path / "optimized") if n.endswith(".bin")]) > 3
    location = str(tmp_path / "store")
    with Store.init(location) as s:
        commit = s.push([str(tmp_path / "optimized")], "cdc://lake/ld/", message="optimized").commit
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cdcstore_cli("mount", f"cdc://lake@{commit}/", str(mnt), "--store", location, "--background", "-q")
    try:
        assert read_litdata(str(mnt / "ld"), 37) == (len(items), items, items[37])
    finally:
        # litdata keeps the chunk files mapped after its dataset is gone (an lru_cache on its item
        # loader's method holds the loader), so the mount stays busy while this process lives: detach it
        cdcstore_cli("unmount", "--lazy", str(mnt))
    assert not os.path.ismount(mnt)


def read_litdata(path, i):
    from litdata import StreamingDataset

    ds = StreamingDataset(path)
    return len(ds), list(ds), ds[i]

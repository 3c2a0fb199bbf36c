"""cdcstore.streaming.sources: a kind of file is one `Source`; the built-in kinds (Parquet, TAR) and a third one
plugged in from outside honour one contract: the same positions give the same samples, so shuffle,
ranks, workers and resume mean the same whatever the kind."""
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore.streaming import sources
from cdcstore.core.errors import InvalidAddressError, PathNotFoundError
from cdcstore.streaming.dataset import StreamingDataset
from test_stream_tar import write_shards

COUNTS = [7, 13, 1, 20, 9]  # samples per unit (row group, shard, lines file): uneven
TOTAL = sum(COUNTS)


class LinesSource(sources.SampleSource):
    """A third kind, as a user would plug one in: `.lines` files, one sample per line (key = line)."""

    noun, plural = "a lines file", "lines files"
    fields = ["line"]

    def __init__(self, files, offsets):
        super().__init__(files, [(fi, 0, len(o)) for fi, o in enumerate(offsets) if o])
        self.offsets = offsets

    @classmethod
    def claims(cls, path):
        return path.endswith(".lines")

    @classmethod
    def index(cls, ds, files, decode=None):
        offsets = []
        for f in files:
            with ds.store.open(f.address) as r:
                data = r.pread(0, f.size)
            starts = [0, *(i + 1 for i, b in enumerate(data) if b == 10)]
            offsets.append([(lo, hi - lo - 1) for lo, hi in zip(starts, starts[1:])])
        return cls(files, offsets)

    def read(self, ds, units, rows, readers):
        out = []
        for u, r in zip(units.tolist(), rows.tolist()):
            fi = self.units[u][0]
            if fi not in readers:
                readers[fi] = ds.store.open(self.files[fi].address)
            lo, n = self.offsets[fi][r]
            line = readers[fi].pread(lo, n)
            ds.counts["bytes_read"] += n
            out.append({"__key__": line.decode(), "line": line})
        return out


def write_parquet(folder):
    """The same samples as `write_shards`: one file, a row group per shard, `__key__` per row."""
    folder.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(folder / "all.parquet", pa.schema([("__key__", pa.string())])) as w:
        i = 0
        for n in COUNTS:
            w.write_table(pa.table({"__key__": [f"{k:06d}" for k in range(i, i + n)]}))
            i += n


def write_lines(folder):
    folder.mkdir(parents=True, exist_ok=True)
    i = 0
    for k, n in enumerate(COUNTS):
        (folder / f"part-{k}.lines").write_bytes(b"".join(b"%06d\n" % j for j in range(i, i + n)))
        i += n
    (folder / "README.txt").write_text("not a lines file")


@pytest.fixture
def kinds_store(tmp_path, store):
    write_shards(tmp_path / "tar", COUNTS)
    write_parquet(tmp_path / "pq")
    write_lines(tmp_path / "lines")
    for name in ("tar", "pq", "lines"):
        store.push([str(tmp_path / name)], f"cdc://ds/{name}/", message=name)
    return store


def dataset(store, name, **kw):
    kw = {"batch_size": 3, "shuffle": True, "seed": 11, "shuffle_buffer": 8, "format": "python", **kw}
    if name == "tar":
        kw["decode"] = False
    if name == "lines":
        kw["kinds"] = [LinesSource, *sources.KINDS]
    return StreamingDataset(f"cdc://ds/{name}/", store=store, **kw)


def keys(batches):
    return [k for b in batches for k in b["__key__"]]


def consumers(store, name, world_size, workers, epoch=0, state=None, **kw):
    """The keys each consumer (rank, worker) is dealt, in order."""
    out = []
    for r in range(world_size):
        ds = dataset(store, name, rank=r, world_size=world_size, **kw)
        ds.set_epoch(epoch)
        if state is not None:
            ds.load_state_dict(state | {"commits": ds.commits, "files": [f.address for f in ds.files]})
        out += [keys(ds.iterate(w, workers)) for w in range(workers)]
    return out


KINDS = ["pq", "tar", "lines"]


@pytest.mark.parametrize("world_size,workers", [(1, 1), (2, 2)])
def test_every_kind_deals_the_same_samples_in_the_same_order(kinds_store, world_size, workers):
    for epoch in (0, 1):
        got = {name: consumers(kinds_store, name, world_size, workers, epoch) for name in KINDS}
        assert got["pq"] == got["tar"] == got["lines"], epoch
        flat = [k for c in got["pq"] for k in c]
        assert sorted(set(flat)) == [f"{i:06d}" for i in range(TOTAL)]  # each sample at least once
        assert len(flat) - TOTAL < world_size * workers * 3  # and only the tail repeats
    assert consumers(kinds_store, "pq", 1, 1, 0) != consumers(kinds_store, "pq", 1, 1, 1)  # epochs reshuffle


def test_every_kind_resumes_at_the_same_position(kinds_store):
    whole = {name: consumers(kinds_store, name, 1, 1)[0] for name in KINDS}
    assert whole["pq"] == whole["tar"] == whole["lines"]
    for consumed in (0, 5, 22, TOTAL - 1):
        state = dataset(kinds_store, "pq").state_dict(consumed=consumed)
        rest = {name: consumers(kinds_store, name, 1, 1, state=state)[0] for name in KINDS}
        assert rest["pq"] == rest["tar"] == rest["lines"] == whole["pq"][consumed:], consumed
        split = {name: sorted(k for c in consumers(kinds_store, name, 2, 2, state=state) for k in c)
                 for name in KINDS}
        assert split["pq"] == split["tar"] == split["lines"]
        assert set(split["pq"]) == set(whole["pq"][consumed:])


def test_a_plugged_in_kind_batches_rows_and_pickles(kinds_store):
    ds = dataset(kinds_store, "lines", shuffle=False)
    assert ds.source.units == [(k, 0, n) for k, n in enumerate(COUNTS)]
    first = next(iter(ds))
    assert first == {"__key__": ["000000", "000001", "000002"], "line": [b"000000", b"000001", b"000002"]}
    rows = list(dataset(kinds_store, "lines", shuffle=False, batch_size=None))
    assert [r["__key__"] for r in rows] == [f"{i:06d}" for i in range(TOTAL)]
    arrow = next(iter(dataset(kinds_store, "lines", format="arrow", shuffle=False)))
    assert arrow.column("line").to_pylist() == [b"000000", b"000001", b"000002"]
    again = pickle.loads(pickle.dumps(dataset(kinds_store, "lines")))
    assert sorted(keys(again)) == [r["__key__"] for r in rows]
    assert again.metrics()["bytes_read"] == 6 * TOTAL  # the source counts into the dataset's figures


def test_a_kind_not_passed_is_not_streamed_and_kinds_do_not_mix(kinds_store):
    with pytest.raises(PathNotFoundError, match="no Parquet file or TAR shard there"):
        StreamingDataset("cdc://ds/lines/", store=kinds_store)
    with pytest.raises(InvalidAddressError, match="stream Parquet files and TAR shards as two datasets"):
        StreamingDataset(["cdc://ds/pq/", "cdc://ds/tar/"], store=kinds_store)
    with pytest.raises(InvalidAddressError, match="is a lines file but .* is not: stream .*lines files"):
        StreamingDataset(["cdc://ds/lines/", "cdc://ds/tar/"], store=kinds_store,
                         kinds=[LinesSource, *sources.KINDS])


def test_each_built_in_kind_is_a_source():
    for kind in sources.KINDS:
        assert issubclass(kind, sources.Source)
        for name in ("claims", "index", "produce", "consumer"):
            assert getattr(kind, name) is not getattr(sources.Source, name), (kind, name)
    assert sources.TarSource.claims("a/b.tar") and not sources.TarSource.claims("a/b.parquet")
    assert sources.ParquetSource.claims("a/b.parquet") and not sources.ParquetSource.claims("a/b.tar")
    assert np.array_equal(sources.ParquetSource.shares_decoded, True) and not sources.TarSource.shares_decoded

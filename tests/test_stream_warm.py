"""A stream over a server decodes the row groups its `Warmer` fetched ahead from the bytes the
Warmer read (verified as they arrived), without reading them back from the chunk cache; what it
fetched is in the cache all the same (issue 45)."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cdcstore import Store
from cdcstore.streaming.dataset import StreamingDataset
from cdcstore.streaming.sources import HeldSpans


def test_cold_stream_decodes_what_was_fetched_ahead_without_reading_it_back(server, tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(2):
        pq.write_table(pa.table({"id": np.arange(i * 60_000, (i + 1) * 60_000), "v": rng.random(60_000)}),
                       folder / f"p{i}.parquet", row_group_size=10_000)
    with Store(server.url, cache=False) as up:
        up.push([str(folder)], "cdc://w/", message="v1")
    with Store(server.url, cache=str(tmp_path / "cache")) as s:
        ds = StreamingDataset("cdc://w/", batch_size=1000, store=s)
        ids = np.concatenate([b["id"] for b in ds])
        m = ds.metrics()
        s.backend.cache.wait()
        cached = s.backend.cache.stats()["chunks"]
    assert (ids == np.arange(120_000)).all()
    assert m["warmed"] > 0 and m["row_groups"] == 12, m
    # a row group fetched ahead is decoded from the fetched bytes: no chunk of the data is read back
    # from the cache (before: each was, once: hits about equal to misses); the footers' chunks came
    # with the manifests and are read from the cache (one each at most)
    assert m["cache_hits"] <= 2 < m["cache_misses"] <= cached, (m, cached)


def test_held_spans_serve_their_ranges_and_ask_the_reader_for_the_rest(server, tmp_path):
    data = bytes(range(256)) * 4096  # 1 MiB
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "x.bin").write_bytes(data)
    with Store(server.url, cache=False) as up:
        up.push([str(tmp_path / "f")], "cdc://h/", message="v1")
    with Store(server.url, cache=False) as s, s.open("cdc://h/x.bin", readahead=False) as r:
        fake = b"\x00" * 1000  # not the file's bytes: shows which reads the held span served
        held = HeldSpans(r, [(5000, fake)])
        assert held.pread(5100, 100) == fake[100:200]
        assert held.pread(5900, 200) == data[5900:6100]  # past the held span: from the reader
        assert held.seek(0, 2) == len(data) and held.seek(5000) == 5000
        assert bytes(held.read_buffer(10)) == fake[:10] and held.tell() == 5010
        assert held.read(-1) == data[5010:]

"""cdcstore.streaming.dataset over WebDataset-style TAR shards: grouping, exactly once, resume, hostile shards."""
import functools
import io
import pickle
import random
import tarfile

import numpy as np
import pyarrow as pa
import pytest

from cdcstore import Store
from cdcstore.streaming import shards
from cdcstore.core.errors import InvalidAddressError
from cdcstore.streaming.dataset import StreamingDataset
from test_stream import PAIRS, _round_robin, without_tail_repeats, write_files

# members as bytes: these tests pin order, resume and bytes; decoding has its own tests below
Raw = functools.partial(StreamingDataset, decode=False)

SHARDS = [7, 13, 1, 20, 9]  # samples per shard: uneven
TOTAL = sum(SHARDS)
BATCH, WINDOW = 4, 11


def tar_bytes(members):
    """A plain tar of (name, bytes) members, in order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def sample(i):
    s = {"__key__": f"{i:06d}", "txt": f"text {i}".encode(), "json": b'{"i": %d}' % i}
    if i % 3 == 0:
        s["cls"] = str(i % 7).encode()
    return s


def write_shards(folder, counts=SHARDS):
    folder.mkdir(parents=True, exist_ok=True)
    i = 0
    for k, n in enumerate(counts):
        members = []
        for _ in range(n):
            s = sample(i)
            members += [(f"{s['__key__']}.{ext}", v) for ext, v in s.items() if ext != "__key__"]
            i += 1
        (folder / f"shard-{k:03d}.tar").write_bytes(tar_bytes(members))
    return i


@pytest.fixture
def tar_store(tmp_path, store):
    write_shards(tmp_path / "shards")
    store.push([str(tmp_path / "shards")], "cdc://ds/shards/", message="v1")
    return store


def make(store, **kw):
    kw = {"batch_size": BATCH, "shuffle": True, "seed": 3, "shuffle_buffer": WINDOW, "format": "python", **kw}
    return Raw("cdc://ds/shards/", store=store, **kw)


def keys(batches):
    return [int(k) for b in batches for k in b["__key__"]]


def loader_order(store, world_size, num_workers, epoch=0, state=None, **kw):
    per_rank = []
    for r in range(world_size):
        ds = make(store, rank=r, world_size=world_size, **kw)
        ds.set_epoch(epoch)
        if state:
            ds.load_state_dict(state)
        per_rank.append(_round_robin([list(ds.iterate(w, num_workers)) for w in range(num_workers)]))
    steps = [[rank[t] for rank in per_rank if t < len(rank)] for t in range(max(map(len, per_rank)))]
    return steps


def flat(steps):
    return [k for step in steps for k in keys(step)]


def test_samples_grouped_by_key_in_shard_order(tar_store):
    got = list(Raw("cdc://ds/shards/", store=tar_store))
    assert got == [sample(i) for i in range(TOTAL)]
    ds = Raw("cdc://ds/shards/shard-00[01].tar", store=tar_store, columns=["txt"])
    assert list(ds) == [{"__key__": f"{i:06d}", "txt": f"text {i}".encode()} for i in range(20)]
    assert ds.metrics()["bytes_read"] == sum(len(f"text {i}") for i in range(20))


@pytest.mark.parametrize("world_size,num_workers", PAIRS)
def test_tar_exactly_once_per_epoch_on_any_split(tar_store, world_size, num_workers):
    for epoch in (0, 1):
        got = flat(loader_order(tar_store, world_size, num_workers, epoch=epoch))
        assert sorted(got) == list(range(TOTAL))
        assert got == flat(loader_order(tar_store, 1, 1, epoch=epoch))
    assert flat(loader_order(tar_store, 1, 1)) != list(range(TOTAL)), "shuffled"


def test_tar_kill_and_resume_on_another_split(tar_store):
    rnd = random.Random(2)
    for _ in range(12):
        (r1, w1), (r2, w2) = rnd.sample(PAIRS, 2)
        full = loader_order(tar_store, r1, w1)
        steps = rnd.randrange(len(full) + 1)
        before = flat(full[:steps])
        state = pickle.loads(pickle.dumps(make(tar_store, rank=0, world_size=r1).state_dict(steps=steps)))
        after = flat(loader_order(tar_store, r2, w2, state=state))
        assert without_tail_repeats(before + after, r2) == flat(loader_order(tar_store, 1, 1)), (r1, w1, steps, r2, w2)


def test_tar_formats_skip_take_and_pickling(tar_store):
    order = keys(make(tar_store))
    assert keys(make(tar_store).skip(5).take(17)) == order[5:22]
    batches = list(make(tar_store, format="arrow"))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert batches[0].schema.field("__key__").type == pa.string()
    assert [int(k) for b in batches for k in b.column("__key__").to_pylist()] == order
    rows = {int(r["__key__"]): r for b in batches for r in b.to_pylist()}
    assert rows[3]["cls"] == b"3" and rows[4]["cls"] is None
    copy = pickle.loads(pickle.dumps(make(tar_store)))
    assert copy._store.here() is None and keys(copy) == order


def test_tar_metrics_count_samples_and_bytes(tar_store):
    ds = make(tar_store, batch_size=None)
    got = list(ds)
    m = ds.metrics()
    assert m["samples"] == TOTAL and m["bytes_read"] == sum(len(v) for s in got for k, v in s.items()
                                                            if k != "__key__")


def push_tar(store, tmp_path, data, name="bad.tar"):
    folder = tmp_path / f"in-{name}"
    folder.mkdir()
    (folder / name).write_bytes(data)
    store.push([str(folder / name)], f"cdc://t/{name}", message=name)
    return f"cdc://t/{name}"


def test_hostile_shards_are_one_clear_error(store, tmp_path):
    good = tar_bytes([("a.txt", b"x" * 1000), ("a.json", b"{}"), ("b.txt", b"y" * 3000)])
    cases = {
        "truncated.tar": (good[:1500], "truncated|declares"),
        "cut-header.tar": (good[:512 + 1024 + 100], "truncated inside the header"),
        "checksum.tar": (good[:148] + b"9999999\0" + good[156:], "bad checksum"),
        "garbage.tar": (bytes(range(256)) * 8, "bad checksum"),
        "noext.tar": (tar_bytes([("README", b"hello")]), "no KEY.EXT name"),
        "twice.tar": (tar_bytes([("a.txt", b"1"), ("a.txt", b"2")]), "two 'txt' members"),
    }
    huge = bytearray(good)
    huge[124:136] = b"%011o\0" % (1 << 33)  # 8 GiB declared in a small file
    huge[148:156] = b"        "
    huge[148:156] = b"%06o\0 " % sum(huge[:512])
    cases["huge.tar"] = (bytes(huge), "declares 8589934592 bytes")
    for name, (data, message) in cases.items():
        src = push_tar(store, tmp_path, data, name)
        with pytest.raises(shards.ShardError, match=message):
            Raw(src, store=store)
    gz = push_tar(store, tmp_path, b"\x1f\x8b" + bytes(100), "x.tar.gz")
    with pytest.raises(InvalidAddressError, match="compressed tar: stream plain .tar"):
        Raw(gz, store=store)


def test_split_keys_zero_byte_members_and_folders(store, tmp_path):
    data = tar_bytes([("k1.jpg", b"J1"), ("k2.jpg", b"J2"), ("k1.json", b""), ("dir/k3.seg.png", b"P"),
                      ("k2.json", b"{2}")])
    src = push_tar(store, tmp_path, data, "split.tar")
    got = list(Raw(src, store=store))
    assert got == [{"__key__": "k1", "jpg": b"J1", "json": b""}, {"__key__": "k2", "jpg": b"J2", "json": b"{2}"},
                   {"__key__": "dir/k3", "seg.png": b"P"}]


def test_mixing_parquet_and_tar_is_refused(store, tmp_path):
    write_files(tmp_path / "pq", [[5]])
    write_shards(tmp_path / "tars", [3])
    store.push([str(tmp_path / "pq"), str(tmp_path / "tars")], "cdc://mix/", message="m")
    with pytest.raises(InvalidAddressError, match="stream Parquet files and TAR shards as two datasets"):
        Raw("cdc://mix/", store=store)
    assert len(list(Raw("cdc://mix/tars/", store=store))) == 3


def test_header_scan_reads_a_window_per_header_not_the_file():
    big = tar_bytes([(f"{k}.bin", bytes([k]) * (3 << 20)) for k in range(4)])
    reads = []

    def read(off, n):
        reads.append(n)
        return big[off:off + n]

    members = shards.scan(read, len(big), window=64 << 10)
    assert [(m.name, m.size) for m in members] == [(f"{k}.bin", 3 << 20) for k in range(4)]
    assert sum(reads) <= 5 * (64 << 10) < len(big) // 30
    small = tar_bytes([(f"{k}.txt", b"x" * 100) for k in range(1000)])
    reads.clear()
    assert len(shards.scan(lambda o, n: reads.append(n) or small[o:o + n], len(small), window=64 << 10)) == 1000
    assert len(reads) <= len(small) // (64 << 10) + 2, "small members: a window holds many headers"


def test_tar_over_a_real_server_fetches_only_the_columns_asked(server, tmp_path):
    folder = tmp_path / "big"
    folder.mkdir()
    rnd = random.Random(0)
    members = []
    for i in range(8):
        members += [(f"{i:04d}.jpg", rnd.randbytes(4 << 20)), (f"{i:04d}.cls", b"%d" % i)]
    (folder / "s.tar").write_bytes(tar_bytes(members))
    with Store(server.url, cache=False) as up:
        up.push([str(folder / "s.tar")], "cdc://w/s.tar", message="v1")
    with Store(server.url, cache=str(tmp_path / "cache")) as s:
        ds = Raw("cdc://w/s.tar", store=s, columns=["cls"])
        assert [r["cls"] for r in ds] == [b"%d" % i for i in range(8)]
        got = s.counters()["received_bytes"]
        # 16 headers: a 256 KiB window each plus the chunks it cuts (<= 256 KiB each side), not the 32 MiB
        assert got < 16 * (256 << 10) * 3 < 32 << 20, got


def test_tar_through_a_torch_dataloader_with_two_workers(tar_store):
    ds = make(tar_store)
    got = [int(k) for b in ds.loader(num_workers=2) for k in b["__key__"]]
    assert got == flat(loader_order(tar_store, 1, 1))
    assert ds.metrics()["samples"] == TOTAL


def test_long_names_in_gnu_and_pax_headers(store, tmp_path):
    long_key = "d/" + "k" * 150
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=fmt) as t:
            for name, data in [(long_key + ".txt", b"T"), ("short.txt", b"S"), (long_key + ".cls", b"1")]:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            d = tarfile.TarInfo("d")
            d.type = tarfile.DIRTYPE
            t.addfile(d)
        src = push_tar(store, tmp_path, out.getvalue(), f"long-{fmt}.tar")
        assert list(Raw(src, store=store)) == [{"__key__": long_key, "txt": b"T", "cls": b"1"},
                                                           {"__key__": "short", "txt": b"S"}]


def decoded_store(tmp_path, store):
    from PIL import Image  # in the test extra: fails, never skips, without Pillow

    png = io.BytesIO()
    Image.new("RGB", (3, 2), (200, 10, 30)).save(png, format="PNG")
    npy = io.BytesIO()
    np.save(npy, np.arange(6, dtype=np.int16).reshape(2, 3))
    folder = tmp_path / "dec"
    folder.mkdir()
    (folder / "s.tar").write_bytes(tar_bytes([
        ("a.cls", b" 8\n"), ("a.txt", "d\u00e9j\u00e0".encode()), ("a.json", b'{"k": [1, 2]}'), ("a.npy", npy.getvalue()),
        ("a.seg.png", png.getvalue()), ("a.bin", b"\x00\x01"), ("a.pyd", b"\x80\x04K\x01.")]))
    (folder / "t.tar").write_bytes(tar_bytes([("b.cls", b"nine"), ("b.txt", b"ok")]))
    store.push([str(folder)], "cdc://dec/", message="v1")
    return store


def test_tar_members_decode_by_extension_as_webdataset_does(tmp_path, store):
    decoded_store(tmp_path, store)
    a = next(iter(StreamingDataset("cdc://dec/s.tar", store=store)))
    assert a["cls"] == 8 and a["txt"] == "d\u00e9j\u00e0" and a["json"] == {"k": [1, 2]}
    assert a["npy"].dtype == np.int16 and a["npy"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert a["seg.png"].size == (3, 2) and a["seg.png"].getpixel((0, 0)) == (200, 10, 30)
    assert a["bin"] == b"\x00\x01" and a["pyd"] == b"\x80\x04K\x01."  # unknown stays bytes; never unpickled
    with pytest.raises(ValueError, match=r"sample 'b': its 'cls' member does not decode .*decode=False"):
        list(StreamingDataset("cdc://dec/t.tar", store=store))
    raw = list(StreamingDataset("cdc://dec/", store=store, decode=False))
    assert raw[1]["cls"] == b"nine"
    mine = list(StreamingDataset("cdc://dec/", store=store, decode={"cls": bytes.decode, "png": None}))
    assert mine[1]["cls"] == "nine" and isinstance(mine[0]["seg.png"], bytes)
    batch = next(iter(StreamingDataset("cdc://dec/", store=store, batch_size=2, format="arrow")))
    assert batch.column("cls").to_pylist() == [b" 8\n", b"nine"]  # Arrow batches carry bytes
    with pytest.raises(ValueError, match="format='arrow' carries TAR members as bytes"):
        StreamingDataset("cdc://dec/s.tar", store=store, batch_size=2, format="arrow", decode=True)

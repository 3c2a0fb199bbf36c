"""Issue 32 item 2: a new replica's first read does not grow with the store. A `cdcstore serve` over a
bucket with a fresh cache used to start its listing of every pack (and a GET of every footer it
lacks) at once in the background, so the first read served meanwhile paid it: 33 requests at 2,000
files, 134 at 20,000 (99 pack GETs). moto behind a counting proxy; the replica has a fresh cache."""
import os
import secrets
import time


from cdcstore import Store
from conftest import S3_BUCKET
from server_util import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _store_of(url: str, tmp_path, packs: int) -> None:
    """A store of `packs` packs: one small push each, all into one folder (the trees stay few)."""
    with Store.init(url) as s:
        for i in range(packs):
            f = tmp_path / "src" / f"f{i}.txt"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(f"push {i}\n" * 50)
            s.push([str(f)], "cdc://ds/d/", message=f"v{i}")


def _first_read(url: str, endpoint: str, home, seen) -> tuple[list, float, list]:
    """A new replica (fresh cache) over `url`: the bucket requests and seconds of its first read,
    then the requests it makes once idle (its deferred maintenance)."""
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": ROOT, "XDG_CACHE_HOME": str(home)}
    server = ServerProcess(url, env=env)
    server.log_path = str(home) + ".log"
    server.start()
    try:
        seen.clear()
        t0 = time.perf_counter()
        with Store(server.url, cache=False) as s:
            assert s.cat("cdc://ds/d/f0.txt") == b"push 0\n" * 50
        seconds = time.perf_counter() - t0
        read = list(seen)
        deadline = time.monotonic() + 30
        while not _listings(seen[len(read):]) and time.monotonic() < deadline:
            time.sleep(0.2)
        return read, seconds, seen[len(read):]
    finally:
        server.stop()


def _listings(requests) -> list:
    """Listings of the store's packs (a recovery's first step)."""
    return [(m, p) for m, p in requests if "list-type=2" in p and "%2Fpacks%2F" in p]


def _pack_reads(requests) -> list:
    """Listings of the packs and reads of a pack (a footer or a chunk)."""
    return _listings(requests) + [(m, p) for m, p in requests if "/packs/" in p]


def test_a_new_replicas_first_read_does_not_grow_with_the_packs(counted_bucket, tmp_path):
    endpoint, seen = counted_bucket
    costs = {}
    for n in (10, 50):
        url = f"s3://{S3_BUCKET}/cold-{n}-{secrets.token_hex(4)}"
        _store_of(url, tmp_path / f"s{n}", n)
        read, seconds, after = _first_read(url, endpoint, tmp_path / f"replica-{n}", seen)
        costs[n] = read
        print(f"{n} packs: first read {len(read)} requests ({len(_pack_reads(read))} of packs), {seconds:.2f} s; "
              f"then, idle: {len(after)} ({len(_pack_reads(after))} of packs)")
        assert _listings(after)  # the recovery still runs, once the replica is idle
    assert not _listings(costs[50])  # (was: a listing and 3 footer GETs a pack, 50 packs: 156)
    assert len(_pack_reads(costs[50])) <= 2  # the read's own chunk: a HEAD and a ranged GET
    assert len(costs[50]) <= len(costs[10]) + 2


def _tree_gets(requests) -> int:
    return sum(1 for m, p in requests if m == "GET" and "/trees/" in p)


def test_a_new_replicas_first_read_reads_the_trees_on_its_path_only(counted_bucket, tmp_path):
    """The grant of a file a branch names walks the head's trees until it meets it: for the file
    walked last, every tree of the head (31 tree GETs with 30 folders). Granted trees lend their
    grant to what they name, so the read costs the trees on its path, at any width."""
    endpoint, seen = counted_bucket
    gets = {}
    for n in (5, 30):
        url = f"s3://{S3_BUCKET}/wide-{n}-{secrets.token_hex(4)}"
        src = tmp_path / f"w{n}"
        for i in range(n):
            (src / f"d{i:02d}").mkdir(parents=True)
            (src / f"d{i:02d}" / "f0.txt").write_text(f"folder {i}\n" * 50)
        with Store.init(url) as s:
            s.push([str(src)], "cdc://ds/", message="v1")
        home = tmp_path / f"wide-replica-{n}"
        env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": ROOT, "XDG_CACHE_HOME": str(home)}
        server = ServerProcess(url, env=env)
        server.log_path = str(home) + ".log"
        with server:
            seen.clear()
            with Store(server.url, cache=False) as s:
                for name in ("d00", f"d{n - 1:02d}"):  # the first and the last the walk meets
                    assert s.cat(f"cdc://ds/{name}/f0.txt") == f"folder {int(name[1:])}\n".encode() * 50
            gets[n] = _tree_gets(seen)
        print(f"{n} folders: {gets[n]} tree GETs, {len(seen)} requests")
    assert gets[30] == gets[5] <= 6  # the root and two folders (each read to grant, and to send)

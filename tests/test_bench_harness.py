"""The bench harness (bench/harness.py), its data generator and servers: what every bench script relies on."""
import ast
import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import harness  # noqa: E402
from harness import Goal  # noqa: E402

SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "bench", "*.py")))


def test_goal_works_out_met_from_direction():
    assert Goal("a", 2.5, 2.0, ">=").met is True
    assert Goal("a", 1.5, 2.0, ">=").met is False
    assert Goal("b", 0.1, 0.1, "<=").met is True
    assert Goal("c", 1.0, 1.0, "<").met is False
    assert Goal("d", 0, 0, "==").met is True


def test_goal_without_a_measurement_is_neither_met_nor_missed():
    g = Goal("side_failed", None, 3.0, ">=")
    assert g.met is None
    assert g.to_json() == {"value": None, "goal": ">= 3", "direction": ">=", "target": 3.0, "met": None}
    assert "n/a" in g.line()


def test_goal_refuses_an_unknown_direction():
    with pytest.raises(ValueError, match="direction '=>'"):
        Goal("x", 1.0, 2.0, "=>")


def test_rotation_alternates_two_sides_and_rotates_three():
    assert [s for _, s in harness.rounds(["ours", "peer"], 4)] == ["ours", "peer", "peer", "ours"] * 2
    order = [harness.rotated(["a", "b", "c"], rep) for rep in range(3)]
    assert order == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert all(sorted(o) == ["a", "b", "c"] for o in order)  # every side once per repetition


def test_finish_prints_the_figures_as_the_last_line(capsys):
    harness.finish({"x": 1}, [Goal("g", 1.0, 2.0, "<=")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    doc = json.loads(last)
    assert doc["goal_results"]["g"]["met"] is True and len(doc["loadavg_end"]) == 3


def bench_imports(path: str) -> set[str]:
    tree = ast.parse(open(path).read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add((node.module or "").split(".")[0])
    return out


def test_no_bench_script_imports_tests():
    for path in SCRIPTS:
        text = open(path).read()
        assert not bench_imports(path) & {"tests", "server_util"}, path
        assert "server_util" not in text and '"tests"' not in text, f"{path} loads a file of tests/"


def test_every_bench_script_runs_on_the_harness():
    helpers = {"harness.py", "data.py", "servers.py", "reads.py", "figures.py"}
    for path in SCRIPTS:
        if os.path.basename(path) not in helpers:
            assert "harness" in bench_imports(path), f"{path} does not use bench/harness.py"


def test_generated_tables_are_the_same_bytes_every_time():
    pytest.importorskip("pyarrow")
    import data
    a, b = data.make_table(3, 500), data.make_table(3, 500)
    assert a.equals(b) and not a.equals(data.make_table(4, 500))
    assert data.dedup_table(1, 300).column_names == ["id", "ts", "user_id", "value", "price", "category", "text"]


def test_static_server_serves_and_stops(tmp_path):
    import urllib.request
    import servers
    (tmp_path / "f.bin").write_bytes(b"abc" * 1000)
    srv = servers.StaticServer(str(tmp_path), "f.bin").start()
    try:
        req = urllib.request.Request(f"{srv.url}/f.bin", headers={"Range": "bytes=3-8"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.read() == b"abcabc"
    finally:
        srv.stop()
    assert srv.proc.poll() is not None


def test_servers_child_refuses_bad_arguments():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "servers.py"), "--nope"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "usage: python bench/servers.py --_static" in p.stderr


def test_scale_proxy_forwards_and_counts_by_method(tmp_path):
    """bench/scale.py's counting proxy: answers as the server behind it would (bodies, ranges,
    HEAD lengths, errors) and counts requests and body bytes by method."""
    import urllib.error
    import urllib.request
    import scale
    import servers
    (tmp_path / "f.bin").write_bytes(bytes(range(256)) * 40)
    srv = servers.StaticServer(str(tmp_path), "f.bin").start()
    proxy = None
    try:
        proxy = scale.Proxy(srv.url).start()
        before = proxy.counts()
        with urllib.request.urlopen(f"{proxy.url}/f.bin", timeout=10) as r:
            assert r.read() == bytes(range(256)) * 40
        req = urllib.request.Request(f"{proxy.url}/f.bin", headers={"Range": "bytes=10-19"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 206 and r.read() == bytes(range(10, 20))
        with urllib.request.urlopen(urllib.request.Request(f"{proxy.url}/f.bin", method="HEAD"), timeout=10) as r:
            assert r.headers["Content-Length"] == str(256 * 40) and r.read() == b""
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(f"{proxy.url}/f.bin", data=b"x" * 100, method="PUT"),
                                   timeout=10)
        assert e.value.code == 405  # the static server refuses PUT; the proxy passes that on
        got = scale.diff_counts(before, proxy.counts())
    finally:
        if proxy:
            proxy.stop()
        srv.stop()
    assert got["by_method"] == {"GET": 2, "HEAD": 1, "PUT": 1} and got["requests"] == 4
    assert got["by_kind"] == {"GET other": 2, "HEAD other": 1, "PUT other": 1}
    assert got["bytes_in"] == 100
    assert got["bytes_out"] >= 256 * 40 + 10  # the file, the range (and the 405's short body)
    assert proxy.proc.poll() is not None


def test_scale_counts_are_differences_of_snapshots():
    import scale
    before = {"GET": {"requests": 3, "bytes_in": 0, "bytes_out": 30, "kinds": {"packs": 3}}}
    after = {"GET": {"requests": 5, "bytes_in": 0, "bytes_out": 50, "kinds": {"packs": 4, "repos": 1}},
             "PUT": {"requests": 1, "bytes_in": 7, "bytes_out": 0, "kinds": {"manifests": 1}}}
    assert scale.diff_counts(before, after) == {
        "requests": 3, "bytes_in": 7, "bytes_out": 20, "by_method": {"GET": 2, "PUT": 1},
        "by_kind": {"GET packs": 1, "GET repos": 1, "PUT manifests": 1}}
    assert scale.diff_counts(after, after)["requests"] == 0


def test_scale_names_the_store_folder_of_a_request():
    import scale
    assert scale.object_kind("/bkt/s100/packs/ab/cd.pack") == "packs"
    assert scale.object_kind("/bkt", "s100/manifests/") == "manifests"  # a listing: its prefix=
    assert scale.object_kind("/bkt/s100/cdcstore.json") == "cdcstore.json"
    assert scale.object_kind("/bkt/s100/elsewhere") == "other"


def test_scale_arguments_are_checked():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scale.py"), "--versions", "1,x"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "give whole numbers separated by commas" in p.stderr
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scale.py"), "--stores", "tape"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "name bucket, dir or both" in p.stderr


def test_scale_paper_extrapolation_follows_the_measured_constants():
    """docs/scale.md's on-paper table is arithmetic on the fitted constants: a changed constant
    changes the row it feeds, and today's new-machine open reads every pack footer."""
    import figures
    base = {"open_requests_per_pack": 3, "reader_index_bytes_per_chunk": 70, "commit_bytes_per_file": 80,
            "edit_push_requests_per_file": 3}
    rows = {r[0]: r for r in figures.paper_rows(base)}
    assert rows["open + read 1 file, new machine"][1].startswith("4.5e+07 requests")  # 1.5e7 packs x 3
    assert rows["client index on disk"][1].startswith("700.0 GB")  # 1e10 chunks x 70 B
    more = {r[0]: r for r in figures.paper_rows({**base, "reader_index_bytes_per_chunk": 140})}
    assert more["client index on disk"][1].startswith("1.4 TB")
    assert more["open + read 1 file, new machine"] == rows["open + read 1 file, new machine"]

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

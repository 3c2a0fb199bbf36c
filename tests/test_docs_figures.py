"""Figures in the docs are rendered from bench JSON (bench/results/*.json), never typed by hand."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import figures  # noqa: E402


def test_every_figure_block_matches_its_json():
    assert figures.stale() == []


def test_a_block_without_its_json_is_an_error(tmp_path):
    text = "<!-- figures no-such-run -->\nold\n<!-- /figures -->\n"
    try:
        figures.rewrite(text, figures.load_results())
    except SystemExit as e:
        assert "bench/results/no-such-run.json does not exist" in str(e)
    else:
        raise AssertionError("a block naming missing results was rendered")


def test_a_changed_figure_changes_the_block():
    doc = json.load(open(os.path.join(ROOT, "bench", "results", "stream.json")))
    for key in ("goal_results", "goals"):  # newer runs carry both; the renderer reads the first
        if isinstance((doc.get(key) or {}).get("first_batch_seconds_ours"), dict):
            doc[key]["first_batch_seconds_ours"]["value"] = 9.5
    text = "<!-- figures stream -->\n<!-- /figures -->\n"
    assert "| first_batch_seconds_ours | 9.5 |" in figures.rewrite(text, {"stream": doc})


def test_charts_are_deterministic_and_follow_the_json():
    pytest = __import__("pytest")
    import matplotlib  # noqa: F401 - the test extra pins it: the charts are compared byte for byte
    results = figures.load_results()
    for name in figures.shown_charts():
        one, two = figures.draw(name, results[name]), figures.draw(name, results[name])
        assert one == two, f"{name}: two drawings of the same JSON differ"
        assert b"<dc:date>" not in one and b"Matplotlib v" not in one
    doc = json.loads(json.dumps(results["read"]))
    doc["sides"]["ours"]["full_mb_s"] *= 2
    assert figures.draw("read", doc) != figures.draw("read", results["read"])


def test_every_chart_shown_is_up_to_date():
    import matplotlib  # noqa: F401 - the test extra pins it
    assert figures.stale_charts() == []

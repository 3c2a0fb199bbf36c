"""Figures in docs/ come from bench JSON, never typed by hand.

Every bench script prints one JSON object as its last line. Keep a run's figures, then render
them into the docs:

    python bench/stream.py | tee /tmp/out.txt
    python bench/figures.py save stream /tmp/out.txt     # -> bench/results/stream.json
    python bench/figures.py render                        # rewrite the figure blocks in docs/*.md
    python bench/figures.py check                         # exit 1 if a block differs from its JSON

A figure block in a doc is

    <!-- figures stream -->
    ...generated...
    <!-- /figures -->

and holds a table of the run's goals (value, goal, met) and, when the JSON has per-side figures
(`sides`), a table of them; `tests/test_docs_figures.py` runs `check`.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
BLOCK = re.compile(r"(<!-- figures (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
SIDE_FIGURES = [("first_batch_seconds", "first batch (s)", "{:.2f}"), ("samples_per_s", "samples/s", "{:,.0f}"),
                ("mb_per_s", "MB/s", "{:.0f}"), ("peak_pss_tree", "peak PSS, process tree (MB)", "MB")]


def last_json(text: str) -> dict:
    """The last line of a bench run that is a JSON object."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("no JSON line in that output: a bench script prints its figures as its last line")


def _fmt(value, how: str = "{:.3g}") -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if how == "MB":
        return f"{value / 1e6:,.0f}"
    if isinstance(value, (int, float)):
        return how.format(value)
    return str(value)


def render(name: str, doc: dict) -> str:
    """The markdown of one figure block."""
    code = doc.get("code") or {}
    load = doc.get("loadavg_start")
    out = [f"From `bench/results/{name}.json` (`bench/{doc.get('bench', name)}.py` at commit "
           f"{code.get('head', '?')}, {doc.get('cpus', '?')} CPUs"
           + (f", load average {load[0]:.1f} at the start" if load else "") + "):", ""]
    goals = doc.get("goals") or {}
    if goals:
        out += ["| figure | value | goal | met |", "| --- | --- | --- | --- |"]
        for key, g in goals.items():
            out.append(f"| {key} | {_fmt(g.get('value'))} | {g.get('goal', '')} | "
                       f"{'yes' if g.get('met') else 'no'} |")
        out.append("")
    sides = doc.get("sides") or {}
    keys = [(k, label, how) for k, label, how in SIDE_FIGURES if any(k in (v or {}) for v in sides.values())]
    if sides and keys:
        out += ["| side | " + " | ".join(label for _, label, _ in keys) + " |",
                "| --- |" + " --- |" * len(keys)]
        for side, figs in sides.items():
            figs = figs or {}
            out.append(f"| {side} | " + " | ".join(_fmt(figs.get(k), how) if k in figs else "" for k, _, how in keys)
                       + " |")
        out.append("")
    return "\n".join(out)


def load_results() -> dict[str, dict]:
    out = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        with open(path) as f:
            out[os.path.basename(path)[:-5]] = json.load(f)
    return out


def rewrite(text: str, results: dict[str, dict]) -> str:
    def block(m):
        name = m.group("name")
        if name not in results:
            raise SystemExit(f"a doc shows figures {name!r} but bench/results/{name}.json does not exist: "
                             f"run the bench and `bench/figures.py save {name} OUTPUT`")
        return m.group(1) + render(name, results[name]) + "\n" + m.group(4)
    return BLOCK.sub(block, text)


def docs() -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]


def stale() -> list[str]:
    """Docs whose figure blocks differ from the JSON they are made from."""
    results = load_results()
    return [p for p in docs() if (t := open(p).read()) != rewrite(t, results)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save", help="keep the last JSON line of a bench run as bench/results/NAME.json")
    s.add_argument("name")
    s.add_argument("output", help="a file holding the bench's output ('-': stdin)")
    sub.add_parser("render", help="rewrite the figure blocks of docs/*.md and README.md")
    sub.add_parser("check", help="exit 1 if a figure block differs from its JSON")
    a = ap.parse_args(argv)
    if a.cmd == "save":
        text = sys.stdin.read() if a.output == "-" else open(a.output).read()
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, f"{a.name}.json"), "w") as f:
            json.dump(last_json(text), f, indent=1, sort_keys=False)
            f.write("\n")
        return 0
    if a.cmd == "render":
        results = load_results()
        for p in docs():
            t = open(p).read()
            if (n := rewrite(t, results)) != t:
                with open(p, "w") as f:
                    f.write(n)
        return 0
    bad = stale()
    for p in bad:
        print(f"{os.path.relpath(p, ROOT)}: figures differ from bench/results: run `python bench/figures.py render`")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

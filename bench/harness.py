"""The harness every bench script shares: setup, repetition, summary.

  setup       start(bench): the opening figures (bench, python, cpus, load average at the start);
              run_dir (a fresh folder of this run under --data-dir, so two runs do not collide);
              code_version (git HEAD and uncommitted files under cdcstore/), xet_env
  repetition  rounds(sides, n): (rep, side) with the sides rotated every repetition (ours, peer;
              peer, ours; ...), so that drift in machine speed hits every side alike
  summary     med, pct, ratio; Goal (name, measured, goal, direction, met) and goal_results;
              finish: the load average at the end, then the figures as one JSON line, the last line

Only the standard library is imported here.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


# ---------------------------------------------------------------------------------------------
# setup
# ---------------------------------------------------------------------------------------------

def code_version() -> dict:
    """The cdcstore code measured: git HEAD and uncommitted changes under cdcstore/ (read-only git)."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "cdcstore"],
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
        return {"head": head, "uncommitted": [d[3:] for d in dirty if d.strip()]}
    except (OSError, subprocess.SubprocessError):
        return {}


def start(bench: str) -> dict:
    """The figures every run opens with: the script's name, python, cpus, load average at the start."""
    return {"bench": bench, "python": platform.python_version(), "cpus": os.cpu_count(),
            "loadavg_start": list(os.getloadavg())}


def run_dir(data_dir: str, name: str) -> str:
    """A new empty folder data_dir/NAME-XXXX for one run's stores and targets (the caller removes it)."""
    os.makedirs(data_dir, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{name}-", dir=data_dir)


def xet_env(cache: str) -> dict:
    """Environment additions for an hf_xet child: no telemetry, its own cache directory."""
    return {"HF_XET_TELEMETRY_ENABLED": "0", "HF_XET_CACHE": cache}


# ---------------------------------------------------------------------------------------------
# repetition
# ---------------------------------------------------------------------------------------------

def rotated(sides: Sequence, rep: int) -> list:
    """The sides in the order of repetition rep: rotated by rep (two sides alternate)."""
    k = rep % len(sides) if sides else 0
    return list(sides[k:]) + list(sides[:k])


def rounds(sides: Sequence, repeat: int) -> Iterator[tuple[int, object]]:
    """(rep, side) for every repetition, the sides rotated each time: A B C, B C A, C A B, ..."""
    for rep in range(repeat):
        for side in rotated(sides, rep):
            yield rep, side


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------

def med(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of xs (linear interpolation between the nearest ranks)."""
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0."""
    return a / b if a is not None and b else None


_TESTS = {">=": lambda v, g: v >= g, "<=": lambda v, g: v <= g, ">": lambda v, g: v > g,
          "<": lambda v, g: v < g, "==": lambda v, g: v == g}


@dataclass
class Goal:
    """One goal: `measured direction goal` (direction one of >=, <=, >, <, ==; "reported" for a
    figure without a goal). met is worked out from the others unless given; None when nothing
    was measured (a side failed, a part did not run)."""
    name: str
    measured: float | None
    goal: float | None
    direction: str
    met: bool | None = None

    def __post_init__(self):
        if self.direction != "reported" and self.direction not in _TESTS:
            raise ValueError(f"goal {self.name}: direction {self.direction!r} is not one of {', '.join(_TESTS)}")
        if self.met is None and self.measured is not None and self.direction in _TESTS:
            self.met = bool(_TESTS[self.direction](self.measured, self.goal))

    @property
    def text(self) -> str:
        """'>= 2' (or 'reported')."""
        return "reported" if self.direction == "reported" else f"{self.direction} {self.goal:g}"

    def to_json(self) -> dict:
        return {"value": self.measured, "goal": self.text, "direction": self.direction, "target": self.goal,
                "met": self.met}

    def line(self, label: str | None = None, spec: str = ".3f") -> str:
        """'  label = 0.980 (goal >= 2: NOT met)'."""
        value = "n/a" if self.measured is None else format(self.measured, spec)
        state = ("n/a" if self.met is None else "met" if self.met else "NOT met")
        return f"  {label or self.name} = {value} (goal {self.text}: {state})"


def goal_results(goals: Iterable[Goal]) -> dict:
    """{name: goal as JSON}: the `goal_results` key of every script's JSON line."""
    return {g.name: g.to_json() for g in goals}


def loadavg_text(load=None) -> str:
    """The load average (now, or the one given) as '1.00 0.50 0.25'."""
    return " ".join(f"{x:.2f}" for x in (os.getloadavg() if load is None else load))


def finish(fig: dict, goals: Iterable[Goal] | None = None) -> None:
    """The closing lines: records goal_results (when goals are given) and the load average at the
    end, prints it (with the code state when fig has "code"), then fig as one JSON object - the
    last line printed."""
    if goals is not None:
        fig["goal_results"] = goal_results(goals)
    fig["loadavg_end"] = os.getloadavg()
    code = f"; cdcstore code {fig['code']}" if "code" in fig else ""
    print(f"\nload average at end (other work on this machine skews timings): "
          f"{loadavg_text(fig['loadavg_end'])}{code}")
    print(json.dumps(fig))

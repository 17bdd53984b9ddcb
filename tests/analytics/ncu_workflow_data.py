"""The recording of the documented ncu workflow on a real H100 (tests/gpu/ncu_workflow_live.py,
2026-11-25; docs/evidence/ncu_workflow_h100/): one Megatron-LM job, three runs. Run 1 unarmed with a
Kineto capture by rule (iterations 1-45, a checkpoint saved at 45); run 2 the same job restarted from
iteration 1 with rank 0 under ncu (``perfd ncu-prefix``), an ncu range by rule at iteration 7; run 3
resumed from the checkpoint at 46, under ncu the same way, a range at iteration 62.

What is read here, by hand and apart from perfd's code where a test compares with perfd: each run's
Megatron log (tests/data/megatron/h100_ncu_workflow_runN.log.gz) and its ``.times`` sidecar (when each
line arrived: ``perfd launch``), the captures' manifests (tests/data/ncu/h100_workflow_captures.json).
"""

from __future__ import annotations

import bisect
import datetime
import gzip
import itertools
import json
import re
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MEGATRON = ROOT / "tests" / "data" / "megatron"
NCU = ROOT / "tests" / "data" / "ncu"
JOB = "ncu-workflow"
GPU = "NVIDIA H100 80GB HBM3"
RUNS = (1, 2, 3)
KINETO, RANGE2, RANGE3 = "c20261125-045214-d1a7c2", "c20261125-045351-a60b94", "c20261125-045710-b53b44"
WARMUP = 5  # records perfd leaves out of a run's steady steps first (perfd.analytics.steps.steady)

_ITER = re.compile(r"\] iteration\s+(\d+)/.*elapsed time per iteration \(ms\): ([0-9.]+)")
_SAVE = re.compile(r"^\s*save-checkpoint \.+: \(([0-9.]+), ([0-9.]+)\)")
_STAMP = re.compile(r"datetime: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)")


def log_text(run: int) -> str:
    return gzip.decompress((MEGATRON / f"h100_ncu_workflow_run{run}.log.gz").read_bytes()).decode()


@dataclass(frozen=True)
class Step:
    iteration: int
    end: float  # epoch s: when its log line arrived (the .times sidecar)
    step_s: float  # Megatron's elapsed time per iteration


@dataclass(frozen=True)
class Run:
    steps: tuple[Step, ...]
    save_s: float  # the save-checkpoint timer printed after its last step (0: none)
    first_stamp: float  # the earliest "datetime:" stamp of its start-up (epoch s): the process's start


@cache
def run_of(run: int) -> Run:
    """The run's iterations as its own log and sidecar say them."""
    text = log_text(run)
    times = [tuple(map(int, ln.split())) for ln in (MEGATRON / f"h100_ncu_workflow_run{run}.log.times")
             .read_text().splitlines()]
    ends = [t[0] for t in times]
    steps, save, stamps, offset = [], 0.0, [], 0
    for line in text.encode().split(b"\n"):
        newline_at = offset + len(line)
        offset = newline_at + 1
        s = line.decode()
        m = _ITER.search(s)
        if m is not None:
            k = bisect.bisect_right(ends, newline_at)  # the first read past the line's newline
            steps.append(Step(int(m.group(1)), times[k][1] / 1e9, float(m.group(2)) / 1e3))
        elif (m := _SAVE.search(s)) is not None:
            save = max(float(m.group(1)), float(m.group(2))) / 1e3
        elif (m := _STAMP.search(s)) is not None:  # Megatron prints them in UTC here
            stamps.append(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(
                tzinfo=datetime.timezone.utc).timestamp())
    return Run(tuple(steps), save, min(stamps))


@cache
def manifests() -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in json.loads((NCU / "h100_workflow_captures.json").read_text())}


def capture_windows() -> list[tuple[float, float]]:
    """(started_at, finished_at) of each capture, as the aggregator marks the iterations they touch."""
    return [(m["timings"]["started_at"], m["timings"]["finished_at"]) for m in manifests().values()]


def touched(s: Step) -> bool:
    return any(a <= s.end and s.end - s.step_s <= b for a, b in capture_windows())


def run1_steady_median_s() -> float:
    """Run 1's steady step by hand: its logged steps after the warm-up, those a capture touched left out."""
    return statistics.median(s.step_s for s in run_of(1).steps[WARMUP:] if not touched(s))


def trained(run: int) -> list[tuple[Step, float]]:
    """Each step with the seconds of the run's wall time it took: the first its own step, each later one
    its step or the time since the one before, whichever is less (the rest is time between steps)."""
    steps = run_of(run).steps
    return [(s, s.step_s if i == 0 else min(s.step_s, s.end - steps[i - 1].end)) for i, s in enumerate(steps)]


def between(run: int) -> float:
    steps = run_of(run).steps
    return sum(max(0.0, b.end - a.end - b.step_s) for a, b in itertools.pairwise(steps))

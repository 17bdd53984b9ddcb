"""`perfd bench soak` runs end to end, small: a real aggregator process restarted on its state dir
while real agent streams send short jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import run_group

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_soak_reports_each_quarter_and_each_restart(tmp_path: Path) -> None:
    argv = ["bench", "soak", "--jobs", "80", "--agents", "8", "--steps", "5", "--restarts", "1", "--sample-s",
            "0.5", "--json", "--out", str(tmp_path)]
    proc = run_group([sys.executable, "-m", "perfd.cli", *argv], cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(proc.stdout)
    assert res["jobs_not_acknowledged"] == 0 and not res["refused_at_the_end"]
    assert [q["jobs"] for q in res["quarters"]] == ["0-20", "20-40", "40-60", "60-80"]
    assert all(q["rss_mb"] and q["state_dir_mb"] for q in res["quarters"])
    (restart,) = res["restarts"]
    assert restart["how"] == "kill -9" and 0 < restart["replayed"]["hellos"] <= 8  # one Hello per agent
    assert res["final"]["jobs_done"] == 80 and set(res["flat"]) == {"rss_mb", "state_dir_mb", "state_held_mb",
                                                                     "admit_p50_ms"}


def test_bench_soak_refuses_nonsense() -> None:
    proc = subprocess.run([sys.executable, "-m", "perfd.cli", "bench", "soak", "--jobs", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "must be positive" in proc.stderr

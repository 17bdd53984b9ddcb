"""`perfd bench soak` runs end to end, small: a real aggregator process restarted on its state dir
while real agent streams send short jobs. The command by the CLI's main() in the test's process
(tests/cli_main.py); the aggregator the bench restarts is its own process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_main import perfd

pytestmark = pytest.mark.slow


@pytest.mark.slow
def test_bench_soak_reports_each_quarter_and_each_restart(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "soak", "--jobs", "80", "--agents", "8", "--steps", "5", "--restarts", "1", "--sample-s",
            "0.5", "--json", "--out", str(tmp_path)]
    proc = perfd(capsys, *argv)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(proc.stdout)
    assert res["jobs_not_acknowledged"] == 0 and not res["refused_at_the_end"]
    assert [q["jobs"] for q in res["quarters"]] == ["0-20", "20-40", "40-60", "60-80"]
    assert all(q["rss_mb"] and q["state_dir_mb"] for q in res["quarters"])
    (restart,) = res["restarts"]
    assert restart["how"] == "kill -9" and 0 < restart["replayed"]["hellos"] <= 8  # one Hello per agent
    assert res["final"]["jobs_done"] == 80 and set(res["flat"]) == {"rss_mb", "state_dir_mb", "state_held_mb",
                                                                     "admit_p50_ms"}


def test_bench_soak_refuses_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    proc = perfd(capsys, "bench", "soak", "--jobs", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr

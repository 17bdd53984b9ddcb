"""`perfd analyze trace FILE --job-step-sd-ms SD`: the job's own steps' spread, as the aggregator reads
it live, widens each range by how far a rerun of such a job moves (perfd.analytics.advice.remedies
.run_spread_ms), on the recorded Hugging Face Trainer run; a negative spread is refused. The CLI's
main() in the test's process: its output from capsys, its return value the exit status."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from perfd.analytics.advice.remedies import MEDIAN_SE_OF_SD, RUN_SPREAD_OF_STEP, RUN_SPREAD_STEPS
from perfd.cli import main

TRACE = Path(__file__).resolve().parents[2] / "tests" / "data" / "loops" / "hf_clm_h200" / "trace.json.xz"
STEP_MS = 225.0


def _gains(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, list[float]]:
    rc = main(["analyze", "trace", str(TRACE), "--json", "--framework", "hf_trainer",
               "--job-step-ms", str(STEP_MS), *extra])
    assert rc == 0
    return {r["remedy"]: r["gain_ms"] for r in json.loads(capsys.readouterr().out)["recommendations"]}


def test_the_jobs_own_spread_widens_each_range_by_a_reruns_move(capsys: pytest.CaptureFixture[str]) -> None:
    sd = 12.0
    floor = _gains(capsys)
    wide = _gains(capsys, "--job-step-sd-ms", str(sd))
    # the floor each range carried (0.5% of the step) against the spread of two medians of 20 steps
    was, now = RUN_SPREAD_OF_STEP * STEP_MS, math.sqrt(2) * MEDIAN_SE_OF_SD * sd / math.sqrt(RUN_SPREAD_STEPS)
    assert now > was
    (lo0, hi0), (lo1, hi1) = floor["data_loader"], wide["data_loader"]  # read from the trace's gaps
    assert lo1 == pytest.approx(lo0 - (now - was), abs=1e-6)
    assert hi1 == pytest.approx(hi0 + (now - was), abs=1e-6)
    # the replayed ones also calibrate the replay to the job's median, known only to that spread: wider still
    for name in ("micro_batch", "fused_layers"):
        (lo0, hi0), (lo1, hi1) = floor[name], wide[name]
        assert lo1 <= lo0 - (now - was) + 1e-6 and hi1 >= hi0 + (now - was) - 1e-6, name


def test_a_spread_under_the_floor_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert _gains(capsys, "--job-step-sd-ms", "0.1") == _gains(capsys)


def test_a_negative_spread_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "trace", str(TRACE), "--job-step-sd-ms", "-1"]) == 2
    assert "--job-step-sd-ms -1.0: a deviation in milliseconds" in capsys.readouterr().err

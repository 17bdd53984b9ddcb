"""`perfd analyze trace FILE --job-step-sd-ms SD`: the job's own steps' spread, as the aggregator reads
it live, widens each range by how far a rerun of such a job moves (perfd.analytics.advice.remedies
.run_spread_ms), on the recorded Hugging Face Trainer run (its trace analysed once a session:
tests/trace_cache.py; the command's own run on the small Lightning recording); a negative spread is
refused before any file is read. The CLI's main() in the test's process: its output from capsys, its
return value the exit status."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from perfd.analytics.advice.capture_findings import diagnose_capture
from perfd.analytics.advice.remedies import MEDIAN_SE_OF_SD, RUN_SPREAD_OF_STEP, RUN_SPREAD_STEPS, Framework
from perfd.analytics.breakdown.budget import TimerShares
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.app.cli import main
from tests.trace_cache import analyze_chrome_trace

LOOPS = Path(__file__).resolve().parents[2] / "tests" / "data" / "loops"
STEP_MS = 225.0


@pytest.fixture(scope="module")
def trainer() -> list[DeviceBreakdown]:
    return list(analyze_chrome_trace(LOOPS / "hf_clm_h200" / "trace.json.xz").devices)


def _gains(devices: list[DeviceBreakdown], sd_ms: float | None = None) -> dict[str, tuple[float, float]]:
    d = diagnose_capture(devices, framework=Framework.HF_TRAINER,
                         timers=TimerShares(step_ms=STEP_MS, step_sd_ms=sd_ms))
    return {str(r.remedy): (r.gain_ms[0], r.gain_ms[1]) for r in d.recommendations if r.gain_ms}


def test_the_jobs_own_spread_widens_each_range_by_a_reruns_move(trainer: list[DeviceBreakdown]) -> None:
    sd = 12.0
    floor, wide = _gains(trainer), _gains(trainer, sd)
    # the floor each range carried (0.5% of the step) against the spread of two medians of 20 steps
    was, now = RUN_SPREAD_OF_STEP * STEP_MS, math.sqrt(2) * MEDIAN_SE_OF_SD * sd / math.sqrt(RUN_SPREAD_STEPS)
    assert now > was
    # every remedy of this job is replayed (the data loader's too: its fetches on the training thread):
    # the replay is calibrated to the job's median, known only to that spread, so each range widens by at
    # least the spread's growth (a range read from the trace's gaps widens by exactly it: the Lightning
    # recording's CUDA graphs, below)
    assert set(floor) == {"micro_batch", "fused_layers", "data_loader"}
    for name in floor:
        (lo0, hi0), (lo1, hi1) = floor[name], wide[name]
        assert lo1 <= lo0 - (now - was) + 1e-6 and hi1 >= hi0 + (now - was) - 1e-6, name


def test_a_spread_under_the_floor_changes_nothing(trainer: list[DeviceBreakdown]) -> None:
    assert _gains(trainer, 0.1) == _gains(trainer)


def test_the_command_takes_the_spread_into_its_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    def ranges(*extra: str) -> dict[str, list[float]]:
        assert main(["analyze", "trace", str(LOOPS / "lightning_h200" / "trace.json.xz"), "--json",
                     "--framework", "lightning", "--job-step-ms", "16", *extra]) == 0
        return {r["remedy"]: r["gain_ms"] for r in json.loads(capsys.readouterr().out)["recommendations"]}

    floor, wide = ranges(), ranges("--job-step-sd-ms", "2")
    (lo0, hi0), (lo1, hi1) = floor["cuda_graphs"], wide["cuda_graphs"]  # read from the trace's gaps
    assert lo1 < lo0 and hi1 > hi0 and (lo0 - lo1) == pytest.approx(hi1 - hi0, abs=1e-9)  # both ends alike


def test_a_negative_spread_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(LOOPS / "hf_clm_h200" / "trace.json.xz")
    assert main(["analyze", "trace", trace, "--job-step-sd-ms", "-1"]) == 2
    assert "--job-step-sd-ms -1.0: a deviation in milliseconds" in capsys.readouterr().err

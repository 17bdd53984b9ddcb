"""The summary's steady values say how each was taken: served under the API's key ``medians``, they are
time-weighted shares and rates, the mean step time and medians of the rest (docs/diagnosis.md), and
``reductions`` says which — checked on the demo's recorded log, whose steady step times have a mean
other than their median."""

from __future__ import annotations

import statistics

import pytest

from perfd.app.api import analyze_megatron_log
from perfd.app.demo.run import DEMO_LOG
from perfd.report.html import _tiles


def test_each_steady_value_is_what_its_reduction_says() -> None:
    run = analyze_megatron_log(DEMO_LOG, gpu="NVIDIA H200")
    s = run["summary"]
    steady = [it for it in run["iterations"] if it["steady_state"]]
    assert len(steady) == s["n_steady"] == 36
    steps = [it["step_time_ms"] for it in steady]
    assert statistics.fmean(steps) != pytest.approx(statistics.median(steps), abs=0.5)  # an odd sample
    med, how = s["medians"], s["reductions"]
    assert set(how) == set(med)
    assert how["step_time_ms"] == "mean" and med["step_time_ms"] == pytest.approx(statistics.fmean(steps))
    assert how["lm_loss"] == "median"
    assert med["lm_loss"] == pytest.approx(statistics.median(it["lm_loss"] for it in steady))
    assert how["mfu"] == "time-weighted"
    weighted = sum(it["mfu"] * it["step_time_ms"] for it in steady) / sum(steps)
    assert med["mfu"] == pytest.approx(weighted) and med["mfu"] != pytest.approx(
        statistics.median(it["mfu"] for it in steady), rel=1e-4)
    # The HTML page's tiles said "Steady-state medians." under a mean step time and a time-weighted MFU.
    note = _tiles(med)
    assert "Steady-state medians." not in note and "step time the mean" in note

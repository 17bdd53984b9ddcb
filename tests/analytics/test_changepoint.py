"""Lasting shifts of the step time: a change point with before/after levels whose
cost runs to the end (or to where the user took the new level as the new normal), and goodput's
incident part equal to the cost of the incidents the job lists, whatever the source.

The issue's probe: steps 60 → 90 ms from iteration 151 to the end at 300 became one incident that
ended near iteration 250 as the steady median adapted, so the rest of the shift was counted nowhere;
a plain hook job with a 3 s data-loading incident reported goodput 100% with ``incident: 0.0``."""

from __future__ import annotations

import time

import pytest

from perfd.aggregator.state import AggregatorState
from perfd.analytics.incidents.detect import LEVEL_SHIFT
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.steps.changepoint import find_change_point
from perfd.core.model import HOOK_COMPUTE, HOOK_DATA_WAIT, JobInfo, StepRecord, TimerValue
from perfd.report.incident_text import cause_line


def shifted(first_slow: int = 151, last: int = 300, before: float = 60.0, after: float = 90.0) -> list[float]:
    return [before if i < first_slow else after for i in range(1, last + 1)]


def records(steps: list[float], t0: float = 1.7e9) -> list[StepRecord]:
    out, t = [], t0
    for i, s in enumerate(steps, start=1):
        t += s / 1e3
        out.append(StepRecord(job="j", iteration=i, rank="last", end_time=t, step_time_ms=s, interval=1))
    return out


def test_a_lasting_shift_is_found_with_its_levels() -> None:
    cp = find_change_point(shifted())
    assert cp is not None and cp.index == 150 and (cp.before_ms, cp.after_ms, cp.n_after) == (60.0, 90.0, 150)
    noisy = [s * (1.0 + 0.05 * ((i * 7919) % 11 - 5) / 5) for i, s in enumerate(shifted())]
    for i in (20, 90, 200):
        noisy[i] = 400.0  # spikes do not move it
    got = find_change_point(noisy)
    assert got is not None and abs(got.index - 150) <= 2


@pytest.mark.parametrize("steps", [
    [60.0] * 300,  # steady
    [60.0] * 150 + [90.0] * 100 + [60.0] * 50,  # a slowdown that recovered: an incident, not a shift
    [60.0] * 290 + [90.0] * 10,  # too short to call lasting: an open incident
    [60.0 if i % 3 else 200.0 for i in range(300)],  # spikes, no level
])
def test_no_change_point_without_a_lasting_level(steps: list[float]) -> None:
    assert find_change_point(steps) is None


def test_the_shift_is_one_incident_counted_to_the_end_and_in_goodput() -> None:
    a = analyze_run(JobInfo(), records(shifted()), job_name="j")
    shifts = [i for i in a.incidents if LEVEL_SHIFT in i.kinds]
    assert len(shifts) == 1 and len(a.incidents) == 1
    inc = shifts[0]
    assert (inc.first_iteration, inc.last_iteration, inc.open) == (151, 300, True)
    assert inc.cost_s == pytest.approx(150 * 0.030)  # Σ(step − level before) to the end
    cp = inc.evidence.change_point
    assert cp is not None and cp.before_ms == 60.0 and cp.after_ms == 90.0
    assert "shifted from 60 to 90 ms at iteration 151" in cause_line(inc)
    gp = a.summary.to_json()["goodput"]
    assert gp["parts_s"]["incident"] == pytest.approx(inc.cost_s)
    assert a.summary.median("step_time_ms") == 60.0  # steady state: the level before the shift


def test_taken_as_the_new_normal_the_shift_stops_costing() -> None:
    a = analyze_run(JobInfo(), records(shifted()), job_name="j", new_normal_at=220)
    inc = next(i for i in a.incidents if LEVEL_SHIFT in i.kinds)
    assert (inc.first_iteration, inc.last_iteration, inc.open) == (151, 219, False)
    assert inc.cost_s == pytest.approx(69 * 0.030) and "new normal at iteration 220" in cause_line(inc)
    later = shifted() + [90.0] * 20 + [200.0] * 10 + [90.0] * 20  # a slowdown on top of the new normal
    b = analyze_run(JobInfo(), records(later), job_name="j", new_normal_at=220)
    spike = next(i for i in b.incidents if LEVEL_SHIFT not in i.kinds)
    assert (spike.first_iteration, spike.last_iteration) == (321, 330)
    assert spike.cost_s == pytest.approx(10 * 0.110)  # measured against the new normal, 90 ms


def _feed(kind: str, steps: list[float], data_ms: list[float]) -> AggregatorState:
    """Records as each source sends them, ingested as they arrive, analysed every 5 (the live
    aggregator's refresher): the hook (one record per rank), torchtitan and Megatron-LM ('last')."""
    st = AggregatorState(min_recompute_s=0.0)
    t = time.time() - sum(steps) / 1e3 - 1
    for i, (s, d) in enumerate(zip(steps, data_ms, strict=True), start=1):
        t += s / 1e3
        if kind == "hook":
            timers = {HOOK_DATA_WAIT: TimerValue(d, d, {0: d}),
                      HOOK_COMPUTE: TimerValue(s - d, s - d, {0: s - d})}
            rec = StepRecord(job="j", iteration=i, rank=0, end_time=t, step_time_ms=s, interval=1,
                             timers=timers)
        else:
            timers = {"batch-generator": TimerValue(d, d)} if kind == "megatron" else {}
            rec = StepRecord(job="j", iteration=i, rank="last", end_time=t, step_time_ms=s, interval=1,
                             timers=timers)
        st.ingest_steps("a", [rec])
        if i % 5 == 0:
            st.analysis("j", force=True)
    st.analysis("j", force=True)
    return st


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hook", "torchtitan", "megatron"])
def test_goodputs_incident_part_is_the_cost_of_the_incidents_listed_for_every_source(kind: str) -> None:
    """A 3 s data-loading stall early in the run: seen live as an incident, then inside the warm-up
    window the analysis leaves out as the run grows — the aggregator keeps the incident, and goodput
    now counts it (before: goodput 100%, incident 0.0, with the incident listed)."""
    data = [5.0] * 300
    for i in range(5, 15):
        data[i] = 305.0
    steps = [95.0 + d for d in data]
    st = _feed(kind, steps, data)
    listed = st.incidents.incidents("j")
    gp = st.snapshot("j").goodput()  # type: ignore[union-attr]
    assert gp is not None and listed
    assert gp.parts["incident"] == pytest.approx(sum(i["cost_s"] for i in listed))
    assert gp.parts["incident"] == pytest.approx(3.0)
    assert gp.ratio == pytest.approx(30.0 / 33.0, rel=1e-3)
    assert sum(gp.parts.values()) == pytest.approx(gp.wall_s)

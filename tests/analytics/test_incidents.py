"""Incident detection (perfd.analytics.incidents.detect) on the per-iteration results."""

from __future__ import annotations

from typing import Any

from perfd.analytics.incidents.detect import CAPTURE, SLOW, detect_incidents
from perfd.analytics.run.run_summary import CaptureDisturbances
from perfd.analytics.steps.iteration import IterationResult
from perfd.report.incident_findings import incident_findings
from perfd.report.incident_text import cause_line


def _its(steps: list[float]) -> list[IterationResult]:
    return [IterationResult(i + 1, step_time_ms=s) for i, s in enumerate(steps)]


def test_a_slow_stretch_with_a_flicker_is_one_incident_and_jitter_is_none() -> None:
    # (the lone 640 ms step sits among enough calm steps that most windows clear of the slow stretch
    # do not hold it: the steady rate is 500 ms a step)
    steps = [900.0] * 3 + [500.0] * 10 + [1300, 1250, 510, 1280, 1300] + [500.0] * 10 + [640.0] + [500.0] * 25
    its = _its(steps)
    ends = {it.iteration: 1000.0 + it.iteration for it in its}
    found = detect_incidents(its, ends, {}, 3, None)
    incs, ref = found.incidents, found.reference_ms
    assert ref == 500.0
    (inc,) = incs  # the lone 640 ms step (1.28x) cost less than one step: jitter, not an incident
    assert (inc.first_iteration, inc.last_iteration, inc.kinds) == (14, 18, [SLOW])
    assert inc.cost_s == sum(s - 500.0 for s in steps[13:18]) / 1e3
    assert inc.start_time == ends[13] and inc.end_time == ends[18] and not inc.open
    assert "no per-rank data names a rank" in cause_line(inc)


def test_a_slowdown_that_starts_as_perfds_capture_ends_is_blamed_on_the_capture() -> None:
    its = _its([500.0] * 10 + [505.0, 500.0] + [2000.0, 2100.0])
    found = detect_incidents(its, {}, {11: True}, 0, None)
    (inc,) = found.incidents
    assert (inc.first_iteration, inc.last_iteration, inc.kinds) == (13, 14, [SLOW]) and inc.open
    assert inc.verdict is not None and inc.verdict.cause == "after_capture"
    assert "perfd's own capture ended" in cause_line(inc)
    assert [(d.first_iteration, d.last_iteration) for d in found.disturbances] == [(11, 11)]


def test_a_capture_inside_an_incident_is_left_out_of_its_cost() -> None:
    steps = [500.0] * 10 + [1500.0] * 3 + [4000.0, 4000.0] + [1500.0] * 3 + [500.0] * 5
    its = _its(steps)
    found = detect_incidents(its, {}, {14: True, 15: True}, 0, None)
    (inc,) = found.incidents
    assert (inc.first_iteration, inc.last_iteration) == (11, 18) and set(inc.kinds) == {CAPTURE, SLOW}
    # The captured steps count as lost up to the incident's own level (1.5 s); beyond it, the capture's.
    assert inc.cost_s == 8 * 1.0
    assert inc.capture_cost_s == 2 * 2.5
    # The captured steps are listed as the capture's disturbance too, naming the incident they are in
    # (on the H100 an ncu range inside the armed rank's level shift was listed nowhere once that
    # incident went as the arming's); their time is the incident's capture_cost_s, not counted again.
    (d,) = found.disturbances
    assert (d.first_iteration, d.last_iteration) == (14, 15) and d.evidence.inside_incident == inc.id
    listed: Any = CaptureDisturbances.of(found.disturbances).to_json()  # as served
    assert listed["excess_s"] is None and listed["stretches"][0]["inside_incident"] == inc.id
    assert listed["stretches"][0]["excess_s"] == d.capture_cost_s


def test_a_lasting_shift_near_the_threshold_is_one_incident_not_fragments() -> None:
    # A data loader slowed for 80 steps: steps hover at 1.15-1.3x the median.
    slow = [650.0 if i % 3 else 580.0 for i in range(80)]
    its = _its([500.0] * 40 + slow + [500.0] * 40)
    found = detect_incidents(its, {}, {}, 0, None)
    assert [(i.first_iteration, i.last_iteration) for i in found.incidents] == [(42, 120)]  # 1.2x enters
    assert found.jitter["n"] == 0


def test_small_departures_are_jitter_below_the_floor() -> None:
    its = _its([40.0] * 50 + [120.0, 110.0] + [40.0] * 50)  # 150 ms lost on a 40 ms step: not 1 s
    found = detect_incidents(its, {}, {}, 0, None)
    assert found.incidents == [] and found.jitter["n"] == 1 and found.jitter["iterations"] == 2
    # a smaller one does not move its window's time per step past the bar at all
    its = _its([40.0] * 50 + [60.0, 55.0] + [40.0] * 50)
    assert detect_incidents(its, {}, {}, 0, None).jitter["n"] == 0


def test_a_named_rank_and_its_finding() -> None:
    its = _its([500.0] * 10 + [1200.0] * 4)
    for it in its[10:]:
        it.straggler_candidate_ranks = [3]
        it.straggler_rank_compute_ratio = {0: 0.9, 3: 2.1}
    (inc,) = detect_incidents(its, {}, {}, 0, None).incidents
    assert inc.ranks == [3] and "rank 3 computed up to 2.10×" in cause_line(inc)
    fs, rs = incident_findings([inc], run_s=10.0)
    assert fs[0].id == f"incident-{inc.id}" and fs[0].evidence["ranks"] == [3]
    assert inc.cost_s is not None and rs[0].impact == inc.cost_s / 10.0 and "rank 3" in rs[0].action

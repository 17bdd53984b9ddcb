"""Whose steps a run analysis' figures are, and what the current run adds: the
run they come from (perfd.analytics.run.runs), the arming's cost measured against the job's previous
run, and no grade from too few steady steps. Split from perfd.analytics.run.run_analysis; pure.

- An armed step (its rank under ncu: perfd.core.armed) is never steady: the job's MFU, step time, jitter and
  class are its unarmed steps'. When every step of the current run is armed, they are those of the
  job's last run without an armed rank — said so (``Runs.figures``), never mixed with the armed run's.
- ``arming``: the armed steps (those that would be steady) against that earlier run's steady steps (or
  its captures' steps), else against the current run's own unarmed steps.
- A class or a jitter from fewer than MIN_GRADE_STEPS steady steps is not given: the summary says how
  many there were (perfd.analytics.thresholds.MIN_GRADE_STEPS).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown.bottleneck import Bottleneck, BottleneckClass, EarlierRun, TooFewSteps
from perfd.analytics.run.arming import MIN_STEPS, ArmingBasis, ArmingCost, against_run
from perfd.analytics.run.run_summary import CaptureDisturbances, RunSummary, incidents_cost_s
from perfd.analytics.run.runs import FiguresFrom, RunDigest, Runs, last_unarmed
from perfd.analytics.steps.steady import Exclusion, SteadyState

if TYPE_CHECKING:
    from collections.abc import Iterable

    from perfd.analytics.incidents.detect import Incident
    from perfd.analytics.steps.iteration import IterationResult
    from perfd.analytics.steps.iteration_table import Table

MIN_GRADE_STEPS = int(th.MIN_GRADE_STEPS.value)


def figures_of(run: int, earlier: Sequence[RunDigest], n_armed: int, n_steady: int) -> Runs:
    """The runs as run ``run``'s analysis reports them: its own figures, or — every step armed, none
    steady — its last unarmed run's (none when there is no such run)."""
    if n_armed and not n_steady:
        ref = last_unarmed(earlier)
        if ref is not None:
            return Runs(current=run, earlier=tuple(earlier), figures=FiguresFrom.EARLIER_UNARMED,
                        figures_run=ref.run, armed_iterations=n_armed)
        return Runs(current=run, earlier=tuple(earlier), figures=FiguresFrom.NONE, figures_run=None,
                    armed_iterations=n_armed)
    return Runs(current=run, earlier=tuple(earlier), figures=FiguresFrom.CURRENT, figures_run=run,
                armed_iterations=n_armed)


def with_runs(summary: RunSummary, runs: Runs, arming: ArmingCost | None) -> RunSummary:
    """``summary`` with the runs it belongs to, the arming's cost (:func:`arming_of`), and no grade
    from too few steps."""
    ref = runs.reference
    if ref is not None:
        summary = dataclasses.replace(
            summary, n_steady=ref.n_steady, steady_first_iteration=ref.first_iteration,
            steady_last_iteration=ref.last_iteration, step_time_cv=ref.step_time_cv, slow_steps=None,
            bottleneck=Bottleneck(ref.bottleneck, EarlierRun(ref.run, ref.bottleneck_of)))
    elif summary.n_steady < MIN_GRADE_STEPS and runs.figures is FiguresFrom.CURRENT:
        unknown = Bottleneck(BottleneckClass.UNKNOWN, TooFewSteps(summary.n_steady))
        summary = dataclasses.replace(summary, step_time_cv=None, slow_steps=None, bottleneck=unknown)
    return dataclasses.replace(summary, runs=runs, arming=arming)


def arming_of(table: Table[IterationResult], steady: SteadyState, runs: Runs, run: int) -> ArmingCost | None:
    """What running armed cost the current run's steps (None: no armed step, or too few to say)."""
    if not runs.armed_iterations:
        return None
    its = list(table.column("iteration"))
    steps = list(table.column("step_time_ms"))
    armed = [(i, s) for i, s in zip(its, steps, strict=True)
             if steady.kinds.get(i) is Exclusion.ARMED and s is not None]
    first = min((i for i, _ in armed), default=None)
    values = [s for _, s in armed]
    ref = runs.reference or last_unarmed(runs.earlier)
    if ref is not None:
        got = against_run(values, first, run, ref)
        if got is not None:
            return got
    own = [s for i, s in zip(its, steps, strict=True) if steady.steady.get(i) and s is not None]
    if len(values) >= MIN_STEPS and len(own) >= MIN_STEPS:  # armed later in the same run
        return ArmingCost(ArmingBasis.EARLIER_STEPS, (), statistics.median(values), statistics.median(own),
                          len(values), len(own), first, run, run)
    return None


def goodput_costs(iterations: Iterable[int], armed: Sequence[int], arming: ArmingCost | None,
                  incidents: Sequence[Incident], disturbances: Sequence[Incident]
                  ) -> tuple[float | None, float | None, float | None]:
    """What goodput takes out of the run's own time (perfd.analytics.steps.goodput.job_goodput): the
    incidents' cost outside the armed steps, inside them, and perfd's captures' excess (their stretches
    and their part inside incidents). With an arming reference, an armed step's excess over it is
    perfd's whole, a capture inside it included: only the stretches outside the armed steps count apart,
    and an incident among them comes out of that excess (``armed``: per row of ``iterations``, 1 armed)."""
    its = {i for i, a in zip(iterations, armed, strict=True) if a} if arming is not None else set()

    def among(i: Incident) -> bool:
        return bool(its.intersection(range(i.first_iteration, i.last_iteration + 1)))

    outside = [i for i in incidents if not among(i)]
    captures = CaptureDisturbances.of([d for d in disturbances if not among(d)]).excess_s
    profiling = sum(c for c in (captures, *(i.capture_cost_s for i in outside)) if c)
    return incidents_cost_s(outside), incidents_cost_s([i for i in incidents if among(i)]), profiling

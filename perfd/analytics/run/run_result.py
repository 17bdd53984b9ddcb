"""What a run's analysis is (:class:`RunAnalysis`, built by perfd.analytics.run.run_analysis) and the
digest an earlier run leaves of it (perfd.analytics.run.runs.RunDigest). Apart from the builder so
that the run's findings and its runs read the type without importing what builds it. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics.advice.plan import Plan
from perfd.analytics.advice.remedies import JobConfig
from perfd.analytics.breakdown.bottleneck import BottleneckClass
from perfd.analytics.breakdown.capture_match import CaptureMatch
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.analytics.incidents.detect import Incident
from perfd.analytics.run.run_summary import (
    JobBlock,
    RunSummary,
)
from perfd.analytics.run.runs import CaptureSteps, FiguresFrom, RunDigest
from perfd.analytics.steps.flops import FlopsResult, MfuConvention
from perfd.analytics.steps.gpus import PeakResult
from perfd.analytics.steps.iteration import IterationResult, json_value
from perfd.analytics.steps.iteration_table import Table
from perfd.analytics.steps.steady import Exclusion, SteadyState
from perfd.analytics.steps.stragglers import (
    PersistentStragglers,
)


@dataclass
class RunAnalysis:
    """Everything analyze_run found: job block, iterations, summary, findings, recommendations."""

    job: JobBlock
    iterations: Table[IterationResult]  # a row is built when read: see iteration_table
    summary: RunSummary
    # the run's own (ordered among themselves): the report adds the incidents' and orders all again
    # (perfd.report.training_report.build_report)
    findings: list[Finding]
    recommendations: list[Recommendation]
    steady: SteadyState
    stragglers: PersistentStragglers
    flops: FlopsResult
    peak: PeakResult
    incidents: list[Incident] = field(default_factory=list)
    config: JobConfig | None = None  # what the job runs with, for the remedies (findings.job_config)
    plan: Plan | None = None  # the remedies as a plan (perfd.analytics.advice.plan), with a capture
    # Whether the capture the analysis read (its timeline) is of this job (None: no capture read)
    capture_match: CaptureMatch | None = None
    # How its model FLOPs were counted: the MFU's typed provenance (None: no count)
    mfu_convention: MfuConvention | None = None

    def steady_iterations(self) -> list[IterationResult]:
        """Every steady iteration's row, built at once: for short runs (tests); a long run's
        readers take ``values``, ``steady_values`` or ``steady_rows``."""
        return list(self.steady_rows())

    def steady_rows(self, newest_first: bool = False) -> Iterator[IterationResult]:
        """The steady iterations' rows, built one at a time."""
        flags = list(self.iterations.column("steady_state"))
        order = range(len(flags) - 1, -1, -1) if newest_first else range(len(flags))
        return (self.iterations[i] for i in order if flags[i])

    def values(self, name: str) -> Iterator[Any]:
        """One per-iteration field over every iteration, in order, without building rows."""
        return self.iterations.column(name)

    def steady_values(self, name: str) -> Iterator[Any]:
        """One per-iteration field over the steady iterations, without building rows."""
        return (v for v, s in zip(self.values(name), self.values("steady_state"), strict=True) if s)

    def run_seconds(self) -> float:
        """The run's logged time: the sum of its step times."""
        return float(sum(s for s in self.values("step_time_ms") if s is not None)) / 1e3

    def to_json(self) -> dict[str, Any]:
        """Keys: job, summary (and capture_match, where a capture was read against the job:
        perfd.analytics.breakdown.capture_match). The iterations' rows, their legend, the incidents
        and the report are made where they are shown, in English (perfd.report.row_json.run_json,
        perfd.report.analysis_json)."""
        out = {
            "job": json_value(self.job.to_json()),
            "summary": json_value(self.summary.to_json()),
        }
        if self.capture_match is not None:  # a capture was read against the job: whether it is its
            out["capture_match"] = json_value(self.capture_match.to_json())
        return out


def digest(a: RunAnalysis, run: int) -> RunDigest:
    """The digest of run ``run`` from its analysis (its figures its own, or, for an armed run, what
    its analysis reported: the earlier run's, which that run's digest already holds)."""
    its = list(a.values("iteration"))
    steps = list(a.values("step_time_ms"))
    ends = list(a.values("end_time"))
    s = a.summary
    own = a.summary.runs.figures is FiguresFrom.CURRENT
    steady_steps = [v for v in a.steady_values("step_time_ms") if v is not None]
    kinds = a.steady.kinds
    armed_steps = [v for i, v in zip(its, steps, strict=True)
                   if kinds.get(i) is Exclusion.ARMED and v is not None]
    starts = [e - st / 1e3 for e, st in zip(ends, steps, strict=True) if e is not None and st is not None]
    gp = s.goodput
    captures = []
    for d in s.capture_disturbances.stretches:
        inside = [v for i, v in zip(its, steps, strict=True)
                  if d.first_iteration <= i <= d.last_iteration and v is not None]
        captures.append(CaptureSteps(first_iteration=d.first_iteration, last_iteration=d.last_iteration,
                                     step_ms=statistics.fmean(inside) if inside else None))
    armed = any(a.values("armed"))
    return RunDigest(
        run=run, first_iteration=min(its) if its else 0, last_iteration=max(its) if its else 0,
        start_time=min(starts) if starts else None,
        end_time=gp.end_time if gp is not None else (max((e for e in ends if e is not None), default=None)),
        resumed=bool(its) and min(its) > 1, armed=armed, n_iterations=len(its),
        n_steady=s.n_steady if own else 0,
        step_time_ms=s.median("step_time_ms") if own else None,
        step_median_ms=statistics.median(steady_steps) if steady_steps and own else None,
        armed_median_ms=statistics.median(armed_steps) if armed_steps else None, n_armed=len(armed_steps),
        mfu=s.median("mfu") if own else None,
        bottleneck=s.bottleneck.cls if own else BottleneckClass.UNKNOWN,
        bottleneck_of=s.bottleneck if own else None,
        step_time_cv=s.step_time_cv if own else None,
        medians=dict(s.medians) if own else {}, step_budget=s.step_budget if own else None,
        captures=tuple(captures), goodput=gp)

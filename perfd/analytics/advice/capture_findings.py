"""Findings from a capture's per-device breakdown (nsys or Kineto), as pure functions.

Input is a capture's device breakdowns (perfd.analytics.breakdown.device_breakdown: span, busy, idle,
NCCL, SendRecv, the kernel categories and the exclusive ``parts_ms`` of the step budget), optionally
with what the job says (framework, model FLOPs, the steady state's timers, how many iterations the
capture covered). Each
device's time becomes a step budget (perfd.analytics.breakdown.budget); its analyzers
(perfd.analytics.advice.budget_findings) give the findings, the remedies with their expected gain, and the
class — a capture that holds kernels always votes: a class with its shares, or "mixed". Beside the
budget, one question of the capture's own: did the kernels run slower than in steady state (the
incident evidence reads ``slowdown``; the finding is a kind and its numbers, :class:`SlowerFinding`,
worded where it is shown: perfd.report.finding_text).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from perfd.analytics.advice.budget_findings import BudgetContext, analyze
from perfd.analytics.advice.remedies import Framework, JobConfig
from perfd.analytics.breakdown.bottleneck import BottleneckClass, ClassBasis
from perfd.analytics.breakdown.budget import (
    MIXED,
    NO_FLOPS,
    NO_TIMERS,
    FlopsContext,
    StepBudget,
    TimerShares,
    classify,
)
from perfd.analytics.breakdown.capture_budget import from_capture
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.analytics.common import BACKWARD_COMPUTE, FORWARD_COMPUTE
from perfd.analytics.finding_types import Finding, Recommendation, Severity
from perfd.core.model import StepRecord
from perfd.core.record_json import unwritten

SLOWER_THAN_STEADY = 1.3  # kernel time per captured iteration ÷ the job's steady compute


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowerFacts:
    """A device's kernels ran slower while captured than in steady state: its compute kernel time per
    captured iteration, the job's steady forward+backward compute per iteration (timers), their ratio."""

    device: int
    per_iteration_ms: float
    steady_ms: float
    ratio: float


@dataclass
class SlowerFinding(Finding):
    """The capture's slower-than-steady finding, its title and observation left to the report."""

    facts: SlowerFacts | None = field(default=None, metadata=unwritten())


@dataclass
class CaptureDiagnosis:
    findings: list[Finding] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    bottleneck: BottleneckClass = BottleneckClass.UNKNOWN
    basis: ClassBasis = field(default_factory=ClassBasis)  # why that class (no device: none decided)
    # device -> compute kernel time per captured iteration ÷ the job's steady compute, where that is
    # at least SLOWER_THAN_STEADY (typed: an incident's evidence reads this, not the finding's text)
    slowdown: dict[int, float] = field(default_factory=dict)
    budgets: dict[int, StepBudget] = field(default_factory=dict)  # device -> its step budget
    class_shares: dict[str, float] = field(default_factory=dict)  # of the device that decided

    def to_json(self) -> dict[str, object]:
        return {"findings": [f.to_json() for f in self.findings],
                "recommendations": [r.to_json() for r in self.recommendations],
                "bottleneck": self.bottleneck.value,  # its reason: perfd.report.capture_text
                "slowdown": {str(k): v for k, v in self.slowdown.items()},
                "budgets": {str(k): b.to_json() for k, b in self.budgets.items()},
                "class_shares": dict(self.class_shares)}


COMPUTE_TIMERS = (FORWARD_COMPUTE, BACKWARD_COMPUTE)  # Megatron timers: the rank's model compute


def steady_compute_ms(records: Sequence[StepRecord], steady: Iterable[int], rank: int | None = None
                      ) -> float | None:
    """Median forward+backward compute per steady iteration (Megatron timers, ms): of ``rank``
    where the timers are per rank, else the slowest rank's. None without both timers."""
    want = set(steady)
    vals = []
    for r in records:
        if r.iteration not in want:
            continue
        parts = []
        for name in COMPUTE_TIMERS:
            tv = r.timers.get(name)
            v = (tv.per_rank.get(rank) if tv is not None and rank is not None and tv.per_rank else None)
            if v is None and tv is not None:
                v = tv.max_ms
            parts.append(v)
        if all(p is not None for p in parts):
            vals.append(sum(p for p in parts if p is not None))
    return statistics.median(vals) if vals else None


def _slower(out: CaptureDiagnosis, d: int, dev: DeviceBreakdown, label: str, iterations: int | None,
            steady_ms: float | None) -> None:
    compute = dev.compute_ms
    if not (iterations and steady_ms and compute):
        return
    per_it = compute / iterations
    ratio = per_it / steady_ms
    if ratio < SLOWER_THAN_STEADY:
        return
    out.slowdown[d] = ratio
    out.findings.append(SlowerFinding(
        f"capture-slower-than-steady-{d}", Severity.WARNING, "", "",
        {"device": d, "compute_ms_per_iteration": per_it, "steady_compute_ms": steady_ms, "ratio": ratio},
        label, "",  # its source (the timeline against the timers), as its title, where it is worded
        facts=SlowerFacts(device=d, per_iteration_ms=per_it, steady_ms=steady_ms, ratio=ratio)))


def diagnose_capture(devices: Sequence[DeviceBreakdown], *, label: str = "capture",
                     iterations: int | None = None, steady_compute_ms: float | None = None,
                     framework: Framework = Framework.PYTORCH, flops: FlopsContext = NO_FLOPS,
                     timers: TimerShares = NO_TIMERS, config: JobConfig | None = None) -> CaptureDiagnosis:
    """Findings for each device of one capture. ``iterations``: how many training iterations the
    capture covered (the budget is per step; None: per captured span); ``steady_compute_ms``: the
    job's steady forward+backward compute per iteration (timers) — together they say whether kernels
    ran slower than usual while captured. ``framework``, ``flops``, ``timers``: the job's, for the
    remedies, the waterfall's first steps and the data wait; ``config``: what the job runs with (the
    remedies fit it). A device whose trace marks its steps is divided by those, not ``iterations``."""
    out = CaptureDiagnosis()
    decided: tuple[float, BottleneckClass, ClassBasis, dict[str, float]] | None = None
    for dev in devices:
        d = dev.device
        where = f"{label}, device {d}" if len(devices) > 1 else label
        marked = dev.trace_steps
        by_trace = marked is not None and marked > 0
        steps = marked if by_trace else iterations
        how = "trace" if by_trace else "request" if steps else ""
        b = from_capture(dev, steps, fl=flops, timers=timers, basis=where, steps_from=how)
        if b is None:
            continue
        out.budgets[d] = b
        fs, rs = analyze(BudgetContext(b, framework, where, config=config))
        out.findings += [dataclasses.replace(f, id=f"{f.id}-{d}") for f in fs]
        out.recommendations += [dataclasses.replace(r, finding_id=f"{r.finding_id}-{d}") for r in rs]
        # The class is the timeline's own (no timer moves its long gaps to "data"): the same trace
        # gives the same class live, after the job and offline, whatever the timers said meanwhile.
        own = from_capture(dev, steps, basis=where) if timers.data else b
        c = classify(own) if own is not None else None
        if c is not None:
            top = max(c.shares.values())
            if decided is None or top > decided[0]:
                decided = (top, c.cls, ClassBasis(decided=c, where=where), c.shares_json())
        _slower(out, d, dev, label, steps, steady_compute_ms)
    if decided is not None:
        _top, out.bottleneck, out.basis, out.class_shares = decided
    elif devices:
        out.basis = ClassBasis(where=label, devices=True)
    out.recommendations.sort(key=lambda r: -(r.impact or 0.0))
    for i, rec in enumerate(out.recommendations, start=1):
        rec.priority, rec.id = i, f"C{i}"
    return out


__all__ = ["MIXED", "CaptureDiagnosis", "ClassBasis", "SlowerFacts", "SlowerFinding", "diagnose_capture",
           "steady_compute_ms"]

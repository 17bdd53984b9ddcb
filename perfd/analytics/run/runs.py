"""Runs of a job: a restart — from iteration 1, or resumed from a checkpoint —
begins a new run, and every figure belongs to one run.

A job's analysis is the analysis of its current run; each earlier run leaves a compact, typed
:class:`RunDigest` (its iterations and time span, steady step, MFU, class, whether it ran armed, its
captures' steps, and the job's goodput up to its end) so that later comparisons keep a reference
after its records are gone: the arming cost of a run under ncu (against the previous unarmed run),
the figures of a job whose current run is all armed (those of its last unarmed run, said so), the
job's goodput over every run (each restart counted, the time between runs as restart).

The live aggregator digests a run when a new one replaces its records (perfd/aggregator/jobs.py);
``perfd analyze megatron`` on a log holding several runs does the same as it reads (:class:`RunsBuilder`
segments the records where the framework's start-up output begins a run), so both give the same
per-run answer. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from perfd.analytics.breakdown.bottleneck import Bottleneck, BottleneckClass
from perfd.analytics.steps.goodput import Goodput
from perfd.core.model import StepRecord
from perfd.core.record_json import JsonWritten

if TYPE_CHECKING:
    from perfd.analytics.breakdown.budget import StepBudget

MAX_DIGESTS = 32  # earlier runs a job keeps digests of (the goodput carried covers every run anyway)


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureSteps(JsonWritten):
    """One stretch of a run's iterations a perfd capture disturbed, and their mean logged step."""

    first_iteration: int
    last_iteration: int
    step_ms: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunDigest:
    """What a run of the job leaves once its records are replaced: enough to compare a later run with
    it, and the job's goodput up to its end (``goodput``: cumulative over this run and every earlier
    one)."""

    run: int  # 1-based, in the order the job ran them
    first_iteration: int
    last_iteration: int
    start_time: float | None  # its first step's start, epoch s
    end_time: float | None  # its last step's end (and its final save)
    resumed: bool  # it began past iteration 1: resumed from a checkpoint
    armed: bool  # its steps ran on a rank armed for a capture (perfd.core.armed)
    n_iterations: int
    n_steady: int
    step_time_ms: float | None  # the steady steps' mean (the summary's step time)
    step_median_ms: float | None  # ... their median (the arming's reference)
    armed_median_ms: float | None = None  # the armed steps' median (those that would be steady)
    n_armed: int = 0
    mfu: float | None = None
    bottleneck: BottleneckClass = BottleneckClass.UNKNOWN
    # its class with why (its votes), None where its figures are not its own; said where its JSON is
    # served ("bottleneck_reason" after "bottleneck": perfd.report.finding_text.runs_json)
    bottleneck_of: Bottleneck | None = None
    step_time_cv: float | None = None
    # the summary's steady values (catalog attribute -> value): a later armed run reports these
    medians: Mapping[str, float | None] = field(default_factory=dict)
    step_budget: StepBudget | None = None
    captures: tuple[CaptureSteps, ...] = ()
    goodput: Goodput | None = None

    def to_json(self) -> dict[str, object]:
        return {"run": self.run, "first_iteration": self.first_iteration,
                "last_iteration": self.last_iteration,
                "start_time": self.start_time, "end_time": self.end_time, "resumed": self.resumed,
                "armed": self.armed, "n_iterations": self.n_iterations, "n_steady": self.n_steady,
                "step_time_ms": self.step_time_ms, "step_median_ms": self.step_median_ms,
                "armed_median_ms": self.armed_median_ms, "n_armed": self.n_armed, "mfu": self.mfu,
                "bottleneck": self.bottleneck.value,
                "step_time_cv": self.step_time_cv,
                "captures": [c.to_json() for c in self.captures]}

    def capture_median_ms(self) -> float | None:
        """The median of its captures' mean steps (a reference where its steady steps are too few)."""
        steps = [c.step_ms for c in self.captures if c.step_ms is not None]
        return statistics.median(steps) if steps else None


class FiguresFrom(str, Enum):
    """Whose steps the job's figures (MFU, step time, jitter, class, budget) are."""

    CURRENT = "current"  # the current run's steady steps
    EARLIER_UNARMED = "earlier_unarmed"  # every step of the current run is armed: its last unarmed run's
    NONE = "none"  # every step of the current run is armed and no earlier run ran unarmed


@dataclass(frozen=True, slots=True, kw_only=True)
class Runs:
    """The job's runs as its analysis reads them: which run is current, whose figures it reports, the
    earlier runs' digests."""

    current: int = 1
    earlier: tuple[RunDigest, ...] = ()
    figures: FiguresFrom = FiguresFrom.CURRENT
    figures_run: int | None = 1  # the run the figures are of (None: none)
    armed_iterations: int = 0  # the current run's armed iterations

    @property
    def reference(self) -> RunDigest | None:
        """The digest the figures come from when they are not the current run's."""
        return next((d for d in self.earlier if d.run == self.figures_run), None) \
            if self.figures is FiguresFrom.EARLIER_UNARMED else None

    @property
    def elsewhere(self) -> bool:
        """The job's figures are not the current run's: an earlier run's (its digest kept), or none; why
        is said where shown (perfd.report.finding_text.runs_text)."""
        return (self.figures is FiguresFrom.EARLIER_UNARMED and self.reference is not None) \
            or self.figures is FiguresFrom.NONE

    def to_json(self) -> dict[str, object]:
        """Its JSON but why the figures are not the current run's ("why", between "armed_iterations" and
        "earlier" where served: perfd.report.finding_text.runs_json)."""
        return {"current": self.current, "figures_from": self.figures.value, "figures_run": self.figures_run,
                "armed_iterations": self.armed_iterations, "earlier": [d.to_json() for d in self.earlier]}


def last_unarmed(earlier: Sequence[RunDigest]) -> RunDigest | None:
    """The latest earlier run with steady steps of its own (not armed)."""
    return next((d for d in reversed(earlier) if not d.armed and d.n_steady > 0), None)


def split_runs(records: Sequence[StepRecord]) -> list[list[StepRecord]]:
    """The records, in the order given, cut where a run begins: a record marked ``first_of_run``
    after others (the framework's start-up output came before it: a restart appended to the same
    log). Always at least one list (empty for no records)."""
    out: list[list[StepRecord]] = [[]]
    for rec in records:
        if rec.first_of_run and out[-1]:
            out.append([])
        out[-1].append(rec)
    return out

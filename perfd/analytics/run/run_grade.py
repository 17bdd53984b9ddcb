"""A run's MFU grade and what explains it (docs/design.md §2 "MFU"): the band an MFU falls in, and
the band explained with the job's own measurements — never its usual causes where the same report
measured them small; and what the run's MFU finding says, as a kind and its numbers (:class:`MfuFacts`).
The grades themselves (bands, severities) are the one registry's
(perfd.analytics.breakdown.advice_registry.GRADES); their words, and the MFU finding's, are the
report's (perfd.report.grade_text). Pure."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.advice.remedies import Framework
from perfd.analytics.breakdown.advice_registry import BANDS, GRADE, Grade, GradeBasis
from perfd.analytics.breakdown.bottleneck import BudgetClass
from perfd.analytics.breakdown.budget import StepBudget, classify
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.analytics.run.runs import Runs
from perfd.analytics.steps.flops import MfuConvention
from perfd.analytics.steps.provenance import Cited
from perfd.analytics.steps.untimed import Untimed
from perfd.core.record_json import unwritten


def grade_mfu(mfu: float | None, steady_steps: int | None = None) -> Grade:
    """The first band whose upper bound the MFU is under (GRADES: <0.30 severe, [0.30, 0.40)
    communication-overhead, [0.40, 0.50] good, > 0.50 excellent); None -> unknown; above 100%
    (th.MFU_POSSIBLE) never graded: the peak is wrong. An MFU over ``steady_steps`` fewer than
    th.MIN_GRADE_STEPS is in no band (ungraded): its median is one or two steps' value."""
    if mfu is None:
        return Grade.UNKNOWN
    if mfu > th.MFU_POSSIBLE.value:
        return Grade.IMPOSSIBLE
    if steady_steps is not None and steady_steps < th.MIN_GRADE_STEPS.value:
        return Grade.UNGRADED
    for g in BANDS:
        if g.below is None or mfu < g.below.value or (g.inclusive and mfu == g.below.value):
            return g.grade
    raise AssertionError("the last band has no upper bound")  # BANDS ends with one (the registry's)


@dataclass(frozen=True, slots=True, kw_only=True)
class GradeExplanation:
    """A grade with what explains it (:func:`explain_grade`); perfd.report.grade_text says it."""

    grade: Grade
    basis: GradeBasis
    budget_class: BudgetClass | None = None  # the class a capture's budget supports (BUDGET)
    data_share: float | None = None
    comm_share: float | None = None
    small_data: bool = False  # the data wait measured below th.DATA_HEALTHY_SHARE
    small_comm: bool = False  # exposed communication below a third of th.COMM_BOUND_SHARE
    untimed: Untimed = ()  # collectives the timers cannot see: communication is never ruled out then


def explain_grade(mfu: float | None, data: float | None, comm: float | None,
                  budget_class: BudgetClass | None = None, untimed: Untimed = (),
                  world_size: int | None = None) -> GradeExplanation:
    """The grade said with this job's own measurements: never its band's usual causes where the same
    report measured them small. ``budget_class``: the class a capture's step budget supports.
    ``untimed``: the groups whose collectives the timers cannot see (perfd.analytics.steps.untimed):
    communication is then never ruled out. Which measurements may explain a band is its registry
    entry's ``explained_by``. A job of one rank (``world_size``) exposes no communication, timed or not
    (a one-GPU loop under the step hook, which times none: its 30–40% band is not communication)."""
    if comm is None and world_size == 1:
        comm = 0.0
    grade = grade_mfu(mfu)
    plain = GradeExplanation(grade=grade, basis=GradeBasis.BAND)
    by = GRADE[grade].explained_by
    if by is None:
        return plain
    if budget_class is not None:  # a capture divided the step: the budget, not the band's usual suspects
        return GradeExplanation(grade=grade, basis=GradeBasis.BUDGET, budget_class=budget_class)
    small_data = data is not None and data < th.DATA_HEALTHY_SHARE.value
    small_comm = comm is not None and comm < th.COMM_BOUND_SHARE.value / 3 and not untimed
    if by is GradeBasis.NOT_COMMUNICATION:
        return (GradeExplanation(grade=grade, basis=GradeBasis.NOT_COMMUNICATION, comm_share=comm,
                                 small_comm=True) if small_comm else plain)
    if not (small_data or small_comm):
        return plain
    return GradeExplanation(grade=grade, basis=GradeBasis.RULED_OUT, data_share=data, comm_share=comm,
                            small_data=small_data, small_comm=small_comm, untimed=untimed)


def budget_class(b: StepBudget | None) -> BudgetClass | None:
    """The class a capture's budget supports, with every class's share (None without a capture)."""
    return classify(b) if b is not None else None


class MfuSaid(enum.Enum):
    """What the run's MFU finding says: why there is no MFU, that too few steps give no grade, or the
    grade."""

    QUOTED = "quoted"  # absent: the first iteration's MFU source says why (MfuFacts.quoted)
    UNKNOWN = "unknown"  # absent, and the iterations say no more
    NO_ITERATIONS = "no-iterations"
    RUNS = "runs"  # absent: the figures are no run's (MfuFacts.runs says why)
    EARLIER_RUN = "earlier-run"  # absent: the figures are an earlier run's, whose digest holds no MFU
    TOO_FEW_STEPS = "too-few-steps"
    GRADED = "graded"


@dataclass(frozen=True, slots=True, kw_only=True)
class MfuFacts:
    """The MFU finding's kind and numbers; the words are made where it is shown."""

    said: MfuSaid
    mfu: float | None = None
    quoted: Cited | None = None  # QUOTED
    runs: Runs | None = None  # RUNS, EARLIER_RUN: the job's runs (which is current, whose the figures)
    n_steady: int = 0  # TOO_FEW_STEPS
    # GRADED: the throughput, the peak it is divided by, the measured matmul ceiling (share and TFLOP/s)
    tflops: float | None = None
    peak_tflops: float | None = None
    gpu_model: str | None = None
    dtype: str | None = None
    of_ceiling: float | None = None
    ceiling_tflops: float | None = None
    explanation: GradeExplanation | None = None
    convention: MfuConvention | None = None  # how the model FLOPs were counted (its typed provenance)
    # the framework's own throughput figure where its log states one (Megatron-LM's TFLOP/s per GPU)
    logged_tflops: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CrosscheckFacts:
    """The check of perfd's throughput (the MFU's numerator) against the framework's logged figure over
    the steady iterations: how many were checked, how many disagree, the largest gap, the two medians,
    the FLOPs formula and the framework whose log gave the figure."""

    n_checked: int
    n_disagree: int
    max_gap: float | None
    tflops: float | None
    logged_tflops: float | None
    formula: str | None
    framework: Framework = Framework.MEGATRON

    @property
    def agrees(self) -> bool:
        return self.n_disagree == 0


@dataclass
class MfuFinding(Finding):
    """One of the run's MFU findings (its grade, or the check of its throughput) with its title and
    observation left to the report (perfd.report.grade_text words them from ``facts``)."""

    facts: MfuFacts | CrosscheckFacts | None = field(default=None, metadata=unwritten())


@dataclass
class CrosscheckRecommendation(Recommendation):
    """What to check where the throughput disagrees, its action and detail left to the report."""

    facts: CrosscheckFacts | None = field(default=None, metadata=unwritten())

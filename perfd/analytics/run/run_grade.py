"""A run's MFU grade and what explains it (docs/design.md §2 "MFU"): the band an MFU falls in,
its text, and the band said with the job's own measurements — never its usual causes where the same
report measured them small. The grades themselves (bands, texts, labels, severities) are the one
registry's (perfd.analytics.breakdown.advice_registry.GRADES); this reads them. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from perfd.analytics import thresholds as th
from perfd.analytics.advice import budget_findings
from perfd.analytics.breakdown.advice_registry import BANDS, GRADE, Grade, GradeBasis
from perfd.analytics.breakdown.budget import StepBudget, classify
from perfd.analytics.steps.untimed import Untimed, untimed_text


def grade_mfu(mfu: float | None) -> tuple[Grade, str]:
    """(grade, text): the first band whose upper bound the MFU is under (GRADES: <0.30 severe,
    [0.30, 0.40) communication-overhead, [0.40, 0.50] good, > 0.50 excellent); None -> unknown; above
    100% (th.MFU_POSSIBLE) never graded: the peak is wrong."""
    if mfu is None:
        return Grade.UNKNOWN, GRADE[Grade.UNKNOWN].text
    if mfu > th.MFU_POSSIBLE.value:
        return Grade.IMPOSSIBLE, GRADE[Grade.IMPOSSIBLE].text
    for g in BANDS:
        if g.below is None or mfu < g.below.value or (g.inclusive and mfu == g.below.value):
            return g.grade, g.text
    raise AssertionError("the last band has no upper bound")  # BANDS ends with one (the registry's)


def grade_mfu_text(grade: Grade) -> str:
    """A grade's own text."""
    return GRADE[grade].text


def grade_label(grade: Grade) -> str:
    """How a headline shows a grade (the registry's GradeEntry.label, else its name)."""
    return GRADE[grade].shown


@dataclass(frozen=True, slots=True, kw_only=True)
class GradeExplanation:
    """A grade with what explains it (:func:`explain_grade`); ``text`` says it."""

    grade: Grade
    basis: GradeBasis
    budget_class: str | None = None  # the capture's budget class text (BUDGET)
    data_share: float | None = None
    comm_share: float | None = None
    small_data: bool = False  # the data wait measured below th.DATA_HEALTHY_SHARE
    small_comm: bool = False  # exposed communication below a third of th.COMM_BOUND_SHARE
    untimed: Untimed = ()  # collectives the timers cannot see: communication is never ruled out then

    def text(self) -> str:
        band = GRADE[self.grade].band
        if self.basis is GradeBasis.BAND or band is None:
            return grade_mfu_text(self.grade)
        if self.basis is GradeBasis.BUDGET:
            return f"{band}: the step budget shows where the time goes — {self.budget_class}"
        if self.basis is GradeBasis.NOT_COMMUNICATION:
            return (f"{band}: a band usually due to communication overhead — not here: exposed communication "
                    f"{self.comm_share:.1%} of the step; the bottleneck class says where the time goes")
        data, comm = self.data_share, self.comm_share
        ruled = [f"data loading ({data:.1%})" if self.small_data else "",
                 f"exposed communication ({comm:.1%})" if self.small_comm else ""]
        unknown = "" if data is not None and comm is not None else (
            "; exposed communication is not timed" if comm is None else "; the data wait is not timed")
        if self.untimed and comm is not None:
            unknown += (f"; exposed communication {comm:.1%} is the timed collectives' only (DP gradient "
                        f"sync); {untimed_text(self.untimed)}")
        return (f"{band}: severe — not {' nor '.join(r for r in ruled if r)} here{unknown}: the bottleneck "
                "class says where the time goes")


def explain_grade(mfu: float | None, data: float | None, comm: float | None,
                  budget_class: str | None = None, untimed: Untimed = ()) -> GradeExplanation:
    """The grade said with this job's own measurements: never its band's usual causes where the same
    report measured them small. ``budget_class``: what a capture's step budget says (its class text).
    ``untimed``: the groups whose collectives the timers cannot see (perfd.analytics.steps.untimed):
    communication is then never ruled out. Which measurements may explain a band is its registry
    entry's ``explained_by``."""
    grade, _ = grade_mfu(mfu)
    plain = GradeExplanation(grade=grade, basis=GradeBasis.BAND)
    by = GRADE[grade].explained_by
    if by is None:
        return plain
    if budget_class:  # a capture divided the step: the budget, not the band's usual suspects
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


def budget_class_text(b: StepBudget | None) -> str | None:
    """The class a capture's budget supports, as text (None without a capture)."""
    c = classify(b) if b is not None else None
    return budget_findings.class_text(c) if c is not None else None

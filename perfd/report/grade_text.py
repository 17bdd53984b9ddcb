"""The MFU grades' words and the run's MFU finding as it reads: each grade's sentence, its
band's range and how a headline shows it, declared once here for the registry's grades
(perfd.analytics.breakdown.advice_registry.GRADES); a grade explained with the job's own measurements
(perfd.analytics.run.run_grade.GradeExplanation); the MFU finding's title and observation from its
kind and numbers (perfd.analytics.run.run_grade.MfuFacts), and the check of the MFU's throughput
against the logged one, its finding and its recommendation (CrosscheckFacts). Pure."""

from __future__ import annotations

import dataclasses

from perfd.analytics.advice.remedies import Framework
from perfd.analytics.breakdown.advice_registry import Grade, GradeBasis
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.analytics.run.run_grade import (
    CrosscheckFacts,
    CrosscheckRecommendation,
    GradeExplanation,
    MfuFacts,
    MfuFinding,
    MfuSaid,
)
from perfd.analytics.steps.flops import MfuConvention
from perfd.report.bottleneck_text import too_few, untimed_text
from perfd.report.budget_text import class_text
from perfd.report.finding_text import runs_text, span_text, worded_run, worded_run_recommendation
from perfd.report.provenance_text import line
from perfd.report.remedy_text import worded_remedies, worded_remedy
from perfd.report.units import tflops

# A grade's own sentence.
GRADE_TEXT: dict[Grade, str] = {
    Grade.SEVERE: "MFU < 30%: severe (usually communication or data loading)",
    Grade.COMMUNICATION_OVERHEAD: "MFU 30–40%: communication overhead",
    Grade.GOOD: "MFU 40–50%: good",
    Grade.EXCELLENT: "MFU > 50%: excellent",
    Grade.IMPOSSIBLE: "MFU above 100% is impossible: the peak it is measured against is wrong (a --dtype, "
                      "--gpu or --peak-tflops that is not the job's)",
    Grade.UNGRADED: "MFU not graded: too few steady steps",
    Grade.UNKNOWN: "MFU unknown",
}
# A band's MFU range (the registry's bands: GradeEntry.band).
BAND_TEXT: dict[Grade, str] = {
    Grade.SEVERE: "MFU < 30%",
    Grade.COMMUNICATION_OVERHEAD: "MFU 30–40%",
    Grade.GOOD: "MFU 40–50%",
    Grade.EXCELLENT: "MFU > 50%",
}
# How a headline shows a grade where its name would not do: a band named for its usual cause would read
# as this job's cause beside the MFU, which the class states.
LABEL: dict[Grade, str] = {
    Grade.COMMUNICATION_OVERHEAD: "fair",
    Grade.IMPOSSIBLE: "above 100%: the peak is wrong",
    Grade.UNGRADED: "not graded",
}


def grade_label(grade: Grade) -> str:
    """How a headline shows a grade: its label, else its name."""
    return LABEL.get(grade, grade.value)


def status_label(status: str) -> str:
    """How a report's status shows beside its headline (the HTML badge, the text's status line): a
    grade as the headline shows it (grade_label: on a one-GPU job the 30–40% band's name would say
    communication), any other status (a serving report's) as it is."""
    try:
        return grade_label(Grade(status))
    except ValueError:
        return status


def ungraded_text(n_steady: int) -> str:
    """The status of an MFU from fewer steady steps than th.MIN_GRADE_STEPS (Grade.UNGRADED)."""
    return f"MFU not graded: {too_few(n_steady)}"


def explanation_text(e: GradeExplanation) -> str:
    """A grade said with the job's own measurements (perfd.analytics.run.run_grade.explain_grade)."""
    band = BAND_TEXT.get(e.grade)
    if e.basis is GradeBasis.BAND or band is None:
        return GRADE_TEXT[e.grade]
    if e.basis is GradeBasis.BUDGET and e.budget_class is not None:
        return f"{band}: the step budget shows where the time goes — {class_text(e.budget_class)}"
    if e.basis is GradeBasis.NOT_COMMUNICATION:
        return (f"{band}: a band usually due to communication overhead — not here: exposed communication "
                f"{e.comm_share:.1%} of the step; the bottleneck class says where the time goes")
    data, comm = e.data_share, e.comm_share
    ruled = [f"data loading ({data:.1%})" if e.small_data else "",
             f"exposed communication ({comm:.1%})" if e.small_comm else ""]
    unknown = "" if data is not None and comm is not None else (
        "; exposed communication is not timed" if comm is None else "; the data wait is not timed")
    if e.untimed and comm is not None:
        unknown += (f"; exposed communication {comm:.1%} is the timed collectives' only (DP gradient "
                    f"sync); {untimed_text(e.untimed)}")
    return (f"{band}: severe — not {' nor '.join(r for r in ruled if r)} here{unknown}: the bottleneck "
            "class says where the time goes")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _absent(f: MfuFacts) -> str:
    """Why there is no MFU, after "MFU "."""
    runs = f.runs
    if f.said is MfuSaid.QUOTED and f.quoted is not None:
        return line(f.quoted)
    if f.said is MfuSaid.RUNS and runs is not None:
        return runs_text(runs) or ""
    if f.said is MfuSaid.EARLIER_RUN and runs is not None and runs.reference is not None:
        ref = runs.reference.run
        return (f"absent: the figures are run {ref}'s (every step of run {runs.current} is armed), and run "
                f"{ref}'s digest holds no MFU (its GPU or its model FLOPs were unknown when its records were "
                "digested)")
    return "no iterations" if f.said is MfuSaid.NO_ITERATIONS else "unknown"


# How the model FLOPs an MFU divides were counted (perfd.analytics.steps.flops.MfuConvention).
_CAUSAL_HALF = ("6 per weight per token for every GEMM, the LM head's among them, plus core attention's "
                "QKᵀ and ·V with the causal mask counted at half")
MFU_CONVENTION_TEXT = {
    MfuConvention.CAUSAL_HALF: f"Model FLOPs by perfd's formula, Megatron-Core's since 0.12: {_CAUSAL_HALF}",
    MfuConvention.HOOK_CAUSAL_HALF: "Model FLOPs as the step hook counted them from its model=, by perfd's "
                                    f"formula, Megatron-Core's since 0.12: {_CAUSAL_HALF}",
    MfuConvention.ATTENTION_WHOLE: "Model FLOPs by perfd's formula with attention whole, as Megatron-Core "
                                   "up to 0.11 and torchtitan count: 6 per weight per token plus core "
                                   "attention's QKᵀ and ·V over the whole sequence",
    MfuConvention.SIX_N: "Model FLOPs 6·N·tokens, with no attention term",
    MfuConvention.STATED: "Model FLOPs as the training script states them (flops_per_step), by its own "
                          "convention",
    MfuConvention.LOGGED: "Model FLOPs per second as the framework logs them",
}


def convention_text(f: MfuFacts) -> str:
    """How the MFU's FLOPs were counted, and the framework's own figure beside it where its log states
    one ("" where neither is known)."""
    bits = [MFU_CONVENTION_TEXT[f.convention]] if f.convention is not None else []
    if f.logged_tflops is not None and f.convention is not MfuConvention.LOGGED:
        own = f" ({f.logged_tflops / f.peak_tflops:.1%} of the same peak)" if f.peak_tflops else ""
        bits.append(f"the log's own throughput {tflops(f.logged_tflops)} TFLOP/s per GPU{own}")
    text = "; ".join(bits)
    return text[:1].upper() + text[1:]


def mfu_words(f: MfuFacts) -> tuple[str, str]:
    """The MFU finding's title and observation."""
    if f.said is MfuSaid.TOO_FEW_STEPS:
        few = too_few(f.n_steady)
        return (f"MFU {_pct(f.mfu)}: {few}",
                f"Median MFU {_pct(f.mfu)} over {f.n_steady} steady step(s); {few}: no grade.")
    if f.said is MfuSaid.GRADED and f.explanation is not None:
        e = f.explanation
        ceiling = (f"; {_pct(f.of_ceiling)} of the measured {f.ceiling_tflops:g} TFLOP/s matmul ceiling"
                   if f.ceiling_tflops else "")
        # The title is a headline too: the band's label, never its usual cause as this job's (LABEL).
        how = convention_text(f)
        return (f"MFU {_pct(f.mfu)}: {grade_label(e.grade)}",
                f"Median MFU {_pct(f.mfu)} = {tflops(f.tflops)} TFLOP/s per GPU of {f.peak_tflops:g} peak "
                f"({f.gpu_model} {f.dtype}){ceiling}." + (f" {how}." if how else "")
                + f" {explanation_text(e)}.")
    return "MFU not available", f"MFU {_absent(f)}"


# Whose throughput figure the check compares perfd's with, and what in the model spec the check's
# recommendation asks to look at (the Megatron-Core version picks the attention formula of Megatron's
# jobs only: perfd.analytics.steps.flops.attention_formula).
LOGGED_BY: dict[Framework, str] = {Framework.MEGATRON: "Megatron's logged throughput",
                                   Framework.TORCHTITAN: "torchtitan's logged tflops"}
_SPEC_FIELDS = "vocab padding, GQA groups, SwiGLU, MoE"


def crosscheck_words(c: CrosscheckFacts) -> tuple[str, str]:
    """The throughput check's title and observation."""
    logged = LOGGED_BY.get(c.framework, "the logged throughput")
    return (f"perfd FLOPs agree with {logged}" if c.agrees else f"perfd FLOPs disagree with {logged}",
            f"{c.n_checked - c.n_disagree}/{c.n_checked} steady iterations within max(1%, log rounding); "
            f"largest gap {_pct(c.max_gap)}; median perfd {tflops(c.tflops, 2)} vs logged "
            f"{tflops(c.logged_tflops, 2)} TFLOP/s/GPU ({c.formula}).")


def worded(f: Finding) -> Finding:
    """A finding as shown, whoever made it: an MFU finding (perfd.analytics.run.run_grade.MfuFinding)
    with its words, the run's others, a capture's, the collectives' and ncu's (perfd.report.finding_text),
    the step budget's and the remedies' (perfd.report.remedy_text); one already worded as it is. The one
    wording step every finding passes before it is shown, served or kept. A run finding's steps
    (``steps``) are its ``iterations``."""
    if f.steps is not None:
        f = dataclasses.replace(f, iterations=span_text(f.steps), steps=None)
    if isinstance(f, MfuFinding) and f.facts is not None:
        title, observation = (mfu_words(f.facts) if isinstance(f.facts, MfuFacts)
                              else crosscheck_words(f.facts))
        return dataclasses.replace(f, title=title, observation=observation, facts=None)
    return worded_run(worded_remedies(f))


def worded_recommendation(r: Recommendation) -> Recommendation:
    """A recommendation as shown, whoever made it: the throughput check's with its action and detail, the
    run's others (perfd.report.finding_text), the remedies' (perfd.report.remedy_text); one already
    worded as it is."""
    if isinstance(r, CrosscheckRecommendation) and r.facts is not None:
        return dataclasses.replace(
            r, action=f"Check the model spec perfd read ({_SPEC_FIELDS}"
                      + (", Megatron-Core version)" if r.facts.framework is Framework.MEGATRON else ")"),
            detail=f"largest gap {_pct(r.facts.max_gap)} on {r.facts.n_disagree} iterations", facts=None)
    return worded_run_recommendation(worded_remedy(r))


def worded_all(findings: list[Finding], recs: list[Recommendation]
               ) -> tuple[list[Finding], list[Recommendation]]:
    """Every finding and recommendation of a list worded (a capture's diagnosis, a run's)."""
    return [worded(f) for f in findings], [worded_recommendation(r) for r in recs]

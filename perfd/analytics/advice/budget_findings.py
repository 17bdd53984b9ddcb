"""Findings and remedies from a step's time budget (perfd.analytics.breakdown.budget): what each part holds,
by the ops that issued its kernels, and the remedies perfd.analytics.advice.remedies fits to the job's own
configuration, each a recommendation with its basis, its needs, its cost and a gain range. Pure, and
no English: the findings and recommendations carry typed facts (BudgetFinding, SmallerRemedies,
RemedyRecommendation), worded where shown (perfd.report.budget_text, perfd.report.remedy_text). What
each part is called, what its finding opens with and whether its share alone is a warning are its entry
in the advice registry (perfd.analytics.breakdown.advice_registry).

A recommendation is made only for time the budget measured: never a check of something the same
budget shows as fine (an efficient GEMM part gets an info finding saying so, and no action); and a
gain that is not promised (its range reaches below zero, or Gain.risk says why) is said as one to
measure.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.advice.moot import Moot, split
from perfd.analytics.advice.plan import Plan, make_plan
from perfd.analytics.advice.remedies import (
    Advice,
    FitContext,
    Framework,
    JobConfig,
    RemedyId,
    run_spread_ms,
)
from perfd.analytics.advice.remedy_catalog import fit, minor
from perfd.analytics.breakdown.advice_registry import PART
from perfd.analytics.breakdown.bottleneck import BudgetClass
from perfd.analytics.breakdown.budget import BudgetPart, StepBudget, classify
from perfd.analytics.breakdown.capture_match import CAPTURE_COST_FINDING
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.finding_types import DataAction, DataLoading, Finding, Recommendation, Severity
from perfd.analytics.ncu.ncu_verdicts import ncu_rows
from perfd.core.record_json import unwritten


@dataclass(frozen=True)
class BudgetContext:
    budget: StepBudget
    framework: Framework = Framework.PYTORCH
    label: str = ""  # where the budget comes from, for the findings' source ("capture c1 rank 0")
    # Parts other analyzers speak for already (the run's timers: data, communication, pipeline)
    covered: frozenset[Part] = frozenset()
    config: JobConfig | None = None  # what the job runs with (remedies fit it); None: the framework alone
    # The job's run the capture and the steady step are of, when not the current one (its steps all
    # armed: the figures are an earlier run's, perfd.analytics.run.runs); None: the current run
    run: int | None = None


Out = tuple[list[Finding], list[Recommendation]]

def part_name(part: Part) -> str:
    """What the report calls a part (the registry's PartEntry.name)."""
    return PART[part].name


class BudgetSaid(enum.Enum):
    """Which of the budget's findings a :class:`BudgetFinding` is (its words: perfd.report.budget_text)."""

    PART = "part"  # what one part holds, by the ops that issued its kernels
    GEMM = "gemm"  # the linear layers' (or the GEMMs') efficiency against the measured ceiling
    CAPTURE_COST = "capture_cost"  # the capture's own slowdown of the steps it recorded
    CLASS = "class"  # the class the budget supports, with where the step goes
    ALREADY = "already"  # what the job already does, and the remedies that makes moot


@dataclass(frozen=True)
class BudgetFacts:
    """What a budget finding is worded from: the budget, the part it is of (PART, GEMM), the run whose
    steps the capture is of (CAPTURE_COST) and the class (CLASS); ``label``: where the budget comes from
    (the capture's label, else the budget's basis), which its source names."""

    said: BudgetSaid
    budget: StepBudget
    part: BudgetPart | None = None
    run: int | None = None
    cls: BudgetClass | None = None
    label: str = ""
    moot: tuple[Moot, ...] = ()  # ALREADY: what the job does (perfd.analytics.advice.moot)


@dataclass
class BudgetFinding(Finding):
    """One of the budget's findings, its title and observation left to the report (perfd.report.budget_text
    words them from ``facts``); its severity, evidence and source are set here."""

    facts: BudgetFacts | None = field(default=None, metadata=unwritten())


def parts(ctx: BudgetContext) -> Out:
    """A finding for each part the budget names (1% of the step or more), with the ops that hold it."""
    b = ctx.budget
    out: list[Finding] = []
    for p in b.parts:
        entry = PART[p.part]
        if p.share < th.BUDGET_PART_NAMED.value or p.part in ctx.covered or not entry.finding:
            continue
        # the math parts' efficiency is the GEMM finding's: their share alone is no warning
        sev = Severity.WARNING if p.share >= th.BUDGET_PART_WARN.value and not entry.math else Severity.INFO
        detail = p.detail_json()  # the ncu summaries (a typed field) as its JSON writes them
        evidence: dict[str, object] = {
            "part": p.part.value, "ms": p.ms, "share": p.share,
            **{k: detail[k] for k in ("op_ms", "kernels", "timer_ms", "ncu", "flops") if k in detail}}
        out.append(BudgetFinding(f"budget-{p.part.value}", sev, "", "", evidence, "",
                                 facts=BudgetFacts(BudgetSaid.PART, b, p, label=ctx.label or b.basis)))
    return out, []


def gemm(ctx: BudgetContext) -> Out:
    """The linear layers' (or the GEMMs') efficiency against the measured ceiling: fine (info) or far below
    it (the bigger-GEMMs remedy speaks for it)."""
    b = ctx.budget
    p = b.get(Part.LINEAR) or b.get(Part.GEMM)
    if p is None or not isinstance(p.detail.get("achieved_tflops"), (int, float)) or not b.ceiling_tflops:
        return [], []
    achieved, of = float(p.detail["achieved_tflops"]), float(p.detail.get("of_ceiling") or 0.0)
    good = of >= th.GEMM_EFFICIENT.value
    evidence = {"ms": p.ms, "achieved_tflops": achieved, "ceiling_tflops": b.ceiling_tflops, "of_ceiling": of}
    return [BudgetFinding("budget-gemm", Severity.INFO if good else Severity.WARNING, "", "", evidence, "",
                          facts=BudgetFacts(BudgetSaid.GEMM, b, p, label=ctx.label or b.basis))], []


def capture_cost(ctx: BudgetContext) -> Out:
    """The capture's own slowdown of the steps it recorded, and how its steps were counted."""
    b = ctx.budget
    over = b.capture_overhead_ms
    if over is None or b.steady_step_ms is None or b.steady_step_ms <= 0:
        return [], []
    sev = Severity.WARNING if over / b.steady_step_ms > th.CAPTURE_SLOWDOWN.value else Severity.INFO
    evidence = {"captured_step_ms": b.captured_step_ms, "steady_step_ms": b.steady_step_ms,
                "overhead_ms": over, "steps": b.iterations, "steps_from": b.steps_from,
                "unprofiled": b.unprofiled.to_json() if b.unprofiled is not None else None}
    facts = BudgetFacts(BudgetSaid.CAPTURE_COST, b, run=ctx.run, label=ctx.label or b.basis)
    return [BudgetFinding(CAPTURE_COST_FINDING, sev, "", "", evidence, "", facts=facts)], []


def _fitted(ctx: BudgetContext) -> tuple[list[Advice], tuple[Moot, ...]]:
    cfg = ctx.config or JobConfig(ctx.framework)
    return split([a for a in fit(FitContext(ctx.budget, cfg)) if a.part not in ctx.covered], ctx.budget.facts)


def fitted(ctx: BudgetContext) -> list[Advice]:
    """The remedies fitted to the job, but those for parts other analyzers speak for and those for what
    the job already does (perfd.analytics.advice.moot)."""
    return _fitted(ctx)[0]


def plan_of(ctx: BudgetContext) -> Plan | None:
    """The remedies as a plan (perfd.analytics.advice.plan): order, effort, relations, combined gain."""
    fit = FitContext(ctx.budget, ctx.config or JobConfig(ctx.framework))
    return make_plan(fitted(ctx), fit.config, ctx.budget.step_ms,
                     run_spread_ms(ctx.budget.step_ms, ctx.budget.step_sd_ms), fit.replay)


@dataclass(frozen=True)
class RemedyFacts:
    """What a remedy's recommendation (or the smaller remedies' finding) is worded from: the fitted
    remedies and the step they are measured against (its MFU: the gain said as MFU too)."""

    advice: tuple[Advice, ...]
    step_ms: float
    mfu: float | None = None


@dataclass
class RemedyRecommendation(Recommendation):
    """A remedy fitted to the job, its action and detail left to the report (perfd.report.remedy_text
    words them from ``facts``); its typed fields (remedy, gain, flags, needs, effort) are set here."""

    facts: RemedyFacts | None = field(default=None, metadata=unwritten())


@dataclass
class SmallerRemedies(Finding):
    """The remedies whose gain is within a rerun's spread, in one finding: its title, observation and
    evidence left to the report (perfd.report.remedy_text)."""

    facts: RemedyFacts | None = field(default=None, metadata=unwritten())


@dataclass
class UnmodelledRemedies(Finding):
    """The remedies that fit the job but have no modelled gain (Advice.no_gain says why), in one finding:
    named, never a recommendation ordered by a gain they do not have (the plan lists them apart too:
    Plan.unmodelled). Its title, observation and evidence are the report's (perfd.report.remedy_text)."""

    facts: RemedyFacts | None = field(default=None, metadata=unwritten())


def remedies(ctx: BudgetContext) -> Out:
    """The remedies fitted to the job, each a recommendation with its gain range; those whose expected
    gain is within a rerun's spread (under th.REMEDY_MIN_GAIN of the step) in one finding of their own:
    named, not ordered among the ones worth doing first; those with no modelled gain in another."""
    b = ctx.budget
    recs: list[Advice] = []
    small: list[Advice] = []
    unmodelled: list[Advice] = []
    kept, moot = _fitted(ctx)
    for a in kept:
        (unmodelled if a.gain is None else small if minor(a, b.step_ms) else recs).append(a)
    fs: list[Finding] = []
    if moot:
        evidence = {"already": [{"already": m.already.value, "dropped": [r.value for r in m.dropped]}
                                for m in moot], "facts": b.facts.to_json() if b.facts is not None else None}
        said = BudgetFacts(BudgetSaid.ALREADY, b, label=ctx.label or b.basis, moot=moot)
        fs.append(BudgetFinding("budget-already", Severity.INFO, "", "", evidence, "", facts=said))
    if small:
        facts = RemedyFacts(tuple(small), b.step_ms, b.mfu)
        fs.append(SmallerRemedies("budget-minor-remedies", Severity.INFO, "", "", {}, "",
                                  ctx.label or b.basis, facts=facts))
    if unmodelled:
        facts = RemedyFacts(tuple(unmodelled), b.step_ms, b.mfu)
        fs.append(UnmodelledRemedies("budget-unmodelled-remedies", Severity.INFO, "", "", {}, "",
                                     ctx.label or b.basis, facts=facts))
    return fs, [recommendation(a, b) for a in recs]


def recommendation(a: Advice, b: StepBudget) -> Recommendation:
    """Advice as a recommendation: its typed fields here, its action and detail (basis, expected change,
    needs, cost, notes, effort) where it is shown."""
    impact = a.gain.mid_ms / b.step_ms if a.gain is not None and a.gain.promised and b.step_ms > 0 else None
    return RemedyRecommendation(
        "",
        f"budget-{a.part.value}",
        0,
        "",
        "",
        impact,
        a.remedy.value,
        [a.gain.low_ms, a.gain.high_ms] if a.gain is not None else None,
        [f.text() for f in a.flags],
        list(a.remove),
        list(a.needs),
        a.effort.value,
        # the data-loader remedy's action is the data-loading one (its words: DATA_LOADING_ACTION)
        data_loading=DataLoading(DataAction.LOAD_FASTER) if a.remedy is RemedyId.DATA_LOADER else None,
        facts=RemedyFacts((a,), b.step_ms, b.mfu),
    )


def bottleneck(ctx: BudgetContext) -> Out:
    """The class the budget supports, with every class's share (a finding; the job's class is decided
    with the other sources' votes in perfd.analytics.breakdown.diagnosis)."""
    c = classify(ctx.budget)
    if c is None:
        return [], []
    evidence = {"class": c.cls.value, "shares": c.shares_json(), "lead": c.lead}
    facts = BudgetFacts(BudgetSaid.CLASS, ctx.budget, cls=c, label=ctx.label or ctx.budget.basis)
    return [BudgetFinding("budget-class", Severity.INFO, "", "", evidence, "", facts=facts)], []


Analyzer = Callable[[BudgetContext], Out]
def ncu_verdicts(ctx: BudgetContext) -> Out:
    """What the Nsight Compute rows on the budget's parts say to do (perfd.analytics.ncu.ncu_verdicts)."""
    return ncu_rows(ctx.budget, ctx.label)


# The one registry: every question the budget answers, in the order findings are listed.
ANALYZERS: tuple[Analyzer, ...] = (bottleneck, capture_cost, gemm, parts, ncu_verdicts, remedies)


def analyze(ctx: BudgetContext, analyzers: Sequence[Analyzer] = ANALYZERS) -> Out:
    fs: list[Finding] = []
    rs: list[Recommendation] = []
    for a in analyzers:
        f, r = a(ctx)
        fs += f
        rs += r
    return fs, rs


def config_of(
    framework: str | None,
    version: str | None,
    arguments: Mapping[str, str],
    packages: Mapping[str, str],
    layout: tuple[int | None, int | None],
    batches: tuple[int | None, int | None],
    memory_mib: Mapping[str, float] | None,
    gpu_memory_mib: float | None,
) -> JobConfig:
    """A JobConfig from what a run's analysis holds (perfd.analytics.run.run_findings builds it)."""
    return JobConfig(
        Framework.of(framework),
        version,
        dict(arguments),
        dict(packages),
        layout[0],
        layout[1],
        batches[0],
        batches[1],
        dict(memory_mib or {}),
        gpu_memory_mib,
    )

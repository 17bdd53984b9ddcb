"""Findings and remedies from a step's time budget (perfd.analytics.breakdown.budget): what each part holds,
by the ops that issued its kernels, and the remedies perfd.analytics.advice.remedies fits to the job's own
configuration, each a recommendation with its basis, its needs, its cost and a gain range. Pure;
English only in the texts. What each part is called, what its finding opens with and whether its share
alone is a warning are its entry in the advice registry (perfd.analytics.breakdown.advice_registry).

A recommendation is made only for time the budget measured: never a check of something the same
budget shows as fine (an efficient GEMM part gets an info finding saying so, and no action); and a
gain whose range reaches below zero is said as one to measure, never promised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
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
from perfd.analytics.breakdown.budget import BudgetClass, BudgetPart, IdleCause, StepBudget, classify
from perfd.analytics.breakdown.capture_match import CAPTURE_COST_FINDING
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.finding_types import DataAction, DataLoading, Finding, Recommendation, Severity
from perfd.analytics.ncu.ncu_verdicts import ncu_rows


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


_COLLECTIVE_OPS = ("nccl", "c10d", "all_reduce", "allreduce", "reduce_scatter", "all_gather")


def part_title(p: BudgetPart) -> str:
    """The part's name for what it is in this job: the gradient reduction part that holds no collective,
    only autograd's main_grad accumulation (DP=1, or the reduction elsewhere), is named so, with the
    stream it runs on."""
    if p.part is Part.GRAD_REDUCE:
        ops = p.detail.get("op_ms")
        collective = isinstance(ops, Mapping) and any(k in str(op).lower() for op in ops
                                                      for k in _COLLECTIVE_OPS)
        if isinstance(ops, Mapping) and ops and not collective:
            side = p.detail.get("side_stream_ms")
            on_side = isinstance(side, (int, float)) and side >= 0.5 * p.ms
            return "gradient accumulation (main_grad +=" + (", a side stream)" if on_side else ")")
    return PART[p.part].name


def _short(name: str, width: int = 60) -> str:
    """A kernel's name as a person reads it: the innermost ATen functor or kernel, not the template."""
    for key in (
        "masked_fill_kernel",
        "softmax_warp_forward",
        "SoftMaxBackward",
        "fused_dropout",
        "masked_scale_kernel",
        "multi_tensor_apply_kernel",
        "layer_norm",
        "CatArrayBatchedCopy",
        "GeluBackward",
        "Gelu",
        "MulFunctor",
        "CUDAFunctor_add",
        "FillFunctor",
        "bfloat16_copy",
    ):
        if key in name:
            return key
    name = " ".join(name.split())
    return name if len(name) <= width else name[: width - 1] + "…"


def _ops_text(p: BudgetPart, n: int = 4) -> str:
    """The part's largest ops per step (by the op that issued the kernels), else its kernels."""
    ops = p.detail.get("op_ms")
    if isinstance(ops, Mapping) and ops:
        top = sorted(
            ((str(k), float(v)) for k, v in ops.items() if isinstance(v, (int, float))), key=lambda kv: -kv[1]
        )[:n]
        return "; ".join(f"{_short(k)} {v:.1f} ms" for k, v in top if v >= 0.05)
    ks = [k for k in p.detail.get("kernels") or [] if isinstance(k, Mapping)][:3]
    return "; ".join(f"{_short(str(k['name']))} {float(k['ms']):.1f} ms ×{float(k['count']):.0f}" for k in ks)


def ncu_text(p: BudgetPart) -> str:
    """What an Nsight Compute capture measured of the part's kernels (perfd.analytics.ncu.join
    summaries in the part's ``ncu`` detail): speed of light and the class NVIDIA's rule gives them."""
    out = []
    for c in p.detail.get("ncu") or []:
        if not isinstance(c, Mapping):
            continue
        figs = [
            f"{label} {float(v):.0%}"
            for label, key in (
                ("compute SOL", "compute_throughput"),
                ("memory SOL", "memory_throughput"),
                ("DRAM", "dram_throughput"),
                ("tensor pipe", "tensor_pipe"),
                ("occupancy", "achieved_occupancy"),
            )
            if isinstance(v := c.get(key), (int, float))
        ]
        bound = f"; mostly {c['bound']}" if c.get("bound") else ""
        stall = f"; top stall {c['top_stall']}" if c.get("top_stall") else ""
        out.append(
            f"{c.get('category')} ({c.get('kernels')} kernel(s)): {', '.join(figs) or 'no figures'}"
            f"{bound}{stall}"
        )
    return (
        (
            "Nsight Compute"
            + (f" (capture {p.detail['ncu'][0].get('capture')})" if out else "")
            + ": "
            + "; ".join(out)
        )
        if out
        else ""
    )


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
        ops = _ops_text(p)
        extra = ""
        if p.part is Part.OPTIMIZER and isinstance(p.detail.get("timer_ms"), (int, float)):
            extra = (
                f"; the framework's own optimizer timer says {float(p.detail['timer_ms']):.0f} ms per step"
            )
        if p.part is Part.ATTENTION and isinstance(p.detail.get("flops"), (int, float)):
            extra = (
                f"; {'fused' if p.detail.get('fused') else 'unfused'}: its FLOPs would take "
                f"{float(p.detail.get('at_ceiling_ms') or 0):.0f} ms at the matmul ceiling"
            )
        if p.part is Part.IDLE_SHORT and isinstance(p.detail.get("under_5us_ms"), (int, float)):
            extra = (f"; {float(p.detail['under_5us_ms']):.1f} ms of it in gaps under 5 µs (the launches "
                     "themselves), the rest the host's Python between launches")
        if p.part is Part.IDLE_SYNC:
            extra = "; " + sync_text(b)
        if ncu_text(p):
            extra += f". {ncu_text(p)}"
        name = part_title(p)
        out.append(
            Finding(
                f"budget-{p.part.value}",
                sev,
                f"{name[0].upper()}{name[1:]}: {p.ms:.0f} ms per step ({p.share:.0%})",
                f"{entry.holds or 'It takes'} {p.ms:.1f} ms of a "
                f"{b.step_ms:.0f} ms step" + (f" (by op, per step: {ops})" if ops else "") + extra + ".",
                {
                    "part": p.part.value,
                    "ms": p.ms,
                    "share": p.share,
                    **{
                        k: p.detail[k]
                        for k in ("op_ms", "kernels", "timer_ms", "ncu", "flops")
                        if k in p.detail
                    },
                },
                "",
                f"{ctx.label or b.basis} ({p.source.value}, {b.attribution or 'timers'})",
            )
        )
    return out, []


def sync_text(b: StepBudget) -> str:
    """Whose synchronisations the GPU waits after, largest first ("after torch.cuda.synchronize() in the
    forward-backward phase 16 ms (14 a step), ...")."""
    rows = sorted((r for r in b.idle if r.cause is IdleCause.SYNC), key=lambda r: -r.ms)
    return "by whose sync: " + "; ".join(f"{r.owner or 'a sync'} in the {r.phase.value} phase {r.ms:.1f} ms "
                                         f"({r.gaps:.0f} a step)" for r in rows[:5] if r.ms >= 0.05)


def gemm(ctx: BudgetContext) -> Out:
    """The linear layers' (or the GEMMs') efficiency against the measured ceiling: fine (info) or far below
    it (the bigger-GEMMs remedy speaks for it)."""
    b = ctx.budget
    p = b.get(Part.LINEAR) or b.get(Part.GEMM)
    if p is None or not isinstance(p.detail.get("achieved_tflops"), (int, float)) or not b.ceiling_tflops:
        return [], []
    achieved, of = float(p.detail["achieved_tflops"]), float(p.detail.get("of_ceiling") or 0.0)
    good = of >= th.GEMM_EFFICIENT.value
    what = "linear layers" if p.part is Part.LINEAR else "GEMMs (and fused attention)"
    return [
        Finding(
            "budget-gemm",
            Severity.INFO if good else Severity.WARNING,
            f"{what[0].upper()}{what[1:]} at {of:.0%} of the measured matmul ceiling",
            f"The {what} take {p.ms:.0f} ms per step and run their FLOPs at {achieved:.0f} TFLOP/s: "
            f"{of:.0%} of the {b.ceiling_tflops:g} TFLOP/s a large bf16 matmul reaches on this GPU"
            + (
                " — efficient: the time to win is outside them."
                if good
                else " — small or odd-shaped matrices."
            )
            + (f" {ncu_text(p)}." if ncu_text(p) else ""),
            {"ms": p.ms, "achieved_tflops": achieved, "ceiling_tflops": b.ceiling_tflops, "of_ceiling": of},
            "",
            f"{ctx.label or b.basis} (capture + model FLOPs)",
        )
    ], []


def capture_cost(ctx: BudgetContext) -> Out:
    """The capture's own slowdown of the steps it recorded, and how its steps were counted."""
    b = ctx.budget
    over = b.capture_overhead_ms
    if over is None or b.steady_step_ms is None or b.steady_step_ms <= 0:
        return [], []
    share = over / b.steady_step_ms
    how = {
        "trace": "the steps the trace marks",
        "request": "the steps the capture asked for",
        "span": "the span over the steady step (the trace marks no step)",
    }.get(b.steps_from, "")
    sev = Severity.WARNING if share > th.CAPTURE_SLOWDOWN.value else Severity.INFO
    who = f"Run {ctx.run}'s capture" if ctx.run else "The capture"  # like with like: one run's steps
    return [
        Finding(
            CAPTURE_COST_FINDING,
            sev,
            f"{who} slowed its steps by {share:+.0%}",
            f"The captured steps averaged {b.step_ms:.0f} ms against the steady {b.steady_step_ms:.0f} ms "
            f"({over:+.0f} ms)"
            + (f" of the same run (run {ctx.run}, the job's last without ncu)" if ctx.run else "")
            + ": the profiler's own cost, which lands in the idle parts (the host runs slower; the kernels "
            "do not)"
            + (f"; steps counted from {how}" if how else "")
            + (". Read the idle parts with that in mind." if share > th.CAPTURE_SLOWDOWN.value else "."),
            {
                "captured_step_ms": b.step_ms,
                "steady_step_ms": b.steady_step_ms,
                "overhead_ms": over,
                "steps": b.iterations,
                "steps_from": b.steps_from,
            },
            "",
            ctx.label or b.basis,
        )
    ], []


def fitted(ctx: BudgetContext) -> list[Advice]:
    """The remedies fitted to the job, but those for parts other analyzers speak for."""
    cfg = ctx.config or JobConfig(ctx.framework)
    return [a for a in fit(FitContext(ctx.budget, cfg)) if a.part not in ctx.covered]


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

    facts: RemedyFacts | None = field(default=None, metadata={"json": False})


@dataclass
class SmallerRemedies(Finding):
    """The remedies whose gain is within a rerun's spread, in one finding: its title, observation and
    evidence left to the report (perfd.report.remedy_text)."""

    facts: RemedyFacts | None = field(default=None, metadata={"json": False})


def remedies(ctx: BudgetContext) -> Out:
    """The remedies fitted to the job, each a recommendation with its gain range; those whose expected
    gain is within a rerun's spread (under th.REMEDY_MIN_GAIN of the step) in one finding of their own:
    named, not ordered among the ones worth doing first."""
    b = ctx.budget
    recs: list[Advice] = []
    small: list[Advice] = []
    for a in fitted(ctx):
        (small if minor(a, b.step_ms) else recs).append(a)
    fs: list[Finding] = []
    if small:
        facts = RemedyFacts(tuple(small), b.step_ms, b.mfu)
        fs.append(SmallerRemedies("budget-minor-remedies", Severity.INFO, "", "", {}, "",
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
    return [
        Finding(
            "budget-class",
            Severity.INFO,
            f"Step budget: {class_text(c)}",
            f"Where the {ctx.budget.step_ms:.0f} ms step goes: {waterfall_text(ctx.budget)}.",
            {"class": c.cls.value, "shares": c.shares_json(), "lead": c.lead},
            "",
            f"{ctx.label or ctx.budget.basis}",
        )
    ], []


def class_text(c: BudgetClass) -> str:
    return f"{c.cls} ({c.reason()})"


def waterfall_text(b: StepBudget) -> str:
    return "; ".join(f"{part_title(p)} {p.ms:.0f} ms ({p.share:.0%})" for p in b.parts)


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

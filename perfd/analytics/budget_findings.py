"""Findings and remedies from a step's time budget (perfd.analytics.budget): one small analyzer per
part, registered in :data:`ANALYZERS`, each reading the typed budget and returning findings with
their evidence and, where the part costs time a remedy can take back, a recommendation with its
basis and a bounded expected gain (perfd.analytics.remedies). Pure; English only in the texts.

A recommendation is only made for time the budget measured: never a check of something the same
budget shows as fine (an efficient GEMM part gets an info finding saying so, and no action).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.budget import BudgetClass, BudgetPart, Part, StepBudget, classify
from perfd.analytics.finding_types import Finding, Recommendation, Severity
from perfd.analytics.remedies import Framework, gain, remedy


@dataclass(frozen=True)
class BudgetContext:
    budget: StepBudget
    framework: Framework = Framework.PYTORCH
    label: str = ""  # where the budget comes from, for the findings' source ("capture c1 rank 0")
    # Parts other analyzers speak for already (the run's timers: data, communication, pipeline)
    covered: frozenset[Part] = frozenset()
    arguments: Mapping[str, str] = field(default_factory=dict)  # Megatron's arguments (flags already on)


Out = tuple[list[Finding], list[Recommendation]]

_NAMES: dict[Part, str] = {
    Part.IDEAL: "the model's FLOPs at peak", Part.CEILING_GAP: "peak → measured matmul ceiling",
    Part.GEMM: "GEMMs below the ceiling", Part.ATTENTION: "attention, unfused", Part.OPTIMIZER: "optimizer",
    Part.POINTWISE: "elementwise / normalisation", Part.MEMCPY: "memory copies",
    Part.COMM_EXPOSED: "exposed communication", Part.PIPELINE: "pipeline wait", Part.DATA: "data wait",
    Part.IDLE_SHORT: "idle, short gaps (launch)", Part.IDLE_LONG: "idle, long gaps (host waits)",
    Part.COMPUTE: "compute (not divided)",
}


def part_name(part: Part) -> str:
    return _NAMES[part]


def _kernels_text(p: BudgetPart, n: int = 3) -> str:
    ks = [k for k in p.detail.get("kernels") or [] if isinstance(k, Mapping)][:n]
    return "; ".join(f"{_short(str(k['name']))} {float(k['ms']):.1f} ms ×{float(k['count']):.0f}" for k in ks)


def _short(name: str, width: int = 60) -> str:
    """A kernel's name as a person reads it: the innermost ATen functor or kernel, not the template."""
    for key in ("masked_fill_kernel", "softmax_warp_forward", "SoftMaxBackward", "fused_dropout",
                "masked_scale_kernel", "multi_tensor_apply_kernel", "layer_norm", "CatArrayBatchedCopy",
                "GeluBackward", "Gelu", "MulFunctor", "CUDAFunctor_add", "FillFunctor", "bfloat16_copy"):
        if key in name:
            return key
    name = " ".join(name.split())
    return name if len(name) <= width else name[: width - 1] + "…"


def ncu_text(p: BudgetPart) -> str:
    """What an Nsight Compute capture measured of the part's kernels (perfd.analytics.ncu_join
    summaries in the part's ``ncu`` detail): speed of light and the class NVIDIA's rule gives them."""
    out = []
    for c in p.detail.get("ncu") or []:
        if not isinstance(c, Mapping):
            continue
        figs = [f"{label} {float(v):.0%}" for label, key in
                (("compute SOL", "compute_throughput"), ("memory SOL", "memory_throughput"),
                 ("DRAM", "dram_throughput"), ("tensor pipe", "tensor_pipe"),
                 ("occupancy", "achieved_occupancy"))
                if isinstance(v := c.get(key), (int, float))]
        bound = f"; mostly {c['bound']}" if c.get("bound") else ""
        stall = f"; top stall {c['top_stall']}" if c.get("top_stall") else ""
        out.append(f"{c.get('category')} ({c.get('kernels')} kernel(s)): {', '.join(figs) or 'no figures'}"
                   f"{bound}{stall}")
    return ("Nsight Compute" + (f" (capture {p.detail['ncu'][0].get('capture')})" if out else "") + ": "
            + "; ".join(out)) if out else ""


def _expected(b: StepBudget, p: BudgetPart, removes: float) -> tuple[float, str]:
    saved, mfu_after = gain(b.step_ms, p.ms, removes, b.mfu)
    after = f", MFU {b.mfu:.1%} → up to ~{mfu_after:.1%}" if mfu_after is not None and b.mfu else ""
    return saved, f"step −{saved:.0f} ms ({saved / b.step_ms:.0%}){after}"


def _part(ctx: BudgetContext, part: Part, title: str, why: str) -> Out:
    """The finding of one kernel part, and its remedy with the expected gain when it costs enough."""
    b = ctx.budget
    p = b.get(part)
    if p is None or p.share < th.BUDGET_PART_NAMED.value or part in ctx.covered:
        return [], []
    kern = _kernels_text(p)
    sev = Severity.WARNING if p.share >= th.BUDGET_PART_WARN.value else Severity.INFO
    fid = f"budget-{part.value}"
    extra = ""
    if part is Part.OPTIMIZER and isinstance(p.detail.get("timer_ms"), (int, float)):
        extra = f"; the framework's own optimizer timer says {float(p.detail['timer_ms']):.0f} ms per step"
    if ncu_text(p):
        extra += f". {ncu_text(p)}"
    f = Finding(fid, sev, f"{title}: {p.ms:.0f} ms per step ({p.share:.0%})",
                f"{why} {p.ms:.1f} ms of a {b.step_ms:.0f} ms step"
                + (f" (top kernels per step: {kern})" if kern else "") + extra + ".",
                {"part": part.value, "ms": p.ms, "share": p.share, "kernels": p.detail.get("kernels") or [],
                 **{k: p.detail[k] for k in ("timer_ms", "ncu") if k in p.detail}},
                "", f"{ctx.label or b.basis} ({p.source.value})")
    r = remedy(part, ctx.framework)
    if r is None or p.share < th.BUDGET_PART_REMEDY.value:
        return [f], []
    saved, text = _expected(b, p, r.removes)
    detail = (f"basis: {part_name(part)} {p.ms:.0f} ms per step ({p.share:.0%}, {p.source.value}); typically "
              f"removes ~{r.removes:.0%} of it ({r.why}) → {text}" + (f"; {r.how}" if r.how else ""))
    return [f], [Recommendation("", fid, 0, r.action, detail, saved / b.step_ms)]


def attention(ctx: BudgetContext) -> Out:
    return _part(ctx, Part.ATTENTION, "Attention runs unfused",
                 "The attention mask fill and softmax run as kernels of their own, reading and writing the "
                 "s×s score matrix (QKᵀ and ·V are among the GEMMs):")


def optimizer(ctx: BudgetContext) -> Out:
    return _part(ctx, Part.OPTIMIZER, "Optimizer step", "The optimizer's kernels take")


def pointwise(ctx: BudgetContext) -> Out:
    return _part(ctx, Part.POINTWISE, "Elementwise and normalisation kernels",
                 "Memory-bound pointwise kernels (dropout, activations, adds, layer norm, casts) take")


def memcpy(ctx: BudgetContext) -> Out:
    return _part(ctx, Part.MEMCPY, "Memory copies", "Copies and memsets on the device take")


def idle_short(ctx: BudgetContext) -> Out:
    return _part(ctx, Part.IDLE_SHORT, "Launch-bound gaps",
                 f"The GPU waits a little before kernels (idle gaps under {th.SHORT_GAP_S.value * 1e3:g} ms: "
                 "the host issues work slower than the GPU runs it):")


def idle_long(ctx: BudgetContext) -> Out:
    return _part(ctx, Part.IDLE_LONG, "Host waits",
                 f"The GPU is idle in gaps of {th.SHORT_GAP_S.value * 1e3:g} ms or more (the host waiting: a "
                 "synchronisation, Python between steps):")


def data(ctx: BudgetContext) -> Out:
    return _part(ctx, Part.DATA, "Data wait", "The step waits for its batch:")


def communication(ctx: BudgetContext) -> Out:
    return _part(ctx, Part.COMM_EXPOSED, "Exposed communication",
                 "Collectives run with no compute beside them for")


def pipeline(ctx: BudgetContext) -> Out:
    return _part(ctx, Part.PIPELINE, "Pipeline wait",
                 "SendRecv kernels run from the moment a stage posts its p2p until the peer stage delivers "
                 "(the bubble, not link bandwidth):")


def gemm(ctx: BudgetContext) -> Out:
    """The GEMMs' own efficiency against the measured ceiling: fine (info) or far below it (a remedy)."""
    b = ctx.budget
    p = b.get(Part.GEMM)
    if p is None or b.gemm_tflops is None or not b.ceiling_tflops:
        return [], []
    of = b.gemm_tflops / b.ceiling_tflops
    total = float(p.detail.get("gemm_ms") or 0.0)
    good = of >= th.GEMM_EFFICIENT.value
    fid = "budget-gemm"
    f = Finding(fid, Severity.INFO if good else Severity.WARNING,
                f"GEMMs at {of:.0%} of the measured matmul ceiling",
                f"The GEMMs (and fused attention) take {total:.0f} ms per step and run the model's FLOPs at "
                f"{b.gemm_tflops:.0f} TFLOP/s: {of:.0%} of the {b.ceiling_tflops:g} TFLOP/s a large bf16 "
                f"matmul reaches on this GPU" + (" — efficient: the time to win is outside them." if good else
                                          " — small or odd-shaped matrices.")
                + (f" {ncu_text(p)}." if ncu_text(p) else ""),
                {"gemm_ms": total, "achieved_tflops": b.gemm_tflops, "ceiling_tflops": b.ceiling_tflops,
                 "of_ceiling": of, **({"ncu": p.detail["ncu"]} if p.detail.get("ncu") else {})}, "",
                f"{ctx.label or b.basis} (capture + model FLOPs)")
    r = remedy(Part.GEMM, ctx.framework)
    if good or r is None or p.share < th.BUDGET_PART_REMEDY.value:
        return [f], []
    saved, text = _expected(b, p, r.removes)
    return [f], [Recommendation("", fid, 0, r.action,
                                f"basis: GEMMs {of:.0%} of the ceiling, {p.ms:.0f} ms per step below it; "
                                f"→ {text}",
                                saved / b.step_ms)]


def bottleneck(ctx: BudgetContext) -> Out:
    """The class the budget supports, with every class's share (a finding; the job's class is decided
    with the other sources' votes in perfd.analytics.diagnosis)."""
    c = classify(ctx.budget)
    if c is None:
        return [], []
    return [Finding("budget-class", Severity.INFO, f"Step budget: {class_text(c)}",
                    f"Where the {ctx.budget.step_ms:.0f} ms step goes: {waterfall_text(ctx.budget)}.",
                    {"class": c.cls.value, "shares": c.shares_json(), "lead": c.lead}, "",
                    f"{ctx.label or ctx.budget.basis}")], []


def class_text(c: BudgetClass) -> str:
    return f"{c.cls} ({c.reason()})"


def waterfall_text(b: StepBudget) -> str:
    return "; ".join(f"{part_name(p.part)} {p.ms:.0f} ms ({p.share:.0%})" for p in b.parts)


Analyzer = Callable[[BudgetContext], Out]
# The one registry: every question the budget answers, in the order findings are listed.
ANALYZERS: tuple[Analyzer, ...] = (bottleneck, gemm, attention, pointwise, memcpy, optimizer, idle_short,
                                   idle_long, data, communication, pipeline)


def analyze(ctx: BudgetContext, analyzers: Sequence[Analyzer] = ANALYZERS) -> Out:
    fs: list[Finding] = []
    rs: list[Recommendation] = []
    for a in analyzers:
        f, r = a(ctx)
        fs += f
        rs += r
    return fs, rs

"""The step budget's findings as they read: what each part holds, by the ops that issued its
kernels (its name for what it is in this job, the synchronisations the GPU waits after, what Nsight Compute
measured of its kernels), the GEMMs' efficiency against the measured ceiling, the capture's own cost, and
the class the budget supports with where the step goes; worded from the typed facts the analytics give
(perfd.analytics.advice.budget_findings: BudgetFinding, BudgetFacts). Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from perfd.analytics import thresholds as th
from perfd.analytics.advice.budget_findings import BudgetFacts, BudgetFinding, BudgetSaid
from perfd.analytics.breakdown.advice_registry import CLASS, PART
from perfd.analytics.breakdown.bottleneck import BudgetClass
from perfd.analytics.breakdown.budget import BudgetPart, IdleCause, StepBudget
from perfd.analytics.breakdown.job_facts import JobFacts
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.finding_types import Finding
from perfd.analytics.steps.flops import FlopsBasis
from perfd.report.job_facts_text import (
    already_words,
    grad_accum_holds,
    grad_accum_title,
    made_of_text,
    made_of_title,
)
from perfd.report.units import tflops

_COLLECTIVE_OPS = ("nccl", "c10d", "all_reduce", "allreduce", "reduce_scatter", "all_gather")


def _own_terms(facts: JobFacts | None) -> JobFacts | None:
    """The job's facts where its parts are named in its own terms: a job whose trace ran no collective
    (no data parallelism, none of Megatron-LM's communication; a Megatron-LM job keeps its words)."""
    return facts if facts is not None and facts.single_device else None


def part_title(p: BudgetPart, facts: JobFacts | None = None) -> str:
    """The part's name for what it is in this job (``facts``: the job's own, from its capture): the
    gradient reduction part of a job with no collective is autograd's AccumulateGrad over its
    micro-batches; the pointwise part names what it is made of; the gradient reduction part that holds
    no collective, only autograd's main_grad accumulation (DP=1, or the reduction elsewhere), is named
    so, with the stream it runs on."""
    own = _own_terms(facts)
    if own is not None and p.part is Part.GRAD_REDUCE:
        return grad_accum_title(own)
    made = p.detail.get("made_of")
    if own is not None and p.part is Part.POINTWISE and isinstance(made, Mapping) and made_of_title(made):
        return f"pointwise: {made_of_title(made)}"
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
    for row in p.ncu or ():
        c = row.summary
        figs = [
            f"{label} {float(v):.0%}"
            for label, v in (
                ("compute SOL", c.compute_throughput),
                ("memory SOL", c.memory_throughput),
                ("DRAM", c.dram_throughput),
                ("tensor pipe", c.tensor_pipe),
                ("occupancy", c.achieved_occupancy),
            )
            if v is not None
        ]
        bound = f"; mostly {c.bound.value}" if c.bound else ""
        stall = f"; top stall {c.top_stall}" if c.top_stall else ""
        out.append(
            f"{c.category} ({c.kernels} kernel(s)): {', '.join(figs) or 'no figures'}"
            f"{bound}{stall}"
        )
    return (
        (
            "Nsight Compute"
            + (f" (capture {p.ncu[0].capture})" if out and p.ncu else "")
            + ": "
            + "; ".join(out)
        )
        if out
        else ""
    )


def sync_text(b: StepBudget) -> str:
    """Whose synchronisations the GPU waits after, largest first, with the refill after each owner's
    ("after torch.cuda.synchronize() in the forward-backward phase 16 ms (14 a step), ...; then 0.6 ms
    while the host refilled the queue")."""
    rows = sorted((r for r in b.idle if r.cause is IdleCause.SYNC), key=lambda r: -r.ms)
    refill: dict[str, float] = {}
    for r in b.idle:
        if r.cause is IdleCause.REFILL:
            refill[r.owner] = refill.get(r.owner, 0.0) + r.ms
    out = []
    for r in rows[:5]:
        if r.ms < 0.05:
            continue
        after = refill.pop(r.owner, 0.0)
        out.append(f"{r.owner or 'a sync'} in the {r.phase.value} phase {r.ms:.1f} ms ({r.gaps:.0f} a step)"
                   + (f" and {after:.1f} ms after it while the host refilled the queue" if after >= 0.05
                      else ""))
    return "by whose sync: " + "; ".join(out)


def waterfall_text(b: StepBudget) -> str:
    return "; ".join(f"{part_title(p, b.facts)} {p.ms:.0f} ms ({p.share:.0%})" for p in b.parts)


def _holds(b: StepBudget, p: BudgetPart) -> str:
    """A part's finding's opening words: in the job's own terms where its facts say them."""
    own = _own_terms(b.facts)
    made = p.detail.get("made_of")
    if own is not None and p.part is Part.GRAD_REDUCE:
        return grad_accum_holds(own)
    if own is not None and p.part is Part.POINTWISE and isinstance(made, Mapping) and made_of_text(made):
        return f"Pointwise work no other part claims (by what it computes, per step: {made_of_text(made)})" \
            " takes"
    return PART[p.part].holds or "It takes"


def _part_words(b: StepBudget, p: BudgetPart) -> tuple[str, str]:
    """A part's finding: its title and observation."""
    ops = _ops_text(p)
    extra = ""
    if p.part is Part.OPTIMIZER and isinstance(p.detail.get("timer_ms"), (int, float)):
        extra = f"; the framework's own optimizer timer says {float(p.detail['timer_ms']):.0f} ms per step"
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
    name = part_title(p, b.facts)
    return (f"{name[0].upper()}{name[1:]}: {p.ms:.0f} ms per step ({p.share:.0%})",
            f"{_holds(b, p)} {p.ms:.1f} ms of a {b.step_ms:.0f} ms step"
            + (f" (by op, per step: {ops})" if ops else "") + extra + ".")


# Which FLOPs a math part's TFLOP/s divides by its time (perfd.analytics.steps.flops.FlopsBasis).
FLOPS_BASIS = {
    FlopsBasis.GEMMS: "their own FLOPs (the formula's GEMM terms: QKV, the attention projection, the MLP "
                      "and the LM head, 6 per weight per token; core attention's QKᵀ and ·V are "
                      "attention's)",
    FlopsBasis.SIX_N: "the model's 6·N·tokens FLOPs (a count with no attention term)",
    FlopsBasis.WHOLE_MODEL: "the whole model's FLOPs (attention's matmuls among them)",
}


def flops_basis_text(p: BudgetPart) -> str:
    """Which FLOPs the part's TFLOP/s is of ("their FLOPs" for a budget kept before it was said)."""
    basis = p.detail.get("flops_basis")
    return FLOPS_BASIS[FlopsBasis(basis)] if basis in FlopsBasis.__members__.values() else "their FLOPs"


def _gemm_words(b: StepBudget, p: BudgetPart) -> tuple[str, str]:
    """The GEMMs' finding: fine, or far below the ceiling."""
    achieved, of = float(p.detail["achieved_tflops"]), float(p.detail.get("of_ceiling") or 0.0)
    good = of >= th.GEMM_EFFICIENT.value
    what = "linear layers" if p.part is Part.LINEAR else "GEMMs (and fused attention)"
    return (f"{what[0].upper()}{what[1:]} at {of:.0%} of the measured matmul ceiling",
            f"The {what} take {p.ms:.0f} ms per step and run {flops_basis_text(p)} at {tflops(achieved, 0)} "
            f"TFLOP/s: {of:.0%} of the {b.ceiling_tflops:g} TFLOP/s a large bf16 matmul reaches on this GPU"
            + (" — efficient: the time to win is outside them." if good
               else " — small or odd-shaped matrices.")
            + (f" {ncu_text(p)}." if ncu_text(p) else ""))


# How the captured steps were counted (StepBudget.steps_from).
STEPS_FROM = {
    "trace": "the steps the trace marks",
    "request": "the steps the capture asked for",
    "span": "the span over the steady step (the trace marks no step)",
}


def _capture_cost_words(b: StepBudget, run: int | None) -> tuple[str, str]:
    """The capture's own slowdown: its title and observation."""
    over, steady = b.capture_overhead_ms or 0.0, b.steady_step_ms or 0.0
    share = over / steady if steady > 0 else 0.0
    how = STEPS_FROM.get(b.steps_from, "")
    who = f"Run {run}'s capture" if run else "The capture"  # like with like: one run's steps
    u = b.unprofiled
    return (f"{who} slowed its steps by {share:+.0%}",
            f"The captured steps averaged {b.captured_step_ms:.0f} ms against the steady {steady:.0f} ms "
            f"({over:+.0f} ms)"
            + (f" of the same run (run {run}, the job's last without ncu)" if run else "")
            + ": the profiler's own cost, which lands in the idle parts (the host runs slower; the kernels "
            "do not)"
            + (f"; steps counted from {how}" if how else "")
            + (f". The budget's host-side idle ({u.host_idle_ms:.0f} ms as captured) is scaled by "
               f"{u.factor:.2f} to the steady step before any gain is read from its gaps; the GPU's time is "
               "as captured" + (f", the data wait ({u.data_ms:.0f} ms) not scaled." if u.data_ms is not None
                                else ".") if u is not None
               else ". Read the idle parts with that in mind." if share > th.CAPTURE_SLOWDOWN.value else "."))


def class_shares_text(c: BudgetClass) -> str:
    """Where the step goes by class, the largest three by their short names: "memory 60%, compute 30%,
    launch 5% of the step" (why a capture's budget supports its class)."""
    top = sorted(((k, s) for k, s in c.shares.items() if s > 0), key=lambda ks: -ks[1])[:3]
    return ", ".join(f"{CLASS[k].short} {s:.0%}" for k, s in top) + " of the step"


def class_text(c: BudgetClass) -> str:
    """The class and why: its finding's title, the MFU grade's explanation where a capture divided the
    step (perfd.report.grade_text)."""
    return f"{c.cls} ({class_shares_text(c)})"


def budget_words(f: BudgetFacts) -> tuple[str, str]:
    """A budget finding's title and observation."""
    b = f.budget
    if f.said is BudgetSaid.PART and f.part is not None:
        return _part_words(b, f.part)
    if f.said is BudgetSaid.GEMM and f.part is not None:
        return _gemm_words(b, f.part)
    if f.said is BudgetSaid.CAPTURE_COST:
        return _capture_cost_words(b, f.run)
    if f.said is BudgetSaid.ALREADY:
        return already_words(f.moot)
    assert f.cls is not None
    return (f"Step budget: {class_text(f.cls)}",
            f"Where the {b.step_ms:.0f} ms step goes: {waterfall_text(b)}.")


def budget_source(f: BudgetFacts) -> str:
    """Where a budget finding's figures come from: the budget's label, and for a part where its time was
    read and how its kernels were attributed; for the GEMMs' efficiency, the capture and the FLOPs."""
    b = f.budget
    if f.said is BudgetSaid.PART and f.part is not None:
        return f"{f.label} ({f.part.source.value}, {b.attribution or 'timers'})"
    if f.said is BudgetSaid.GEMM:
        return f"{f.label} (capture + model FLOPs)"
    return f.label


def worded_budget(f: Finding) -> Finding:
    """A budget finding with its title, observation and source; any other as it is."""
    if not isinstance(f, BudgetFinding) or f.facts is None:
        return f
    title, observation = budget_words(f.facts)
    return dataclasses.replace(f, title=title, observation=observation, source=budget_source(f.facts),
                               facts=None)

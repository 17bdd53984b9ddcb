"""A job's step budget from what its run analysis holds: the steady-state timers and FLOPs, and the
capture that informs the job (perfd.analytics.breakdown.diagnosis.TimelineClass carries its device breakdown).
The same inputs give the same budget live (perfd.aggregator), after the job and offline (``perfd
analyze megatron LOG --capture TRACE``). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from perfd.analytics.breakdown import kernels as kc
from perfd.analytics.breakdown.budget import (
    FlopsContext,
    Source,
    StepBudget,
    TimerShares,
    from_timers,
)
from perfd.analytics.breakdown.capture_budget import from_capture
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.analytics.breakdown.diagnosis import TimelineClass
from perfd.analytics.breakdown.kernel_rows import figure, kernel_rows
from perfd.analytics.breakdown.ncu_rows import JoinedKernel, NcuCategory
from perfd.analytics.breakdown.op_parts import kernel_part
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.steps.flops import FORMULA_LEGACY, FlopsResult, FlopsSplit
from perfd.analytics.steps.gpus import PeakResult


def contexts(medians: Mapping[str, object], peak: PeakResult, pp: int | None,
             flops: FlopsResult | None = None, split: FlopsSplit | None = None
             ) -> tuple[FlopsContext, TimerShares]:
    """The FLOPs and timer context of a budget from a run summary's steady medians: FLOPs per GPU per
    step = model TFLOP/s per GPU × step time (both measured over the same steps); the GEMMs' and core
    attention's shares of them from ``split`` (perfd.analytics.steps.flops.flops_split: the count's own
    terms, or the formula's for the job's model where the count was stated whole), else from the
    formula's terms (``flops.breakdown``). With pipeline stages the exposed communication the budget
    holds is the data-parallel part: the p2p waits are the pipeline's idle, counted once, there."""
    step, tflops = figure(medians, "step_time_ms"), figure(medians, "model_tflops_per_gpu")
    per_gpu = tflops * 1e12 * step / 1e3 if step and tflops else None
    attn = gemm = None
    if per_gpu and split is not None:
        gemm = per_gpu * split.gemm_share
        attn = per_gpu * split.attention_share if split.attention_share else None
    elif per_gpu and flops is not None and flops.flops_per_iteration and "core_attention" in flops.breakdown:
        attn = per_gpu * flops.breakdown["core_attention"] / flops.flops_per_iteration or None
    halved = split.causal_halved if split is not None else (flops is None or flops.formula != FORMULA_LEGACY)
    fl = FlopsContext(per_gpu, peak.peak_tflops, peak.measured_ceiling_tflops, attn, halved, gemm,
                      split.basis if split is not None else None)
    staged = bool(pp and pp > 1)
    pipe = figure(medians, "pp_idle_max") if staged else 0.0
    comm = budget_comm(figure(medians, "comm_exposed_share"), figure(medians, "comm_exposed_dp_share"),
                       figure(medians, "comm_exposed_pp_share"), staged)
    t = TimerShares(step, figure(medians, "data_share"), comm, pipe, figure(medians, "optimizer_ms"),
                    figure(medians, "mfu"))
    return fl, t


def budget_comm(total: float | None, grad_sync: float | None, pipeline_p2p: float | None,
                staged: bool) -> float | None:
    """The share of the step a budget from timers books as exposed communication: all of the timed
    communication (``total``), but with pipeline stages only its data-parallel part (``grad_sync``, else
    ``total`` less the ``pipeline_p2p`` waits): those waits are the pipeline's idle, booked as its wait."""
    if not staged:
        return total
    if grad_sync is not None or total is None:
        return grad_sync
    return max(0.0, total - (pipeline_p2p or 0.0))


def captured_iterations(device: DeviceBreakdown, iterations: int | None, step_ms: float | None
                        ) -> tuple[float | None, str]:
    """How many steps a captured span holds, and how that is known: the steps the trace marks
    (torch.optim's or the profiler's step annotations), else what the capture asked for, else the span
    over the steady step (an offline trace that marks none), at least one."""
    marked = device.trace_steps
    if marked is not None and marked > 0:
        return float(marked), "trace"
    if iterations:
        return float(iterations), "request"
    span = device.span_ms
    return (max(1.0, round(span / step_ms)), "span") if span and step_ms else (None, "")


def job_budget(medians: Mapping[str, object], peak: PeakResult, pp: int | None,
               timeline: TimelineClass | None, flops: FlopsResult | None = None,
               split: FlopsSplit | None = None, rescale: bool = True) -> StepBudget | None:
    """The job's budget: from the capture that informs it (with an Nsight Compute capture's kernel
    figures on its parts; its steps brought back to the job's steady one where the profiler slowed them,
    unless ``rescale`` is False: a capture whose steps are not the job's), else from the timers alone."""
    fl, timers = contexts(medians, peak, pp, flops, split)
    if timeline is not None and timeline.device is not None:
        n, how = captured_iterations(timeline.device, timeline.iterations, timers.step_ms)
        b = from_capture(timeline.device, n, fl=fl, timers=timers, basis=timeline.source, steps_from=how,
                         rescale=rescale)
        if b is not None:
            return with_ncu(b, timeline.ncu, timeline.ncu_id, timeline.ncu_kernels, timeline.ncu_joined_to)
    b = from_timers(timers, fl)
    # No timeline, an ncu capture: its rows still say what the step's kernels do (they once
    # lived only in /api/captures), on the undivided compute part.
    if b is None or timeline is None:
        return b
    return with_ncu(b, timeline.ncu, timeline.ncu_id, timeline.ncu_kernels, timeline.ncu_joined_to)


# perfd.analytics.breakdown.kernels category of an ncu summary -> the budget part its kernels' time is in
# (GEMMs:
# the linear layers' part when the capture divided by op, else the GEMMs known by name)
_NCU_PART = {kc.GEMM: Part.GEMM, kc.OPTIMIZER: Part.OPTIMIZER, kc.ELEMENTWISE: Part.POINTWISE,
             kc.NORMALIZATION: Part.NORM, kc.REDUCTION: Part.POINTWISE, kc.OTHER: Part.POINTWISE}


def _ncu_part(b: StepBudget, category: str) -> Part | None:
    """The budget part an ncu category's kernel time is in (attention: the unfused part when there is
    one, else the GEMMs, where fused attention is; the timers' budget: its undivided compute)."""
    math = Part.LINEAR if b.get(Part.LINEAR) is not None else Part.GEMM
    part = (Part.ATTENTION if b.get(Part.ATTENTION) is not None else math) \
        if category == kc.ATTENTION else _NCU_PART.get(category)
    if part is Part.GEMM:
        part = math
    if part is not None and b.get(part) is None and b.get(Part.COMPUTE) is not None:
        part = Part.COMPUTE  # the timers' budget: its compute is not divided by kernel
    return part


def _own_part(b: StepBudget, part: str | None) -> Part | None:
    """The part a row (an ncu kernel or category summary) was matched to launch by launch, where the
    budget has it (perfd.analytics.ncu.launches): the op that launched it decides, not its name."""
    try:
        own = Part(str(part))
    except ValueError:
        return None
    return own if b.get(own) is not None else None


def _kernel_part(b: StepBudget, k: JoinedKernel, unfused_attention: bool) -> Part | None:
    """The part one ncu kernel's time is in: the part its name gives (as a capture divides kernels it
    cannot charge to an op: perfd.analytics.breakdown.op_parts.kernel_part; a masked fill beside softmax
    kernels
    is attention's, a GELU the activation's) where the budget has that part, else its category's."""
    name = k.timeline_name or k.kernel.name
    part = kernel_part(name, unfused_attention)
    if part is not Part.GEMM and b.get(part) is not None:
        return part
    return _ncu_part(b, k.category or kc.category(name))


def with_ncu(b: StepBudget, categories: Sequence[NcuCategory], capture_id: str,
             kernels: Sequence[JoinedKernel] = (), joined_to: str | None = None) -> StepBudget:
    """``b`` with each ncu category summary on the part its kernels' time is in (BudgetPart.ncu), and
    that part's top kernels (perfd.analytics.breakdown.kernel_rows.KernelRow, from the capture's joined
    rows ``kernels``, joined to the timeline of capture ``joined_to``) in its ``ncu_kernels``."""
    if not categories and not kernels:
        return b
    by: dict[Part, list[NcuCategory]] = {}
    for c in categories:
        part = _own_part(b, c.summary.part) or _ncu_part(b, c.summary.category)
        if part is not None:
            by.setdefault(part, []).append(replace(c, capture=capture_id))
    rows: dict[Part, list[JoinedKernel]] = {}
    unfused = any(kc.is_softmax(k.timeline_name or k.kernel.name) for k in kernels)
    for k in kernels:
        part = _own_part(b, k.part) or _kernel_part(b, k, unfused)
        if part is not None:
            rows.setdefault(part, []).append(k)
    parts = []
    for p in b.parts:
        cats = tuple(by[p.part]) if p.part in by else p.ncu
        ceiling = p.detail.get("of_ceiling")
        ks = tuple(kernel_rows(rows[p.part], p.ms, capture_id, of_ceiling=float(ceiling)
                               if isinstance(ceiling, (int, float)) else None, joined_to=joined_to)) \
            if p.part in rows else p.ncu_kernels
        parts.append(replace(p, ncu=cats, ncu_kernels=ks) if cats != p.ncu or ks != p.ncu_kernels else p)
    return replace(b, parts=tuple(parts), sources=(*b.sources, Source.NCU) if Source.NCU not in b.sources
                   else b.sources)

"""A step budget from one captured device (perfd.analytics.breakdown.device_breakdown): its parts per
step, from the complete steps between the trace's first and last step marks where it marks two or
more (a step the capture window cut is then found and kept out, issue "the plan an engineer would
make" item 6), else the whole span over the steps; its idle by cause and its parts by phase. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown import kernels as kc
from perfd.analytics.breakdown.advice_registry import MATH_PARTS
from perfd.analytics.breakdown.budget import (
    NO_FLOPS,
    NO_TIMERS,
    BudgetPart,
    CutPart,
    FlopsContext,
    IdleCause,
    IdleShare,
    PartDetail,
    Row,
    Source,
    StepBudget,
    TimerShares,
    Top,
    Unprofiled,
    Window,
    attention_detail,
    finish,
    math_detail,
    phase_parts,
)
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown, KernelStat, Stretch
from perfd.analytics.breakdown.step_parts import Part

_IDLE = (Part.IDLE_SYNC, Part.IDLE_SHORT, Part.IDLE_SWITCH, Part.IDLE_LONG, Part.DATA)


def _parts(raw: Mapping[str, float], n: float) -> dict[Part, float]:
    per: dict[Part, float] = {}
    for k, v in raw.items():
        try:
            per[Part(str(k))] = per.get(Part(str(k)), 0.0) + v / n
        except ValueError:
            continue
    return per


def window_of(device: DeviceBreakdown, marked: float | None) -> tuple[Window | None, Stretch | None]:
    """How the span divides into steps, and the stretch the per-step values come from: the complete
    steps (the device's ``complete``) where there is one, else None (the device itself)."""
    comp = device.complete
    if comp is None:
        return (Window(int(marked), 0) if marked else None), None
    steps = comp.steps
    m = int(marked) if marked else steps
    edge_steps = m - steps
    cut: list[CutPart] = []
    if edge_steps > 0 and device.parts_ms:
        for k, v in comp.parts_ms.items():
            try:
                part = Part(k)
            except ValueError:
                continue
            per = v / steps
            if part in _IDLE or per < th.WINDOW_CUT_MIN_MS.value:
                continue
            edge = device.parts_ms.get(k, 0.0) - v
            expected = per * edge_steps
            if edge < (1 - th.WINDOW_CUT.value) * expected:
                cut.append(CutPart(part, edge, expected))
    return Window(m, steps, tuple(cut)), comp


def from_capture(
    device: DeviceBreakdown,
    iterations: float | None,
    *,
    fl: FlopsContext = NO_FLOPS,
    timers: TimerShares = NO_TIMERS,
    basis: str = "",
    steps_from: str = "",
    rescale: bool = True,
) -> StepBudget | None:
    """The budget of one captured device (its ``parts_ms``) over
    ``iterations`` steps (None: the whole captured span as one step); where the trace marks two steps
    or more, per step from the complete steps between its first and last mark (:func:`window_of`). The
    timers' data share, where they measure one and the capture saw no data-loader wait of its own, says
    how much of the host's idle was the wait for data. A breakdown from before the attribution is
    rebuilt from its shares (:func:`device_parts`, said in ``attribution``). Steps the profiler slowed
    are brought back to the job's steady step (:func:`unprofiled`; ``rescale=False``: read as captured,
    a capture whose steps are not the job's)."""
    window, comp = window_of(device, iterations)
    if comp is not None:
        raw, how = dict(comp.parts_ms), device.attribution or "kernel names"
        n = float(comp.steps)  # window_of gave a whole number of steps, at least 1
    else:
        raw, how = device_parts(device)
        n = iterations if iterations and iterations > 0 else 1.0
    if not raw:
        return None
    per = _parts(raw, n)
    if sum(per.values()) <= 0:
        return None
    n_span = iterations if iterations and iterations > 0 else n  # the kernel and op tops span the window
    op_ms = comp.part_op_ms if comp is not None else device.part_op_ms
    rows: list[Row] = []
    if timers.data and timers.step_ms and Part.DATA not in per:
        # the timed data wait, in the host's idle: its long gaps, else after the batch timer's sync;
        # one part, whichever idle it came from (two rows of it read as the wait shown twice, at half)
        want = timers.data * sum(per.values())
        taken: dict[str, float] = {}
        for p in (Part.IDLE_LONG, Part.IDLE_SYNC):
            take = min(per.get(p, 0.0), want)
            if take > 0:
                per[p] -= take
                want -= take
                taken[p.value] = take
        if taken:
            rows.append((Part.DATA, sum(taken.values()), Source.TIMERS,
                         PartDetail(timer_share=timers.data, from_idle_ms=taken)))
    latency = (comp if comp is not None else device).launch_latency_ms
    for p, ms in per.items():
        detail = PartDetail(kernels=_top(device.part_kernels, p, n_span),
                            ops=_top(device.part_ops, p, n_span))
        by_op = op_ms.get(p.value)
        if by_op is not None:
            detail["op_ms"] = {k: v / n for k, v in by_op.items()}
        if p in MATH_PARTS:
            detail.update(math_detail(p, ms, fl))
        elif p is Part.ATTENTION:
            detail.update(attention_detail(ms, fl, device.attention_fused))
        elif p is Part.OPTIMIZER and timers.optimizer_ms is not None:
            detail["timer_ms"] = timers.optimizer_ms  # the framework's own optimizer timer: a cross-check
        elif p is Part.POINTWISE and (made := _made_of(device.made_of, ms)):
            detail["made_of"] = made
        if p is Part.IDLE_SHORT and latency is not None:
            detail["under_5us_ms"] = latency / n  # the launches themselves
        if (on_side := device.side_stream_ms.get(p.value)) is not None and p not in _IDLE:
            detail["side_stream_ms"] = on_side / n_span
        rows.append((p, ms, Source.CAPTURE, detail))
    sources = [Source.CAPTURE, *([Source.TIMERS] if timers.data else [])]
    host_side = {"syncs": device.syncs, "sync_gap_ms": device.sync_gap_ms,
                 "stream_syncs": device.stream_syncs, "stream_sync_gap_ms": device.stream_sync_gap_ms}
    host = {k: float(v) / n_span for k, v in host_side.items() if v is not None}
    idle = tuple(IdleShare(r.cause, r.phase, r.owner, r.ms / n, r.gaps / n)
                 for r in (comp.idle if comp is not None else device.idle))
    phase_ms = comp.phase_ms if comp is not None else device.phase_ms
    phases = {ph: {p: v / n for p, v in d.items()} for ph, d in phase_parts(phase_ms).items()}
    b = replace(
        finish(rows, sources, fl),
        iterations=n if window is not None and window.complete else iterations,
        basis=basis,
        attribution=how,
        steady_step_ms=timers.step_ms,
        step_sd_ms=timers.step_sd_ms,
        mfu=timers.mfu,
        steps_from=steps_from,
        host=host,
        idle=idle,
        phase_ms=phases,
        window=window,
        replay=device.replay,
        facts=device.facts,
        optimizer=device.optimizer,
        casts=device.casts,
        splitk=device.splitk,
        recompute=device.recompute,
    )
    return unprofiled(b) if rescale else b


# The host's gaps, which a profiler lengthens (it records every op the host runs: ~+45% on the eager
# Trainer's host-bound H200 steps, 422 ms captured against 293 unprofiled): the idle after syncs and
# their refills, the launch gaps, the host elsewhere, the data wait. The GPU's own time (its kernels, and
# its switches between kernels the host had queued) a host-side profiler does not change.
HOST_IDLE = (Part.IDLE_SYNC, Part.IDLE_SHORT, Part.IDLE_LONG, Part.DATA)
_HOST_CAUSES = frozenset((IdleCause.SYNC, IdleCause.REFILL, IdleCause.LAUNCH, IdleCause.HOST,
                          IdleCause.DATA))
_HOST_GAP_KEYS = ("sync_gap_ms", "stream_sync_gap_ms")


def _timed_data(p: BudgetPart) -> float | None:
    """The timers' share of the step for a data part taken from them (None: the capture's own)."""
    share = p.detail.get("timer_share")
    return float(share) if p.part is Part.DATA and p.source is Source.TIMERS and \
        isinstance(share, (int, float)) else None


def unprofiled(b: StepBudget) -> StepBudget:
    """``b`` brought back to the job's unprofiled step where the profiler slowed its steps (the captured
    step th.CAPTURE_SLOWDOWN or more over the job's steady one, not past th.CAPTURE_OTHER_JOB_STEP: a
    capture that far off is another job's, perfd.analytics.breakdown.capture_match): its host-side
    idle (:data:`HOST_IDLE`, its idle rows, phases and sync gaps) scaled by one factor so that the step
    is the steady one, the GPU's time as captured, a data wait the timers measured their share of the
    steady step, one the capture saw as captured; said in ``unprofiled``. Unchanged where nothing is to
    scale (no steady step, the GPU's time alone past the steady step)."""
    steady = b.steady_step_ms
    if not b.has_kernels or not steady or steady <= 0 or b.unprofiled is not None:
        return b
    ratio = b.step_ms / steady
    if ratio < 1 + th.CAPTURE_SLOWDOWN.value or ratio > th.CAPTURE_OTHER_JOB_STEP.value:
        return b
    host = sum(b.ms(p) for p in HOST_IDLE)
    gpu = b.step_ms - host
    timers = {p.part: share * steady for p in b.parts if (share := _timed_data(p)) is not None}
    # the capture's own data wait is the job's: the profiler's cost is per op it records, and a data
    # loader's fetch records a few dozen in tens of ms (perfd.capture.step_replay); where it and the GPU's
    # time leave the other gaps no room (a steady step from another machine or configuration), it is
    # scaled with them, as the timers' is not
    captured: dict[Part, float] = {p.part: p.ms for p in b.parts
                                   if p.part is Part.DATA and p.part not in timers}
    kept: tuple[dict[Part, float], ...] = ({**timers, **captured}, timers)
    for timed in kept:
        rest = host - sum(b.ms(p) for p in timed)  # the host's gaps the factor scales
        if rest > 0 and gpu + sum(timed.values()) < steady:
            break
    else:
        return b
    f = (steady - gpu - sum(timed.values())) / rest
    scaled = {p.part: timed.get(p.part, p.ms * f) for p in b.parts if p.part in HOST_IDLE}
    each = {p.part: scaled[p.part] / p.ms if p.ms > 0 else f for p in b.parts if p.part in HOST_IDLE}
    step = gpu + sum(scaled.values())
    parts = []
    for p in b.parts:
        if p.part not in HOST_IDLE:
            parts.append(replace(p, share=p.ms / step))
            continue
        ms = scaled[p.part]
        detail = PartDetail(**p.detail)
        if isinstance(latency := detail.get("under_5us_ms"), (int, float)):
            detail["under_5us_ms"] = min(float(latency), ms)  # the launches themselves: not lengthened
        if isinstance(taken := detail.get("from_idle_ms"), dict):
            detail["from_idle_ms"] = {key: v * each[p.part] for key, v in taken.items()}
        parts.append(replace(p, ms=ms, share=ms / step, detail=detail))
    idle = tuple(replace(r, ms=r.ms * (each.get(Part.DATA, f) if r.cause is IdleCause.DATA else f))
                 if r.cause in _HOST_CAUSES else r for r in b.idle)
    phases = {ph: {p: v * each.get(p, f) if p in HOST_IDLE else v for p, v in d.items()}
              for ph, d in b.phase_ms.items()}
    host_side = {k: v * f if k in _HOST_GAP_KEYS else v for k, v in b.host.items()}
    return replace(b, step_ms=step, parts=tuple(parts), idle=idle, phase_ms=phases, host=host_side,
                   unprofiled=Unprofiled(b.step_ms, steady, rest, f, timed.get(Part.DATA)))


def _made_of(kinds: Mapping[str, float], part_ms: float) -> dict[str, float]:
    """The pointwise part's ms per step by kind, largest first: the kinds' summed kernel time over the
    span, in proportion, scaled to the part's own (exclusive) ms, so that the kinds add up to the part."""
    total = sum(v for v in kinds.values() if v > 0)
    if total <= 0:
        return {}
    return {k: v / total * part_ms for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v > 0}


def _top(by_part: Mapping[str, tuple[KernelStat, ...]], part: Part, n: float) -> list[Top]:
    """The part's top kernels (or ops), per step."""
    return [Top(name=k.name, ms=k.total_ms / n, count=k.count / n) for k in by_part.get(part.value, ())]


def device_parts(device: DeviceBreakdown) -> tuple[dict[str, float], str]:
    """A captured device's exclusive parts (``parts_ms``), and how they were had (its ``attribution``,
    perfd.capture.ops.Method). A breakdown from before the attribution existed has busy, idle,
    SendRecv and exposed NCCL, and kernel category shares (or only its top kernels): its parts are
    rebuilt from those, the compute time divided by the categories' shares, and the basis says so."""
    if device.parts_ms:
        return dict(device.parts_ms), device.attribution or "kernel names"
    busy, idle, exposed = device.busy_ms, device.idle_ms, device.comm_exposed_ms
    if busy <= 0:
        return {}, "no breakdown"
    pipeline = min(device.sendrecv_ms, exposed)
    out = {Part.PIPELINE.value: pipeline, Part.COMM_EXPOSED.value: exposed - pipeline}
    short = min(device.idle_short_ms or 0.0, idle)
    out[Part.IDLE_SHORT.value], out[Part.IDLE_LONG.value] = short, idle - short
    split = "" if device.idle_short_ms is not None else "; idle not split into gaps: all counted long"
    basis = "category shares of all kernels (an older breakdown)" + split
    top = device.top_kernels
    softmax_ms = (
        device.softmax_ms
        if device.softmax_ms is not None
        else sum(k.total_ms for k in top if kc.is_softmax(k.name))
    )
    by_cat = device.categories()
    if not by_cat:
        basis = f"category shares of the top {len(top)} kernels only" + split
        for k in top:
            c = kc.category(k.name)
            by_cat[c] = by_cat.get(c, 0.0) + k.total_ms
    shares = {c: v for c, v in by_cat.items() if not c.startswith(kc.NCCL_PREFIX)}
    total = sum(shares.values())
    compute = max(busy - exposed, 0.0)
    softmax = min(softmax_ms, compute)
    to_part = {
        kc.GEMM: Part.GEMM,
        kc.ATTENTION: Part.GEMM,
        kc.OPTIMIZER: Part.OPTIMIZER,
        kc.MEMCPY: Part.MEMCPY,
        kc.NORMALIZATION: Part.NORM,
    }
    for c, v in shares.items():
        p = to_part.get(c, Part.POINTWISE).value
        out[p] = out.get(p, 0.0) + (compute - softmax) * v / total if total else 0.0
    out[Part.ATTENTION.value] = out.get(Part.ATTENTION.value, 0.0) + softmax
    if not total:
        out[Part.POINTWISE.value] = out.get(Part.POINTWISE.value, 0.0) + compute - softmax
    return {k: v for k, v in out.items() if v > 0}, basis

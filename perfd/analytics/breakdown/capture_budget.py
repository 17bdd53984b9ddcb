"""A step budget from one captured device (perfd.capture.analysis JSON): its parts per step, from the
complete steps between the trace's first and last step marks where it marks two or more (a step the
capture window cut is then found and kept out, issue "the plan an engineer would make" item 6), else
the whole span over the steps; its idle by cause and its parts by phase. Pure.
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
    CutPart,
    FlopsContext,
    IdleShare,
    PartDetail,
    Row,
    Source,
    StepBudget,
    TimerShares,
    Top,
    Window,
    attention_detail,
    finish,
    math_detail,
    phase_parts,
)
from perfd.analytics.breakdown.kernel_rows import figure
from perfd.analytics.breakdown.replay_table import ReplayTable
from perfd.analytics.breakdown.step_parts import Part
from perfd.typed import obj, objs

_IDLE = (Part.IDLE_SYNC, Part.IDLE_SHORT, Part.IDLE_LONG, Part.DATA)


def _parts(raw: Mapping[str, float], n: float) -> dict[Part, float]:
    per: dict[Part, float] = {}
    for k, v in raw.items():
        try:
            per[Part(str(k))] = per.get(Part(str(k)), 0.0) + v / n
        except ValueError:
            continue
    return per


def _ms(d: object) -> dict[str, float]:
    """A JSON ``{name: ms}`` as numbers; an entry that is not a number is left out."""
    return {str(k): v for k in obj(d) if (v := figure(obj(d), k)) is not None}


def window_of(device: Mapping[str, object], marked: float | None
              ) -> tuple[Window | None, Mapping[str, object]]:
    """How the span divides into steps, and the stretch the per-step values come from: the complete
    steps (the device's ``complete``) where there is one, else the device itself."""
    comp = device.get("complete")
    steps = comp.get("steps") if isinstance(comp, Mapping) else None
    if not isinstance(comp, Mapping) or not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        return (Window(int(marked), 0) if marked else None), device
    m = int(marked) if marked else steps
    edge_steps = m - steps
    cut: list[CutPart] = []
    whole, inner = device.get("parts_ms"), comp.get("parts_ms")
    if edge_steps > 0 and isinstance(whole, Mapping) and isinstance(inner, Mapping):
        for k, v in _ms(inner).items():
            try:
                part = Part(k)
            except ValueError:
                continue
            per = v / steps
            if part in _IDLE or per < th.WINDOW_CUT_MIN_MS.value:
                continue
            edge = (figure(whole, k) or 0.0) - v
            expected = per * edge_steps
            if edge < (1 - th.WINDOW_CUT.value) * expected:
                cut.append(CutPart(part, edge, expected))
    return Window(m, steps, tuple(cut)), comp


def from_capture(
    device: Mapping[str, object],
    iterations: float | None,
    *,
    fl: FlopsContext = NO_FLOPS,
    timers: TimerShares = NO_TIMERS,
    basis: str = "",
    steps_from: str = "",
) -> StepBudget | None:
    """The budget of one captured device (perfd.capture.analysis JSON with ``parts_ms``) over
    ``iterations`` steps (None: the whole captured span as one step); where the trace marks two steps
    or more, per step from the complete steps between its first and last mark (:func:`window_of`). The
    timers' data share, where they measure one and the capture saw no data-loader wait of its own, says
    how much of the host's idle was the wait for data. A breakdown from before the attribution is
    rebuilt from its shares (:func:`device_parts`, said in ``attribution``)."""
    window, src = window_of(device, iterations)
    if src is not device:
        raw, how = _ms(src.get("parts_ms")), str(device.get("attribution") or "kernel names")
        n = figure(src, "steps") or 1.0  # window_of gave a whole number of steps, at least 1
    else:
        raw, how = device_parts(device)
        n = iterations if iterations and iterations > 0 else 1.0
    if not raw:
        return None
    per = _parts(raw, n)
    if sum(per.values()) <= 0:
        return None
    n_span = iterations if iterations and iterations > 0 else n  # the kernel and op tops span the window
    pk, po, pom = (
        device.get("part_kernels"),
        src.get("part_ops") or device.get("part_ops"),
        src.get("part_op_ms"),
    )
    kernels, ops, op_ms = obj(pk), obj(po), obj(pom)
    fused = bool(device.get("attention_fused"))
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
    side = obj(device.get("side_stream_ms"))
    for p, ms in per.items():
        detail = PartDetail(kernels=_top(kernels, p, n_span), ops=_top(ops, p, n_span))
        by_op = op_ms.get(p.value)
        if isinstance(by_op, Mapping):
            detail["op_ms"] = {str(k): float(v) / n for k, v in by_op.items() if isinstance(v, (int, float))}
        if p in MATH_PARTS:
            detail.update(math_detail(p, ms, fl))
        elif p is Part.ATTENTION:
            detail.update(attention_detail(ms, fl, fused))
        elif p is Part.OPTIMIZER and timers.optimizer_ms is not None:
            detail["timer_ms"] = timers.optimizer_ms  # the framework's own optimizer timer: a cross-check
        if p is Part.IDLE_SHORT and (latency := figure(src, "launch_latency_ms")) is not None:
            detail["under_5us_ms"] = latency / n  # the launches themselves
        if (on_side := figure(side, p.value)) is not None and p not in _IDLE:
            detail["side_stream_ms"] = on_side / n_span
        rows.append((p, ms, Source.CAPTURE, detail))
    sources = [Source.CAPTURE, *([Source.TIMERS] if timers.data else [])]
    host = {
        k: v / n_span
        for k in ("syncs", "sync_gap_ms", "stream_syncs", "stream_sync_gap_ms")
        if (v := figure(device, k)) is not None
    }
    idle = tuple(
        r
        for x in objs(src.get("idle"))
        if (r := IdleShare.from_json({**x, "ms": (figure(x, "ms") or 0.0) / n,
                                      "gaps": (figure(x, "gaps") or 0.0) / n})) is not None
    )
    phases = {ph: {p: v / n for p, v in d.items()} for ph, d in phase_parts(src.get("phase_ms")).items()}
    return replace(
        finish(rows, sources, fl),
        iterations=n if window is not None and window.complete else iterations,
        basis=basis,
        attribution=how,
        steady_step_ms=timers.step_ms,
        mfu=timers.mfu,
        steps_from=steps_from,
        host=host,
        idle=idle,
        phase_ms=phases,
        window=window,
        replay=ReplayTable.from_json(device.get("replay")),
    )


def _top(by_part: Mapping[str, object], part: Part, n: float) -> list[Top]:
    """The part's top kernels (or ops), per step."""
    return [Top(name=str(k.get("name", "?")), ms=(figure(k, "total_ms") or 0.0) / n,
                count=(figure(k, "count") or 0.0) / n) for k in objs(by_part.get(part.value))]


def device_parts(device: Mapping[str, object]) -> tuple[dict[str, float], str]:
    """A captured device's exclusive parts (``parts_ms``), and how they were had (its ``attribution``,
    perfd.capture.ops.Method). A breakdown from before the attribution existed has busy, idle,
    SendRecv and exposed NCCL, and kernel category shares (or only its top kernels): its parts are
    rebuilt from those, the compute time divided by the categories' shares, and the basis says so."""
    raw = device.get("parts_ms")
    if isinstance(raw, Mapping) and raw:
        return _ms(raw), str(device.get("attribution") or "kernel names")

    def num(key: str) -> float:
        return figure(device, key) or 0.0

    busy, idle, exposed = num("busy_ms"), num("idle_ms"), num("comm_exposed_ms")
    if busy <= 0:
        return {}, "no breakdown"
    pipeline = min(num("sendrecv_ms"), exposed)
    out = {Part.PIPELINE.value: pipeline, Part.COMM_EXPOSED.value: exposed - pipeline}
    short = min(num("idle_short_ms"), idle)
    out[Part.IDLE_SHORT.value], out[Part.IDLE_LONG.value] = short, idle - short
    split = "" if device.get("idle_short_ms") is not None else "; idle not split into gaps: all counted long"
    cats = device.get("categories")
    basis = "category shares of all kernels (an older breakdown)" + split
    top = objs(device.get("top_kernels"))
    softmax_ms = (
        num("softmax_ms")
        if device.get("softmax_ms") is not None
        else sum(figure(k, "total_ms") or 0.0 for k in top if kc.is_softmax(str(k.get("name", ""))))
    )
    by_cat = _ms(cats)
    if not isinstance(cats, Mapping) or not cats:
        by_cat, basis = {}, f"category shares of the top {len(top)} kernels only" + split
        for k in top:
            c = kc.category(str(k.get("name", "")))
            by_cat[c] = by_cat.get(c, 0.0) + (figure(k, "total_ms") or 0.0)
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

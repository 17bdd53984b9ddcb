"""A step budget from one captured device (perfd.capture.analysis JSON): its parts per step, from the
complete steps between the trace's first and last step marks where it marks two or more (a step the
capture window cut is then found and kept out, issue "the plan an engineer would make" item 6), else
the whole span over the steps; its idle by cause and its parts by phase. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown import kernels as kc
from perfd.analytics.breakdown.advice_registry import MATH_PARTS
from perfd.analytics.breakdown.budget import (
    NO_FLOPS,
    NO_TIMERS,
    CutPart,
    FlopsContext,
    IdleShare,
    Source,
    StepBudget,
    TimerShares,
    Window,
    attention_detail,
    finish,
    math_detail,
    phase_parts,
)
from perfd.analytics.breakdown.replay_table import ReplayTable
from perfd.analytics.breakdown.step_parts import Part

_IDLE = (Part.IDLE_SYNC, Part.IDLE_SHORT, Part.IDLE_LONG, Part.DATA)


def _num(d: Mapping[str, object], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _parts(raw: Mapping[str, Any], n: float) -> dict[Part, float]:
    per: dict[Part, float] = {}
    for k, v in raw.items():
        try:
            per[Part(str(k))] = per.get(Part(str(k)), 0.0) + float(v) / n
        except (ValueError, TypeError):
            continue
    return per


def window_of(device: Mapping[str, Any], marked: float | None) -> tuple[Window | None, Mapping[str, Any]]:
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
        for k, v in inner.items():
            try:
                part = Part(str(k))
            except ValueError:
                continue
            per = float(v) / steps
            if part in _IDLE or per < th.WINDOW_CUT_MIN_MS.value:
                continue
            edge = float(whole.get(k) or 0.0) - float(v)
            expected = per * edge_steps
            if edge < (1 - th.WINDOW_CUT.value) * expected:
                cut.append(CutPart(part, edge, expected))
    return Window(m, steps, tuple(cut)), comp


def from_capture(
    device: Mapping[str, Any],
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
        raw, how = dict(src.get("parts_ms") or {}), str(device.get("attribution") or "kernel names")
        n = float(src["steps"])
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
    kernels: Mapping[str, Any] = pk if isinstance(pk, Mapping) else {}
    ops: Mapping[str, Any] = po if isinstance(po, Mapping) else {}
    op_ms: Mapping[str, Any] = pom if isinstance(pom, Mapping) else {}
    fused = bool(device.get("attention_fused"))
    rows: list[tuple[Part, float, Source, dict[str, Any]]] = []
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
                         {"timer_share": timers.data, "from_idle_ms": taken}))
    side = device.get("side_stream_ms") if isinstance(device.get("side_stream_ms"), Mapping) else {}
    for p, ms in per.items():
        detail: dict[str, Any] = {"kernels": _top(kernels, p, n_span), "ops": _top(ops, p, n_span)}
        by_op = op_ms.get(p.value)
        if isinstance(by_op, Mapping):
            detail["op_ms"] = {str(k): float(v) / n for k, v in by_op.items() if isinstance(v, (int, float))}
        if p in MATH_PARTS:
            detail.update(math_detail(p, ms, fl))
        elif p is Part.ATTENTION:
            detail.update(attention_detail(ms, fl, fused))
        elif p is Part.OPTIMIZER and timers.optimizer_ms is not None:
            detail["timer_ms"] = timers.optimizer_ms  # the framework's own optimizer timer: a cross-check
        if p is Part.IDLE_SHORT and _num(src, "launch_latency_ms") is not None:
            detail["under_5us_ms"] = float(src["launch_latency_ms"]) / n  # the launches themselves
        if isinstance(side, Mapping) and isinstance(side.get(p.value), (int, float)) and p not in _IDLE:
            detail["side_stream_ms"] = float(side[p.value]) / n_span
        rows.append((p, ms, Source.CAPTURE, detail))
    sources = [Source.CAPTURE, *([Source.TIMERS] if timers.data else [])]
    host = {
        k: float(device[k]) / n_span
        for k in ("syncs", "sync_gap_ms", "stream_syncs", "stream_sync_gap_ms")
        if _num(device, k) is not None
    }
    idle = tuple(
        r
        for x in src.get("idle") or []
        if isinstance(x, Mapping)
        and (
            r := IdleShare.from_json(
                {**x, "ms": float(x.get("ms") or 0.0) / n, "gaps": float(x.get("gaps") or 0.0) / n}
            )
        )
        is not None
    )
    phases = {ph: {p: v / n for p, v in d.items()} for ph, d in phase_parts(src.get("phase_ms")).items()}
    return finish(
        rows,
        sources,
        fl,
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


def _top(by_part: Mapping[str, Any], part: Part, n: float) -> list[dict[str, Any]]:
    """The part's top kernels (or ops), per step."""
    out = []
    for k in by_part.get(part.value) or []:
        if isinstance(k, Mapping):
            out.append(
                {
                    "name": str(k.get("name", "?")),
                    "ms": float(k.get("total_ms") or 0.0) / n,
                    "count": float(k.get("count") or 0) / n,
                }
            )
    return out


def device_parts(device: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    """A captured device's exclusive parts (``parts_ms``), and how they were had (its ``attribution``,
    perfd.capture.ops.Method). A breakdown from before the attribution existed has busy, idle,
    SendRecv and exposed NCCL, and kernel category shares (or only its top kernels): its parts are
    rebuilt from those, the compute time divided by the categories' shares, and the basis says so."""
    raw = device.get("parts_ms")
    if isinstance(raw, Mapping) and raw:
        parts = {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float))}
        return parts, str(device.get("attribution") or "kernel names")

    def num(key: str) -> float:
        v = device.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0

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
    top = [k for k in device.get("top_kernels") or [] if isinstance(k, Mapping)]
    softmax_ms = (
        num("softmax_ms")
        if device.get("softmax_ms") is not None
        else sum(float(k.get("total_ms") or 0.0) for k in top if kc.is_softmax(str(k.get("name", ""))))
    )
    if not isinstance(cats, Mapping) or not cats:
        cats, basis = {}, f"category shares of the top {len(top)} kernels only" + split
        for k in top:
            c = kc.category(str(k.get("name", "")))
            cats[c] = cats.get(c, 0.0) + float(k.get("total_ms") or 0.0)
    shares = {str(c): float(v) for c, v in cats.items() if not str(c).startswith(kc.NCCL_PREFIX)}
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

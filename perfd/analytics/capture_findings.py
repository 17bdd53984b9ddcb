"""Findings from a capture's per-device breakdown (nsys or Kineto), as pure functions.

Input is the JSON of perfd.capture.analysis (``devices``: span, busy, idle, NCCL, SendRecv and the
kernel ``categories`` of perfd.analytics.kernels), optionally with what the job's steady state says
(forward+backward compute per iteration from its timers) and how many iterations the capture
covered. Output: findings with evidence and recommendations (DESIGN.md §2 playbook), and the
bottleneck class the timeline supports. A device without the numbers a rule needs gives no
finding for that rule, never a guess.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics import kernels as kc
from perfd.analytics import thresholds as th
from perfd.analytics.common import BACKWARD_COMPUTE, FORWARD_COMPUTE
from perfd.analytics.findings import Finding, Recommendation
from perfd.model import StepRecord

ELEMENTWISE_HEAVY = 0.35  # pointwise + normalisation share of kernel time: unfused model code
GEMM_DOMINANT = 0.5  # GEMM + attention share: the GPU does the model's math
SENDRECV_DOMINANT = 0.2  # SendRecv ÷ busy time on a device: a stage waiting for its peer
IDLE_HIGH = 0.2  # idle ÷ span: the GPU waits for the host
TINY_KERNEL_US = 10.0  # median kernel shorter than this with idle gaps: launch-bound
EXPOSED_COMM_HIGH = 0.2  # exposed NCCL ÷ span
SLOWER_THAN_STEADY = 1.3  # kernel time per captured iteration ÷ the job's steady compute
SHORT_GAPS_DOMINATE = th.SHORT_GAPS_DOMINATE.value
SHORT_GAP_US = th.SHORT_GAP_S.value * 1e6


@dataclass
class CaptureDiagnosis:
    findings: list[Finding] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    bottleneck: str = "unknown"
    bottleneck_reason: str = "no device in the capture"
    # device -> compute kernel time per captured iteration ÷ the job's steady compute, where that is
    # at least SLOWER_THAN_STEADY (typed: an incident's evidence reads this, not the finding's text)
    slowdown: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"findings": [asdict(f) for f in self.findings],
                "recommendations": [asdict(r) for r in self.recommendations],
                "bottleneck": self.bottleneck, "bottleneck_reason": self.bottleneck_reason,
                "slowdown": {str(k): v for k, v in self.slowdown.items()}}


COMPUTE_TIMERS = (FORWARD_COMPUTE, BACKWARD_COMPUTE)  # Megatron timers: the rank's model compute


def steady_compute_ms(records: Sequence[StepRecord], steady: Iterable[int], rank: int | None = None
                      ) -> float | None:
    """Median forward+backward compute per steady iteration (Megatron timers, ms): of ``rank``
    where the timers are per rank, else the slowest rank's. None without both timers."""
    want = set(steady)
    vals = []
    for r in records:
        if r.iteration not in want:
            continue
        parts = []
        for name in COMPUTE_TIMERS:
            tv = r.timers.get(name)
            v = (tv.per_rank.get(rank) if tv is not None and rank is not None and tv.per_rank else None)
            if v is None and tv is not None:
                v = tv.max_ms
            parts.append(v)
        if all(p is not None for p in parts):
            vals.append(sum(p for p in parts if p is not None))
    return statistics.median(vals) if vals else None


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _shares(dev: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    """category -> share of kernel time, and where it came from. A breakdown from before kernel
    categories existed has only its top kernels: those are categorised (and the basis said)."""
    cats = dev.get("categories")
    if isinstance(cats, Mapping) and cats:
        return {str(k): float(v) for k, v in cats.items()}, "all kernels"
    top = [k for k in dev.get("top_kernels") or [] if isinstance(k, Mapping)]
    ms: dict[str, float] = {}
    for k in top:
        ms[kc.category(str(k.get("name", "")))] = ms.get(kc.category(str(k.get("name", ""))), 0.0) + float(
            k.get("total_ms") or 0.0)
    tot = sum(ms.values())
    return ({c: v / tot for c, v in ms.items()} if tot else {}), f"the top {len(top)} kernels only"


def _nccl(shares: Mapping[str, float]) -> float:
    return sum(v for k, v in shares.items() if k.startswith(kc.NCCL_PREFIX))


def diagnose_capture(devices: Sequence[Mapping[str, Any]], *, label: str = "capture",
                     iterations: int | None = None, steady_compute_ms: float | None = None,
                     pipeline: bool | None = None) -> CaptureDiagnosis:
    """Findings for each device of one capture. ``iterations``: how many training iterations the
    capture covered; ``steady_compute_ms``: the job's steady forward+backward compute per iteration
    (timers) — together they say whether kernels ran slower than usual while captured.
    ``pipeline``: the job uses pipeline parallelism (None: unknown; SendRecv still reads as p2p)."""
    out = CaptureDiagnosis()
    classes: list[tuple[float, str, str]] = []  # (weight, class, reason) per device
    for dev in devices:
        d = int(dev.get("device", -1))
        span, busy = _num(dev, "span_ms"), _num(dev, "busy_ms")
        if not span or busy is None:
            continue
        idle, sendrecv = _num(dev, "idle_ms") or 0.0, _num(dev, "sendrecv_ms") or 0.0
        exposed, compute = _num(dev, "comm_exposed_ms") or 0.0, _num(dev, "compute_ms")
        sh, basis = _shares(dev)
        pointwise = sh.get(kc.ELEMENTWISE, 0.0) + sh.get(kc.NORMALIZATION, 0.0)
        math_share = sh.get(kc.GEMM, 0.0) + sh.get(kc.ATTENTION, 0.0)
        softmax_ms = _num(dev, "softmax_ms")
        if softmax_ms is None:  # older breakdowns: the softmax kernels among the top kernels
            softmax_ms = sum(float(k.get("total_ms") or 0.0) for k in dev.get("top_kernels") or []
                             if isinstance(k, Mapping) and kc.is_softmax(str(k.get("name", ""))))
        median_us = _num(dev, "kernel_median_us")
        ev: dict[str, Any] = {"device": d, "span_ms": span, "busy_ms": busy, "idle_ms": idle,
                              "categories": {k: round(v, 4) for k, v in sh.items()}, "categories_from": basis}
        if busy > 0 and sendrecv / busy >= SENDRECV_DOMINANT:
            fid = f"capture-sendrecv-wait-{d}"
            out.findings.append(Finding(
                fid, "warning", f"Device {d}: pipeline waiting, not bandwidth",
                f"ncclDevKernel_SendRecv covers {sendrecv:.0f} ms of {busy:.0f} ms busy "
                f"({sendrecv / busy:.0%}) in the {label}: a SendRecv kernel runs from the moment a stage "
                "posts its p2p until the "
                "peer stage delivers, so this time is the stage waiting for its peer (pipeline bubble and "
                "stage imbalance), not link bandwidth.", {**ev, "sendrecv_ms": sendrecv}, label,
                "capture timeline (perfd.capture.analysis)"))
            out.recommendations.append(Recommendation(
                "", fid, 0, "Shrink the pipeline wait: more micro-batches per iteration, interleaved "
                "stages, or rebalance layers between stages (the last stage also computes the logits)",
                "faster links would not help: the SendRecv time is waiting", sendrecv / span))
            classes.append((sendrecv / span, "pipeline-bound",
                            f"SendRecv (peer wait) {sendrecv / busy:.0%} of busy time on device {d}"))
        if pointwise >= ELEMENTWISE_HEAVY:
            fid = f"capture-unfused-{d}"
            soft = (f"; softmax kernels of their own take {softmax_ms:.0f} ms (attention computed unfused: "
                    "QKᵀ, softmax and ·V as separate kernels)") if softmax_ms > 0 else ""
            out.findings.append(Finding(
                fid, "warning", f"Device {d}: {pointwise:.0%} of kernel time is elementwise/normalisation",
                f"Pointwise kernels (elementwise, dropout, activation, normalisation) take {pointwise:.0%} "
                f"of kernel time and GEMMs/attention {math_share:.0%}{soft}. Pointwise kernels are "
                "memory-bound; "
                "each one reads and writes whole activations, so unfused model code leaves the tensor cores "
                "idle.", {**ev, "pointwise_share": pointwise, "math_share": math_share,
                          "softmax_ms": softmax_ms}, label,
                "capture timeline kernel categories (perfd.analytics.kernels)"))
            action = ("Fuse the pointwise work: Transformer Engine layers (--transformer-impl "
                      "transformer_engine), fused bias-GELU/SwiGLU, dropout-add and layer-norm kernels, or "
                      "torch.compile")
            detail = ("use FlashAttention / fused attention (TE, --attention-backend flash) for the unfused "
                      "softmax" if softmax_ms > 0 else "")
            out.recommendations.append(Recommendation("", fid, 0, action, detail, pointwise * busy / span))
            classes.append((pointwise * busy / span, "memory-bound",
                            f"elementwise/normalisation {pointwise:.0%} of kernel time on device {d}"))
        if span and idle / span >= IDLE_HIGH:
            short = _num(dev, "idle_short_ms")
            gaps = _num(dev, "idle_gaps")
            tiny = median_us is not None and median_us < TINY_KERNEL_US
            many_short = short is not None and idle > 0 and short / idle >= SHORT_GAPS_DOMINATE
            fid = f"capture-idle-{d}"
            gap_text = (f"; {short / idle:.0%} of the idle is in {gaps:.0f} gaps shorter than "
                        f"{SHORT_GAP_US / 1e3:.0f} ms" if short is not None and gaps and idle > 0 else "")
            if tiny or many_short:
                why = (f"the median kernel lasts {median_us:.1f} µs" if tiny else
                       "the GPU waits a little before almost every kernel")
                out.findings.append(Finding(
                    fid, "warning", f"Device {d}: launch-bound (idle in many short gaps between kernels)",
                    f"The GPU is idle {idle / span:.0%} of the captured window (every GPU activity "
                    f"counted as busy: kernels, copies, sets){gap_text}; {why}: the host cannot issue "
                    "work as fast as the GPU runs it.",
                    {**ev, "kernel_median_us": median_us, "idle_short_ms": short, "idle_gaps": gaps}, label,
                    "capture timeline"))
                out.recommendations.append(Recommendation(
                    "", fid, 0, "Cut launch overhead: CUDA graphs (--enable-cuda-graph / "
                    "torch.cuda.graphs), kernel fusion (Transformer Engine, torch.compile), larger "
                    "micro-batches", "", idle / span))
                classes.append((idle / span, "launch-overhead", f"idle {idle / span:.0%} in short gaps" + (
                    f" with {median_us:.1f} µs median kernels" if median_us is not None else "")))
            else:
                out.findings.append(Finding(
                    fid, "warning", f"Device {d}: idle {idle / span:.0%} of the captured window",
                    f"No GPU activity for {idle:.0f} ms of {span:.0f} ms{gap_text}: the GPU waited on the "
                    "host (data loading, host-device synchronisation such as .item() or prints, Python "
                    "overhead).",
                    {**ev, "idle_short_ms": short, "idle_gaps": gaps}, label, "capture timeline"))
                out.recommendations.append(Recommendation(
                    "", fid, 0, "Find the host gaps: data-loader workers / pinned memory / prefetch; remove "
                    "synchronising calls (.item(), prints, .cpu()) from the training loop", "", idle / span))
                classes.append((idle / span, "sync-bound", f"idle {idle / span:.0%} in long gaps"))
        if span and exposed / span >= EXPOSED_COMM_HIGH:
            fid = f"capture-comm-exposed-{d}"
            out.findings.append(Finding(
                fid, "warning", f"Device {d}: exposed NCCL {exposed / span:.0%} of the window",
                f"NCCL kernels run with no compute beside them for {exposed:.0f} ms of {span:.0f} ms.",
                {**ev, "comm_exposed_ms": exposed, "nccl_share": _nccl(sh)}, label, "capture timeline"))
            out.recommendations.append(Recommendation(
                "", fid, 0, "Overlap communication with compute (--overlap-grad-reduce, "
                "--overlap-param-gather); check the link bandwidth", "", exposed / span))
            classes.append((exposed / span, "communication-bound", f"exposed NCCL {exposed / span:.0%}"))
        if math_share >= GEMM_DOMINANT and busy / span >= 1 - IDLE_HIGH:
            classes.append((math_share * busy / span, "compute-bound",
                            f"GEMM/attention {math_share:.0%} of kernel time, GPU busy {busy / span:.0%}"))
        if iterations and steady_compute_ms and compute:
            per_it = compute / iterations
            ratio = per_it / steady_compute_ms
            if ratio >= SLOWER_THAN_STEADY:
                out.slowdown[d] = ratio
                fid = f"capture-slower-than-steady-{d}"
                out.findings.append(Finding(
                    fid, "warning", f"Device {d}: kernels ran {ratio:.1f}× slower than in steady state",
                    f"Compute kernels took {per_it:.0f} ms per captured iteration against "
                    f"{steady_compute_ms:.0f} ms of forward+backward compute per steady iteration "
                    "(timers): the same work ran slower "
                    "while captured — the GPU was shared, throttled, or clocked down.",
                    {**ev, "compute_ms_per_iteration": per_it, "steady_compute_ms": steady_compute_ms,
                     "ratio": ratio}, label, "capture timeline vs Megatron timers"))
    if classes:
        _w, cls, why = max(classes)
        out.bottleneck, out.bottleneck_reason = cls, f"{why} ({label})"
    elif devices:
        out.bottleneck_reason = f"no timeline pattern beyond its threshold ({label})"
    out.recommendations.sort(key=lambda r: -(r.impact or 0.0))
    for i, rec in enumerate(out.recommendations, start=1):
        rec.priority, rec.id = i, f"C{i}"
    return out

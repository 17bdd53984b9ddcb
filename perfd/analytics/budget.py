"""The step's time budget: where one training step's time goes, from the peak down to the achieved
step (issue "why not closer to the limit"). Typed parts, each in ms per step and share of the step,
each with its source; and the bottleneck class the budget supports. Pure, no I/O.

Evidence, best last (each refines what the one before could only lump together):

- **timers** (the step source's phases): data wait, exposed communication, pipeline idle, the
  optimizer step where the framework times it, and the rest as compute — the timers cannot see
  inside it;
- **GPM** says how the compute time uses the GPU (tensor pipes, DRAM): detail of the compute part,
  and a vote of its own in perfd.analytics.diagnosis;
- **capture** (a Kineto or nsys timeline of a few steps, perfd.capture.analysis ``parts_ms``): every
  instant of the captured span attributed to one part, so the parts add up to the captured step —
  GEMMs, attention, the optimizer, other pointwise kernels, memory copies, exposed communication,
  pipeline waits (SendRecv), and idle split into short gaps (the host launching work) and long ones
  (the host waiting: a sync, data);
- **ncu** per-kernel speed-of-light rows joined to the parts (their detail; perfd.capture ncu).

With the model's FLOPs the GEMM time is cut into the waterfall's first steps: the time the model's
FLOPs take at the peak, the gap from the peak to the measured matmul ceiling (the best a matmul
reaches on this GPU), and the GEMMs' own shortfall below that ceiling — with the TFLOP/s they achieve.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics import kernels as kc
from perfd.analytics import thresholds as th
from perfd.analytics.bottleneck import B, BottleneckClass
from perfd.analytics.common import TextEnum


class Part(TextEnum):
    """A part of the step. ``str`` so that JSON and a Prometheus ``part`` label carry the value."""

    IDEAL = "ideal"  # the model's FLOPs at the GPU's peak
    CEILING_GAP = "ceiling_gap"  # from the peak to the measured matmul ceiling
    GEMM = "gemm"  # GEMM (and fused-attention) time beyond those two: the kernels below the ceiling
    ATTENTION = "attention"  # attention computed unfused: mask fill, softmax forward and backward
    OPTIMIZER = "optimizer"
    POINTWISE = "pointwise"  # elementwise, normalisation, reductions and other kernels
    MEMCPY = "memcpy"  # copies and memsets
    COMM_EXPOSED = "comm_exposed"  # communication with no compute beside it
    PIPELINE = "pipeline"  # pipeline bubble: SendRecv waits, idle stages
    DATA = "data"  # waiting for the next batch
    IDLE_SHORT = "idle_short"  # idle in gaps shorter than th.SHORT_GAP_S: the host launching work
    IDLE_LONG = "idle_long"  # idle in longer gaps: the host waiting (a sync, Python, data)
    COMPUTE = "compute"  # the timers' compute, not divided (no capture)


# The order of the waterfall, and of a capture's attribution: an instant where several parts run is
# the first one's (a copy or a collective beside a GEMM is hidden by it).
PART_ORDER: tuple[Part, ...] = tuple(Part)
KERNEL_PRECEDENCE: tuple[Part, ...] = (Part.GEMM, Part.ATTENTION, Part.OPTIMIZER, Part.POINTWISE,
                                       Part.MEMCPY, Part.PIPELINE, Part.COMM_EXPOSED)


class Source(TextEnum):
    TIMERS = "timers"
    GPM = "gpm"
    CAPTURE = "capture"
    NCU = "ncu"
    FLOPS = "flops"  # the model's FLOPs and the GPU's peak/ceiling (perfd.analytics.flops, gpus)


def kernel_part(name: str, unfused_attention: bool) -> Part:
    """The part a kernel's time belongs to. ``unfused_attention``: the capture has softmax kernels of
    their own, so a masked fill there is the attention mask (perfd.analytics.kernels.is_mask_fill)."""
    cat = kc.category(name)
    if cat.startswith(kc.NCCL_PREFIX):
        return Part.PIPELINE if cat == kc.NCCL_PREFIX + "sendrecv" else Part.COMM_EXPOSED
    if cat == kc.GEMM:
        return Part.GEMM
    if cat == kc.ATTENTION:
        return Part.ATTENTION if kc.is_softmax(name) else Part.GEMM  # fused attention is the model's math
    if cat == kc.OPTIMIZER:
        return Part.OPTIMIZER
    if unfused_attention and kc.is_mask_fill(name):
        return Part.ATTENTION
    return Part.POINTWISE


@dataclass(frozen=True)
class BudgetPart:
    """One part: ms per step, its share of the step, where it comes from, and what it holds."""

    part: Part
    ms: float
    share: float
    source: Source
    detail: Mapping[str, Any] = field(default_factory=dict)  # typed numbers: kernels, TFLOP/s, counts

    def to_json(self) -> dict[str, Any]:
        return {"part": self.part.value, "ms": self.ms, "share": self.share, "source": self.source.value,
                "detail": dict(self.detail)}


@dataclass(frozen=True)
class StepBudget:
    """The parts of one step, in waterfall order; ``step_ms`` is their sum."""

    step_ms: float
    parts: tuple[BudgetPart, ...]
    sources: tuple[Source, ...]  # the evidence it was built from, best first
    iterations: float | None = None  # captured iterations the per-step values are averaged over
    basis: str = ""  # a capture's id and rank, or "steady-state timers"
    attribution: str = ""  # how a capture's time was divided among the parts (budget.device_parts)
    steady_step_ms: float | None = None  # the job's steady median, for a captured step's context
    gemm_tflops: float | None = None  # the model's FLOPs ÷ the GEMM (and fused attention) time
    ceiling_tflops: float | None = None
    peak_tflops: float | None = None
    mfu: float | None = None

    def ms(self, part: Part) -> float:
        return sum(p.ms for p in self.parts if p.part is part)

    def get(self, part: Part) -> BudgetPart | None:
        return next((p for p in self.parts if p.part is part), None)

    @property
    def has_kernels(self) -> bool:
        return Source.CAPTURE in self.sources

    def to_json(self) -> dict[str, Any]:
        return {"step_ms": self.step_ms, "parts": [p.to_json() for p in self.parts],
                "sources": [s.value for s in self.sources], "iterations": self.iterations,
                "basis": self.basis, "attribution": self.attribution, "steady_step_ms": self.steady_step_ms,
                "gemm_tflops": self.gemm_tflops,
                "ceiling_tflops": self.ceiling_tflops, "peak_tflops": self.peak_tflops, "mfu": self.mfu}

    @staticmethod
    def from_json(d: Mapping[str, Any] | None) -> StepBudget | None:
        """Back from :meth:`to_json` (a capture record, a kept summary); None when unreadable."""
        if not isinstance(d, Mapping):
            return None
        try:
            parts = tuple(BudgetPart(Part(str(p["part"])), float(p["ms"]), float(p["share"]),
                                     Source(str(p["source"])), dict(p.get("detail") or {}))
                          for p in d.get("parts") or [])
            sources = tuple(Source(str(s)) for s in d.get("sources") or [])
            step = float(d["step_ms"])
        except (KeyError, ValueError, TypeError):
            return None

        def num(key: str) -> float | None:
            v = d.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        return StepBudget(step, parts, sources, num("iterations"), str(d.get("basis") or ""),
                          str(d.get("attribution") or ""), num("steady_step_ms"), num("gemm_tflops"),
                          num("ceiling_tflops"),
                          num("peak_tflops"), num("mfu"))


# --- building ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlopsContext:
    """What the waterfall's first steps need: the model's FLOPs per step per GPU and the GPU's
    figures (perfd.analytics.flops, perfd.analytics.gpus)."""

    flops_per_gpu_step: float | None = None
    peak_tflops: float | None = None
    ceiling_tflops: float | None = None


@dataclass(frozen=True)
class TimerShares:
    """What the step's timers say (ratios of the step; None = not timed)."""

    step_ms: float | None = None
    data: float | None = None
    comm_exposed: float | None = None
    pipeline_idle: float | None = None
    optimizer_ms: float | None = None  # the framework's optimizer timer, when it has one
    mfu: float | None = None


NO_FLOPS = FlopsContext()
NO_TIMERS = TimerShares()


def _split_math(math_ms: float, fl: FlopsContext) -> tuple[list[tuple[Part, float, dict[str, Any]]],
                                                           float | None]:
    """GEMM time cut into ideal / ceiling gap / below-ceiling, and the TFLOP/s the GEMMs achieve."""
    flops, peak, ceiling = fl.flops_per_gpu_step, fl.peak_tflops, fl.ceiling_tflops
    if not flops or not peak or math_ms <= 0:
        return [(Part.GEMM, math_ms, {})], None
    achieved = flops / (math_ms * 1e9)  # TFLOP/s: FLOPs ÷ (ms · 1e-3) ÷ 1e12
    ideal = min(flops / (peak * 1e9), math_ms)
    at_ceiling = min(flops / (ceiling * 1e9), math_ms) if ceiling else ideal
    gap = max(at_ceiling - ideal, 0.0)
    below = max(math_ms - ideal - gap, 0.0)
    return [(Part.IDEAL, ideal, {"tflops": peak}), (Part.CEILING_GAP, gap, {"tflops": ceiling}),
            (Part.GEMM, below, {"gemm_ms": math_ms, "achieved_tflops": achieved,
                                "of_ceiling": achieved / ceiling if ceiling else None})], achieved


def _finish(rows: list[tuple[Part, float, Source, dict[str, Any]]], sources: Iterable[Source],
            **kw: Any) -> StepBudget:
    step = sum(ms for _p, ms, _s, _d in rows)
    order = {p: i for i, p in enumerate(PART_ORDER)}
    parts = tuple(BudgetPart(p, ms, ms / step if step > 0 else 0.0, s, d)
                  for p, ms, s, d in sorted(rows, key=lambda r: order[r[0]]) if ms > 0 or p is Part.IDEAL)
    return StepBudget(step, parts, tuple(dict.fromkeys(sources)), **kw)


def from_timers(t: TimerShares, fl: FlopsContext = NO_FLOPS) -> StepBudget | None:
    """The budget the timers alone support: data, exposed communication, pipeline idle, the
    optimizer, and compute (undivided; with FLOPs, its ideal and ceiling steps split off). None
    without a step time or a data and a communication share."""
    step = t.step_ms
    if not step or step <= 0 or t.data is None or t.comm_exposed is None:
        return None
    rows: list[tuple[Part, float, Source, dict[str, Any]]] = [
        (Part.DATA, t.data * step, Source.TIMERS, {}),
        (Part.COMM_EXPOSED, t.comm_exposed * step, Source.TIMERS, {})]
    if t.pipeline_idle:
        rows.append((Part.PIPELINE, t.pipeline_idle * step, Source.TIMERS, {}))
    if t.optimizer_ms:
        rows.append((Part.OPTIMIZER, min(t.optimizer_ms, step), Source.TIMERS, {"timer_ms": t.optimizer_ms}))
    compute = max(step - sum(r[1] for r in rows), 0.0)
    sources = [Source.TIMERS]
    if fl.flops_per_gpu_step and fl.peak_tflops:
        split, _achieved = _split_math(compute, fl)
        for p, ms, d in split:
            rows.append((Part.COMPUTE if p is Part.GEMM else p, ms, Source.FLOPS if p is not Part.GEMM
                         else Source.TIMERS, {**d, "note": "compute below the ceiling, not divided"}
                         if p is Part.GEMM else d))
        sources.append(Source.FLOPS)
    else:
        rows.append((Part.COMPUTE, compute, Source.TIMERS, {}))
    return _finish(rows, sources, basis="steady-state timers", steady_step_ms=step,
                   ceiling_tflops=fl.ceiling_tflops, peak_tflops=fl.peak_tflops, mfu=t.mfu)


def from_capture(device: Mapping[str, Any], iterations: float | None, *, fl: FlopsContext = NO_FLOPS,
                 timers: TimerShares = NO_TIMERS, basis: str = "") -> StepBudget | None:
    """The budget of one captured device (perfd.capture.analysis JSON with ``parts_ms``) over
    ``iterations`` steps (None: the whole captured span as one step). The timers' data share, where
    they measure one, says how much of the long idle gaps was the wait for data. A breakdown from
    before the attribution is rebuilt from its shares (:func:`device_parts`, said in ``attribution``)."""
    raw, how = device_parts(device)
    if not raw:
        return None
    n = iterations if iterations and iterations > 0 else 1.0
    per: dict[Part, float] = {}
    for k, v in raw.items():
        try:
            per[Part(str(k))] = per.get(Part(str(k)), 0.0) + float(v) / n
        except ValueError:
            continue
    step = sum(per.values())
    if step <= 0:
        return None
    pk = device.get("part_kernels")
    kernels: Mapping[str, Any] = pk if isinstance(pk, Mapping) else {}
    rows: list[tuple[Part, float, Source, dict[str, Any]]] = []
    math_ms = per.pop(Part.GEMM, 0.0)
    split, achieved = _split_math(math_ms, fl)
    for p, ms, d in split:
        rows.append((p, ms, Source.CAPTURE if p is Part.GEMM else Source.FLOPS,
                     {**d, "kernels": _kernels(kernels, Part.GEMM, n)} if p is Part.GEMM else d))
    idle_long = per.pop(Part.IDLE_LONG, 0.0)
    if timers.data and timers.step_ms and idle_long > 0:  # the timed data wait, seen as long gaps
        data = min(idle_long, timers.data * step)
        rows.append((Part.DATA, data, Source.TIMERS, {"timer_share": timers.data, "from_idle_ms": data}))
        idle_long -= data
    rows.append((Part.IDLE_LONG, idle_long, Source.CAPTURE, {}))
    for p, ms in per.items():
        detail: dict[str, Any] = {"kernels": _kernels(kernels, p, n)}
        if p is Part.OPTIMIZER and timers.optimizer_ms is not None:
            detail["timer_ms"] = timers.optimizer_ms  # the framework's own optimizer timer: a cross-check
        rows.append((p, ms, Source.CAPTURE, detail))
    sources = [Source.CAPTURE, *([Source.FLOPS] if achieved is not None else []),
               *([Source.TIMERS] if timers.data else [])]
    return _finish(rows, sources, iterations=iterations, basis=basis, attribution=how,
                   steady_step_ms=timers.step_ms,
                   gemm_tflops=achieved, ceiling_tflops=fl.ceiling_tflops, peak_tflops=fl.peak_tflops,
                   mfu=timers.mfu)


def device_parts(device: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    """A captured device's exclusive parts (``parts_ms``), and how they were had. A breakdown from
    before the attribution existed has busy, idle, SendRecv and exposed NCCL, and kernel category
    shares (or only its top kernels): its parts are rebuilt from those, the compute time divided by
    the categories' shares, and the basis says so."""
    raw = device.get("parts_ms")
    if isinstance(raw, Mapping) and raw:
        parts = {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float))}
        return parts, "exclusive attribution"

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
    softmax_ms = num("softmax_ms") if device.get("softmax_ms") is not None else sum(
        float(k.get("total_ms") or 0.0) for k in top if kc.is_softmax(str(k.get("name", ""))))
    if not isinstance(cats, Mapping) or not cats:
        cats, basis = {}, f"category shares of the top {len(top)} kernels only" + split
        for k in top:
            c = kc.category(str(k.get("name", "")))
            cats[c] = cats.get(c, 0.0) + float(k.get("total_ms") or 0.0)
    shares = {str(c): float(v) for c, v in cats.items() if not str(c).startswith(kc.NCCL_PREFIX)}
    total = sum(shares.values())
    compute = max(busy - exposed, 0.0)
    softmax = min(softmax_ms, compute)
    to_part = {kc.GEMM: Part.GEMM, kc.ATTENTION: Part.GEMM, kc.OPTIMIZER: Part.OPTIMIZER,
               kc.MEMCPY: Part.MEMCPY}
    for c, v in shares.items():
        p = to_part.get(c, Part.POINTWISE).value
        out[p] = out.get(p, 0.0) + (compute - softmax) * v / total if total else 0.0
    out[Part.ATTENTION.value] = out.get(Part.ATTENTION.value, 0.0) + softmax
    if not total:
        out[Part.POINTWISE.value] = out.get(Part.POINTWISE.value, 0.0) + compute - softmax
    return {k: v for k, v in out.items() if v > 0}, basis


def _kernels(by_part: Mapping[str, Any], part: Part, n: float) -> list[dict[str, Any]]:
    """The part's top kernels, per step."""
    out = []
    for k in by_part.get(part.value) or []:
        if isinstance(k, Mapping):
            out.append({"name": str(k.get("name", "?")), "ms": float(k.get("total_ms") or 0.0) / n,
                        "count": float(k.get("count") or 0) / n})
    return out


# --- the class the budget supports ------------------------------------------------------------------
# Each class and the parts whose time it is (GPM, timers and the capture use the same names:
# perfd.analytics.bottleneck.BOTTLENECK_CLASSES).
CLASS_PARTS: dict[BottleneckClass, tuple[Part, ...]] = {
    B.COMPUTE: (Part.IDEAL, Part.CEILING_GAP, Part.GEMM),
    B.MEMORY: (Part.ATTENTION, Part.OPTIMIZER, Part.POINTWISE, Part.MEMCPY),
    B.LAUNCH: (Part.IDLE_SHORT,),
    B.SYNC: (Part.IDLE_LONG,),
    B.DATA: (Part.DATA,),
    B.COMMUNICATION: (Part.COMM_EXPOSED,),
    B.PIPELINE: (Part.PIPELINE,),
}
MIXED = B.MIXED


@dataclass(frozen=True)
class BudgetClass:
    """The class a budget supports: the class whose parts hold most of the step, "mixed" when the
    runner-up is within th.CLASS_MIXED_MARGIN of it; ``shares``: every class's share of the step."""

    cls: BottleneckClass
    shares: Mapping[BottleneckClass, float]
    lead: float  # the winner's share minus the runner-up's

    def reason(self) -> str:
        top = sorted(((c, s) for c, s in self.shares.items() if s > 0), key=lambda cs: -cs[1])[:3]
        return ", ".join(f"{c.value.split('-')[0]} {s:.0%}" for c, s in top) + " of the step"

    def shares_json(self) -> dict[str, float]:
        return {c.value: s for c, s in self.shares.items()}


def classify(b: StepBudget) -> BudgetClass | None:
    """The class from a budget that saw the kernels (a capture); None for one that did not (the
    timers' compute is not divided: their own vote speaks for them, perfd.analytics.diagnosis)."""
    if not b.has_kernels or b.step_ms <= 0:
        return None
    shares = {c: sum(b.ms(p) for p in parts) / b.step_ms for c, parts in CLASS_PARTS.items()}
    ranked = sorted(shares.items(), key=lambda cs: -cs[1])
    (first, s1), (_second, s2) = ranked[0], ranked[1]
    lead = s1 - s2
    return BudgetClass(first if lead >= th.CLASS_MIXED_MARGIN.value else MIXED, shares, lead)


def metric_rows(job: str, budget: Mapping[str, Any] | None, seconds_name: str, ratio_name: str
                ) -> list[tuple[dict[str, str], str, float]]:
    """/metrics rows of a budget JSON: each part's seconds per step and share (a bounded ``part``
    label: :class:`Part`). No budget, no rows (absent, never 0)."""
    b = StepBudget.from_json(budget)
    if b is None:
        return []
    rows: list[tuple[dict[str, str], str, float]] = []
    for p in b.parts:
        labels = {"job_name": job, "part": p.part.value}
        rows.append((labels, seconds_name, p.ms / 1e3))
        rows.append((dict(labels), ratio_name, p.share))
    return rows

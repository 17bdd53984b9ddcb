"""The step's time budget: where one training step's time goes (issues "why not closer to the limit",
"remedies an engineer can apply without checking"). Typed parts, each in ms per step and share of
the step, each with its source; and the bottleneck class the budget supports. Pure, no I/O.

Evidence, best last (each refines what the one before could only lump together):

- **timers** (the step source's phases): data wait, exposed communication, the pipeline wait, the
  optimizer step where the framework times it, and the rest as compute — the timers cannot see
  inside it;
- **GPM** says how the compute time uses the GPU (tensor pipes, DRAM): a vote of its own in
  perfd.analytics.breakdown.diagnosis;
- **capture** (a Kineto or nsys timeline of a few steps, perfd.capture.analysis ``parts_ms``): every
  instant of the captured span given to one part, by the op that launched the kernel running then
  (perfd.capture.ops: attention with its matmuls, copies and dropout, the linear layers, the
  activation, normalisation, the loss, the embedding, the optimizer, gradient reduction, other
  pointwise work, copies), else to exposed communication, pipeline waits, or idle split into short
  gaps (the host launching work) and long ones (the host waiting: a sync, data). The parts add up
  to the captured step; a capture with no host side falls back to kernel names and says so;
- **ncu** per-kernel speed-of-light rows joined to the parts (their detail; perfd.capture ncu).

Every part is read against the model's FLOPs: the time they take at the GPU's peak (``ideal_ms``,
MFU × step) and at its measured matmul ceiling; the linear layers' part says the TFLOP/s it achieves,
attention's what its FLOPs would cost fused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypedDict, cast

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown.advice_registry import PARTS, class_parts
from perfd.analytics.breakdown.bottleneck import B, BottleneckClass, BudgetClass
from perfd.analytics.breakdown.casts_seen import CastsSeen
from perfd.analytics.breakdown.job_facts import JobFacts
from perfd.analytics.breakdown.kernel_rows import KernelRow
from perfd.analytics.breakdown.ncu_rows import NcuCategory, categories_of
from perfd.analytics.breakdown.optimizer_seen import OptimizerSeen
from perfd.analytics.breakdown.recompute_seen import RecomputeSeen
from perfd.analytics.breakdown.replay_table import ReplayTable
from perfd.analytics.breakdown.splitk_seen import SplitKSeen
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.breakdown.step_parts import Phase as Phase  # declared beside Part; read from here too
from perfd.analytics.common import TextEnum
from perfd.analytics.steps.flops import FlopsBasis
from perfd.core.record_json import JsonRecord, absent
from perfd.core.typed import fit, number, obj, objs


class IdleCause(TextEnum):
    """What an idle gap of the GPU waited for: what precedes it on the host (perfd.capture.sweep)."""

    SYNC = "sync"  # a synchronisation returned in the gap: the host waited for the device, then launched
    # a short gap after a sync's, the host still behind: refilling the queue the sync drained (the sync's
    # knock-on; its owner the sync's)
    REFILL = "refill"
    LAUNCH = "launch"  # a short gap with no sync: the host issuing work slower than the GPU runs it
    # a short gap before a kernel launched before the GPU went idle: the GPU's own switch between kernels
    SWITCH = "switch"
    DATA = "data"  # the host was in the data loader
    HOST = "host"  # a long gap with no sync: the host elsewhere


# The order of the budget's rows, and of a capture's attribution: an instant where several activities
# run is the first one's (a copy or a collective beside a kernel is hidden by it).
PART_ORDER: tuple[Part, ...] = tuple(Part)
KERNEL_PRECEDENCE: tuple[Part, ...] = (Part.LINEAR, Part.GEMM, Part.ATTENTION, Part.ACTIVATION, Part.NORM,
                                       Part.LOSS, Part.EMBEDDING, Part.OPTIMIZER, Part.GRAD_REDUCE,
                                       Part.POINTWISE, Part.MEMCPY, Part.PIPELINE, Part.COMM_EXPOSED)


class Source(TextEnum):
    TIMERS = "timers"
    GPM = "gpm"
    CAPTURE = "capture"
    NCU = "ncu"
    FLOPS = "flops"  # the model's FLOPs and the GPU's peak/ceiling (perfd.analytics.steps.flops, gpus)


class Top(TypedDict):
    """One of a part's largest kernels or ops, per step (a capture's)."""

    name: str
    ms: float
    count: float


class PartDetail(TypedDict, total=False):
    """What a part holds besides its time, each key written where the part is built (the parts that
    carry it said); a part's keys keep the order they were written in, which its JSON keeps."""

    kernels: list[Top]  # a captured part's top kernels
    ops: list[Top]  # ... and top ops
    op_ms: dict[str, float]  # a captured part's ms per step by the op that launched its kernels
    flops: float  # the FLOPs per step of a part of matmuls (math_detail) or of core attention
    flops_basis: str  # math parts: which FLOPs ``flops`` are (perfd.analytics.steps.flops.FlopsBasis)
    achieved_tflops: float  # ... the TFLOP/s they run at
    of_ceiling: float | None  # math parts: that over the measured matmul ceiling (None: no ceiling)
    at_ceiling_ms: float | None  # math parts and attention: their time at that ceiling
    fused: bool  # attention: whether one fused kernel runs it
    executed_flops: float  # attention: the FLOPs its kernels compute (an unfused causal one: twice)
    timer_ms: float  # the optimizer: the framework's own timer
    scaled_from_ms: float  # a timers' part scaled down so that the step holds overlapping timers
    timer_share: float  # data (a capture's): the timers' share of the step
    from_idle_ms: dict[str, float]  # ... and the idle parts it was taken from
    under_5us_ms: float  # the short idle: the part of it in gaps under 5 µs (the launches)
    side_stream_ms: float  # the part's time on a side stream
    # the pointwise part: its ms per step by what its kernels compute (PointwiseKind value), largest first
    made_of: dict[str, float]


_TYPED_DETAIL = ("ncu", "ncu_kernels")  # a part's detail keys held as typed fields of BudgetPart


def detail_from_json(d: object) -> PartDetail:
    """A part's detail read back from its JSON, keys in their order; one that is not a
    :class:`PartDetail` reads as none (a top kernel or op that does not fit is left out)."""
    got, _problems = fit(obj(d), PartDetail)
    # fit checked every declared key against PartDetail's own declaration
    return cast(PartDetail, got) if got is not None else PartDetail()


@dataclass(frozen=True)
class BudgetPart:
    """One part: ms per step, its share of the step, where it comes from, and what it holds; the
    Nsight Compute category summaries and top kernels of its kernels (perfd.analytics.breakdown
    .job_budget.with_ncu) typed, written last in its JSON detail as ``ncu`` and ``ncu_kernels``."""

    part: Part
    ms: float
    share: float
    source: Source
    detail: PartDetail = field(default_factory=PartDetail)
    ncu_kernels: tuple[KernelRow, ...] | None = None  # None: no ncu rows on it (none in its JSON either)
    ncu: tuple[NcuCategory, ...] | None = None  # None: no ncu summaries on it (... nor in its JSON)

    def detail_json(self) -> dict[str, object]:
        """The part's detail as its JSON writes it: the typed ncu fields last."""
        detail: dict[str, object] = dict(self.detail)
        if self.ncu is not None:
            detail["ncu"] = [c.to_json() for c in self.ncu]
        if self.ncu_kernels is not None:
            detail["ncu_kernels"] = [r.to_json() for r in self.ncu_kernels]
        return detail

    def to_json(self) -> dict[str, object]:
        return {"part": self.part.value, "ms": self.ms, "share": self.share, "source": self.source.value,
                "detail": self.detail_json()}

    @staticmethod
    def from_json(p: Mapping[str, object]) -> BudgetPart | None:
        """Back from :meth:`to_json`; None for a part this version does not know (a budget kept by an
        older one). Raises KeyError, ValueError or TypeError where a figure is missing or not one."""
        try:
            part = Part(str(p["part"]))
        except ValueError:
            return None
        detail = obj(p.get("detail"))
        ks = detail.get("ncu_kernels")  # the rows readable as KernelRow, typed
        rows = tuple(r for k in objs(ks) if (r := KernelRow.from_json(k)) is not None) \
            if isinstance(ks, list) else None
        cats = categories_of(detail["ncu"]) if isinstance(detail.get("ncu"), list) else None
        return BudgetPart(part, number(p["ms"]), number(p["share"]), Source(str(p["source"])),
                          detail_from_json({k: v for k, v in detail.items() if k not in _TYPED_DETAIL}), rows,
                          cats)


@dataclass(frozen=True)
class IdleShare(JsonRecord):
    """Idle per step of one cause, in one phase, after one owner's synchronisations (``aten::item``;
    "" for the other causes), and its gaps per step."""

    cause: IdleCause
    phase: Phase
    owner: str = field(metadata=absent(""))
    ms: float = field()
    gaps: float = field(metadata=absent(0.0))


@dataclass(frozen=True)
class CutPart:
    """A part the capture window cut: what its edges held against a complete step's."""

    part: Part
    edge_ms: float  # the part's time at the window's edges (the steps it cut, together)
    expected_ms: float  # what as many complete steps hold


@dataclass(frozen=True)
class Window(JsonRecord):
    """How the captured span divides into steps: the steps the trace marks, the complete ones between
    its first and last mark that the budget is the mean of (0: none: the whole span over the steps), and
    the parts the window's edges hold less of than complete steps do (a step the window cut)."""

    marked: int
    complete: int
    cut: tuple[CutPart, ...] = ()


@dataclass(frozen=True)
class Unprofiled(JsonRecord):
    """A captured budget brought back to the job's unprofiled step (perfd.analytics.breakdown
    .capture_budget.unprofiled): the capture's steps ran ``captured_ms`` against the job's steady
    ``steady_ms``; the GPU's time (its kernels, and its own switches between kernels it had queued) is as
    captured, the host-side idle the profiler lengthened (``host_idle_ms`` as captured: the gaps after
    syncs, the launch gaps, the host elsewhere) × ``factor``; the data wait ``data_ms`` unscaled, as
    captured (a fetch records few ops for the profiler to slow) or as the timers measured it (None: scaled
    with the rest, where the GPU's time and it left no room for the other gaps)."""

    captured_ms: float
    steady_ms: float
    host_idle_ms: float
    factor: float
    data_ms: float | None = None


@dataclass(frozen=True)
class StepBudget:
    """The parts of one step, in :data:`PART_ORDER`; ``step_ms`` is their sum. ``ideal_ms`` and
    ``ceiling_ms``: the time the model's FLOPs take at the GPU's peak and at its measured matmul
    ceiling (the reference the parts are read against: ideal_ms ÷ step_ms is the MFU)."""

    step_ms: float
    parts: tuple[BudgetPart, ...]
    sources: tuple[Source, ...]  # the evidence it was built from, best first
    iterations: float | None = None  # captured iterations the per-step values are averaged over
    basis: str = ""  # a capture's id and rank, or "steady-state timers"
    attribution: str = ""  # how a capture's time was divided among the parts (perfd.capture.ops.Method)
    steady_step_ms: float | None = None  # the job's steady median: a captured step above it is the capture's
    ideal_ms: float | None = None
    ceiling_ms: float | None = None
    ceiling_tflops: float | None = None
    peak_tflops: float | None = None
    mfu: float | None = None
    steps_from: str = ""  # how the captured steps were counted: "trace" | "request" | "span"
    # per step, what the capture saw of the host: synchronisations and the GPU idle after them
    # (perfd.capture.analysis.sync_gaps: syncs, sync_gap_ms, stream_syncs, stream_sync_gap_ms)
    host: Mapping[str, float] = field(default_factory=dict)
    idle: tuple[IdleShare, ...] = ()  # the idle parts by cause, phase and owner, per step (a capture's)
    phase_ms: Mapping[Phase, Mapping[Part, float]] = field(default_factory=dict)  # parts by phase, per step
    window: Window | None = None  # how the captured span divides into steps
    # the robust deviation of the job's steady step times (1.4826 x their median absolute deviation):
    # how far a rerun moves (perfd.analytics.advice.remedies.run_spread_ms); None: not known
    step_sd_ms: float | None = None
    # the captured steps replayed launch by launch, unchanged and with changes (perfd.capture.step_replay)
    replay: ReplayTable | None = None
    facts: JobFacts | None = None  # what the job already does, as its capture shows it
    # the budget brought back to the job's unprofiled step (None: read as captured)
    unprofiled: Unprofiled | None = None
    optimizer: OptimizerSeen | None = None  # the optimizer's class and implementation a capture shows
    casts: CastsSeen | None = None  # a capture's cast kernels a step (perfd.analytics.breakdown.casts_seen)
    splitk: SplitKSeen | None = None  # a capture's split-K reductions a step (.splitk_seen)
    recompute: RecomputeSeen | None = None  # a capture's forward run again in its backward (.recompute_seen)

    def ms(self, part: Part) -> float:
        return sum(p.ms for p in self.parts if p.part is part)

    def get(self, part: Part) -> BudgetPart | None:
        return next((p for p in self.parts if p.part is part), None)

    @property
    def has_kernels(self) -> bool:
        return Source.CAPTURE in self.sources

    @property
    def capture_overhead_ms(self) -> float | None:
        """How much longer the captured step ran than the steady one (the profiler's own cost; None
        when there is no captured step or no steady one to compare)."""
        if not self.has_kernels or self.steady_step_ms is None:
            return None
        if self.unprofiled is not None:  # brought back to the steady step: the captured one said it
            return self.unprofiled.captured_ms - self.steady_step_ms
        return self.step_ms - self.steady_step_ms

    @property
    def captured_step_ms(self) -> float:
        """The step the capture's steps ran (``step_ms`` unless brought back to the unprofiled one)."""
        return self.unprofiled.captured_ms if self.unprofiled is not None else self.step_ms

    def to_json(self) -> dict[str, object]:
        return {"step_ms": self.step_ms, "parts": [p.to_json() for p in self.parts],
                "sources": [s.value for s in self.sources], "iterations": self.iterations,
                "basis": self.basis, "attribution": self.attribution, "steady_step_ms": self.steady_step_ms,
                "ideal_ms": self.ideal_ms, "ceiling_ms": self.ceiling_ms,
                "ceiling_tflops": self.ceiling_tflops, "peak_tflops": self.peak_tflops, "mfu": self.mfu,
                "steps_from": self.steps_from, "capture_overhead_ms": self.capture_overhead_ms,
                "host": dict(self.host), "idle": [r.to_json() for r in self.idle],
                "phase_ms": {ph.value: {p.value: v for p, v in d.items()} for ph, d in self.phase_ms.items()},
                "window": self.window.to_json() if self.window is not None else None,
                "step_sd_ms": self.step_sd_ms,
                "replay": self.replay.to_json() if self.replay is not None else None,
                "facts": self.facts.to_json() if self.facts is not None else None,
                "unprofiled": self.unprofiled.to_json() if self.unprofiled is not None else None,
                "optimizer": self.optimizer.to_json() if self.optimizer is not None else None,
                "casts": self.casts.to_json() if self.casts is not None else None,
                "splitk": self.splitk.to_json() if self.splitk is not None else None,
                "recompute": self.recompute.to_json() if self.recompute is not None else None}

    @staticmethod
    def from_json(d: object) -> StepBudget | None:
        """Back from :meth:`to_json` (a capture record, a kept summary); None when unreadable. Parts
        this version does not know (a budget kept by an older one) are left out."""
        if not isinstance(d, Mapping):
            return None
        try:
            got = (BudgetPart.from_json(_mapping(p)) for p in _list(d.get("parts")))
            parts = [p for p in got if p is not None]
            sources = tuple(Source(str(s)) for s in _list(d.get("sources")))
            step = number(d["step_ms"])
        except (KeyError, ValueError, TypeError):
            return None

        def num(key: str) -> float | None:  # a whole number stays one: the budget reads back as it was
            v = d.get(key)
            return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        host = d.get("host")
        idle = tuple(s for x in objs(d.get("idle")) if (s := IdleShare.from_json(x)) is not None)
        return StepBudget(step, tuple(parts), sources, num("iterations"), str(d.get("basis") or ""),
                          str(d.get("attribution") or ""), num("steady_step_ms"), num("ideal_ms"),
                          num("ceiling_ms"), num("ceiling_tflops"), num("peak_tflops"), num("mfu"),
                          str(d.get("steps_from") or ""),
                          {str(k): float(v) for k, v in host.items() if isinstance(v, (int, float))
                           and not isinstance(v, bool)} if isinstance(host, Mapping) else {},
                          idle, phase_parts(d.get("phase_ms")),
                          Window.from_json(d.get("window")),
                          num("step_sd_ms"), ReplayTable.from_json(d.get("replay")),
                          JobFacts.from_json(d.get("facts")),
                          Unprofiled.from_json(d.get("unprofiled")),
                          OptimizerSeen.from_json(d.get("optimizer")), CastsSeen.from_json(d.get("casts")),
                          SplitKSeen.from_json(d.get("splitk")), RecomputeSeen.from_json(d.get("recompute")))


def _mapping(v: object) -> Mapping[str, object]:
    """A JSON object; raises TypeError for anything else."""
    if isinstance(v, Mapping):
        return v
    raise TypeError(f"{type(v).__name__}, not an object")


def _list(v: object) -> list[object]:
    """A JSON list, none when absent (or empty); raises TypeError for anything else."""
    if isinstance(v, list):
        return v
    if not v:
        return []
    raise TypeError(f"{type(v).__name__}, not a list")


def phase_parts(d: object) -> dict[Phase, dict[Part, float]]:
    """``{phase: {part: ms}}`` JSON as typed keys; what this version does not know is left out."""
    out: dict[Phase, dict[Part, float]] = {}
    for ph, parts in (d.items() if isinstance(d, Mapping) else ()):
        if ph not in Phase.__members__.values() or not isinstance(parts, Mapping):
            continue
        out[Phase(ph)] = {Part(p): float(v) for p, v in parts.items()
                          if p in Part.__members__.values() and isinstance(v, (int, float))}
    return out


# --- building ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlopsContext:
    """What the budget reads its parts against: the model's FLOPs per step per GPU, the part of them
    that core attention's two matmuls are (the formula's core-attention term, causal-halved in
    Megatron-Core >= 0.12), the part that the GEMMs are (``gemm_basis``: which FLOPs those are;
    perfd.analytics.steps.flops.flops_split) and the GPU's figures (perfd.analytics.steps.flops,
    perfd.analytics.steps.gpus)."""

    flops_per_gpu_step: float | None = None
    peak_tflops: float | None = None
    ceiling_tflops: float | None = None
    attention_flops_per_gpu_step: float | None = None
    attention_causal_halved: bool = True  # the formula counts half the s×s scores (a causal mask)
    gemm_flops_per_gpu_step: float | None = None  # None: the model's whole count less attention's
    gemm_basis: FlopsBasis | None = None  # None: the split is the two figures above (the formula's)


@dataclass(frozen=True)
class TimerShares:
    """What the step's timers say (ratios of the step; None = not timed)."""

    step_ms: float | None = None
    data: float | None = None
    comm_exposed: float | None = None  # exposed communication other than the pipeline's p2p
    pipeline_idle: float | None = None  # the pipeline wait: the stage's idle (its p2p waits are in it)
    optimizer_ms: float | None = None  # the framework's optimizer timer, when it has one
    mfu: float | None = None
    # the robust deviation of the job's steady steps on its own clock (StepBudget.step_sd_ms)
    step_sd_ms: float | None = None


NO_FLOPS = FlopsContext()
NO_TIMERS = TimerShares()


def _reference(fl: FlopsContext) -> tuple[float | None, float | None]:
    """(ms the model's FLOPs take at the peak, at the measured ceiling) per step."""
    if not fl.flops_per_gpu_step or not fl.peak_tflops:
        return None, None
    ideal = fl.flops_per_gpu_step / (fl.peak_tflops * 1e9)  # FLOPs ÷ (TFLOP/s · 1e12) in ms
    return ideal, fl.flops_per_gpu_step / (fl.ceiling_tflops * 1e9) if fl.ceiling_tflops else None


def gemm_flops(fl: FlopsContext) -> tuple[float, FlopsBasis] | None:
    """The FLOPs per GPU per step the linear layers' GEMMs run, and which they are: the split's GEMM
    share, else the model's count less core attention's; None where neither is known (a count stated
    whole with no spec to divide it: dividing the whole model's FLOPs, attention's among them, by the
    linear layers' time overstates their speed)."""
    if fl.gemm_flops_per_gpu_step:
        return fl.gemm_flops_per_gpu_step, fl.gemm_basis or FlopsBasis.GEMMS
    if fl.flops_per_gpu_step and fl.attention_flops_per_gpu_step:
        return fl.flops_per_gpu_step - fl.attention_flops_per_gpu_step, FlopsBasis.GEMMS
    return None


def math_detail(part: Part, ms: float, fl: FlopsContext) -> PartDetail:
    """What a part of matmuls runs: its FLOPs per step (``flops_basis``: which), the TFLOP/s they
    achieve, the share of the measured ceiling. The linear layers run the GEMMs' FLOPs (attention's
    two matmuls are attention's part); GEMMs known by name only run the whole model's."""
    total = fl.flops_per_gpu_step
    if not total or ms <= 0:
        return PartDetail()
    if part is Part.LINEAR:
        got = gemm_flops(fl)
        if got is None:
            return PartDetail()
        flops, basis = got
    else:
        flops, basis = total, FlopsBasis.WHOLE_MODEL
    achieved = flops / (ms * 1e9)
    return {"flops": flops, "achieved_tflops": achieved,
            "of_ceiling": achieved / fl.ceiling_tflops if fl.ceiling_tflops else None,
            "at_ceiling_ms": flops / (fl.ceiling_tflops * 1e9) if fl.ceiling_tflops else None,
            "flops_basis": basis.value}


def attention_detail(ms: float, fl: FlopsContext, fused: bool) -> PartDetail:
    """Core attention's FLOPs per step (the model's count; unfused kernels compute the whole s×s, twice
    a causal count) and its time at the measured matmul ceiling: what fused attention would cost."""
    useful = fl.attention_flops_per_gpu_step
    if not useful:
        return {"fused": fused}
    executed = useful if fused or not fl.attention_causal_halved else 2.0 * useful
    out = PartDetail(fused=fused, flops=useful, executed_flops=executed,
                     at_ceiling_ms=useful / (fl.ceiling_tflops * 1e9) if fl.ceiling_tflops else None)
    if ms > 0:  # a part of no time has no speed (and no row: finish leaves it out)
        out["achieved_tflops"] = executed / (ms * 1e9)
    return out


Row = tuple[Part, float, Source, PartDetail]  # a part's ms, its source and its detail, before finish


def finish(rows: list[Row], sources: Iterable[Source], fl: FlopsContext) -> StepBudget:
    """The budget of ``rows`` (the parts of no time left out) read against ``fl``; the caller sets
    what else it knows (``dataclasses.replace``)."""
    step = sum(ms for _p, ms, _s, _d in rows)
    order = {p: i for i, p in enumerate(PART_ORDER)}
    parts = tuple(BudgetPart(p, ms, ms / step if step > 0 else 0.0, s, d)
                  for p, ms, s, d in sorted(rows, key=lambda r: order[r[0]]) if ms > 0)
    ideal, ceiling = _reference(fl)
    srcs = [*sources, *([Source.FLOPS] if ideal is not None else [])]
    return StepBudget(step, parts, tuple(dict.fromkeys(srcs)), ideal_ms=ideal, ceiling_ms=ceiling,
                      ceiling_tflops=fl.ceiling_tflops, peak_tflops=fl.peak_tflops)


def from_timers(t: TimerShares, fl: FlopsContext = NO_FLOPS) -> StepBudget | None:
    """The budget the timers alone support: data, exposed communication, the pipeline wait, the
    optimizer, and compute (undivided). Each millisecond once: the pipeline's p2p waits are in its
    stage idle, so ``comm_exposed`` holds only the rest. None without a step time or a data and a
    communication share."""
    step = t.step_ms
    if not step or step <= 0 or t.data is None or t.comm_exposed is None:
        return None
    rows: list[Row] = [
        (Part.DATA, t.data * step, Source.TIMERS, PartDetail()),
        (Part.COMM_EXPOSED, t.comm_exposed * step, Source.TIMERS, PartDetail())]
    if t.pipeline_idle:
        rows.append((Part.PIPELINE, t.pipeline_idle * step, Source.TIMERS, PartDetail()))
    if t.optimizer_ms:
        rows.append((Part.OPTIMIZER, min(t.optimizer_ms, step), Source.TIMERS,
                     PartDetail(timer_ms=t.optimizer_ms)))
    taken = sum(r[1] for r in rows)
    if taken > step:  # timers that overlap (a wait inside another timer): scaled so the step holds them
        rows = [(p, ms * step / taken, s, PartDetail(**d, scaled_from_ms=ms)) for p, ms, s, d in rows]
    rows.append((Part.COMPUTE, max(step - sum(r[1] for r in rows), 0.0), Source.TIMERS, PartDetail()))
    return replace(finish(rows, [Source.TIMERS], fl), basis="steady-state timers", steady_step_ms=step,
                   mfu=t.mfu)


# --- the class the budget supports ------------------------------------------------------------------
# Each class and the parts whose time it is, from the one registry (perfd.analytics.breakdown.advice_registry:
# each part names its class; GPM, timers and the capture use the same class names).
CLASS_PARTS: dict[BottleneckClass, tuple[Part, ...]] = class_parts()
MIXED = B.MIXED


def classify(b: StepBudget) -> BudgetClass | None:
    """The class from a budget that saw the kernels (a capture); None for one that did not (the
    timers' compute is not divided: their own vote speaks for them, perfd.analytics.breakdown.diagnosis)."""
    if not b.has_kernels or b.step_ms <= 0:
        return None
    shares = {c: sum(b.ms(p) for p in parts) / b.step_ms for c, parts in CLASS_PARTS.items()}
    for e in PARTS:  # a part one fused kernel runs (attention's math) is its fused class's time
        if e.fused_cls is None or e.cls is None or (p := b.get(e.part)) is None or not p.detail.get("fused"):
            continue
        shares[e.fused_cls] += p.share
        shares[e.cls] -= p.share
    ranked = sorted(shares.items(), key=lambda cs: -cs[1])
    (first, s1), (_second, s2) = ranked[0], ranked[1]
    lead = s1 - s2
    return BudgetClass(first if lead >= th.CLASS_MIXED_MARGIN.value else MIXED, shares, lead)


def metric_rows(job: str, b: StepBudget | None, seconds_name: str, ratio_name: str
                ) -> list[tuple[dict[str, str], str, float]]:
    """/metrics rows of a budget: each part's seconds per step and share (a bounded ``part``
    label: :class:`Part`). No budget, no rows (absent, never 0)."""
    if b is None:
        return []
    rows: list[tuple[dict[str, str], str, float]] = []
    for p in b.parts:
        labels = {"job_name": job, "part": p.part.value}
        rows.append((labels, seconds_name, p.ms / 1e3))
        rows.append((dict(labels), ratio_name, p.share))
    return rows

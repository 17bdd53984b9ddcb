"""A captured device's breakdown, typed: what perfd.capture.analysis computes from a timeline (its
module docstring defines every figure) and what the step budget, the class and the capture match read
(perfd.analytics.breakdown.capture_budget, perfd.analytics.advice.capture_findings,
perfd.analytics.breakdown.capture_match).

The types live here, below the capture package, so that the analytics read them as they are: the
offline path (``perfd analyze ... --capture TRACE``) hands the analysis's own values on, and the
aggregator reads a capture's event (JSON: the agent's summary, perfd.capture.bookkeeping.device_summary,
which leaves out the kernel and NVTX tables) into them once, where it arrives
(:meth:`DeviceBreakdown.from_json`). ``to_json`` is the capture's file and event format.

A breakdown written before a figure existed (a capture kept by an older version) reads with that figure
absent (None) where a reader tells absent from zero (the softmax time, the short idle, the parts), and
with the category shares it carried standing for its category times (only their proportions are read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from perfd.analytics.breakdown.budget import IdleCause, Phase
from perfd.analytics.breakdown.casts_seen import CastsSeen
from perfd.analytics.breakdown.job_facts import JobFacts
from perfd.analytics.breakdown.optimizer_seen import OptimizerSeen
from perfd.analytics.breakdown.recompute_seen import RecomputeSeen
from perfd.analytics.breakdown.replay_table import ReplayTable
from perfd.analytics.breakdown.splitk_seen import SplitKSeen
from perfd.core.record_json import JsonRecord, absent
from perfd.core.typed import obj, objs


def _num(v: object) -> float | None:
    """A JSON number as a float (None: absent, not a number, or NaN)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _ms_map(v: object) -> dict[str, float]:
    """A JSON ``{name: ms}`` as numbers; an entry that is not a number is left out."""
    return {str(k): x for k, raw in obj(v).items() if (x := _num(raw)) is not None}


def _nested(v: object) -> dict[str, dict[str, float]]:
    return {str(k): _ms_map(x) for k, x in obj(v).items() if isinstance(x, Mapping)}


@dataclass(frozen=True)
class KernelStat:
    name: str
    count: int
    total_ms: float  # sum of durations (overlapping launches each count)
    share: float = 0.0  # total_ms / busy_ms (shares can sum above 1 when streams overlap); 0: not kept

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> KernelStat:
        return cls(str(d.get("name", "?")), int(_num(d.get("count")) or 0), _num(d.get("total_ms")) or 0.0,
                   _num(d.get("share")) or 0.0)

    def to_json(self, share: bool = True) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "count": self.count, "total_ms": self.total_ms}
        if share:
            out["share"] = self.share
        return out


def _stats(v: object) -> tuple[KernelStat, ...]:
    return tuple(KernelStat.from_json(x) for x in objs(v))


@dataclass(frozen=True)
class NvtxStat:
    name: str
    count: int
    total_ms: float  # sum of durations, as nsys stats reports it


@dataclass(frozen=True)
class IdleRow(JsonRecord):
    """Idle of one cause, in one phase, after one owner's synchronisations (perfd.capture.sweep)."""

    cause: IdleCause
    phase: Phase
    owner: str = field(metadata=absent(""))  # the op that made the sync ("aten::item"); "" for other causes
    ms: float = field()
    gaps: int = field(metadata=absent(0))


def _idle(v: object) -> tuple[IdleRow, ...]:
    """The rows that fit (a cause or phase this version does not know, no time: left out)."""
    return tuple(r for x in objs(v) if (r := IdleRow.from_json(x)) is not None)


@dataclass(frozen=True)
class Stretch:
    """What a stretch of the span holds (the complete steps between the trace's first and last step
    marks): its steps, span, parts, each part's ms by issuing op, idle by cause, and parts by phase."""

    steps: int
    span_ms: float
    parts_ms: dict[str, float]
    part_op_ms: dict[str, dict[str, float]]
    idle: tuple[IdleRow, ...]
    phase_ms: dict[str, dict[str, float]]
    launch_latency_ms: float | None = 0.0  # of the launch gaps, those under 5 µs (perfd.capture.sweep)

    def to_json(self) -> dict[str, object]:
        return {"steps": self.steps, "span_ms": self.span_ms, "parts_ms": dict(self.parts_ms),
                "launch_latency_ms": self.launch_latency_ms,
                "part_op_ms": {p: dict(d) for p, d in self.part_op_ms.items()},
                "idle": [r.to_json() for r in self.idle],
                "phase_ms": {k: dict(v) for k, v in self.phase_ms.items()}}

    @classmethod
    def from_json(cls, v: object) -> Stretch | None:
        """None: no stretch of complete steps (under one step, or not one)."""
        d = obj(v)
        steps = _int(d.get("steps"))
        if steps is None or steps < 1:
            return None
        return cls(steps, _num(d.get("span_ms")) or 0.0, _ms_map(d.get("parts_ms")),
                   _nested(d.get("part_op_ms")), _idle(d.get("idle")), _nested(d.get("phase_ms")),
                   _num(d.get("launch_latency_ms")))


@dataclass(frozen=True)
class DeviceBreakdown:
    device: int
    span_ms: float
    busy_ms: float
    idle_ms: float
    compute_ms: float
    comm_ms: float
    comm_exposed_ms: float
    overlap_ratio: float | None  # None when the device ran no communication
    memcpy_ms: float
    sendrecv_ms: float
    kernel_count: int
    top_kernels: tuple[KernelStat, ...]
    nvtx: tuple[NvtxStat, ...]
    # perfd.analytics.breakdown.kernels category -> summed duration (ms) of its kernels (memcpy: copies)
    category_ms: dict[str, float] = field(default_factory=dict)
    kernel_median_us: float | None = None
    softmax_ms: float | None = None  # softmax kernels of their own: attention computed unfused
    kernel_ms: float = 0.0  # union(all kernels): busy without the copies
    idle_gaps: int = 0  # idle stretches between activities
    idle_short_ms: float | None = None  # idle in gaps shorter than SHORT_GAP_US
    # perfd.analytics.breakdown.budget.Part value -> exclusive ms over the span (they add up to span_ms), and
    # each part's top kernels (name, count, summed ms)
    parts_ms: dict[str, float] = field(default_factory=dict)
    part_kernels: dict[str, tuple[KernelStat, ...]] = field(default_factory=dict)
    part_ops: dict[str, tuple[KernelStat, ...]] = field(default_factory=dict)  # the ops that decided each
    part_op_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # part -> issuing op -> summed ms
    attribution: str = ""  # perfd.capture.ops.Method: how the time was divided
    attention_fused: bool = False  # attention time with no softmax kernel of its own: one fused kernel
    trace_steps: int | None = None  # the training steps the trace marks (TraceData.steps)
    # The host's synchronisations (device-wide; stream/event waits apart) and the GPU idle from each
    # one's return to the device's next activity: the host launching again (None: no host side)
    syncs: int | None = None
    sync_gap_ms: float | None = None
    stream_syncs: int | None = None
    stream_sync_gap_ms: float | None = None
    # idle by cause over the span (perfd.capture.sweep), the parts by phase, each part's kernel time on a
    # stream other than the busiest one, and the complete steps between the first and last step marks
    idle: tuple[IdleRow, ...] = ()
    phase_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    side_stream_ms: dict[str, float] = field(default_factory=dict)
    complete: Stretch | None = None
    launch_latency_ms: float | None = 0.0  # of the launch gaps over the span, those under 5 µs
    # rows -> launches of PyTorch's row-per-block layer-norm kernels (kernels.ROW_NORM_KERNELS): the
    # tokens of a micro-batch, which say whose job the capture is (perfd.analytics.breakdown.capture_match)
    norm_rows: dict[int, int] = field(default_factory=dict)
    # the complete steps replayed launch by launch, unchanged and with changes (perfd.capture.step_replay)
    replay: ReplayTable | None = None
    # what the job already does, as the trace shows it (None: a breakdown made without its host side, or
    # kept by a version before the facts); and the pointwise part's kernel time (summed, over the span)
    # by what it computes (perfd.analytics.breakdown.pointwise_kinds.PointwiseKind value -> ms)
    facts: JobFacts | None = None
    made_of: dict[str, float] = field(default_factory=dict)
    optimizer: OptimizerSeen | None = None  # the optimizer's class and implementation the trace shows
    casts: CastsSeen | None = None  # the complete steps' cast kernels, per step (None: not counted)
    splitk: SplitKSeen | None = None  # the complete steps' split-K reductions, per step (None: not counted)
    recompute: RecomputeSeen | None = None  # the forward run again in its backward, per step

    def categories(self) -> dict[str, float]:
        """category -> share of the summed kernel (and copy) time, largest first."""
        tot = sum(self.category_ms.values())
        return {k: v / tot for k, v in sorted(self.category_ms.items(), key=lambda kv: -kv[1])} if tot else {}

    def to_json(self) -> dict[str, object]:
        return {
            "device": self.device, "span_ms": self.span_ms, "busy_ms": self.busy_ms, "idle_ms": self.idle_ms,
            "compute_ms": self.compute_ms, "comm_ms": self.comm_ms, "comm_exposed_ms": self.comm_exposed_ms,
            "overlap_ratio": self.overlap_ratio, "memcpy_ms": self.memcpy_ms, "sendrecv_ms": self.sendrecv_ms,
            "kernel_count": self.kernel_count,
            "top_kernels": [k.to_json() for k in self.top_kernels],
            "nvtx": [{"name": n.name, "count": n.count, "total_ms": n.total_ms} for n in self.nvtx],
            "categories": self.categories(), "category_ms": dict(self.category_ms),
            "kernel_median_us": self.kernel_median_us, "softmax_ms": self.softmax_ms,
            "kernel_ms": self.kernel_ms, "idle_gaps": self.idle_gaps, "idle_short_ms": self.idle_short_ms,
            "parts_ms": dict(self.parts_ms),
            "part_kernels": {p: [k.to_json(share=False) for k in ks] for p, ks in self.part_kernels.items()},
            "part_ops": {p: [k.to_json(share=False) for k in ks] for p, ks in self.part_ops.items()},
            "part_op_ms": {p: dict(d) for p, d in self.part_op_ms.items()},
            "attribution": self.attribution, "attention_fused": self.attention_fused,
            "trace_steps": self.trace_steps, "syncs": self.syncs, "sync_gap_ms": self.sync_gap_ms,
            "stream_syncs": self.stream_syncs, "stream_sync_gap_ms": self.stream_sync_gap_ms,
            "idle": [r.to_json() for r in self.idle],
            "phase_ms": {k: dict(v) for k, v in self.phase_ms.items()},
            "side_stream_ms": dict(self.side_stream_ms), "launch_latency_ms": self.launch_latency_ms,
            "complete": self.complete.to_json() if self.complete is not None else None,
            "norm_rows": {str(r): n for r, n in sorted(self.norm_rows.items())},
            "replay": self.replay.to_json() if self.replay is not None else None,
            "facts": self.facts.to_json() if self.facts is not None else None,
            "made_of": dict(self.made_of),
            "optimizer": self.optimizer.to_json() if self.optimizer is not None else None,
            "casts": self.casts.to_json() if self.casts is not None else None,
            "splitk": self.splitk.to_json() if self.splitk is not None else None,
            "recompute": self.recompute.to_json() if self.recompute is not None else None,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> DeviceBreakdown | None:
        """A device as :meth:`to_json` (or a capture's event, without the tables) wrote it; None: no
        device index (not a device's breakdown). A figure that is absent or not a number reads as the
        reader has always read it: 0 where it is summed, None where absent means unmeasured."""
        dev = _int(d.get("device"))
        if dev is None:
            return None

        def n(key: str) -> float:
            return _num(d.get(key)) or 0.0

        cats = _ms_map(d.get("category_ms")) or _ms_map(d.get("categories"))
        return cls(
            device=dev, span_ms=n("span_ms"), busy_ms=n("busy_ms"), idle_ms=n("idle_ms"),
            compute_ms=n("compute_ms"), comm_ms=n("comm_ms"), comm_exposed_ms=n("comm_exposed_ms"),
            overlap_ratio=_num(d.get("overlap_ratio")), memcpy_ms=n("memcpy_ms"),
            sendrecv_ms=n("sendrecv_ms"),
            kernel_count=_int(d.get("kernel_count")) or 0, top_kernels=_stats(d.get("top_kernels")),
            nvtx=tuple(NvtxStat(str(x.get("name", "?")), int(_num(x.get("count")) or 0),
                                _num(x.get("total_ms")) or 0.0) for x in objs(d.get("nvtx"))),
            category_ms=cats, kernel_median_us=_num(d.get("kernel_median_us")),
            softmax_ms=_num(d.get("softmax_ms")), kernel_ms=n("kernel_ms"),
            idle_gaps=_int(d.get("idle_gaps")) or 0, idle_short_ms=_num(d.get("idle_short_ms")),
            parts_ms=_ms_map(d.get("parts_ms")),
            part_kernels={str(p): _stats(ks) for p, ks in obj(d.get("part_kernels")).items()},
            part_ops={str(p): _stats(ks) for p, ks in obj(d.get("part_ops")).items()},
            part_op_ms=_nested(d.get("part_op_ms")), attribution=str(d.get("attribution") or ""),
            attention_fused=bool(d.get("attention_fused")), trace_steps=_int(d.get("trace_steps")),
            syncs=_int(d.get("syncs")), sync_gap_ms=_num(d.get("sync_gap_ms")),
            stream_syncs=_int(d.get("stream_syncs")), stream_sync_gap_ms=_num(d.get("stream_sync_gap_ms")),
            idle=_idle(d.get("idle")), phase_ms=_nested(d.get("phase_ms")),
            side_stream_ms=_ms_map(d.get("side_stream_ms")), complete=Stretch.from_json(d.get("complete")),
            launch_latency_ms=_num(d.get("launch_latency_ms")),
            norm_rows={int(r): c for r, c in obj(d.get("norm_rows")).items()
                       if str(r).isdigit() and isinstance(c, int) and not isinstance(c, bool)},
            replay=ReplayTable.from_json(d.get("replay")),
            facts=JobFacts.from_json(d.get("facts")), made_of=_ms_map(d.get("made_of")),
            optimizer=OptimizerSeen.from_json(d.get("optimizer")), casts=CastsSeen.from_json(d.get("casts")),
            splitk=SplitKSeen.from_json(d.get("splitk")),
            recompute=RecomputeSeen.from_json(d.get("recompute")),
        )

    def ratio(self, part_ms: float) -> float | None:
        """part ÷ span (e.g. idle or exposed share of the captured window); None for an empty span."""
        return part_ms / self.span_ms if self.span_ms > 0 else None


def devices_of(v: object) -> tuple[DeviceBreakdown, ...]:
    """The device breakdowns of a JSON list (a capture's event, an analysis file); one that is not one
    is left out."""
    return tuple(b for x in objs(v) if (b := DeviceBreakdown.from_json(x)) is not None)


@dataclass(frozen=True)
class CaptureAnalysis:
    devices: tuple[DeviceBreakdown, ...]
    source: str = ""
    rank: int | None = None
    steps: int | None = None  # the training steps the trace marks (TraceData.steps)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"devices": [d.to_json() for d in self.devices], "source": self.source}
        if self.rank is not None:
            out["rank"] = self.rank
        if self.steps is not None:
            out["steps"] = self.steps
        return out

    def device(self, index: int) -> DeviceBreakdown:
        for d in self.devices:
            if d.device == index:
                return d
        raise KeyError(index)

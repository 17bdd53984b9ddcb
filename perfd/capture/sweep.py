"""One sweep over a device's activities (issue "the plan an engineer would make", items 5-6): every
instant of the span given to one budget part, every idle gap charged to what it waited for, and the
span divided at the training steps the trace marks so that a step the capture window cut is seen.
Pure: activities and the host side in, totals out (perfd.capture.analysis builds the device's
breakdown from them).

- **Parts**: the first of KERNEL_PRECEDENCE among the activities running at an instant (a copy or a
  collective beside a GEMM is hidden by it); an activity is its launching op's part
  (perfd.capture.ops), else its kernel name's.
- **Idle by cause** (:class:`IdleCause`), each gap charged to what precedes it: the data wait (the
  host inside a data-loader range during the gap), a host synchronisation that returned inside the
  gap (the GPU drained, the host woke and launched again; its owner is the op that made it:
  ``aten::item``, ``c10d::barrier``, none for a bare ``torch.cuda.synchronize()``); else, for a gap
  shorter than th.SHORT_GAP_S, by where the host was: the GPU's own switch between kernels where the
  next kernel's launch call returned before the gap began (the host ahead), the host refilling the
  queue a sync drained where it returned after and a sync's gap came before with the host ahead of it
  until then (the sync's knock-on, charged to its owner; until the host is th.SYNC_REFILLED_LEAD_S ahead
  again), else a launch gap (the host issuing work slower than the GPU runs it); a longer gap is the
  host elsewhere (Python between steps). A capture without the launch calls' ends charges short gaps
  to launches, as before. Each gap has the phase of the work it precedes: the optimizer phase
  (perfd.capture.ops' step tails) or forward-backward.
- **Steps**: each step mark (``Optimizer.step#``) starts a step on the GPU where the first activity
  launched after it starts; the complete steps are those between the first and the last mark. The
  window's edges hold what is left of the steps it cut (Kineto's iteration-aligned window stops after
  the last mark's host call, before the GPU ran the rest of that step).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown import kernels as kernels_mod
from perfd.analytics.breakdown.budget import KERNEL_PRECEDENCE, IdleCause, Phase
from perfd.analytics.breakdown.op_parts import fused_kernel_part, kernel_part
from perfd.analytics.breakdown.pointwise_kinds import PointwiseKind, kernel_kind
from perfd.analytics.breakdown.step_parts import Part
from perfd.capture.ops import Launch, OpAttribution
from perfd.capture.timeline_events import KernelEvent, MemEvent

Interval = tuple[float, float]
SHORT_GAP_NS = th.SHORT_GAP_S.value * 1e9
# A sync call's return is recorded when the host's call ends; the device drained a moment before.
# A return up to this long before the gap began still made it (clock rounding between the two sides).
SYNC_SLACK_NS = 2_000.0
# A gap is the data wait when the host spent at least half of it inside the data loader (a loader that
# hands a ready batch over in 0.2 ms inside a 3 ms gap after a timer's sync did not cause the gap).
DATA_SHARE_OF_GAP = 0.5
# The host has refilled the queue a synchronisation drained once it is this far ahead of the GPU.
REFILLED_LEAD_NS = th.SYNC_REFILLED_LEAD_S.value * 1e9
# A launch gap this short is the launch itself (the runtime's latency between back-to-back kernels); a
# longer one is the host's Python between the launches.
LAUNCH_LATENCY_NS = 5_000.0
IDLE_PART: dict[IdleCause, Part] = {
    IdleCause.SYNC: Part.IDLE_SYNC,
    IdleCause.REFILL: Part.IDLE_SYNC,  # the sync's knock-on: charged to it
    IdleCause.LAUNCH: Part.IDLE_SHORT,
    IdleCause.SWITCH: Part.IDLE_SWITCH,
    IdleCause.HOST: Part.IDLE_LONG,
    IdleCause.DATA: Part.DATA,
}


@dataclass(frozen=True)
class HostSide:
    """What the capture's host side says about the device's gaps and steps (None parts: no host side)."""

    syncs: Sequence[Launch] = ()  # synchronising runtime calls, ``ns`` = when each returned
    sync_owner: Mapping[int, str] = field(default_factory=dict)  # index in ``syncs`` -> the op that made it
    data: Sequence[Interval] = ()  # host ranges of the data loader (``enumerate(DataLoader)``)
    marks: Sequence[float] = ()  # host ns where each marked step begins
    ops: OpAttribution | None = None  # tails (the optimizer phase) and each launch's host time


@dataclass
class Tally:
    """What one stretch of the span holds: its parts, each part's ms by issuing op, and its idle by
    (cause, phase, owner) with the gaps counted."""

    span_ns: float = 0.0
    parts: dict[Part, float] = field(default_factory=lambda: defaultdict(float))
    op_ns: dict[Part, dict[str, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    idle: dict[tuple[IdleCause, Phase, str], list[float]] = field(default_factory=dict)  # [ns, gaps]
    parts_in_phase: dict[Phase, dict[Part, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    tiny_ns: float = 0.0  # launch gaps under LAUNCH_LATENCY_NS: the launches themselves

    def add_idle(self, key: tuple[IdleCause, Phase, str], ns: float, counted: bool) -> None:
        row = self.idle.setdefault(key, [0.0, 0.0])
        row[0] += ns
        row[1] += 1.0 if counted else 0.0


@dataclass
class SweepResult:
    whole: Tally
    complete: Tally | None  # the complete steps between the first and last mark (None: fewer than 2)
    steps: int  # complete steps
    named: dict[Part, list[tuple[str, float]]]  # (kernel or copy name, ns) per part, whole span
    by_op: dict[Part, list[tuple[str, float]]]  # (deciding op label, ns) per part, whole span
    side_stream_ns: dict[Part, float]  # each part's kernel time on streams other than the busiest
    # the pointwise part's kernel time by what it computes (perfd.capture.op_kinds), whole span
    made_of: dict[PointwiseKind, float] = field(default_factory=dict)
    window: tuple[float, float] | None = None  # the complete steps' span on the device (None: no two marks)


class _Activity:
    __slots__ = ("corr", "end", "label", "name", "op", "part", "start", "stream")

    def __init__(
        self,
        start: float,
        end: float,
        part: Part,
        name: str,
        corr: int | None,
        stream: int | None,
        label: str | None,
        op: str | None,
    ) -> None:
        self.start, self.end, self.part, self.name = start, end, part, name
        self.corr, self.stream, self.label, self.op = corr, stream, label, op


def _activities(
    kernels: Sequence[KernelEvent], memcpys: Sequence[MemEvent], ops: OpAttribution | None
) -> list[_Activity]:
    unfused = any(kernels_mod.is_softmax(k.name) for k in kernels)
    part_of_name: dict[str, Part] = {}
    out: list[_Activity] = []
    for k in kernels:
        part = part_of_name.get(k.name)
        if part is None:
            part = part_of_name[k.name] = kernel_part(k.name, unfused)
        label = op = None
        if ops is not None and k.corr is not None:
            if part not in (Part.PIPELINE, Part.COMM_EXPOSED):  # collectives go by name
                decided = ops.parts.get(k.corr)
                if decided is None and k.corr in ops.labels:  # an op that names no part (a compiled region)
                    decided = fused_kernel_part(k.name) or Part.POINTWISE
                part = decided or part
            if k.corr in ops.labels:
                label, op = ops.labels[k.corr], ops.op_names.get(k.corr, "")
        out.append(_Activity(k.start_ns, k.end_ns, part, k.name, k.corr, k.stream, label, op))
    for m in memcpys:
        part = ops.parts.get(m.corr, Part.MEMCPY) if ops is not None and m.corr is not None else Part.MEMCPY
        label = op = None
        if ops is not None and m.corr in ops.labels:
            label = f"{ops.labels[m.corr]}: {m.name or m.kind}"
            op = f"{ops.op_names.get(m.corr, '')}: {m.kind}"
        out.append(_Activity(m.start_ns, m.end_ns, part, m.name or m.kind, m.corr, m.stream, label, op))
    return out


def _gpu_cuts(acts: Sequence[_Activity], host: HostSide) -> list[float]:
    """Where each marked step begins on the device: the start of the first activity launched at or
    after the mark (by its host launch time)."""
    ops = host.ops
    if ops is None or not host.marks:
        return []
    launched = sorted(
        (ops.launch_ns[a.corr], a.start) for a in acts if a.corr is not None and a.corr in ops.launch_ns
    )
    if not launched:
        return []
    at = [x[0] for x in launched]
    # the earliest GPU start among activities launched after the mark (streams can reorder a little)
    suffix_min = [0.0] * len(launched)
    low = float("inf")
    for i in range(len(launched) - 1, -1, -1):
        low = min(low, launched[i][1])
        suffix_min[i] = low
    cuts = []
    for m in sorted(host.marks):
        i = bisect.bisect_left(at, m)
        if i < len(launched):
            cuts.append(suffix_min[i])
    return sorted(set(cuts))


class _Classifier:
    """The cause, phase and owner of an idle gap; called once per gap, in time order (it remembers how
    far ahead the host was, and which sync's drained queue it is refilling)."""

    def __init__(self, host: HostSide) -> None:
        order = sorted(range(len(host.syncs)), key=lambda i: host.syncs[i].ns)
        self.sync_ns = [host.syncs[i].ns for i in order]
        self.sync_owner = [self._owner(host, i) for i in order]
        self.data = sorted(host.data)
        self.data_starts = [d[0] for d in self.data]
        ops = host.ops
        self.tails = sorted(ops.tails) if ops is not None else []
        self.tail_starts = [t[0] for t in self.tails]
        self.launch_ns = ops.launch_ns if ops is not None else {}
        self.launch_end = ops.launch_end_ns if ops is not None else {}
        # how far ahead of the GPU the host was at the last gap whose next launch is known (ns: the gap's
        # start less the launch call's return; negative: behind), and the owner of the sync whose
        # drained queue the host is refilling (None: none)
        self.lead: float | None = None
        self.refill: str | None = None

    @staticmethod
    def _owner(host: HostSide, i: int) -> str:
        owner = host.sync_owner.get(i, "")
        if owner:
            return owner
        name = host.syncs[i].name
        return "torch.cuda.synchronize()" if "DeviceSynchronize" in name or "CtxSynchronize" in name else name

    def phase(self, corr: int | None) -> Phase:
        ns = self.launch_ns.get(corr) if corr is not None else None
        if ns is None:
            return Phase.LAYERS
        j = bisect.bisect_right(self.tail_starts, ns) - 1
        return Phase.OPTIMIZER if j >= 0 and self.tails[j][1] >= ns else Phase.LAYERS

    def classify(self, a: float, b: float, next_corr: int | None) -> tuple[IdleCause, Phase, str]:
        phase = self.phase(next_corr)
        j = bisect.bisect_right(self.data_starts, b) - 1
        inside = (
            sum(
                max(0.0, min(b, self.data[k][1]) - max(a, self.data[k][0]))
                for k in range(max(0, j - 2), j + 1)
            )
            if j >= 0
            else 0.0
        )
        end = self.launch_end.get(next_corr) if next_corr is not None else None
        lead = a - end if end is not None else None
        before, self.lead = self.lead, lead if lead is not None else self.lead
        if inside >= DATA_SHARE_OF_GAP * (b - a):
            self.refill = None
            return IdleCause.DATA, phase, ""
        hi = bisect.bisect_right(self.sync_ns, b)
        if hi > 0 and self.sync_ns[hi - 1] >= a - SYNC_SLACK_NS:
            owner = self.sync_owner[hi - 1]
            # a knock-on only where the host was ahead before the sync: one behind anyway stays behind
            self.refill = owner if before is not None and before >= REFILLED_LEAD_NS else None
            return IdleCause.SYNC, phase, owner
        short = b - a < SHORT_GAP_NS
        if lead is not None and lead >= 0:  # launched before the GPU went idle: the host was ahead
            if lead >= REFILLED_LEAD_NS:
                self.refill = None  # the queue the sync drained is full again
            return (IdleCause.SWITCH if short else IdleCause.HOST), phase, ""
        if self.refill is not None and lead is not None and short:
            return IdleCause.REFILL, phase, self.refill
        if not short:
            self.refill = None  # the host elsewhere: what follows is not the sync's
        return (IdleCause.LAUNCH if short else IdleCause.HOST), phase, ""


def sweep(
    kernels: Sequence[KernelEvent],
    memcpys: Sequence[MemEvent],
    ops: OpAttribution | None = None,
    host: HostSide | None = None,
) -> SweepResult:
    """The device's span divided (module doc): the whole span, and the complete steps where the trace
    marks two steps or more."""
    host = host or HostSide(ops=ops)
    acts = _activities(kernels, memcpys, ops)
    rank = {p: i for i, p in enumerate(KERNEL_PRECEDENCE)}
    edges: list[tuple[float, int, int]] = []  # (time, +1 start / -1 end, activity index)
    named: dict[Part, list[tuple[str, float]]] = defaultdict(list)
    by_op: dict[Part, list[tuple[str, float]]] = defaultdict(list)
    stream_ns: dict[int | None, float] = defaultdict(float)
    made_of: dict[PointwiseKind, float] = defaultdict(float)
    kinds = ops.kinds if ops is not None else {}
    for i, a in enumerate(acts):
        dur = max(a.end - a.start, 0.0)
        if a.end > a.start:
            edges += [(a.start, 1, i), (a.end, -1, i)]
        named[a.part].append((a.name, dur))
        if a.part is Part.POINTWISE:
            kind = kinds.get(a.corr) if a.corr is not None else None
            made_of[kind or kernel_kind(a.name) or PointwiseKind.OTHER] += dur
        if a.label is not None:
            by_op[a.part].append((a.label, dur))
        stream_ns[a.stream] += dur
    main = max(stream_ns, key=lambda s: stream_ns[s]) if stream_ns else None
    side: dict[Part, float] = defaultdict(float)
    for a in acts:
        if a.stream != main and a.stream is not None:
            side[a.part] += max(a.end - a.start, 0.0)
    cuts = _gpu_cuts(acts, host)
    lo, hi = (cuts[0], cuts[-1]) if len(cuts) >= 2 else (float("inf"), float("-inf"))
    whole = Tally()
    complete = Tally() if len(cuts) >= 2 else None
    for a in acts:
        if a.op is not None:
            whole.op_ns[a.part][a.op] += max(a.end - a.start, 0.0)
            if complete is not None and lo <= a.start < hi:
                complete.op_ns[a.part][a.op] += max(a.end - a.start, 0.0)
    classify = _Classifier(host)
    edges.sort(key=lambda e: (e[0], e[1]))  # at one instant, ends before starts
    active = [0] * len(KERNEL_PRECEDENCE)
    running: list[set[int]] = [set() for _ in KERNEL_PRECEDENCE]
    prev: float | None = None
    idle_from: float | None = None
    n_active = 0
    for t, step, i in edges:
        if prev is not None and t > prev and n_active:
            top = next(k for k, n in enumerate(active) if n > 0)
            part = KERNEL_PRECEDENCE[top]
            phase = classify.phase(acts[next(iter(running[top]))].corr)
            _add(whole, part, phase, prev, t, None)
            if complete is not None:
                _add(complete, part, phase, prev, t, (lo, hi))
        r = rank[acts[i].part]
        was_idle = n_active == 0
        active[r] += step
        n_active += step
        if step > 0:
            running[r].add(i)
        else:
            running[r].discard(i)
        if n_active == 0 and not was_idle:
            idle_from = t
        elif was_idle and n_active > 0 and idle_from is not None:
            key = classify.classify(idle_from, t, acts[i].corr)
            _add_idle(whole, key, idle_from, t, None)
            if complete is not None:
                _add_idle(complete, key, idle_from, t, (lo, hi))
            idle_from = None
        prev = t
    if edges:
        whole.span_ns = edges[-1][0] - edges[0][0]
    if complete is not None:
        complete.span_ns = hi - lo
    steps = len(cuts) - 1 if complete is not None else 0
    return SweepResult(whole, complete, steps, named, by_op, dict(side), dict(made_of),
                       (lo, hi) if complete is not None else None)


def _clip(a: float, b: float, window: tuple[float, float] | None) -> float:
    if window is None:
        return b - a
    return max(0.0, min(b, window[1]) - max(a, window[0]))


def _add(t: Tally, part: Part, phase: Phase, a: float, b: float, window: tuple[float, float] | None) -> None:
    ns = _clip(a, b, window)
    if ns > 0:
        t.parts[part] += ns
        t.parts_in_phase[phase][part] += ns


def _add_idle(
    t: Tally, key: tuple[IdleCause, Phase, str], a: float, b: float, window: tuple[float, float] | None
) -> None:
    ns = _clip(a, b, window)
    if ns > 0:
        part = IDLE_PART[key[0]]
        t.parts[part] += ns
        t.parts_in_phase[key[1]][part] += ns
        # a gap is counted once, in the stretch where it begins
        t.add_idle(key, ns, window is None or window[0] <= a < window[1])
        if key[0] is IdleCause.LAUNCH and b - a < LAUNCH_LATENCY_NS:
            t.tiny_ns += ns

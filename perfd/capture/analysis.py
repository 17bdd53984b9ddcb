"""Breakdown of a GPU timeline (the HTA method, docs/design.md §3 "Captures"), as pure functions.

Per CUDA device::

    span          = first kernel/memcpy/memset start → last end
    busy          = union(every GPU activity: kernels, memcpy, memset)      idle = span − busy
    compute       = union(non-NCCL kernels)       comm = union(NCCL kernels)   (name contains "nccl")
    memcpy        = union(memcpy and memset)      (compute, comm and memcpy are parts of busy; they
                                                   may overlap one another, busy counts the time once)
    comm_exposed  = union(NCCL) − union(compute)  (interval difference: comm no compute overlaps)
    overlap       = 1 − exposed / comm            (None without communication)
    idle gaps     = the idle between activities, split at SHORT_GAP_US: many short gaps are the host
                    issuing work slower than the GPU runs it (launch overhead); long ones are the
                    host waiting (a sync, data, Python between steps)
    sendrecv      = union(ncclDevKernel_SendRecv / ncclKernel_SendRecv): pipeline p2p, which
                    *includes waiting for the peer stage*, i.e. the pipeline bubble
    parts         = every instant of the span given to one part of the step budget
                    (perfd.analytics.breakdown.budget.Part): the first of KERNEL_PRECEDENCE among the
                    activities running then (a copy or a collective beside a GEMM is hidden by it),
                    else idle by its cause; and the complete steps between the trace's first and last
                    step marks apart (``complete``: a step the capture window cut is kept out). The
                    parts add up to the span exactly, so a step's budget is the span's parts over the
                    iterations captured (or the complete steps' over their number).

Kernels from several streams overlap and nest, so every total is a length of a union, never a sum
of durations (except the per-name kernel and NVTX tables, which count each event, like
``nsys stats``). Unions and differences work on sorted lists: O(n log n) for the sort, linear after.
Timestamps are nanoseconds (floats: Chrome traces give fractional µs). HolisticTraceAnalysis'
temporal breakdown counts the same activities as busy; tests compare against it on real traces.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown import kernels as kernels_mod
from perfd.analytics.breakdown.casts_seen import CastGroup, CastsSeen
from perfd.analytics.breakdown.device_breakdown import (
    CaptureAnalysis,
    DeviceBreakdown,
    IdleRow,
    KernelStat,
    NvtxStat,
    Stretch,
)
from perfd.analytics.breakdown.job_facts import Loader, loader_kind
from perfd.analytics.breakdown.op_parts import is_data_annotation, is_profiler_step
from perfd.analytics.breakdown.pointwise_kinds import PointwiseKind
from perfd.analytics.breakdown.recompute_seen import RecomputeSeen
from perfd.analytics.breakdown.splitk_seen import SplitKSeen, is_splitk_reduce
from perfd.analytics.breakdown.step_parts import LAYER_PARTS, Part
from perfd.capture.job_scan import scan, with_syncs
from perfd.capture.op_kinds import kernel_kinds
from perfd.capture.ops import Flow, HostRange, Launch, Method, OpAttribution, attribute
from perfd.capture.step_marks import optimizer_marks
from perfd.capture.step_replay import HostTrace, replay_device
from perfd.capture.sweep import HostSide, Tally, sweep
from perfd.capture.timeline_events import KernelEvent, MemEvent

Interval = tuple[float, float]

NS_PER_MS = 1e6
SHORT_GAP_US = th.SHORT_GAP_S.value * 1e6  # shorter idle gaps: launch overhead
PART_TOP_N = 3  # kernels named per budget part
# ops kept per part with their time (the remedies' models read them): the largest; a capture's record
# travels to the aggregator in one event of at most perfd.core.limits.MAX_EVENT_BYTES for all its ranks
PART_OPS_N = 25
CAST_GROUPS_N = 16  # kinds of cast kernel kept (the weights' casts, perfd.analytics.breakdown.casts_seen)
IDLE_ROWS_N = 24  # idle rows (cause, phase, owner) kept, the largest
NAME_CHARS = 160
_SENDRECV = ("nccldevkernel_sendrecv", "ncclkernel_sendrecv")


@dataclass(frozen=True)
class NvtxRange:
    """An annotated range. ``device`` set: a GPU-side projection (Kineto gpu_user_annotation);
    else it belongs to the devices whose kernels ``pid`` launched (all devices when pid is None)."""

    start_ns: float
    end_ns: float
    name: str
    device: int | None = None
    pid: int | None = None


@dataclass
class TraceData:
    """What a loader read from one capture file. ``ranges``, ``launches`` and ``flows`` are the host
    side (empty when the capture has no CPU activity: attribution then falls back to kernel names);
    ``syncs`` the runtime calls that waited for the device; ``steps`` the training steps the trace
    marks (torch.optim's ``Optimizer.step#`` or the profiler's ``ProfilerStep#``), None if none."""

    kernels: list[KernelEvent] = field(default_factory=list)
    memcpys: list[MemEvent] = field(default_factory=list)
    nvtx: list[NvtxRange] = field(default_factory=list)
    source: str = ""
    rank: int | None = None
    ranges: list[HostRange] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)
    syncs: list[Launch] = field(default_factory=list)
    steps: int | None = None
    # Timed events the file held, read or not (a Chrome trace's complete events but the profiler's own
    # span): what tells an empty window from a trace of kinds perfd does not read
    timed_events: int = 0

    @property
    def empty(self) -> bool:
        """Nothing perfd reads in it: no kernel, copy, range, launch or wait."""
        return not (self.kernels or self.memcpys or self.nvtx or self.ranges or self.launches or self.syncs)


class TraceEmpty(ValueError):
    """A capture with nothing perfd reads in it (TraceData.empty): there is nothing to analyse, and an
    analysis of it would read as a job with no device. torch's on-demand profiler writes one when its
    window recorded nothing (seen with a CPU build starved of its CPU for the window)."""


def refuse_empty(data: TraceData) -> None:
    """TraceEmpty for a capture with nothing perfd reads, saying which of the two it is."""
    if not data.empty:
        return
    if data.timed_events:
        raise TraceEmpty(f"the trace holds {data.timed_events} timed event(s), none of a kind perfd reads "
                         "(kernels, memory copies, CPU ops, runtime calls, annotations, by their category)")
    raise TraceEmpty("the trace holds no timed event (its metadata and the profiler's own marks only): "
                     "the profiler recorded nothing in its window")


# --- interval arithmetic ----------------------------------------------------------------------
def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time; empty/negative intervals are dropped."""
    out: list[Interval] = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def total(merged: Sequence[Interval]) -> float:
    """Length of disjoint intervals (the output of :func:`union`)."""
    return sum(e - s for s, e in merged)


def difference(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """a − b for two outputs of :func:`union`: the parts of a that no interval of b covers."""
    out: list[Interval] = []
    j = 0
    for s, e in a:
        cur = s
        # b intervals that end before this one starts can never matter again (a is sorted).
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            bs, be = b[k]
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def intersection(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """a ∩ b for two outputs of :func:`union`."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def is_nccl(name: str) -> bool:
    return "nccl" in name.lower()


def is_sendrecv(name: str) -> bool:
    low = name.lower()
    return any(p in low for p in _SENDRECV)


# --- results: perfd.analytics.breakdown.device_breakdown (the analytics read them as they are) ---


def _ms(ns: float) -> float:
    return ns / NS_PER_MS


def _kernel_table(kernels: Sequence[KernelEvent], busy_ns: float, top_n: int) -> tuple[KernelStat, ...]:
    count: dict[str, int] = defaultdict(int)
    dur: dict[str, float] = defaultdict(float)
    for k in kernels:
        count[k.name] += 1
        dur[k.name] += max(k.end_ns - k.start_ns, 0.0)
    ranked = sorted(dur, key=lambda n: (-dur[n], n))[:top_n]
    return tuple(KernelStat(n, count[n], _ms(dur[n]), dur[n] / busy_ns if busy_ns > 0 else 0.0)
                 for n in ranked)


def _nvtx_table(ranges: Iterable[NvtxRange], top_n: int) -> tuple[NvtxStat, ...]:
    count: dict[str, int] = defaultdict(int)
    dur: dict[str, float] = defaultdict(float)
    for r in ranges:
        if r.end_ns > r.start_ns:
            count[r.name] += 1
            dur[r.name] += r.end_ns - r.start_ns
    ranked = sorted(dur, key=lambda n: (-dur[n], n))[:top_n]
    return tuple(NvtxStat(n, count[n], _ms(dur[n])) for n in ranked)


def _parts_ms(t: Tally) -> dict[str, float]:
    return {p.value: _ms(v) for p, v in t.parts.items() if v > 0}


def _op_ms(t: Tally) -> dict[str, dict[str, float]]:
    return {p.value: {op: _ms(v) for op, v in sorted(d.items(), key=lambda kv: -kv[1])[:PART_OPS_N]}
            for p, d in t.op_ns.items()}


def _stretch(t: Tally, steps: int) -> Stretch:
    rows = sorted(t.idle.items(), key=lambda kv: -kv[1][0])[:IDLE_ROWS_N]
    return Stretch(steps, _ms(t.span_ns), _parts_ms(t), _op_ms(t),
                   tuple(IdleRow(c, ph, owner, _ms(v[0]), int(v[1])) for (c, ph, owner), v in rows),
                   {ph.value: {p.value: _ms(v) for p, v in d.items() if v > 0}
                    for ph, d in t.parts_in_phase.items()}, _ms(t.tiny_ns))


def _tops(named: Mapping[Part, Sequence[tuple[str, float]]]) -> dict[str, tuple[KernelStat, ...]]:
    tops: dict[str, tuple[KernelStat, ...]] = {}
    for part, evs in named.items():
        count: dict[str, int] = defaultdict(int)
        dur: dict[str, float] = defaultdict(float)
        for name, d in evs:
            count[name] += 1
            dur[name] += d
        ranked = sorted(dur, key=lambda n: (-dur[n], n))[:PART_TOP_N]
        # a kernel's name is shown, not matched: C++ template arguments past NAME_CHARS add bytes, not meaning
        tops[part.value] = tuple(KernelStat(n[:NAME_CHARS], count[n], _ms(dur[n]), 0.0) for n in ranked)
    return tops


def _casts(kernels: Sequence[KernelEvent], ops: OpAttribution | None, window: Interval | None,
           steps: int) -> CastsSeen | None:
    """The cast kernels of the complete steps by name (and whether autograd ran them, and whether it
    links them to a parameter's gradient), per step: those the ops or the kernel's name say cast, and
    an eager model's weight casts (perfd.capture.op_kinds.weight_cast_ranges). None: no complete step."""
    if ops is None or window is None or steps < 1:
        return None
    lo, hi = window
    tally: dict[tuple[str, bool, bool], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for k in kernels:
        if k.corr is None or not lo <= k.start_ns < hi:
            continue
        linked = k.corr in ops.weight_casts
        if linked or ops.kinds.get(k.corr) is PointwiseKind.CAST:
            row = tally[(k.name[:NAME_CHARS], k.corr in ops.backward, linked)]
            row[0] += 1
            row[1] += max(k.end_ns - k.start_ns, 0.0)
    kept = sorted(tally.items(), key=lambda kv: (-kv[1][1], kv[0]))[:CAST_GROUPS_N]
    return CastsSeen(tuple(CastGroup(name, back, linked, n / steps, _ms(ns) / steps)
                           for (name, back, linked), (n, ns) in kept))


def _splitk(kernels: Sequence[KernelEvent], window: Interval | None, steps: int) -> SplitKSeen | None:
    """The GEMM library's split-K reductions in the complete steps, per step (None: no complete step)."""
    if window is None or steps < 1:
        return None
    lo, hi = window
    found = [k for k in kernels if lo <= k.start_ns < hi and is_splitk_reduce(k.name)]
    return SplitKSeen(len(found) / steps, _ms(sum(max(k.end_ns - k.start_ns, 0.0) for k in found)) / steps)


def _recompute(kernels: Sequence[KernelEvent], ops: OpAttribution | None, window: Interval | None,
               steps: int) -> RecomputeSeen | None:
    """The forward recomputed inside the backward in the complete steps, per step (None: no complete
    step, or no host side to tell); zero launches where the backward recomputes nothing."""
    if window is None or steps < 1 or ops is None:
        return None
    lo, hi = window
    by: dict[str, float] = defaultdict(float)
    n = 0
    for k in kernels:
        if k.corr is not None and k.corr in ops.recomputed and lo <= k.start_ns < hi:
            n += 1
            part = ops.parts.get(k.corr)
            by[part.value if part is not None else "other"] += max(k.end_ns - k.start_ns, 0.0)
    rows = tuple(sorted(((p, _ms(ns) / steps) for p, ns in by.items()), key=lambda x: -x[1]))
    fwd, bwd = _launch_host_us(kernels, ops, window) if n else (None, None)
    return RecomputeSeen(n / steps, sum(ms for _p, ms in rows), rows, fwd, bwd)


def _launch_host_us(kernels: Sequence[KernelEvent], ops: OpAttribution, window: Interval
                    ) -> tuple[float | None, float | None]:
    """The host's time a kernel launch (µs, median, each launch's distance from the one before it on its
    thread, pauses of SHORT_GAP or more left out) in the layers' forward, and in the backward's own work
    (the recomputed launches left out)."""
    lo, hi = window
    mine = {k.corr for k in kernels if k.corr is not None and lo <= k.start_ns < hi}
    by_tid: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for corr, ns in ops.launch_ns.items():
        if corr in mine:
            by_tid[ops.launch_tid.get(corr, 0)].append((ns, corr))
    fwd: list[float] = []
    bwd: list[float] = []
    for seq in by_tid.values():
        seq.sort()
        for (a, _c), (b, corr) in itertools.pairwise(seq):
            gap = b - a
            if gap >= SHORT_GAP_US * 1e3 or ops.parts.get(corr) not in LAYER_PARTS:
                continue
            if corr not in ops.backward:
                fwd.append(gap)
            elif corr not in ops.recomputed:
                bwd.append(gap)
    return (statistics.median(fwd) / 1e3 if fwd else None, statistics.median(bwd) / 1e3 if bwd else None)


def analyze_device(device: int, kernels: Sequence[KernelEvent], memcpys: Sequence[MemEvent],
                   nvtx: Iterable[NvtxRange] = (), top_n: int = 10,
                   ops: OpAttribution | None = None, host: HostSide | None = None) -> DeviceBreakdown:
    """The breakdown of one device from its own events (``host``: what the capture's host side says
    of its gaps and steps)."""
    starts = [k.start_ns for k in kernels] + [m.start_ns for m in memcpys]
    ends = [k.end_ns for k in kernels] + [m.end_ns for m in memcpys]
    span = max(ends) - min(starts) if starts else 0.0
    kernel_busy = union((k.start_ns, k.end_ns) for k in kernels)
    busy = union([*kernel_busy, *((m.start_ns, m.end_ns) for m in memcpys)])
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(busy)]
    compute = union((k.start_ns, k.end_ns) for k in kernels if not is_nccl(k.name))
    comm = union((k.start_ns, k.end_ns) for k in kernels if is_nccl(k.name))
    sendrecv = union((k.start_ns, k.end_ns) for k in kernels if is_sendrecv(k.name))
    exposed = difference(comm, compute)
    busy_ns, comm_ns, exposed_ns = total(busy), total(comm), total(exposed)
    cat_ns: dict[str, float] = defaultdict(float)
    for k in kernels:
        cat_ns[kernels_mod.category(k.name)] += max(k.end_ns - k.start_ns, 0.0)
    for mc in memcpys:
        cat_ns[kernels_mod.MEMCPY] += max(mc.end_ns - mc.start_ns, 0.0)
    durations = sorted(max(k.end_ns - k.start_ns, 0.0) for k in kernels)
    softmax_ns = sum(max(k.end_ns - k.start_ns, 0.0) for k in kernels if kernels_mod.is_softmax(k.name))
    swept = sweep(kernels, memcpys, ops, host)
    whole = _stretch(swept.whole, 0)
    norm_rows: dict[int, int] = defaultdict(int)
    for k in kernels:
        if k.grid is not None and k.grid[0] > 0 and kernels_mod.is_row_norm(k.name):
            norm_rows[k.grid[0]] += 1
    return DeviceBreakdown(
        device=device,
        span_ms=_ms(span),
        busy_ms=_ms(busy_ns),
        idle_ms=_ms(max(span - busy_ns, 0.0)),
        compute_ms=_ms(total(compute)),
        comm_ms=_ms(comm_ns),
        comm_exposed_ms=_ms(exposed_ns),
        overlap_ratio=1.0 - exposed_ns / comm_ns if comm_ns > 0 else None,
        memcpy_ms=_ms(total(union((m.start_ns, m.end_ns) for m in memcpys))),
        sendrecv_ms=_ms(total(sendrecv)),
        kernel_count=len(kernels),
        top_kernels=_kernel_table(kernels, total(kernel_busy), top_n),
        nvtx=_nvtx_table(nvtx, top_n),
        category_ms={c: _ms(v) for c, v in cat_ns.items()},
        kernel_median_us=durations[len(durations) // 2] / 1e3 if durations else None,
        softmax_ms=_ms(softmax_ns),
        kernel_ms=_ms(total(kernel_busy)),
        idle_gaps=len(gaps),
        idle_short_ms=_ms(sum(g for g in gaps if g < SHORT_GAP_US * 1e3)),
        parts_ms=whole.parts_ms,
        part_kernels=_tops(swept.named),
        part_ops=_tops(swept.by_op),
        part_op_ms=whole.part_op_ms,
        attribution=(ops.method if ops is not None else Method.NAMES).value,
        attention_fused=(Part.ATTENTION.value in whole.parts_ms and softmax_ns == 0),
        idle=whole.idle,
        phase_ms=whole.phase_ms,
        side_stream_ms={p.value: _ms(v) for p, v in swept.side_stream_ns.items() if v > 0},
        complete=_stretch(swept.complete, swept.steps) if swept.complete is not None else None,
        launch_latency_ms=whole.launch_latency_ms,
        norm_rows=dict(norm_rows),
        made_of={k.value: _ms(v) for k, v in swept.made_of.items() if v > 0},
        optimizer=ops.optimizer if ops is not None else None,
        casts=_casts(kernels, ops, swept.window, swept.steps),
        splitk=_splitk(kernels, swept.window, swept.steps),
        recompute=_recompute(kernels, ops, swept.window, swept.steps),
    )


def sync_gaps(busy: Sequence[Interval], syncs: Sequence[Launch]) -> tuple[int, float, int, float]:
    """(device syncs, their gaps ms, stream/event syncs, their gaps ms): for each synchronising host
    call that returned while the device was idle, the idle until the device's next activity."""
    starts = [b[0] for b in busy]
    counts, gaps = [0, 0], [0.0, 0.0]
    for s in syncs:
        j = bisect.bisect_right(starts, s.ns)
        if j == len(starts) or (j > 0 and busy[j - 1][1] > s.ns):
            continue  # the device was busy when it returned (another stream), or nothing followed
        k = 0 if s.name in DEVICE_SYNCS else 1
        counts[k] += 1
        gaps[k] += _ms(starts[j] - s.ns)
    return counts[0], gaps[0], counts[1], gaps[1]


DEVICE_SYNCS = ("cudaDeviceSynchronize", "cuCtxSynchronize")


def analyze_intervals(kernels: Iterable[KernelEvent], memcpys: Iterable[MemEvent] = (),
                      nvtx: Iterable[NvtxRange] = (), source: str = "", rank: int | None = None,
                      top_n: int = 10, ops: OpAttribution | None = None,
                      steps: int | None = None, syncs: Sequence[Launch] = (),
                      host: HostSide | None = None) -> CaptureAnalysis:
    """The breakdown of every device that ran a kernel or a copy, sorted by device."""
    k_by: dict[int, list[KernelEvent]] = defaultdict(list)
    m_by: dict[int, list[MemEvent]] = defaultdict(list)
    pids: dict[int, set[int]] = defaultdict(set)
    for k in kernels:
        k_by[k.device].append(k)
        if k.pid is not None:
            pids[k.device].add(k.pid)
    for m in memcpys:
        m_by[m.device].append(m)
        if m.pid is not None:
            pids[m.device].add(m.pid)
    ranges = list(nvtx)
    devices = []
    for dev in sorted(set(k_by) | set(m_by)):
        mine = [r for r in ranges if r.device == dev
                or (r.device is None and (r.pid is None or r.pid in pids[dev]))]
        d = analyze_device(dev, k_by[dev], m_by[dev], mine, top_n, ops, host)
        if syncs:
            busy = union([*((k.start_ns, k.end_ns) for k in k_by[dev]),
                          *((m.start_ns, m.end_ns) for m in m_by[dev])])
            n, gap, ns_, sgap = sync_gaps(busy, syncs)
            d = dataclasses.replace(d, syncs=n, sync_gap_ms=gap, stream_syncs=ns_, stream_sync_gap_ms=sgap)
        devices.append(dataclasses.replace(d, trace_steps=steps))
    return CaptureAnalysis(tuple(devices), source, rank, steps)


def analyze_trace(data: TraceData, top_n: int = 10, use_frames: bool = True) -> CaptureAnalysis:
    """The breakdown of a loaded capture, its kernels charged to their ops where the host side was
    recorded (perfd.capture.ops; ``use_frames=False``: the op rules alone, Python frames ignored).
    TraceEmpty where it holds nothing to analyse."""
    refuse_empty(data)
    ops = attribute(data.ranges, data.launches, data.flows, use_frames, data.syncs)
    if ops is not None:  # each kernel's kind: its ops', else its name's (the pointwise part's makeup)
        ops = dataclasses.replace(ops, kinds=kernel_kinds(data.kernels, ops.kinds))
    host = HostSide(data.syncs, ops.sync_owner if ops is not None else {},
                    [(r.start_ns, r.end_ns) for r in data.ranges if is_data_annotation(r.name)],
                    step_marks(data.ranges), ops)
    out = analyze_intervals(data.kernels, data.memcpys, data.nvtx, data.source, data.rank, top_n, ops,
                            data.steps, data.syncs, host)
    facts = scan(data.ranges, data.launches, data.kernels, data.memcpys, ops, host.marks)
    out = dataclasses.replace(out, devices=tuple(with_syncs(d, facts) for d in out.devices))
    if ops is None or len(host.marks) < 2:
        return out
    trace = HostTrace(data.launches, data.syncs, {}, host.marks, ops.parts, ops.op_names, ops.sync_owner,
                      ops.tails, [a for a, _b in host.data], ops.backward, recomputed=ops.recomputed,
                      fetches=training_fetches(data.ranges))
    return dataclasses.replace(out, devices=tuple(
        dataclasses.replace(d, replay=replay_device(d.device, data.kernels, data.memcpys, dataclasses.replace(
            trace, checkpoint_host=d.recompute.forward_host if d.recompute is not None else 1.0)))
        for d in out.devices))


def training_fetches(ranges: Sequence[HostRange]) -> tuple[tuple[float, float], ...]:
    """The batches made on the training thread: a single-process DataLoader's fetches on the thread that
    marks the steps (a worker loader's ranges are its queue's waits; another thread's are not the step's)."""
    tids = {r.tid for r in ranges if is_profiler_step(r.name)} or {r.tid for r in optimizer_marks(ranges)}
    return tuple((r.start_ns, r.end_ns) for r in ranges
                 if r.tid in tids and loader_kind(r.name) is Loader.SINGLE_PROCESS)


def step_marks(ranges: Sequence[HostRange]) -> list[float]:
    """Where each step the trace marks begins on the host: the profiler's ``ProfilerStep#`` ranges
    where the loop has them (each spans its step), else torch.optim's ``Optimizer.step#`` (one a step,
    in its optimizer phase) — the kind that counts the trace's steps (perfd.capture.chrome_trace)."""
    prof = [r.start_ns for r in ranges if is_profiler_step(r.name)]
    return prof or [r.start_ns for r in optimizer_marks(ranges)]

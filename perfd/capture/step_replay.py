"""Replay a captured step launch by launch, with changes applied: what a remedy that acts on the
host side saves depends on whether the host or the GPU sets the pace, which no sum of gaps says
(measured: docs/evidence/entries/33-issue-53-third-h200-a-b-the-launch-by-launch-replay-plan-h20.md). Pure.

Why by hand: no profiler or library simulates a CUDA host/stream timeline from a trace (HTA and
nsys report what happened; neither answers "what if this synchronisation were not there").

The model, from the trace's complete steps (between its first and last step marks):

- the host issues events in the order it did: a launch (a kernel or a copy, on its stream, with its
  device duration) or a synchronisation (the host waits until every stream has drained);
- between two events the host works for the time the trace shows between the first's end and the
  second's start (a synchronisation's wait is not work), times a **host scale** ``s``;
- a launch starts on its stream at max(host time + LAUNCH_LATENCY_NS, the stream's previous end).
  Streams are otherwise independent (cross-stream event waits are not modelled);
- the host's time inside an in-process DataLoader's fetches (the batch made on the training thread) is
  the job's own at every host scale: the profiler's cost is per op it records, and a fetch records a few
  dozen in tens of ms (3-4 ops a ms on the H200 recordings of run_clm.py and torchtitan, their steps
  90-100 a ms).

The profiler slows the host (it records every op), so the trace's own host is slower than the job's.
:func:`replay` gives the step time over a grid of host scales for the trace as it is and for every
combination of :class:`Change`; the analysis (perfd.analytics.advice.replay_gains) finds the scale at
which the unchanged step equals the job's own steady step and reads each change's gain there. A
change with a model parameter is replayed at both ends of its range (``lo``/``hi``: the end that
saves less and the end that saves more).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown.op_parts import kernel_part
from perfd.analytics.breakdown.replay_table import (
    COMPILED_LAUNCH_NS,
    DATA_HOST,
    DROPOUT_HOST,
    FUSED_DEVICE,
    FUSED_LAUNCHES,
    GRAPHED_HOST,
    LAUNCH_LATENCY_NS,
    MICROBATCH_DEVICE,
    RECOMPUTE_HOST,
    SCALES,
    Change,
    ReplayTable,
)
from perfd.analytics.breakdown.step_parts import LAYER_PARTS, Part
from perfd.capture.ops import Launch
from perfd.capture.timeline_events import KernelEvent, MemEvent

# Launches in the layers, graphed under CUDA graphs (Megatron-LM's local graphs: each transformer
# layer's forward and backward)
_PER_MICROBATCH_FIXED = frozenset({Part.GRAD_REDUCE})  # weight-sized: not more work for more rows
_DEVICE_SYNCS = ("cudaDeviceSynchronize", "cuCtxSynchronize")
# What torch.compile fuses: the kernels elementwise by their name (a norm's, an activation's, a cast's, a
# copy's), whichever of the model's ops launched them (autocast's casts under a linear layer fuse too:
# nanoGPT's compiled layers launch no separate ones). Not those of what runs outside the compiled model:
# autograd's gradient accumulation, the optimizer, the loss (often computed outside the model), copies
# of the batch; nor those Inductor made already.
_FUSED_KINDS = frozenset({Part.POINTWISE, Part.NORM, Part.ACTIVATION})
_OUTSIDE_MODEL = frozenset({Part.GRAD_REDUCE, Part.OPTIMIZER, Part.LOSS, Part.MEMCPY, Part.COMM_EXPOSED,
                            Part.PIPELINE})
_COMPILED_OPS = "compiledfunction"  # torch.compile's regions (remedies.COMPILED_REGION)
_INDUCTOR_KERNELS = "triton_"
# A host gap this long or longer between two launches is not a launch's dispatch (the loop's Python
# between micro-batches, the garbage collector): it stays when the launches go.
_DISPATCH_NS = th.SHORT_GAP_S.value * 1e9


# what a change's parameter is in each variant: (lo, hi)
_PARAMS: Mapping[Change, tuple[float, float]] = {
    Change.MICROBATCH: MICROBATCH_DEVICE, Change.GRAPHS: GRAPHED_HOST, Change.DROPOUT: DROPOUT_HOST,
    Change.FUSED: FUSED_DEVICE,  # and FUSED_LAUNCHES, at the same end
    Change.RECOMPUTE: RECOMPUTE_HOST, Change.DATA: DATA_HOST,
}

# The changes the fused layers' (torch.compile's, outside Megatron-LM) are replayed together with: those a
# plain loop's or a trainer's remedies read from the replay. The timers' and the attention dropout's are
# read from it in Megatron-LM only, whose fused layers are Transformer Engine's (not replayed); leaving
# those combinations out spares a Megatron-LM trace's analysis 12 of 31 replays.
_FUSED_WITH = frozenset({Change.MICROBATCH, Change.GRAPHS, Change.DATA})
# Changes read alone, never with another: one replay (two variants) each
_ALONE = frozenset({Change.RECOMPUTE})

# event flags
(_SYNC, _BARE_LAYERS_SYNC, _LAYERS, _GRAPHABLE, _DROPOUT, _FIXED, _MB_START, _FUSABLE, _RECOMPUTED,
 _FWD_LAYER) = (1 << i for i in range(10))


def fusable(part: Part | None, kernel: str, op: str) -> bool:
    """A forward-backward kernel torch.compile would fuse (_FUSED_KINDS): ``part`` the one its op decides
    (None: none), ``kernel`` its name, ``op`` the op that launched it."""
    return (bool(kernel) and part not in _OUTSIDE_MODEL and not kernel.startswith(_INDUCTOR_KERNELS)
            and _COMPILED_OPS not in op.lower() and kernel_part(kernel, False) in _FUSED_KINDS)


@dataclass(frozen=True, slots=True)
class Event:
    gap_ns: float  # the host's work before it (the trace's, at scale 1), its fetch's time included
    stream: int  # -1: a synchronisation
    dur_ns: float
    flags: int
    step: int  # which complete step (0-based)
    fetch_ns: float = 0.0  # of gap_ns, the time inside an in-process DataLoader's fetches (not scaled)


@dataclass(frozen=True)
class Timeline:
    events: tuple[Event, ...]
    steps: int
    microbatches: int | None  # micro-batches a step, when every step shows the same count
    checkpoint_host: float = 1.0  # HostTrace.checkpoint_host

    @functools.cached_property
    def rows(self) -> tuple[tuple[float, int, float, int, int, float], ...]:
        """The events as (gap_ns, stream, dur_ns, flags, step, fetch_ns): what :func:`_compiled` reads,
        unpacked faster than the fields of each event, once for each of :func:`replay`'s ~30
        combinations."""
        return tuple((e.gap_ns, e.stream, e.dur_ns, e.flags, e.step, e.fetch_ns) for e in self.events)

    @functools.cached_property
    def fused(self) -> tuple[int, int, float, float]:
        """The forward-backward phase's launches, the fusable ones among them, their device ns and the
        host's dispatch ns of them all (:func:`_dispatch`), over all steps."""
        fb = [e for e in self.events if e.stream >= 0 and e.flags & _LAYERS]
        fus = [e for e in fb if e.flags & _FUSABLE]
        return (len(fb), len(fus), sum(e.dur_ns for e in fus),
                sum(e.gap_ns for e in fb if _dispatch(e.gap_ns, e.flags)))

    def has(self, change: Change) -> bool:
        if change is Change.FUSED:
            return any(e.flags & _FUSABLE for e in self.events)
        if change is Change.TIMERS:
            return any(e.flags & _BARE_LAYERS_SYNC for e in self.events)
        if change is Change.MICROBATCH:
            return self.microbatches is not None and self.microbatches >= 2
        if change is Change.DROPOUT:
            return any(e.flags & _DROPOUT for e in self.events)
        if change is Change.RECOMPUTE:
            return any(e.flags & _RECOMPUTED for e in self.events)
        if change is Change.DATA:
            return any(e.fetch_ns > 0 for e in self.events)
        return any(e.flags & _GRAPHABLE for e in self.events)


@dataclass(frozen=True)
class HostTrace:
    """What the timeline is built from (the loader's events and the op attribution's reading)."""

    launches: Sequence[Launch]
    syncs: Sequence[Launch]  # synchronising calls, ``ns`` = when each returned
    device: Mapping[int, tuple[float, float, int]]  # corr -> (start, end, stream) on this device
    marks: Sequence[float]  # host ns where each marked step begins
    parts: Mapping[int, Part]
    op_names: Mapping[int, str]
    sync_owner: Mapping[int, str]
    tails: Sequence[tuple[float, float]]  # the optimizer phase of each step on the host
    # host ns where each fetch of a batch begins (the data loader's ranges): a micro-batch's start
    data_starts: Sequence[float] = ()
    backward: frozenset[int] = frozenset()  # the launches the autograd engine made (the backward pass)
    kernels: Mapping[int, str] = field(default_factory=dict)  # corr -> its kernel's name on this device
    recomputed: frozenset[int] = frozenset()  # the launches of the forward the backward ran again
    # what a layer's forward launch costs the host without the checkpoint, of what it costs under it, at
    # most (RecomputeSeen.forward_host): the high end of Change.RECOMPUTE
    checkpoint_host: float = 1.0
    # host ranges of the fetches of a DataLoader without workers (the batch made on the training thread):
    # the time Change.DATA moves to worker processes, and which no host scale changes
    fetches: Sequence[tuple[float, float]] = ()


def timeline(h: HostTrace) -> Timeline | None:
    """The complete steps' events in host order; None without two step marks or any launch."""
    if len(h.marks) < 2:
        return None
    lo, hi = h.marks[0], h.marks[-1]
    tails = sorted(h.tails)
    tail_starts = [t[0] for t in tails]

    def in_optimizer(ns: float) -> bool:
        j = bisect.bisect_right(tail_starts, ns) - 1
        return j >= 0 and tails[j][1] >= ns

    starts = {(x.corr, x.name): x.ns for x in h.launches}
    raw: list[tuple[float, float, int, float, int, int]] = []  # (start, end, stream, dur, flags, corr)
    for x in h.launches:
        if x.corr not in h.device or x.name in _SYNC_NAMES or not lo <= x.ns < hi:
            continue
        a, b, stream = h.device[x.corr]
        part = h.parts.get(x.corr)
        op = h.op_names.get(x.corr, "")
        flags = 0 if in_optimizer(x.ns) else _LAYERS
        if flags & _LAYERS and part in LAYER_PARTS:
            flags |= _GRAPHABLE
        if part is Part.ATTENTION and "dropout" in op.lower():
            flags |= _DROPOUT
        if flags & _LAYERS and fusable(part, h.kernels.get(x.corr, ""), op):
            flags |= _FUSABLE
        if part in _PER_MICROBATCH_FIXED:
            flags |= _FIXED
        if x.corr in h.recomputed:
            flags |= _RECOMPUTED
        elif flags & _LAYERS and part in LAYER_PARTS and x.corr not in h.backward:
            flags |= _FWD_LAYER
        raw.append((x.ns, x.ns, stream, max(b - a, 0.0), flags, x.corr))
    for i, s in enumerate(h.syncs):
        t0 = starts.get((s.corr, s.name), s.ns)
        if not lo <= t0 < hi:
            continue
        flags = _SYNC
        if not in_optimizer(t0):
            flags |= _LAYERS
            if s.name in _DEVICE_SYNCS and not h.sync_owner.get(i, ""):
                flags |= _BARE_LAYERS_SYNC
        raw.append((t0, s.ns, -1, 0.0, flags, -1))
    if not raw:
        return None
    raw.sort(key=lambda r: r[0])
    marks = list(h.marks)
    fetches = sorted(h.data_starts)
    passes = forward_starts(h, in_optimizer)
    by_pass = bool(passes) and not _interleaved(fetches, passes)
    bounds = passes if by_pass else fetches
    inside = _Inside(h.fetches)
    events, prev_end, prev_start = [], raw[0][0], raw[0][0] - 1.0
    for t0, t1, stream, dur, flags, _ in raw:
        step = bisect.bisect_right(marks, t0) - 1
        if bisect.bisect_right(bounds, t0) > bisect.bisect_right(bounds, prev_start):
            flags |= _MB_START  # the first event of a micro-batch (after its fetch, or its forward's first)
        events.append(Event(max(t0 - prev_end, 0.0), stream, dur, flags, step, inside.ns(prev_end, t0)))
        prev_start = t0
        prev_end = max(prev_end, t1)
    steps = len(marks) - 1
    if by_pass:  # counted on the host, whether or not the trace kept each launch's GPU activity
        per_step = [bisect.bisect_left(passes, marks[k + 1]) - bisect.bisect_left(passes, marks[k])
                    for k in range(steps)]
    else:
        per_step = [sum(1 for e in events if e.step == k and e.flags & _MB_START) for k in range(steps)]
    mb = per_step[0] if per_step and len(set(per_step)) == 1 and per_step[0] > 0 else None
    return Timeline(tuple(events), steps, mb, h.checkpoint_host)


class _Inside:
    """How much of a host span lies inside ranges (the fetches; nested or overlapping ones merged)."""

    def __init__(self, ranges: Sequence[tuple[float, float]]) -> None:
        merged: list[tuple[float, float]] = []
        for a, b in sorted(ranges):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.ranges = merged
        self.starts = [a for a, _b in self.ranges]

    def ns(self, a: float, b: float) -> float:
        if b <= a or not self.ranges:
            return 0.0
        out, j = 0.0, max(bisect.bisect_right(self.starts, a) - 1, 0)
        for lo, hi in self.ranges[j:]:
            if lo >= b:
                break
            out += max(min(hi, b) - max(lo, a), 0.0)
        return out


def forward_starts(h: HostTrace, in_optimizer: Callable[[float], bool]) -> list[float]:
    """Host ns where each forward pass between the first and last step mark begins: its first launch
    after the backward pass before it (the micro-batches of a step are its forward passes between two
    optimizer steps). Empty where the trace shows no backward pass (no autograd engine's launches)."""
    if not h.backward:
        return []
    lo, hi = h.marks[0], h.marks[-1]
    out: list[float] = []
    after_backward = True
    for x in sorted((x for x in h.launches if lo <= x.ns < hi and x.name not in _SYNC_NAMES),
                    key=lambda x: x.ns):
        if in_optimizer(x.ns) or h.op_names.get(x.corr) == _READ_BACK:
            continue
        backward = x.corr in h.backward
        if not backward and after_backward:
            out.append(x.ns)
        after_backward = backward
    return out


def _interleaved(fetches: Sequence[float], passes: Sequence[float]) -> bool:
    """Each forward pass after the first has one fetch of a batch since the one before it: the fetches
    mark the micro-batches (a loop that fetches its batch inside each micro-batch, as Megatron-LM's
    does). A loop that fetches a step's batches at its start (Hugging Face's Trainer) does not."""
    if not fetches or len(passes) < 2:
        return False
    return all(bisect.bisect_right(fetches, b) - bisect.bisect_right(fetches, a) == 1
               for a, b in itertools.pairwise(passes))


# .item()'s copy of a scalar to the host: the loop reading a result (a loss logged between the steps of
# a closure loop, whose optimizer phase ends with its step mark), no pass's work
_READ_BACK = "aten::_local_scalar_dense"
_SYNC_NAMES = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                         "cudaMemcpy", "cuCtxSynchronize", "cuStreamSynchronize"})


# What each compiled row does on the host (see _compiled); _FETCH: the host works at no scale
_WORK, _WAIT, _LAUNCH, _FETCH = 0, 1, 2, 3
# (gap_ns, m1, m2, kind, stream index, dur_ns): the host works gap_ns × scale × m1 × m2 (m1, m2 are 1.0
# where no change acts, and x × 1.0 is x exactly), then waits for every stream or launches on one; a
# _FETCH row's gap_ns × m1 × m2, whatever the scale
_Row = tuple[float, float, float, int, int, float]


def _compiled(t: Timeline, changes: frozenset[Change], hi: bool) -> tuple[tuple[_Row, ...], int]:
    """The timeline's rows with the changes applied once, and the streams' count: what no scale changes
    (which rows a larger micro-batch absorbs, which syncs the timers' change drops, each launch's
    duration) is decided here, so that each scale's pass is only the clocks' arithmetic. ``replay``
    runs ~30 combinations at 9 scales over 10-20k events, the larger part of analysing a trace."""
    p = {c: v[1 if hi else 0] for c, v in _PARAMS.items()}
    graphs, dropout, timers = Change.GRAPHS in changes, Change.DROPOUT in changes, Change.TIMERS in changes
    p_graphs, p_dropout, p_mb = p[Change.GRAPHS], p[Change.DROPOUT], p[Change.MICROBATCH]
    fused, p_fused = Change.FUSED in changes, p[Change.FUSED]
    recompute, p_recompute = Change.RECOMPUTE in changes, p[Change.RECOMPUTE]
    p_fetch = p[Change.DATA] if Change.DATA in changes else 1.0
    # without the checkpoint, the forward's launches at the high end at what the backward's own cost
    fwd_host = t.checkpoint_host if recompute and hi else 1.0
    host_left = _launches_left(t, hi) if fused else 1.0
    keep_mb = (t.microbatches + 1) // 2 if Change.MICROBATCH in changes and t.microbatches else None
    # half the fetches, each of twice the rows: at the low end a fetch's work is its rows' (the same time
    # in all), at the high end it is per fetch (half the time)
    fetch_mb = 0.5 if keep_mb is not None and hi else 1.0
    streams: dict[int, int] = {}
    rows: list[_Row] = []
    mb_seen, step_seen = 0, -1
    for gap_ns, stream, dur, flags, step, fetch_ns in t.rows:
        if step != step_seen:
            step_seen, mb_seen = step, 0
        if flags & _MB_START:
            mb_seen += 1
        if fetch_ns > 0:
            gap_ns -= fetch_ns
            rows.append((fetch_ns, fetch_mb, p_fetch, _FETCH, 0, 0.0))
        if keep_mb is not None and flags & _LAYERS and mb_seen > keep_mb:
            continue  # a micro-batch the larger ones absorb
        m1 = p_graphs if graphs and flags & _GRAPHABLE else 1.0
        # fused, a launch's dispatch costs the host what the launches left cost it (_launches_left)
        m2 = host_left if fused and stream >= 0 and flags & _LAYERS and _dispatch(gap_ns, flags) else 1.0
        if flags & _FWD_LAYER and _dispatch(gap_ns, flags):
            m2 *= fwd_host
        if dropout and flags & _DROPOUT:
            rows.append((gap_ns, m1, p_dropout * m2, _WORK, 0, 0.0))
        elif recompute and flags & _RECOMPUTED:
            rows.append((gap_ns, m1, p_recompute * m2, _WORK, 0, 0.0))
        elif flags & _SYNC:
            rows.append((gap_ns, m1, 1.0, _WORK if timers and flags & _BARE_LAYERS_SYNC else _WAIT, 0, 0.0))
        else:
            if keep_mb is not None and flags & _LAYERS and not flags & _FIXED:
                dur *= p_mb
            if fused and flags & _FUSABLE:
                dur *= p_fused
            rows.append((gap_ns, m1, m2, _LAUNCH, streams.setdefault(stream, len(streams)), dur))
    return tuple(rows), len(streams)


def _dispatch(gap_ns: float, flags: int) -> bool:
    """The host's time before a forward-backward launch is its dispatch: not the loop's between
    micro-batches (before a micro-batch's first launch), nor a pause of _DISPATCH_NS or more."""
    return not flags & _MB_START and gap_ns < _DISPATCH_NS


def _launches_left(t: Timeline, hi: bool) -> float:
    """What the forward-backward phase's dispatch costs the host once fused, over what it cost: the
    launches that remain (the fusable ones FUSED_LAUNCHES of themselves) over those it had, each at the
    trace's own cost a launch (that phase's dispatch over its launches: an eager op's Python runs for
    each of its kernels), or at the high end a compiled launch's where that is cheaper
    (COMPILED_LAUNCH_NS)."""
    n, k, _, dispatch_ns = t.fused
    if not n:
        return 1.0
    left = 1.0 - (1.0 - FUSED_LAUNCHES[1 if hi else 0]) * k / n
    each = min(1.0, COMPILED_LAUNCH_NS * n / dispatch_ns) if hi and dispatch_ns > 0 else 1.0
    return left * each


def _run(rows: tuple[_Row, ...], n_streams: int, scale: float, steps: int) -> float:
    """One scale's pass over compiled rows: the replayed step (ms, the mean over the steps). Each
    stream's end only grows, so the latest of them all is kept as it goes (``top``): a wait for every
    stream is a max of two, not of all. The same arithmetic in the same order as a launch-by-launch
    reading of the timeline: the same floats."""
    host, top, latency = 0.0, 0.0, LAUNCH_LATENCY_NS  # the host's clock (never below 0), the last end
    free = [0.0] * n_streams  # each stream's end
    for gap_ns, m1, m2, kind, stream, dur in rows:
        if kind == _FETCH:
            host += gap_ns * m1 * m2
            continue
        host += gap_ns * scale * m1 * m2
        if kind == _LAUNCH:
            ready, busy = host + latency, free[stream]
            end = (busy if busy > ready else ready) + dur
            free[stream] = end
            if end > top:
                top = end
        elif kind == _WAIT and top > host:
            host = top
    return (top if top > host else host) / steps / 1e6


def simulate(t: Timeline, scale: float, changes: frozenset[Change] = frozenset(), hi: bool = False) -> float:
    """The replayed step (ms, the mean over the timeline's steps)."""
    rows, n_streams = _compiled(t, changes, hi)
    return _run(rows, n_streams, scale, t.steps)


def _scales(t: Timeline, scales: Sequence[float], changes: frozenset[Change] = frozenset(),
            hi: bool = False) -> tuple[float, ...]:
    rows, n_streams = _compiled(t, changes, hi)
    return tuple(_run(rows, n_streams, s, t.steps) for s in scales)


def replay(t: Timeline, traced_ms: float, scales: Sequence[float] = SCALES) -> ReplayTable:
    """The table over ``scales``: the trace unchanged and every combination of the changes it has (the
    fused layers' with those _FUSED_WITH only)."""
    have = [c for c in Change if t.has(c)]
    changed: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {}
    for n in range(1, len(have) + 1):
        for combo in itertools.combinations(have, n):
            cs = frozenset(combo)
            if Change.FUSED in cs and not cs - {Change.FUSED} <= _FUSED_WITH:
                continue
            if cs & _ALONE and len(cs) > 1:  # read alone (remedy_recompute): one replay more
                continue
            lo = _scales(t, scales, cs, hi=False)
            hi = _scales(t, scales, cs, hi=True) if cs & set(_PARAMS) else lo
            changed[ReplayTable.key(cs)] = (lo, hi)
    steps = max(t.steps, 1)
    host = sum(e.gap_ns for e in t.events) / steps / 1e6
    device = sum(e.dur_ns for e in t.events if e.stream >= 0) / steps / 1e6
    n, k, ns, _ = t.fused
    fetch = sum(e.fetch_ns for e in t.events) / steps / 1e6
    return ReplayTable.of(tuple(scales), _scales(t, scales), changed, traced_ms, t.microbatches, host, device,
                          (n / steps, k / steps, ns / steps / 1e6), fetch)


def replay_device(device: int, kernels: Iterable[KernelEvent], memcpys: Iterable[MemEvent],
                  h: HostTrace) -> ReplayTable | None:
    """The replay table of one device's activities (``h.device`` is filled from them); None without a
    host side to replay."""
    acts: tuple[KernelEvent | MemEvent, ...] = (*kernels, *memcpys)
    mine = {x.corr: (x.start_ns, x.end_ns, x.stream if x.stream is not None else 0)
            for x in acts if x.device == device and x.corr is not None}
    names = {x.corr: x.name for x in acts
             if isinstance(x, KernelEvent) and x.device == device and x.corr is not None}
    t = timeline(dataclasses.replace(h, device=mine, kernels=names))
    if t is None:
        return None
    return replay(t, (h.marks[-1] - h.marks[0]) / (len(h.marks) - 1) / 1e6)


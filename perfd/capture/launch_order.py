"""A timeline's kernel launches in launch order, each with its op's part, its phase, its step and
micro-batch, and its layer (perfd.analytics.ncu.launches reads them to match ncu's profiled launches
to the ops that made them, and to choose ncu's launch window).

Launch order is the correlation id order (the runtime calls' order: ncu numbers the launches it
profiles in the same order). The part and the phase come from perfd.capture.ops (the op open at the
launch, autograd's backward nodes); the steps from the trace's own marks (torch.profiler's
``ProfilerStep#N`` around each step, else the optimizer's ``Optimizer.step#`` at each step's end); a
micro-batch is a forward pass and the backward after it within a step.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from perfd.analytics.breakdown.ncu_rows import Phase
from perfd.analytics.breakdown.op_parts import is_profiler_step
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.ncu.launches import LaunchTimeline, StepMarks, TimelineLaunch, assign_layers
from perfd.capture.analysis import TraceData
from perfd.capture.ops import RangeKind, attribute
from perfd.capture.step_marks import optimizer_marks
from perfd.capture.timeline_events import KernelEvent

# Parts whose launches belong to neither pass: the optimizer's step and zeroing, the gradients'
# accumulation and reduction outside autograd's nodes, copies no op claims
_OTHER = frozenset({Part.OPTIMIZER, Part.GRAD_REDUCE, Part.MEMCPY})


def _step_of(data: TraceData) -> tuple[list[tuple[float, float]], list[float]]:
    """(ProfilerStep ranges, Optimizer.step end times), host ns, sorted."""
    anns = [r for r in data.ranges if r.kind is RangeKind.ANNOTATION]
    prof = [(r.start_ns, r.end_ns) for r in anns if is_profiler_step(r.name)]
    return sorted(prof), sorted(r.end_ns for r in optimizer_marks(anns))


def timeline_launches(data: TraceData, device: int | None = None) -> LaunchTimeline:
    """The launches of ``device`` (every device when None) in launch order, the stage's layers (None:
    no forward pass repeats) and how its steps are known."""
    ops = attribute(data.ranges, data.launches, data.flows)
    when = {ln.corr: ln.ns for ln in data.launches}
    mine = [k for k in data.kernels if k.corr is not None and (device is None or k.device == device)]
    kernels = sorted(mine, key=lambda k: k.corr or 0)
    prof, opt = _step_of(data)
    starts = [a for a, _ in prof]
    out: list[TimelineLaunch] = []
    step_mb: dict[int | None, int] = {}
    last_phase: dict[int | None, Phase] = {}
    for i, k in enumerate(kernels):
        corr = k.corr or 0
        t = when.get(corr)
        step: int | None = None
        if t is not None and prof:
            j = bisect.bisect_right(starts, t) - 1
            step = j + 1 if j >= 0 and t <= prof[j][1] else None
        elif t is not None and opt:
            step = bisect.bisect_right(opt, t)  # steps end at each optimizer step; 0: before the first
        part = ops.parts.get(corr) if ops is not None else None
        if ops is not None and corr in ops.backward:
            phase = Phase.BACKWARD
        elif part is not None and part not in _OTHER:
            phase = Phase.FORWARD
        else:
            phase = Phase.OTHER
        mb = None
        if phase is not Phase.OTHER:
            if phase is Phase.FORWARD and last_phase.get(step) is not Phase.FORWARD:
                step_mb[step] = step_mb.get(step, 0) + 1
            last_phase[step] = phase
            mb = step_mb.get(step)
        out.append(TimelineLaunch(i, k.name, k.grid, k.block, max(k.end_ns - k.start_ns, 0.0) / 1e6,
                                  part.value if part is not None else None, phase,
                                  ops.labels.get(corr, "") if ops is not None else "", step, mb))
    out = _within_passes(out)
    layers, total = assign_layers(out)
    marks = StepMarks.PROFILER if prof else StepMarks.OPTIMIZER if opt else StepMarks.NONE
    placed = tuple(dataclasses.replace(ln, layer=layer) for ln, layer in zip(out, layers, strict=True))
    return LaunchTimeline(placed, total, marks)


def _within_passes(launches: list[TimelineLaunch]) -> list[TimelineLaunch]:
    """A launch no part claims that runs between two forward launches of one micro-batch (a compiled
    fused dropout, a cat) is the forward pass's too."""
    first: dict[tuple[int | None, int | None], int] = {}
    last: dict[tuple[int | None, int | None], int] = {}
    for i, ln in enumerate(launches):
        if ln.phase is Phase.FORWARD:
            first.setdefault((ln.step, ln.microbatch), i)
            last[(ln.step, ln.microbatch)] = i
    out = list(launches)
    for key, a in first.items():
        for i in range(a + 1, last[key]):
            if out[i].phase is Phase.OTHER and out[i].step == key[0]:
                out[i] = dataclasses.replace(out[i], phase=Phase.FORWARD, microbatch=key[1])
    return out


def read_trace(path: str | Path) -> TraceData:
    """The events of a capture file (a Kineto/Chrome trace, an nsys .sqlite or .nsys-rep), read once
    for whatever is made of them (its analysis, its launches)."""
    p = Path(path)
    if p.suffix in (".nsys-rep", ".sqlite"):
        from perfd.capture.nsys_sqlite import read_nsys_trace

        return read_nsys_trace(p)
    from perfd.capture.chrome_trace import read_chrome_trace

    return read_chrome_trace(p)


def launches_of(data: TraceData, device: int | None = None) -> LaunchTimeline:
    """The launches of a capture's events on ``device`` (None: its first device with kernels)."""
    return timeline_launches(data, device if device is not None else _first_device(data.kernels))


def read_launches(path: str | Path, device: int | None = None) -> LaunchTimeline:
    """The launches of a capture file (a Kineto/Chrome trace, an nsys .sqlite or .nsys-rep)."""
    return launches_of(read_trace(path), device)


def _first_device(kernels: Sequence[KernelEvent]) -> int | None:
    devs = sorted({k.device for k in kernels})
    return devs[0] if devs else None

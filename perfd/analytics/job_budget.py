"""A job's step budget from what its run analysis holds: the steady-state timers and FLOPs, and the
capture that informs the job (perfd.analytics.diagnosis.TimelineClass carries its device breakdown).
The same inputs give the same budget live (perfd.aggregator), after the job and offline (``perfd
analyze megatron LOG --capture TRACE``). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfd.analytics.bottleneck import BottleneckClass
from perfd.analytics.budget import FlopsContext, StepBudget, TimerShares, from_capture, from_timers
from perfd.analytics.diagnosis import TimelineClass
from perfd.analytics.gpus import PeakResult


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def contexts(medians: Mapping[str, Any], peak: PeakResult, pp: int | None
             ) -> tuple[FlopsContext, TimerShares]:
    """The FLOPs and timer context of a budget from a run summary's steady medians: FLOPs per GPU per
    step = model TFLOP/s per GPU × step time (both measured over the same steps)."""
    step, tflops = _num(medians, "step_time_ms"), _num(medians, "model_tflops_per_gpu")
    flops = tflops * 1e12 * step / 1e3 if step and tflops else None
    fl = FlopsContext(flops, peak.peak_tflops, peak.measured_ceiling_tflops)
    pipe = _num(medians, "pp_idle_max") if pp and pp > 1 else 0.0
    t = TimerShares(step, _num(medians, "data_share"), _num(medians, "comm_exposed_share"), pipe,
                    _num(medians, "optimizer_ms"), _num(medians, "mfu"))
    return fl, t


def captured_iterations(device: Mapping[str, Any], iterations: int | None, step_ms: float | None
                        ) -> float | None:
    """How many steps a captured span holds: what the capture asked for, else the span over the steady
    step (an offline trace whose step count is not recorded), at least one."""
    if iterations:
        return float(iterations)
    span = _num(device, "span_ms")
    return max(1.0, round(span / step_ms)) if span and step_ms else None


def job_budget(medians: Mapping[str, Any], peak: PeakResult, pp: int | None,
               timeline: TimelineClass | None) -> StepBudget | None:
    """The job's budget: from the capture that informs it, else from the timers alone."""
    fl, timers = contexts(medians, peak, pp)
    if timeline is not None and timeline.device is not None:
        n = captured_iterations(timeline.device, timeline.iterations, timers.step_ms)
        b = from_capture(timeline.device, n, fl=fl, timers=timers, basis=timeline.source)
        if b is not None:
            return b
    return from_timers(timers, fl)


def capture_timeline(capture: Mapping[str, Any]) -> TimelineClass | None:
    """What a capture record (perfd.aggregator.captures JSON, its ``decided`` rank and device) gives the
    job's analysis: the class it supports and the breakdown of the device that decided it."""
    cls = BottleneckClass.of(capture.get("bottleneck"))
    if cls is BottleneckClass.UNKNOWN:
        return None
    result, decided = capture.get("result"), capture.get("decided")
    device = None
    if isinstance(result, Mapping) and isinstance(decided, Mapping):
        part = (result.get("ranks") or {}).get(str(decided.get("rank")))
        devices = part.get("devices") if isinstance(part, Mapping) else None
        device = next((d for d in devices or [] if isinstance(d, Mapping)
                       and d.get("device") == decided.get("device")), None)
    steps = capture.get("steps")
    return TimelineClass(cls, str(capture.get("bottleneck_reason") or ""),
                         f"capture {capture.get('id')} ({capture.get('tool')}, ranks {capture.get('ranks')})",
                         device, steps if isinstance(steps, int) and not isinstance(steps, bool) else None,
                         str(capture.get("id") or ""))

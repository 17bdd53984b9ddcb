"""What the launch-by-launch replay of a capture (perfd.capture.step_replay) says a change saves, on the
job's own clock (docs/evidence/entries/33-issue-53-third-h200-a-b-the-launch-by-launch-replay-plan-h20.md).
Pure.

The trace's host is the profiled one: it records every op, so it runs slower than the job does (on
the H200 runs the captured step was 233 and 537 ms where the job stepped at 204-230 and 400-414 ms).
A gap the profiler lengthened is not a gap the job has, so a remedy read off the trace's gaps promises
time the job never spends. The replay gives the step at several host speeds; the one at which the
unchanged replay steps at the job's own steady median is the job's host, and each change is read
there. The job's median is known to within its run-to-run spread (remedies.run_spread_ms): the host
speeds at both ends of it widen the range, with the change's own model parameter at both ends
(perfd.capture.step_replay: MICROBATCH_DEVICE, GRAPHED_HOST, DROPOUT_HOST).

The replay does not model all of a step: at the profiled host's own speed it steps shorter than the
trace did (ReplayTable.unmodelled_ms: 22 ms of a 396 ms step on the H200's wide model, whose kernels
hide the host). That time is no sign of a slow host, so the job's clock is matched less it: matched
whole, a GPU-bound job read as a host slower than the profiled one, and every host-side change was
promised its slowest-host gain (timer level 1: 6.6-20.5 ms predicted, 3.9 measured; 3.1-14.6 with the
time set apart; docs/evidence/plan_h200_v6).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics.breakdown.replay_table import Change, ReplayTable
from perfd.core.record_json import JsonRecord

# The trace's slices (its gaps by cause) are the job's while the profiler did not slow the host: the
# captured step within this share of the job's steady one (the H100 jobs: 1.4-2.5%, their slices held
# 7 of 8 changes; the H200 jobs: 13-25%, the slices' launch gaps were the profiler's).
PROFILED_SLICES_HOLD = 0.05
# The GPU hides the host where the replayed step moves by less than this share of a change in the host's
# speed (d ln step / d ln host time at the job's host speed, read over HOST_BAND either side). The
# recorded A/Bs' jobs fall in two groups with nothing between: the GPU-bound ones (wide_gpu, wide_swiglu
# on an H100 and an H200) 0.04-0.24, the host-bound ones (long_seq, gqa_swiglu, many_mb) 0.32-0.98
# (tools/plan_mb_factor.py prints them). Where the host is hidden, a stall of the host's costs the step
# nothing the GPU would not have spent, so the step's own jitter is not the host's to give back
# (remedy_steps.timer_sync; docs/evidence/README.md, gain model 7).
HOST_HIDDEN_SHARE = 0.3
HOST_BAND = 0.05


@dataclass(frozen=True)
class ReplayGains(JsonRecord):
    """Each combination's gain (ms a step, low and high) at the job's host speed."""

    clock_ms: float  # the job's steady step the replay was matched to (its unmodelled time included)
    scale: float  # the host speed that matched it (1.0: the profiled host)
    scales: tuple[float, float]  # at the job's step less and more its run-to-run spread
    gains: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    traced_ms: float = 0.0  # the trace's own step
    host_share: float | None = None  # how the replayed step moves with the host's time there (elasticity)

    @property
    def slices_hold(self) -> bool:
        """The trace's slices (its gaps by cause) are the job's: the profiler did not slow its host."""
        return self.traced_ms <= (1 + PROFILED_SLICES_HOLD) * self.clock_ms

    @property
    def host_hidden(self) -> bool:
        """The GPU sets the step's pace at the job's host speed (HOST_HIDDEN_SHARE)."""
        return self.host_share is not None and self.host_share < HOST_HIDDEN_SHARE

    def of(self, changes: Iterable[Change]) -> tuple[float, float] | None:
        return self.gains.get(ReplayTable.key(changes))


def _at(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """ys at x, linear between the grid's points (xs ascending)."""
    j = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def host_scale(t: ReplayTable, step_ms: float) -> float | None:
    """The host speed at which the unchanged replay steps at ``step_ms``; None outside the grid (a job
    faster than the replay's fastest host, or slower than the profiled one: the capture is not its)."""
    ys = t.as_is
    if len(ys) < 2 or any(b < a for a, b in itertools.pairwise(ys)) or not ys[0] <= step_ms <= ys[-1]:
        return None
    j = min(max(bisect.bisect_left(ys, step_ms), 1), len(ys) - 1)
    y0, y1, x0, x1 = ys[j - 1], ys[j], t.scales[j - 1], t.scales[j]
    return x0 if y1 == y0 else x0 + (x1 - x0) * (step_ms - y0) / (y1 - y0)


def calibrate(t: ReplayTable | None, clock_ms: float | None, spread_ms: float) -> ReplayGains | None:
    """Every combination's gain at the job's host speed (None: no replay, no clock, or the clock
    outside what the replay reaches)."""
    if t is None or clock_ms is None or clock_ms <= 0:
        return None
    replayed = clock_ms - t.unmodelled_ms  # the part of the job's step the replay models
    mid = host_scale(t, replayed)
    if mid is None:
        return None
    lo = host_scale(t, replayed - spread_ms) or t.scales[0]
    hi = host_scale(t, replayed + spread_ms) or t.scales[-1]
    xs = t.scales
    gains = {}
    for key, (less, more) in t.changed.items():
        got = [_at(xs, t.as_is, s) - _at(xs, row, s) for s in (lo, mid, hi) for row in (less, more)]
        gains[key] = (min(got), max(got))
    share = (_at(xs, t.as_is, mid * (1 + HOST_BAND)) - _at(xs, t.as_is, mid * (1 - HOST_BAND))) \
        / (2 * HOST_BAND) / clock_ms
    return ReplayGains(clock_ms, mid, (lo, hi), gains, t.traced_ms, share)

"""Lasting shifts of a job's step time: a change point with the levels before and after it. Pure.

Why not an incident: an incident is measured against the steady median, and a slowdown that lasts
(steps 60 → 90 ms from iteration 151 to the end at 300) becomes the median once it covers half of
the window — the incident then ended as the median adapted (near iteration 250 in a probe)
and the rest of the shift was counted nowhere. A change point keeps the level from before the shift
as the reference: its cost is Σ(step − level before) over every iteration after it, to the end of
the run — or until the user says the new level is the new normal (``new_normal_at``: the
aggregator's ``POST /api/jobs/<job>/new-normal``), from which iteration on the level after is the
reference and nothing more is counted. perfd.analytics.incidents.detect turns it into an incident of kind
``level-shift`` (so the aggregator's tracker, events, findings and goodput's incident part all see
it), with the evidence of what grew.

The search is the least-squares split of the step times (one pass over prefix sums, values clipped
at 3× the median so that a few spikes do not pick the split), checked with medians: the level
after is at least ``STEP_FACTOR`` × the level before, each side sits on its own side of the midpoint
for ``CHANGE_POINT_LEVEL_SHARE`` of its steps, the shift lasts ``CHANGE_POINT_MIN_STEPS`` steps (and a
tenth of the window) and the run is still at the new level at its end. One change point, the last
one that lasts: a slowdown that recovered before the end is an incident, not a shift. Written here
rather than taken from ruptures or a CUSUM package: one split over a few thousand numbers, pure
Python, no dependency for the agent-side analyses that run it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from perfd.analytics import thresholds as th

_CLIP = 3.0  # step times are clipped at this many medians for the split (spikes do not pick it)


@dataclass(frozen=True)
class ChangePoint:
    """A lasting shift: ``index`` is the first of the steps passed in that is at the new level."""

    index: int
    before_ms: float  # median step before the shift: the reference its cost is measured against
    after_ms: float  # median step after it
    n_after: int  # steps at the new level, to the end of those passed in
    # Index from which the user took the new level as the new normal (None: still counted).
    accepted_index: int | None = None


def min_steps(n: int) -> int:
    """Steps a shift must last in a window of ``n``: CHANGE_POINT_MIN_STEPS, and a tenth of it."""
    return max(int(th.CHANGE_POINT_MIN_STEPS.value), n // 10)


def find_change_point(steps: Sequence[float | None]) -> ChangePoint | None:
    """The lasting upward shift among ``steps`` (step times in ms in iteration order; None: no time,
    or disturbed — left out), or None."""
    idx = [i for i, s in enumerate(steps) if s is not None and s > 0]
    xs = [float(steps[i]) for i in idx]  # type: ignore[arg-type]
    n = len(xs)
    need = min_steps(n)
    if n < 2 * need:
        return None
    # Cheap refusal first (most runs have no shift; an analysis runs every refresh): the run ends
    # above the midpoint of the two levels, itself ≥ (1 + STEP_FACTOR) / 2 × the level before, and a
    # twentieth of the steps lie at or below that level (half the ≥ n/10 before the shift): so does
    # the n/40-th smallest.
    ordered = sorted(xs)
    if statistics.median(xs[n - need:]) <= (1 + th.STEP_FACTOR.value) / 2 * ordered[n // 40]:
        return None
    cap = _CLIP * ordered[n // 2]
    clipped = [min(x, cap) for x in xs]
    s1, s2 = [0.0], [0.0]
    for x in clipped:
        s1.append(s1[-1] + x)
        s2.append(s2[-1] + x * x)

    def sse(a: int, b: int) -> float:
        m = b - a
        return s2[b] - s2[a] - (s1[b] - s1[a]) ** 2 / m

    k = min(range(need, n - need + 1), key=lambda j: sse(0, j) + sse(j, n))
    before, after = statistics.median(xs[:k]), statistics.median(xs[k:])
    if not after >= th.STEP_FACTOR.value * before:
        return None
    mid = (before + after) / 2
    while k > 1 and xs[k - 1] > mid:  # the first step at the new level
        k -= 1
    while k < n - need and xs[k] <= mid:
        k += 1
    share = th.CHANGE_POINT_LEVEL_SHARE.value
    above = sum(1 for x in xs[k:] if x > mid)
    below = sum(1 for x in xs[:k] if x <= mid)
    tail = xs[n - need:]
    if n - k < need or above < share * (n - k) or below < share * k \
            or statistics.median(tail) <= mid:
        return None
    return ChangePoint(idx[k], statistics.median(xs[:k]), statistics.median(xs[k:]), n - k)


def accept(cp: ChangePoint, iterations: Sequence[int], new_normal_at: int | None) -> ChangePoint:
    """``cp`` with the index from which the user took its level as the new normal (the first of
    ``iterations`` at or after ``new_normal_at``), when that comes after the shift began."""
    if new_normal_at is None:
        return cp
    at = next((i for i, it in enumerate(iterations) if it >= new_normal_at), len(iterations))
    if at <= cp.index:  # marked before this shift began: it was another one, or none
        return cp
    return ChangePoint(cp.index, cp.before_ms, cp.after_ms, cp.n_after, at)

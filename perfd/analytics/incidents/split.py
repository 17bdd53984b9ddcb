"""A slow stretch whose steps fall into runs of different causes, as one incident per run.

A stretch is found by its step times alone (perfd.analytics.incidents.detect): a data-loading
slowdown that runs straight into steps slowed by something else (a loaded host) is one stretch,
and one verdict over it either names the data wait for steps it did not slow or names nothing for
steps it did. Seen in CI on a loaded 2-core machine: a CPU-only loop's 40 data-slow steps joined
the ~130 load-slowed steps after them (iterations 60-230, 2.9x the steady step) and the whole read
"not explained". Where a part of the step (data wait, exposed communication) explains the excess of
one contiguous run of the stretch's steps and not of the rest, that run is an incident of its own
and the rest another, each with its own verdict, cost and iterations; every step stays in exactly
one of them.

The run a part explains is the one over which its growth most exceeds ``EXPLAINS_SHARE`` of the
steps' excess (the rule that names an incident's cause, read step by step: a maximum-sum run of
growth - share x excess). It is split off only where each piece would be an incident by itself
(its cost at least the incident floor): a few steps of another kind at its edge stay with it, as
they did before, and are never dropped to jitter by a split.

Pure functions over per-step numbers; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from perfd.analytics import thresholds as th

EXPLAINS_SHARE = th.EXPLAINS_SHARE.value


def _best_run(score: Sequence[float], lo: int, hi: int) -> tuple[float, int, int]:
    """The run lo <= a <= b < hi with the largest sum of ``score`` (Kadane): (sum, a, b)."""
    best, best_a, best_b = 0.0, lo, lo - 1
    total, start = 0.0, lo
    for i in range(lo, hi):
        if total <= 0.0:
            total, start = 0.0, i
        total += score[i]
        if total > best:
            best, best_a, best_b = total, start, i
    return best, best_a, best_b


def split_by_cause(run: Sequence[int], excess_ms: Mapping[int, float | None],
                   growth_ms: Sequence[Mapping[int, float | None]], floor_ms: float) -> list[list[int]]:
    """``run`` (indices of consecutive steps) as consecutive pieces, each one cause's: a piece a part
    explains, and the pieces before and after it (split again the same way). ``excess_ms[i]``: step
    i's time beyond the steady rate for its size (None: not measured, a captured or missing step);
    ``growth_ms``: per part of the step, step i's time in it beyond its steady time (None: no timer);
    ``floor_ms``: the incident floor (perfd.analytics.incidents.detect.min_cost_s), which every piece
    split off must cost. The pieces cover ``run`` exactly, in order."""
    steps = list(run)
    if len(steps) < 2:
        return [steps]

    def cost(a: int, b: int) -> float:  # positions a..b inclusive, in steps' order
        return sum(e for k in range(a, b + 1) if (e := excess_ms[steps[k]]) is not None)

    best: tuple[float, int, int] | None = None
    for part in growth_ms:
        score = [0.0 if (e := excess_ms[i]) is None or (g := part[i]) is None else g - EXPLAINS_SHARE * e
                 for i in steps]
        found = _best_run(score, 0, len(steps))
        if found[0] > 0.0 and (best is None or found[0] > best[0]):
            best = found
    if best is None:
        return [steps]
    _, a, b = best
    if cost(a, b) < floor_ms:
        return [steps]  # the part's run is no incident by itself: the stretch stays one
    # A side too cheap to be an incident stays with the part's run (as the whole stretch held it).
    if a > 0 and cost(0, a - 1) < floor_ms:
        a = 0
    if b < len(steps) - 1 and cost(b + 1, len(steps) - 1) < floor_ms:
        b = len(steps) - 1
    if (a, b) == (0, len(steps) - 1):
        return [steps]
    before = split_by_cause(steps[:a], excess_ms, growth_ms, floor_ms) if a > 0 else []
    after = split_by_cause(steps[b + 1:], excess_ms, growth_ms, floor_ms) if b < len(steps) - 1 else []
    return [*before, steps[a:b + 1], *after]

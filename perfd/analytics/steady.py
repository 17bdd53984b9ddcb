"""Steady-state selection: which iterations summaries are taken over (DESIGN.md §2).

Excluded: the warm-up (the first max(3, ⌈10%⌉) records, where step time has not settled),
iterations slower than 2× the median step time of the post-warm-up window (recompiles, checkpoint
saves, hiccups), iterations perfd's own captures disturbed, and records without a step time.
The window's median is recomputed over all records passed in, so in a live feed where the window
grows it is a running median.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from perfd.analytics.common import TextEnum, finite, median
from perfd.model import StepRecord

WARMUP_MIN_ITERATIONS = 3
WARMUP_FRACTION = 0.10
OUTLIER_FACTOR = 2.0


class Exclusion(TextEnum):
    """Why an iteration is left out of the steady state (``SteadyState.kinds``; the sentence saying
    it with its numbers is ``SteadyState.excluded``, for people)."""

    WARMUP = "warmup"
    CAPTURE = "capture"  # disturbed by perfd's own capture
    NO_STEP_TIME = "no_step_time"
    OUTLIER = "outlier"  # slower than OUTLIER_FACTOR × the window's median
    INCIDENT = "incident"  # part of an incident (perfd.analytics.incidents)


@dataclass(frozen=True)
class SteadyState:
    """iteration -> steady?, why each excluded iteration was left out (typed, and said)."""

    steady: dict[int, bool]
    excluded: dict[int, str] = field(default_factory=dict)
    kinds: dict[int, Exclusion] = field(default_factory=dict)
    warmup_records: int = 0
    reference_step_ms: float | None = None  # median step time of the post-warm-up window

    @property
    def iterations(self) -> list[int]:
        return sorted(i for i, s in self.steady.items() if s)

    def range_text(self) -> str:
        its = self.iterations
        if not its:
            return "no steady-state iterations"
        return f"iterations {its[0]}–{its[-1]} ({len(its)} steady)"


def warmup_count(n_records: int) -> int:
    return max(WARMUP_MIN_ITERATIONS, math.ceil(WARMUP_FRACTION * n_records))


def steady_state(records: Sequence[StepRecord]) -> SteadyState:
    """Mark each record's iteration steady or not (records may come in any order)."""
    ordered = sorted(records, key=lambda r: r.iteration)
    return steady_state_of([r.iteration for r in ordered], [finite(r.step_time_ms) for r in ordered],
                           [r.disturbed_by_capture for r in ordered])


def steady_state_of(iterations: Sequence[int], steps: Sequence[float | None],
                    disturbed: Sequence[int]) -> SteadyState:
    """steady_state over columns already in iteration order, step times finite or None (a long
    run's offline analysis keeps its records as columns, not objects)."""
    w = warmup_count(len(iterations))
    ref = median(steps[i] for i in range(w, len(iterations)) if not disturbed[i])
    steady: dict[int, bool] = {}
    excluded: dict[int, str] = {}
    kinds: dict[int, Exclusion] = {}
    warmup = f"warm-up (first {w} records)"  # one string for every warm-up iteration
    for i, iteration in enumerate(iterations):
        step = steps[i]
        kind: Exclusion | None = None
        if i < w:
            kind, reason = Exclusion.WARMUP, warmup
        elif disturbed[i]:
            kind, reason = Exclusion.CAPTURE, "disturbed by a perfd capture"
        elif step is None:
            kind, reason = Exclusion.NO_STEP_TIME, "no step time"
        elif ref is not None and step > OUTLIER_FACTOR * ref:
            kind = Exclusion.OUTLIER
            reason = f"step {step:g} ms > {OUTLIER_FACTOR:g}× window median {ref:g} ms"
        steady[iteration] = kind is None
        if kind is not None:
            excluded[iteration], kinds[iteration] = reason, kind
    return SteadyState(steady, excluded, kinds, w, ref)

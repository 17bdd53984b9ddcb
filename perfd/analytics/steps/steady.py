"""Steady-state selection: which iterations summaries are taken over (docs/design.md §2).

Excluded: the warm-up (the first max(3, ⌈10%⌉) records, where step time has not settled),
outliers — a step slower than 2× the steady time per step whose window of steps is slower too
(a recompile, a checkpoint save, a hiccup; never one mode of a regular pattern: perfd.analytics.
windows) —, iterations perfd's own captures disturbed, and records without a step time. The
steady time per step is the median of the post-warm-up windows' mean times (per unit of work where
steps differ in size), recomputed over all records passed in: in a live feed it is a running one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics.common import TextEnum, finite
from perfd.analytics.finding_types import StepSpan
from perfd.analytics.steps import windows
from perfd.analytics.steps.provenance import Cited, Code, cite
from perfd.core.model import StepRecord
from perfd.core.record_json import JsonWritten, unless_none

WARMUP_MIN_ITERATIONS = 3
WARMUP_FRACTION = 0.10
OUTLIER_FACTOR = 2.0
# ... and its window of steps past the midpoint between the steady level and that: one mode of a
# regular pattern (a two-worker loader's long wait) never moves its window's mean that far.
WINDOW_OUTLIER = (1.0 + OUTLIER_FACTOR) / 2
CAPTURED, NO_STEP, ARMED = cite(Code.CAPTURED), cite(Code.NO_STEP), cite(Code.ARMED_STEP)


class Exclusion(TextEnum):
    """Why an iteration is left out of the steady state (``SteadyState.kinds``; the code saying it
    with its numbers is ``SteadyState.excluded``, worded where shown)."""

    WARMUP = "warmup"
    CAPTURE = "capture"  # disturbed by perfd's own capture
    NO_STEP_TIME = "no_step_time"
    OUTLIER = "outlier"  # slower than OUTLIER_FACTOR × the steady step, in a window slower than that too
    INCIDENT = "incident"  # part of an incident (perfd.analytics.incidents.detect)
    PAUSE = "pause"  # the loop's own pause at a cadence (perfd.analytics.incidents.cadence)
    # its rank ran armed for a capture (perfd.core.armed): the profiler's step, not the job's; an armed step
    # that would otherwise be steady (what the arming's cost is measured over)
    ARMED = "armed"


@dataclass(frozen=True)
class SteadyState:
    """iteration -> steady?, why each excluded iteration was left out (typed, and said)."""

    steady: dict[int, bool]
    excluded: dict[int, Cited] = field(default_factory=dict)  # codes of Kind.EXCLUDED
    kinds: dict[int, Exclusion] = field(default_factory=dict)
    warmup_records: int = 0
    reference_step_ms: float | None = None  # steady time per step (windows.reference), per mean work
    # iteration -> the incident or capture disturbance (its id) it was left out for: what a range of
    # excluded iterations refers to instead of repeating its sentence (perfd.report.row_json)
    refs: dict[int, str] = field(default_factory=dict)

    @property
    def iterations(self) -> list[int]:
        return sorted(i for i, s in self.steady.items() if s)

    def span(self, run: int | None = None) -> StepSpan:
        """The steady iterations' span (``run``: named, the job having had more than one)."""
        its = self.iterations
        return StepSpan(first=its[0], last=its[-1], n=len(its), run=run) if its else StepSpan(run=run)


def warmup_count(n_records: int) -> int:
    return max(WARMUP_MIN_ITERATIONS, math.ceil(WARMUP_FRACTION * n_records))


def steady_state(records: Sequence[StepRecord]) -> SteadyState:
    """Mark each record's iteration steady or not (records may come in any order)."""
    ordered = sorted(records, key=lambda r: r.iteration)
    return steady_state_of([r.iteration for r in ordered], [finite(r.step_time_ms) for r in ordered],
                           [r.disturbed_by_capture for r in ordered])


def steady_state_of(iterations: Sequence[int], steps: Sequence[float | None],
                    disturbed: Sequence[int], work: Sequence[float | None] | None = None,
                    armed: Sequence[int] | None = None) -> SteadyState:
    """steady_state over columns already in iteration order, step times finite or None (a long
    run's offline analysis keeps its records as columns, not objects); ``work``: each step's size
    (its FLOPs), where steps differ (windows.per_work); ``armed``: each step's rank ran armed for a
    capture (perfd.core.armed): never steady, marked ARMED where it would be (the steady level is the
    unarmed steps' where there are some, else the armed ones': outliers among them stay outliers)."""
    w = warmup_count(len(iterations))
    sized = windows.per_work(steps, work)
    armed = armed if armed is not None else [0] * len(iterations)
    unarmed = any(not armed[i] for i in range(w, len(iterations)))
    post = [None if disturbed[i] or (unarmed and armed[i]) else sized[i] for i in range(w, len(iterations))]
    ref = windows.reference(post)
    smooth = windows.rolling(post)
    steady: dict[int, bool] = {}
    excluded: dict[int, Cited] = {}
    kinds: dict[int, Exclusion] = {}
    warmup = cite(Code.WARMUP_ROWS, w)  # one value for every warm-up iteration
    for i, iteration in enumerate(iterations):
        step = steps[i]
        kind: Exclusion | None = None
        if i < w:
            kind, reason = Exclusion.WARMUP, warmup
        elif disturbed[i]:
            kind, reason = Exclusion.CAPTURE, CAPTURED
        elif step is None:
            kind, reason = Exclusion.NO_STEP_TIME, NO_STEP
        elif armed[i] and unarmed:  # measured against the unarmed level, every armed step is slow
            kind, reason = Exclusion.ARMED, ARMED
        elif ref is not None and (own := sized[i]) is not None and own > OUTLIER_FACTOR * ref \
                and (smooth[i - w] or 0.0) > WINDOW_OUTLIER * ref:
            kind = Exclusion.OUTLIER
            reason = cite(Code.OUTLIER_STEP, step, OUTLIER_FACTOR, ref)
        elif armed[i]:
            kind, reason = Exclusion.ARMED, ARMED
        steady[iteration] = kind is None
        if kind is not None:
            excluded[iteration], kinds[iteration] = reason, kind
    return SteadyState(steady, excluded, kinds, w, ref)


@dataclass(frozen=True)
class ExcludedRange(JsonWritten):
    """Consecutive iterations left out of the steady state for one reason."""

    first: int
    last: int
    kind: Exclusion
    # the incident or capture disturbance they belong to
    ref: str | None = field(default=None, metadata=unless_none())


def excluded_ranges(kinds: Mapping[int, Exclusion], refs: Mapping[int, str],
                    iterations: Iterable[int] | None = None) -> tuple[ExcludedRange, ...]:
    """The excluded iterations as ranges: a range runs while the kind and reference stay the same
    and no steady iteration (one of ``iterations`` not in ``kinds``) lies between (iterations the run
    never logged, a log interval's gaps, do not break it)."""
    order = sorted(iterations) if iterations is not None else sorted(kinds)
    out: list[ExcludedRange] = []
    cur: tuple[int, Exclusion, str | None] | None = None  # the open range's first, kind, ref
    for i in order:
        kind = kinds.get(i)
        if kind is None:
            cur = None
            continue
        ref = refs.get(i)
        if cur is not None and cur[1] is kind and cur[2] == ref:
            out[-1] = ExcludedRange(cur[0], i, kind, ref)
        else:
            cur = (i, kind, ref)
            out.append(ExcludedRange(i, i, kind, ref))
    return tuple(out)

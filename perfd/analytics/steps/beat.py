"""Slow steps that recur at a fixed period: a timer-driven disturbance, not the job's own work. Pure.

Why it matters (H100, tests/gpu/varlen_jitter_live.py): a variable-length loop read as step-jitter (a
residual CV of 14%) had slow steps 10-45 ms long whose midpoints fell every 1.54 s; the same loop
under the same perfd stack on a clean machine had none (CV 1.6%). "Look for host-side gaps" is all a
CV says; a period says what kind of thing to look for (a monitor, a logger's flush, a cron: something
on a timer), and the slow steps' time over their work's is what removing it gives back (a GPU timer
beside the loop: 4.4% read, 4.8% gained without it).

The test is Rayleigh's over a grid of trial periods: at period P each slow step's time t is a phase
2πt/P; R is the length of the mean of those phases as unit vectors (1: all in phase, ~1/√n for n
random times). For random times n·R² is about Exp(1)-distributed, so the best of the few hundred
periods tried (around the few the slow steps' gaps pile up at) stays below ~7 by chance;
:data:`BEAT_RAYLEIGH` asks more. Written by hand: twenty
lines over the standard library, where a periodogram library (Lomb-Scargle) answers another question
(a sinusoid in the values, not events in phase) and would bring numpy to the analytics.
"""

from __future__ import annotations

import cmath
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from perfd.analytics import thresholds as th
from perfd.analytics.steps import windows
from perfd.core.record_json import JsonWritten

SLOW_EXCESS = th.BEAT_SLOW_STEP_EXCESS.value
MIN_SLOW = int(th.BEAT_MIN_SLOW_STEPS.value)
RAYLEIGH = th.BEAT_RAYLEIGH.value
MIN_PERIOD_S = 0.2  # below this a "period" is a few steps: the step pattern's, not a timer's
MIN_CYCLES = 5  # a period must fit this many times in the slow steps' span
SPAN_S = 120.0  # the newest slow steps read: within this much of the newest (a timer's period drifts)
MAX_SLOW = 200  # and at most this many (the search costs trial periods × slow steps)
CANDIDATES = 3  # the periods the slow steps' gaps pile up at most, each searched ±BAND
BAND = 0.05  # in steps of a tenth of a cycle's drift over the span


@dataclass(frozen=True, slots=True)
class SlowSteps(JsonWritten):
    """A jittering run's slow steps (:func:`slow_steps`): how many, what they cost, and the period
    they keep where they keep one."""

    count: int  # steps more than SLOW_EXCESS over what their work predicts
    steps: int  # the steps read
    excess_share: float  # the slow steps' time over their prediction ÷ all the steps' time
    period_s: float | None = None  # None: no period passes the test
    concentration: float | None = None  # R: the mean phase vector's length at the period (0-1)


def _fit(steps: Sequence[float], work: Sequence[float] | None) -> list[float]:
    """Each step's expected time: the line through the steps' sizes that unexplained_cv measures the
    spread from (windows.line_fit) where the work varies, else the median step."""
    fit = windows.line_fit(work, steps) if work is not None else None
    if fit is not None and work is not None:
        mw, mt, slope = fit
        return [mt + slope * (w - mw) for w in work]
    mid = sorted(steps)[len(steps) // 2]
    return [mid] * len(steps)


def _candidates(mids: Sequence[float], span: float) -> list[float]:
    """The periods the slow steps' pairwise gaps pile up at: log bins BAND wide from MIN_PERIOD_S to
    a fifth of the span, each scored by its count ÷ its width (random times spread their gaps evenly;
    a period piles them at P, 2P, ... with P's bin the narrowest). ``mids`` ascending."""
    lo, hi = MIN_PERIOD_S, span / MIN_CYCLES
    if hi <= lo:
        return []
    step = math.log1p(BAND)
    counts = [0] * (int(math.log(hi / lo) / step) + 1)
    for i, a in enumerate(mids):
        for b in mids[i + 1:]:
            if b - a > hi:
                break
            if b - a >= lo:
                counts[min(len(counts) - 1, int(math.log((b - a) / lo) / step))] += 1
    top = sorted(((c / math.exp(k * step), k) for k, c in enumerate(counts) if c), reverse=True)[:CANDIDATES]
    return [lo * math.exp((k + 0.5) * step) for _, k in top]


def _rayleigh(mids: Sequence[float], f: float) -> float:
    """R at frequency ``f``: the length of the mean of the times' phases as unit vectors."""
    return abs(sum(cmath.exp(2j * math.pi * f * m) for m in mids)) / len(mids)


def slow_steps(ends: Sequence[float | None], steps_ms: Sequence[float | None],
               work: Sequence[float | None] | None = None) -> SlowSteps | None:
    """The slow steps and the period they keep, if they keep one: ``ends`` each step's end (epoch
    seconds), ``steps_ms`` its time (less its data wait: what the job itself spent), ``work`` its
    FLOPs where known. None with fewer than 3 steps to read."""
    if work is not None and all(w is None for w in work):
        work = None  # no step's work known: the median step is what each is expected to take
    rows = [(float(e), float(t), float(w) if w is not None else None)
            for e, t, w in zip(ends, steps_ms, work if work is not None else [None] * len(steps_ms),
                               strict=True)
            if e is not None and t is not None and (work is None or w is not None)]
    total = sum(t for _, t, _ in rows)
    if len(rows) < 3 or total <= 0:
        return None
    s = [t for _, t, _ in rows]
    expected = _fit(s, [w for _, _, w in rows] if work is not None else None)  # type: ignore[misc]
    slow = [(e - t / 2e3, t - x) for (e, t, _), x in zip(rows, expected, strict=True)
            if x > 0 and t > x * (1 + SLOW_EXCESS)]
    found = SlowSteps(count=len(slow), steps=len(s), excess_share=sum(x for _, x in slow) / total)
    if len(slow) < MIN_SLOW:
        return found
    newest = slow[-1][0]
    mids = [m for m, _ in slow if m >= newest - SPAN_S][-MAX_SLOW:]
    span = mids[-1] - mids[0]
    best = (0.0, 0.0)
    for p0 in _candidates(mids, span):
        f, df = (1 - BAND) / p0, 0.1 / span
        while f <= (1 + BAND) / p0:
            best = max(best, (_rayleigh(mids, f), f))
            f += df
    r, f = best
    if f <= 0 or len(mids) * r * r < RAYLEIGH:
        return found
    return replace(found, period_s=round(1.0 / f, 3), concentration=round(r, 3))

"""Step series read as rates over windows of steps, not as single steps (issue "the job that is not
Megatron", items 1, 2 and 5). Pure.

Real loops step irregularly by design: a DataLoader with two workers makes the data wait alternate
(a short one, a long one), gradient accumulation and periodic logging add a slower step every N,
variable-length batches make steps of different sizes. A median of single steps then picks one mode
(the fast steps: "data loading 0.6% of the step" for a job that waits on data a third of its time),
and a per-step threshold flags the other mode all the time (the steady state opened an incident).
Over a window of :data:`WINDOW` steps the time per step is stable whatever the pattern inside it
(an alternation's mean is its mean), so:

- a step's *size* is its work (its FLOPs, where the source gives them per step): a step is read as
  its time per unit of work, scaled to the run's mean work (:func:`per_work`), so that a batch twice
  as long is not a slow step;
- the steady reference is the level of the rolling windows' mean times (:func:`reference`), and the
  rolling mean (:func:`rolling`) is what a departure is judged on;
- shares and throughput are time-weighted over the steps they cover (:func:`weighted`): data wait
  summed ÷ step time summed; FLOPs summed ÷ time summed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from perfd.analytics import thresholds as th

WINDOW = int(th.STEADY_WINDOW_STEPS.value)


def per_work(steps: Sequence[float | None], work: Sequence[float | None] | None) -> list[float | None]:
    """Each step's time per unit of its work, scaled to the mean work of the steps that have both (so
    a run of equal steps is unchanged); the steps as they are where the work is unknown or constant."""
    if work is None:
        return list(steps)
    known = [w for s, w in zip(steps, work, strict=True) if s is not None and w is not None and w > 0]
    if len(known) < 2 or max(known) <= min(known) * (1 + 1e-9):
        return list(steps)
    mean = statistics.fmean(known)
    return [s * mean / w if s is not None and w is not None and w > 0 else s for s, w in zip(steps, work,
                                                                                             strict=True)]


def rolling(xs: Sequence[float | None], window: int = WINDOW) -> list[float | None]:
    """The centred mean of each value's window (values present only; None where the window has none)."""
    half = window // 2
    n = len(xs)
    prefix_sum, prefix_n = [0.0], [0]
    for x in xs:
        prefix_sum.append(prefix_sum[-1] + (x if x is not None else 0.0))
        prefix_n.append(prefix_n[-1] + (x is not None))
    out: list[float | None] = []
    for i in range(n):
        a = max(0, i - half)
        b = min(n, a + window)
        a = max(0, b - window)
        k = prefix_n[b] - prefix_n[a]
        out.append((prefix_sum[b] - prefix_sum[a]) / k if k else None)
    return out


def reference(xs: Sequence[float | None], window: int = WINDOW, quantile: float = 0.5) -> float | None:
    """The steady time per step: the median of the rolling windows' mean times (values present only),
    the level most windows sit at whatever the pattern inside them. ``quantile=0.25``: the lower
    quartile, a first guess that a slowdown covering up to three quarters of the run does not move
    (a median sits between the two levels once a slowdown covers half of it); incident detection
    takes it, then the median of the windows clear of the slowdown."""
    means = sorted(m for m in rolling([x for x in xs if x is not None], window) if m is not None)
    return means[min(len(means) - 1, int(quantile * (len(means) - 1) + 0.5))] if means else None


def weighted(shares: Sequence[float | None], steps: Sequence[float | None]) -> float | None:
    """A share of the step time-weighted over the steps (Σ share·step ÷ Σ step, over the steps that
    have both): data wait summed over step time summed."""
    num = den = 0.0
    for v, s in zip(shares, steps, strict=True):
        if v is not None and s is not None and s > 0:
            num += v * s
            den += s
    return num / den if den > 0 else None


def unexplained_cv(steps: Sequence[float | None], work: Sequence[float | None] | None) -> float | None:
    """The coefficient of variation of the step times that the steps' sizes do not explain: the
    spread of their residuals from the least-squares line t = a + b·w (a step's fixed cost plus its
    cost per unit of work) ÷ the mean step, over the steps that have both. A line and not a ratio:
    on the H100, 512-, 1024- and 2048-token steps of one model took 18, 31 and 57 ms (not
    proportional to their FLOPs: the time per FLOP alone left a CV of 31%, the line 4%). The plain CV
    where the work is unknown or the same for every step."""
    pairs = [(w, t) for t, w in zip(steps, work if work is not None else [None] * len(steps), strict=True)
             if t is not None and w is not None and w > 0]
    ts = [t for t in steps if t is not None]
    if len(ts) < 2:
        return None
    mean_t = statistics.fmean(ts)
    if mean_t <= 0:
        return None
    fit = line_fit([w for w, _ in pairs], [t for _, t in pairs])
    if fit is None:
        return statistics.pstdev(ts) / mean_t
    mw, mt, slope = fit
    residuals = [t - (mt + slope * (w - mw)) for w, t in pairs]
    return statistics.pstdev(residuals) / mt if mt > 0 else None


def line_fit(work: Sequence[float], steps: Sequence[float]) -> tuple[float, float, float] | None:
    """The least-squares line t = mean_t + slope·(w − mean_w) through the steps' times against their
    work, as (mean_w, mean_t, slope); None with fewer than 3 steps or the same work for all."""
    if len(work) < 3 or max(work) <= min(work) * (1 + 1e-9):
        return None
    mw, mt = statistics.fmean(work), statistics.fmean(steps)
    return mw, mt, sum((w - mw) * (t - mt) for w, t in zip(work, steps, strict=True)) / sum((w - mw) ** 2
                                                                                          for w in work)


# A normal sample's standard deviation over its median absolute deviation.
MAD_TO_SD = 1.4826
ROBUST_SD_MIN_N = 5  # fewer steps say nothing about their spread


def robust_sd(xs: Sequence[float | None]) -> float | None:
    """The spread of ``xs`` as a standard deviation read from their median absolute deviation: a
    checkpoint's or a capture's odd step does not widen it. None under ROBUST_SD_MIN_N values."""
    known = [float(x) for x in xs if x is not None]
    if len(known) < ROBUST_SD_MIN_N:
        return None
    mid = statistics.median(known)
    return MAD_TO_SD * statistics.median(abs(x - mid) for x in known)

"""Percentiles and rates from two scrapes of a Prometheus endpoint (pure: no I/O, no clock).

Method (what every latency percentile perfd reports for serving means):

1. Histograms are cumulative since the server started. perfd takes the **difference** of the
   cumulative bucket counts between two scrapes (t0, t1], so a percentile describes the requests of
   that window, not the server's lifetime. A series whose count went down was reset (restart): its
   current counts are the increase since the reset.
2. Series of one histogram (label sets: model_name, tp_rank, ...) with the same bucket bounds are
   summed bucket by bucket (``sum by (le)`` in PromQL). Series with other bounds are left out and
   said so.
3. The q-quantile is interpolated linearly inside the bucket that holds rank q·N, exactly as
   Prometheus' ``histogram_quantile``: lower bound of the first bucket 0 (when its upper bound is
   positive), a rank that falls in the ``+Inf`` bucket gives the largest finite upper bound.
   Counts are made monotonic first (as Prometheus does). No observations in the window: absent.

The result is exact for the bucketed data and an estimate of the true percentile: the true value
lies in the same bucket.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from perfd.analytics.steps.provenance import Cited, Code, cite
from perfd.core.model import LabelSet
from perfd.core.serving_records import HistogramSeries, MetricsSnapshot

# Labels that name a replica of the same process group's numbers (TP/PP ranks report the same
# requests): for gauges perfd keeps the lowest rank of each and sums the rest (dp_rank, priority).
DUPLICATE_RANK_LABELS: tuple[str, ...] = ("tp_rank", "pp_rank", "moe_ep_rank", "ep_rank")


@dataclass(frozen=True)
class Quantile:
    value: float | None
    observations: float  # observations in the window the quantile was computed over
    method: Cited | None  # how it was computed (None: no histogram to compute it from)
    reason: Cited | None = None  # why value is None


def _monotonic(buckets: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    hi = 0.0
    for le, c in buckets:
        hi = max(hi, c)
        out.append((le, hi))
    return out


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets sorted by le.

    None when there are no observations or no ``+Inf`` bucket (the total is unknown).
    """
    if not buckets or not math.isinf(buckets[-1][0]) or not 0.0 <= q <= 1.0:
        return None
    bs = _monotonic(buckets)
    total = bs[-1][1]
    if total <= 0:
        return None
    if len(bs) < 2:
        return None
    rank = q * total
    i = next(j for j, (_, cum) in enumerate(bs) if cum >= rank)  # the +Inf bucket always qualifies
    le, c = bs[i]
    if math.isinf(le):
        return bs[-2][0]  # the largest finite upper bound
    lower, prev = (0.0, 0.0) if i == 0 else (bs[i - 1][0], bs[i - 1][1])
    if i == 0 and le <= 0:
        return le
    if c == prev:
        return le
    return lower + (le - lower) * (rank - prev) / (c - prev)


def delta_series(prev: HistogramSeries | None, cur: HistogramSeries) -> tuple[HistogramSeries, bool]:
    """cur − prev bucket by bucket; (cur, True) when prev is missing, has other bounds, or was reset."""
    if prev is None or [le for le, _ in prev.buckets] != [le for le, _ in cur.buckets]:
        return cur, prev is not None
    pt, ct = prev.total(), cur.total()
    reset = (pt is not None and ct is not None and ct < pt) or any(
        c < p for (_, p), (_, c) in zip(prev.buckets, cur.buckets, strict=True))
    if reset:
        return cur, True
    buckets = tuple((le, c - p) for (le, p), (_, c) in zip(prev.buckets, cur.buckets, strict=True))
    count = None if cur.count is None or prev.count is None else cur.count - prev.count
    total = None if cur.sum is None or prev.sum is None else cur.sum - prev.sum
    return HistogramSeries(cur.labels, buckets, count, total), False


def merge_series(series: Sequence[HistogramSeries]) -> tuple[list[tuple[float, float]] | None, int]:
    """Bucket-wise sum of series sharing the most common bucket bounds; (buckets, series left out)."""
    if not series:
        return None, 0
    bounds: dict[tuple[float, ...], list[HistogramSeries]] = {}
    for s in series:
        bounds.setdefault(tuple(le for le, _ in s.buckets), []).append(s)
    key, group = max(bounds.items(), key=lambda kv: len(kv[1]))
    sums = [0.0] * len(key)
    for s in group:
        for i, (_, c) in enumerate(s.buckets):
            sums[i] += c
    return list(zip(key, sums, strict=True)), len(series) - len(group)


def window_quantile(q: float, name: str, cur: MetricsSnapshot,
                    prev: MetricsSnapshot | None) -> Quantile:
    """The q-quantile of histogram ``name`` over the requests between ``prev`` and ``cur``.

    Without ``prev`` the window is the server's lifetime (said in ``method``).
    """
    series = cur.histograms.get(name)
    if not series:
        return Quantile(None, 0.0, None, cite(Code.SG_NOT_EXPOSED, name, cur.source))
    before = {s.labels: s for s in prev.histograms.get(name, [])} if prev is not None else {}
    deltas: list[HistogramSeries] = []
    resets = 0
    for s in series:
        d, reset = delta_series(before.get(s.labels), s) if prev is not None else (s, False)
        resets += reset
        deltas.append(d)
    buckets, left_out = merge_series(deltas)
    window = (cite(Code.SG_BUCKETS_DELTA, cur.time - prev.time) if prev is not None
              else cite(Code.SG_BUCKETS_LIFETIME))
    n = buckets[-1][1] if buckets and math.isinf(buckets[-1][0]) else 0.0
    method = cite(Code.SG_QUANTILE, q, name, window, len(deltas) - left_out, n)
    if resets:
        method = cite(Code.SG_QUANTILE_RESETS, method, resets)
    if left_out:
        method = cite(Code.SG_QUANTILE_LEFT_OUT, method, left_out)
    if buckets is None or n <= 0:
        return Quantile(None, n, method, cite(Code.SG_NO_OBSERVATIONS_OF, name))
    return Quantile(histogram_quantile(q, buckets), n, method)


def first_histogram(cur: MetricsSnapshot, names: Sequence[str]) -> str | None:
    """The first of ``names`` the snapshot exposes (e.g. inter_token_latency, then the older
    time_per_output_token)."""
    return next((n for n in names if cur.histograms.get(n)), None)


def _keep(labels: LabelSet, lowest: dict[str, str]) -> bool:
    d = dict(labels)
    return all(d.get(k) in (None, lowest[k]) for k in lowest)


def _lowest_ranks(rows: Sequence[tuple[LabelSet, float]]) -> dict[str, str]:
    lowest: dict[str, str] = {}
    for labels, _ in rows:
        for k, v in labels:
            if k in DUPLICATE_RANK_LABELS and (k not in lowest or _rank_key(v) < _rank_key(lowest[k])):
                lowest[k] = v
    return lowest


def _rank_key(v: str) -> tuple[int, str]:
    try:
        return int(v), v
    except ValueError:
        return 1 << 30, v


def gauge_value(snap: MetricsSnapshot, name: str, how: str) -> tuple[float | None, int]:
    """A job-level value of gauge ``name``: ``how`` = "sum" (counts, throughputs) or "mean" (ratios)
    over the series left after keeping the lowest TP/PP/EP rank; (value, series used)."""
    rows = [(lab, v) for lab, v in snap.gauges.get(name, []) if math.isfinite(v)]
    if not rows:
        return None, 0
    lowest = _lowest_ranks(rows)
    vals = [v for lab, v in rows if _keep(lab, lowest)]
    if not vals:
        return None, 0
    return (sum(vals) if how == "sum" else sum(vals) / len(vals)), len(vals)


def counter_increase(name: str, cur: MetricsSnapshot, prev: MetricsSnapshot) -> float | None:
    """Increase of counter ``name`` (summed over series) between two scrapes; resets handled as
    Prometheus' increase() does (a series that went down counts from 0)."""
    now = {lab: v for lab, v in cur.counters.get(name, [])}
    if not now:
        return None
    before = {lab: v for lab, v in prev.counters.get(name, [])}
    total = 0.0
    for lab, v in now.items():
        p = before.get(lab)
        total += v if p is None or v < p else v - p
    return total


def counter_rate(name: str, cur: MetricsSnapshot, prev: MetricsSnapshot | None) -> float | None:
    """Per-second rate of counter ``name`` between two scrapes (None with one scrape)."""
    if prev is None or cur.time <= prev.time:
        return None
    inc = counter_increase(name, cur, prev)
    return None if inc is None else inc / (cur.time - prev.time)

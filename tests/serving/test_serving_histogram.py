"""histogram_quantile, deltas, merges and gauge/counter helpers on hand-built snapshots."""

from __future__ import annotations

import math

import pytest

from perfd.analytics.serving.histogram import (
    counter_increase,
    counter_rate,
    delta_series,
    gauge_value,
    histogram_quantile,
    merge_series,
    window_quantile,
)
from perfd.analytics.steps.provenance import Code, cite
from perfd.core.serving_records import HistogramSeries, MetricsSnapshot
from perfd.report.provenance_text import text

INF = math.inf


def test_quantile_interpolates_inside_the_bucket() -> None:
    b = [(0.1, 10.0), (0.2, 30.0), (0.5, 40.0), (INF, 40.0)]
    assert histogram_quantile(0.5, b) == pytest.approx(0.15)  # rank 20: half-way through (0.1, 0.2]
    assert histogram_quantile(0.25, b) == pytest.approx(0.1)  # rank 10: the top of the first bucket
    assert histogram_quantile(0.1, b) == pytest.approx(0.04)  # first bucket starts at 0
    assert histogram_quantile(0.0, b) == 0.0
    assert histogram_quantile(1.0, b) == pytest.approx(0.5)


def test_rank_in_the_inf_bucket_gives_the_largest_finite_bound() -> None:
    assert histogram_quantile(0.99, [(1.0, 5.0), (2.0, 9.0), (INF, 20.0)]) == 2.0


def test_no_observations_or_no_inf_bucket_is_absent() -> None:
    assert histogram_quantile(0.5, [(1.0, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.5, [(1.0, 3.0), (2.0, 4.0)]) is None
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(1.5, [(1.0, 3.0), (INF, 3.0)]) is None
    assert histogram_quantile(0.5, [(INF, 3.0)]) is None


def test_non_monotonic_counts_are_fixed_as_prometheus_does() -> None:
    assert histogram_quantile(0.5, [(1.0, 4.0), (2.0, 3.0), (INF, 8.0)]) == histogram_quantile(
        0.5, [(1.0, 4.0), (2.0, 4.0), (INF, 8.0)])


def series(*counts: float, labels: tuple[tuple[str, str], ...] = (("model_name", "m"),),
           bounds: tuple[float, ...] = (0.1, 1.0, INF)) -> HistogramSeries:
    return HistogramSeries(labels, tuple(zip(bounds, counts, strict=True)), counts[-1], None)


def test_delta_and_reset() -> None:
    d, reset = delta_series(series(1, 2, 3), series(4, 8, 10))
    assert not reset and d.buckets == ((0.1, 3.0), (1.0, 6.0), (INF, 7.0)) and d.count == 7
    d2, reset2 = delta_series(series(5, 6, 9), series(1, 1, 2))  # the server restarted
    assert reset2 and d2.buckets == series(1, 1, 2).buckets
    d3, changed = delta_series(series(1, 2, 3, bounds=(0.5, 2.0, INF)), series(4, 8, 10))
    assert changed and d3 == series(4, 8, 10)


def test_merge_keeps_the_most_common_bounds() -> None:
    a = series(1, 2, 3, labels=(("tp_rank", "0"),))
    b = series(1, 1, 1, labels=(("tp_rank", "1"),))
    odd = series(5, 5, 5, bounds=(0.2, 2.0, INF))
    buckets, left = merge_series([a, b, odd])
    assert buckets == [(0.1, 2.0), (1.0, 3.0), (INF, 4.0)] and left == 1


def snap(t: float, **kw: object) -> MetricsSnapshot:
    return MetricsSnapshot(time=t, source="test", **kw)  # type: ignore[arg-type]


def test_window_quantile_explains_itself() -> None:
    prev = snap(0.0, histograms={"h": [series(0, 0, 0)]})
    cur = snap(30.0, histograms={"h": [series(10, 20, 20)]})
    q = window_quantile(0.5, "h", cur, prev)
    assert q.value == pytest.approx(0.1) and q.observations == 20
    # how, as a code and its numbers: q, the histogram, its window (Δ over 30 s), the series, the count
    assert q.method is not None and q.method.code is Code.SG_QUANTILE
    assert q.method.args[:2] == (0.5, "h") and q.method.args[2] == cite(Code.SG_BUCKETS_DELTA, 30.0)
    assert "30.0 s apart" in text(q.method) and "as Prometheus" in text(q.method)  # worded where shown
    assert window_quantile(0.5, "nope", cur, prev).reason == cite(Code.SG_NOT_EXPOSED, "nope", "test")
    empty = window_quantile(0.5, "h", cur, cur)
    assert empty.value is None and empty.reason == cite(Code.SG_NO_OBSERVATIONS_OF, "h")


def test_gauges_keep_the_lowest_tp_rank_and_sum_dp_ranks() -> None:
    rows = [((("dp_rank", "0"), ("tp_rank", "0")), 5.0), ((("dp_rank", "0"), ("tp_rank", "1")), 5.0),
            ((("dp_rank", "1"), ("tp_rank", "0")), 7.0), ((("dp_rank", "1"), ("tp_rank", "1")), 7.0)]
    s = snap(1.0, gauges={"g": rows})
    assert gauge_value(s, "g", "sum") == (12.0, 2)
    assert gauge_value(s, "g", "mean") == (6.0, 2)
    assert gauge_value(s, "missing", "sum") == (None, 0)
    nan = snap(1.0, gauges={"g": [((), math.nan)]})
    assert gauge_value(nan, "g", "sum") == (None, 0)


def test_counter_increase_handles_resets_and_new_series() -> None:
    prev = snap(0.0, counters={"c": [((("a", "1"),), 100.0), ((("a", "2"),), 50.0)]})
    cur = snap(10.0, counters={"c": [((("a", "1"),), 160.0), ((("a", "2"),), 20.0), ((("a", "3"),), 5.0)]})
    assert counter_increase("c", cur, prev) == 60.0 + 20.0 + 5.0
    assert counter_rate("c", cur, prev) == pytest.approx(8.5)
    assert counter_rate("c", cur, None) is None and counter_rate("c", prev, cur) is None
    assert counter_increase("missing", cur, prev) is None

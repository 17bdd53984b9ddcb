"""Steady-state selection: warm-up, slow outliers, capture-disturbed iterations."""

from __future__ import annotations

from perfd.analytics.steady import steady_state, warmup_count
from perfd.model import StepRecord
from tests.analytics.analytics_helpers import fixture_records


def test_fixture_warmup_excluded() -> None:
    st = steady_state(fixture_records())
    assert st.warmup_records == 4  # max(3, 10% of 40)
    assert st.iterations == list(range(5, 41))
    assert st.reference_step_ms == 336.8
    assert set(st.excluded) == {1, 2, 3, 4}


def test_outliers_and_captures_excluded() -> None:
    recs = [StepRecord(job="j", iteration=i, step_time_ms=100.0) for i in range(1, 31)]
    recs[19].step_time_ms = 250.0  # iteration 20: > 2× median
    recs[24].disturbed_by_capture = True  # iteration 25
    recs[26].step_time_ms = None  # iteration 27
    recs[27].step_time_ms = 190.0  # iteration 28: slow but < 2×, kept
    st = steady_state(list(reversed(recs)))  # order does not matter
    assert 20 in st.excluded and "median" in st.excluded[20]
    assert "capture" in st.excluded[25] and "no step time" in st.excluded[27]
    assert st.steady[28] is True
    assert st.iterations == [i for i in range(4, 31) if i not in (20, 25, 27)]


def test_warmup_count() -> None:
    assert warmup_count(10) == 3 and warmup_count(100) == 10 and warmup_count(0) == 3
    assert steady_state([]).iterations == []

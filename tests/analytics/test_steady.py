"""Steady-state selection: warm-up, slow outliers, capture-disturbed iterations, and irregular series
read over windows of steps (perfd.analytics.steps.windows)."""

from __future__ import annotations

import statistics

import pytest

from perfd.analytics.steps.provenance import Code, cite
from perfd.analytics.steps.steady import OUTLIER_FACTOR, steady_state, steady_state_of, warmup_count
from perfd.core.model import StepRecord
from perfd.report.provenance_text import text
from tests.analytics.analytics_helpers import fixture_records


def test_fixture_warmup_excluded() -> None:
    st = steady_state(fixture_records())
    assert st.warmup_records == 4  # max(3, 10% of 40)
    assert st.iterations == list(range(5, 41))
    # a regular series: the windows' level is its median, to a percent (336.8 ms)
    steps = [r.step_time_ms for r in fixture_records()][4:]
    assert st.reference_step_ms == pytest.approx(statistics.median(s for s in steps if s), rel=0.01)
    assert set(st.excluded) == {1, 2, 3, 4}


def test_outliers_and_captures_excluded() -> None:
    recs = [StepRecord(job="j", iteration=i, step_time_ms=100.0) for i in range(1, 31)]
    recs[19].step_time_ms = 1000.0  # iteration 20: a checkpoint save, its window slow too
    recs[24].disturbed_by_capture = True  # iteration 25
    recs[26].step_time_ms = None  # iteration 27
    recs[27].step_time_ms = 250.0  # iteration 28: > 2×, but its window is not: part of the steady cost
    st = steady_state(list(reversed(recs)))  # order does not matter
    # why, as codes with the numbers (the step, the factor, the steady step); worded where shown
    assert st.reference_step_ms == 100.0
    assert st.excluded[20] == cite(Code.OUTLIER_STEP, 1000.0, OUTLIER_FACTOR, 100.0)
    assert st.excluded[25] == cite(Code.CAPTURED) and st.excluded[27] == cite(Code.NO_STEP)
    assert text(st.excluded[20]) == "step 1000 ms > 2× the steady 100 ms a step"  # one golden sentence
    assert st.steady[28] is True
    assert st.iterations == [i for i in range(4, 31) if i not in (20, 25, 27)]


def test_one_mode_of_a_regular_pattern_is_never_an_outlier() -> None:
    """A four-worker DataLoader: three quick batches, then one that waits 4× as long. A median of
    single steps (100 ms) made every slow one an "outlier" (> 2×) and the steady state the fast
    steps alone; over windows the level is the pattern's mean (175 ms) and every step is steady."""
    steps = [400.0 if i % 4 == 3 else 100.0 for i in range(80)]
    st = steady_state_of(list(range(1, 81)), steps, [0] * 80)
    assert st.reference_step_ms == pytest.approx(175.0, rel=0.02)
    assert st.iterations == list(range(9, 81))  # the warm-up only is left out


def test_steps_of_different_sizes_are_read_per_unit_of_work() -> None:
    """Variable-length batches (sequence 512, 1024 or 2048 drawn per step): a step four times the work
    takes four times as long and is no outlier; a step twice as slow for its size is."""
    sizes = [512.0, 1024.0, 2048.0] * 20
    steps = [s / 10 for s in sizes]  # 51.2, 102.4, 204.8 ms: one rate
    steps[40] *= 6  # a 6× slower step (for its size) in a slow window: an outlier
    steps[41] *= 6
    st = steady_state_of(list(range(1, 61)), steps, [0] * 60, sizes)
    assert st.reference_step_ms == pytest.approx(statistics.fmean(steps[:40]), rel=0.05)
    assert [i for i, k in st.kinds.items() if k == "outlier"] == [41, 42]


def test_warmup_count() -> None:
    assert warmup_count(10) == 3 and warmup_count(100) == 10 and warmup_count(0) == 3
    assert steady_state([]).iterations == []

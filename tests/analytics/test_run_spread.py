"""The run-to-run spread a remedy's range carries: the job's own steady steps' (issue "the plan an
engineer would make": a host-bound H200 job's steps moved by ~15 ms of 200, an H100 job's by 0.7%)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfd.analytics.advice.remedies import (
    RUN_SPREAD_OF_STEP,
    RUN_SPREAD_STEPS,
    Gain,
    run_spread_ms,
    with_spread,
)
from perfd.analytics.advice.remedy_said import Said, Say, say
from perfd.analytics.breakdown.budget import StepBudget
from perfd.analytics.steps.windows import ROBUST_SD_MIN_N, robust_sd
from perfd.report.remedy_text import text

# the long-sequence job's base run on the H200 (docs/evidence/plan_h200/ab_long_seq.json), steady steps
H200_BASE = [191, 189, 210, 184, 202, 207, 199, 192, 222, 218, 234, 224, 178, 178, 191, 207, 224]


def test_a_noisy_job_carries_its_own_spread_a_quiet_one_the_floor() -> None:
    sd = robust_sd(H200_BASE)
    assert sd is not None and 15 < sd < 25
    s = run_spread_ms(202.0, sd)
    assert s == pytest.approx(math.sqrt(2) * 1.2533 * sd / math.sqrt(RUN_SPREAD_STEPS))
    assert s > 3 * RUN_SPREAD_OF_STEP * 202.0
    quiet = robust_sd([693.2, 693.5, 693.3, 693.4, 693.2, 693.6])
    assert run_spread_ms(693.0, quiet) == pytest.approx(RUN_SPREAD_OF_STEP * 693.0)
    assert run_spread_ms(693.0, None) == pytest.approx(RUN_SPREAD_OF_STEP * 693.0)


def test_one_odd_step_does_not_widen_the_spread() -> None:
    """A checkpoint's or a capture's step (the captured run's 675 ms among ~210) is not the job's spread."""
    steady = [210.0, 212.0, 208.0, 211.0, 209.0, 213.0, 207.0, 210.0]
    assert robust_sd([*steady, 675.0]) == pytest.approx(robust_sd(steady), rel=0.5)
    assert robust_sd(steady[: ROBUST_SD_MIN_N - 1]) is None


def test_the_range_says_whose_spread_it_carries() -> None:
    b = StepBudget(202.0, (), (), step_sd_ms=robust_sd(H200_BASE))
    model = say(Say.DATA_BASIS, 4.0, 0.5, 0.9)
    g = with_spread(Gain(4.0, 7.0, model), b)
    assert g is not None and g.low_ms < 0 < g.high_ms and g.basis.code is Say.WITH_SPREAD
    spread = g.basis.args[1]
    assert isinstance(spread, Said) and spread.args[2] == say(Say.OWN_SPREAD)  # its own steady steps'
    assert "its own steady steps" in text(g.basis)  # as the report says it
    floor = with_spread(Gain(4.0, 7.0, model), StepBudget(202.0, (), ()))
    assert floor is not None and floor.low_ms == pytest.approx(4.0 - 1.01)
    spread = floor.basis.args[1]
    assert isinstance(spread, Said) and spread.args[2] is None and "own" not in text(floor.basis)


@given(st.lists(st.floats(min_value=1.0, max_value=1e4), min_size=ROBUST_SD_MIN_N, max_size=60),
       st.floats(min_value=1.0, max_value=1e4))
def test_the_spread_is_never_under_the_floor(xs: list[float], step: float) -> None:
    sd = robust_sd(xs)
    assert sd is not None and sd >= 0
    assert run_spread_ms(step, sd) >= RUN_SPREAD_OF_STEP * step - 1e-9

"""Pipeline bubble: analytic (1F1B, interleaved), measured stage idle, imbalance, rebalancing."""

from __future__ import annotations

import pytest

from perfd.analytics.steps.pipeline import (
    analytic_bubble,
    microbatches_for_bubble,
    rebalance_estimate,
    stage_idle,
)
from perfd.analytics.steps.provenance import Code
from perfd.core.model import StepRecord, TimerValue
from tests.analytics.analytics_helpers import fixture_record, fixture_row


def test_analytic_bubble() -> None:
    assert analytic_bubble(2, 16).value == pytest.approx(1 / 17)
    assert analytic_bubble(4, 8, vpp=2).value == pytest.approx(3 / 19)  # (p-1)/(v·m+p-1)
    assert analytic_bubble(4, 8, vpp=1).value == pytest.approx(3 / 11)
    assert analytic_bubble(1, 16).value == 0.0 and analytic_bubble(1, 16).cite.code is Code.NO_BUBBLE
    assert analytic_bubble(2, None).value is None
    assert analytic_bubble(2, None).cite.code is Code.MICROBATCHES_UNKNOWN
    assert analytic_bubble(None, 16).value is None and analytic_bubble(None, 16).cite.code is Code.PP_UNKNOWN
    assert analytic_bubble(4, 8, vpp=2).cite.args == (3, 2, 8)  # p-1, v, m


def test_stage_idle_minmax_iteration_38() -> None:
    rec = fixture_record(fixture_row(38))
    bubble = analytic_bubble(2, 16)
    idle = stage_idle(rec, 2, bubble)
    assert idle.method == "minmax-pairing"
    assert idle.idle_max.value == pytest.approx(1 - (124.99 + 123.21) / 322.71)  # lighter stage, ~23%
    assert idle.idle_min.value == pytest.approx(1 - (159.84 + 134.99) / 322.71)  # heavier stage, ~8.6%
    assert idle.imbalance.value == pytest.approx((idle.idle_max.value or 0) - 1 / 17)
    assert idle.idle_max.cite.code is Code.IDLE_LIGHTER and idle.idle_min.cite.code is Code.IDLE_HEAVIER
    assert idle.idle_max.cite.caveat is Code.MINMAX_PAIRING  # which rank holds which value: inferred
    assert idle.imbalance.cite.code is Code.IMBALANCE
    assert idle.compute_ratio == pytest.approx(294.83 / 248.2)


def test_stage_idle_per_rank_is_exact() -> None:
    rec = StepRecord(job="j", iteration=5, step_time_ms=330.0, timers={
        "forward-backward": TimerValue(per_rank={0: 320.0, 1: 322.0}),
        "forward-compute": TimerValue(per_rank={0: 120.0, 1: 160.0}),
        "backward-compute": TimerValue(per_rank={0: 140.0, 1: 130.0}),
    })
    idle = stage_idle(rec, 2, analytic_bubble(2, 16))
    assert idle.method == "per-rank"
    assert idle.per_rank_idle[0] == pytest.approx(1 - 260 / 320)
    assert idle.per_rank_idle[1] == pytest.approx(1 - 290 / 322)
    assert idle.idle_max.value == pytest.approx(1 - 260 / 320)
    assert idle.idle_min.value == pytest.approx(1 - 290 / 322)
    assert idle.idle_max.cite.caveat is None  # not an inference
    assert idle.idle_max.cite.code is Code.IDLE_RANK_MAX and idle.idle_max.cite.args[0] == 0
    assert idle.idle_min.cite.code is Code.IDLE_RANK_MIN and idle.idle_min.cite.args[0] == 1


def test_stage_idle_absent_cases() -> None:
    rec = fixture_record(fixture_row(38))
    assert stage_idle(rec, 1, analytic_bubble(1, 16)).idle_max.cite.code is Code.NO_STAGES
    assert stage_idle(rec, None, analytic_bubble(None, 16)).idle_max.cite.code is Code.PP_UNKNOWN
    del rec.timers["forward-compute"]
    idle = stage_idle(rec, 2, analytic_bubble(2, 16))
    assert idle.idle_max.value is None and idle.idle_max.cite.code is Code.NO_STAGE_TIMERS


def test_microbatches_for_bubble() -> None:
    assert microbatches_for_bubble(2, 0.05) == 19
    assert microbatches_for_bubble(4, 0.05, vpp=2) == 29  # 3/(2·29+3) = 0.049


def test_rebalance_estimate() -> None:
    fixture = rebalance_estimate(8, 2, 248.2, 294.83)
    assert fixture is not None
    assert fixture.per_layer_ms == pytest.approx(62.05)
    assert fixture.best_move == 0  # a 62 ms layer against a 47 ms gap: moving one flips it
    est = rebalance_estimate(8, 2, 200.0, 320.0)
    assert est is not None and est.best_move == 1 and est.new_heavier_ms == pytest.approx(270.0)
    assert rebalance_estimate(7, 2, 200.0, 320.0) is None


def test_max_only_timers_leave_stage_idle_absent_with_reason() -> None:
    rec = StepRecord(job="j", iteration=5, step_time_ms=330.0, timers={
        "forward-backward": TimerValue(max_ms=322.0), "forward-compute": TimerValue(max_ms=160.0),
        "backward-compute": TimerValue(max_ms=135.0)})
    idle = stage_idle(rec, 2, analytic_bubble(2, 16))
    assert idle.idle_max.value is None and idle.idle_min.value is None
    assert idle.idle_max.cite.code is Code.MAX_ONLY and idle.idle_max.cite.absent

"""Straggler signals: straggler line, compute spread (pp == 1 only), per-rank timers, persistence."""

from __future__ import annotations

import pytest

from perfd.analytics.steps.provenance import Code, cite
from perfd.analytics.steps.stragglers import (
    STRAGGLER_RATIO,
    RankOrder,
    StragglerResult,
    detect,
    persistent,
    rank_order,
)
from perfd.core.model import ParallelLayout, RankValue, StepRecord, StragglerLine, TimerValue
from perfd.report.provenance_text import text
from tests.analytics.analytics_helpers import fixture_record, fixture_row

DP2 = ParallelLayout(world_size=2, tp=1, pp=1, dp=2, cp=1)
PP2_DP2 = ParallelLayout(world_size=4, tp=1, pp=2, dp=2, cp=1)


def _line(lo: float, lo_rank: int, hi: float, hi_rank: int) -> StragglerLine:
    rtt = (RankValue(lo, lo_rank, "ms"), RankValue(hi, hi_rank, "ms"))
    return StragglerLine(time=None, quantities={"rtt": rtt})


def test_fixture_line_spread_is_between_stages_not_a_straggler() -> None:
    rec = fixture_record(fixture_row(38))  # MnRtt 108.93/0, MxRtt 140.73/1, PP=2
    res = detect(rec, RankOrder(ParallelLayout(world_size=2, tp=1, pp=2, dp=1, cp=1)))
    assert res.rtt_ratio == pytest.approx(140.73 / 108.93)
    assert res.rtt_max_rank == 1 and res.line_between_stages
    assert res.line_candidate_rank is None and res.flagged_ranks == []
    assert res.compute_spread == pytest.approx(159.84 / 124.99)
    assert res.compute_spread_flagged is None  # pp > 1: stage imbalance, not a straggler
    assert not res.flagged
    # why no rank is named: codes with the ranks and stages, worded where shown (one golden sentence)
    assert res.notes == [cite(Code.RTT_BETWEEN_STAGES, STRAGGLER_RATIO, 0, 0, 1, 1),
                         cite(Code.SPREAD_WITH_PP)]
    assert text(res.notes[0]) == ("rtt spread > 1.1× between rank 0 (stage 0) and rank 1 (stage 1): stage "
                                  "imbalance, not a straggler")


def test_dp2_straggler_line_names_the_rank() -> None:
    rec = StepRecord(job="j", iteration=10, step_time_ms=200.0, straggler=_line(100.0, 0, 130.0, 1),
                     timers={"forward-compute": TimerValue(50.0, 66.0),
                             "backward-compute": TimerValue(90.0, 95.0)})
    res = detect(rec, RankOrder(DP2))
    assert res.line_candidate_rank == 1 and res.flagged_ranks == [1]
    assert res.compute_spread == pytest.approx(66.0 / 50.0)
    assert res.compute_spread_flagged is True  # pp == 1: the spread is a straggler signal
    calm = StepRecord(job="j", iteration=11, straggler=_line(100.0, 0, 105.0, 1))
    assert detect(calm, RankOrder(DP2)).flagged_ranks == []


def test_dp2_per_rank_timers_flag_the_slow_rank() -> None:
    rec = StepRecord(job="j", iteration=10, step_time_ms=300.0, timers={
        "forward-compute": TimerValue(per_rank={0: 60.0, 1: 84.0}),
        "backward-compute": TimerValue(per_rank={0: 40.0, 1: 56.0}),
    })
    res = detect(rec, RankOrder(DP2))
    # compute 100 vs 140, median 120: rank 1 at 1.167× is flagged, rank 0 at 0.83× is not
    assert res.per_rank_ratio[1] == pytest.approx(140 / 120)
    assert res.per_rank_flagged == [1] and res.flagged_ranks == [1]


def test_per_rank_compares_within_pipeline_stage() -> None:
    # ranks 0,1 = stage 0 (light), 2,3 = stage 1 (1.3× heavier); rank 2 slow within its stage
    rec = StepRecord(job="j", iteration=10, step_time_ms=300.0, timers={
        "forward-compute": TimerValue(per_rank={0: 50.0, 1: 50.0, 2: 90.0, 3: 65.0}),
        "backward-compute": TimerValue(per_rank={0: 50.0, 1: 50.0, 2: 90.0, 3: 65.0}),
    })
    res = detect(rec, RankOrder(PP2_DP2))
    assert res.per_rank_flagged == [2]
    assert res.per_rank_ratio[0] == pytest.approx(1.0)


def test_rank_order_stage_mapping() -> None:
    default = RankOrder(PP2_DP2)
    assert [default.stage(r) for r in range(4)] == [0, 0, 1, 1]
    tp_pp = rank_order(ParallelLayout(world_size=8, tp=2, pp=2, dp=2, cp=1), {"use_tp_pp_dp_mapping": "True"})
    assert [tp_pp.stage(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert RankOrder(ParallelLayout(pp=2)).stage(1) is None  # layout unknown: no guess


def test_persistence_needs_half_the_window() -> None:
    flagged = StragglerResult(line_candidate_rank=3)
    clean = StragglerResult()
    six_of_ten = persistent([flagged] * 6 + [clean] * 4)
    assert six_of_ten.ranks == [3] and six_of_ten.fraction[3] == pytest.approx(0.6)
    four_of_ten = persistent([flagged] * 4 + [clean] * 6)
    assert four_of_ten.ranks == [] and four_of_ten.fraction[3] == pytest.approx(0.4)
    assert persistent([]).ranks == []
    anon = persistent([StragglerResult(compute_spread_flagged=True)] * 3
                      + [StragglerResult(compute_spread_flagged=False)])
    assert anon.anonymous_fraction == pytest.approx(0.75)

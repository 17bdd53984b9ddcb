"""Incremental analysis: with an AnalysisMemo, re-analysing a grown run recomputes only
the iterations whose records are new or changed, and the result is exactly the analysis from
scratch. Real Megatron-LM logs (per-rank timers, and the co-tenant straggler run with an incident)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.jobs import job_level_steps, mark_disturbed
from perfd.analytics.run import run_analysis
from perfd.analytics.run.run_analysis import AnalysisMemo, analyze_run
from perfd.collectors.megatron import parse_lines
from perfd.core.model import TimerValue

DATA = Path(__file__).resolve().parents[1] / "data"
LOGS = [DATA / "megatron" / "dp2_all_timers.log", DATA / "incidents" / "costraggler_dp2" / "dp2_cotenant.log"]


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_a_grown_run_recomputes_only_its_new_iterations_and_matches_a_fresh_analysis(log: Path,
                                                                                   monkeypatch) -> None:
    parsed = parse_lines(log.read_text().splitlines(keepends=True), job="j")
    recs = sorted(parsed.records, key=lambda r: r.iteration)
    assert len(recs) >= 20
    calls: list[int] = []
    real = run_analysis._iteration

    def counting(rec, ctx):
        calls.append(rec.iteration)
        return real(rec, ctx)

    monkeypatch.setattr(run_analysis, "_iteration", counting)
    memo = AnalysisMemo()
    cut = len(recs) * 2 // 3
    analyze_run(parsed.job_info, recs[:cut], gpu_name="NVIDIA H200", memo=memo)
    assert len(calls) == cut and memo.misses == cut and memo.hits == 0
    calls.clear()
    grown = analyze_run(parsed.job_info, recs, gpu_name="NVIDIA H200", memo=memo)
    assert sorted(calls) == [r.iteration for r in recs[cut:]]  # only the new ones
    assert memo.hits == cut
    fresh = analyze_run(parsed.job_info, recs, gpu_name="NVIDIA H200")
    assert grown.to_json() == fresh.to_json()
    assert [f.to_json() if hasattr(f, "to_json") else f for f in grown.findings] == \
        [f.to_json() if hasattr(f, "to_json") else f for f in fresh.findings]
    # A changed record (a re-delivered iteration) is recomputed; the rest are not.
    calls.clear()
    changed = dataclasses.replace(recs[5], step_time_ms=(recs[5].step_time_ms or 0.0) * 3)
    again = analyze_run(parsed.job_info, [*recs[:5], changed, *recs[6:]], gpu_name="NVIDIA H200", memo=memo)
    assert calls == [changed.iteration]
    assert again.to_json() == analyze_run(parsed.job_info, [*recs[:5], changed, *recs[6:]],
                                          gpu_name="NVIDIA H200").to_json()
    # Another GPU (another peak): nothing kept applies.
    calls.clear()
    analyze_run(parsed.job_info, recs, gpu_name="NVIDIA H100 80GB HBM3", memo=memo)
    assert len(calls) == len(recs)
    # Evicted iterations leave the memo.
    analyze_run(parsed.job_info, recs[10:], gpu_name="NVIDIA H100 80GB HBM3", memo=memo)
    assert sorted(memo.entries) == [r.iteration for r in recs[10:]]


def test_per_rank_folds_and_capture_marks_keep_their_identity_while_unchanged() -> None:
    from perfd.core.model import StepRecord

    def rec(it: int, rank: int, ms: float) -> StepRecord:
        return StepRecord(job="j", iteration=it, rank=rank, step_time_ms=ms, end_time=100.0 + it,
                          timers={"forward-backward": TimerValue(max_ms=ms * 0.8)})

    recs = [rec(i, r, 100.0 + r) for i in range(5) for r in range(4)]
    cache: dict[int, Any] = {}
    first = job_level_steps(recs, cache)
    second = job_level_steps(list(recs), cache)
    assert all(a is b for a, b in zip(first, second, strict=True))
    assert first[2].step_time_ms == 103.0
    assert first[2].timers["forward-backward"].per_rank == pytest.approx({0: 80.0, 1: 80.8, 2: 81.6, 3: 82.4})
    replaced = [rec(2, 3, 500.0) if (r.iteration, r.rank) == (2, 3) else r for r in recs]
    third = job_level_steps(replaced, cache)
    assert third[2] is not first[2] and third[2].step_time_ms == 500.0
    assert all(third[i] is first[i] for i in (0, 1, 3, 4))
    marks: dict[int, Any] = {}
    windows = [(102.5, 103.0)]  # overlaps iteration 2 (ends at 102.0 + its 0.5 s step) and 3
    m1 = mark_disturbed(third, windows, marks)
    m2 = mark_disturbed(third, windows, marks)
    hit = [i for i, r in enumerate(m1) if r.disturbed_by_capture]
    assert hit and all(m1[i] is m2[i] for i in range(5))


@pytest.mark.slow
@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_a_sliding_window_of_held_iterations_matches_a_fresh_analysis_at_every_step(log: Path) -> None:
    """What the aggregator does: iterations arrive at the end and leave at the start (retention);
    each analysis takes over the last one's rows. Incidents come and go as their iterations enter
    and leave the window, so rows marked by an earlier analysis must not keep its marks."""
    parsed = parse_lines(log.read_text().splitlines(keepends=True), job="j")
    recs = sorted(parsed.records, key=lambda r: r.iteration)
    memo = AnalysisMemo()
    width = max(8, len(recs) // 3)
    seen_incidents = 0
    for end in range(4, len(recs) + 1, 3):
        window = recs[max(0, end - width):end]
        live = analyze_run(parsed.job_info, window, gpu_name="NVIDIA H200", memo=memo)
        fresh = analyze_run(parsed.job_info, window, gpu_name="NVIDIA H200")
        assert live.to_json() == fresh.to_json(), end
        seen_incidents += len(fresh.incidents)
    assert memo.run is not None and len(memo.run.records) == min(width, len(recs))
    if "cotenant" in log.name:
        assert seen_incidents > 0  # the case the marks are about was exercised

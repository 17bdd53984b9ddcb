"""Step-record retention counts iterations, not records (issue: scale): with 1,000 ranks sending
per-rank records, the window still holds the configured number of iterations."""

from __future__ import annotations

from perfd.aggregator.jobs import JobStore
from perfd.core.model import StepRecord


def _iteration(it: int, ranks: int) -> list[StepRecord]:
    recs = [StepRecord(job="big", iteration=it, rank=r, end_time=1e9 + it, step_time_ms=500.0)
            for r in range(ranks)]
    recs.append(StepRecord(job="big", iteration=it, rank="last", end_time=1e9 + it, step_time_ms=500.0))
    return recs


def test_a_thousand_ranks_keep_the_configured_iterations() -> None:
    store = JobStore(max_iterations_per_job=5)
    for it in range(1, 21):
        store.ingest_steps("a", _iteration(it, 1000))
    js = store.jobs["big"]
    assert sorted({k[0] for k in js.records}) == [16, 17, 18, 19, 20]
    assert len(js.records) == 5 * 1001
    assert store.stats.evicted_iterations == 15 and store.stats.dropped_steps == 15 * 1001


def test_a_resent_iteration_replaces_and_an_older_one_is_refused_and_counted() -> None:
    store = JobStore(max_iterations_per_job=3)
    for it in range(1, 6):
        store.ingest_steps("a", _iteration(it, 2))
    store.ingest_steps("a", _iteration(5, 2))  # a batch delivered again: replaced, not added
    assert len(store.jobs["big"].records) == 3 * 3
    before = store.stats.dropped_steps
    store.ingest_steps("a", _iteration(1, 2))  # arrives after its iteration left the window
    assert sorted({k[0] for k in store.jobs["big"].records}) == [3, 4, 5]
    assert store.stats.dropped_steps == before + 3


def _timed(it: int, ranks: int) -> StepRecord:
    """One job-level record with per-rank timers, as Megatron-LM's --timing-log-option all gives."""
    from perfd.core.model import TimerValue

    timers = {name: TimerValue(per_rank={r: 10.0 + r for r in range(ranks)}) for name in ("fwd", "bwd")}
    return StepRecord(job="big", iteration=it, rank="last", end_time=1e9 + it, step_time_ms=500.0,
                      timers=timers)


def test_retention_is_bounded_by_bytes_too_and_the_newest_iteration_stays() -> None:
    from perfd.aggregator.jobs import record_bytes

    one = record_bytes(_timed(1, 1000))
    assert 150_000 < one < 300_000  # 2,000 per-rank values (the estimate, ~96 bytes each)
    store = JobStore(max_iterations_per_job=5000, max_bytes_per_job=10 * one)
    for it in range(1, 31):
        store.ingest_steps("a", [_timed(it, 1000)])
    js = store.jobs["big"]
    assert sorted({k[0] for k in js.records}) == list(range(21, 31))  # 10 iterations fit the bytes
    assert js.held_bytes == 10 * one
    assert store.stats.evicted_iterations == 20 and store.stats.evicted_iterations_bytes == 20
    store.ingest_steps("a", [_timed(30, 1000)])  # re-sent: replaces, the bytes do not grow
    assert js.held_bytes == 10 * one
    tiny = JobStore(max_bytes_per_job=1)  # below one record: the newest iteration is still kept
    tiny.ingest_steps("a", [_timed(1, 10), _timed(2, 10)])
    assert sorted({k[0] for k in tiny.jobs["big"].records}) == [2]


def test_the_aggregator_takes_retention_from_its_flags() -> None:
    from perfd.app.cli import main

    assert main(["aggregator", "--retain-iterations", "0"]) == 2
    assert main(["aggregator", "--retain-mib", "0"]) == 2


def test_goodput_after_eviction_covers_the_held_iterations_only() -> None:
    """A job whose first iterations left the window: the time from its start-up stamp to the first
    step held is not start-up (it trained then); goodput covers what is held, and says so."""
    from perfd.core.model import JobInfo

    store = JobStore(max_iterations_per_job=5, min_recompute_s=0.0)
    for it in range(1, 11):
        store.ingest_steps("a", [StepRecord(job="big", iteration=it, rank="last", end_time=1e9 + it,
                                            step_time_ms=1000.0)])
    store.jobs["big"].job_info = JobInfo(started_at=1e9 - 30)
    gp = store.analysis("big", force=True).summary.to_json()["goodput"]  # type: ignore[union-attr]
    assert gp["parts_s"]["startup"] == 0 and gp["wall_s"] == 5.0 and gp["notes"]

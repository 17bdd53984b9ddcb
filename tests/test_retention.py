"""Step-record retention counts iterations, not records (issue: scale): with 1,000 ranks sending
per-rank records, the window still holds the configured number of iterations."""

from __future__ import annotations

from perfd.aggregator.jobs import JobStore
from perfd.model import StepRecord


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

"""The step-time histogram on the aggregator's /metrics: every job-level step record once."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from perfd.aggregator.http import _StateCollector
from perfd.aggregator.state import AggregatorState
from perfd.collectors.megatron import parse_file

DP2 = Path(__file__).resolve().parents[1] / "tests" / "data" / "megatron" / "dp2_all_timers.log"


def test_step_histogram_counts_each_record_once_and_buckets_are_cumulative() -> None:
    parsed = parse_file(DP2, job="dp2")
    st = AggregatorState(min_recompute_s=0.0)
    st.ingest_job_info("a", "dp2", parsed.job_info)
    st.ingest_steps("a", parsed.records)
    st.ingest_steps("a", parsed.records[:10])  # a re-sent batch after a reconnect
    st.refresh()  # the aggregator's refresher: /metrics serves the last analysis
    reg = CollectorRegistry()
    reg.register(_StateCollector(st))
    text = generate_latest(reg).decode()
    n = len(parsed.records)
    assert f'perfd_job_step_duration_seconds_count{{job_name="dp2"}} {float(n)}' in text
    total = sum(r.step_time_ms or 0.0 for r in parsed.records) / 1e3
    sum_key = 'perfd_job_step_duration_seconds_sum{job_name="dp2"}'
    line = next(x for x in text.splitlines() if x.startswith(sum_key))
    assert abs(float(line.split()[-1]) - total) < 1e-6
    under_1s = sum(1 for r in parsed.records if (r.step_time_ms or 0) <= 1000.0)
    assert f'perfd_job_step_duration_seconds_bucket{{job_name="dp2",le="1.0"}} {float(under_1s)}' in text


def _hist(st: AggregatorState, job: str) -> tuple[float, float]:
    """(count, sum) of the job's step histogram on /metrics."""
    st.refresh()
    reg = CollectorRegistry()
    reg.register(_StateCollector(st))
    text = generate_latest(reg).decode()
    lines = {x.rsplit(" ", 1)[0]: float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
             if x.startswith("perfd_job_step_duration_seconds_")}
    name = f'{{job_name="{job}"}}'
    metric = "perfd_job_step_duration_seconds"
    return lines[f"{metric}_count{name}"], lines[f"{metric}_sum{name}"]


def test_a_job_its_ranks_report_one_by_one_counts_each_iteration_once_at_its_slowest_rank() -> None:
    """The step hook's per-rank records (4 nodes x 8 ranks, recorded H100 clocks): an iteration is
    counted once the next begins, with its slowest rank's step — as the engine's folds are."""
    from tests.engine.records import job_records

    by_node = job_records("hook", 4, 6)
    st = AggregatorState(min_recompute_s=0.0)
    for it in range(6):
        for n in range(4):
            st.ingest_steps(f"node-{n}", by_node[n][it])
    slowest = [max(r.step_time_ms or 0.0 for n in range(4) for r in by_node[n][it]) for it in range(6)]
    count, total = _hist(st, "hook")
    assert count == 5.0  # the sixth is counted when a seventh begins
    assert abs(total - sum(slowest[:5]) / 1e3) < 1e-9


def test_a_fold_that_grows_is_counted_once_with_what_the_iteration_took() -> None:
    """The engine's root hands on an iteration's fold as each shard's partial comes in: the first
    copy holds one shard's ranks (a faster step than the iteration's). Counted once, at its last."""
    from dataclasses import replace

    from perfd.core.model import StepRecord
    from perfd.core.stepfold import ALL_RANKS

    st = AggregatorState(min_recompute_s=0.0)
    first = StepRecord(job="eng", iteration=1, rank=ALL_RANKS, end_time=1000.0, step_time_ms=900.0)
    st.ingest_steps("engine", [first])
    st.ingest_steps("engine", [replace(first, step_time_ms=1200.0, end_time=1000.3)])  # the slower shard
    st.ingest_steps("engine", [replace(first, iteration=2, step_time_ms=1000.0, end_time=1001.3)])
    assert _hist(st, "eng") == (1.0, 1.2)


def test_a_logged_job_with_the_step_hook_counts_each_iteration_once_from_its_log() -> None:
    """A Megatron-LM job whose ranks run the step hook too: its iterations are the log's (as its
    analysis reads them), each counted once, at the log's step time; the hook's records counted as
    well made every iteration two."""
    from perfd.core.model import HOOK_COMPUTE, Provenance, StepRecord, TimerValue

    log = parse_file(Path(__file__).resolve().parents[1] / "perfd" / "app" / "demo" / "data" /
                     "megatron_h200x2_tp1_pp2.log", job="mixed").records[:10]
    st = AggregatorState(min_recompute_s=0.0)
    for rec in log:
        assert rec.step_time_ms is not None and rec.end_time is not None
        hooks = [StepRecord(job="mixed", iteration=rec.iteration, rank=r, end_time=rec.end_time,
                            step_time_ms=rec.step_time_ms + 50.0, interval=1,
                            timers={HOOK_COMPUTE: TimerValue(1.0, 1.0, {r: 1.0})},
                            source=Provenance("hook", f"rank{r}:pid{7 + r}"), fields={"pid": str(7 + r)})
                 for r in range(2)]
        st.ingest_steps("a", [rec, *hooks])
    count, total = _hist(st, "mixed")
    assert count == 10.0 and abs(total - sum(r.step_time_ms or 0.0 for r in log) / 1e3) < 1e-9

"""The step-time histogram on the aggregator's /metrics: every job-level step record once."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from collectors.megatron import parse_file
from perfd.aggregator.http import _StateCollector
from perfd.aggregator.state import AggregatorState

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

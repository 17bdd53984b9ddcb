"""End to end for serving, in the test's process on loopback (tests/inproc.py): the agent tails an SGLang
log (0.5.x format) and scrapes an SGLang-style /metrics endpoint; the aggregator serves the serving
metrics on /metrics (catalog names, job_name label) and the serving report in the job summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from perfd.core import catalog
from perfd.report.training_report import Report
from tests.inproc import pipeline

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "perfd" / "collectors" / "sglang" / "tests" / "data" / "sglang_0_5_5_dp2.log"
pytestmark = pytest.mark.slow


def test_serving_metrics_and_report_reach_the_aggregator(tmp_path: Path) -> None:
    # An SGLang-style endpoint: inter-token latency and TTFT histograms with sglang: names.
    reg = CollectorRegistry()
    itl = Histogram("sglang:inter_token_latency_seconds", "ITL", ["model_name"], registry=reg,
                    buckets=(0.005, 0.01, 0.02, 0.04, 0.08, 0.16))
    ttft = Histogram("sglang:time_to_first_token_seconds", "TTFT", ["model_name"], registry=reg,
                     buckets=(0.05, 0.1, 0.2, 0.4, 0.8, 1.6))
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    port = server.server_address[1]
    log = tmp_path / "server.log"
    log.write_text(LOG.read_text())
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(json.dumps({"job": "llm", "collectors": {"sglang": {
        "log_path": str(log), "metrics_url": f"http://127.0.0.1:{port}/metrics", "interval_s": 0.5,
        "scrape_interval_s": 0.5, "report_interval_s": 1.0}}}))
    try:
        with pipeline(tmp_path, "--no-rules") as p:
            agent = p.agent("--config", cfg, "--nvml", "off", "--host", "off", "--metrics-port", "-1")
            p.wait(lambda: (p.json("/api/jobs/llm/summary").get("serving") or {}).get("metrics"), 30,
                   "the first serving numbers")
            # Traffic while the agent scrapes: percentiles come from the histograms' deltas between
            # scrapes, never from the server's lifetime. In rounds, each scraped before the next.
            for i in range(300):
                itl.labels("llama").observe(0.004 + 0.0005 * (i % 40))  # 4 .. 23.5 ms
                if i % 10 == 0:
                    ttft.labels("llama").observe(0.06 + 0.01 * (i % 7))
                if i % 50 == 49:
                    p.collected(agent, "sglang")

            def served():
                s = p.json("/api/jobs/llm/summary")
                sv = s.get("serving") or {}
                m = sv.get("metrics") or {}
                return s if sv.get("report") and "perfd_serving_itl_p99_seconds" in m else None

            summary = p.wait(served, 30, "the serving report at the aggregator")
            report = Report.from_json(summary["serving"]["report"])
            assert report.summary.status and report.metrics
            names = {m.name for m in report.metrics}
            assert names <= set(catalog.names()) and "perfd_serving_itl_p99_seconds" in names
            fams = {f.name: f for f in text_string_to_metric_families(p.get("/metrics").decode())}
            serving = {n: f for n, f in fams.items() if n.startswith("perfd_serving_")}
            assert serving, "no serving metrics on the aggregator's /metrics"
            for name, fam in serving.items():
                catalog.get(name)  # every exported name is in the catalog
                assert all(s.labels.get("job_name") == "llm" for s in fam.samples)
                assert summary["serving"]["metrics"][name] == pytest.approx(fam.samples[0].value)
            assert "perfd_serving_gen_throughput_tokens_per_second" in serving
            # Observations were 4..23.5 ms: the interpolated p99 lies in the (20 ms, 40 ms] bucket.
            assert 0.02 < summary["serving"]["metrics"]["perfd_serving_itl_p99_seconds"] <= 0.04
    finally:
        server.shutdown()

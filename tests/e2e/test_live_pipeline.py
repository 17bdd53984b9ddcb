"""End to end in one process (tests/inproc.py): the real aggregator and a real agent on loopback gRPC,
the agent tailing a Megatron-LM log that grows while the test runs. What the aggregator serves must
equal what `perfd analyze megatron` computes for the same log."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from perfd.app.commands.analyze import analyze_megatron_file
from perfd.core import catalog
from perfd.report.row_json import run_json
from tests.inproc import pipeline

ROOT = Path(__file__).resolve().parents[2]
# The real 2×H200 run's log (Megatron-Core 0.20.0, TP=1 PP=2), as the demo ships it: in every checkout.
FIXTURE = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
DATA = ROOT / "tests" / "data" / "megatron"
pytestmark = pytest.mark.slow

@pytest.mark.parametrize(("source", "prewritten"), [
    (FIXTURE, 0.5),
    # The agent starts on an empty file: the start-up block (layout, model) arrives in batches
    # of its own, before any iteration.
    (FIXTURE, 0.0),
    (DATA / "dp2_all_timers.log", 0.5),
], ids=["pp2-half-written", "pp2-empty-at-start", "dp2-half-written"])
def test_agent_to_aggregator_matches_offline_analysis(tmp_path: Path, source: Path,
                                                      prewritten: float) -> None:
    lines = source.read_text().splitlines(keepends=True)
    with pipeline(tmp_path, "--gpu", "NVIDIA H200") as p:
        train_log = tmp_path / "train.log"
        half = int(len(lines) * prewritten)
        train_log.write_text("".join(lines[:half]))
        agent = p.agent("--job", "e2e", "--megatron-log", train_log, "--nvml", "off", "--host", "off",
                        "--metrics-port", "0")
        # The log grows while the pipeline runs, in chunks that cut lines in the middle: each chunk read
        # by the agent's tail before the next is written.
        rest = "".join(lines[half:])
        step = max(1, len(rest) // 7)
        for i in range(0, len(rest), step):
            with train_log.open("a") as f:
                f.write(rest[i:i + step])
            p.collected(agent, "megatron")

        offline_parsed, offline = analyze_megatron_file(str(train_log), job="e2e", gpu="NVIDIA H200")
        n = len(offline_parsed.records)
        last_it = offline_parsed.records[-1].iteration

        def caught_up():
            s = p.json("/api/jobs/e2e/summary")
            ov = s["overview"]
            # The summary is the refresher's last analysis (at most one tick behind the data).
            analysed = (s.get("latest") or {}).get("iteration")
            return s if ov["iterations_seen"] == n and ov["last_iteration"] == last_it == analysed else None

        summary = p.wait(caught_up, 30, f"aggregator to see {n} iterations")
        want = run_json(offline)  # the JSON `perfd analyze` writes
        assert summary["summary"] == json.loads(json.dumps(want["summary"]))
        assert summary["latest"] == json.loads(json.dumps(want["iterations"][-1]))
        assert summary["job"]["layout"] == want["job"]["layout"]
        assert summary["overview"]["has_job_info"] and want["job"]["layout"]["pp"] is not None

        # /metrics: each job gauge equals the offline value of the last iteration (absent if None).
        families = list(text_string_to_metric_families(p.get("/metrics").decode()))
        fams = {f.name: f for f in families}
        # By sample name: a counter's family is named without _total, like a gauge of that name
        # (perfd_job_incident_lost_seconds_total, served from 0, beside perfd_job_incident_lost_seconds).
        samples = [s for f in families for s in f.samples]
        latest = want["iterations"][-1]
        checked = 0
        for m in catalog.job_metrics():
            name, key, scale = m.name, m.attr or "", m.scale
            v = latest.get(key)
            got = [s.value for s in samples if s.name == name and s.labels.get("job_name") == "e2e"]
            if v is None:
                assert got == [], f"{name} must be absent when {key} is None"
            else:
                assert len(got) == 1 and math.isclose(got[0], v * scale, rel_tol=1e-12), (name, got, v)
                checked += 1
        assert checked >= 10
        per_rank = latest.get("straggler_rank_compute_ratio") or {}
        got_ranks = {s.labels["rank"]: s.value for s in fams["perfd_job_rank_compute_ratio"].samples
                     if s.labels.get("job_name") == "e2e"} if "perfd_job_rank_compute_ratio" in fams else {}
        assert got_ranks == {str(k): v for k, v in per_rank.items()}
        if "dp2" in source.name:
            assert set(got_ranks) == {"0", "1"}  # per-rank timers ('all' option) give per-rank series
        mfu = fams["perfd_job_mfu_ratio"].samples[0].value
        assert 0 < mfu < 1

        stats = p.json("/api/stats")
        assert stats["step_records_ingested"] >= n
        assert stats["transport"]["decode_errors"] == 0
        # The agent's own endpoint answers, with its self-metrics.
        agent_metrics = p.get_url(agent.metrics_url).decode()
        assert "perfd_agent_cpu_seconds_total" in agent_metrics
        # Both stop cleanly (the subprocess test's exit status 0 on SIGTERM): the agent's run ends
        # without an error, and the aggregator's stop below raises none.
        p.stop_agent()

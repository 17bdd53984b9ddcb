"""`perfd bench scale` runs end to end, small: a real aggregator process, agents in a separate process
(the bench's own). The command by the CLI's main() in the test's process (tests/cli_main.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from tests.cli_main import perfd

pytestmark = pytest.mark.slow
KEYS = ("agents", "agents_connected", "samples_per_s", "aggregator_cpu_cores", "aggregator_rss_bytes",
        "metrics_scrape_s", "latency_p99_s")


@pytest.mark.slow
def test_bench_scale_reports_every_key_with_every_agent_connected(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # TMPDIR as the command was given it: tempfile reads it once a process and keeps the answer in
    # tempfile.tempdir, so that is set too (monkeypatch puts both back).
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    proc = perfd(capsys, "bench", "scale", "--agents", "12", "--seconds", "5", "--procs", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not list(tmp_path.glob("perfd-scale-*"))  # a run that worked leaves no folder
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(k in res for k in KEYS)
    assert res["agents"] == 12 and res["agents_connected"] == 12
    assert res["samples_per_s"] > 0 and res["aggregator_rss_bytes"] > 0
    assert res["latency_p99_s"] is not None  # the probe's step time reached /metrics
    # The aggregator process times its collector, and its CPU splits by thread (the event loop first).
    assert res["aggregator_gc_cores"] is not None and res["aggregator_gc_cores"] >= 0
    threads = res["aggregator_thread_cpu_cores"]
    assert "main" in threads and all(v >= 0 for v in threads.values())
    assert sum(threads.values()) <= res["aggregator_cpu_cores"] + 0.05  # the same CPU, sliced


def test_bench_scale_refuses_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    proc = perfd(capsys, "bench", "scale", "--agents", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr


@pytest.mark.slow
def test_bench_scale_step_agents_only_those_send_step_records(capsys: pytest.CaptureFixture[str]) -> None:
    """`--step-agents 1`: a Megatron log's shape — one node sends the job's step records, the rest only
    their reduced samples (every 2 s) — and every agent still stays connected."""
    proc = perfd(capsys, "bench", "scale", "--agents", "12", "--seconds", "6", "--procs", "1",
                 "--step-agents", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["step_agents"] == 1 and res["agents_connected"] == 12
    # Agent 0 sends the job's record and the probe's, one each a second; all 12 would be 13 a second.
    assert 0 < res["step_records_per_s"] < 4
    assert res["samples_per_s"] > 0 and res["latency_p99_s"] is not None


def test_bench_scale_refuses_negative_step_agents(capsys: pytest.CaptureFixture[str]) -> None:
    proc = perfd(capsys, "bench", "scale", "--step-agents", "-1")
    assert proc.returncode == 2 and "--step-agents must be >= 0" in proc.stderr

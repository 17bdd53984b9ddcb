"""`perfd bench memory` and `perfd bench shutdown` run end to end, small, and report what
benchmarks/README.md quotes: the figures are printed by the benches, never asserted here; what is
asserted is what perfd did (the jobs held at the quota, the stops made)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from perfd import limits as L
from tests.procs import run_group

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _bench(*argv: str, timeout: float = 300) -> dict[str, object]:
    proc = run_group([sys.executable, "-m", "perfd.cli", "bench", *argv, "--json"], cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got: dict[str, object] = json.loads(proc.stdout)
    return got


def test_bench_memory_job_flood_reports_the_rss_and_the_quota_held(tmp_path: Path) -> None:
    res = _bench("memory", "--scenario", "job-flood", "--out", str(tmp_path))
    flood = res["job-flood"]
    assert isinstance(flood, dict)
    assert flood["jobs_held"] == L.MAX_JOBS_PER_AGENT and flood["job_names_sent"] == 50_000
    assert {"rss_mb_before", "rss_mb_growth", "metrics_bytes", "scrape_s"} <= set(flood)


def test_bench_shutdown_reports_each_stop_against_the_budget() -> None:
    res = _bench("shutdown", "--rounds", "2", "--tick-s", "0.2")
    assert res["tick_s"] == 0.2 and isinstance(res["stop_s"], list) and len(res["stop_s"]) == 2
    assert {"budget_s", "stop_s_median", "stop_s_max", "within_budget"} <= set(res)

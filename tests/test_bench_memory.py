"""`perfd bench memory` and `perfd bench shutdown` run end to end, small, and report what
benchmarks/README.md quotes: the figures are printed by the benches, never asserted here; what is
asserted is what perfd did (the jobs held at the quota, the stops made). `perfd bench` by the CLI's main()
in the test's process (tests/cli_main.py); the memory bench measures each scenario in a process of its
own, as it does from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfd.core import limits as L
from tests.cli_main import Ran, perfd

pytestmark = pytest.mark.slow


@pytest.fixture
def _bench(capsys: pytest.CaptureFixture[str]):
    def run(*argv: str) -> dict[str, object]:
        return _ran(perfd(capsys, "bench", *argv, "--json"))
    return run


def _ran(proc: Ran) -> dict[str, object]:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got: dict[str, object] = json.loads(proc.stdout)
    return got


def test_bench_memory_job_flood_reports_the_rss_and_the_quota_held(tmp_path: Path, _bench) -> None:
    res = _bench("memory", "--scenario", "job-flood", "--out", str(tmp_path))
    flood = res["job-flood"]
    assert isinstance(flood, dict)
    assert flood["jobs_held"] == L.MAX_JOBS_PER_AGENT and flood["job_names_sent"] == 50_000
    assert {"rss_mb_before", "rss_mb_growth", "metrics_bytes", "scrape_s"} <= set(flood)


def test_bench_shutdown_reports_each_stop_against_the_budget(_bench) -> None:
    res = _bench("shutdown", "--rounds", "2", "--tick-s", "0.2")
    assert res["tick_s"] == 0.2 and isinstance(res["stop_s"], list) and len(res["stop_s"]) == 2
    assert {"budget_s", "stop_s_median", "stop_s_max", "within_budget"} <= set(res)

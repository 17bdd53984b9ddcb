"""Offline, on the recorded real co-tenant run (tests/data/incidents/costraggler_dp2): the
incident names rank 1 and its iterations, and its cost is Σ(step − steady median) within 10%.
`perfd analyze` by the CLI's main() in the test's process (tests/cli_main.py)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.cli_main import perfd

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "incidents" / "costraggler_dp2" / "dp2_cotenant.log"


def test_analyze_megatron_names_the_slow_rank_its_iterations_and_the_cost(
        capsys: pytest.CaptureFixture[str]) -> None:
    res = perfd(capsys, "analyze", "megatron", LOG, "--gpu", "NVIDIA H200", "--json", "--iterations", "all")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    main = max(doc["incidents"], key=lambda i: i["cost_s"])
    assert main["ranks"][0] == 1 and main["first_iteration"] <= 70 and main["last_iteration"] >= 89
    its = {it["iteration"]: it["step_time_ms"] for it in doc["iterations"]}
    inside = [its[i] for i in range(main["first_iteration"], main["last_iteration"] + 1)]
    steady = statistics.median(v for k, v in its.items() if doc["iterations"][0]["iteration"] + 17 <= k
                               and not main["first_iteration"] <= k <= main["last_iteration"])
    want = sum(v - steady for v in inside) / 1e3
    assert abs(main["cost_s"] - want) <= 0.10 * want and main["cost_s"] > 10
    report = doc["report"]
    assert "rank 1" in report["summary"]["headline"] and "s lost" in report["summary"]["headline"]
    f = next(x for x in report["findings"] if x["id"] == f"incident-{main['id']}")
    assert f["evidence"]["ranks"][0] == 1
    # Offline there is no GPM and no capture: compute fills the step at a low MFU, which slow kernels
    # and a host too slow to launch them both give; the timers cannot tell, and say what could.
    assert doc["summary"]["bottleneck"] == "unknown"
    assert "slow kernels or slow launches" in doc["summary"]["bottleneck_reason"]
    assert "a capture or GPM can" in doc["summary"]["bottleneck_reason"]
    text = perfd(capsys, "analyze", "megatron", LOG, "--gpu", "NVIDIA H200").stdout
    assert "Largest loss: rank 1" in text.replace("\n", " ").replace("  ", " ")

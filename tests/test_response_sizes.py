"""Responses sized for their readers — each fact once, per-iteration provenance as codes
(the English once, in a legend), ranges instead of per-iteration lists. Measured on recorded real
data:

- ``/api/jobs/<job>/summary`` of a 250-step one-rank loop (the H100 data loop's iterations 420-669,
  its slowdown inside: tests/data/hook/plain_loop_h100/data_steps.json.gz, replayed with its GPU's
  NVML and its host observations: tests/loop_replay.py) was 66.8 KB (its ``excluded`` 40 KB: every
  warm-up and incident iteration with a sentence; each incident twice); now under 40 KB;
- ``perfd analyze megatron --iterations all`` of real 150- and 170-iteration logs was 2.01x and 1.84x
  the log (the same ``sources`` sentences on every row, every row indented); now under 0.5x;
- ``/api/jobs/<job>/iterations`` of that loop was 704 KB; rows carry codes, not sentences.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.http import job_iterations, job_summary
from tests.cli_main import perfd
from tests.loop_replay import TRAINING_NVML, Feed, loop, nvml_frames, replay, run3_host

# Its tests share what the module computes once: one xdist worker runs them (conftest.py)
pytestmark = pytest.mark.xdist_group("response_sizes")

ROOT = Path(__file__).resolve().parents[1]
JOB = "plain-data"
PID = 485


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    rows = loop()["steps"][419:669]  # iterations 420-669: 250 steps, the slowdown from 467 on
    frames = nvml_frames(TRAINING_NVML)
    t00 = frames[0]["time"]
    steady = [f for f in frames if 50.0 <= f["time"] - t00 <= 95.0]
    t0 = 1_795_500_000.0 - rows[0][1]
    feed = Feed()
    feed.steps(JOB, rows, t0, PID)
    start, end = t0 + rows[0][1], t0 + rows[-1][3]
    feed.nvml(steady, start, end)
    feed.gpu_process(start - 1.0, JOB, PID, "GPU-3f304f7f-0179-8aeb-2812-6011d9c6a4aa")
    t = start
    while t < end:
        feed.host(t, JOB, {**run3_host(), "pid": PID})
        t += 1.0
    *_, (_, st) = replay(feed, JOB)
    return {"summary": job_summary(st, JOB), "iterations": job_iterations(st, JOB)}


@pytest.mark.slow
def test_the_summary_of_a_250_step_loop_is_under_40_kb_each_fact_once(served: dict[str, Any]) -> None:
    s = served["summary"]
    assert s is not None and s["summary"]["n_iterations"] == 250
    assert len(json.dumps(s)) < 40_000
    (inc,) = s["incidents"]
    # Each incident once: the report's finding names it, the incident itself says the rest.
    (f,) = [f for f in s["report"]["findings"] if f["id"] == f"incident-{inc['id']}"]
    assert set(f["evidence"]) == {"incident", "kinds", "ranks", "cost_s", "cause"}
    # Its evidence items once: in its verdict, not again as observed / gpu_observed / snapshot items.
    assert "observed" not in inc["evidence"] and "gpu_observed" not in inc["evidence"]
    assert inc["verdict"]["cause"] == "data_wait"
    # Excluded iterations as ranges of (kind, reference), no sentence per iteration.
    ex = s["summary"]["excluded"]
    assert isinstance(ex, list) and len(ex) < 10 and "excluded_kinds" not in s["summary"]
    assert {r["kind"] for r in ex} >= {"warmup", "incident"}
    (r,) = [r for r in ex if r["kind"] == "incident"]
    assert (r["first"], r["last"], r["ref"]) == (inc["first_iteration"], inc["last_iteration"], inc["id"])
    assert "sources" not in s["latest"]


@pytest.mark.slow
def test_iteration_rows_carry_codes_and_the_legend_says_each_once(served: dict[str, Any]) -> None:
    doc = served["iterations"]
    rows, legend = doc["iterations"], doc["iteration_codes"]
    assert len(rows) == 250 and len(json.dumps(doc)) < 150_000
    assert all("sources" not in r and "excluded_reason" not in r and None not in r.values() for r in rows)
    assert all(r["source"].startswith("hook:rank0:pid") for r in rows)
    assert {r["excluded"] for r in rows if "excluded" in r} <= set(legend["excluded"])
    assert legend["sources"]["data_share"].startswith("hook:timer data-wait")


INCIDENT_LOGS = ROOT / "tests" / "data" / "incidents"


@pytest.mark.slow
@pytest.mark.parametrize("log", [INCIDENT_LOGS / "costraggler_dp2" / "dp2_cotenant.log",
                                 INCIDENT_LOGS / "cotenant_h100" / "megatron_dp1.log.gz"],
                         ids=["dp2-170-iterations", "dp1-150-iterations"])
def test_iterations_all_is_under_half_the_log(log: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    if log.suffix == ".gz":  # the size of the log as Megatron wrote it
        plain = tmp_path / log.stem
        plain.write_bytes(gzip.decompress(log.read_bytes()))
        log = plain
    # The command by the CLI's main() in this process (tests/cli_main.py): what it prints, as it prints it.
    out = perfd(capsys, "analyze", "megatron", log, "--gpu", "NVIDIA H200", "--json", "--iterations", "all")
    assert out.returncode == 0, out.stderr[-500:]
    doc = json.loads(out.stdout)
    assert len(doc["iterations"]) >= 150
    assert len(out.stdout) < 0.5 * log.stat().st_size, (len(out.stdout), log.stat().st_size)
    # one row a line, and each metric's source said once
    assert out.stdout.count("\n") < len(doc["iterations"]) + 2000
    assert "model_tflops_per_gpu" in doc["iteration_codes"]["sources"]

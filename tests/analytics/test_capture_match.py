"""Captures that are not of the job, on real traces and logs of different jobs: the
PP=2 Megatron-LM run on 2×H200 (perfd/app/demo/data) and the one-GPU H100 runs of tests/data/captures
(12 layers, h=2048, seq 2048, mbs 4: ``big2048``/``ops_*``; seq 1024: ``big``; h=256: ``tiny``), each
with the log of its own run where one was recorded. A capture of another job is refused with its
numbers (exit 2, one line, offline; never attached live); a capture of the job matches; --capture-force
reads it anyway and the report says it does not match."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.breakdown.capture_match import Check, JobFacts, check, job_facts
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown, devices_of
from perfd.analytics.run.run_analysis import analyze_run
from perfd.collectors.megatron import parse_file
from tests.trace_cache import analyze_chrome_trace, perfd_cli

ROOT = Path(__file__).resolve().parents[2]
K = ROOT / "tests" / "data" / "captures" / "kineto_h100_megatron"
PP2 = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
PP2_NSYS = ROOT / "tests" / "data" / "captures" / "megatron_pp2_nsys_h200x2.analysis.json"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


@cache
def _devices(trace: str) -> tuple[DeviceBreakdown, ...]:
    return analyze_chrome_trace(K / trace).devices


def _log(name: str, tmp: Path | None = None) -> Path:
    if name == "pp2":
        return PP2
    if name == "big2048":
        return K / "big2048_megatron.log"
    assert tmp is not None
    out = tmp / "ops_megatron.log"
    with gzip.open(K / "ops_megatron.log.gz", "rb") as f, out.open("wb") as g:
        shutil.copyfileobj(f, g)
    return out


@cache
def _facts(log: str) -> JobFacts:
    p = parse_file(_log(log), job="j")
    a = analyze_run(p.job_info, p.records, gpu_name=H200 if log == "pp2" else H100)
    return job_facts(p.job_info, a.summary.medians, a.peak.peak_tflops, a.job.layout.world_size)


def _ev(m: Any) -> dict[Check, Any]:
    return {e.check: e for e in m.evidence}


@pytest.mark.slow
def test_a_trace_of_another_job_is_refused_with_its_numbers():
    m = check("ops_default_rank0.json.gz", _devices("ops_default_rank0.json.gz"), _facts("pp2"))
    assert m.refused and not m.matches
    ev = _ev(m)
    # its layer norms normalise 4 × 2048 tokens a launch; the PP2 job's micro-batch is 4 × 1024
    assert (ev[Check.TOKENS].capture, ev[Check.TOKENS].job, ev[Check.TOKENS].matches) == (8192, 4096, False)
    assert ev[Check.PIPELINE].capture == 0 and ev[Check.PIPELINE].job == 2 and not ev[Check.PIPELINE].matches
    assert not ev[Check.COLLECTIVES].matches  # a one-GPU trace, a two-GPU job
    # its 3 marked steps ran 711 ms each, the PP2 job's steady step is 345 ms: not a profiler's +106%
    st = ev[Check.STEP_TIME]
    assert st.capture == pytest.approx(711.0, abs=1) and st.job == pytest.approx(344.5, abs=0.5)
    assert not st.matches and st.extra["ratio"] == pytest.approx(2.06, abs=0.01)


@pytest.mark.slow
def test_one_check_alone_is_not_enough():
    """``big`` has the PP2 job's tokens per micro-batch (4 × 1024) but no pipeline exchange."""
    ev = _ev(check("big", _devices("big_rank0.json.gz"), _facts("pp2")))
    assert ev[Check.TOKENS].matches and not ev[Check.PIPELINE].matches


@pytest.mark.slow
@pytest.mark.parametrize(("trace", "log"), [("ops_default_rank0.json.gz", "big2048"),
                                            ("big2048_rank0.json.gz", "big2048")])
def test_a_trace_of_the_job_matches(trace: str, log: str):
    m = check(trace, _devices(trace), _facts(log))
    assert m.matches, m.to_json()
    assert {Check.TOKENS, Check.PIPELINE, Check.FLOPS} <= set(m.checked)
    flops = _ev(m)[Check.FLOPS]
    assert flops.capture is not None and 150 < flops.capture < 989  # the job's FLOPs at a plausible rate


def test_the_pp2_jobs_own_nsys_capture_matches_its_log():
    devs = devices_of(json.loads(PP2_NSYS.read_text())["devices"])
    m = check("pp2", devs, _facts("pp2"))
    assert m.matches and _ev(m)[Check.PIPELINE].capture == pytest.approx(319.3, abs=0.1)
    assert not check("pp2", devs, _facts("big2048")).matches  # SendRecv in a job without a pipeline


def test_a_capture_too_short_for_the_jobs_flops_is_another_jobs():
    """All the tiny job's kernel time, at any GPU's peak, cannot do one step of the 12-layer job."""
    facts = _facts("big2048")
    devs = [dataclasses.replace(_devices("tiny_rank0.json.gz")[0], trace_steps=1)]
    ev = _ev(check("tiny", devs, facts))
    assert not ev[Check.FLOPS].matches and ev[Check.FLOPS].capture is not None
    assert ev[Check.FLOPS].capture > 989 * 1.05


@pytest.mark.slow
def test_cli_refuses_a_capture_of_another_job_with_one_line():
    r = perfd_cli("analyze", "megatron", PP2, "--capture", K / "ops_default_rank0.json.gz")
    err = r.stderr
    assert r.returncode == 2 and r.stdout == ""
    assert len(err.strip().splitlines()) == 1
    assert "not of this job" in err and "8,192 rows" in err and "4,096 tokens" in err
    assert "no SendRecv kernel" in err and "711 ms against the job's steady 345 ms" in err
    assert "--capture-force" in err


@pytest.mark.slow
def test_cli_capture_force_reads_it_and_says_it_does_not_match():
    r = perfd_cli("analyze", "megatron", PP2, "--capture", K / "ops_default_rank0.json.gz", "--capture-force",
                  "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0
    assert out["capture_match"]["refused"] is True
    found = {f["id"]: f for f in out["report"]["findings"]}
    assert "read anyway (--capture-force)" in found["capture-mismatch"]["title"]
    assert "budget-capture-cost" not in found  # its steps' excess is not read as the profiler's cost
    assert out["summary"]["step_budget"]["steady_step_ms"] is None


@pytest.mark.slow
def test_cli_a_capture_of_the_job_is_read_as_before(tmp_path: Path):
    r = perfd_cli("analyze", "megatron", _log("ops", tmp_path), "--gpu", H100, "--capture",
                  K / "ops_default_rank0.json.gz", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["capture_match"]["matches"] is True
    assert "capture-mismatch" not in {f["id"] for f in out["report"]["findings"]}
    assert out["summary"]["step_budget"]["basis"].startswith("capture ops_default_rank0")


@pytest.mark.slow
def test_html_report_refuses_it_too(tmp_path: Path):
    out = tmp_path / "r.html"
    r = perfd_cli("report", "--log", PP2, "--html", out, "--capture", K / "big2048_rank0.json.gz")
    assert r.returncode == 2 and "not of this job" in r.stderr and not out.exists()

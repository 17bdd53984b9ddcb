"""`perfd demo`'s own words, from the recorded log it replays (the same JSON the aggregator serves):
each iteration's exposed communication and pipeline wait as the step budget names and books them
(a pipeline's p2p waits are its wait, not communication), reading notes that quote only what the
report prints, and the last line that says when NVML was unavailable and what was used instead."""

from __future__ import annotations

from typing import Any

import pytest

from perfd.app.api import analyze_megatron_log
from perfd.app.demo import run as demo
from perfd.report import render_text
from perfd.report.training_report import Report


@pytest.fixture(scope="module")
def analysed() -> dict[str, Any]:
    return analyze_megatron_log(demo.DEMO_LOG, gpu="NVIDIA H200")


def _budget_line(text: str, name: str) -> str:
    return next(ln for ln in text.splitlines() if ln.strip().startswith(name))


def test_an_iteration_names_its_parts_as_the_budget_does(analysed: dict[str, Any]) -> None:
    it = analysed["iterations"][-1]
    # The timers' total counts the pipeline's p2p waits (~25%); the budget books them as pipeline wait.
    assert it["comm_exposed_share"] > 0.2 and it["comm_exposed_dp_share"] < 0.01
    line = demo.iteration_line(it)
    assert f"exposed communication {100 * it['comm_exposed_dp_share']:.1f}%" in line, line
    assert f"pipeline wait {100 * it['pp_idle_max']:.1f}%" in line, line
    assert "exposed comm " not in line
    text = render_text(Report.from_json(analysed["report"]))
    assert "0.3%" in _budget_line(text, "exposed communication")
    assert "23.8%" in _budget_line(text, "pipeline wait")
    # A job of one stage: all of its timed communication is exposed communication, no pipeline wait.
    flat = {"iteration": 7, "step_time_ms": 100.0, "mfu": 0.4, "comm_exposed_share": 0.12,
            "comm_exposed_dp_share": 0.12, "comm_exposed_pp_share": None, "pp_bubble_analytic": 0.0,
            "pp_idle_max": None, "bottleneck": "communication-bound"}
    assert "exposed communication 12.0%, bottleneck" in demo.iteration_line(flat)


def test_the_notes_quote_what_the_report_prints(analysed: dict[str, Any]) -> None:
    text = " ".join(render_text(Report.from_json(analysed["report"])).split())
    notes = demo.reading_notes({"summary": analysed["summary"], "report": analysed["report"]}, "off")
    grade = notes[0]
    quoted = grade.split('"')[1]
    assert quoted and quoted in text, (quoted, text[:600])
    assert "data wait at 4.0%" in grade and "exposed communication at 0.3%" in grade
    assert "neither explains it here" in grade and "pipeline-bound" in grade
    assert any("790 TFLOP/s matmul ceiling is measured" in n and "989 TFLOP/s peak" in n for n in notes)
    assert "790" in text and "989" in text


def test_nvml_real_without_a_gpu_says_so() -> None:
    sources = [{"agent": "demo-node/agent", "node": "demo-node",
                "nvml": "unavailable: NVML not found: libnvidia-ml.so.1 could not be loaded"}]
    said = demo.nvml_used("real", sources, [])
    assert said.startswith("unavailable (NVML not found: libnvidia-ml.so.1 could not be loaded)"), said
    assert "no GPU counters" in said and "from the log alone" in said and "real GPU" not in said
    gpu = [{"gpu": "0", "model": "NVIDIA H200", "text": "util 98%"}]
    assert demo.nvml_used("real", [{"nvml": "ok"}], gpu) == "this machine's GPUs, live"
    assert "from the log alone" in demo.nvml_used("real", [], [])
    recording = demo.nvml_used("replay:/x/h100_phases.jsonl", [], gpu)
    assert recording == "a recording of another run (h100_phases.jsonl)"
    assert demo.nvml_used("off", [], []) == "off"

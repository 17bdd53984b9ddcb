"""`perfd analyze sglang`: JSON keys, the four-part text report, metrics from files and a live URL."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from perfd.app.cli import main
from perfd.collectors.sglang.tests.test_metrics import Server
from perfd.report import Report, render_text

DATA = Path(__file__).resolve().parents[2] / "perfd" / "collectors" / "sglang" / "tests" / "data"
LOG = str(DATA / "sglang_0_5_5_dp2.log")


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["analyze", "sglang", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_json_has_records_summary_and_report(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, LOG, "--gpu", "NVIDIA H100 80GB HBM3", "--model-params", "8.03B", "--job", "llm")
    assert set(out) >= {"records", "summary", "report", "parse"}
    recs = out["records"]
    assert len(recs) == 12 and {r["kind"] for r in recs} == {"prefill", "decode"}
    first = recs[0]
    assert first["kind"] == "prefill" and first["time_text"] == "[2025-11-05 07:00:10 DP0]"
    assert first["timestamp"] == 1762326010.0 and first["ranks"] == {"DP": 0}
    assert first["new_tokens"] == 8000 and first["fields"]["#cached-token"] == "0"
    assert "gen_throughput" not in first  # absent fields are left out, never 0
    metrics = out["summary"]["metrics"]
    assert metrics["perfd_serving_decode_mfu_ratio"] > 0 and "perfd_serving_ttft_p99_seconds" not in metrics
    rep = out["report"]
    assert set(rep) == {"summary", "metrics", "step_budget", "arming", "findings", "recommendations", "plan"}
    # a serving job has no training step and no rank under ncu: absent, not zeros
    assert rep["step_budget"] is None and rep["arming"] is None and rep["plan"] is None
    assert rep["summary"]["job_name"] == "llm" and rep["summary"]["status"] == "warning"
    ids = {f["id"] for f in rep["findings"]}
    assert all(r["finding_id"] in ids for r in rep["recommendations"])
    by_name = {m["name"]: m for m in rep["metrics"]}
    assert by_name["perfd_serving_itl_p99_seconds"]["value"] is None
    assert by_name["perfd_serving_itl_p99_seconds"]["source"].startswith("absent: no /metrics scrape")
    assert out["parse"]["issues_total"] == 2
    text = render_text(Report.from_json(rep))
    for part in ("SUMMARY", "METRICS", "FINDINGS", "RECOMMENDATIONS"):
        assert part in text


def test_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "sglang", LOG]) == 0
    text = capsys.readouterr().out
    assert "SUMMARY" in text and "queue-growing" in text and "perfd_serving_kv_cache_usage_ratio" in text
    assert "2 log lines could not be used" in text


def test_two_metrics_files_give_window_percentiles(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    srv = Server()
    try:
        a = tmp_path / "a.prom"
        a.write_bytes(generate_latest(srv.reg))
        srv.observe([0.15] * 10, [0.01] * 99 + [0.5], [1.0] * 10)
        b = tmp_path / "b.prom"
        b.write_bytes(generate_latest(srv.reg))
    finally:
        srv.close()
    os.utime(a, (1000.0, 1000.0))
    os.utime(b, (1060.0, 1060.0))
    out = run_json(capsys, LOG, "--metrics", str(a), "--metrics", str(b))
    m = out["summary"]["metrics"]
    assert m["perfd_serving_ttft_p50_seconds"] == pytest.approx(0.15)
    assert m["perfd_serving_itl_p99_seconds"] == pytest.approx(0.01)  # rank 99 of 100: top of (0.008, 0.01]
    src = out["summary"]["values"]["ttft_p50"]["source"]
    assert "60.0 s apart" in src and out["metrics_sources"] == [str(a), str(b)]


def test_metrics_url_is_scraped_twice(capsys: pytest.CaptureFixture[str]) -> None:
    srv = Server()
    try:
        srv.observe([0.3], [0.02], [2.0])
        out = run_json(capsys, LOG, "--metrics", srv.url, "--scrape-interval", "0.05")
    finally:
        srv.close()
    assert len(out["metrics_sources"]) == 2 and out["metrics_problems"] == []
    # nothing was observed between the two scrapes: no window percentiles, said so
    reason = out["summary"]["values"]["ttft_p50"]["reason"]
    assert reason == "no sglang:time_to_first_token_seconds observations in the window"


def test_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["analyze", "sglang", str(tmp_path / "missing.log")]) == 2
    assert main(["analyze", "sglang", LOG, "--model-params", "lots"]) == 2
    assert "not a number" in capsys.readouterr().err
    # Neither batch lines nor usable /metrics: refused with one line naming both (it
    # used to exit 0 with an 'unknown' report).
    empty = tmp_path / "empty.log"
    empty.write_text("hello\n")
    capsys.readouterr()
    assert main(["analyze", "sglang", str(empty), "--metrics", str(tmp_path / "nope.prom"), "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no SGLang" in err[0] and "nope.prom" in err[0]

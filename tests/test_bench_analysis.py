"""`perfd bench analysis` runs small in CI: its keys, and a refusal of nonsense."""

from __future__ import annotations

import json

import pytest

from perfd.app.cli import main


def test_bench_analysis_reports_scratch_and_incremental(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "analysis", "--ranks", "8", "--iterations", "12", "--new", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ranks"] == 8 and r["iterations"] == 12 and r["new_iterations_timed"] == 2
    assert r["scratch_s_median"] > 0 and r["incremental_s_median"] >= 0


def test_bench_analysis_refuses_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "analysis", "--iterations", "2", "--new", "5"]) == 2
    assert "need" in capsys.readouterr().err

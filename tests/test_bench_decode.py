"""`perfd bench decode` runs small in CI: its keys, and a refusal of nonsense."""

from __future__ import annotations

import json

import pytest

from perfd.app.cli import main


def test_bench_decode_reports_both_wire_forms_and_the_step_batch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "decode", "--agents", "5", "--rounds", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["agents"] == 5 and r["samples_per_batch"] == 200
    assert r["samples_batch_us"] > 0 and r["samples_batch_packed_us"] > 0 and r["step_batch_us"] > 0
    assert r["packed_over_arrays"] == pytest.approx(r["samples_batch_packed_us"] / r["samples_batch_us"])


def test_bench_decode_refuses_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "decode", "--agents", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err

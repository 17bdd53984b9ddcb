"""`perfd analyze trace FILE --framework F --job-step-ms MS`: a trace read offline as a live capture of
that job is (the remedies in its framework's words, the profiler's slowdown brought back to the job's
own step before any gain is modelled), on the recorded Hugging Face Trainer run. The command by the CLI's
own entry point, in the test's process (tests/cli_main.py), each recording read and analysed once a
session (tests/trace_cache.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_main import Ran, perfd
from tests.trace_cache import session_traces

ROOT = Path(__file__).resolve().parents[2]
LOOPS = ROOT / "tests" / "data" / "loops"
HF = LOOPS / "hf_clm_h200"


@pytest.fixture
def _analyze(capsys: pytest.CaptureFixture[str]):
    def run(*args: str, trace: Path = HF) -> Ran:
        with session_traces():
            return perfd(capsys, "analyze", "trace", trace / "trace.json.xz", *args)
    return run


def _remedies(_analyze, name: str, framework: str, step_ms: str) -> dict[str, dict[str, Any]]:
    """The recommendations of `perfd analyze trace` of one recording as its job, by remedy."""
    out = json.loads(_analyze("--json", "--framework", framework, "--job-step-ms", step_ms,
                              trace=LOOPS / name).stdout)
    return {str(r["remedy"]): r for r in out["recommendations"]}


def test_the_trace_read_as_the_trainers_job_at_its_own_step(_analyze) -> None:
    own = json.loads((HF / "meta.json").read_text())["own_clock_median_ms"]
    plain = json.loads(_analyze("--json").stdout)
    job = json.loads(_analyze("--json", "--framework", "hf_trainer", "--job-step-ms", str(own)).stdout)
    (b0,), (b1,) = plain["budgets"].values(), job["budgets"].values()
    assert b0["step_ms"] > 400 and b1["unprofiled"] is not None  # captured 422 ms; brought back
    assert abs(b1["step_ms"] - own) < 0.01 * own
    words = " ".join(r["action"] for r in job["recommendations"])
    assert "--per_device_train_batch_size" in words and "--torch_compile" in words
    assert "--per_device_train_batch_size" not in " ".join(r["action"] for r in plain["recommendations"])
    mb = next(r for r in job["recommendations"] if r["remedy"] == "micro_batch")
    assert mb["effort"] == "flag"


def test_a_step_time_that_is_no_step_time_is_refused(_analyze) -> None:
    got = _analyze("--job-step-ms", "-5")
    assert got.returncode == 2 and "--job-step-ms" in got.stderr and not got.stdout


def test_the_remedies_that_failed_as_said_are_said_with_what_they_need(_analyze) -> None:
    """The remedies that failed or slowed the job when applied as said (docs/evidence/loops_ab_h200,
    loops_ab2_h200), as the command that makes the predictions shows them: CUDA graphs are no promised
    gain on any of the three (no impact: ordered after every promised one), each saying why and where the
    mark goes; nanoGPT, compiled, is offered no fused loss (59 ms slower outside its graph)."""
    hf = _remedies(_analyze, "hf_clm_h200", "hf_trainer", "293.18")
    graphs = hf["cuda_graphs"]
    assert graphs["impact"] is None and graphs["flags"] == ["--torch_compile_mode reduce-overhead"]
    assert "not promised" in graphs["detail"]
    assert "torch.compiler.cudagraph_mark_step_begin()" in graphs["detail"]
    assert all(r["impact"] is not None for r in hf.values() if r["priority"] < graphs["priority"])
    nano = _remedies(_analyze, "nanogpt_h200", "pytorch", "133.46")
    assert "cross_entropy_fusion" not in nano and "loss_only" in nano
    lit = _remedies(_analyze, "lightning_h200", "lightning", "23.2")
    graphs = lit["cuda_graphs"]
    assert graphs["impact"] is None and "not promised" in graphs["detail"]
    assert "cudagraph_mark_step_begin() before each forward" in graphs["detail"]
    assert all(r["impact"] is not None for r in lit.values() if r["priority"] < graphs["priority"])

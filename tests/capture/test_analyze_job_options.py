"""`perfd analyze trace FILE --framework F --job-step-ms MS`: a trace read offline as a live capture of
that job is (the remedies in its framework's words, the profiler's slowdown brought back to the job's
own step before any gain is modelled), on the recorded Hugging Face Trainer run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "data" / "loops" / "hf_clm_h200"


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perfd.cli", "analyze", "trace", str(HF / "trace.json.xz"),
                           *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_trace_read_as_the_trainers_job_at_its_own_step() -> None:
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


def test_a_step_time_that_is_no_step_time_is_refused() -> None:
    got = _analyze("--job-step-ms", "-5")
    assert got.returncode == 2 and "--job-step-ms" in got.stderr and not got.stdout

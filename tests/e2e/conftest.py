"""A real aggregator and a real agent on loopback, in the test's process (tests/inproc.py), fed the
demo's kind of inputs (a real Megatron-LM log with per-rank timers, half written at start; a real NVML
recording replayed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.inproc import pipeline
from tests.procs import http_get

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"  # per-rank timers: a heat line
NVML = ROOT / "perfd" / "collectors" / "nvml" / "data" / "h100_phases.jsonl"
JOB = "top-dp2"


def _json(url: str) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(http_get(url))
    return got


class Live:
    """The running pair: the aggregator's URL, the log still to write, the agent's /metrics."""

    def __init__(self, base: str, train_log: Path, rest: list[str], agent_metrics: str) -> None:
        self.base, self.train_log, self.rest, self.agent_metrics = base, train_log, rest, agent_metrics

    def write_rest(self) -> None:
        with self.train_log.open("a") as fh:
            fh.writelines(self.rest)


@pytest.fixture
def live(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Live]:
    """Parametrize indirectly with a list of extra aggregator arguments."""
    extra = list(getattr(request, "param", []))
    lines = LOG.read_text().splitlines(keepends=True)
    iters = [i for i, ln in enumerate(lines) if " iteration " in ln and "/" in ln]
    # Half the iterations now, the rest later: cut just before an iteration line, so the last one
    # written comes with its timer block. (Cut after an iteration line, that iteration is flushed
    # without its per-rank timers once the log is quiet for 2 s, and the job's latest analysis has
    # no straggler ratios: what a loaded machine showed to the tests that came after the flush.)
    cut = iters[len(iters) // 2]
    train_log = tmp_path / "train.log"
    train_log.write_text("".join(lines[:cut]))
    with pipeline(tmp_path, "--gpu", "NVIDIA H200", *extra) as p:
        agent = p.agent("--job", JOB, "--megatron-log", train_log, "--nvml", f"replay:{NVML}", "--host", "on",
                        "--node", "node-a", "--metrics-port", "0")
        base = p.base

        def has_gpu_and_steps() -> bool:
            gpus = _json(f"{base}/api/jobs/{JOB}/gpus")["gpus"]
            jobs = _json(f"{base}/api/jobs")["jobs"]
            # The summary is the refresher's last analysis: wait until it has iterations too.
            latest = _json(f"{base}/api/jobs/{JOB}/summary").get("latest") if jobs else None
            return bool(gpus) and bool(jobs) and (jobs[0].get("iterations_seen") or 0) >= 5 \
                and latest is not None
        p.wait(has_gpu_and_steps, 60, "steps and GPU series at the aggregator")
        yield Live(base, train_log, lines[cut:], agent.metrics_url)

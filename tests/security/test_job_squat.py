"""A client without credentials cannot squat a job's future iterations: the real
aggregator and real gRPC clients on loopback, in the test's process (tests/inproc.py).

Before, the first record of an (iteration, rank) won whoever sent it: a client that named the job in
its Hello (anyone can) and wrote iterations the job had not reached yet had the real records
refused when the job got there. Now the host that continues the job — whose record of the iteration
before is held — takes an iteration another wrote ahead of it, and a host a Hello named outranks one
that only wrote first (docs/reliability.md, "Who may write a job"). The figures printed are recorded
in docs/reliability.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from perfd.core.model import StepRecord
from tests.inproc import pipeline
from tests.procs import get_json

pytestmark = pytest.mark.slow

T0 = time.time()


def steps(job: str, its: range, step_ms: float) -> list[StepRecord]:
    return [StepRecord(job=job, iteration=i, rank="last", end_time=T0 + i * 0.1, step_time_ms=step_ms,
                       lm_loss=5.0) for i in its]


def held(base: str, job: str) -> dict[int, float]:
    its = get_json(f"{base}/api/jobs/{job}/iterations?sources=0")["iterations"]
    return {int(it["iteration"]): it["step_time_ms"] for it in its}


def real_at(base: str, job: str, it: int) -> dict[int, float] | None:
    """The step times held once iteration ``it`` holds the real job's (100 ms)."""
    h = held(base, job)
    return h if h.get(it) == 100.0 else None


def test_a_stranger_cannot_squat_a_jobs_future_iterations(tmp_path: Path) -> None:
    with pipeline(tmp_path, "--no-rules") as p:
        base = p.base
        # The real job's agent writes 1-50; a stranger names the job in its Hello too and writes
        # 51-200 ahead of it (1 ms steps); the real agent goes on with 51-120.
        p.send("node-a", [{"steps": steps("train", range(1, 51), 100.0)}], ["train"])
        p.send("stranger", [{"steps": steps("train", range(51, 201), 1.0)}], ["train"])
        p.send("node-a", [{"steps": steps("train", range(51, 121), 100.0)}], ["train"])
        got = p.wait(lambda: real_at(base, "train", 120), 30, "the real records of 51-120 held")
        # A job nobody's Hello named yet: the stranger writes first (a first writer is a host), then
        # the job's agent, whose Hello names it, writes the same iterations.
        p.send("stranger", [{"steps": steps("early", range(100, 151), 1.0)}], [])
        p.send("node-b", [{"steps": steps("early", range(1, 151), 100.0)}], ["early"])
        early = p.wait(lambda: real_at(base, "early", 150), 30, "the Hello-named host's records held")
        st: dict[str, Any] = get_json(base + "/api/stats")
        evs = json.dumps(get_json(f"{base}/api/events?job=train")["events"])
        real = sum(1 for i in range(51, 121) if got.get(i) == 100.0)
        print(f"FIGURES squat: a stranger's records of iterations 51-200 written ahead of the job: "
              f"{real} of 70 real records (51-120) held, {st['refused_by_agent']['stranger']} refused under "
              f"the stranger; a first writer's 100-150 taken by the Hello-named host: "
              f"{sum(1 for i in range(100, 151) if early.get(i) == 100.0)} of 51")
        assert real == 70 and all(got[i] == 1.0 for i in range(121, 201))  # the rest stays, counted
        assert st["refused_by_agent"]["stranger"]["step_ahead"] == 70 + 51
        assert st["transport"].get("refused_step_conflict", 0) == 0
        assert "written ahead of the job" in evs
        assert all(early[i] == 100.0 for i in range(1, 151))

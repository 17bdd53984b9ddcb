"""A ladder of far-future iterations in one batch.

The attack: 6,000 step records of one job, each 99,999 iterations past the one before, in one
batch — every one within MAX_ITERATION_LEAP of the record before it, so the per-record check took them
all: the job's 200 held iterations were evicted (the retention window keeps the newest 5,000) and its
next 200 were dropped as older than the window, with 0 refusals counted. Plausibility is now judged
per batch: a record more than MAX_ITERATION_LEAP past what the job held *before* the batch is refused.

Against the real aggregator, in the test's process (tests/inproc.py), through real gRPC streams: a job
fed as Megatron-LM's log is (one record per iteration, rank "last") and a job fed as the step hook is
(records per rank, the hook's pid in their fields), the ladder sent by a client whose Hello names the job
(any client may).
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import pytest

from perfd.core import limits as L
from perfd.core.model import Provenance, StepRecord
from perfd.transport.client import AgentClient
from tests.faults.streams import streaming
from tests.inproc import pipeline
from tests.procs import http_get

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
RUNGS = 6_000
STEP = L.MAX_ITERATION_LEAP - 1  # each rung within the leap of the one below it


def _rec(job: str, it: int, hook: bool, t: float) -> StepRecord:
    if not hook:
        return StepRecord(job=job, iteration=it, rank="last", end_time=t, step_time_ms=100.0)
    return StepRecord(job=job, iteration=it, rank=0, end_time=t, step_time_ms=100.0,
                      source=Provenance("hook", "rank0"), fields={"pid": "4242"})


def _held(base: str, job: str) -> list[int]:
    its = json.loads(http_get(f"{base}/api/jobs/{job}/iterations?sources=0"))["iterations"]
    return sorted(int(it["iteration"]) for it in its)


def _refused(base: str, reason: str) -> float:
    m = re.search(rf'^perfd_aggregator_refused_total\{{reason="{reason}"\}} (\S+)$',
                  http_get(f"{base}/metrics").decode(), re.M)
    return float(m.group(1)) if m else 0.0


async def _attack(target: str, job: str, hook: bool) -> None:
    real = AgentClient(target, f"{job}-agent", jobs=[job])
    ladder = AgentClient(target, f"{job}-ladder", jobs=[job])
    async with streaming(real) as r, streaming(ladder) as a:
        t0 = time.time() - 100
        r.submit(steps=[_rec(job, i, hook, t0 + i * 0.1) for i in range(1, 201)])
        assert await r.flush(30)
        a.submit(steps=[_rec(job, 200 + k * STEP, hook, t0 + 20 + k * 1e-3) for k in range(1, RUNGS + 1)])
        assert await a.flush(60)
        r.submit(steps=[_rec(job, i, hook, t0 + i * 0.1) for i in range(201, 401)])
        assert await r.flush(30)


@pytest.mark.parametrize("hook", [False, True], ids=["megatron-shaped", "hook-shaped"])
def test_a_ladder_in_one_batch_is_refused_and_evicts_nothing(tmp_path: Path, hook: bool,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    job = "hookjob" if hook else "logjob"
    caplog.set_level(logging.WARNING, logger="perfd.refused")  # the aggregator's refusal lines
    with pipeline(tmp_path, "--no-rules") as p:
        base = p.base
        p.call(_attack(p.target, job, hook), "the ladder and the real writer's batches", 120)
        held = p.wait(lambda: (h := _held(base, job)) and 400 in h and h, 30, "iteration 400 held")
        refused = _refused(base, "iteration_ahead")
    out = caplog.text
    # Every real iteration held, the 200 before the ladder and the 200 after it.
    assert [i for i in held if i <= 400] == list(range(1, 401))
    # The first rung is one leap past the newest held (a single record within MAX_ITERATION_LEAP is
    # plausible, as before); the other 5,999 are refused and counted.
    assert held[400:] == [200 + STEP]
    assert refused == RUNGS - 1
    assert "refused (iteration_ahead)" in out and "past the newest held before its batch" in out


ACROSS = 320  # one-record batches (320 in 3.4 s, 0 refused, 0 of 400 real held)
WINDOW = 300


async def _ladder_across_batches(target: str, job: str, hook: bool, ladders: int) -> None:
    """The real writer's 200 iterations, then one rung a batch from ``ladders`` agents in turn (each
    rung one leap past the one before), then its next 200."""
    real = AgentClient(target, f"{job}-agent", jobs=[job])
    clients = [AgentClient(target, f"{job}-ladder{n}", jobs=[job]) for n in range(ladders)]
    async with streaming(real) as r:
        t0 = time.time() - 100
        r.submit(steps=[_rec(job, i, hook, t0 + i * 0.1) for i in range(1, 201)])
        assert await r.flush(30)
        for n, c in enumerate(clients):
            async with streaming(c) as a:
                for k in range(1 + n, ACROSS + 1, ladders):
                    a.submit(steps=[_rec(job, 200 + k * STEP, hook, t0 + 20 + k * 1e-3)])
                    assert await a.flush(30)
        r.submit(steps=[_rec(job, i, hook, t0 + i * 0.1) for i in range(201, 401)])
        assert await r.flush(30)


@pytest.mark.parametrize("hook,ladders", [(False, 1), (True, 1), (False, 2)],
                         ids=["megatron-shaped", "hook-shaped", "two-ladder-agents"])
def test_a_ladder_across_batches_is_refused_from_its_second_rung(tmp_path: Path, hook: bool, ladders: int,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Each rung is judged against the job's progress as its main writer shows it, never against the
    sender's own uncorroborated rung: the first rung is held (one leap, as any one record), every later
    one refused — by one ladder agent or two taking turns."""
    job = "hookjob" if hook else "logjob"
    caplog.set_level(logging.WARNING, logger="perfd.refused")  # the aggregator's refusal lines
    with pipeline(tmp_path, "--no-rules", "--retain-iterations", str(WINDOW)) as p:
        base = p.base
        p.call(_ladder_across_batches(p.target, job, hook, ladders),
               "the rungs and the real writer's batches", 180)
        held = p.wait(lambda: (h := _held(base, job)) and 400 in h and h, 30, "iteration 400 held")
        refused = _refused(base, "iteration_ahead")
    out = caplog.text
    # The window's newest 300: the first rung (one leap past the 200 held) and the 299 newest real
    # iterations; the other 319 rungs refused (the second agent's first is two leaps past the job's 200).
    assert held == [*range(402 - WINDOW, 401), 200 + STEP]
    assert refused == ACROSS - 1
    assert "of the job's main writer" in out

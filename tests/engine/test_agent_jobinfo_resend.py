"""On the engine the agent sends each job's info again once a minute, changed or not: a shard that took
a partition over mid-run reads a job's info only from a node message carrying it, and without it groups
none of the job's ranks by pipeline stage (perfd.engine.shard_summaries.NO_INFO). Only the jobs that
stepped on the node since; to an aggregator the info goes on change and after a reconnect only. The
agent's clock is the test's."""

from __future__ import annotations

from typing import Any

import pytest

from perfd.agent.config import apply_overrides, load_config
from perfd.agent.node_agent import JOBINFO_RESEND_S, Agent
from perfd.collectors.collector import Collected
from perfd.core.events import GPU_PROCESSES
from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, ParallelLayout, StepRecord

INFO = JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"),
               layout=ParallelLayout(world_size=16, tp=1, pp=2, dp=8, cp=1))


class Client:
    """What the agent submitted, as the engine's or the aggregator's client would be given it."""

    def __init__(self) -> None:
        self.infos: list[dict[str, str] | None] = []

    def submit(self, samples: Any = (), steps: Any = (), events: Any = (), **kw: Any) -> int:
        self.infos.append(kw.get("job_info_json"))
        return len(self.infos)


def _sent(engine: str | None, times: list[float], stepping_until: float = float("inf")) -> list[bool]:
    """For each of ``times`` (the agent's monotonic clock), whether that collection's batch carried the
    job's info: the info read at the first, a step of the job at each up to ``stepping_until``, and an
    event at each (a batch each collection)."""
    overrides: dict[str, Any] = {"node": "n1", "nvml": "off", "metrics_port": -1}
    if engine is not None:
        overrides["engine"] = engine
    now = [times[0]]
    agent = Agent(apply_overrides(load_config(None), **overrides))
    agent.monotonic = lambda: now[0]
    agent._jobinfo_resent_at = times[0]
    client = agent.client = Client()
    idle = {"kind": GPU_PROCESSES.name, "labels": {"gpu": "0"}, "payload": []}
    for k, t in enumerate(times):
        now[0] = t
        step = StepRecord(job="gpt", iteration=k + 1, rank=0, step_time_ms=100.0)
        steps = [step] if t <= stepping_until else []
        agent._forward([("hook", Collected(steps=steps, events=[dict(idle)],
                                           job_info={"gpt": INFO} if k == 0 else {}))])
    return [bool(i and "gpt" in i) for i in client.infos]


@pytest.mark.parametrize("engine", ["nats://127.0.0.1:4222", None], ids=["engine", "aggregator"])
def test_the_job_info_goes_again_once_a_minute_on_the_engine_only(engine: str | None) -> None:
    r = JOBINFO_RESEND_S
    times = [0.0, 1.0, r - 0.5, r, r + 1.0, 2 * r - 0.1, 2 * r + 0.5, 2 * r + 1.0]
    want = [True, False, False, True, False, False, True, False] if engine else [True] + [False] * 7
    assert _sent(engine, times) == want


def test_a_job_that_no_longer_steps_here_is_not_sent_again() -> None:
    """Only the jobs that stepped on the node since the last time: an ended job's info stays put (its
    store would take it for a live job's)."""
    r = JOBINFO_RESEND_S
    times = [0.0, 1.0, r, r + 1.0, 2 * r, 3 * r, 4 * r]
    # stepped up to r + 1: sent again at r and at 2r (it stepped between r and 2r), then not
    assert _sent("nats://127.0.0.1:4222", times, stepping_until=r + 1.0) == [
        True, False, True, False, True, False, False]

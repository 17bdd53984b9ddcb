"""A failing collector is counted in a metric, logged once, and the agent runs on."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import perfd.collectors.megatron
from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent
from perfd.collectors.collector import Capabilities, Collected, Collector, Registry
from perfd.core.model import Sample


class Exploding(Collector):
    name = "exploding"
    default_interval_s = 0.05

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()

    def probe(self) -> Capabilities:
        return Capabilities(True)

    def collect(self, now: float) -> Collected:
        raise RuntimeError("the source broke")  # breaks the contract: the scheduler must cope


class Healthy(Collector):
    name = "healthy"
    default_interval_s = 0.05

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.n = 0

    def probe(self) -> Capabilities:
        return Capabilities(True)

    def collect(self, now: float) -> Collected:
        self.n += 1
        return Collected(samples=[Sample("perfd_host_load1", float(self.n), now)])


def test_failures_are_counted_logged_once_and_the_agent_keeps_running(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry()
    reg.register("exploding", Exploding)
    reg.register("healthy", Healthy)
    perfd.collectors.megatron.register(reg)
    reg.register("bad-config", lambda cfg: (_ for _ in ()).throw(ValueError("path is required")))
    cfg = AgentConfig(job="j", metrics_port=0, metrics_host="127.0.0.1", collectors={
        "exploding": {}, "healthy": {}, "bad-config": {},
        "megatron": {"path": str(tmp_path / "not-there.log")}}).finish()
    agent = Agent(cfg, reg)

    def ran_enough() -> bool:  # the condition the test reads, not a pause it hopes is long enough
        st = agent.scheduler.states
        healthy_n = getattr(st["healthy"].collector, "n", 0) if "healthy" in st else 0
        forwarded = any(name == "perfd_host_load1" for _l, name, _v in agent.view.rows())
        return "exploding" in st and st["exploding"].failures >= 5 and healthy_n >= 5 and forwarded and \
            "megatron" in st and any(r.startswith("tail:") for r in st["megatron"].collector.errors)

    async def body() -> str:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        deadline = asyncio.get_running_loop().time() + 60
        while not ran_enough() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert agent.metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics") as r:
            text: str = r.read().decode()
        stop.set()
        await task
        return text

    with caplog.at_level(logging.WARNING):
        metrics = asyncio.run(body())
    boom = agent.scheduler.states["exploding"]
    assert boom.failures >= 5 and boom.collector.errors["collect-raised"] == boom.failures
    assert sum("collect-raised" in r.getMessage() for r in caplog.records) == 1  # logged once
    healthy = agent.scheduler.states["healthy"].collector
    assert isinstance(healthy, Healthy) and healthy.n >= 5  # the others ran on
    assert 'perfd_agent_collector_errors_total{collector="exploding",node=' in metrics
    assert 'reason="collect-raised"' in metrics
    assert 'collector="bad-config"' in metrics and 'reason="config"' in metrics
    assert 'collector="megatron"' in metrics and "tail:missing" in metrics
    assert "perfd_host_load1" in metrics


def test_collected_extend_keeps_both_outputs_in_order_and_the_newer_checkpoint() -> None:
    a = Collected(samples=[Sample("a", 1.0, 0.0)], events=[{"kind": "x"}], checkpoint={"offset": 1})
    b = Collected(samples=[Sample("b", 2.0, 0.0)], events=[{"kind": "y"}])
    a.extend(b)
    assert [s.name for s in a.samples] == ["a", "b"] and [e["kind"] for e in a.events] == ["x", "y"]
    assert a.checkpoint == {"offset": 1}  # b has none: a's stays
    a.extend(Collected(checkpoint={"offset": 2}))
    assert a.checkpoint == {"offset": 2}

"""Aggregator → agent → capture manager → events back: the loop closes, with the reason, even when
the capture cannot run (here: the agent does not know rank 7's process)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.collectors.collector import Registry


def test_capture_request_reaches_the_agent_and_its_outcome_comes_back(tmp_path: Path) -> None:
    async def body() -> dict[str, object]:
        agg = Aggregator(AggregatorConfig(grpc_host="127.0.0.1", grpc_port=0, http_host="127.0.0.1",
                                          http_port=0, rules_files=[]))
        await agg.start()
        cfg = AgentConfig(job="j", aggregator=f"127.0.0.1:{agg.grpc_port}", metrics_port=None,
                          capture_dir=str(tmp_path / "captures"), kineto_daemon=False).finish()
        agent = Agent(cfg, Registry())
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            for _ in range(100):
                if agg.server.connected_agents():
                    break
                await asyncio.sleep(0.05)
            rec = agg.captures.request("j", [7], "kineto", 3, "manual")
            assert rec.status == "requested", rec
            for _ in range(100):
                cur = next(c for c in agg.captures.list() if c["id"] == rec.id)
                if cur["status"] in ("finished", "failed"):
                    return cur
                await asyncio.sleep(0.05)
            return next(c for c in agg.captures.list() if c["id"] == rec.id)
        finally:
            stop.set()
            await task
            await agg.stop()

    cur = asyncio.run(body())
    assert cur["status"] == "failed", cur
    assert "7" in str(cur["reason"])  # names the rank it could not find
    # The process is released: the same rank can be asked for again.
    assert cur["agents"]

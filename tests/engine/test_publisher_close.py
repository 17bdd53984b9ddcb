"""An agent's engine connection whose close never returns is let go, and the agent connects afresh
(perfd.engine.connect.close_bounded). nats-py awaits the old socket's transport closing both in its
own reconnect and in ``close()``, and that wait can last for good on a socket the server dropped
(https://github.com/nats-io/nats.py/issues/671 and
https://github.com/nats-io/nats.py/issues/718); a CI run of ``perfd bench engine-storm`` had an agent
still not connected minutes after its nats-server came back. Here nats-py's TCP transport is made to hang
exactly there (its ``wait_closed``), against a real nats-server killed and started again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from perfd.core.model import StepRecord
from perfd.engine import connect as engine_connect
from perfd.engine import subjects as S
from perfd.engine.natsd import NatsCluster
from perfd.engine.publisher import EngineClient
from tests.engine.engine_driver import need_nats_server, until


def _step(it: int) -> StepRecord:
    return StepRecord(job="job-close", rank=0, iteration=it, end_time=time.time(), step_time_ms=1000.0)




@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_agent_whose_close_hangs_connects_afresh_and_publishes_what_waited(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need_nats_server()
    from nats.aio.transport import TcpTransport

    cluster = NatsCluster(tmp_path / "nats", 1).start()
    monkeypatch.setattr(engine_connect, "CLOSE_TIMEOUT_S", 1.0)

    async def main() -> tuple[EngineClient, float]:
        cfg = S.EngineConfig(tuple(cluster.urls))
        nc = await engine_connect.connect(cfg, "test streams")
        await engine_connect.ensure_streams(nc, cfg)  # what a shard or the root makes when it starts
        await nc.close()
        client = EngineClient(cfg, "node-0/job-close", node="node-0", backoff_initial_s=0.2,
                              backoff_max_s=1.0)
        task = asyncio.create_task(client.run())
        try:
            await until("the first connection", lambda: client.connected, 30)
            client.submit(steps=[_step(1)])
            await until("the first message published", lambda: client.published == 1, 30)

            async def never(self: TcpTransport) -> None:  # the nats.py bug above: waits for good
                await asyncio.Event().wait()

            monkeypatch.setattr(TcpTransport, "wait_closed", never)
            await asyncio.to_thread(cluster.kill, 0)
            await until("the loss seen", lambda: not client.connected, 30)
            client.submit(steps=[_step(2)])  # waits in the spool while the engine is down
            await asyncio.sleep(2.0)
            await asyncio.to_thread(cluster.restart, 0)
            back = await until("connected again after the restart", lambda: client.connected, 60)
            await until("the waiting message published", lambda: client.published == 2, 30)
            return client, back
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    try:
        client, back = asyncio.run(main())
    finally:
        monkeypatch.undo()
        cluster.stop()
    assert client.close_timeouts >= 1, "the hung close was never let go: the test did not reach the case"
    assert client.spool.pending_count() == 0
    assert client.stats()["close_timeouts"] == client.close_timeouts
    print(f"FIGURES connected again {back:.1f} s after the restart; {client.close_timeouts} close(s) let go")

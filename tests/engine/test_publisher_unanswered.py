"""A publish that lands on the engine but whose answer never comes back is sent again, and the engine
answers the resend as a duplicate (its Nats-Msg-Id de-duplication). That is one message stored once,
not a message sent twice: the agent counts it in ``duplicates_unanswered`` as well as in
``duplicates``, so published - (duplicates - duplicates_unanswered) is what the engine stored.

A CI run lost an engine server under load and saw exactly this: 180 messages stored, 180 folded, and
the clients' 180 acknowledgements with one "duplicate" read as 179 distinct messages. Here a real
nats-server sits behind a proxy that lets the client's bytes through and drops the server's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from perfd.core.model import StepRecord
from perfd.engine import connect as engine_connect
from perfd.engine import publisher
from perfd.engine import subjects as S
from perfd.engine.natsd import NatsCluster
from perfd.engine.publisher import EngineClient
from tests.engine.engine_driver import need_nats_server, stream_state, until
from tests.faults.proxy import FaultProxy


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_publish_whose_answer_was_lost_is_not_counted_as_a_message_sent_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need_nats_server()
    monkeypatch.setattr(publisher, "PUBLISH_TIMEOUT_S", 1.0)
    monkeypatch.setattr(engine_connect, "CLOSE_TIMEOUT_S", 1.0)
    cluster = NatsCluster(tmp_path / "nats", 1).start()
    proxy = FaultProxy("127.0.0.1", cluster.servers[0].client_port).start()

    async def main() -> EngineClient:
        direct = S.EngineConfig(tuple(cluster.urls))
        nc = await engine_connect.connect(direct, "test streams")
        await engine_connect.ensure_streams(nc, direct)  # what a shard or the root makes when it starts
        await nc.close()
        cfg = S.EngineConfig((f"nats://127.0.0.1:{proxy.port}",))
        client = EngineClient(cfg, "node-0/job-deaf", node="node-0", backoff_initial_s=0.2,
                              backoff_max_s=1.0)
        task = asyncio.create_task(client.run())
        try:
            await until("connected", lambda: client.connected, 30)
            proxy.set_mode("deaf")
            client.submit(steps=[StepRecord(job="job-deaf", rank=0, iteration=1, end_time=time.time(),
                                            step_time_ms=1000.0)])
            await until("the publish unanswered", lambda: client.publish_errors >= 1, 30)
            proxy.set_mode("pass")
            await until("the message acknowledged", lambda: client.published == 1, 30)
            return client
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    try:
        client = asyncio.run(main())
        stored = stream_state(cluster.urls, S.NODES_STREAM)["last_seq"]
    finally:
        proxy.close()
        cluster.stop()
    st = client.stats()
    assert stored == 1, f"the engine stored {stored} messages"
    assert (st["published"], st["duplicates"], st["duplicates_unanswered"]) == (1, 1, 1), st
    assert st["published"] - (st["duplicates"] - st["duplicates_unanswered"]) == stored
    assert st["distinct_published"] == stored
    assert st["pending"] == 0 and st["unreadable"] == 0, st

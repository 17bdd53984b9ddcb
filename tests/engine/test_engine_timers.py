"""The engine's timers are a deployment's settings (perfd.engine.subjects.EngineConfig: --engine-lease-ttl,
--engine-ack-wait): the hold a shard puts on a message for its windows is derived under the ack wait
whatever it is; the engine keeps what the lease bucket and a partition's consumer were made with, so a
process given another lease TTL is refused, saying which flags, and a shard finding a consumer made
with another ack wait sets it to its own (real nats-server, a shard in process)."""

from __future__ import annotations

import asyncio
import time

import pytest

from perfd.engine import subjects as S
from perfd.engine.connect import connect, ensure_streams
from perfd.engine.shard import Shard
from tests.engine.engine_driver import Rig


@pytest.mark.parametrize("ack_wait_s, hold_s",
                         [(10.0, 7.0), (6.0, 3.0), (4.0, 2.0), (1.0, 0.5), (30.0, 27.0)])
def test_the_hold_is_under_the_ack_wait(ack_wait_s: float, hold_s: float) -> None:
    cfg = S.EngineConfig(("nats://unused",), ack_wait_s=ack_wait_s)
    assert cfg.hold_s == hold_s
    assert 0 < cfg.hold_s < cfg.ack_wait_s


def test_the_defaults_are_the_engines() -> None:
    cfg = S.EngineConfig(("nats://unused",))
    assert (cfg.lease_ttl_s, cfg.renew_s, cfg.ack_wait_s, cfg.hold_s) == (6.0, 2.0, 10.0, 7.0)


def test_a_process_given_another_lease_ttl_is_refused_naming_the_flags(rig: Rig) -> None:
    rig.start_cluster()

    async def main() -> str:
        nc = await connect(rig.cfg(), "test")
        try:
            await ensure_streams(nc, rig.cfg())
            await ensure_streams(nc, rig.cfg())  # the same settings: nothing to change
            with pytest.raises(RuntimeError) as err:
                await ensure_streams(nc, S.EngineConfig(tuple(rig.urls), lease_ttl_s=3.0))
            return str(err.value)
        finally:
            await nc.close()

    said = asyncio.run(main())
    assert "--engine-lease-ttl 3" in said and "--engine-replicas 1" in said, said


def test_a_consumer_made_with_another_ack_wait_is_set_to_the_shards(rig: Rig) -> None:
    rig.start_cluster()

    async def main() -> dict[int, float]:
        from nats.js.api import AckPolicy, ConsumerConfig

        nc = await connect(rig.cfg(), "test")
        try:
            await ensure_streams(nc, rig.cfg())
            js = nc.jetstream()
            for p in range(rig.partitions):  # as a shard of another --engine-ack-wait made them
                made = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=3.0)
                sub = await js.pull_subscribe(S.partition_filter(p), durable=S.shard_consumer(p),
                                              stream=S.NODES_STREAM, config=made)
                await sub.unsubscribe()
            shard = Shard(S.EngineConfig(tuple(rig.urls), partitions=rig.partitions, ack_wait_s=4.0), "s")
            stop = asyncio.Event()
            task = asyncio.create_task(shard.run(stop))
            try:
                deadline = time.monotonic() + 30
                while True:
                    waits = {p: (await js.consumer_info(S.NODES_STREAM, S.shard_consumer(p))).config.ack_wait
                             for p in range(rig.partitions)}
                    if all(w == 4.0 for w in waits.values()) or time.monotonic() > deadline or task.done():
                        return {p: w or 0.0 for p, w in waits.items()}
                    await asyncio.sleep(0.1)
            finally:
                stop.set()
                await asyncio.wait_for(task, 30)
        finally:
            await nc.close()

    assert asyncio.run(main()) == dict.fromkeys(range(rig.partitions), 4.0)

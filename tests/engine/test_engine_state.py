"""The engine's own state on the root's /metrics: each stream's messages and bytes against its limit,
each partition consumer's backlog, as the leading root reads them from JetStream — checked against
nats-server's own monitoring endpoint (/jsz), an independent reading of the same engine. Real
nats-server; the root in the test's process; node messages published for a partition no shard takes,
so they wait there as a shard's backlog would."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.core.limits import Limits
from perfd.core.refusals import Refusals
from perfd.engine import engine_state
from perfd.engine import subjects as S
from perfd.engine.connect import ensure_streams
from perfd.engine.natsd import NatsCluster
from perfd.engine.partial import encode
from perfd.engine.root import Root
from perfd.exporters.engine_metrics import engine_rows
from tests.engine.test_natsd import _need_nats_server

JOB = "observed"
BOUND_S = 60.0  # a failure's bound only


def _jsz(cluster: NatsCluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """Streams and consumers as nats-server's monitoring says: name -> its detail."""
    got = cluster.servers[0].monitor("/jsz?streams=true&consumers=true&config=true")
    streams, consumers = {}, {}
    for acc in got.get("account_details") or []:
        for st in acc.get("stream_detail") or []:
            streams[st["name"]] = st
            for c in st.get("consumer_detail") or []:
                consumers[c["name"]] = c
    return streams, consumers


@pytest.mark.timeout(120)
def test_the_leaders_read_of_the_streams_is_what_the_engine_says(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _need_nats_server()
    monkeypatch.setattr(engine_state, "ENGINE_STATE_S", 0.2)  # the leader reads every 0.2 s here
    cluster = NatsCluster(tmp_path / "nats", 1)
    cluster.start()
    try:
        cfg = S.EngineConfig(tuple(cluster.urls), partitions=4)
        root = Root(cfg, EngineSink(AggregatorState(), Guard(Limits(), Refusals())), "root-a")
        waiting = 7  # node messages for partition 2, whose consumer no shard pulls from

        async def setup() -> None:
            import nats
            from nats.js.api import AckPolicy, ConsumerConfig

            nc = await nats.connect(list(cluster.urls))
            try:
                await ensure_streams(nc, cfg, comm_rows=True)  # every stream, the saved rows' too
                js = nc.jetstream()
                await js.add_consumer(S.NODES_STREAM, ConsumerConfig(
                    durable_name=S.shard_consumer(2), filter_subject=S.partition_filter(2),
                    ack_policy=AckPolicy.EXPLICIT))
                for k in range(waiting):
                    await js.publish(S.node_subject(JOB, 2), encode(f"node-{k}:1", f"node-{k}", 1, ()),
                                     headers={"Nats-Msg-Id": f"n{k}"})
            finally:
                await nc.close()

        async def lead_and_read() -> tuple[engine_state.EngineState, bool]:
            await setup()
            stop = asyncio.Event()
            task = asyncio.create_task(root.run(stop))
            t0 = time.monotonic()
            try:
                while time.monotonic() - t0 < BOUND_S:
                    st = root.engine
                    nodes = st.streams.get(S.STREAM_LABELS[S.NODES_STREAM])
                    if st.read_at is not None and nodes is not None and nodes.messages == waiting:
                        break
                    await asyncio.sleep(0.05)
                read = root.engine
            finally:
                stop.set()
                await asyncio.wait_for(task, 30)
            return read, root.engine.read_at is None

        read, cleared = asyncio.run(lead_and_read())
        streams, consumers = _jsz(cluster)
    finally:
        cluster.stop()

    assert read.read_at is not None and read.read_errors == 0, read
    # every engine stream, each as nats-server counts it; the byte limits perfd made them with
    # (the lease and job-info buckets are streams too, KV_*: not the engine's data, not read)
    named = {short: name for name, short in engine_state.STREAMS.items()}
    assert set(read.streams) == set(named)
    assert set(named.values()) == {n for n in streams if not n.startswith("KV_")}
    for short, st in read.streams.items():
        want = streams[named[short]]
        assert (st.messages, st.bytes) == (want["state"]["messages"], want["state"]["bytes"])
        assert st.max_bytes == want["config"]["max_bytes"] > 0
    nodes = read.streams[S.STREAM_LABELS[S.NODES_STREAM]]
    assert nodes.max_bytes == S.NODES_MAX_BYTES and nodes.messages == waiting and nodes.bytes > 0
    # the one partition consumer made: its backlog the node messages no shard took
    # (the root's own readers are consumers too, ephemeral, of the other streams: not read)
    assert set(read.consumers) == {S.shard_consumer(2)} == {
        n for n in consumers if n in {S.shard_consumer(p) for p in range(cfg.partitions)}}
    c, jc = read.consumers[S.shard_consumer(2)], consumers[S.shard_consumer(2)]
    assert (c.pending, c.ack_pending, c.redelivered) == (jc["num_pending"], jc["num_ack_pending"],
                                                         jc["num_redelivered"]) == (waiting, 0, 0)
    rows = {(name, tuple(sorted(labels.items()))): v for labels, name, v in engine_rows(read)}
    assert rows[("perfd_engine_consumer_pending", (("consumer", S.shard_consumer(2)),))] == waiting
    assert rows[("perfd_engine_stream_limit_bytes", (("stream", "nodes"),))] == S.NODES_MAX_BYTES
    assert cleared  # no longer leading: nothing read is held (the next leader's are the engine's)


def test_a_read_that_fails_keeps_the_last_until_it_is_stale_then_none() -> None:
    """The engine away: the last read stays served for STALE_AFTER_READS reads' time, counted; past it
    the streams and consumers are let go (absent, not a frozen figure an alert would read)."""
    from nats.js.api import StreamConfig, StreamInfo
    from nats.js.api import StreamState as NatsStreamState
    from nats.js.errors import NotFoundError

    away = [False]

    class Engine:
        """The JetStream API as a read calls it: each stream holds 3 messages; no consumer made."""

        async def stream_info(self, name: str) -> StreamInfo:
            if away[0]:
                raise TimeoutError("the engine away")
            return StreamInfo(config=StreamConfig(name=name, max_bytes=-1),
                              state=NatsStreamState(messages=3, bytes=300, first_seq=1, last_seq=3,
                                                    consumer_count=0))

        async def consumer_info(self, stream: str, consumer: str) -> Any:
            raise NotFoundError()

    state, every = engine_state.EngineState(), engine_state.ENGINE_STATE_S
    limit = engine_state.STALE_AFTER_READS * every

    async def read_at(t: float) -> int:
        await engine_state.read_once(Engine(), 2, state, t)  # type: ignore[arg-type]
        return len(state.streams)

    async def main() -> list[int]:
        held = [await read_at(1000.0)]
        away[0] = True
        reads = range(1, engine_state.STALE_AFTER_READS + 3)
        return held + [await read_at(1000.0 + k * every) for k in reads]

    held = asyncio.run(main())
    n = len(engine_state.STREAMS)
    assert held[0] == n and state.streams == {} and state.consumers == {}
    kept = [h for k, h in enumerate(held) if k * every <= limit]
    gone = [h for k, h in enumerate(held) if k * every > limit]
    assert kept == [n] * len(kept) and gone and set(gone) == {0}
    assert state.read_errors == len(held) - 1 and state.read_at == 1000.0  # the last good read's time

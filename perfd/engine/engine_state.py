"""What the engine itself holds, read by the leading root from JetStream's API every ENGINE_STATE_S:
each stream's messages and bytes against its byte limit (past that limit the engine lets the oldest
messages go, lost to the jobs' analysis: the root counts those it finds gone only once it reads past
them), and each partition's durable consumer — node messages not yet delivered to a shard (the shards'
backlog), delivered and not acknowledged yet, delivered more than once. The figures are the engine's
own (what nats-server's monitoring /jsz shows); nothing here counts. On the root's /metrics
(perfd.exporters.engine_metrics) and in /api/stats ``engine.streams``; a root that does not lead holds
none (the leader's are the engine's, once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from perfd.engine import subjects as S
from perfd.engine.nats_api import JetStream

log = logging.getLogger("perfd.engine")

# The streams whose state is read (their engine names) -> the short name they are held and shown by
STREAMS = S.STREAM_LABELS
# How often the leader reads them: a Prometheus scrape's order (15 s), and 5 + partitions requests a
# read, which the engine answers from memory
ENGINE_STATE_S = 15.0
READ_TIMEOUT_S = 5.0  # one request's bound: a read that cannot be made keeps the last one, counted
# ... for so long: past it what was read is let go (absent, not served as the engine's state now)
STALE_AFTER_READS = 4


@dataclass(frozen=True)
class StreamState:
    messages: int
    bytes: int
    max_bytes: int | None  # None: the stream has no byte limit


@dataclass(frozen=True)
class ConsumerState:
    pending: int  # messages of its filter not delivered yet
    ack_pending: int  # delivered, not acknowledged
    redelivered: int  # delivered more than once and not acknowledged yet


@dataclass
class EngineState:
    """The last read (``read_at`` None: none made yet), and the reads that failed."""

    streams: dict[str, StreamState] = field(default_factory=dict)  # by STREAMS' short name
    consumers: dict[str, ConsumerState] = field(default_factory=dict)  # consumer name -> its state
    read_at: float | None = None  # epoch s
    read_errors: int = 0

    def to_json(self) -> dict[str, object]:
        return {"read_at": self.read_at, "read_errors": self.read_errors,
                "streams": {n: vars(s) for n, s in self.streams.items()},
                "consumers": {n: vars(c) for n, c in self.consumers.items()}}


def _limit(max_bytes: int | None) -> int | None:
    return max_bytes if max_bytes is not None and max_bytes > 0 else None  # -1: none


async def read_state(js: JetStream, partitions: int
                     ) -> tuple[dict[str, StreamState], dict[str, ConsumerState]]:
    """Every engine stream's state and every partition consumer's; a stream or consumer not made yet
    is left out (absent, not 0). Raises what the engine's API raised otherwise."""
    from nats.js.errors import NotFoundError

    streams: dict[str, StreamState] = {}
    for name, short in STREAMS.items():
        try:
            si = await asyncio.wait_for(js.stream_info(name), READ_TIMEOUT_S)
        except NotFoundError:
            continue
        streams[short] = StreamState(int(si.state.messages), int(si.state.bytes), _limit(si.config.max_bytes))
    consumers: dict[str, ConsumerState] = {}
    for p in range(partitions):
        name = S.shard_consumer(p)
        try:
            ci = await asyncio.wait_for(js.consumer_info(S.NODES_STREAM, name), READ_TIMEOUT_S)
        except NotFoundError:
            continue
        consumers[name] = ConsumerState(int(ci.num_pending or 0), int(ci.num_ack_pending or 0),
                                        int(ci.num_redelivered or 0))
    return streams, consumers


async def read_once(js: JetStream, partitions: int, state: EngineState, now: float) -> None:
    """One read into ``state`` at ``now`` (epoch s). One that fails keeps the last, counted and logged (the
    first, then once every ten), for STALE_AFTER_READS reads' time; past it the streams and consumers
    are let go (absent on /metrics: a frozen figure would hold an alert on, or off)."""
    try:
        state.streams, state.consumers = await read_state(js, partitions)
        state.read_at = now
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the engine away or slow: the session around this reconnects
        state.read_errors += 1
        if state.read_at is not None and now - state.read_at > STALE_AFTER_READS * ENGINE_STATE_S:
            state.streams, state.consumers = {}, {}
        if state.read_errors % 10 == 1:
            log.warning("engine: its streams' state could not be read (%s: %s; %d time(s)); the last read "
                        "stays served for %.0f s", type(exc).__name__, exc, state.read_errors,
                        STALE_AFTER_READS * ENGINE_STATE_S)


async def watch(js: JetStream, partitions: int, state: EngineState, over: asyncio.Event) -> None:
    """Read the engine's state into ``state`` now and every ENGINE_STATE_S until ``over`` is set (a
    cancel alone may be lost: perfd.core.phase says why)."""
    while not over.is_set():
        await read_once(js, partitions, state, time.time())
        try:
            await asyncio.wait_for(over.wait(), timeout=ENGINE_STATE_S)
        except asyncio.TimeoutError:
            pass

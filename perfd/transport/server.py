"""Aggregator side of the transport: a ``grpc.aio`` server, one bidi stream per agent.

It must be aio (DESIGN.md §3 "Transport"): a synchronous gRPC server holds a pool thread for the
whole life of each stream, and streams beyond the pool size wait seconds for their first reply.
One aio process held 1,000 streams there.

Delivery: each Batch is delivered to ``on_batch`` once per (agent_id, spool epoch, seq) and then
acknowledged cumulatively. A batch at or below the highest seq already accepted from that agent
is a duplicate (a resend after a reconnect): not delivered again, but acknowledged. A seq that
skips ahead (the agent's spool dropped its oldest batches at its cap, or lost its state) is
accepted and the gap counted. A batch that fails to decode, or whose delivery raises, is counted,
logged once per agent and acknowledged anyway, so one bad batch cannot make an agent resend it
forever.

Restart caveat: the dedupe state (:class:`SeqTracker`) lives in memory. An aggregator that
restarts without it (pass ``seq_state=SeqTracker.load(...)`` to keep it) can receive again the
batches it had delivered but not yet acknowledged when it died (at most the agent's window per
agent). Downstream keys step records by (job, iteration, rank), so their re-delivery is idempotent
there; a re-delivered sample repeats a (series, timestamp) point.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from perfd.transport.codec import (
    Command,
    DecodedBatch,
    HelloInfo,
    Series,
    command_to_pb,
    decode_batch,
    decode_hello,
)
from perfd.transport.gen import perfd_pb2 as pb

log = logging.getLogger(__name__)

OnBatch = Callable[[str, DecodedBatch], None]
OnHello = Callable[[HelloInfo], None]


def server_options(max_message_bytes: int = 64 << 20) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # Agents ping every 20 s to notice a dead network; let them, even when no data flows.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 0),
        # And notice dead agents ourselves, so their stream (and its registry entry) goes away.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),  # an idle agent sends no data: keep pinging it
    ]


class SeqTracker:
    """Highest accepted seq per agent and spool epoch: the dedupe state. Export it to keep it
    across an aggregator restart; a new epoch from an agent (its spool was lost) starts over."""

    def __init__(self, state: Mapping[str, tuple[str, int]] | None = None) -> None:
        self._last: dict[str, tuple[str, int]] = dict(state or {})

    def last(self, agent_id: str, epoch: str) -> int:
        e = self._last.get(agent_id)
        return e[1] if e is not None and e[0] == epoch else 0

    def advance(self, agent_id: str, epoch: str, seq: int) -> None:
        if seq > self.last(agent_id, epoch):
            self._last[agent_id] = (epoch, seq)

    def export(self) -> dict[str, tuple[str, int]]:
        return dict(self._last)

    @classmethod
    def load(cls, state: Mapping[str, tuple[str, int]]) -> SeqTracker:
        return cls(state)


class _Conn:
    """One agent stream's state, shared by its reader task and its response generator."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.agent_id: str | None = None
        self.epoch = ""
        self.series: dict[int, Series] = {}
        # Ids the Hello (re)defined, reported in the first delivered batch's new_series: after a
        # reconnect with a new spool epoch the same id may name another series.
        self.hello_ids: list[int] = []
        self.commands: deque[pb.Command] = deque()
        self.ack_due = 0
        self.ack_sent = -1  # so that the Ack answering the Hello goes out even when it is 0
        self.last_ack_at = 0.0
        self.closed = False
        self.wake = asyncio.Event()


class IngestServer:
    """``grpc.aio`` ingest server. ``on_batch(agent_id, batch)`` runs on the event loop for every
    batch: keep it synchronous and fast (append columns, update indexes), or hand off."""

    SERVICE = "perfd.v1.Ingest"

    def __init__(
        self,
        on_batch: OnBatch,
        on_hello: OnHello | None = None,
        *,
        seq_state: SeqTracker | None = None,
        ack_interval_s: float = 0.002,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        self._on_batch = on_batch
        self._on_hello = on_hello
        self.seq_state = seq_state if seq_state is not None else SeqTracker()
        self.ack_interval_s = ack_interval_s
        self._max_message_bytes = max_message_bytes
        self._server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, _Conn] = {}  # agent_id -> its newest stream (commands go there)
        self._agent_losses: dict[str, tuple[int, int]] = {}
        self._logged_errors: set[tuple[str, str]] = set()
        # Counters.
        self.streams_opened = 0
        self.batches = 0
        self.samples = 0
        self.steps = 0
        self.events = 0
        self.duplicates = 0
        self.gaps = 0
        self.gap_batches = 0
        self.decode_errors = 0
        self.deliver_errors = 0
        self.protocol_errors = 0
        self.commands_sent = 0
        self.commands_undeliverable = 0
        self.acks_sent = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind and start; returns the bound port (``port=0`` picks a free one)."""
        self._loop = asyncio.get_running_loop()
        server = grpc.aio.server(options=server_options(self._max_message_bytes))
        handler = grpc.stream_stream_rpc_method_handler(
            self._stream,
            request_deserializer=pb.AgentMessage.FromString,
            response_serializer=pb.AggregatorMessage.SerializeToString,
        )
        service = grpc.method_handlers_generic_handler(self.SERVICE, {"Stream": handler})
        server.add_generic_rpc_handlers((service,))
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        bound = server.add_insecure_port(addr)
        if not bound:
            raise OSError(f"could not bind the ingest server to {addr}")
        await server.start()
        self._server = server
        return int(bound)

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop accepting; give open streams ``grace`` seconds (None: cancel them now).

        Always call it before the event loop ends: a grpc.aio server that is still running when
        its loop closes can keep the interpreter from exiting (seen under pytest)."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    # ------------------------------------------------------------------ commands

    def send_command(self, agent_id: str, command: Command) -> bool:
        """Queue ``command`` to the agent's current stream. False (and counted) when that agent has
        no stream: a capture command is only meaningful now, so it is not kept for later.
        Safe to call from another thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                fut = asyncio.run_coroutine_threadsafe(self._send_command_async(agent_id, command), loop)
                return fut.result(timeout=5.0)
        return self._send_command_now(agent_id, command)

    async def _send_command_async(self, agent_id: str, command: Command) -> bool:
        return self._send_command_now(agent_id, command)

    def _send_command_now(self, agent_id: str, command: Command) -> bool:
        conn = self._streams.get(agent_id)
        if conn is None or conn.closed:
            self.commands_undeliverable += 1
            return False
        msg = command_to_pb(command)
        if not msg.id:
            msg.id = uuid.uuid4().hex[:12]
        conn.commands.append(msg)
        conn.wake.set()
        return True

    def connected_agents(self) -> list[str]:
        return sorted(a for a, c in self._streams.items() if not c.closed)

    # ------------------------------------------------------------------ the stream

    async def _stream(self, request_iterator: AsyncIterator[pb.AgentMessage],
                      context: Any) -> AsyncIterator[pb.AggregatorMessage]:
        loop = asyncio.get_running_loop()
        conn = _Conn(peer=str(context.peer()))
        self.streams_opened += 1
        reader = asyncio.create_task(self._read(request_iterator, conn))
        try:
            while True:
                await conn.wake.wait()
                conn.wake.clear()
                while conn.commands:
                    self.commands_sent += 1
                    yield pb.AggregatorMessage(command=conn.commands.popleft())
                if conn.agent_id is not None and conn.ack_due > conn.ack_sent:
                    # Acks coalesce: at most one per ack_interval_s per stream, and the next one
                    # covers every batch accepted meanwhile. Each message costs the server
                    # ~0.1 ms of gRPC machinery, so a busy agent should not get an Ack per batch.
                    # A sparse agent (one batch a second) still gets its Ack at once.
                    wait = conn.last_ack_at + self.ack_interval_s - loop.time()
                    if wait > 0 and not reader.done():
                        await asyncio.sleep(wait)
                    conn.last_ack_at = loop.time()
                    conn.ack_sent = conn.ack_due
                    self.acks_sent += 1
                    yield pb.AggregatorMessage(ack=pb.Ack(acked_seq=conn.ack_sent))
                if reader.done():
                    break
        finally:
            reader.cancel()
            if conn.agent_id is not None and self._streams.get(conn.agent_id) is conn:
                del self._streams[conn.agent_id]
        if not reader.cancelled() and reader.exception() is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(reader.exception()))

    async def _read(self, it: AsyncIterator[pb.AgentMessage], conn: _Conn) -> None:
        try:
            async for msg in it:
                which = msg.WhichOneof("msg")
                if which == "batch":
                    self._batch(conn, msg.batch)
                elif which == "hello":
                    self._hello(conn, msg.hello)
        finally:
            conn.closed = True
            conn.wake.set()

    def _hello(self, conn: _Conn, hello: pb.Hello) -> None:
        info = decode_hello(hello, conn.series, peer=conn.peer)
        conn.hello_ids = [d.id for d in hello.series]
        conn.agent_id, conn.epoch = info.agent_id, info.spool_epoch
        self._streams[info.agent_id] = conn  # a newer stream replaces one not yet seen to be dead
        # Tell the agent what we already hold, so it does not resend batches whose Ack was lost.
        conn.ack_due = max(conn.ack_due, self.seq_state.last(info.agent_id, info.spool_epoch))
        conn.ack_sent = -1
        conn.wake.set()
        if self._on_hello is not None:
            try:
                self._on_hello(info)
            except Exception:
                log.exception("on_hello failed for agent %s", info.agent_id)

    def _batch(self, conn: _Conn, b: pb.Batch) -> None:
        agent = conn.agent_id
        if agent is None:
            self.protocol_errors += 1
            raise ValueError("Batch before Hello")
        seq = b.seq
        last = self.seq_state.last(agent, conn.epoch)
        if seq <= last:
            self.duplicates += 1
        else:
            if last and seq > last + 1:
                self.gaps += 1
                self.gap_batches += seq - last - 1
            self._deliver(agent, conn, b)
            self.seq_state.advance(agent, conn.epoch, seq)
        conn.ack_due = max(conn.ack_due, self.seq_state.last(agent, conn.epoch))
        conn.wake.set()

    def _deliver(self, agent: str, conn: _Conn, b: pb.Batch) -> None:
        try:
            decoded = decode_batch(b, conn.series)
            if conn.hello_ids:
                decoded.new_series = conn.hello_ids + decoded.new_series
                conn.hello_ids = []
        except Exception as e:
            self.decode_errors += 1
            self._log_once(agent, "decode", f"batch {b.seq} from agent {agent} failed to decode "
                           f"({e}); counted and acknowledged")
            return
        try:
            self._on_batch(agent, decoded)
        except Exception as e:
            self.deliver_errors += 1
            self._log_once(agent, "deliver", f"on_batch raised for batch {b.seq} of agent {agent}: {e!r}; "
                           "counted and acknowledged")
            return
        self.batches += 1
        self.samples += len(decoded.values)
        self.steps += len(decoded.steps)
        self.events += len(decoded.events)
        if decoded.dropped_batches or decoded.dropped_samples:
            self._agent_losses[agent] = (decoded.dropped_batches, decoded.dropped_samples)

    def _log_once(self, agent: str, kind: str, text: str) -> None:
        if (agent, kind) not in self._logged_errors:
            self._logged_errors.add((agent, kind))
            log.error("%s (further ones from this agent are only counted)", text)

    # ------------------------------------------------------------------ counters

    def counters(self) -> dict[str, int]:
        return {
            "agents_connected": len(self.connected_agents()),
            "streams_opened": self.streams_opened,
            "batches": self.batches,
            "samples": self.samples,
            "steps": self.steps,
            "events": self.events,
            "duplicates": self.duplicates,
            "gaps": self.gaps,
            "gap_batches": self.gap_batches,
            "decode_errors": self.decode_errors,
            "deliver_errors": self.deliver_errors,
            "protocol_errors": self.protocol_errors,
            "commands_sent": self.commands_sent,
            "commands_undeliverable": self.commands_undeliverable,
            "acks_sent": self.acks_sent,
            # What the agents report their spools dropped (latest figure per agent, summed).
            "agent_dropped_batches": sum(v[0] for v in self._agent_losses.values()),
            "agent_dropped_samples": sum(v[1] for v in self._agent_losses.values()),
        }

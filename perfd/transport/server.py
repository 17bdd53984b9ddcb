"""Aggregator side of the transport: a ``grpc.aio`` server, one bidi stream per agent.

It must be aio (docs/design.md §3 "Transport"): a synchronous gRPC server holds a pool thread for the
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
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

import grpc

from perfd.core import limits as L
from perfd.core.refusals import Refusals
from perfd.transport.admission import (
    Backlog,
    StreamRefused,
    admit_stream,
    authenticate,
    check_agent_id,
    check_liveness,
    check_token,
    refuse_stream,
    trim_batch,
)
from perfd.transport.codec import (
    AdmitSeries,
    Command,
    DecodedBatch,
    HelloInfo,
    command_to_pb,
    decode_batch,
)
from perfd.transport.delivery import IngestJournal, Kept, SeqTracker
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.grpc_api import Server, ServicerContext
from perfd.transport.grpc_bind import bind, server_options
from perfd.transport.hello_tables import SeriesTables
from perfd.transport.security import UNAUTHENTICATED_PREFIX, IdentityPolicy, ServerTls, TokenFile
from perfd.transport.series import Series
from perfd.transport.stream import AgentStream

log = logging.getLogger(__name__)

# The receiver says what it kept of a batch (None: all of it) and which jobs of a Hello it admitted
# (None: all): the journal stores only those.
OnBatch = Callable[[str, DecodedBatch], Kept | None]
OnHello = Callable[[HelloInfo], Sequence[str] | None]
OnStreamEnd = Callable[[str], None]  # the agent whose live stream ended (it may come back)
# (agent id, series id, definition) -> whether the series is held (the aggregator's caps). A refused
# definition is kept nowhere: its samples are dropped as samples of an undefined id.
SeriesAdmission = Callable[[str, int, Series], bool]


class IngestServer:
    """``grpc.aio`` ingest server. ``on_batch(agent_id, batch)`` runs on the event loop for every
    batch: keep it synchronous and fast (append columns, update indexes), or hand off.

    Security (docs/reliability.md): with ``token`` every stream must carry ``authorization:
    Bearer <token>`` metadata; with ``tls`` the port speaks TLS (mutual when it names a client
    CA). Each agent id is bound to the identity of its first stream (perfd.transport.security):
    another identity claiming it is refused and counted. Without any credentials the binding holds
    while the bound stream is open (the peer's address is all there is to go on)."""

    SERVICE = "perfd.v1.Ingest"

    def __init__(
        self,
        on_batch: OnBatch,
        on_hello: OnHello | None = None,
        *,
        seq_state: SeqTracker | None = None,
        ack_interval_s: float = L.ACK_INTERVAL_S,
        max_message_bytes: int | None = None,
        tls: ServerTls | None = None,
        token: TokenFile | None = None,
        limits: L.Limits | None = None,
        refusals: Refusals | None = None,
        journal: IngestJournal | None = None,
        admit_series: SeriesAdmission | None = None,
        policy: IdentityPolicy | None = None,
        on_stream_end: OnStreamEnd | None = None,
    ) -> None:
        self._on_batch = on_batch
        self._on_stream_end = on_stream_end
        self.admit_series = admit_series
        self.policy = policy
        self.journal = journal
        self._on_hello = on_hello
        self.seq_state = seq_state if seq_state is not None else SeqTracker()
        self.ack_interval_s = ack_interval_s
        self.limits = limits if limits is not None else L.Limits()
        if max_message_bytes is not None:
            self.limits.max_message_bytes = max_message_bytes
        self.tls = tls
        self.token = token
        self.refusals = refusals if refusals is not None else Refusals()
        self._server: Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, AgentStream] = {}  # agent_id -> its live stream (commands go there)
        self._identities: dict[str, str] = {}  # agent_id -> the identity it is bound to
        self._tables = SeriesTables()  # each agent's series table, kept for its next Hello
        self._open = 0
        self._conns: set[AgentStream] = set()  # open streams, for the one liveness task
        self.backlog = Backlog()  # how far behind admission runs (perfd.transport.admission)
        self._liveness_task: asyncio.Task[None] | None = None
        # How late the liveness task woke at its last tick: how far behind the event loop runs.
        self.loop_lag_s = 0.0
        self._agent_losses: dict[str, tuple[int, int]] = {}
        # What other threads (the HTTP server's) read of the tables above: never the tables
        # themselves, which the event loop changes while they iterate ("dictionary changed size
        # during iteration", HTTP 500 under stream churn), but this immutable view the loop
        # replaces whole at every liveness tick: (live agents, dropped batches, dropped samples).
        self._published: tuple[tuple[str, ...], int, int] = ((), 0, 0)
        self._loop_thread: int | None = None
        self._stopping = False  # begin_stop(): nothing more is delivered
        self._logged_errors: set[tuple[str, str]] = set()
        # Counters.
        self.streams_opened = 0
        self.streams_superseded = 0
        self.streams_closed_token_rotated = 0
        self.heartbeats = 0
        self.batches = 0
        self.samples = 0
        self.steps = 0
        self.events = 0
        self.event_bytes_cut = 0  # of events kept cut (perfd.core.events.cut), before they were journalled
        self.duplicates = 0
        self.gaps = 0
        self.gap_batches = 0
        self.decode_errors = 0
        self.deliver_errors = 0
        self.protocol_errors = 0
        self.commands_sent = 0
        self.commands_undeliverable = 0
        self.acks_sent = 0
        self.store_failures = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str = L.LOOPBACK, port: int = 0) -> int:
        """Bind and start; returns the bound port (``port=0`` picks a free one). Raises OSError
        when the address cannot be bound (in use, not local): no port sharing."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        server = grpc.aio.server(options=server_options(self.limits.max_message_bytes))
        handler = grpc.stream_stream_rpc_method_handler(
            self._stream,
            request_deserializer=pb.AgentMessage.FromString,
            response_serializer=pb.AggregatorMessage.SerializeToString,
        )
        service = grpc.method_handlers_generic_handler(self.SERVICE, {"Stream": handler})
        server.add_generic_rpc_handlers((service,))
        bound = await bind(server, host, port, self.tls)
        await server.start()
        self._server = server
        self._liveness_task = asyncio.create_task(self._liveness_loop())
        return bound

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop accepting; give open streams ``grace`` seconds (None: cancel them now).

        Always call it before the event loop ends: a grpc.aio server that is still running when
        its loop closes can keep the interpreter from exiting (seen under pytest)."""
        self.begin_stop()
        for conn in list(self._conns):
            conn.close(grpc.StatusCode.UNAVAILABLE, "the aggregator is shutting down; resend what is "
                       "not acknowledged")
        if self._liveness_task is not None:
            self._liveness_task.cancel()
            self._liveness_task = None
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    def begin_stop(self) -> None:
        """Deliver nothing more from now on; the streams end at their next message. One flag, so a
        signal handler may call it. Under a flood of batches the loop otherwise spent stop()'s
        grace, and seconds after it (8.9 s measured), delivering batches no Ack would cover: the
        agents resend them anyway, from their spools."""
        self._stopping = True

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    # ------------------------------------------------------------------ commands

    def send_command(self, agent_id: str, command: Command) -> bool:
        """Queue ``command`` to the agent's live stream (the one bound to the agent's identity).
        False (and counted) when that agent has none: a capture command is only meaningful now,
        so it is not kept for later. Safe to call from another thread. A command that cannot be
        encoded raises here, to its sender (encoded on the loop, the error reached only the loop's log
        while the sender took it as sent: a capture stayed "requested" holding its ranks)."""
        msg = command_to_pb(command)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                # From another thread (the rules tick runs in an executor): the command is handed to
                # the loop, which owns the streams, and never waited on. Waiting (5 s, before) raised
                # TimeoutError out of the tick whenever the loop was busy that long under load: the
                # rule had fired and its capture was never requested. A stream that closes before the
                # loop runs the hand-over counts the command undeliverable there.
                conn = self._streams.get(agent_id)
                if conn is None or conn.closed:
                    loop.call_soon_threadsafe(self._count_undeliverable)
                    return False
                loop.call_soon_threadsafe(self._send_command_now, agent_id, msg)
                return True
        return self._send_command_now(agent_id, msg)

    def _count_undeliverable(self) -> None:
        self.commands_undeliverable += 1

    def _send_command_now(self, agent_id: str, msg: pb.Command) -> bool:
        conn = self._streams.get(agent_id)
        if conn is None or conn.closed:
            self.commands_undeliverable += 1
            return False
        if not msg.id:
            msg.id = uuid.uuid4().hex[:12]
        conn.commands.append(msg)
        conn.wake.set()
        return True

    def _live(self, conn: AgentStream, now: float) -> bool:
        return not conn.closed and now - conn.last_msg_at <= self.limits.agent_silence_s

    def _view(self) -> tuple[tuple[str, ...], int, int]:
        """(live agents, dropped batches, dropped samples): computed on the event loop's thread
        (the owner of the tables), else the view it last published (at most a tick old)."""
        loop = self._loop
        if threading.get_ident() != self._loop_thread or loop is None or loop.is_closed():
            return self._published
        now = loop.time()
        return (tuple(a for a, c in self._streams.items() if self._live(c, now)),
                sum(v[0] for v in self._agent_losses.values()),
                sum(v[1] for v in self._agent_losses.values()))

    def _publish(self) -> None:
        self._published = self._view()  # one reference swap: a reader sees the old or the new view

    def connected_agents(self) -> list[str]:
        """Agents whose stream carried a message (each one acknowledged) within the silence
        limit: an open socket alone does not count. Safe from any thread (see _view)."""
        return sorted(self._view()[0])

    # ------------------------------------------------------------------ the stream

    async def _stream(self, request_iterator: AsyncIterator[pb.AgentMessage],
                      context: ServicerContext) -> AsyncIterator[pb.AggregatorMessage]:
        loop = asyncio.get_running_loop()
        try:
            identity, token_gen = authenticate(context, self.token)  # and the token's generation
            admit_stream(self._open, self.loop_lag_s, self.limits, *self.backlog.now(loop.time()))
        except StreamRefused as exc:
            self.refusals.refuse(exc.reason, str(exc))
            await refuse_stream(context, request_iterator, exc)
            return
        conn = AgentStream(str(context.peer()), identity, loop.time(), token_gen)
        self.backlog.opened(conn)
        self._open += 1
        self.streams_opened += 1
        reader = asyncio.create_task(self._read(request_iterator, conn))
        self._conns.add(conn)  # the liveness task closes (and wakes) it when it goes silent
        try:
            while True:
                # No timeout here: a wait_for per stream per tick is a task each, thousands a
                # second at 2,000 agents; one task checks every stream's liveness instead.
                await conn.wake.wait()
                conn.wake.clear()
                if conn.closed:
                    break
                while conn.commands:
                    self.commands_sent += 1
                    yield pb.AggregatorMessage(command=conn.commands.popleft())
                if conn.agent_id is not None and (conn.ack_due > conn.ack_sent or conn.ack_forced):
                    # Acks coalesce: at most one per ack_interval_s per stream, covering every
                    # batch accepted meanwhile — each message costs the server its gRPC machinery
                    # (at 1,000 agents sending a batch a second, an Ack per batch was ~11% of the
                    # aggregator's CPU). A Heartbeat (what the agent sends to flush) and the end of
                    # the stream are answered at once; commands never wait (a timer, not a sleep).
                    if (not conn.ack_forced and not reader.done()
                            and not conn.ack_now(loop, self.ack_interval_s)):
                        continue
                    if self.journal is not None:
                        # Acknowledge only what is on disk: a failed commit (this one, or one of the
                        # rules thread's in the shared transaction) took this agent's rows if it
                        # had any pending; its stream is then closed and nothing acknowledged. An
                        # agent with nothing pending is acknowledged whatever happened to others.
                        self.journal.commit()
                        if not self._durable(conn, conn.agent_id):
                            break
                    conn.last_ack_at = loop.time()
                    conn.ack_sent = max(conn.ack_sent, conn.ack_due)
                    self.backlog.answered(conn, loop.time())
                    conn.ack_forced = False
                    self.acks_sent += 1
                    yield pb.AggregatorMessage(ack=pb.Ack(acked_seq=max(conn.ack_sent, 0)))
                if reader.done():
                    break
        finally:
            if conn.ack_timer is not None:
                conn.ack_timer.cancel()
            self._open -= 1
            self.backlog.closed(conn)
            self._conns.discard(conn)
            reader.cancel()
            if conn.agent_id is not None and self._streams.get(conn.agent_id) is conn:
                del self._streams[conn.agent_id]
                if self._on_stream_end is not None:
                    try:
                        self._on_stream_end(conn.agent_id)
                    except Exception:
                        log.exception("on_stream_end failed for agent %s", conn.agent_id)
        if conn.close_reason is not None:
            await context.abort(*conn.close_reason)
        if not reader.cancelled() and reader.exception() is not None:
            err = reader.exception()
            if isinstance(err, StreamRefused):
                await context.abort(err.code, str(err))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))

    async def _liveness_loop(self) -> None:
        """Every open stream's liveness, checked at least every tick (one task for all)."""
        loop = asyncio.get_running_loop()
        tick = max(0.05, min(1.0, self.limits.agent_silence_s / 4, self.limits.hello_timeout_s / 4))
        while True:
            before = loop.time()
            await asyncio.sleep(tick)
            now = loop.time()
            self.loop_lag_s = max(0.0, now - before - tick)
            self.backlog.tick(now)  # this task runs on the loop's thread: the loop's business
            gen = self.token.current()[1] if self.token is not None else None  # one stat a tick
            for conn in list(self._conns):
                check_liveness(conn, now, self.limits, self.refusals)
                self.streams_closed_token_rotated += check_token(conn, gen, self.refusals)
            self._publish()

    def _durable(self, conn: AgentStream, agent: str) -> bool:
        """False when writes of ``agent`` not yet acknowledged were lost (a failed commit): the
        dedupe state goes back to what is on disk (so the resend is accepted), ``conn`` is closed
        (the agent resends from its spool on a new stream) and nothing more is acknowledged."""
        j = self.journal
        if j is None or not j.lost(agent):
            return True
        state = j.recover(agent)
        self.seq_state.reset(agent, state)
        conn.ack_due = min(conn.ack_due, state[1] if state is not None and state[0] == conn.epoch else 0)
        self.store_failures += 1
        conn.close(grpc.StatusCode.UNAVAILABLE, "the aggregator could not make the batches durable "
                   "(its --state-dir); resend")
        return False

    async def _read(self, it: AsyncIterator[pb.AgentMessage], conn: AgentStream) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for msg in it:
                if conn.closed or self._stopping:  # closed under it (lost writes, superseded), or stopping
                    break
                conn.last_msg_at = loop.time()
                which = msg.WhichOneof("msg")
                if which == "batch":
                    self._batch(conn, msg.batch)
                elif which == "hello":
                    self._hello(conn, msg.hello)
                elif which == "heartbeat":
                    self.heartbeats += 1
                    conn.ack_forced = conn.agent_id is not None
                    conn.wake.set()
        finally:
            conn.closed = True
            conn.wake.set()

    @property
    def hellos_reused(self) -> int:
        """Hellos byte for byte the same as the agent's last (a reconnect): its table taken over."""
        return self._tables.reused

    def identity_of(self, agent_id: str) -> str | None:
        """The identity ``agent_id`` is bound to (None before its first stream)."""
        return self._identities.get(agent_id)

    def live(self, agent_id: str) -> bool:
        """The agent has an open stream now. Event-loop thread only."""
        conn = self._streams.get(agent_id)
        return conn is not None and not conn.closed

    def forget_agent(self, agent_id: str) -> None:
        """The aggregator forgot the agent (gone long enough, perfd.aggregator.retention): its series
        table goes (its next Hello is decoded and admitted afresh), and so does the binding of its id
        to a client without credentials, which lasted only while its stream was open anyway. A
        credential's binding stays. Its dedupe seq leaves memory where the journal keeps it (read
        back if the agent comes back): an aggregator with a state dir meets a new agent id with every
        job's sidecar, and held each one's for its life. Event-loop thread only; nothing happens while
        it has a stream."""
        if self.live(agent_id):
            return
        self._tables.forget(agent_id)
        self._agent_losses.pop(agent_id, None)
        self._logged_errors.difference_update({(agent_id, "decode"), (agent_id, "deliver")})
        if self.journal is not None:  # its dedupe seq is on disk, read back if it comes back (_hello)
            self.seq_state.reset(agent_id, None)
        if self._identities.get(agent_id, "").startswith(UNAUTHENTICATED_PREFIX):
            del self._identities[agent_id]

    def _bind(self, conn: AgentStream, agent_id: str) -> None:
        """Bind ``agent_id`` to this stream's identity, or refuse (see the class docstring)."""
        live = self._streams.get(agent_id)
        check_agent_id(self.policy, conn, agent_id, self._identities.get(agent_id), live)
        self._identities[agent_id] = conn.identity
        if live is not None and live is not conn and not live.closed:
            # The same agent again (a reconnect after a cut the old stream has not noticed yet):
            # the newer stream wins and the older one is closed at once.
            self.streams_superseded += 1
            live.close(grpc.StatusCode.ABORTED, "superseded by a newer stream of the same agent")
        self._streams[agent_id] = conn

    def _hello(self, conn: AgentStream, hello: pb.Hello) -> None:
        if conn.agent_id is not None:
            self.protocol_errors += 1
            raise ValueError("a second Hello on one stream")
        if not hello.agent_id or len(hello.agent_id.encode()) > L.MAX_JOB_NAME_BYTES:
            self.protocol_errors += 1
            raise ValueError("Hello without a usable agent_id")
        if len(hello.series) > self.limits.max_series_per_agent:
            refused = StreamRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, L.REFUSED_SERIES,
                                    f"agent {hello.agent_id[:64]} defines {len(hello.series)} series "
                                    f"(cap {self.limits.max_series_per_agent})")
            self.refusals.refuse(refused.reason, str(refused), len(hello.series), agent=hello.agent_id)
            raise refused
        try:
            self._bind(conn, hello.agent_id)
        except StreamRefused as exc:
            self.refusals.refuse(exc.reason, str(exc))
            raise
        info = self._tables.take(conn, hello, self._admitter(hello.agent_id), self.limits.max_streams)
        conn.agent_id, conn.epoch = info.agent_id, info.spool_epoch
        self.backlog.heard(conn)
        if self.journal is not None and (self.journal.lost(info.agent_id)
                                         or not self.seq_state.known(info.agent_id)):
            # its older stream had lost writes, or it was forgotten (forget_agent): start from disk
            self.seq_state.reset(info.agent_id, self.journal.recover(info.agent_id))
        # Tell the agent what we already hold, so it does not resend batches whose Ack was lost.
        conn.ack_due = max(conn.ack_due, self.seq_state.last(info.agent_id, info.spool_epoch))
        conn.ack_sent = -1
        conn.wake.set()
        admitted: Sequence[str] | None = None
        if self._on_hello is not None:
            try:
                admitted = self._on_hello(info)
            except Exception:
                log.exception("on_hello failed for agent %s", info.agent_id)
                admitted = ()
        if self.journal is not None:  # what the Hello was given, not what it asked
            self.journal.hello(info.agent_id, list(hello.jobs) if admitted is None else list(admitted))

    def _batch(self, conn: AgentStream, b: pb.Batch) -> None:
        agent = conn.agent_id
        if agent is None:
            self.protocol_errors += 1
            raise ValueError("Batch before Hello")
        if not self._durable(conn, agent):
            return
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
            if self.journal is not None:
                self.journal.seq(agent, conn.epoch, seq)
        conn.ack_due = max(conn.ack_due, self.seq_state.last(agent, conn.epoch))
        # The Ack's time is known now: a timer wakes the stream then, rather than a wake per batch
        # that finds the Ack not yet due (a task step per batch for nothing).
        if conn.ack_now(asyncio.get_running_loop(), self.ack_interval_s):
            conn.wake.set()

    def _admitter(self, agent: str) -> AdmitSeries | None:
        admit = self.admit_series
        return None if admit is None else (lambda sid, s: admit(agent, sid, s))

    def _deliver(self, agent: str, conn: AgentStream, b: pb.Batch) -> None:
        if (cut := trim_batch(agent, conn, b, self.limits, self.refusals)) is None:
            return
        self.event_bytes_cut += cut
        try:
            decoded = decode_batch(b, conn.series, self._admitter(agent) if b.series else None)
            if conn.hello_ids:
                decoded.new_series = conn.hello_ids + decoded.new_series
                conn.hello_ids = []
        except Exception as e:
            self.decode_errors += 1
            self._log_once(agent, "decode", f"batch {b.seq} from agent {agent} failed to decode "
                           f"({e}); counted and acknowledged")
            return
        try:
            kept = self._on_batch(agent, decoded)
        except Exception as e:
            self.deliver_errors += 1
            self._log_once(agent, "deliver", f"on_batch raised for batch {b.seq} of agent {agent}: {e!r}; "
                           "counted and acknowledged")
            return
        if self.journal is not None:
            self.journal.batch(agent, b, kept)
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
        """Every counter; safe from any thread (the tables through _view, the rest are ints)."""
        live, dropped_batches, dropped_samples = self._view()
        return {
            "agents_connected": len(live),
            "streams_opened": self.streams_opened,
            "streams_superseded": self.streams_superseded,
            "streams_closed_token_rotated": self.streams_closed_token_rotated,
            "hellos_reused": self._tables.reused,
            "heartbeats": self.heartbeats,
            "batches": self.batches,
            "samples": self.samples,
            "steps": self.steps,
            "events": self.events, "event_bytes_cut": self.event_bytes_cut,
            "duplicates": self.duplicates,
            "gaps": self.gaps,
            "gap_batches": self.gap_batches,
            "decode_errors": self.decode_errors,
            "deliver_errors": self.deliver_errors,
            "protocol_errors": self.protocol_errors,
            "commands_sent": self.commands_sent,
            "commands_undeliverable": self.commands_undeliverable,
            "acks_sent": self.acks_sent,
            "loop_lag_ms": round(self.loop_lag_s * 1000),
            "streams_opening": self.backlog.opening(),
            "loop_busy_pct": round(100 * self.backlog.busy),
            "store_failures": self.store_failures,
            # What the agents report their spools dropped (latest figure per agent, summed).
            "agent_dropped_batches": dropped_batches,
            "agent_dropped_samples": dropped_samples,
        }

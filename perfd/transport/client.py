"""Agent side of the transport: spool every batch, keep one bidi stream, resend until acknowledged.

``submit()`` is cheap and never blocks on the network: it encodes the batch, gives it the next
sequence number and appends it to the :class:`~perfd.transport.spool.Spool`. ``run()`` is a
long-lived task that keeps one stream to the aggregator: Hello (with the whole series table),
then the spooled batches in order with at most ``window`` unacknowledged on the wire. Cumulative
Acks drop batches from the spool. After any failure (aggregator dead, stream broken, keepalive
timeout) it reconnects with exponential backoff and jitter and resends everything unacknowledged;
the aggregator dedupes on (agent, spool epoch, seq). ``run()`` only ever ends by cancellation.

``submit()`` may be called from other threads (collectors run in threads): the spool is guarded
by a lock and the stream task is woken through the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

import grpc

from perfd import __version__
from perfd.core import limits as L
from perfd.core.model import CollectiveRecord, Sample, StepRecord
from perfd.core.phase import Phase
from perfd.transport.codec import (
    Command,
    command_from_pb,
    encode_batch,
    encode_hello,
    frame_batch,
    sample_count,
)
from perfd.transport.dispatch import CommandTarget
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.grpc_api import AgentCall
from perfd.transport.security import AUTH_HEADER, ClientTls, TokenFile
from perfd.transport.series import SeriesTable
from perfd.transport.spool import Spool
from perfd.transport.wakeup import wake

log = logging.getLogger(__name__)

STREAM_METHOD = "/perfd.v1.Ingest/Stream"


def _passthrough(b: bytes) -> bytes:
    return b  # every request is serialized before it is written (batches come framed from the spool)


def channel_options(max_message_bytes: int = L.MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    ms = 1000
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # A network cut without RST would otherwise leave the stream "open" for the kernel's TCP
        # timeout (minutes): ping every KEEPALIVE_TIME_S and give up after KEEPALIVE_TIMEOUT_S.
        ("grpc.keepalive_time_ms", int(L.KEEPALIVE_TIME_S * ms)),
        ("grpc.keepalive_timeout_ms", int(L.KEEPALIVE_TIMEOUT_S * ms)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # We reconnect with our own backoff and a fresh channel: no hidden channel-level backoff.
        ("grpc.initial_reconnect_backoff_ms", 500),
        ("grpc.max_reconnect_backoff_ms", 30_000),
        ("grpc.enable_retries", 0),
        # A fresh channel must mean a fresh TCP connection: with gRPC's global subchannel pool a
        # new channel to the same target reuses the old connection, half-open one included.
        ("grpc.use_local_subchannel_pool", 1),
    ]


class AckTimeout(Exception):
    """No acknowledgement (Ack or command) from the aggregator within the ack timeout."""


class StreamEnded(Exception):
    """The status the aggregator ended a stream with, when a write on it failed first: a write
    to a stream the server already closed fails with INTERNAL ("Internal error from Core") or "RPC
    already finished", which names no reason; the call's own status does (UNAUTHENTICATED, ...),
    and its metadata says when a refused agent may come back (L.RETRY_AFTER_KEY): ``trailers``, and
    ``initial`` (the initial metadata, where the aggregator sends the hint as well: below)."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 trailers: tuple[tuple[str, str | bytes], ...] = (),
                 initial: tuple[tuple[str, str | bytes], ...] = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details, self.trailers, self.initial = code, details, trailers, initial


def reconnect_wait(hint: float | None, delay: float, draw: float) -> float:
    """Seconds to wait before the next stream, ``draw`` uniform in [0, 1). Refused with a ``hint`` (the
    aggregator is saturated and said when to come back): that long, jittered to 0.5-1.5 of it so the
    refused do not return together; it paces the refused by how long its overload has lasted, and the
    agent's own backoff would only add. Otherwise the backoff's ``delay`` jittered to [delay/2, delay],
    so that a thousand agents that lost the same aggregator do not reconnect in lockstep."""
    if hint is not None:
        return hint * (0.5 + draw)
    return delay * (0.5 + draw / 2)


def retry_after(e: BaseException) -> float | None:
    """When the aggregator that refused a stream said to come back (seconds; perfd.core.limits.RETRY_AFTER_KEY
    in the trailing metadata, or in the initial metadata), within MAX_RETRY_AFTER_S; None when it did not
    say.

    Why the initial metadata too: grpcio's asyncio client (1.85; grpc/grpc#36066) replaces the status a
    server ended the stream with — its trailers with it — by INTERNAL "Internal error from Core" when
    a write failing on the closed stream is handled after that status arrived, which a busy agent's loop
    does (13 of 1,200 refused streams with four busy loops beside, 2026-11-30). The initial metadata is
    kept, and the aggregator sends its hint there before it refuses (transport.admission.refuse_stream)."""
    if isinstance(e, grpc.aio.AioRpcError):
        metas = (e.trailing_metadata(), e.initial_metadata())
    elif isinstance(e, StreamEnded):  # the refusal came back through a failed write
        metas = (e.trailers, e.initial)
    else:
        return None
    for meta in metas:
        for key, value in meta or ():
            if key == L.RETRY_AFTER_KEY:
                try:
                    return min(L.MAX_RETRY_AFTER_S, max(0.0, int(value) / 1000))
                except (TypeError, ValueError):
                    return None
    return None


async def _ended_with(call: AgentCall) -> StreamEnded | None:
    try:
        code = await asyncio.wait_for(call.code(), 2.0)
        details = await call.details()
    except Exception:  # no status in time, or none to read: the write's own error stands
        return None
    try:
        trailers = tuple(await call.trailing_metadata() or ())
    except Exception:  # the status stands without its trailers (then the hint from the initial metadata)
        trailers = ()
    try:
        initial = tuple(await call.initial_metadata() or ())
    except Exception:
        initial = ()
    if code in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
        return None
    return StreamEnded(code, str(details or ""), trailers, initial)


class AgentClient(CommandTarget):
    """One agent's connection to the aggregator. Create, ``asyncio.create_task(client.run())``,
    call ``submit()`` as data arrives; cancel the task and ``close()`` on shutdown."""

    def __init__(
        self,
        target: str,
        agent_id: str,
        *,
        spool: Spool | None = None,
        node: str = "",
        jobs: Iterable[str] = (),
        capabilities: Mapping[str, str] | None = None,
        version: str = __version__,
        window: int = L.AGENT_WINDOW,
        on_command: Callable[[Command], object] | None = None,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        max_series: int = L.MAX_SERIES_PER_AGENT,
        max_batch_bytes: int = L.MAX_BATCH_BYTES,
        grpc_options: Sequence[tuple[str, int | str]] | None = None,
        tls: ClientTls | None = None,
        token: TokenFile | None = None,
        heartbeat_s: float = L.HEARTBEAT_S,
        ack_timeout_s: float = L.ACK_TIMEOUT_S,
    ) -> None:
        self.target = target
        self.agent_id = agent_id
        self.spool = spool if spool is not None else Spool(None)
        self.table = SeriesTable(self.spool.directory / "series.jsonl" if self.spool.directory else None)
        self.node = node
        self.jobs = list(jobs)
        self.capabilities = dict(capabilities or {})
        self.version = version
        self.window = max(1, window)
        self.on_command = on_command
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.max_series = max_series
        self.max_batch_bytes = max_batch_bytes
        self._grpc_options: list[tuple[str, int | str]] = (list(grpc_options) if grpc_options is not None
                                                           else list(channel_options()))
        self.tls = tls
        self.token = token
        self.heartbeat_s = heartbeat_s
        self.ack_timeout_s = ack_timeout_s
        self._last_heard = 0.0  # loop time the aggregator last sent anything on this stream
        self._lock = threading.Lock()  # guards spool and table: submit() may run on other threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        # Set by close(): run() ends at its next round even where its cancel was lost (perfd.core.phase)
        self._closed = False
        self._inflight: deque[int] = deque()  # seqs sent on this stream and not yet acknowledged
        self._last_sent = 0
        self._max_sent = 0  # highest seq ever sent, across streams: anything at or below is a resend
        self._tasks: set[asyncio.Future[object]] = set()
        self._answered = False  # the aggregator has sent something on the current stream
        # flush() wants its Acks now: the aggregator coalesces Acks (one per stream every couple of
        # seconds) but answers a Heartbeat at once.
        self._want_ack = False
        self._asked_for = -1  # the newest seq in flight when a full window last asked for an Ack
        # Counters for the agent's own /metrics.
        # True from the first acknowledgement of a stream until ack_timeout_s pass without one, or
        # the stream ends: it follows acknowledgements, not the socket.
        self.connected = False
        self.ack_timeouts = 0
        self.heartbeats_sent = 0
        self.connects = 0
        self.reconnects = 0
        self.batches_submitted = 0
        self.batches_sent = 0
        self.batches_acked = 0
        self.resent = 0  # sends of a seq already sent by this process (after a reconnect)
        self.commands_received = 0
        self.command_errors = 0
        self.stream_errors = 0
        self.retry_after_s: float | None = None  # when the aggregator said to come back (a refusal)
        self.last_error = ""

    # ------------------------------------------------------------------ producer side

    def submit(
        self,
        samples: Iterable[Sample] = (),
        steps: Iterable[StepRecord] = (),
        events: Iterable[Mapping[str, object]] = (),
        *,
        columns: tuple[Sequence[int], Sequence[int], Sequence[float]] | None = None,
        job_info_json: Mapping[str, str] | None = None,
        collectives: Iterable[CollectiveRecord] = (),
        on_seq: Callable[[int], object] | None = None,
    ) -> int:
        """Encode and spool one batch; returns its seq (0 if there was nothing to send).

        ``on_seq(seq)`` runs under the client's lock once the batch has its seq, just before it
        enters the spool (the agent's collector checkpoints pend on it: perfd.agent.checkpoints).

        ``columns`` = (series_ids, timestamps_ns, values) with ids from ``client.series_id()``:
        the cheap path for collectors with fixed series. Raises ValueError for a batch larger
        than ``max_batch_bytes`` (the aggregator would refuse it forever): submit smaller ones.
        """
        with self._lock:
            if len(self.table) > self.max_series and self.spool.pending_count() == 0:
                # Series churn (jobs come and go) would grow the table, and every Hello, without
                # bound. With nothing pending no spooled batch refers to an id: start over.
                self.table.clear()
            seq = self.spool.next_seq()
            batch = encode_batch(self.agent_id, seq, samples, steps, events, self.table, columns=columns,
                                 job_info_json=job_info_json, dropped_batches=self.spool.dropped_batches,
                                 dropped_samples=self.spool.dropped_samples, collectives=collectives)
            if not (batch.values_le or batch.steps or batch.events or batch.job_info_json or batch.series
                    or batch.collectives):
                return 0
            data = batch.SerializeToString()
            if len(data) > self.max_batch_bytes:
                self.table.untake([d.id for d in batch.series])
                raise ValueError(f"batch of {len(data)} bytes exceeds max_batch_bytes={self.max_batch_bytes}")
            if on_seq is not None:
                on_seq(seq)
            self.spool.append(seq, data, sample_count(batch))
            self.batches_submitted += 1
        self._notify()
        return seq

    def series_id(self, name: str, labels: Mapping[str, str] | None = None) -> int:
        """Id of a series for ``submit(columns=...)`` (stable for the life of the spool)."""
        with self._lock:
            return self.table.id_for(name, labels)

    def _notify(self) -> None:
        wake(self._loop, self._wake)  # run() not started yet: it reads the spool when it starts

    # ------------------------------------------------------------------ stream side

    async def run(self) -> None:
        """Keep a stream to the aggregator forever; never raises except CancelledError."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        delay = self.backoff_initial_s
        first = True
        while not self._closed:
            if not first:
                self.reconnects += 1
            first = False
            healthy = False
            try:
                healthy = await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # grpc errors, a broken stream, anything: log, back off, retry
                self._note_error(e)
            finally:
                self.connected = False
            if healthy:
                delay = self.backoff_initial_s  # the aggregator answered: start the backoff over
            hint, self.retry_after_s = self.retry_after_s, None
            await asyncio.sleep(reconnect_wait(hint, delay, random.random()))
            if hint is None:
                delay = min(delay * 2, self.backoff_max_s)

    def _note_error(self, e: BaseException) -> None:
        self.stream_errors += 1
        self.retry_after_s = retry_after(e)
        if isinstance(e, grpc.aio.AioRpcError):
            msg = f"{e.code().name}: {e.details()}"
        elif isinstance(e, StreamEnded):
            msg = str(e)
        else:
            msg = f"{type(e).__name__}: {e}"
        # One line per change of error, not one per retry.
        code = e.code() if isinstance(e, grpc.aio.AioRpcError) else getattr(e, "code", None)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            msg += "; give the agent the aggregator's token (--auth-token-file)"
        if msg != self.last_error:
            log.warning("perfd agent %s: stream to %s ended (%s); reconnecting with backoff",
                        self.agent_id, self.target, msg)
        self.last_error = msg

    async def _session(self) -> bool:
        """One stream, until it breaks. Returns whether the aggregator answered on it."""
        self._answered = False
        if self.tls is not None:  # files read again for every channel: renewed ones apply now
            channel = grpc.aio.secure_channel(self.target, self.tls.credentials(), options=self._grpc_options)
        else:
            channel = grpc.aio.insecure_channel(self.target, options=self._grpc_options)
        metadata = ((AUTH_HEADER, self.token.header()),) if self.token is not None else None
        call = None
        # The stream's tasks end with it, through an event (perfd.core.phase: a cancel alone can be lost)
        phase = Phase(f"perfd agent {self.agent_id}")
        try:
            call = channel.stream_stream(STREAM_METHOD, request_serializer=_passthrough,
                                         response_deserializer=pb.AggregatorMessage.FromString)(
                                             metadata=metadata)
            with self._lock:
                hello = encode_hello(self.agent_id, self.node, self.version, self.jobs, self.capabilities,
                                     self.spool.epoch, self.table)
                self.table.take_new()  # the Hello defines every series; batches need not repeat them
                self._inflight.clear()
                self._asked_for = -1
                self._last_sent = self.spool.acked_seq  # resend everything unacknowledged
            self._last_heard = asyncio.get_running_loop().time()
            await call.write(hello.SerializeToString())
            self.connects += 1
            tasks = [phase.spawn(self._read_loop(call)), phase.spawn(self._write_loop(call, phase.over)),
                     phase.spawn(self._watchdog(phase.over))]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # re-raise the error that ended the stream, if any
            return self._answered
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            ended = await _ended_with(call) if call is not None else None
            if ended is not None and not (isinstance(exc, grpc.aio.AioRpcError) and exc.code() == ended.code):
                raise ended from exc
            raise
        finally:
            if call is not None:  # first: the reads and writes on it end, whatever their tasks' cancels do
                call.cancel()
            await phase.end()  # their errors were reported through t.result() above
            await channel.close(grace=None)

    async def _watchdog(self, over: asyncio.Event) -> None:
        """End the stream when the aggregator has acknowledged nothing for ack_timeout_s: a
        half-open or black-holed connection looks open to the socket and, for a while, to gRPC."""
        loop = asyncio.get_running_loop()
        while not over.is_set() and not self._closed:
            silent = loop.time() - self._last_heard
            if silent > self.ack_timeout_s:
                self.ack_timeouts += 1
                self.connected = False
                raise AckTimeout(f"no acknowledgement from the aggregator for {silent:.1f} s")
            await asyncio.sleep(min(1.0, self.ack_timeout_s / 10))

    async def _read_loop(self, call: AgentCall) -> None:
        loop = asyncio.get_running_loop()
        async for msg in call:
            self._last_heard = loop.time()
            which = msg.WhichOneof("msg")
            if which == "ack":
                self._answered = self.connected = True
                self._apply_ack(msg.ack.acked_seq)
            elif which == "command":
                self._answered = True
                self._dispatch(command_from_pb(msg.command))
        # The aggregator closed the stream (shutdown): the session ends and run() reconnects.

    async def _write_loop(self, call: AgentCall, over: asyncio.Event) -> None:
        assert self._wake is not None
        while not over.is_set() and not self._closed:
            self._wake.clear()  # before reading the spool, so a submit() in between is not missed
            room = self.window - len(self._inflight)
            recs: list[tuple[int, bytes]] = []
            if room > 0:
                with self._lock:
                    recs = self.spool.read(self._last_sent, room)
            if not recs:
                # A full window waits for an Ack that the aggregator would otherwise send only at
                # its next interval: ask once per window's worth (a spool being replayed after a
                # reconnect moves a window per round trip, not per ack interval).
                full = room <= 0 and self._inflight[-1] != self._asked_for
                if full:
                    self._asked_for = self._inflight[-1]
                elif not (self._want_ack and self._inflight):
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=self.heartbeat_s)
                        continue
                    except asyncio.TimeoutError:
                        pass
                # Nothing to send for a while, or flush() waits: ask for an Ack (both sides keep
                # seeing one; the aggregator answers a Heartbeat without waiting).
                self._want_ack = False
                msg = pb.AgentMessage(heartbeat=pb.Heartbeat(sent_ns=time.time_ns()))
                await call.write(msg.SerializeToString())
                self.heartbeats_sent += 1
                continue
            for seq, data in recs:
                await call.write(frame_batch(data))
                self._inflight.append(seq)
                self._last_sent = seq
                self.batches_sent += 1
                if seq <= self._max_sent:
                    self.resent += 1
                else:
                    self._max_sent = seq

    def _apply_ack(self, seq: int) -> None:
        with self._lock:
            before = self.spool.pending_count()
            self.spool.ack(seq)
            self.batches_acked += before - self.spool.pending_count()
        while self._inflight and self._inflight[0] <= seq:
            self._inflight.popleft()
        self._last_sent = max(self._last_sent, seq)  # the Ack after Hello may cover unsent batches
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ housekeeping

    async def flush(self, timeout: float) -> bool:
        """Wait until every submitted batch is acknowledged; False on timeout."""
        deadline = time.monotonic() + timeout
        ask_at = 0.0
        while True:
            with self._lock:
                if self.spool.pending_count() == 0:
                    return True
            now = time.monotonic()
            if now >= deadline:
                return False
            if now >= ask_at:  # again now and then: batches sent after the last ask wait for theirs
                self._want_ack, ask_at = True, now + 0.2
                self._notify()
            await asyncio.sleep(0.01)

    def counters(self) -> dict[str, int]:
        with self._lock:
            out = self.spool.stats()
        out.update(connected=int(self.connected), connects=self.connects, reconnects=self.reconnects,
                   batches_submitted=self.batches_submitted, batches_sent=self.batches_sent,
                   batches_acked=self.batches_acked, resent=self.resent, inflight=len(self._inflight),
                   commands_received=self.commands_received, command_errors=self.command_errors,
                   stream_errors=self.stream_errors, series=len(self.table),
                   ack_timeouts=self.ack_timeouts, heartbeats_sent=self.heartbeats_sent,
                   series_journal_errors=self.table.journal_errors)
        return out

    def close(self) -> None:
        """Persist the spool state. Cancel the run() task first."""
        self._closed = True
        with self._lock:
            self.spool.close()

"""The agent's side of the distributed path: what its ranks sent, reduced to one message per (job,
iteration) (perfd.engine.partial), spooled, and published to the engine with an id the engine
de-duplicates on — a drop-in for :class:`perfd.transport.client.AgentClient` in ``perfd agent``.

Nothing is lost while the engine is away: each message waits in the agent's spool (the same spool,
disk-backed where the agent has a spool dir) until the engine acknowledged it; one published twice
(its acknowledgement lost) is dropped by the engine within its duplicate window, and is harmless
after it (a fold is idempotent). Node series stay on the agent's /metrics for Prometheus and are not
published. Events go as sent, and collective records reduced to one partial (perfd.core.collfold:
compact rows, one per operation, a rank's newest SENT_RETENTION, the store's share), one message per
job, to the records stream (perfd.engine.subjects), which the jobs' root reads beside the partials;
a job whose windows were folded below the root has its share held and sent at most every
SHARE_EVERY_S, its dumps merged (perfd.engine.shares: what a fast dump cadence would cost the root).

Where the per-window figures are folded: a job whose ranks' step records this agent sends (the step
hook: each rank's own ends, its windows) has its ranks' every collective operation folded into
per-window figures (perfd.core.winfigures: a row a rank a window) where they are, and the records message
says so (``collectives_folded``): the root keeps its rows without folding them. Either here, with a
``window_fold`` (perfd.analytics.collectives.shardfold.ShardCollectives, handed in by the agent: the
engine imports no analytics): the figures go on the node's partition beside the step partials and
its shard hands them on as they are; or, without one, at that shard, every operation sent there (at
most SHARD_ROWS a message; ``perfd shard`` folds what its nodes send). Both fold the same records the
same way: a rank's windows are its own step ends, which the node's fold of its ranks' records carries
to either. Here it costs a node ~20 µs of CPU an operation (a 100,000-rank job: 48 a node an
iteration, ~1 ms a node every 2 s), where at the shards it cost each shard 35-46 µs an operation of a
quarter of the job's nodes, 2-3x the cores of 4 shards at 100,000 ranks
(docs/evidence/entries/48-scale-history.md). What it
changes: the operations still waiting for their window to settle (about three iterations) are in
this process only, so an agent killed loses them, and its ranks' latest windows keep the provisional
figures it sent (a shard's fold holds its messages unacknowledged until they settle, so that a shard
killed loses nothing). A job whose windows the node does not have (a Megatron-LM log's, on another
node) keeps the root's fold of the store's share, as before.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypedDict

from google.protobuf.message import DecodeError

from perfd.core.collfold import SENT_RETENTION, CollectivePartial, for_sending, reduce
from perfd.core.events import NCCL_HANG
from perfd.core.model import CollectiveRecord, Sample, StepRecord
from perfd.core.winfigures import WindowFigures
from perfd.engine import subjects as S
from perfd.engine.connect import close_bounded, connect
from perfd.engine.figures_codec import chunks as figure_chunks
from perfd.engine.nats_api import JetStream, Msg, NatsClient
from perfd.engine.partial import Partial, RunMarks, decode, encode, partials_of
from perfd.engine.shard_windows import CollectiveFold, JobLayouts
from perfd.engine.shares import SHARE_EVERY_S, Held, HeldShares
from perfd.transport.codec import Command, command_from_pb, encode_batch
from perfd.transport.dispatch import CommandTarget
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.series import SeriesTable
from perfd.transport.spool import Spool
from perfd.transport.wakeup import wake

log = logging.getLogger("perfd.engine")

PUBLISH_TIMEOUT_S = 5.0
# Operations in one node message at most: ~40 bytes a row on the wire, ~160 KB, well under the
# engine's 1 MiB (a first Flight Recorder dump of a node's ranks may hold 20,000).
SHARD_ROWS = 4096
MAX_RANKED_JOBS = 1024  # jobs remembered as sending rank step records (bounded: forgotten, then seen again)


class PublisherStats(TypedDict):
    """:meth:`EngineClient.stats`."""

    connected: bool
    connects: int
    published: int
    duplicates: int
    duplicates_unanswered: int
    distinct_published: int
    publish_errors: int
    unreadable: int
    close_timeouts: int
    commands_received: int
    command_errors: int
    undecodable_commands: int
    pending: int
    records_submitted: int
    collectives_not_sent: int
    collective_shares_sent: int
    collective_rows_held: int
    collective_share_round_s: float | None  # the longest of its live jobs' rounds (shares)
    operations_folded: int
    figure_rows_sent: int
    bad_job_info: int
    fold_jobs_forgotten: int
    last_error: str


class EngineClient(CommandTarget):
    """Create, ``asyncio.create_task(client.run())``, call ``submit()`` as records arrive. Commands
    the jobs' root sends this agent (perfd.engine.root.Root.send_command) go to ``on_command``."""

    def __init__(self, cfg: S.EngineConfig, agent_id: str, *, node: str, spool: Spool | None = None,
                 window: int = 32, backoff_initial_s: float = 0.5, backoff_max_s: float = 30.0,
                 on_command: Callable[[Command], object] | None = None, collectives_at_shards: bool = True,
                 window_fold: CollectiveFold | None = None, share_every_s: float = SHARE_EVERY_S) -> None:
        self.cfg = cfg
        self.agent_id = agent_id
        self.on_command = on_command
        self.commands_received = self.command_errors = self.undecodable_commands = 0
        self._tasks: set[asyncio.Future[object]] = set()
        self.node = node or agent_id
        self.spool = spool if spool is not None else Spool(None)
        self.window = max(1, window)
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self._lock = threading.Lock()  # submit() runs on the agent's threads
        self._wake: asyncio.Event | None = None
        # Set by close(): run() ends at its next round even where its cancel was lost (perfd.core.phase)
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # the session's connection (nats-py's: it reconnects by itself a while)
        self._nc: NatsClient | None = None
        self.connects = self.reconnects = 0
        self.batches_submitted = self.published = self.duplicates = self.publish_errors = 0
        # Of the duplicates, resends of a publish whose answer never came (the connection or the
        # server went first): that publish had landed, so the message is stored once, not sent twice.
        self.duplicates_unanswered = 0
        self._unanswered: set[int] = set()  # spool seqs published whose answer has not come
        self.unreadable = 0  # spooled messages that did not decode (a damaged spool)
        self.close_timeouts = 0  # connections let go that did not close in time (connect.close_bounded)
        self.records_submitted = 0  # events and collective records spooled for the records stream
        self.collectives_not_sent = 0  # of those, collective records the reduction left out (counted)
        # The store's share of a job whose windows were folded below the root, held and sent at most
        # every share_every_s (perfd.engine.shares: what a dump cadence would cost the root); 0: each
        # as it comes
        self._shares = HeldShares(share_every_s)
        self.collective_shares_sent = 0
        self._runs = RunMarks()  # its ranks' processes: a restart marks the partial where it began
        self._no_series = SeriesTable()  # records messages carry no samples: nothing is ever defined
        self.last_error = ""
        # Send a job's operations to its partition's shard once this agent sent rank step records of
        # it (off: the root folds the store's share, as an agent before the shards' fold did)
        self.collectives_at_shards = collectives_at_shards
        self._ranked_jobs: set[str] = set()
        # Those operations folded here and the figures sent instead (None: sent to the shards to fold)
        self.window_fold = window_fold
        self._layouts = JobLayouts(window_fold) if window_fold is not None else None
        # jobs whose operations came, the least recently first: only their step ends feed the fold (a
        # shard's Holds.fold_in alike), not every hook job's, whose windows nothing would read
        self._folding: dict[str, None] = {}
        self.operations_folded = self.figure_rows_sent = 0

    # ---- producer side (any thread) ------------------------------------------------------------
    def submit(self, samples: Iterable[Sample] = (), steps: Iterable[StepRecord] = (),
               events: Iterable[Mapping[str, object]] = (), *,
               columns: tuple[Sequence[int], Sequence[int], Sequence[float]] | None = None,
               job_info_json: Mapping[str, str] | None = None, collectives: Iterable[CollectiveRecord] = (),
               on_seq: Callable[[int], object] | None = None) -> int:
        """Spool one message per job of ``steps`` / ``job_info_json``, and one per job of ``events`` /
        ``collectives`` (for the records stream); returns the last seq (0: none). Samples stay on the
        agent (its /metrics)."""
        records: dict[str, tuple[list[Mapping[str, object]], list[CollectiveRecord]]] = {}
        for ev in events:
            records.setdefault(str(ev.get("job") or ""), ([], []))[0].append(ev)
        for c in collectives:
            records.setdefault(c.job, ([], []))[1].append(c)
        by_job: dict[str, list[StepRecord]] = {}
        for r in steps:
            by_job.setdefault(r.job, []).append(r)
        for job in job_info_json or {}:
            by_job.setdefault(job, [])
        seq = 0
        with self._lock:
            if self.collectives_at_shards:
                ranked = {job for job, recs in by_job.items() if any(isinstance(r.rank, int) for r in recs)}
                if len(self._ranked_jobs | ranked) > MAX_RANKED_JOBS:
                    self._ranked_jobs.clear()
                self._ranked_jobs |= ranked
            to_shard = {job: colls for job, (_, colls) in records.items()
                        if colls and job in self._ranked_jobs}
            for job in to_shard:
                by_job.setdefault(job, [])
            made: list[tuple[str, int, list[Partial]]] = []  # (job, its message's seq, its step partials)
            for job, recs in by_job.items():
                seq = self.spool.next_seq()
                made.append((job, seq, partials_of(recs, f"{self.agent_id}:{self.spool.epoch}:{seq}",
                                                   self._runs.new_runs(recs))))
            figures = self._fold(to_shard, made, job_info_json) if self.window_fold is not None else {}
            # beside each job's partials: the figures folded here, or the operations for its shard to
            # fold; what one message cannot hold in messages of their own after (the spool's seqs rise)
            later: list[tuple[list[CollectivePartial], list[WindowFigures]]] = []
            for job, seq, partials in made:
                pieces: list[tuple[list[CollectivePartial], list[WindowFigures]]] = [([], [])]
                if self.window_fold is not None and job in figures:
                    pieces = [([], [f]) for f in figure_chunks(figures.pop(job))]
                elif self.window_fold is None and job in to_shard:
                    pieces = [(p, []) for p in _pieces(job, to_shard[job])]
                info = {job: job_info_json[job]} if job_info_json and job in job_info_json else None
                self._append(seq, encode(f"{self.agent_id}:{self.spool.epoch}:{seq}", self.agent_id,
                                         time.time_ns(), partials, info, collectives=pieces[0][0],
                                         figures=pieces[0][1], to_partition=True), on_seq)
                later += pieces[1:]
            later += [([], [f]) for figs in figures.values() for f in figure_chunks(figs)]
            for colls_piece, figs in later:
                seq = self.spool.next_seq()
                self._append(seq, encode(f"{self.agent_id}:{self.spool.epoch}:{seq}", self.agent_id,
                                         time.time_ns(), (), collectives=colls_piece, figures=figs,
                                         to_partition=True), on_seq)
            for job, (evs, colls) in records.items():
                # the events and the collective records in messages of their own: the events to their
                # stream, which the records' volume never crowds out (perfd.engine.subjects)
                if evs:
                    seq = self.spool.next_seq()
                    batch = encode_batch(self.agent_id, seq, (), (), evs, self._no_series)
                    self._append(seq, encode(f"{self.agent_id}:{self.spool.epoch}:{seq}", self.agent_id,
                                             time.time_ns(), (), records=batch), on_seq)
                if any(ev.get("kind") == NCCL_HANG.name for ev in evs):  # its completion goes soon
                    self._shares.note_hang(job, time.monotonic())
                if colls and job in to_shard and self._shares.every_s > 0:
                    for held in self._shares.hold(reduce(job, colls), len(colls), time.monotonic()):
                        seq = self._send_share(held, on_seq)
                elif colls:
                    seq = self._send_share(Held(reduce(job, colls), len(colls), 0.0), on_seq,
                                           folded=job in to_shard)
                self.records_submitted += len(evs) + len(colls)
            for held in self._shares.due(time.monotonic()):
                seq = self._send_share(held, on_seq)
        if seq:
            self._notify()
        return seq

    def _send_share(self, held: Held, on_seq: Callable[[int], object] | None = None,
                    folded: bool = True) -> int:
        """Spool a job's share of its collective records (the lock held); returns its seq.
        ``folded``: the job's windows were folded below the root (the root only keeps its rows)."""
        seq = self.spool.next_seq()
        reduced = [for_sending(held.part, SENT_RETENTION)]
        # not sent: past a rank's newest SENT_RETENTION, or an op twice in them (or in two dumps held)
        self.collectives_not_sent += held.records - sum(len(p) for p in reduced)
        self.collective_shares_sent += 1
        self._append(seq, encode(f"{self.agent_id}:{self.spool.epoch}:{seq}", self.agent_id,
                                 time.time_ns(), (), collectives=reduced, collectives_folded=folded), on_seq)
        return seq

    def _send_due_shares(self, every: bool = False) -> None:
        """Spool the held shares whose time came (``every``: all of them); any thread."""
        with self._lock:
            now = time.monotonic()
            for held in self._shares.take_all(now) if every else self._shares.due(now):
                self._send_share(held)

    def _append(self, seq: int, data: bytes, on_seq: Callable[[int], object] | None) -> None:
        if on_seq is not None:
            on_seq(seq)
        self.spool.append(seq, data)
        self.batches_submitted += 1

    def _fold(self, ops: Mapping[str, Sequence[CollectiveRecord]],
              made: Sequence[tuple[str, int, list[Partial]]],
              job_info_json: Mapping[str, str] | None) -> dict[str, WindowFigures]:
        """The window fold fed as a shard feeds it from a node message (the job's layout, its
        operations, then its ranks' step ends: perfd.engine.shard_windows.Holds.fold_in), and what it
        made since the last take, by job (every job of ``ops`` has a message in ``made``)."""
        fold, layouts = self.window_fold, self._layouts
        assert fold is not None and layouts is not None
        layouts.read(job_info_json or {})
        for job in ops:
            self._folding.pop(job, None)
            self._folding[job] = None
            if len(self._folding) > MAX_RANKED_JOBS:
                del self._folding[next(iter(self._folding))]
        for job, colls in ops.items():
            part = reduce(job, colls)
            self.operations_folded += len(part)
            fold.add(part)
        steps = [p.fold for job, _, partials in made if job in self._folding for p in partials
                 if p.fold is not None]
        if steps:
            fold.add_steps(steps)
        out: dict[str, WindowFigures] = {}
        for figs in fold.take():
            out[figs.job] = figs
        self.figure_rows_sent += sum(len(f) for f in out.values())
        return out

    def series_id(self, name: str, labels: Mapping[str, str] | None = None) -> int:
        return 0  # series stay on the agent: nothing to resolve

    def _notify(self) -> None:
        wake(self._loop, self._wake)  # run() not started yet: it reads the spool when it starts

    # ---- publishing (the agent's event loop) ---------------------------------------------------
    async def run(self) -> None:
        """Publish what is spooled, forever; reconnects with jittered backoff. Never raises but
        CancelledError."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        delay = self.backoff_initial_s
        while not self._closed:
            nc = None
            try:
                nc = await connect(self.cfg, f"perfd-agent {self.agent_id}", reconnected_cb=self._reconnected)
                self.connects += 1
                self.reconnects += self.connects > 1
                self._nc = nc
                delay = self.backoff_initial_s
                await nc.subscribe(S.command_subject(self.agent_id), cb=self._on_command_msg)
                await self._publish_loop(nc)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no server, a timeout, a refused publish: spooled, retried
                self.publish_errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                log.warning("engine publish: %s (retry in ~%.1f s; %d message(s) spooled)",
                            self.last_error, delay, self.spool.pending_count())
            finally:
                self._nc = None
                if nc is not None and not await close_bounded(nc, f"agent {self.agent_id}"):
                    self.close_timeouts += 1
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))  # jittered: agents do not return in step
            delay = min(self.backoff_max_s, delay * 2)

    @property
    def distinct_published(self) -> int:
        """Messages the engine stored from this client: those acknowledged, less the copies it already
        had but for the resends of a publish whose answer was lost (stored once, sent once)."""
        return self.published - (self.duplicates - self.duplicates_unanswered)

    @property
    def connected(self) -> bool:
        """Connected to a server now (not while nats-py is reconnecting underneath)."""
        nc = self._nc
        return nc is not None and bool(nc.is_connected)

    async def _reconnected(self) -> None:
        """nats-py reconnected the session's connection by itself: a reconnect all the same."""
        self.reconnects += 1

    async def _on_command_msg(self, msg: Msg) -> None:
        """A command from the root: answered at once (it arrived), then handled."""
        try:
            cmd = command_from_pb(pb.Command.FromString(msg.data))
        except DecodeError as exc:
            self.undecodable_commands += 1
            log.warning("engine: a command that does not decode (%s): refused", exc)
            return
        if msg.reply:
            await msg.respond(b"")
        self._dispatch(cmd)

    async def _publish_loop(self, nc: NatsClient) -> None:
        js = nc.jetstream()
        assert self._wake is not None
        while not self._closed:
            self._send_due_shares()  # a job's held share goes in time though nothing else is submitted
            with self._lock:
                pending = self.spool.read(0, self.window)
            if not pending:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
                except asyncio.TimeoutError:
                    pass
                if not nc.is_connected:
                    raise ConnectionError("the engine connection is down")
                continue
            # In order, a window at a time: the spool's acknowledgement is cumulative.
            seqs = [seq for seq, _ in pending]
            resent = self._unanswered.intersection(seqs)
            self._unanswered = set(seqs)  # bounded by the window: older ones were answered or let go
            acks = await asyncio.gather(*(self._publish(js, data) for _, data in pending),
                                        return_exceptions=True)
            for seq, dup in zip(seqs, acks, strict=True):
                if isinstance(dup, BaseException):
                    raise dup  # the ones before it are acknowledged; it and the rest go again
                self._unanswered.discard(seq)
                self.published += 1
                self.duplicates += dup
                self.duplicates_unanswered += dup and seq in resent
                with self._lock:
                    self.spool.ack(seq)

    async def _publish(self, js: JetStream, data: bytes) -> bool:
        """Publish one spooled message; True when the engine had it already (or it could not be
        read back from the spool: counted and logged, then let go, or it would block every later one)."""
        try:
            d = decode(data, figures_raw=True)
            if d.events_only:
                subject = S.events_subject(d.records_job)
            elif not d.is_node_message:
                subject = S.records_subject(d.records_job)
            else:  # (a node message of figures alone: what one message beside the partials could not hold)
                job = (d.partials[0].job if d.partials else d.collectives[0].job if d.collectives
                       else d.figures_pb[0].job if d.figures_pb else next(iter(d.job_info_json)))
                subject = S.node_subject(job, S.partition_of(job, self.node, self.cfg.partitions))
        except (ValueError, StopIteration) as exc:
            self.unreadable += 1
            log.error("engine publish: a spooled message cannot be read back (%s): dropped", exc)
            return False
        ack = await js.publish(subject, data, timeout=PUBLISH_TIMEOUT_S, headers={"Nats-Msg-Id": d.id})
        return bool(getattr(ack, "duplicate", False))

    async def flush(self, timeout: float) -> bool:
        """Wait until every submitted message is acknowledged by the engine, the collective shares
        held included (sent now); False on timeout."""
        self._send_due_shares(every=True)
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self.spool.pending_count() == 0:
                    return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)

    def counters(self) -> dict[str, int]:
        """What the agent's /metrics reads of its sender (perfd.agent.node_agent), as AgentClient's."""
        with self._lock:
            out = self.spool.stats()
        out.update(connected=int(self.connected), connects=self.connects, reconnects=self.reconnects,
                   batches_submitted=self.batches_submitted, batches_acked=self.published,
                   stream_errors=self.publish_errors, ack_timeouts=0, duplicates=self.duplicates,
                   unreadable=self.unreadable, close_timeouts=self.close_timeouts,
                   commands_received=self.commands_received,
                   command_errors=self.command_errors)
        return out

    def close(self) -> None:
        """Persist the spool state, the collective shares held spooled first (a spool on disk
        sends them after a restart). Cancel the run() task first."""
        self._closed = True
        self._send_due_shares(every=True)
        with self._lock:
            self.spool.close()

    def stats(self) -> PublisherStats:
        with self._lock:
            held, round_s = self._shares.rows, self._shares.live_round_s(time.monotonic())
        return {"connected": self.connected, "connects": self.connects, "published": self.published,
                "duplicates": self.duplicates, "duplicates_unanswered": self.duplicates_unanswered,
                "distinct_published": self.distinct_published,
                "publish_errors": self.publish_errors,
                "unreadable": self.unreadable, "close_timeouts": self.close_timeouts,
                "commands_received": self.commands_received,
                "command_errors": self.command_errors, "undecodable_commands": self.undecodable_commands,
                "pending": self.spool.pending_count(), "records_submitted": self.records_submitted,
                "collectives_not_sent": self.collectives_not_sent,
                "collective_shares_sent": self.collective_shares_sent,
                "collective_rows_held": held, "collective_share_round_s": round_s,
                "operations_folded": self.operations_folded, "figure_rows_sent": self.figure_rows_sent,
                "bad_job_info": self._layouts.bad if self._layouts is not None else 0,
                "fold_jobs_forgotten": self.window_fold.jobs_forgotten if self.window_fold is not None else 0,
                "last_error": self.last_error}


def _pieces(job: str, colls: Sequence[CollectiveRecord]) -> list[list[CollectivePartial]]:
    """A node's operations of one job reduced in pieces of at most SHARD_ROWS (each a node message)."""
    return [[reduce(job, colls[k:k + SHARD_ROWS])] for k in range(0, len(colls), SHARD_ROWS)] or [[]]

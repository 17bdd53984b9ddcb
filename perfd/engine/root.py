"""A job's root on the distributed path: the shards' partials folded per (job, iteration) and handed
to the aggregator's store as one record per iteration, so that the analysis, /metrics, the API and
the rules read a job of 100,000 ranks as they read one that streams to a single aggregator.

One root leads at a time, by lease (perfd.engine.leases); a standby aggregator started the same way
takes over when the leader stops renewing. The lease is renewed on a thread of its own
(perfd.engine.lease_keeper, as a shard's): a fold of a large batch holds this loop for seconds, and a
renewal waiting its turn behind it lost the lease of a root that was working, not gone. The leader
reads the partials stream from its first message kept (the jobs' history, an hour by default): a new
leader, or one that restarted, rebuilds what it holds from it, and a partial read twice folds once.
The nodes' events come as their agents sent them, and their collective records as each agent reduced
them (perfd.core.collfold), on the records stream, read the same way beside the partials
(the engine drops a message published twice within its duplicate window; a reduced one read twice
merges once: the merge is a join). The reduced collective records (the store's share of each rank's)
are merged here, in the store the root hands them to: what the analysis reads of whole operations
(who arrives last, the wait asymmetry, the groups, hangs). Their per-window figures, the
per-iteration shares, are folded at the shards where the agents send every operation there too (the
records message says ``collectives_folded``; the shards' figures come on the partials stream and go
to the store's join, ``ingest_window_figures``), and here otherwise: an agent of a job whose ranks'
windows its node does not have (a Megatron-LM log's), or one older than the shards' fold.
What the root pays is linear in what arrives: 0.37 ms of CPU a node message of a 100,000-rank job
(decode and a keyed insert per row; ``perfd bench collectives``). Everything goes to a
:class:`RootSink` — the aggregator — so nothing here knows the aggregator. The shards' step summaries
are read beside the partials, on a stream of their own, and answered per whole iteration
(perfd.engine.root_summaries): shown in the root's stats, never handed to the store.

A root leads every job, or one (``perfd aggregator --engine-job NAME``): a job's own root holds a lease
of its own (subjects.root_lease) and reads that job's subjects alone — and the events of no job (the
nodes' process lists, which place its ranks on their GPUs) — so two large jobs need not share one
interpreter. While it leads it puts its job's key in the job-roots bucket (subjects.JOB_ROOTS_BUCKET,
kept JOB_ROOTS_TTL_S past the last put). The root of every job, leading or standing by, reads that
bucket every third of the TTL (a failed first read ends its session: it never reads the streams
without it): a job with a key is left to its own root (its messages skipped, counted
``led_elsewhere``), through the root's failover and for the grace after, whichever process of the
root of every job leads; what it held of the job before is let go of (the store's copy would stand
still while the job runs: a stalled job to the rules).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Protocol, TypeVar

from google.protobuf.message import DecodeError

from perfd.core.collfold import CollectivePartial
from perfd.core.commsummary import CommSummary
from perfd.core.jobinfo_json import job_info_from_json
from perfd.core.model import CollectiveRecord, JobInfo, StepRecord
from perfd.core.phase import Phase
from perfd.core.winfigures import WindowFigures
from perfd.engine import comm_codec, job_roots, summary_codec
from perfd.engine import subjects as S
from perfd.engine.connect import close_bounded, connect, ensure_streams
from perfd.engine.engine_state import EngineState
from perfd.engine.engine_state import watch as watch_engine
from perfd.engine.lease_keeper import LeaseKeeper, keep_beating
from perfd.engine.nats_api import JetStream, KeyValue, Msg, NatsClient, Subscription
from perfd.engine.partial import Decoded, Partial, decode
from perfd.engine.root_comm import RootComm
from perfd.engine.root_summaries import RootSummaries
from perfd.engine.rootfold import RootFold, RootStats, stream_gap
from perfd.engine.stepsummary import StepSummary
from perfd.transport.codec import Command, DecodedBatch, command_to_pb, decode_batch
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import DecodedEvent

log = logging.getLogger("perfd.engine")
T = TypeVar("T")
M = TypeVar("M")

ENGINE_AGENT = "engine"  # the sender the store sees for every record that came through the engine
INFO_TEXTS_KEPT = 4096  # jobs whose latest info text the root keeps, to pass the same again by
SKIPPED_LINE_S = 60.0  # messages a stream let go before they were read: one log line a stream this often


class RootSink(Protocol):
    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord],
                     now: float | None = None) -> object: ...  # what it returns is not read
    def ingest_job_info(self, agent_id: str, job: str, info: JobInfo, now: float | None = None) -> None: ...
    def note_folded_ranks(self, job: str, ranks: Collection[int]) -> None: ...
    def held_fold(self, job: str, iteration: int) -> StepRecord | None: ...
    def ingest_records(self, agent_id: str, events: Sequence[DecodedEvent],
                       collectives: Sequence[CollectiveRecord]) -> None: ...
    def ingest_collective_partial(self, agent_id: str, partial: CollectivePartial,
                                  folded: bool = False) -> None: ...
    def ingest_window_figures(self, figs: WindowFigures) -> None: ...
    def admit_job(self, job: str) -> bool: ...
    def let_go(self, tokens: Collection[str]) -> list[str]: ...  # jobs of those tokens, let go of: which


class Root:
    """The leader's loop: ``await Root(cfg, sink, id).run(stop)`` in the aggregator's event loop."""

    def __init__(self, cfg: S.EngineConfig, sink: RootSink, root_id: str, replicas: int = 1,
                 advertise_http: str | None = None, job: str | None = None) -> None:
        self.cfg, self.sink, self.id, self.replicas = cfg, sink, root_id, replicas
        # The one job this root leads (its own root), or None: every job without a root of its own
        self.job, self.lease = job, S.root_lease(job)
        # This root's HTTP as the others reach it (put while it leads); the leader's, as last read
        # while standing by (None: leading, or no leader advertises one)
        self.advertise_http = advertise_http
        self.leader_http: str | None = None
        self.fold = RootFold()
        self.job_roots = job_roots.JobRoots(self.fold.stats)  # (the root of every job) jobs left to theirs
        # A job's own root reads its job's subjects alone: the stream's other messages are no gap
        self.fold.stats.reads_every_job = job is None
        self._readers: tuple[tuple[str, str, str], ...] = (
            ("records", S.RECORDS_STREAM, S.root_filter(S.RECORDS_PREFIX, job)),
            ("events", S.EVENTS_STREAM, S.root_filter(S.EVENTS_PREFIX, job)),
            ("summaries", S.SUMMARIES_STREAM, S.root_filter(S.SUMMARIES_PREFIX, job)))
        if job is not None:  # the nodes' own events (process lists): the ranks' placement on GPUs
            self._readers += (("node events", S.EVENTS_STREAM, S.events_subject("")),)
        self.summaries = RootSummaries(self.fold.stats, world=self.fold.world, ranks=self._iteration_ranks)
        self.comm = RootComm(cfg.partitions)  # the shards' communication-share summaries (root_comm)
        self._info_text: OrderedDict[str, str] = OrderedDict()  # job -> the info it last took in
        # what the summaries were last checked against: jobs the fold forgot, and each job's run
        self._forgotten, self._runs = 0, dict(self.fold.runs)
        self._read_to = 0  # the partials stream's sequence read and folded up to
        self._nc: NatsClient | None = None  # the session's connection: what commands go out on
        self._loop: asyncio.AbstractEventLoop | None = None
        # the records, events and summaries streams' ("records", "events", "summaries"), read up to
        self._records_read_to: dict[str, int] = {}
        self._pending: set[asyncio.Future[None]] = set()  # commands in flight from the loop itself
        self._pending_calls: set[concurrent.futures.Future[None]] = set()  # ... from other threads
        self._said: dict[str, float] = {}  # stream -> when messages it let go were last logged
        self._unsaid: dict[str, int] = {}  # ... and how many since
        # The engine's streams and consumers as this root last read them while leading (none otherwise:
        # one root's are the engine's, perfd.engine.engine_state)
        self.engine = EngineState()

    @property
    def stats(self) -> RootStats:
        return self.fold.stats

    def engine_state(self) -> EngineState | None:
        """The engine's streams and consumers as last read, by the root of every job (None on a job's own
        root, which does not read them: its series absent, not 0)."""
        return self.engine if self.job is None else None

    def stats_json(self) -> dict[str, object]:
        """The counters, and the newest answers from the summaries of each job (/api/stats ``engine``)."""
        return {**self.stats.to_json(), "job": self.job, "summary_answers": self.summaries.to_json(),
                "comm_answers": self.comm.to_json(), "streams": self.engine.to_json()}

    async def run(self, stop: asyncio.Event) -> None:
        """Lead when the lease is free, follow otherwise; reconnects; never raises but CancelledError."""
        while not stop.is_set():
            try:
                await self._session(stop)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the engine away: try again; the store keeps what it has
                log.warning("engine root %s: %s: reconnecting", self.id, exc)
                self.stats.leader = False
                try:
                    await asyncio.wait_for(stop.wait(), timeout=2.0)
                except asyncio.TimeoutError:
                    pass

    async def _session(self, stop: asyncio.Event) -> None:
        nc = await connect(self.cfg, f"perfd-root {self.id}")
        self._nc, self._loop = nc, asyncio.get_running_loop()
        keeper = beats = None
        try:
            await ensure_streams(nc, self.cfg, self.replicas, job_roots=True)
            js = nc.jetstream()
            kv = await js.key_value(S.LEASES_BUCKET)
            roots = await self._job_roots_bucket(js)
            await self._look_for_job_roots(js, first=True)
            keeper = LeaseKeeper(self.cfg, self.id)
            await keeper.start()
            beats = asyncio.create_task(keep_beating(keeper))
            while not stop.is_set():
                if await keeper.acquire(self.lease):
                    log.info("engine root %s: leads %s; reading the partials kept", self.id,
                             "every job without a root of its own" if self.job is None
                             else f"job {self.job[:80]!r}")
                    self.stats.leader, self.leader_http = True, None
                    try:
                        await self._lead(js, keeper, stop, kv, roots)
                    finally:
                        self.stats.leader = False
                        await self._unadvertise(kv)
                        await keeper.release(self.lease)
                else:
                    self.leader_http = await _advertised(kv, S.root_http_key(self.job))
                    await self._look_for_job_roots(js)  # a standby knows them when it leads
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=self.cfg.renew_s)
                    except asyncio.TimeoutError:
                        pass
        finally:
            if beats is not None:
                beats.cancel()
                await asyncio.gather(beats, return_exceptions=True)
            if keeper is not None:
                await keeper.close()
            self._nc = None
            await close_bounded(nc, f"root {self.id}")

    async def _advertise(self, kv: KeyValue) -> None:
        """Put this root's HTTP where a standby reads it (expires with the bucket's TTL unless put
        again at each renewal); a failure only leaves the standby answering for itself."""
        if self.advertise_http:
            try:
                await kv.put(S.root_http_key(self.job), self.advertise_http.encode())
            except Exception as exc:
                log.warning("engine root %s: could not advertise its HTTP (%s)", self.id, exc)

    def _lead_lost(self, keeper: LeaseKeeper) -> None:
        keeper.take_lost()
        self.stats.leadership_lost += 1
        log.warning("engine root %s: lost the root lease %s (not renewed within its TTL, or taken): stops "
                    "leading", self.id, self.lease)

    async def _unadvertise(self, kv: KeyValue) -> None:
        """Take this root's HTTP back, so that a standby stops forwarding here at its next read: only
        where it is still this root's (a lead lost: the next leader may have put its own already)."""
        if not self.advertise_http:
            return
        with contextlib.suppress(Exception):  # gone already, or the engine away: it expires anyway
            e = await kv.get(S.root_http_key(self.job))
            if e.value == self.advertise_http.encode():
                await kv.delete(S.root_http_key(self.job), last=e.revision)

    def _skipped(self, stream: str, read_to: int, msgs: Sequence[Msg]) -> None:
        """Count (and say) the messages of ``stream`` the engine let go before this root read them (a job's
        own root cannot tell: the stream's sequence numbers it is not delivered are other jobs')."""
        if self.job is not None:
            return
        gap = stream_gap(read_to, [m.metadata.sequence.stream for m in msgs])
        if not gap:
            return
        if stream == "records":
            self.stats.records_skipped += gap
        elif stream == "events":
            self.stats.events_skipped += gap
        elif stream == "summaries":
            self.stats.summaries_skipped += gap
        else:
            self.stats.partials_skipped += gap
        # one line a stream a minute at most, with what was let go since the last (a root this far
        # behind finds more gone at every read)
        unsaid = self._unsaid[stream] = self._unsaid.get(stream, 0) + gap
        now = time.monotonic()
        if now - self._said.get(stream, -SKIPPED_LINE_S) < SKIPPED_LINE_S:
            return
        self._said[stream], self._unsaid[stream] = now, 0
        log.warning("engine root %s: %d message(s) of the %s stream were let go by the engine (its limits: "
                    "%d MiB, %.0f s) before this root read them, since the last such line: lost to the "
                    "jobs' analysis (counted, /api/stats engine.%s_skipped)", self.id, unsaid, stream,
                    {"records": S.RECORDS_MAX_BYTES, "events": S.EVENTS_MAX_BYTES,
                     "summaries": S.SUMMARIES_MAX_BYTES}.get(
                        stream, S.PARTIALS_MAX_BYTES) >> 20,
                    S.PARTIALS_MAX_AGE_S, stream)

    async def _lead(self, js: JetStream, keeper: LeaseKeeper, stop: asyncio.Event, kv: KeyValue,
                    roots: KeyValue | None) -> None:
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.api import ConsumerConfig, DeliverPolicy

        # From the first partial kept, or — leading again in the same process, whose fold and store
        # hold what it read — from the one after the last it read (a replay would fold it all again).
        async def subscribe(stream: str, subject: str, read_to: int) -> Subscription:
            if read_to:
                return await js.subscribe(subject, stream=stream, ordered_consumer=True,
                                          deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                          config=ConsumerConfig(opt_start_seq=read_to + 1))
            return await js.subscribe(subject, stream=stream, ordered_consumer=True,
                                      deliver_policy=DeliverPolicy.ALL)

        async def batch(sub: Subscription, wait_s: float) -> list[Msg]:
            msgs: list[Msg] = []
            try:
                msgs.append(await sub.next_msg(timeout=wait_s))
                while len(msgs) < 256:  # what else is there already: one store update for all
                    msgs.append(await sub.next_msg(timeout=0.001))
            except NatsTimeout:
                pass
            return msgs

        async def read_records(stream: str, rsub: Subscription) -> None:
            """The records, events or summaries stream (``stream``: its key in ``_records_read_to``)."""
            handle = self.handle_summaries if stream == "summaries" else self.handle_records
            skipped = "events" if stream == "node events" else stream
            while not phase.over.is_set():
                msgs = await batch(rsub, 0.5)
                if not keeper.held(self.lease):  # its batch unread (whoever leads next reads it):
                    return  # it ends, and the lead with it (below), never to read on past a hole
                if msgs:
                    read_to = self._records_read_to.get(stream, 0)
                    self._skipped(skipped, read_to, msgs)
                    handle(self.job_roots.ours((m.subject, m.data) for m in msgs))
                    self._records_read_to[stream] = max(read_to, msgs[-1].metadata.sequence.stream)

        await self._look_for_job_roots(js, first=True)  # before the first read: their messages not folded
        phase = Phase(f"engine root {self.id}")  # its readers and watchers end with the lead (core.phase)
        sub = await subscribe(S.PARTIALS_STREAM, S.root_filter(S.PARTIALS_PREFIX, self.job), self._read_to)
        rsubs = {name: await subscribe(stream, subject, self._records_read_to.get(name, 0))
                 for name, stream, subject in self._readers}
        readers = [phase.spawn(read_records(name, rsub)) for name, rsub in rsubs.items()]
        self.engine = EngineState()
        # The engine's streams and consumers, read by the root of every job only (one set of series,
        # one alert, however many jobs have roots of their own)
        if self.job is None:
            phase.spawn(watch_engine(js, self.cfg.partitions, self.engine, phase.over))
        # ... and the job roots, marked or read, on a task of their own: a slow answer never holds the reads
        phase.spawn(self._keep_job_roots(js, roots, phase.over))
        loop = asyncio.get_running_loop()
        advertise_at = loop.time() + self.cfg.renew_s
        try:
            await self._advertise(kv)
            while not stop.is_set():
                # A reader ends on an error (raised here: this session ends and reconnects) or where it
                # found the lease no longer held, having left its batch unread: the lead ends either way
                ended = [records for records in readers if records.done()]
                for records in ended:
                    records.result()
                if ended or not keeper.held(self.lease):  # not renewed within its TTL, or taken
                    self._lead_lost(keeper)
                    return
                if loop.time() >= advertise_at:  # put again before the bucket's TTL lets it go
                    await self._advertise(kv)
                    advertise_at = loop.time() + self.cfg.renew_s
                msgs = await batch(sub, 0.5)
                if not keeper.held(self.lease):  # the batch unread: whoever leads next reads it (this
                    self._lead_lost(keeper)  # root from _read_to, leading again on a new subscription)
                    return
                if msgs:
                    self._skipped("partials", self._read_to, msgs)
                    self.handle(self.job_roots.ours((m.subject, m.data) for m in msgs))
                    self._read_to = max(self._read_to, msgs[-1].metadata.sequence.stream)
                else:
                    self.flush()  # an iteration that is not whole still reaches the store
        finally:
            phase.over.set()  # first, and whatever the flush does: the engine's state is the next leader's
            self.engine = EngineState()
            self.flush(every=True)  # what it read is folded: the store has it all, leading or not
            await phase.end()  # a reader's error, if any, was raised above
            await sub.unsubscribe()
            for rsub in rsubs.values():
                await rsub.unsubscribe()

    async def _job_roots_bucket(self, js: JetStream) -> KeyValue | None:
        """The job-roots bucket a job's own root marks its job in (the root of every job reads it
        otherwise: None). One without it cannot lead: the root of every job would fold its job too."""
        if self.job is None:
            return None
        try:
            return await js.key_value(S.JOB_ROOTS_BUCKET)
        except Exception as exc:
            raise RuntimeError(f"a job's own root needs the engine's job-roots bucket {S.JOB_ROOTS_BUCKET}, "
                               f"which could not be read or made ({exc}); it does not lead") from exc

    async def _keep_job_roots(self, js: JetStream, roots: KeyValue | None, over: asyncio.Event) -> None:
        """While leading (until ``over``), every third of the TTL: a job's own root marks its job
        (job_roots.mark), the root of every job reads which jobs have roots of their own."""
        while not over.is_set():
            if self.job is not None and roots is not None:
                await job_roots.mark(roots, self.job, self.id)
            else:
                await self._look_for_job_roots(js)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(over.wait(), timeout=self.cfg.renew_s)

    async def _look_for_job_roots(self, js: JetStream, first: bool = False) -> None:
        """(The root of every job) which jobs have roots of their own (job_roots). ``first``: the read
        before this root reads any stream, whose failure is raised (the session starts again), never
        read past; a later failure keeps what was read last."""
        if self.job is not None:
            return
        try:
            tokens = await job_roots.read(js)
        except Exception as exc:
            if first:
                raise
            log.warning("engine root %s: could not read which jobs have a root of their own (%s)", self.id,
                        exc)
            return
        self.note_job_roots(tokens)

    def note_job_roots(self, tokens: Collection[str]) -> None:
        """``tokens``: the jobs with a root of their own now. A job newly among them is let go of here —
        the fold's, the summaries' and the store's (the aggregator prunes it) — and its messages skipped
        from now on; one no longer among them is read again from the next message, as a job not seen."""
        new, gone = self.job_roots.note(tokens)
        for token in gone:
            log.info("engine root %s: the job of token %s has had no root of its own for %.0f s: this root "
                     "reads its messages again, from now on", self.id, token, S.JOB_ROOTS_TTL_S)
        if not new:
            return
        held = {j for j in (*self.fold.jobs, *self.summaries.fold_jobs(), *self.comm.held)
                if S.job_token(j) in new}
        for job in held:
            self.fold.forget(job, "has a root of its own", idle=False)
            self.summaries.forget(job)
            self.comm.forget(job)
        let_go = {*held, *self.sink.let_go(new)}
        # A job given its own root while it runs: its history before what the streams keep (an hour, their
        # bytes) is in neither root from now on (its own root rebuilds from the streams)
        (log.warning if let_go else log.info)(
            "engine root %s: job(s) of token %s have a root of their own: their messages are left to it; "
            "what this root held of them let go of (%s)%s", self.id, ", ".join(sorted(new)),
            ", ".join(repr(j[:80]) for j in sorted(let_go)) or "none",
            ": their history older than the engine's streams keep is lost to both roots" if let_go else "")

    def send_command(self, agent_id: str, command: Command) -> bool:
        """Send ``command`` to an agent on the engine; False (counted) without an engine connection.
        True: handed to the event loop, which counts whether the agent answered. Any thread (the
        rules tick runs in an executor), never waits: as perfd.transport.server's."""
        nc, loop = self._nc, self._loop
        if nc is None or loop is None or loop.is_closed():
            self.stats.commands_undeliverable += 1
            return False
        data = command_to_pb(command).SerializeToString()
        coro = self._request(nc, agent_id, data)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task = asyncio.ensure_future(coro)
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        else:  # its future kept until done: a task only the loop's weak set holds may be collected
            fut = asyncio.run_coroutine_threadsafe(coro, loop)
            self._pending_calls.add(fut)
            fut.add_done_callback(self._pending_calls.discard)
        return True

    async def _request(self, nc: NatsClient, agent_id: str, data: bytes) -> None:
        try:
            await nc.request(S.command_subject(agent_id), data, timeout=S.COMMAND_REPLY_TIMEOUT_S)
        except Exception as exc:  # no responders, a timeout, a closed connection: not delivered
            self.stats.commands_undeliverable += 1
            log.warning("engine root %s: command to agent %s not delivered (%s)", self.id, agent_id[:80],
                        type(exc).__name__)
            return
        self.stats.commands_sent += 1

    def _decoded(self, data: bytes, what: str, read: Callable[[Decoded], T]) -> T | None:
        """``read(decode(data))``, or None for a message that does not decode (counted, logged)."""
        try:
            return read(decode(data))
        except ValueError as exc:
            self.stats.undecodable += 1
            log.warning("engine root %s: a %s message that does not decode (%s): skipped", self.id, what, exc)
            return None

    def handle(self, batch: Sequence[bytes]) -> None:
        """Fold shard messages in and hand what changed to the sink."""
        parts: list[Partial] = []
        for data in batch:
            d = self._decoded(data, "partials", lambda d: d)
            if d is None:
                continue
            self.stats.batches += 1
            for job, text in d.job_info_json.items():
                if job in self.fold.jobs and self._info_text.get(job) == text:
                    # the same again, of a job held: each node sends it, on the engine once a minute
                    self._info_text.move_to_end(job)
                    self.stats.job_info_same += 1
                    continue
                if job not in self.fold.jobs and not self.sink.admit_job(job):
                    self.stats.refused += 1
                    continue
                try:
                    info = job_info_from_json(text)
                except ValueError as exc:
                    self.stats.undecodable += 1
                    log.warning("engine root %s: job info of %r does not decode (%s)", self.id, job[:80], exc)
                    continue
                self.sink.ingest_job_info(ENGINE_AGENT, job, info)
                self.fold.note_world(job, info.layout.world_size)
                self._info_text[job] = text
                while len(self._info_text) > INFO_TEXTS_KEPT:
                    self._info_text.popitem(last=False)
            parts.extend(d.partials)
            for figs in d.figures:
                if figs.job in self.fold.jobs or self.sink.admit_job(figs.job):
                    self.stats.figure_rows += len(figs)
                    self.sink.ingest_window_figures(figs)
                else:
                    self.stats.refused += 1
        records, new_ranks = self.fold.add(parts, self.sink.held_fold, time.time(), self.sink.admit_job)
        if records:
            self.sink.ingest_steps(ENGINE_AGENT, records)
            self.stats.records_ingested += len(records)
        # After the records: a restart's first fold ends the store's run, and with it that run's ranks
        for job, ranks in new_ranks.items():
            self.sink.note_folded_ranks(job, ranks)
        self._summaries_follow()

    def _summaries_follow(self) -> None:
        """The summaries follow the fold: jobs it let go of, or that began a new run (whose iterations
        may bear the last run's numbers), let go of; iterations it made whole answered."""
        if self.stats.jobs_forgotten != self._forgotten or self.fold.runs != self._runs:
            for job in list(self.summaries.answers.keys() | self.summaries.fold_jobs()):
                if job not in self.fold.jobs or self.fold.runs.get(job) != self._runs.get(job):
                    self.summaries.forget(job)
            for job in [j for j in self.comm.held
                        if j not in self.fold.jobs or self.fold.runs.get(j) != self._runs.get(j)]:
                self.comm.forget(job)  # gone, or a new run (whose iterations may bear the last run's numbers)
            self._forgotten, self._runs = self.stats.jobs_forgotten, dict(self.fold.runs)
        while self.fold.completed:
            self.summaries.whole(*self.fold.completed.popleft())

    def _iteration_ranks(self, job: str, iteration: int) -> set[int] | None:
        """The ranks the partials brought of an iteration the fold still holds."""
        held = self.fold.jobs.get(job)
        acc = held.get(iteration) if held is not None else None
        return acc.ranks if acc is not None else None

    def handle_summaries(self, batch: Sequence[bytes]) -> None:
        """The shards' step and communication summaries (EngineBatch ``step_summaries``,
        ``comm_summaries``), held beside the partials' folds."""
        got: list[StepSummary] = []
        comm: list[CommSummary] = []
        for data in batch:
            try:
                b = pb.EngineBatch.FromString(data)
            except DecodeError as exc:
                self.stats.undecodable += 1
                log.warning("engine root %s: a summaries message that does not decode (%s): skipped",
                            self.id, exc)
                continue
            got.extend(self._read(b.step_summaries, summary_codec.from_pb, "step summary"))
            comm.extend(self._read(b.comm_summaries, comm_codec.from_pb, "communication summary"))
        self.summaries.add(got, lambda job: job in self.fold.jobs or self.sink.admit_job(job))
        self.comm.add(comm, lambda job: job in self.fold.jobs or self.sink.admit_job(job))

    def _read(self, ms: Iterable[M], read: Callable[[M], T], what: str) -> list[T]:
        """Each of ``ms`` read; one that does not (another version, malformed) counted and skipped."""
        out = []
        for m in ms:
            try:
                out.append(read(m))
            except ValueError as exc:
                self.stats.undecodable += 1
                log.warning("engine root %s: a %s that does not read (%s): skipped", self.id, what, exc)
        return out

    def flush(self, every: bool = False) -> None:
        """Hand the store what the fold held back (perfd.engine.rootfold.HAND_ON_S) and is now due;
        ``every``: all of it."""
        records = self.fold.flush(time.time(), every)
        if records:
            self.sink.ingest_steps(ENGINE_AGENT, records)
            self.stats.records_ingested += len(records)

    def handle_records(self, batch: Sequence[bytes]) -> None:
        """Hand the nodes' events and collective records on, each as its agent's."""
        for data in batch:
            decoded = self._decoded(data, "records", _records_of)
            if decoded is None:
                continue
            d, got = decoded
            self.stats.node_records_messages += 1
            if got is not None:
                self.stats.events += len(got.events)
                self.stats.collectives += len(got.collectives)
                self.sink.ingest_records(d.sender, got.events, got.collectives)
            self.stats.collectives_folded += d.collectives_folded
            for part in d.collectives:
                self.stats.collective_partials += 1
                self.stats.collectives += len(part)
                self.sink.ingest_collective_partial(d.sender, part, d.collectives_folded)


def _records_of(d: Decoded) -> tuple[Decoded, DecodedBatch | None]:
    """A records message's events and collective records, as sent (None: it carries only reduced
    ones); ValueError: none of either, or they do not decode."""
    if d.records is None and not d.collectives:
        raise ValueError("a records message without records")
    return d, decode_batch(d.records, {}) if d.records is not None else None


async def _advertised(kv: KeyValue, key: str) -> str | None:
    """The leading root's HTTP under ``key``, if it advertises one (None: none, or it expired with it)."""
    try:
        e = await kv.get(key)
    except Exception:  # no such key (nats' KeyNotFoundError and kin): no leader advertises
        return None
    return e.value.decode(errors="replace") if e.value else None

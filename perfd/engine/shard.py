"""``perfd shard``: one of the processes that reduce a large job's node messages between the agents
and the job's root.

A shard holds partitions of the node stream by lease (perfd.engine.leases): as many as its fair share
of the shards alive (each renews a member key), taking a partition whose holder stopped renewing. Its
leases and member key are renewed on a thread of their own, with its own connection
(perfd.engine.lease_keeper says why): a fold that keeps the event loop busy does not lose them. From
each partition's durable consumer it folds what arrives into one Partial per (job, iteration)
(several, each of at most MAX_PARTIAL_RANKS ranks) and every FLUSH_S publishes them to the job's
partials subject, in as few messages as the engine's largest message allows; only once the engine
acknowledged that does it acknowledge the node messages folded in. A shard killed at any point leaves
its unacknowledged messages to the engine, which delivers them again (after the ack wait) to whoever
holds the partition next; a message that reached the root twice that way is folded once
(perfd.core.stepfold) and counted.

Given a collective fold (``perfd shard`` wires perfd.analytics.collectives.shardfold's in), the shard
also folds the operations its nodes' agents send beside their step partials into per-window figures,
published to the job's root with the partials; a message's acknowledgement then waits for the
windows it fed to settle (perfd.engine.shard_windows says why). Figures an agent folded itself (its
``window_fold``: perfd.engine.publisher says when) come in place of those operations and are handed
on as they came, fold or none, with the partials of the same flush; their messages are acknowledged
once they are out, as the partials' are (a message delivered again hands the same rows on: a join).
Each partition's step summaries (perfd.engine.shard_summaries) go out beside the partials, after them
in the same flush: a node message is acknowledged once what it fed of both is out. Given a summariser
(``perfd shard --comm-summaries`` wires perfd.analytics.collectives.comm_summary's in), the agents' figures
are held by partition and summarised (perfd.engine.shard_comm), the summaries sent on the same subject as
they come due, in place of the rows: the root reads the job's shares from them (its work no longer grows
with the ranks'). The rows are saved to the engine as they are taken, before their messages are
acknowledged, and a partition's next holder reads them back before it summarises it (perfd.engine
.comm_rows): a lease that moves takes no row with it (the root takes the new holder's summary in place of
this one's once it holds a newer iteration: perfd.engine.root_comm).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from perfd.core.phase import Phase
from perfd.core.record_json import JsonWritten
from perfd.core.winfigures import WindowFigures
from perfd.engine import comm_rows, figures_codec
from perfd.engine import subjects as S
from perfd.engine.connect import close_bounded, connect, ensure_streams
from perfd.engine.lease_keeper import LeaseKeeper, keep_beating
from perfd.engine.leases import holders
from perfd.engine.nats_api import JetStream, KeyValue, Msg
from perfd.engine.partial import Decoded, Partial, decode, encode, encode_batches
from perfd.engine.shard_comm import CommSummaries, ShardComm, comm_messages
from perfd.engine.shard_jobinfo import JobInfoBucket
from perfd.engine.shard_summaries import ShardSummaries, batches
from perfd.engine.shard_windows import CollectiveFold, Holds
from perfd.transport.gen import perfd_pb2 as pb

log = logging.getLogger("perfd.engine")

FLUSH_S = 0.25  # a node message waits at most this long in a shard before its partial leaves
FETCH_BATCH = 512
FETCH_TIMEOUT_S = 0.5
MEMBER_PREFIX = "member."
# Node messages a partition's consumer hands out before they are acknowledged: a few fetches. More
# would let a slow shard take what it cannot fold within the ack wait, delivered again to no purpose.
MAX_ACK_PENDING = 4 * FETCH_BATCH
# With a collective fold, a message stays unacknowledged until its windows settle (about three
# iterations, 14 s at most: shard_windows): a partition of a 100,000-rank job over 16 partitions has
# ~780 node messages an iteration out at once. (Set by the durable consumer's first creator.)
MAX_ACK_PENDING_HELD = 16 * FETCH_BATCH
# A partial's ranks at most: ~48 bytes a rank on the wire (the step hook's records), so ~200 KB, well
# under nats-server's 1 MiB message. One shard holding a 100,000-rank job folded it into one partial of
# ~4.8 MB, which the engine refused at every flush (perfd bench engine --shards 1): nothing got through.
MAX_PARTIAL_RANKS = 4096
DEFAULT_MAX_PAYLOAD = 1 << 20  # nats-server's default, where the server did not say its own
YIELD_EVERY = 8  # node messages folded between two turns of the event loop
FLUSH_FIRST_S = 1.0  # a fold's turn waits this long at most for a flush under way (Shard._flush_first)



@dataclass
class ShardStats(JsonWritten):
    node_messages: int = 0
    # node messages the engine delivered more than once (an ack wait ran out: a fold or a flush held past
    # it, a partition moved with messages out): folded once at the root, which counts them (redelivered)
    delivered_again: int = 0
    undecodable: int = 0
    partials_published: int = 0
    batches_published: int = 0
    publish_errors: int = 0
    # node messages in partials a failed publish held (sent again: where the engine had stored the first
    # before its acknowledgement was lost, the root reads them twice, folds them once, counts redelivered)
    messages_resent: int = 0
    leases_taken: int = 0
    leases_lost: int = 0
    consumer_restarts: int = 0
    takeover_waits: int = 0  # partitions taken with messages of a previous holder due again first
    # window figures its nodes' agents folded themselves (perfd.engine.publisher's window_fold), handed on
    figure_rows_forwarded: int = 0
    summaries_published: int = 0  # partition summaries sent (each a partition's iteration so far)
    summaries_too_old: int = 0  # node partials of an iteration whose summaries were let go: not summarised
    comm_summaries_published: int = 0  # partitions' communication-share summaries sent
    # job infos read from the engine's job-info bucket (a job this shard had not read it of, its node
    # message carrying none: a partition taken over), and puts to it the engine refused
    job_infos_read: int = 0
    job_info_put_errors: int = 0
    job_info_gets_late: int = 0  # bucket gets not answered in time: read when answered
    summaries_restaged: int = 0  # summaries whose ranks were grouped by stage once their job's info was read
    stage_rows_dropped: int = 0  # ranks' rows not kept for that past stepsummary.UNSTAGED_MAX_ROWS
    partitions: list[int] = field(default_factory=list)


class Shard:
    def __init__(self, cfg: S.EngineConfig, shard_id: str, replicas: int = 1,
                 collectives: CollectiveFold | None = None, comm: ShardComm | None = None) -> None:
        self.cfg, self.id, self.replicas = cfg, shard_id, replicas
        self.windows = Holds(collectives, cfg.hold_s) if collectives is not None else None
        self.epoch = uuid.uuid4().hex[:12]
        self.stats = ShardStats()
        self._pending: dict[tuple[str, int], list[Partial]] = {}
        self._max_bytes = DEFAULT_MAX_PAYLOAD - 4096  # the message headers' room kept
        self._job_info: dict[str, str] = {}
        self.infos = JobInfoBucket(None)  # the engine's job-info bucket, once a session has it
        # Figures an agent folded, by job: handed on as they came, undecoded (the root's join merges
        # them), with or without a fold of this shard's own, their messages acknowledged once they are
        # out. Decoded into rows, joined and encoded again, they were most of the shard's CPU for them.
        self._forward: dict[str, list[pb.WindowFigures]] = {}
        self._to_ack: list[Msg] = []
        self._to_term: list[Msg] = []
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._stops: dict[int, asyncio.Event] = {}  # a partition's consumer ends between two fetches
        self._leases: dict[int, str] = {}  # partition -> its lease's key, held through _keeper
        self._keeper: LeaseKeeper | None = None
        self._flushes = 0
        self._connected_once = False
        self._naks: set[asyncio.Future[list[BaseException | None]]] = set()
        self._flushing = 0  # flushes under way
        self._flushed = asyncio.Event()  # set while none is
        self._flushed.set()
        self._flush_due_at = math.inf  # the flush loop's next flush (inf: no loop running)
        self.summaries = ShardSummaries()
        self.comm = comm
        self._later: set[asyncio.Task[int]] = set()  # partitions' second readings back (comm_rows)

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``; a connection lost after the first is made again (backoff), with what was
        folded and not published kept. The first failing raises (a wrong URL or credentials: the
        command says so and exits)."""
        delay = 1.0
        while not stop.is_set():
            began = time.monotonic()
            try:
                await self._session(stop)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._connected_once:
                    raise
                if time.monotonic() - began > 60.0:  # a session that worked: the next wait starts short
                    delay = 1.0
                self.stats.publish_errors += 1
                log.warning("shard %s: %s: %s; again in %.0f s", self.id, type(exc).__name__, exc, delay)
                for p in list(self._leases):
                    self._drop(p)  # their leases expire; this shard takes its share again after
                try:
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass
                delay = min(30.0, delay * 2)

    async def _session(self, stop: asyncio.Event) -> None:
        nc = await connect(self.cfg, f"perfd-shard {self.id}")
        self._connected_once = True
        self._max_bytes = (nc.max_payload or DEFAULT_MAX_PAYLOAD) - 4096
        keeper = None
        try:
            await ensure_streams(nc, self.cfg, self.replicas, comm_rows=self.comm is not None)
            js = nc.jetstream()
            kv = await js.key_value(S.LEASES_BUCKET)
            try:
                self.infos.kv = await js.key_value(S.JOBINFO_BUCKET)
            except Exception as exc:  # an engine that could not make it (perfd.engine.shard_jobinfo)
                self.infos.kv = None
                log.warning("shard %s: no job-info bucket on the engine (%s): a partition taken over "
                            "groups its ranks by stage once the agents send the job's info", self.id, exc)
            keeper = self._keeper = LeaseKeeper(self.cfg, self.id, f"{MEMBER_PREFIX}{self.id}")
            await keeper.start()
            tasks = Phase(f"engine shard {self.id}")  # they end with the session (perfd.core.phase)
            tasks.spawn(self._flush_loop(js, tasks.over))
            tasks.spawn(keep_beating(keeper))
            try:
                while not stop.is_set():
                    await self._balance(js, kv, keeper)
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=self.cfg.renew_s)
                    except asyncio.TimeoutError:
                        pass
            finally:
                leases = list(self._leases.values())
                await self._retire(list(self._tasks), kv)
                await self._flush(js)  # what was folded leaves before the leases do
                await tasks.end()
                for key in leases:
                    await keeper.release(key)
        finally:
            if keeper is not None:
                await keeper.close()
            self._keeper = None
            await close_bounded(nc, f"shard {self.id}")

    async def _balance(self, js: JetStream, kv: KeyValue, keeper: LeaseKeeper) -> None:
        """Drop what the keeper lost; take free partitions up to the fair share; give back what is
        over it."""
        lost = set(keeper.take_lost())
        for p, key in list(self._leases.items()):
            if key in lost or not keeper.held(key):
                self.stats.leases_lost += 1
                log.warning("shard %s: partition %d's lease lost", self.id, p)
                self._drop(p)
                if key not in lost:  # past its time, still the keeper's: let go (a compare-and-set delete),
                    await keeper.release(key)  # or it renews a partition nobody consumes
                continue
            t = self._tasks.get(p)
            if t is not None and t.done():  # a consumer that ended: said, counted, started again
                why = t.exception() if not t.cancelled() else None
                self.stats.consumer_restarts += 1
                log.warning("shard %s: partition %d's consumer ended (%r): started again", self.id, p, why)
                self._start(js, p, kv)
        members = max(1, len(await holders(js, kv, MEMBER_PREFIX)))
        share = math.ceil(self.cfg.partitions / members)
        # Each shard starts looking at its own offset, so shards starting together take different ones.
        start = int.from_bytes(self.id.encode()[-4:].rjust(4, b"\0"), "big") % self.cfg.partitions
        for k in range(self.cfg.partitions):
            if len(self._leases) >= share:
                break
            p = (start + k) % self.cfg.partitions
            if p in self._leases:
                continue
            key = S.partition_lease(p)
            if await keeper.acquire(key):
                self.stats.leases_taken += 1
                self._leases[p] = key
                self._start(js, p, kv)
                log.info("shard %s: holds partition %d", self.id, p)
        over = sorted(self._leases)[share:]  # over the share (more shards now): give them back
        if over:
            keys = [self._leases[p] for p in over]
            await self._retire(over, kv)
            await self._flush(js)  # what they fetched is acknowledged before another shard holds them
            for key in keys:
                await keeper.release(key)
        self.stats.partitions = sorted(self._leases)

    def _start(self, js: JetStream, p: int, kv: KeyValue) -> None:
        stop = self._stops[p] = asyncio.Event()
        self._tasks[p] = asyncio.create_task(self._consume(js, p, stop, kv))

    def _drop(self, p: int) -> None:
        """At once (the lease is lost, or the connection): what the consumer had fetched and not
        folded is delivered again after the ack wait; what it held for its windows is handed back (at once,
        where the connection still works). A shard that took the partition meanwhile waits out the ack
        wait before fetching (shard_windows): those come to it first either way."""
        if self.windows is not None:
            self._hand_back(self.windows.drop(p))
        if self.comm is not None:
            self.comm.drop_partition(p)
        self._stops.pop(p, asyncio.Event()).set()
        t = self._tasks.pop(p, None)
        if t is not None:
            t.cancel()
        self._leases.pop(p, None)

    def _hand_back(self, msgs: list[Msg]) -> None:
        """Held messages of a partition this shard gives up: delivered again at once, before newer
        ones, to the next holder (which folds them from the windows they fed; best effort: one not
        handed back comes again after the ack wait)."""
        if msgs:
            task = asyncio.ensure_future(asyncio.gather(*(m.nak() for m in msgs), return_exceptions=True))
            self._naks.add(task)
            task.add_done_callback(self._naks.discard)

    async def _retire(self, partitions: list[int], kv: KeyValue | None = None) -> None:
        """Between two fetches (each ends within FETCH_TIMEOUT_S): what the consumers fetched is
        folded, so a partition handed over (or a shard stopped) leaves nothing waiting out the ack
        wait for the next holder. A consumer that does not end in time is cancelled. Messages held for
        their windows are handed back, and the partition marked handed (``kv``)."""
        tasks = []
        for p in partitions:
            self._stops.pop(p, asyncio.Event()).set()
            self._leases.pop(p, None)
            t = self._tasks.pop(p, None)
            if t is not None:
                tasks.append(t)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=FETCH_TIMEOUT_S + 2.0)
            for t in late:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.comm is not None:  # the next holder's to summarise
            for p in partitions:
                self.comm.drop_partition(p)
        if self.windows is not None:
            for p in partitions:
                self._hand_back(self.windows.drop(p))
            await asyncio.gather(*self._naks, return_exceptions=True)
            if kv is not None:
                for p in partitions:
                    try:
                        await kv.put(S.partition_handed(p), self.id.encode())
                    except Exception as exc:  # the next holder waits out the ack wait instead
                        log.info("shard %s: partition %d not marked handed (%s)", self.id, p, exc)

    async def _consume(self, js: JetStream, p: int, stop: asyncio.Event, kv: KeyValue) -> None:
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.api import AckPolicy, ConsumerConfig

        sub = await js.pull_subscribe(
            S.partition_filter(p), durable=S.shard_consumer(p), stream=S.NODES_STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=self.cfg.ack_wait_s,
                                  max_ack_pending=MAX_ACK_PENDING if self.windows is None
                                  else MAX_ACK_PENDING_HELD))
        info = await js.consumer_info(S.NODES_STREAM, S.shard_consumer(p))
        if info.config.ack_wait != self.cfg.ack_wait_s:
            # The durable consumer keeps the ack wait its first maker gave it (nats-py's pull_subscribe
            # changes nothing of one that exists): a changed --engine-ack-wait would have its messages
            # delivered again on the old one, not the one this shard's holds and takeover are sized to
            log.warning("shard %s: partition %d's consumer has an ack wait of %s s: set to this shard's "
                        "%s s (--engine-ack-wait, the same on every shard)", self.id, p,
                        info.config.ack_wait, self.cfg.ack_wait_s)
            info = await js.add_consumer(S.NODES_STREAM,
                                         dataclasses.replace(info.config, ack_wait=self.cfg.ack_wait_s))
        if self.windows is not None and not await _handed(kv, p) and info.num_ack_pending:
            # A previous holder's messages are out (it stopped without handing them back): once due
            # again the engine hands them out before newer ones, which folded first would settle
            # windows past them (shard_windows)
            self.stats.takeover_waits += 1
            log.info("shard %s: partition %d has messages of its last holder out: fetching in %.0f s",
                     self.id, p, self.cfg.ack_wait_s)
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.cfg.ack_wait_s)
            except asyncio.TimeoutError:
                pass
        if self.comm is not None:  # the rows its former holders saved, then (where it had messages out)
            # what it saves late, once they are due again
            held = lambda: p in self._leases  # noqa: E731
            await comm_rows.read_back(js, self.comm, p, stop, held)
            if info.num_ack_pending:
                self._later.add(asyncio.create_task(comm_rows.read_back(js, self.comm, p, stop, held,
                                                                        after_s=self.cfg.ack_wait_s)))
                self._later = {t for t in self._later if not t.done()}
        key = S.partition_lease(p)
        # When the last fetch asked, if it came back short: its pull may have delivered more after it
        # stopped waiting (until the pull expired, within FETCH_TIMEOUT_S), which nats-py queued for
        # the next fetch (each fetch takes the queued ones first)
        short: float | None = None
        while not stop.is_set() and (self._keeper is None or self._keeper.held(key)):
            # (a lease lost: nothing more fetched; _balance drops the partition)
            asked = time.monotonic()
            try:
                msgs = await sub.fetch(FETCH_BATCH, timeout=FETCH_TIMEOUT_S)
            except (NatsTimeout, asyncio.TimeoutError):  # nats-py raises either when nothing came
                short = asked
                continue
            # A message's ack wait runs from its delivery, no earlier than the pull that delivered it
            delivered = asked if short is None else short
            short = None if len(msgs) == FETCH_BATCH else asked
            for k, m in enumerate(msgs):
                if (m.metadata.num_delivered or 1) > 1:
                    self.stats.delivered_again += 1
                d = self._decode(m)
                if d is not None:  # a job's info it lacks, before the hold's time is read
                    await self.infos.fill(d, self.summaries)
                if time.monotonic() - delivered >= self.cfg.hold_s:
                    # A fold this slow would have the rest delivered again before folded: their ack
                    # wait starts again (nats' in-progress ack), sent before the next one is folded
                    delivered = await _in_progress(msgs[k:])
                if d is not None:
                    self._fold_in(d, m, p, delivered)
                if k % YIELD_EVERY == YIELD_EVERY - 1:
                    # a node message takes ~1-5 ms to fold with its operations, ~0.1-1 without: the
                    # flushes that acknowledge what is folded run between them (512 in one go held the
                    # loop seconds: the leases expired, or the fetch's last were delivered again)
                    await asyncio.sleep(0)
                    await self._flush_first(js)
        try:
            await sub.unsubscribe()
        except Exception as exc:  # the connection is going: the server forgets the subscription
            log.debug("shard %s: partition %d unsubscribe: %s", self.id, p, exc)

    async def _flush_first(self, js: JetStream) -> None:
        """A flush under way finishes before the fold goes on (FLUSH_FIRST_S at most): a fold taking the
        turns its acks need (8 messages, 0.1 s each) held them past the ack wait. One due and not begun
        runs here: its timer's wake-up is queued behind the fold's turn, so its task began only after one
        or two more turns' folds."""
        if not self._flushing and time.monotonic() >= self._flush_due_at:
            await self._flush(js)
        elif self._flushing:
            try:
                await asyncio.wait_for(self._flushed.wait(), FLUSH_FIRST_S)
            except asyncio.TimeoutError:
                pass

    def _decode(self, m: Msg) -> Decoded | None:
        """A node message decoded (None: it is not one, terminated and counted)."""
        self.stats.node_messages += 1
        try:
            d = decode(m.data, figures_raw=True)
            for f in d.figures_pb:
                figures_codec.check(f)
        except ValueError as exc:
            self.stats.undecodable += 1
            log.warning("shard %s: a node message that is not an EngineBatch (%s): terminated", self.id, exc)
            self._to_term.append(m)  # never delivered again: it would fail the same way
            return None
        return d

    def _fold_in(self, d: Decoded, m: Msg, partition: int, delivered: float) -> None:
        """``delivered``: no later than the engine delivered ``m`` (time.monotonic()): a hold on it
        ends within the hold (``cfg.hold_s``) of that, under the engine's ack wait however long the fold
        took."""
        self.stats.summaries_too_old += self.summaries.fold_in(d.job_info_json, d.partials, partition)
        for part in d.partials:
            held = self._pending.setdefault((part.job, part.iteration), [])
            if held and len(held[-1].ranks) + len(part.ranks) <= MAX_PARTIAL_RANKS:
                held[-1].merge(part)
            else:
                held.append(part)
        self._job_info.update(d.job_info_json)
        if self.comm is not None:  # summarised, in place of the rows: the root reads its shares from those
            for part in d.partials:
                if part.new_run:
                    self.comm.new_run(part.job, partition, part.iteration, delivered)
            if d.figures_pb:
                self.comm.fold_in(d.figures_pb, partition, delivered)
        else:
            for f in d.figures_pb:
                self._forward.setdefault(f.job, []).append(f)
        if self.windows is None or not self.windows.fold_in(d, m, partition, delivered):
            self._to_ack.append(m)

    def _next_batch_id(self) -> str:
        self._flushes += 1
        return f"{self.id}:{self.epoch}:{self._flushes}"

    async def _flush_loop(self, js: JetStream, over: asyncio.Event) -> None:
        self._flush_due_at = time.monotonic() + FLUSH_S
        try:
            while not over.is_set():
                await asyncio.sleep(max(0.0, self._flush_due_at - time.monotonic()))
                if self._flushing:  # one a fold ran (_flush_first): its end says when the next is due
                    await self._flushed.wait()
                elif time.monotonic() >= self._flush_due_at:
                    await self._flush(js)
        finally:
            self._flush_due_at = math.inf

    async def _flush(self, js: JetStream) -> None:
        # Under way from its start (_flush_first): marked from its publishing only, the in-progress acks
        # of the holds it extended waited behind 8 messages folded; the engine delivered 8 again.
        self._flushing += 1
        self._flushed.clear()
        try:
            await self._flush_now(js)
        finally:
            self._flushing -= 1
            if not self._flushing:
                self._flushed.set()
            if self._flush_due_at != math.inf:  # the loop's next one: FLUSH_S after this one ended
                self._flush_due_at = time.monotonic() + FLUSH_S

    async def _flush_now(self, js: JetStream) -> None:
        st, infos = self.stats, self.infos  # the bucket's counts (a late get's answer lands between folds)
        st.job_infos_read, st.job_info_put_errors = infos.read, infos.put_errors
        st.job_info_gets_late, st.summaries_restaged = infos.late, self.summaries.restaged
        st.stage_rows_dropped = self.summaries.held.unstaged_dropped
        if self.windows is not None:
            extended = self.windows.extend(time.monotonic())
            if extended:  # their ack wait started again before their holds run out
                await _in_progress(extended)
        figures = self.windows.take() if self.windows is not None else []
        released = self.windows.release(time.monotonic()) if self.windows is not None else []
        forward, self._forward = self._forward, {}
        comm = self.comm.take(time.monotonic()) if self.comm is not None else {}
        if not (self._pending or self._job_info or self._to_term or self._to_ack or figures or released
                or forward or self.summaries.touched or comm):
            return
        await self._publish(js, figures, released, forward, comm)

    async def _publish(self, js: JetStream, figures: list[WindowFigures], released: list[Msg],
                       forward: dict[str, list[pb.WindowFigures]], comm: CommSummaries) -> None:
        """What was folded to the job's root (``figures``: this shard's fold's; ``forward``: its agents'),
        then what it fed acknowledged."""
        pending, infos, to_ack = self._pending, self._job_info, self._to_ack
        self._pending, self._job_info, self._to_ack = {}, {}, []
        summaries, summary_keys = self.summaries.take()
        saves = self.comm.take_saves() if self.comm is not None else {}
        by_job: dict[str, list[Partial]] = {}
        for (job, _), parts in pending.items():
            by_job.setdefault(job, []).extend(parts)
        for job in infos:
            by_job.setdefault(job, [])
        try:
            for job, parts in by_job.items():
                info = {job: infos[job]} if job in infos else None
                for bid, data in encode_batches(self._next_batch_id, self.id, time.time_ns(), parts, info,
                                                self._max_bytes):
                    await js.publish(S.partials_subject(job), data, timeout=5.0, headers={"Nats-Msg-Id": bid})
                    self.stats.batches_published += 1
                self.stats.partials_published += len(parts)
            # The figures after the partials: the windows they are of came with those step ends
            for figs in figures:
                for piece in figures_codec.chunks(figs):
                    bid = self._next_batch_id()
                    await js.publish(S.partials_subject(figs.job), encode(bid, self.id, time.time_ns(), (),
                                                                         figures=[piece]),
                                     timeout=5.0, headers={"Nats-Msg-Id": bid})
                    if self.windows is not None:
                        self.windows.stats.figure_messages += 1
            for job, raw in forward.items():
                for batch in figures_codec.grouped(raw):
                    bid = self._next_batch_id()
                    b = pb.EngineBatch(id=bid, sender=self.id, created_ns=time.time_ns())
                    b.window_figures.extend(batch)
                    await js.publish(S.partials_subject(job), b.SerializeToString(), timeout=5.0,
                                     headers={"Nats-Msg-Id": bid})
            self.stats.figure_rows_forwarded += sum(len(f.iteration) for raw in forward.values() for f in raw)
            if self.comm is not None:  # what it took (before their messages' acks), what it let go of around
                await comm_rows.purge(js, self.comm, whole=True)
                n = await comm_rows.save(js, saves, self._next_batch_id, self.id)
                self.comm.stats.saved_messages += n
                await comm_rows.purge(js, self.comm, whole=False)
            for job, ms in summaries.items():  # after the partials they summarise
                for bid, data in batches(ms, self._next_batch_id, self.id, self._max_bytes):
                    await js.publish(S.summaries_subject(job), data, timeout=5.0,
                                     headers={"Nats-Msg-Id": bid})
                self.stats.summaries_published += len(ms)
            for job, bid, data in comm_messages(comm, self._next_batch_id, self.id):
                await js.publish(S.summaries_subject(job), data, timeout=5.0, headers={"Nats-Msg-Id": bid})
                self.stats.comm_summaries_published += 1
        except Exception as exc:  # the engine is away: fold it back, acknowledge nothing, retry
            self.stats.publish_errors += 1
            self.stats.messages_resent += sum(len(p.messages) for parts in pending.values() for p in parts)
            log.warning("shard %s: publishing partials failed (%s): kept, retried", self.id, exc)
            for key, parts in pending.items():
                self._pending[key] = parts + self._pending.get(key, [])
            self._job_info = {**infos, **self._job_info}
            self._to_ack = to_ack + self._to_ack
            if self.windows is not None:
                self.windows.give_back(figures)
                self.windows.hold_again(released, time.monotonic())
            for job, raw in forward.items():
                self._forward[job] = raw + self._forward.get(job, [])
            self.summaries.give_back(summary_keys)
            if self.comm is not None:
                self.comm.again(comm)
                self.comm.saves_again(saves)
            return
        terms, self._to_term = self._to_term, []
        for m in terms:
            try:
                await m.term()
            except Exception as exc:  # delivered again and terminated then
                log.info("shard %s: term failed (%s)", self.id, exc)
        for m in [*to_ack, *released]:
            try:
                await m.ack()
            except Exception as exc:  # delivered again later, folded once at the root
                log.info("shard %s: ack failed (%s): the engine delivers it again", self.id, exc)
        await self.infos.put(infos)  # after the acks: for a shard taking one of these jobs' partitions over


async def _in_progress(msgs: Sequence[Msg]) -> float:
    """Each message's ack wait started again; returns a time no later than the engine restarted them."""
    now = time.monotonic()
    done = await asyncio.gather(*(m.in_progress() for m in msgs), return_exceptions=True)
    failed = [r for r in done if isinstance(r, BaseException)]
    if failed:  # the connection is going: those are delivered again, folded once at the root
        log.info("shard: %d in-progress acks failed (%s)", len(failed), failed[0])
    await asyncio.sleep(0)  # nats-py's flusher sends them on a turn of the loop
    return now


async def _handed(kv: KeyValue, p: int) -> bool:
    """Whether the partition's last holder gave it up on purpose, its held messages handed back (the
    mark is taken: it is for this hand-over only)."""
    try:
        e = await kv.get(S.partition_handed(p))
    except Exception:  # no such key (nats' KeyNotFoundError and kin): not handed, or it expired
        return False
    if not e.value:
        return False
    try:
        await kv.delete(S.partition_handed(p))
    except Exception as exc:  # it expires with the bucket's TTL
        log.debug("partition %d: handed mark not deleted (%s)", p, exc)
    return True

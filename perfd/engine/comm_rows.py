"""A shard's held window-figure rows (perfd.engine.shard_comm, with ``perfd shard --comm-summaries``)
saved to the engine and read back by a partition's next holder (perfd.engine.subjects.COMMROWS_STREAM).

Why the engine holds them. With the summaries on, the agents' rows go no further than the shard that
holds their partition: the root reads only the summaries made of them. The node messages that brought the
rows are acknowledged once their partials are out (the step path needs no more), so a partition whose
lease moved — its shard killed, or its loop held past the lease's TTL — took every row it had with it, and
its next holder's summaries were of the windows that came after (the root then read fewer windows than one
aggregator would). Each agent message whose rows went in is published here before its node message is
acknowledged, under its newest iteration's subject and tagged with the job's run the holder knows (a
restart's rows, perhaps of lower iteration numbers, must not join the last run's); what the holder lets go
of is purged; the next holder reads the partition's subjects back before it summarises it. A row read back
twice, or read back and delivered again, is one row (the holder's join by (iteration, rank)); a later
run's rows read back let go of an earlier run's held, and an earlier run's are skipped. A restart's last-run
rows are not purged (a purge by subject cannot tell the runs apart): they age out with the stream.

The readings back: at the take, and again after the ack wait where the former holder had messages out (a
holder that lost its lease saves and acknowledges what it folded at its next flush, which a holder held
past its TTL may send after the new one read back; what it did not acknowledge by then comes to the new
holder itself). The agents' messages are saved as they came (not decoded and encoded again: that was most
of a shard's CPU for them when it handed them on decoded).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable

from perfd.engine import figures_codec
from perfd.engine import subjects as S
from perfd.engine.nats_api import JetStream
from perfd.engine.shard_comm import NO_RUN, Run, Saves, ShardComm
from perfd.transport.gen import perfd_pb2 as pb

log = logging.getLogger("perfd.engine")

PUBLISH_TIMEOUT_S = 5.0
READ_BATCH = 64  # messages a fetch of the reading back (each up to figures_codec.MAX_ROWS rows)
READ_TIMEOUT_S = 5.0  # a fetch that brings nothing in this long ends the reading (counted)
READER_IDLE_S = 10.0  # the reading's consumer, ephemeral, is let go by the server once idle this long

RUN_HEADER = "Perfd-Run"  # the run a saved message's rows are of: "<ns>:<iteration>" (ShardComm's Run)


def run_header(run: Run) -> str:
    return f"{run[0]}:{'' if run[1] is None else run[1]}"


_RUN_VALUE = re.compile(r"(\d{1,19}):(\d{0,19})")


def read_run(value: str | None) -> Run:
    """ValueError for a value run_header does not write (a time past any clock's would have every later
    reading let go of what it holds)."""
    if value is None:
        return NO_RUN
    m = _RUN_VALUE.fullmatch(value)
    if m is None or int(m[1]) >= 1 << 63:
        raise ValueError(f"not a run: {value[:40]!r}")
    return (int(m[1]), int(m[2]) if m[2] else None)


async def save(js: JetStream, saves: Saves, next_id: Callable[[], str], sender: str) -> int:
    """Publish ``saves`` (ShardComm.take_saves), each tagged with its run; raises where the engine refused
    one (the caller gives them back and acknowledges nothing). Returns the messages published."""
    n = 0
    for (job, partition, iteration, run), raw in saves.items():
        for group in figures_codec.grouped(raw):
            bid = next_id()
            b = pb.EngineBatch(id=bid, sender=sender, created_ns=time.time_ns())
            b.window_figures.extend(group)
            await js.publish(S.commrows_subject(job, partition, iteration), b.SerializeToString(),
                             timeout=PUBLISH_TIMEOUT_S,
                             headers={"Nats-Msg-Id": bid, RUN_HEADER: run_header(run)})
            n += 1
    return n


async def purge(js: JetStream, comm: ShardComm, whole: bool) -> None:
    """What the holder let go of since the last flush, purged (best effort: one the engine does not do is
    logged and counted, and ages out with the stream's max age): a job's whole partition (``whole``: a job
    forgotten) before the flush's saves, whose rows came since; an iteration evicted after them, as one
    saved in the same flush goes with it."""
    for job, partition, iteration in comm.take_purges(whole):
        await _purge(js, comm, job, partition, iteration)


async def _purge(js: JetStream, comm: ShardComm, job: str, partition: int, iteration: int | None) -> None:
    try:
        await js.purge_stream(S.COMMROWS_STREAM, subject=S.commrows_subject(job, partition, iteration))
    except Exception as exc:
        comm.stats.purge_errors += 1
        log.info("shard: saved rows of job %s partition %d not purged (%s): they age out", job, partition,
                 exc)


async def read_back(js: JetStream, comm: ShardComm, partition: int, stop: asyncio.Event,
                    held: Callable[[], bool], after_s: float = 0.0) -> int:
    """The partition's saved rows folded into ``comm`` (its summaries held back meanwhile), ``after_s``
    from now; returns the messages read. A reading that fails or ends early keeps what it read, logged and
    counted; one whose partition was let go meanwhile (``stop``) and is not held again (``held``) leaves
    nothing of it held."""
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    if after_s > 0:
        try:
            await asyncio.wait_for(stop.wait(), timeout=after_s)
        except asyncio.TimeoutError:
            pass
    if stop.is_set():
        return 0
    comm.replaying[partition] = comm.replaying.get(partition, 0) + 1
    comm.stats.replays += 1
    read, began = 0, time.monotonic()
    try:
        flt = S.commrows_filter(partition)
        info = await js.stream_info(S.COMMROWS_STREAM, subjects_filter=flt)
        if not sum((info.state.subjects or {}).values()):
            return 0
        sub = await js.pull_subscribe(flt, stream=S.COMMROWS_STREAM, config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=READER_IDLE_S))
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(READ_BATCH, timeout=READ_TIMEOUT_S)
                except (NatsTimeout, asyncio.TimeoutError):  # the count said more: ended early
                    comm.stats.replay_errors += 1
                    log.warning("shard: partition %d's saved rows stopped coming after %d messages",
                                partition, read)
                    break
                for m in msgs:
                    # (nats' JetStream messages carry their headers; the Msg protocol does not name them)
                    _fold_back(comm, m.data, getattr(m, "headers", None) or {}, partition)
                read += len(msgs)
                if not msgs or (msgs[-1].metadata.num_pending or 0) == 0:
                    break
                await asyncio.sleep(0)  # the flushes run between fetches
        finally:
            try:
                name = (await sub.consumer_info()).name
                await sub.unsubscribe()
                await js.delete_consumer(S.COMMROWS_STREAM, name)
            except Exception as exc:  # the server lets the consumer go once idle (READER_IDLE_S)
                log.debug("shard: partition %d reading back: its consumer not deleted: %s", partition, exc)
    except Exception as exc:  # the engine away: what was read is kept; the rows come again as they come
        comm.stats.replay_errors += 1
        log.warning("shard: reading back partition %d's saved rows failed after %d messages (%s)", partition,
                    read, exc)
    finally:
        left = comm.replaying.pop(partition, 1) - 1
        if left:
            comm.replaying[partition] = left
        if stop.is_set() and not held():  # let go of meanwhile (_drop): its rows are the next holder's
            comm.drop_partition(partition)
        took = time.monotonic() - began
        comm.stats.read_back_s += took
    log.info("shard: partition %d: %d messages of saved rows read back in %.1f s", partition, read, took)
    return read


def _fold_back(comm: ShardComm, data: bytes, headers: dict[str, str], partition: int) -> None:
    try:
        run = read_run(headers.get(RUN_HEADER))
        b = pb.EngineBatch.FromString(data)
        for f in b.window_figures:
            figures_codec.check(f)
    except Exception as exc:  # not what a shard saves: counted, the rest read
        comm.stats.replay_errors += 1
        log.warning("shard: partition %d: saved rows that do not decode (%s): skipped", partition, exc)
        return
    comm.fold_in(list(b.window_figures), partition, time.monotonic(), replayed=run)

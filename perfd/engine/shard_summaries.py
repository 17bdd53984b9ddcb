"""What a shard keeps and sends of its partitions' step summaries (perfd.engine.stepsummary), beside
the partials: per (job, iteration, partition) the summary of the ranks folded in so far, each flush
sending those it touched, whole, on the job's summaries subject (perfd.engine.subjects). A summary
sent again (the next flush, a retry after a failed one) stands for what this shard folded of the
partition's iteration so far, ordered by its flush: the root holds the newest of each partition's holder
(this shard's epoch), never adds two of one; a holder before or after this one (the lease moved) adds.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Sequence

from perfd.core.jobinfo_json import job_info_from_json
from perfd.engine import stepsummary as ss
from perfd.engine import summary_codec
from perfd.engine.partial import Partial
from perfd.transport.gen import perfd_pb2 as pb

# A job's newest iterations whose partition summaries a shard holds (the root's KEEP_ITERATIONS): a
# node message of an older one is not summarised (counted), since a summary of it made afresh from that
# message alone would stand, at the root, for the partition's whole iteration.
SUMMARY_ITERATIONS = 16
# A job no node message came for this long is let go of here (the root's IDLE_FORGET_S): what the
# shard holds is then its live jobs', not every job it ever saw
IDLE_FORGET_S = 600.0
BATCH_ROOM = 512  # bytes of a summaries message kept for its id, sender and time
Key = tuple[str, int, int]  # (job, iteration, partition)
# A job whose info this shard has not read: a shard that took the partition over mid-run reads it from
# the engine's job-info bucket (perfd.engine.subjects.JOBINFO_BUCKET: what the shards read from node
# messages) before it folds the job's first message, else from the next node message carrying it (on
# change, and once a minute on the engine: perfd.agent.node_agent.JOBINFO_RESEND_S). Until then its
# ranks' stages are not known (stage_unknown: the root shows no per-stage figures), not left out of the
# stages the former holder's summaries fill; once it is read, the summaries made meanwhile have their
# ranks grouped by stage and are sent again (stepsummary.PartitionSummaries.restage).
NO_INFO: tuple[str, Callable[[int], int | None] | None] = ("", lambda rank: None)


def holder_epoch() -> int:
    """This shard as a holder of its partitions (the root holds each holder's newest flush, and merges
    holders): its start in ns, its low bits random, so that two shards started in the same tick are two
    holders, not one."""
    return (time.time_ns() & ~0xFFFF) | secrets.randbits(16)


class ShardSummaries:
    def __init__(self) -> None:
        self.held = ss.PartitionSummaries()
        self.epoch = holder_epoch()
        self.seq = 0
        self._stages: dict[str, tuple[str, Callable[[int], int | None] | None]] = {}  # job -> (info, stages)
        self._newest: dict[str, int] = {}  # job -> its newest iteration summarised
        self._floor: dict[str, int] = {}  # job -> its oldest iteration still summarised
        self._run_began: dict[str, int] = {}  # job -> the iteration its newest run began at (new_run)
        self._seen: dict[str, float] = {}  # job -> when a node message of it was last summarised
        self.restaged = 0  # summaries whose ranks were grouped by stage when their job's info was read late
        self._expecting: set[str] = set()  # jobs whose info a get of the engine's bucket is fetching

    @property
    def touched(self) -> bool:
        return bool(self.held.touched)

    def has_info(self, job: str) -> bool:
        """Whether this shard read ``job``'s info (its ranks are grouped by stage)."""
        return job in self._stages

    def expect(self, job: str) -> None:
        """``job``'s info is on its way (a get of the engine's bucket out): its ranks folded until it
        comes are kept to be grouped by stage then. Only then: a job whose info never comes (no layout
        anywhere) keeps nothing for it."""
        if job not in self._stages:
            self._expecting.add(job)

    def not_expected(self, job: str) -> None:
        """No info of ``job`` is coming after all (the bucket had none, or did not answer): what was kept
        to group its ranks by stage let go; its summaries stay stage_unknown until a node message brings
        the info."""
        if job in self._expecting:
            self._expecting.discard(job)
            self.held.forget_unstaged(job)

    def fold_in(self, infos: dict[str, str], parts: Sequence[Partial], partition: int,
                now: float | None = None) -> int:
        """Each partial's ranks into its partition's summary, grouped by stage as the job's info (the
        latest this shard read: a hook job's node messages carry it) lays its ranks out. Returns the
        partials not summarised (of an iteration let go)."""
        for job, text in infos.items():
            if self._stages.get(job, ("", None))[0] != text:
                first = job not in self._stages
                try:
                    self._stages[job] = (text, ss.stages_of(job_info_from_json(text).layout))
                except ValueError:  # the root counts it undecodable; the ranks go ungrouped here
                    self._stages[job] = (text, None)
                if first:  # the ranks folded before it was read, into their stages now
                    self.restaged += self.held.restage(job, self._stages[job][1])
                    self._expecting.discard(job)
        too_old = 0
        now = time.monotonic() if now is None else now
        for part in parts:
            fold = part.fold
            if fold is None:  # a log's job-level records alone: no rank's
                continue
            job, it = part.job, part.iteration
            if part.new_run and self._run_began.get(job) != it:
                # a resumed job numbers its iterations again: the last run's summaries are not its
                self._run_began[job] = it
                self.held.drop_before(job, 1 << 62)
                self._floor.pop(job, None)
                self._newest.pop(job, None)
            if it < self._floor.get(job, it):
                too_old += 1
                continue
            self._newest[job] = max(it, self._newest.get(job, it))
            self._seen[job] = now
            self.held.add(partition, fold, part.ranks, self._stages.get(job, NO_INFO)[1],
                          new_run=part.new_run, layout_unread=job in self._expecting)
        return too_old

    def take(self, now: float | None = None) -> tuple[dict[str, list[pb.StepSummary]], list[Key]]:
        """The summaries touched since the last take, encoded now (they share their parts with what
        the next node message folds in), by job, and their keys; a job's iterations past the newest
        SUMMARY_ITERATIONS let go, and jobs idle IDLE_FORGET_S."""
        self.seq += 1
        by_job: dict[str, list[pb.StepSummary]] = {}
        keys = []
        for s in self.held.take(self.epoch, self.seq):
            m = pb.StepSummary()
            summary_codec.to_pb(s, m)
            by_job.setdefault(s.job, []).append(m)
            keys.append((s.job, s.iteration, s.partition))
        for job, newest in self._newest.items():
            floor = newest - SUMMARY_ITERATIONS + 1
            if floor > self._floor.get(job, floor - 1):
                self._floor[job] = floor
                self.held.drop_before(job, floor)
        now = time.monotonic() if now is None else now
        for job in [j for j, t in self._seen.items() if now - t > IDLE_FORGET_S]:
            self.held.drop_before(job, 1 << 62)
            for d in (self._stages, self._newest, self._floor, self._run_began, self._seen):
                d.pop(job, None)
            self._expecting.discard(job)
        return by_job, keys

    def give_back(self, keys: Sequence[Key]) -> None:
        """Taken summaries that did not go out: sent again, as they are by then, at the next take
        (those let go meanwhile: not)."""
        self.held.touched.update(k for k in keys if k in self.held.held)


def batches(ms: Sequence[pb.StepSummary], next_id: Callable[[], str], sender: str,
            max_bytes: int) -> Iterator[tuple[str, bytes]]:
    """A job's summaries in as few EngineBatch messages as the engine's largest message takes: (id,
    bytes) each."""
    b, size = pb.EngineBatch(sender=sender), 0
    for m in ms:
        n = m.ByteSize() + 8  # its field's tag and length
        if len(b.step_summaries) and size + n + BATCH_ROOM > max_bytes:
            b.id, b.created_ns = next_id(), time.time_ns()
            yield b.id, b.SerializeToString()
            b, size = pb.EngineBatch(sender=sender), 0
        b.step_summaries.append(m)
        size += n
    if len(b.step_summaries):
        b.id, b.created_ns = next_id(), time.time_ns()
        yield b.id, b.SerializeToString()

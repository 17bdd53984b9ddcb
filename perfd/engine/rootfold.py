"""What a job's root holds between the shards' partials (:class:`RootFold`): the fold of each recent
iteration of each job, what it keeps of those that left memory (:class:`Gone`), its counters
(:class:`RootStats`), and when an iteration goes to the store. Pure: perfd.engine.root reads the
streams and hands what this returns to the aggregator.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from perfd.core.model import StepRecord
from perfd.core.stepfold import RUN_FIELD
from perfd.engine.partial import Partial

log = logging.getLogger("perfd.engine")

# Iterations of a job folded in memory (their per-rank maps, ranks and message ids): a partial of an
# older one is folded with the record the store holds for it (late, counted), not lost. A 100k-rank
# iteration holds ~45 MiB here: 64 of them took the root to 3.0 GiB (perfd bench engine, 12,500 nodes);
# 16 are 32 s of a 2 s iteration, well past what the shards' 0.25 s flushes leave late.
KEEP_ITERATIONS = 16
# Iterations past those whose node messages and ranks the root still knows (compactly: ~100 KB each
# at 100k ranks), so that a partial arriving later still counts as a redelivery or as new ranks, and
# an iteration made whole by it is counted once. 64 more are 128 s of a 2 s iteration, past the
# engine's redelivery (10 s) after a shard's lease (6 s) runs out.
GONE_ITERATIONS = 64
# A job no partial came for this long leaves the root's memory (its iterations, what it knew of the
# gone ones, its ranks: at 100k ranks ~1 GB, kept for ever before, job after job); the store keeps
# its records and prunes the job as it ends (perfd.aggregator.retention). Its run count stays (a few
# bytes): a job silent this long and stepping again is the same run unless its ranks restarted.
IDLE_FORGET_S = 600.0
# A job the aggregator refused (its jobs cap) is not asked about again for this long: every node's
# partial of it would otherwise ask, and making room prunes (perfd.aggregator.guard), per message.
REFUSED_RETRY_S = 10.0
LAG_SAMPLES = 1000  # the newest iterations' lags kept for the quantiles
LAG_QUANTILES = {"p50": 0.5, "p99": 0.99}  # the quantiles of those the root reports
# An iteration not yet whole goes to the store at most this often (and at once when it is whole, brings
# a log's record, or leaves memory): building a fold's record copies its per-rank maps, and at 100,000
# ranks a shard's every flush touching every iteration made that a third of the root's CPU and held its
# lag past 2 s on 2 cores. The API shows an iteration in progress at most this late.
HAND_ON_S = 1.0
# ... for an iteration of this many ranks and more: a smaller one's record is cheap (~1 ms at 4,096
# ranks), and goes to the store on every partial, as the ranks' records reach one aggregator.
HAND_ON_MIN_RANKS = 4096


@dataclass
class RootStats:
    leader: bool = False
    leadership_lost: int = 0  # perfd_engine_root_leadership_lost_total (perfd/core/catalog_engine.py)
    batches: int = 0
    partials: int = 0
    undecodable: int = 0
    node_messages: int = 0  # distinct node messages folded in
    redelivered: int = 0  # node messages that arrived again (folded once)
    late: int = 0  # partials of an iteration no longer in memory, folded with the store's record
    refused: int = 0  # partials and job infos of a job the aggregator holds no room for (its jobs cap)
    new_runs: int = 0  # restarts seen (a rank's step hook began a new process): the job's run counted on
    jobs_forgotten: int = 0  # jobs silent IDLE_FORGET_S: their folds let go of (the store keeps them)
    # Commands to agents on the engine (perfd.engine.subjects.command_subject): answered, or not
    # (no agent listening, no answer in time, no engine connection): counted, never retried.
    commands_sent: int = 0
    commands_undeliverable: int = 0
    records_ingested: int = 0
    # The records stream: messages read, events and collective records handed on as their agents sent them
    node_records_messages: int = 0
    events: int = 0
    collectives: int = 0  # operations: records as sent, or rows of the partials they were reduced to
    collective_partials: int = 0  # of those messages, the ones that carried them reduced
    collectives_folded: int = 0  # of those, the ones whose operations the shards folded (not the root)
    figure_rows: int = 0  # per-window figures the shards' folds made, (iteration, rank) rows handed on
    # Iterations that became whole (every rank the job has shown folded in), and the time from their
    # last rank's step end to then: what the job's analysis waits for the engine, a shard and this root.
    complete: int = 0
    # Iterations folded into since they last went to the store (HAND_ON_S), now: what the store lacks
    # of what the root has read (0: the store holds all of it)
    held_back: int = 0
    # Messages the engine let go (the stream's limits: subjects.PARTIALS_MAX_BYTES, RECORDS_MAX_BYTES,
    # EVENTS_MAX_BYTES, PARTIALS_MAX_AGE_S) before this root read them: a root that fell that far
    # behind, or was away that long. Lost to the job's analysis; counted and logged
    # (perfd.engine.root), never silent.
    partials_skipped: int = 0
    records_skipped: int = 0
    events_skipped: int = 0
    summaries_skipped: int = 0
    # False on a job's own root (--engine-job): it reads one job's subjects, so the sequence numbers it
    # is not delivered are other jobs', not messages let go: its ``*_skipped`` are unknown (None, absent)
    reads_every_job: bool = True
    # (the root of every job) messages of jobs a root of their own leads, left to it; those jobs, now
    led_elsewhere: int = 0
    jobs_led_elsewhere: int = 0

    # The shards' step summaries (perfd.engine.root_summaries), beside the partials: read; of those, held
    # in place of an older one of their holder's partition's iteration (replaced); not newer than the one
    # held, a copy delivered again (stale: dropped); of an iteration no longer held (late: dropped); a
    # holder's let go of for a newer holder's, past MAX_HOLDERS of one partition's iteration
    # (holders_dropped: its ranks missing from the answer); answers not shown for holding more ranks than
    # the job has (overcounted: a node message in two holders' summaries)
    job_info_same: int = 0  # job infos passed by, the same text as the one the job's store took last
    summaries: int = 0
    summaries_replaced: int = 0
    summaries_stale: int = 0
    summaries_late: int = 0
    summaries_holders_dropped: int = 0
    summaries_overcounted: int = 0
    lag_s: deque[float] = field(default_factory=lambda: deque(maxlen=LAG_SAMPLES))

    def to_json(self) -> dict[str, bool | int | dict[str, float] | None]:
        """The counters; ``lag_s``: its p50, p99, max and n (None: no iteration complete yet)."""
        out: dict[str, bool | int | dict[str, float] | None] = {
            k: v for k, v in self.__dict__.items() if k != "lag_s"}
        if not self.reads_every_job:
            out.update((k, None) for k in out if k in EVERY_JOB_ONLY or k.endswith("_skipped"))
        lag: dict[str, float] | None = None
        if quantiles := self.lag_quantiles():
            lag = {name: round(quantiles[q], 4) for name, q in LAG_QUANTILES.items()}
            lag.update(max=round(max(self.lag_s), 4), n=len(self.lag_s))
        out["lag_s"] = lag
        return out

    def lag_quantiles(self) -> dict[float, float]:
        """{quantile: seconds} of the kept lags (LAG_QUANTILES), empty before an iteration is whole: what
        /api/stats shows as ``lag_s`` and /metrics as perfd_engine_root_completion_lag_p50_seconds, _p99_."""
        lags = sorted(self.lag_s)
        n = len(lags)
        return {q: lags[min(n - 1, int(q * n))] for q in LAG_QUANTILES.values()} if lags else {}


# The counters of the root of every job alone: None (absent from /metrics) on a job's own root
EVERY_JOB_ONLY = ("led_elsewhere", "jobs_led_elsewhere")


def stream_gap(read_to: int, seqs: Sequence[int]) -> int:
    """Stream sequence numbers missing from a read that went on from ``read_to`` (0: the first read,
    whose start is the stream's first message kept) and got ``seqs``, in order: the messages the stream
    let go before they were read. The root reads every subject of a stream, so its sequence numbers
    come one after another but for those."""
    gap, last = 0, read_to or None
    for seq in seqs:
        if last is not None and seq > last + 1:
            gap += seq - last - 1
        last = seq if last is None else max(last, seq)
    return gap


class Gone:
    """What the root keeps of an iteration that left its memory: its node messages (hashes, sorted)
    and, until it was whole, its ranks. Pure."""

    __slots__ = ("complete", "messages", "ranks", "unknown_messages")

    def __init__(self, acc: Partial, world: int, unknown_messages: bool = False) -> None:
        self.messages = array("q", sorted({hash(m) for m in acc.messages}))
        # Whole when it left (counted then, or the job's first iteration, held to no world then)
        self.complete = acc.complete or len(acc.ranks) >= world
        self.ranks: array[int] | None = None if self.complete else array("I", sorted(acc.ranks))
        # Made from the store's record of an iteration the root kept nothing of (:meth:`of_store`):
        # the node messages folded into it before are not known, its ranks are.
        self.unknown_messages = unknown_messages

    @classmethod
    def of_store(cls, job: str, iteration: int, fold: StepRecord | None, world: int) -> Gone:
        """What the store's record (None: it holds none) tells of an iteration older than all the root
        holds and kept: the ranks folded into it (each rank's end, or its timers'), not its messages."""
        ranks: set[int] = set()
        if fold is not None:
            ranks.update(fold.rank_end_times)
            for tv in fold.timers.values():
                ranks.update(tv.per_rank)
        return cls(Partial(job, iteration, ranks=ranks), world, unknown_messages=True)

    def merge(self, part: Partial) -> int:
        """Count ``part`` in; returns how many of its node messages were in already. Of an iteration
        whose messages are not known (:meth:`of_store`), a partial of ranks all in already is a
        redelivery (the store holds its records: a shard's, delivered again past the root's memory),
        not new messages: its messages are counted in as such."""
        fresh = {h for m in part.messages if not self._has(h := hash(m))}
        again = len(part.messages) - len(fresh)
        if self.unknown_messages and part.ranks and (self.ranks is None or part.ranks <= set(self.ranks)):
            again = len(part.messages)
        if fresh:  # known from now on by their ids too
            self.messages = array("q", sorted({*self.messages, *fresh}))
        if self.ranks is not None and not part.ranks <= set(self.ranks):
            self.ranks = array("I", sorted(set(self.ranks) | part.ranks))
        return again

    def _has(self, h: int) -> bool:
        i = bisect.bisect_left(self.messages, h)
        return i < len(self.messages) and self.messages[i] == h

    def n_ranks(self) -> int | None:
        return None if self.ranks is None else len(self.ranks)


class RootFold:
    """What the root holds between partials: the fold of each recent iteration of each job. Pure."""

    def __init__(self, keep: int = KEEP_ITERATIONS, keep_gone: int = GONE_ITERATIONS) -> None:
        self.keep, self.keep_gone = keep, keep_gone
        self.jobs: dict[str, OrderedDict[int, Partial]] = {}
        self.gone: dict[str, OrderedDict[int, Gone]] = {}  # iterations that left memory, the newest kept
        self.ranks: dict[str, set[int]] = {}
        # Each job's world as its job info names it (the hooks' torch.distributed world size, a
        # Megatron-LM log's start-up): an iteration is whole once that many ranks are in, not once it
        # holds every rank the job has shown so far, which in its first iterations (before every
        # partition's shard flushed) is only some of them.
        self.worlds: dict[str, int] = {}
        # Each job's run as this root counts them and the iteration it began at (from the partials
        # marked new_run: every node of a restarted job marks the one where its ranks' processes
        # changed, the same iteration, so they count once).
        self.runs: dict[str, tuple[int, int | None]] = {}
        self.seen: dict[str, float] = {}  # job -> when its last partial came (add's ``now``)
        self.refused_until: dict[str, float] = {}  # job -> until when it is refused without asking
        self.stats = RootStats()
        # (job, iteration)s made whole, the newest, for the root's answers from the summaries
        self.completed: deque[tuple[str, int]] = deque(maxlen=1024)

    def add(self, parts: Sequence[Partial],
            held_fold: Callable[[str, int], StepRecord | None] = lambda j, i: None,
            now: float = 0.0, admit: Callable[[str], bool] = lambda j: True
            ) -> tuple[list[StepRecord], dict[str, set[int]]]:
        """Fold ``parts`` in; returns the records that changed (one fold and the job-level records of
        each (job, iteration) touched) and each job's ranks new to it. ``held_fold(job, iteration)``:
        the fold the store holds, the start of an iteration no longer (or not yet) in memory — a late
        partial, or the first after this root started on a store that kept its records.
        ``admit(job)``: whether a job not in memory may be (the aggregator's jobs cap; refused:
        counted, not folded)."""
        touched: dict[tuple[str, int], Partial] = {}
        new_ranks: dict[str, set[int]] = {}
        restarted: set[str] = set()  # jobs whose new run began in these parts: the store holds the old
        late: dict[tuple[str, int], Partial] = {}  # iterations gone from memory, folded with the store's
        out: list[StepRecord] = []
        for part in parts:
            self.stats.partials += 1
            if part.job not in self.jobs and not self._admitted(part.job, admit, now):
                self.stats.refused += 1
                continue
            if part.new_run and part.job in self.ranks:
                run, began = self.runs.get(part.job, (1, None))
                if began != part.iteration:
                    self._begin_run(part.job, run + 1, part.iteration, touched, out, now)
                    restarted.add(part.job)
            held = self.jobs.setdefault(part.job, OrderedDict())
            acc = held.get(part.iteration)
            its_gone = self.gone.get(part.job)
            gone = its_gone.get(part.iteration) if acc is None and its_gone is not None else None
            if acc is None and gone is None and len(held) >= self.keep and part.iteration < min(held):
                # Older than all the root holds and kept of (GONE_ITERATIONS): what the store's record
                # shows is all there is to count it against; kept with the iterations gone, so that
                # the rest of this batch's partials of it count against it too.
                gone = Gone.of_store(part.job, part.iteration, held_fold(part.job, part.iteration),
                                     self.world(part.job))
                self.gone.setdefault(part.job, OrderedDict())[part.iteration] = gone
            if gone is not None:  # late: counted against what the root kept of it, folded with the store's
                self.stats.late += 1
                n_again = gone.merge(part)
                self.stats.redelivered += n_again
                self.stats.node_messages += len(part.messages) - n_again
                acc = late.get((part.job, part.iteration))
                if acc is None:
                    acc = late[(part.job, part.iteration)] = Partial(
                        part.job, part.iteration, fold=held_fold(part.job, part.iteration))
                acc.merge(part)
                self._note_ranks(part, new_ranks)
                world = self.world(part.job)
                n = gone.n_ranks()
                if n is not None and n >= world:
                    gone.complete, gone.ranks = True, None
                    self.stats.complete += 1
                    self.completed.append((part.job, part.iteration))
                    end = acc.fold.end_time if acc.fold is not None else None
                    if end is not None:
                        self.stats.lag_s.append(max(0.0, now - end))
                continue
            if acc is None:
                # Until its first fold reaches the store, a restarted job's store still holds the
                # run that ended, whose iterations may bear the same numbers (a resume).
                start = None if part.job in restarted else held_fold(part.job, part.iteration)
                acc = Partial(part.job, part.iteration, fold=start)
                held[part.iteration] = acc
            again = acc.merge(part)
            # A job's log records (Megatron-LM's ``last``) go to the store in the order they came: a
            # run's first one that came after later ones would end the run they belong to.
            acc.fresh_job_level = acc.fresh_job_level or bool(part.job_level)
            self.stats.redelivered += len(again)
            self.stats.node_messages += len(part.messages) - len(again)
            self._note_ranks(part, new_ranks)
            touched[(part.job, part.iteration)] = acc
        for acc in touched.values():
            whole = self._whole(acc, now)
            if (whole or acc.fresh_job_level or acc.handed_at is None or len(acc.ranks) < HAND_ON_MIN_RANKS
                    or now - acc.handed_at >= HAND_ON_S):
                out.extend(self._earlier_held(acc, now))
                out.extend(self._records_of(acc, now))
            else:
                acc.unhanded = True  # the next flush (at most HAND_ON_S on) hands it on
        for acc in late.values():
            if acc.fold is not None:
                out.append(self._marked(acc.fold, acc.job))
            out.extend(acc.job_level.values())
        for job in {j for j, _ in touched}:
            out.extend(self._trim(job, now))
        out.extend(self.flush(now))
        for part in parts:
            if part.job in self.jobs:
                self.seen[part.job] = now
        for job in [j for j, t in self.seen.items() if now - t > IDLE_FORGET_S]:
            self.forget(job)
        return out, new_ranks

    def _admitted(self, job: str, admit: Callable[[str], bool], now: float) -> bool:
        """``admit(job)``, not asked again for REFUSED_RETRY_S after it said no."""
        if self.refused_until.get(job, float("-inf")) > now:
            return False
        if admit(job):
            self.refused_until.pop(job, None)
            return True
        if len(self.refused_until) >= 4096:  # bounded: job names come from the network
            self.refused_until.clear()
        self.refused_until[job] = now + REFUSED_RETRY_S
        return False

    def note_world(self, job: str, world: int | None) -> None:
        """The job's info named its world size (None: it named none; the job is then held to the
        ranks it has shown)."""
        if world is not None and world > 0:
            self.worlds[job] = world

    def world(self, job: str) -> int:
        """The ranks an iteration of ``job`` must hold to be whole: its info's world size, or the
        ranks it has shown where they are more (an info that undercounts is not believed)."""
        return max(self.worlds.get(job, 0), len(self.ranks.get(job, ())))

    def forget(self, job: str, why: str = f"silent {IDLE_FORGET_S:.0f} s", idle: bool = True) -> None:
        """Let go of what memory holds of ``job`` (not its run count: see IDLE_FORGET_S); ``idle``: counted
        in ``jobs_forgotten`` (a job let go of for its own root is not)."""
        self.jobs.pop(job, None)
        self.worlds.pop(job, None)
        self.gone.pop(job, None)
        self.ranks.pop(job, None)
        self.seen.pop(job, None)
        self.stats.jobs_forgotten += idle
        log.info("engine root: job %s %s: its folds leave memory", job[:80], why)

    def _note_ranks(self, part: Partial, new_ranks: dict[str, set[int]]) -> None:
        known = self.ranks.setdefault(part.job, set())
        fresh = part.ranks - known
        if fresh:
            known |= fresh
            new_ranks.setdefault(part.job, set()).update(fresh)

    def flush(self, now: float, every: bool = False) -> list[StepRecord]:
        """The records of the iterations folded into since they last went to the store, HAND_ON_S
        ago or more (the root calls it while no partial comes too); ``every``: however recently
        (the root stops leading: what it folded goes to its store first)."""
        out: list[StepRecord] = []
        waiting = 0
        for held in self.jobs.values():
            for _it, acc in sorted(held.items()):
                if acc.unhanded and (every or acc.handed_at is None or now - acc.handed_at >= HAND_ON_S):
                    out.extend(self._earlier_held(acc, now))
                    out.extend(self._records_of(acc, now))
                waiting += acc.unhanded
        self.stats.held_back = waiting
        return out

    def _earlier_held(self, acc: Partial, now: float) -> list[StepRecord]:
        """The records of the job's earlier iterations held back, to go before ``acc``'s: the store
        gets a rank's ends in the order of its iterations (a rank whose end of iteration N came after
        its end of N+1 had its windows read over both: the collectives' per-rank shares then differed
        from one aggregator's)."""
        out: list[StepRecord] = []
        for it, other in sorted(self.jobs.get(acc.job, {}).items()):
            if it >= acc.iteration:
                break
            if other.unhanded:
                out.extend(self._records_of(other, now))
        return out

    def _trim(self, job: str, now: float) -> list[StepRecord]:
        """The lowest iterations beyond ``keep`` leave memory (not the store), what counts them kept;
        returns the records of those folded into since they last went to the store."""
        out: list[StepRecord] = []
        held = self.jobs[job]
        gone = self.gone.setdefault(job, OrderedDict())
        while len(held) > self.keep:
            it = min(held)
            acc = held.pop(it)
            if acc.unhanded:
                out.extend(self._records_of(acc, now))
            gone[it] = Gone(acc, self.world(job))
            while len(gone) > self.keep_gone:
                del gone[min(gone)]
        return out

    def _marked(self, fold: StepRecord, job: str) -> StepRecord:
        """The fold as the store gets it: marked with the job's run past the first
        (perfd.aggregator.job_runs.run_mark)."""
        run = self.runs.get(job, (1, None))[0]
        return fold if run == 1 else dataclasses.replace(fold, fields={**fold.fields, RUN_FIELD: str(run)})

    def _records_of(self, acc: Partial, now: float) -> list[StepRecord]:
        """What the store gets of an iteration folded: its fold (marked with the job's run past the
        first: perfd.aggregator.job_runs.run_mark) and its job-level records."""
        out: list[StepRecord] = []
        fold = acc.fold
        if fold is not None:
            out.append(self._marked(fold, acc.job))
        out.extend(acc.job_level.values())
        acc.handed_at, acc.unhanded, acc.fresh_job_level = now, False, False
        return out

    def _whole(self, acc: Partial, now: float) -> bool:
        """Whether the iteration just became whole: every rank of the job's world is in (counted once,
        with its lag). A job whose info named no world, or fewer ranks than it shows, is held to the
        ranks it has shown; while it has shown one iteration only, that iteration's own ranks are all
        there is to hold it to: not counted yet."""
        if acc.complete or len(acc.ranks) < self.world(acc.job):
            return False
        if self.worlds.get(acc.job, 0) < len(acc.ranks) and len(self.jobs[acc.job]) <= 1:
            return False  # held to no more than the ranks it has shown, in its first iteration
        acc.complete = True
        self.stats.complete += 1
        self.completed.append((acc.job, acc.iteration))
        end = acc.fold_end()
        if end is not None:
            self.stats.lag_s.append(max(0.0, now - end))
        return True

    def _begin_run(self, job: str, run: int, iteration: int, touched: dict[tuple[str, int], Partial],
                   out: list[StepRecord], now: float) -> None:
        """A rank of ``job`` began a new process at ``iteration``: the run held in memory is done.
        What this call folded of it goes out first, as that run's; the store digests the run when the
        new one's first fold arrives. The new run's world is the ranks it shows."""
        for key in [k for k in touched if k[0] == job]:
            acc = touched.pop(key)
            self._whole(acc, now)
            out.extend(self._records_of(acc, now))
        for acc in self.jobs.get(job, {}).values():  # what waited to go to the store goes now
            if acc.unhanded:
                out.extend(self._records_of(acc, now))
        log.info("engine root: job %s restarted at iteration %d (run %d)", job[:80], iteration, run)
        self.runs[job] = (run, iteration)
        self.stats.new_runs += 1
        self.jobs[job] = OrderedDict()
        self.gone[job] = OrderedDict()
        self.ranks[job] = set()

"""What a shard keeps of the window figures its partitions' agents folded, and what it sends of them: the
communication-share summaries (perfd.core.commsummary) a job's root merges in place of every rank's
rows.

Per (job, partition) the rows are held as the root's fold holds what it receives
(perfd.analytics.collectives.winfold.WindowFold.add_figures: a join by (iteration, rank), a settled row
over a provisional one, the newest ``keep`` iterations within MAX_FIGURE_ROWS_PER_JOB rows), so that a
summary is made of the rows the root's analysis would read of these ranks. Making one reads every row
held (each rank's recent windows: perfd.analytics.collectives.rank_shares), so a job's partitions are
summarised again no sooner than limits.ANALYSIS_COST_FACTOR times what their last summaries took
together, as the root's analysis is run again (perfd.aggregator.collectives), each only when rows came
since — and one partition a take (a flush), so that the shard's loop is held one summary at a time
(four of a 100,000-rank job's at once held it 2.6 s, past the node messages' hold). A row whose window
has no length (garbage: no share can be read of it) is refused and counted; a summary that fails is
logged and counted, never the flush's end; its partition is summarised again at the job's next round.

A job's new run (a rank's step hook began a new process: the node partial's ``new_run``, as the root
reads it) lets go of the rows the partition held of the last run, once, at the iteration it began:
the new run's iterations may bear lower numbers, which the newest-iterations window would otherwise
evict as they came while the last run's rows stayed (every node of the partition flags the same
iteration; a second restart resuming from the same iteration reads as the same run, as at the root).

The rows are the partition's, not the holder's: each agent message whose rows went in is kept to be saved
to the engine (:meth:`ShardComm.take_saves`; perfd.engine.comm_rows publishes them before the node
message is acknowledged), each tagged with the job's run the holder knows (when it saw the run begin, and
where: :data:`Run`; read back, a later run's rows let go of those of an earlier one held, and an earlier
run's are skipped), and what the holder lets go of is purged there (:meth:`ShardComm.take_purges`: an
iteration evicted, a job forgotten). A partition's next holder reads the
saved rows back (:meth:`ShardComm.fold_in` ``replayed``) before it summarises the partition: a lease that
moves takes no row with it. A partition whose lease is lost keeps its rows not yet saved, to be saved at the
next flush (their messages are acknowledged then), and drops its purges (the next holder's now).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from perfd.core import commsummary as cs
from perfd.core import limits as L
from perfd.core.winfigures import WindowFigures
from perfd.engine import comm_codec, figures_codec
from perfd.engine.shard_summaries import IDLE_FORGET_S, holder_epoch
from perfd.transport.gen import perfd_pb2 as pb

log = logging.getLogger("perfd.engine")

CommSummaries = dict[str, list[cs.CommSummary]]  # by job
# A job's run as a holder knows it: (when it saw the run begin, wall-clock ns; the iteration it began at).
# (0, None): no new run seen (the job's first, or one that began before any holder saved its rows). Runs
# are ordered by that time: a later one's restart was seen later, whichever shard saw it.
Run = tuple[int, int | None]
NO_RUN: Run = (0, None)
# What a holder saves (perfd.engine.comm_rows): (job, partition, newest iteration, run) -> the agents'
# figures of the run whose newest iteration that is
SaveKey = tuple[str, int, int, Run]
Saves = dict[SaveKey, list[pb.WindowFigures]]


@dataclass
class _Held:
    joins: dict[int, WindowFigures] = field(default_factory=dict)  # iteration -> its rows
    rows: int = 0
    changed: bool = False
    seen: float = 0.0  # monotonic time its last rows came
    run_began: int | None = None  # the iteration its rows' run began at, where a new run was seen
    run_ns: int = 0  # when that run's beginning was seen (wall clock; 0: none seen)

    @property
    def run(self) -> Run:
        return (self.run_ns, self.run_began)


@dataclass
class CommStats:
    rows_in: int = 0  # rows that went into a join (a row again, or an older one, does not)
    rows_refused: int = 0  # rows whose window has no length
    rows_evicted: int = 0  # let go with their iteration (older than the kept ones, or past the rows' cap)
    summaries: int = 0  # summaries made
    summary_errors: int = 0  # summaries that failed (logged; the partition again at the job's next round)
    summary_cpu_s: float = 0.0  # the CPU they took
    runs_begun: int = 0  # a (job, partition)'s rows let go of for a new run of the job
    saved_messages: int = 0  # agents' figure messages saved to the engine (perfd.engine.comm_rows)
    rows_past_run: int = 0  # rows of messages read back of an earlier run than the one held: skipped
    rows_replayed: int = 0  # rows read back from the engine that went into a join (a partition taken)
    replays: int = 0  # partitions read back
    read_back_s: float = 0.0  # the wall time those readings took, together
    replay_errors: int = 0  # readings back that failed or ended early (logged; the rows read kept)
    purge_errors: int = 0  # purges of let-go rows the engine did not do (logged; they age out)


class ShardComm:
    """``summarize``: perfd.analytics.collectives.comm_summary.summarize (``perfd shard`` hands it on);
    ``recent_windows``, ``iterations_out``: the job's analysis's (limits.COMM_RECENT_WINDOWS, ...)."""

    def __init__(self, summarize: cs.Summarize, recent_windows: int, iterations_out: int,
                 cpu: Callable[[], float] = time.thread_time,
                 wall_ns: Callable[[], int] = time.time_ns) -> None:
        self.epoch = holder_epoch()
        self.seq = 0  # this holder's summaries in order, whatever their job or partition
        self._summarize = summarize
        self.recent_windows, self.iterations_out = recent_windows, iterations_out
        self.keep = max(recent_windows, iterations_out)  # the iterations the root's fold keeps
        self.max_rows = L.MAX_FIGURE_ROWS_PER_JOB
        self._cpu, self._wall_ns = cpu, wall_ns
        self.held: dict[tuple[str, int], _Held] = {}
        self._due: dict[str, float] = {}  # job -> monotonic time before which no new round begins
        self._round: dict[str, list[int]] = {}  # job -> its partitions still to summarise this round
        self._spent: dict[str, float] = {}  # job -> the CPU its round took so far
        self._unsent: CommSummaries = {}  # made, their publishing failed: sent at the next take
        self._saves: Saves = {}  # agents' figures whose rows went in, not saved yet
        self._purges: set[tuple[str, int, int | None]] = set()  # (job, partition, iteration; None: all)
        self.replaying: dict[int, int] = {}  # partition -> its readings back under way: summarised after
        self.stats = CommStats()

    def fold_in(self, figures: list[pb.WindowFigures], partition: int, now: float,
                replayed: Run | None = None) -> None:
        """An agent's figures (checked: perfd.engine.figures_codec.check) into its partition's rows
        (``now``: time.monotonic()); ``replayed``: read back from the engine (saved already), of that run:
        of a later run than the one held, the rows held are the last run's and go; of an earlier one, they
        are skipped (counted)."""
        for m in figures:
            figs = figures_codec.from_pb(m)
            h = self.held.setdefault((figs.job, partition), _Held())
            h.seen = now
            # (the same beginning iteration is the same run, whichever shard saw it when: the rule live)
            if replayed is not None and replayed[0] != h.run_ns and (replayed[1] is None
                                                                     or replayed[1] != h.run_began):
                if replayed[0] < h.run_ns:
                    self.stats.rows_past_run += len(figs.rows)
                    continue
                self._begin(h, replayed, figs.job, partition)
            went_in, newest = 0, None
            for (it, _rank), w in figs.rows.items():
                if w.end_ns <= w.start_ns:
                    self.stats.rows_refused += not replayed  # counted when it came
                    continue
                join = h.joins.get(it)
                if join is None:
                    join = h.joins[it] = WindowFigures(figs.job)
                had = len(join.rows)
                if join.add(it, w):
                    went_in += 1
                    h.rows += len(join.rows) - had  # (a row over one held adds none)
                    newest = it if newest is None else max(newest, it)
                    h.changed = True
            self._trim(h, figs.job, partition)
            if replayed is not None:
                self.stats.rows_replayed += went_in
                continue
            self.stats.rows_in += went_in
            if newest is not None and newest in h.joins:  # saved under the newest iteration that went in,
                # purged when that one goes (one of iterations let go of already is not)
                self._saves.setdefault((figs.job, partition, newest, h.run), []).append(m)

    def new_run(self, job: str, partition: int, iteration: int, now: float) -> None:
        """A node partial of the partition says a rank began a new run of ``job`` at ``iteration`` (``now``:
        time.monotonic()). The rows saved from then on are of the new run (their tag: perfd.engine
        .comm_rows); the last run's saved ones are skipped where read back, and age out."""
        h = self.held.setdefault((job, partition), _Held(seen=now))
        if h.run_began != iteration:
            # later than the run held whatever this shard's clock says (another's saw that one)
            self._begin(h, (max(self._wall_ns(), h.run_ns + 1), iteration), job, partition)

    def _begin(self, h: _Held, run: Run, job: str, partition: int) -> None:
        """The rows held are the last run's: let go of, and so are the purges of their iterations (subjects
        the new run's rows may be saved under too)."""
        self._purges = {k for k in self._purges if k[:2] != (job, partition) or k[2] is None}
        if h.rows:
            self.stats.rows_evicted += h.rows
            self.stats.runs_begun += 1
        h.joins.clear()
        h.rows, h.changed = 0, True
        h.run_ns, h.run_began = run

    def _trim(self, h: _Held, job: str, partition: int) -> None:
        its = sorted(h.joins)
        for k, it in enumerate(its[:-1]):  # the newest iteration stays, whatever its rows
            if len(its) - k <= self.keep and h.rows <= self.max_rows:
                break
            gone = len(h.joins.pop(it))
            h.rows -= gone
            self.stats.rows_evicted += gone
            self._purges.add((job, partition, it))

    def take(self, now: float) -> CommSummaries:
        """By job, the summaries to send now (``now``: time.monotonic()): those whose publishing failed,
        and at most one newly made — the next partition of a job's round. A round begins, once the job's
        cadence allows, with each of its partitions that took rows since its last summary."""
        self._forget_idle(now)
        out, self._unsent = self._unsent, {}
        for job in sorted({j for j, _ in self.held}):
            pending = self._round.get(job)
            if not pending:
                if now < self._due.get(job, 0.0):
                    continue
                pending = self._round[job] = sorted(p for (j, p), h in self.held.items()
                                                    if j == job and h.changed and p not in self.replaying)
                if not pending:
                    continue
            made = self._make(job, pending.pop(0))
            if not pending:  # the round is over: the next begins after its cost times the factor
                took = self._spent.pop(job, 0.0)
                self._due[job] = now + max(L.ANALYSIS_MIN_EVERY_S, L.ANALYSIS_COST_FACTOR * took)
            if made is not None:
                out.setdefault(job, []).append(made)
                break  # one summary a take: the loop held one at a time
        return out

    def _make(self, job: str, partition: int) -> cs.CommSummary | None:
        h = self.held.get((job, partition))
        if h is None:  # let go of since the round began
            return None
        h.changed = False
        t0 = self._cpu()
        self.seq += 1
        try:
            s = self._summarize(job, h.joins, self.recent_windows, self.iterations_out, partition, self.epoch,
                                self.seq)
        except Exception:  # rows it cannot read: said, counted, tried again at the job's next round
            h.changed = True
            self.stats.summary_errors += 1
            log.exception("shard: the communication summary of job %s partition %d failed", job, partition)
            return None
        finally:
            took = self._cpu() - t0
            self._spent[job] = self._spent.get(job, 0.0) + took
            self.stats.summary_cpu_s += took
        self.stats.summaries += 1
        return s

    def again(self, summaries: CommSummaries) -> None:
        """Summaries whose publishing failed: sent again at the next take, as they were made."""
        for job, ss in summaries.items():
            self._unsent.setdefault(job, []).extend(ss)

    def take_saves(self) -> Saves:
        """The agents' figures to save now (perfd.engine.comm_rows.save), by (job, partition, newest
        iteration); given back (:meth:`saves_again`) where the flush failed."""
        out, self._saves = self._saves, {}
        return out

    def saves_again(self, saves: Saves) -> None:
        """Saved at the next take, before what was taken since."""
        back = {k: figs + self._saves.pop(k, []) for k, figs in saves.items()}
        self._saves = {**back, **self._saves}

    def take_purges(self, whole: bool | None = None) -> list[tuple[str, int, int | None]]:
        """The rows let go of since the last take, to purge from the engine (iteration None: every one of
        the job's partition); ``whole``: only those of a whole (job, partition), or only an iteration's."""
        out = sorted((k for k in self._purges if whole is None or (k[2] is None) == whole),
                     key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2]))
        self._purges.difference_update(out)
        return out

    def drop_partition(self, partition: int) -> None:
        """The partition's lease is gone: its rows are its next holder's to summarise (read back from the
        engine: its rows not saved yet are saved at the next flush, before their messages are
        acknowledged; what it would purge is the next holder's to)."""
        for key in [k for k in self.held if k[1] == partition]:
            del self.held[key]
        self._purges = {k for k in self._purges if k[1] != partition}
        for pending in self._round.values():
            if partition in pending:
                pending.remove(partition)

    def _forget_idle(self, now: float) -> None:
        """A job no rows came for in IDLE_FORGET_S is let go of, as the step summaries let go of theirs
        (perfd.engine.shard_summaries)."""
        seen: dict[str, float] = {}
        for (job, _), h in self.held.items():
            seen[job] = max(seen.get(job, 0.0), h.seen)
        for job in [j for j, t in seen.items() if now - t > IDLE_FORGET_S]:
            self.forget(job)

    def forget(self, job: str) -> None:
        for key in [k for k in self.held if k[0] == job]:
            del self.held[key]
            self._purges.add((job, key[1], None))
        for save in [k for k in self._saves if k[0] == job]:
            del self._saves[save]
        for d in (self._due, self._round, self._spent, self._unsent):
            d.pop(job, None)


def comm_messages(summaries: CommSummaries, next_id: Callable[[], str], sender: str
                  ) -> Iterator[tuple[str, str, bytes]]:
    """(job, batch id, EngineBatch) of each summary, one a message: ~1-2 KB an iteration it holds, a
    hundred iterations well under the engine's 1 MiB."""
    for job, ss in summaries.items():
        for s in ss:
            bid = next_id()
            b = pb.EngineBatch(id=bid, sender=sender, created_ns=time.time_ns())
            comm_codec.to_pb(s, b.comm_summaries.add())
            yield job, bid, b.SerializeToString()

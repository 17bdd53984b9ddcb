"""What a shard keeps of the window figures its partitions' agents folded, and what it sends of them: the
communication-share summaries (perfd.engine.commsummary) a job's root merges in place of every rank's
rows.

Per (job, partition) the rows are held as the root's fold holds what it receives
(perfd.analytics.collectives.winfold.WindowFold.add_figures: a join by (iteration, rank), a settled row
over a provisional one, the newest ``keep`` iterations within MAX_FIGURE_ROWS_PER_JOB rows), so that a
summary is made of the rows the root's analysis would read of these ranks. Making one reads every row
held (each rank's recent windows: perfd.analytics.collectives.rank_shares), so a job's partitions are
summarised again no sooner than COST_FACTOR times what their last summaries took together, as the
root's analysis is run again (perfd.aggregator.collectives), each only when rows came since.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from perfd.core import commsummary as cs
from perfd.core import limits as L
from perfd.core.winfigures import WindowFigures
from perfd.engine import comm_codec, figures_codec
from perfd.engine.shard_summaries import IDLE_FORGET_S, holder_epoch
from perfd.transport.gen import perfd_pb2 as pb

# A (job, partition)'s summary is made again no sooner than this many times what the last took: the
# root's analysis's cadence rule (perfd.aggregator.collectives.ANALYSIS_COST_FACTOR), kept equal so
# that a shard spends on its ranks what the root spent on them.
COST_FACTOR = 10
MIN_EVERY_S = 1.0  # ... and no sooner than this after the last


CommSummaries = dict[str, list[cs.CommSummary]]  # by job


@dataclass
class _Held:
    joins: dict[int, WindowFigures] = field(default_factory=dict)  # iteration -> its rows
    rows: int = 0
    changed: bool = False
    seq: int = 0
    seen: float = 0.0  # monotonic time its last rows came


@dataclass
class CommStats:
    rows_in: int = 0  # rows that went into a join (a row again, or an older one, does not)
    rows_evicted: int = 0  # let go with their iteration (older than the kept ones, or past the rows' cap)
    summaries: int = 0  # summaries made
    summary_cpu_s: float = 0.0  # the CPU they took


class ShardComm:
    """``summarize``: perfd.analytics.collectives.comm_summary.summarize (``perfd shard`` hands it on);
    ``recent_windows``, ``iterations_out``: the job's analysis's (its CollectiveConfig's)."""

    def __init__(self, summarize: cs.Summarize, recent_windows: int, iterations_out: int,
                 cpu: Callable[[], float] = time.thread_time) -> None:
        self.epoch = holder_epoch()
        self._summarize = summarize
        self.recent_windows, self.iterations_out = recent_windows, iterations_out
        self.keep = max(recent_windows, iterations_out)  # the iterations the root's fold keeps
        self.max_rows = L.MAX_FIGURE_ROWS_PER_JOB
        self._cpu = cpu
        self.held: dict[tuple[str, int], _Held] = {}
        self._due: dict[str, float] = {}  # job -> monotonic time before which it is not summarised again
        self.stats = CommStats()

    def fold_in(self, figures: list[pb.WindowFigures], partition: int, now: float) -> None:
        """An agent's figures (checked: perfd.engine.figures_codec.check) into its partition's rows
        (``now``: time.monotonic())."""
        for m in figures:
            figs = figures_codec.from_pb(m)
            h = self.held.setdefault((figs.job, partition), _Held())
            h.seen = now
            for (it, _rank), w in figs.rows.items():
                join = h.joins.get(it)
                if join is None:
                    join = h.joins[it] = WindowFigures(figs.job)
                if join.add(it, w):
                    self.stats.rows_in += 1
                    h.changed = True
            h.rows = sum(len(j) for j in h.joins.values())
            self._trim(h)

    def _trim(self, h: _Held) -> None:
        its = sorted(h.joins)
        for k, it in enumerate(its[:-1]):  # the newest iteration stays, whatever its rows
            if len(its) - k <= self.keep and h.rows <= self.max_rows:
                break
            gone = len(h.joins.pop(it))
            h.rows -= gone
            self.stats.rows_evicted += gone

    def take(self, now: float) -> CommSummaries:
        """By job, the summaries due: of each of its partitions that took rows since its last, once the
        job's cadence allows (``now``: time.monotonic()). The cadence is the job's, all its partitions'
        summaries' cost together: per partition, a shard holding four of a 100,000-rank job's spent a
        third of a core on them (0.65 s of CPU each) and fell behind its node messages."""
        seen: dict[str, float] = {}
        for (job, _), h in self.held.items():
            seen[job] = max(seen.get(job, 0.0), h.seen)
        for job in [j for j, t in seen.items() if now - t > IDLE_FORGET_S]:
            self.forget(job)  # what it holds is its live jobs', as the step summaries (shard_summaries)
        out: CommSummaries = {}
        spent: dict[str, float] = {}
        for (job, partition), h in self.held.items():
            if not h.changed or now < self._due.get(job, 0.0):
                continue
            t0 = self._cpu()
            h.seq += 1
            s = self._summarize(job, h.joins, self.recent_windows, self.iterations_out, partition, self.epoch,
                                h.seq)
            took = self._cpu() - t0
            h.changed = False
            spent[job] = spent.get(job, 0.0) + took
            self.stats.summaries += 1
            self.stats.summary_cpu_s += took
            out.setdefault(job, []).append(s)
        for job, took in spent.items():
            self._due[job] = now + max(MIN_EVERY_S, COST_FACTOR * took)
        return out

    def again(self, summaries: CommSummaries) -> None:
        """Summaries whose publishing failed: made again at the next take (from the rows then)."""
        for job, ss in summaries.items():
            for s in ss:
                h = self.held.get((job, s.partition))
                if h is not None:
                    h.changed = True
            self._due.pop(job, None)

    def forget(self, job: str) -> None:
        for key in [k for k in self.held if k[0] == job]:
            del self.held[key]
        self._due.pop(job, None)


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

"""The window fold where a slice of a job's nodes is reduced (pure): a shard of the engine holds its
partitions' nodes' step records (each rank's own ends: its windows) and, sent beside them, those
nodes' collective operations, so it can fold every operation of its ranks into per-window figures
(perfd.analytics.collectives.winfold, the same code the root's store runs) and hand the root the
figures (perfd.core.winfigures: one row a rank a window) instead of the operations. The root merges the
shards' figures (a join) into its store's fold, which the analysis reads as it reads its own.

What the root's analysis then gives is the one aggregator's: a rank's windows are its own step ends,
which the shard holding its node has as the root has them; its operations are all the shard's; the
classes need the job's layout (its info, which a node's message carries) and world size (the groups
the operations name). What differs: a capture or warm-up flag that marks only some ranks' steps is
the slowest of the shard's ranks' where the root has the slowest of the job's (both a fold's flags).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from perfd.analytics.collectives.collective_config import CollectiveConfig
from perfd.analytics.collectives.fold_counts import FoldCounts
from perfd.analytics.collectives.winfold import PENDING, WindowFold
from perfd.core import limits as L
from perfd.core.collfold import CollectivePartial
from perfd.core.model import ParallelLayout, StepRecord
from perfd.core.winfigures import WindowFigures

# Iterations of step records a shard keeps of each rank (its windows): the newest operations settle
# within a few windows of their step records (the waiting ones are bounded at ~3 iterations a rank at
# 100,000 ranks: winfold.PENDING); older windows have handed their figures on. Every new step end
# builds the windows again from all of them (32 were a fifth of a shard's fold, flushing 8 times an
# iteration: shard_fold_bench --takes 8). Each rank's newest, not the job's: a shard that took over a
# killed one's partitions folds their messages again, delivered once the engine's ack wait ran out,
# iterations behind its other nodes' (28-40 in tests/engine/test_engine_collectives_faults.py), and
# the job's newest 12 let those records go as they came: their ranks' windows were never made.
# Records without their ranks' ends (a log's job) are kept by the job's newest iterations.
KEEP_STEP_ITERATIONS = 12
# Iterations of settled figures a shard's fold keeps (a sequence gap seen later takes them back).
KEEP_FIGURE_ITERATIONS = 8
# Jobs a fold holds at most (the aggregator's cap on distinct jobs): a shard and an agent live through
# many jobs, and a job's fold (its step records, waiting operations, figures) stayed after it ended.
# Past it the job touched least recently goes, counted (``jobs_forgotten``).
MAX_JOBS = L.MAX_JOBS


@dataclass
class _Job:
    fold: WindowFold
    steps: dict[int, list[StepRecord]] = field(default_factory=dict)  # iteration -> its records here
    # rank -> (iteration, arrival, record) of the records naming it among its ends: a new end reads the
    # records of its ranks only. Scanning every held record for them (12 iterations of the shard's nodes)
    # at every node message was half of a shard's CPU (py-spy on `perfd bench engine --collectives`)
    # and grew with the square of its nodes.
    by_rank: dict[int, list[tuple[int, int, StepRecord]]] = field(default_factory=dict)
    # id(record) -> the ranks that still keep it among their newest (it goes when none does)
    keeping: dict[int, int] = field(default_factory=dict)
    arrivals: int = 0
    # The ranks whose windows changed since a take last advanced the fold (None: every rank's). Only
    # theirs can settle anything new there: every other rank was advanced when its operations came
    # and has the same windows, operations and frontier since. Advancing every rank at each take was
    # most of WindowFold._advance's calls (shard_fold_bench --per-message --profile), each finding
    # nothing, a cost growing with the shard's ranks.
    stale: set[int] | None = field(default_factory=set)
    layout: ParallelLayout | None = None
    version: int = 0  # changes with the steps and the layout
    # The ranks whose ends came since the fold last had its windows (None: every rank's windows again:
    # the layout changed, an iteration left, or a record without its ranks' ends came)
    changed: set[int] | None = None


class ShardCollectives:
    """Each job's fold of the operations of the ranks this shard holds."""

    def __init__(self, config: CollectiveConfig | None = None, cache: bool = True) -> None:
        """``cache``: each rank's provisional windows kept from its settling and handed on when they
        change (WindowFold's ``hands_on``); off, computed again at every take (the bench's baseline)."""
        self.cfg = config or CollectiveConfig()
        self.cache = cache
        self.jobs: dict[str, _Job] = {}  # the job touched least recently first
        self.jobs_forgotten = 0

    def _job(self, job: str) -> _Job:
        j = self.jobs.pop(job, None)
        if j is None:
            j = _Job(WindowFold(self.cfg, PENDING, keep=KEEP_FIGURE_ITERATIONS, hands_on=self.cache))
            if len(self.jobs) >= MAX_JOBS:
                del self.jobs[next(iter(self.jobs))]
                self.jobs_forgotten += 1
        self.jobs[job] = j  # last: the most recently touched
        return j

    def add_steps(self, records: Iterable[StepRecord]) -> None:
        """Step records of this shard's ranks (a fold of them: each rank's own end), any job."""
        for r in records:
            j = self._job(r.job)
            j.steps.setdefault(r.iteration, []).append(r)
            j.arrivals += 1
            for rank in r.rank_end_times:
                j.by_rank.setdefault(rank, []).append((r.iteration, j.arrivals, r))
            j.version += 1
            if j.changed is not None:
                if r.rank_end_times and self.cache:
                    j.changed.update(r.rank_end_times)
                else:
                    j.changed = None
            if r.rank_end_times:
                j.keeping[id(r)] = len(r.rank_end_times)
                for rank in r.rank_end_times:
                    _keep_newest(j, rank)
            else:
                _forget_rankless(j)

    def set_layout(self, job: str, layout: ParallelLayout | None) -> None:
        j = self._job(job)
        if layout != j.layout:
            j.layout, j.version, j.changed = layout, j.version + 1, None

    def add(self, part: CollectivePartial) -> None:
        """Its operations onto their ranks' timelines; the windows now settled folded."""
        j = self._job(part.job)
        self._steps_to_fold(j)
        fold = j.fold
        fold.advance(fold.add(row for rows in part.streams.values() for row in rows.values()))

    def take(self) -> list[WindowFigures]:
        """Per job, what its fold made since the last take (perfd.analytics.collectives.winfold's
        take_figures); jobs with nothing new left out."""
        out = []
        for job, j in self.jobs.items():
            if self._steps_to_fold(j):
                j.fold.advance(j.stale)
                j.stale = set()
            figs = j.fold.take_figures(job)
            if figs:
                out.append(figs)
        return out

    def fold_counts(self) -> dict[str, int]:
        """Its folds' counters summed over the jobs it holds (a shard's stats: where a window's figures
        went, as the root's /api/stats says of its own fold)."""
        return FoldCounts.summed(j.fold.counts for j in self.jobs.values()).to_json()

    def frontier(self, job: str, rank: int) -> int | None:
        """The enqueue time up to which the rank's operations are folded and handed on (None: none)."""
        j = self.jobs.get(job)
        st = None if j is None else j.fold.ranks.get(rank)
        return None if st is None else st.frontier

    def settled_from(self, job: str, rank: int) -> int | None:
        """The start of the rank's last settled window (its figures taken final); None: no
        operation of the rank here (nothing of it waits on this fold), or none settled yet (-1)."""
        j = self.jobs.get(job)
        st = None if j is None else j.fold.ranks.get(rank)
        if st is None:
            return None
        return -1 if st.settled_start is None else st.settled_start

    def _steps_to_fold(self, j: _Job) -> bool:
        if j.fold.steps_key == j.version:
            return False
        if j.changed is not None and j.fold.steps_key is not None:
            # Only the ranks whose ends came: their records (a node's fold names its ranks) give their
            # windows as all the records would (each rank's windows are its own ends)
            # (in the order of j.steps: by iteration, then as they came; a record once)
            named = {e[1]: e for rank in j.changed for e in j.by_rank.get(rank, ())}
            j.fold.set_rank_steps(j.version, [e[2] for e in sorted(named.values(), key=_order)], j.changed)
            if j.stale is not None:
                j.stale |= j.changed
        else:
            j.fold.set_steps(j.version, [r for it in sorted(j.steps) for r in j.steps[it]], j.layout)
            j.stale = None
        j.changed = set()
        return True


def _order(e: tuple[int, int, StepRecord]) -> tuple[int, int]:
    return e[0], e[1]


def _keep_newest(j: _Job, rank: int) -> None:
    """The rank's records of its newest KEEP_STEP_ITERATIONS iterations kept; a record none of its ranks
    keeps any more goes (its windows there are made from the records that stay)."""
    entries = j.by_rank[rank]
    if len(entries) <= KEEP_STEP_ITERATIONS:  # (as many iterations at most: nothing to let go)
        return
    its = {e[0] for e in entries}
    if len(its) <= KEEP_STEP_ITERATIONS:
        return
    oldest = sorted(its)[:len(its) - KEEP_STEP_ITERATIONS]
    gone = [e for e in entries if e[0] <= oldest[-1]]
    j.by_rank[rank] = [e for e in entries if e[0] > oldest[-1]]
    for _, _, r in gone:
        left = j.keeping[id(r)] - 1
        if left:
            j.keeping[id(r)] = left
            continue
        del j.keeping[id(r)]
        held = [x for x in j.steps[r.iteration] if x is not r]
        if held:
            j.steps[r.iteration] = held
        else:
            del j.steps[r.iteration]


def _forget_rankless(j: _Job) -> None:
    """Records without their ranks' ends past the job's newest KEEP_STEP_ITERATIONS iterations of them."""
    if len(j.steps) <= KEEP_STEP_ITERATIONS:  # (no more iterations of them than of all records)
        return
    its = sorted(it for it, rs in j.steps.items() if any(not r.rank_end_times for r in rs))
    for it in its[:max(0, len(its) - KEEP_STEP_ITERATIONS)]:
        kept = [r for r in j.steps[it] if r.rank_end_times]
        if kept:
            j.steps[it] = kept
        else:
            del j.steps[it]

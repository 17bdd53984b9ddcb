"""One iteration's rank records folded into one ``"all"`` record: the slowest rank's step (the
iteration ends when it does), every rank's timers kept by rank, the latest end and each rank's own,
armed if any rank was. Pure; shared by the aggregator (perfd.aggregator.job_fold, a job the step hook
alone reports) and the distributed path (perfd.engine: a node's agent folds its ranks, a shard its
nodes', a job's root the shards').

The fold is a join: associative, commutative and idempotent. Folding folds gives the fold of all
their records, in any order and grouping, and folding a record in twice changes nothing — which is
what lets the engine deliver a node's records at least once and still count each once. Two choices
keep it so: the slowest record is chosen by (step time, source) rather than by arrival order, and
the per-rank values are kept in rank order.

:class:`RankFold` folds in place, a record at a time (a shard folds thousands of node messages an
iteration: re-folding the whole accumulated map per message was quadratic, 16.8 s for 3,125 nodes
against 84 ms); the record is built when asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from perfd.core.model import StepRecord, TimerValue

ALL_RANKS: Final = "all"  # the rank scope of a fold (perfd.core.model.RankScope)
# A fold the engine's root hands on names the job's run as that root counts them (a rank's step hook
# began a new process: perfd.engine.root), from the second on: a fold without it is of the first.
RUN_FIELD: Final = "perfd_run"
FIRST_RUN: Final = "1"


def _slowness(r: StepRecord) -> tuple[float, str]:
    """Order of the records a fold chooses its slowest from: the step time, then the source (ties
    broken by what the record is, never by which arrived first)."""
    return (r.step_time_ms if r.step_time_ms is not None else -1.0,
            r.source.detail if r.source is not None else "")


class RankFold:
    """A fold being made: ``add`` rank records or folds, ``record()`` the fold (None before any)."""

    __slots__ = ("_armed", "_end", "_ends", "_keep_ends", "_slow", "_timers")

    def __init__(self, records: Iterable[StepRecord] = (), keep_ends: bool = True) -> None:
        self._slow: StepRecord | None = None
        self._timers: dict[str, dict[int, float]] = {}
        self._end: float | None = None
        # Each rank's own end (StepRecord.rank_end_times), in the order ranks came: a map compared and
        # looked up, never shown, so not sorted (at 100,000 ranks sorting it was a third of a root's
        # fold time; the timers' per-rank values are shown, in rank order).
        self._ends: dict[int, float] = {}
        # False where the ranks' own records stay beside the fold (one aggregator's analysis folds):
        # their windows are read from those records, and the ends would be a map per iteration for nothing.
        self._keep_ends = keep_ends
        self._armed = False
        self.add(records)

    def add(self, records: Iterable[StepRecord]) -> None:
        for r in records:
            if self._slow is None or _slowness(r) > _slowness(self._slow):
                self._slow = r
            for name, tv in r.timers.items():
                per = self._timers.setdefault(name, {})
                if tv.per_rank:
                    per.update(tv.per_rank)
                elif isinstance(r.rank, int) and tv.max_ms is not None:
                    per[r.rank] = tv.max_ms
            if r.end_time is not None and (self._end is None or r.end_time > self._end):
                self._end = r.end_time
            if self._keep_ends:
                self._add_end(r)
            # a rank under ncu paces every rank it synchronises with (perfd.core.armed): the iteration is
            # armed
            self._armed = self._armed or r.armed

    def _add_end(self, r: StepRecord) -> None:
        """A rank's own end, or a fold's ranks' ends."""
        if isinstance(r.rank, int) and r.end_time is not None:
            held = self._ends.get(r.rank)
            if held is None or r.end_time > held:
                self._ends[r.rank] = r.end_time
        elif r.rank_end_times:
            _latest(self._ends, r.rank_end_times)

    def add_fold(self, other: RankFold) -> None:
        """Fold another fold in: as adding every record it holds (no map of its is shared)."""
        if other._slow is not None and (self._slow is None or _slowness(other._slow) > _slowness(self._slow)):
            self._slow = other._slow
        for name, per in other._timers.items():
            self._timers.setdefault(name, {}).update(per)
        if other._end is not None and (self._end is None or other._end > self._end):
            self._end = other._end
        if self._keep_ends:
            _latest(self._ends, other._ends)
        self._armed = self._armed or other._armed

    @property
    def end(self) -> float | None:
        """The latest end folded in (None: none had one)."""
        return self._end

    def record(self) -> StepRecord | None:
        """The fold as one ``"all"`` record: new objects each call (the caller may hand it on)."""
        if self._slow is None:
            return None
        timers: dict[str, TimerValue] = {}
        for name, per in sorted(self._timers.items()):  # in name order: the same whatever arrived first
            # by its ranks (ints, unique): sorting the keys, not the items, is 5x faster at 100,000 ranks
            per_rank = {r: per[r] for r in sorted(per)}
            timers[name] = (TimerValue(min(per_rank.values()), max(per_rank.values()), per_rank) if per_rank
                            else TimerValue())
        return dataclasses.replace(self._slow, rank=ALL_RANKS, timers=timers, end_time=self._end,
                                   armed=self._armed, rank_end_times=dict(self._ends))


def _latest(ends: dict[int, float], more: Mapping[int, float]) -> None:
    """``more`` folded into ``ends``, each rank's the latest seen: two records of one rank's iteration
    (a resend, a restart's) fold to the same end whatever their order. The ranks both hold are looked
    at one by one, the rest go in at once (a job's root folds a 100,000-rank job's ends a few times an
    iteration: a call per rank was half its fold's time)."""
    both = ends.keys() & more.keys()
    kept = {r: ends[r] for r in both if ends[r] > more[r]}
    ends.update(more)
    ends.update(kept)


def fold_ranks(rs: Sequence[StepRecord], keep_ends: bool = True) -> StepRecord:
    """Rank records (or folds of them) of one iteration as one ``"all"`` record; ``keep_ends``: with
    each rank's own end (:class:`RankFold`)."""
    out = RankFold(rs, keep_ends).record()
    if out is None:
        raise ValueError("nothing to fold")
    return out

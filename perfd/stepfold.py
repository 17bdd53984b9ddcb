"""One iteration's rank records folded into one ``"all"`` record: the slowest rank's step (the
iteration ends when it does), every rank's timers kept by rank, the latest end, armed if any rank
was. Pure; shared by the aggregator (perfd.aggregator.job_fold, a job the step hook alone reports)
and the distributed path (perfd.engine: a node's agent folds its ranks, a shard its nodes', a job's
root the shards').

The fold is a join: associative, commutative and idempotent. Folding folds gives the fold of all
their records, in any order and grouping, and folding a record in twice changes nothing — which is
what lets the engine deliver a node's records at least once and still count each once. Two choices
keep it so: the slowest record is chosen by (step time, source) rather than by arrival order, and
the per-rank values are kept in rank order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final

from perfd.model import StepRecord, TimerValue

ALL_RANKS: Final = "all"  # the rank scope of a fold (perfd.model.RankScope)


def _slowness(r: StepRecord) -> tuple[float, str]:
    """Order of the records a fold chooses its slowest from: the step time, then the source (ties
    broken by what the record is, never by which arrived first)."""
    return (r.step_time_ms if r.step_time_ms is not None else -1.0,
            r.source.detail if r.source is not None else "")


def fold_ranks(rs: Sequence[StepRecord]) -> StepRecord:
    """Rank records (or folds of them) of one iteration as one ``"all"`` record."""
    if not rs:
        raise ValueError("nothing to fold")
    slow = max(rs, key=_slowness)
    merged: dict[str, dict[int, float]] = {}
    for r in rs:
        for name, tv in r.timers.items():
            vals = tv.per_rank or ({r.rank: tv.max_ms} if isinstance(r.rank, int) and tv.max_ms is not None
                                   else {})
            merged.setdefault(name, {}).update(vals)
    timers: dict[str, TimerValue] = {}
    for name, per in sorted(merged.items()):  # in name order: the same whatever arrived first
        per_rank = dict(sorted(per.items()))
        timers[name] = (TimerValue(min(per_rank.values()), max(per_rank.values()), per_rank) if per_rank
                        else TimerValue())
    ends = [r.end_time for r in rs if r.end_time is not None]
    # armed: a rank under ncu paces every rank it synchronises with (perfd.armed): the iteration is armed
    return dataclasses.replace(slow, rank=ALL_RANKS, timers=timers, end_time=max(ends) if ends else None,
                               armed=any(r.armed for r in rs))

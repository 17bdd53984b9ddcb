"""Step windows and per-rank collective timelines for the communication share (pure): the matching
of collectives to iterations that :mod:`perfd.analytics.collectives.collective_analysis` computes its shares
over.
Apart because it is interval bookkeeping with no notion of groups, links or findings.

A rank's iteration N is the window between the end times of its step records N-1 and N (the hook's
per-rank records, else the job's records, e.g. Megatron's iteration lines; both are host wall-clock
like ``time_created_ns``). Each Flight Recorder record with a duration becomes an interval
``[start, start + duration_ms]`` where ``start`` is its enqueue time (``time_created_ns``), or the
end of the previous op of the same process group (they run in order on that group's NCCL stream),
whichever is later; it belongs to the window it was enqueued in. A window counts only when the
records cover it (collectives enqueued before and after it, no sequence gap across it: the ring may
wrap between dumps).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from perfd.core.model import StepRecord


@dataclass(frozen=True)
class StepWindow:
    iteration: int
    start_ns: int
    end_ns: int
    n_iterations: int  # iterations the window spans (> 1 when step records are sparse)
    excluded: str | None = None  # "warmup" | "capture": kept out of the summary

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


# An iteration's end (epoch seconds) and the record whose flags it has
IterationEnd = tuple[float, StepRecord]
# What step_windows gives: each rank's windows from its own ends, and the job's from its "last"/"all" records
Windows = tuple[Mapping[int, list[StepWindow]], list[StepWindow]]


def step_windows(steps: Iterable[StepRecord]) -> tuple[dict[int, list[StepWindow]], list[StepWindow]]:
    """(per-rank windows from records of one rank, job windows from "last"/"all" records). A fold's
    ranks' own ends (``rank_end_times``: perfd.core.stepfold, the engine's root holds only folds) give those
    ranks their windows as their own records would, the fold's flags (warm-up, capture) for all of
    them; a rank's own record of an iteration wins over a fold's end for it. Such a fold is not a job
    window: the ranks' records held as they came make none either, so a rank whose records have not
    come yet (its node's fold is still on its way through the engine) waits for them rather than
    being read over the other ranks' windows."""
    per_rank: dict[int, dict[int, IterationEnd]] = {}
    folded: dict[int, dict[int, IterationEnd]] = {}
    job: dict[int, StepRecord] = {}
    for s in steps:
        if s.end_time is None:
            continue
        if isinstance(s.rank, int):
            per_rank.setdefault(s.rank, {})[s.iteration] = (s.end_time, s)
            continue
        if not s.rank_end_times:  # a log's line, a fold from an agent older than the ranks' ends
            cur = job.get(s.iteration)
            if cur is None or (cur.end_time or 0.0) < s.end_time:
                job[s.iteration] = s
        for rank, end in s.rank_end_times.items():
            held = folded.setdefault(rank, {}).get(s.iteration)
            if held is None or held[0] < end:
                folded[rank][s.iteration] = (end, s)
    for rank, ends in folded.items():
        per_rank[rank] = {**ends, **per_rank.get(rank, {})}
    return ({r: iteration_windows(v) for r, v in per_rank.items()},
            iteration_windows({i: (s.end_time or 0.0, s) for i, s in job.items()}))


def iteration_windows(by_it: Mapping[int, IterationEnd]) -> list[StepWindow]:
    out: list[StepWindow] = []
    its = sorted(by_it)
    for a, b in itertools.pairwise(its):
        (ea, _), (eb, rb) = by_it[a], by_it[b]
        start, end = round(ea * 1e9), round(eb * 1e9)
        if end <= start:
            continue
        excluded = ("warmup" if rb.fields.get("warmup") == "true"
                    else "capture" if rb.disturbed_by_capture else None)
        out.append(StepWindow(b, start, end, b - a, excluded))
    return out


def union_ns(ivs: Iterable[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(ivs):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


QueueKey = tuple[int | None, bool, int | None]  # (process group id, p2p, peer of a p2p op)
SeqKey = tuple[int | None, bool]  # (process group id, p2p): what a sequence number counts


class TimedOp(Protocol):
    """What a timeline reads of an operation: a :class:`perfd.core.model.CollectiveRecord` or a
    :class:`perfd.core.collfold.OpRow` (the same names)."""

    @property
    def pg_id(self) -> int | None: ...
    @property
    def is_p2p(self) -> bool: ...
    @property
    def peer(self) -> int | None: ...
    @property
    def collective_seq_id(self) -> int | None: ...
    @property
    def p2p_seq_id(self) -> int | None: ...
    @property
    def time_created_ns(self) -> int | None: ...
    @property
    def duration_ms(self) -> float | None: ...


@dataclass(frozen=True)
class TimelineContext:
    """What a rank's timeline needs of its operations before some enqueue time, once they are gone
    (perfd.analytics.collectives.winfold folds them away): its first enqueue time, each queue's last
    op (its sequence number and end: the next op of the group starts after it), each group's last
    sequence number and enqueue time (a gap to the next one leaves the windows it spans uncovered)."""

    first: int | None = None
    queues: Mapping[QueueKey, tuple[int | None, int]] = field(default_factory=dict)
    seqs: Mapping[SeqKey, tuple[int, int]] = field(default_factory=dict)


@dataclass
class RankTimeline:
    created: list[int]  # sorted enqueue times
    ivs: list[tuple[int, int, str]]  # (start, end, group class), in the order of ``created``
    gaps: list[tuple[int, int]]  # enqueue-time spans where sequence numbers are missing
    first: int | None = None  # the first enqueue time, where ops before ``created`` are gone
    tail: TimelineContext | None = None  # the context after the ops up to rank_timeline's ``cut_ns``

    def complete(self, w: StepWindow) -> bool:
        if not self.created:
            return False
        first = self.created[0] if self.first is None else min(self.first, self.created[0])
        if w.start_ns < first or w.end_ns > self.created[-1]:
            return False
        return not any(a < w.end_ns and b > w.start_ns for a, b in self.gaps)

    def window(self, w: StepWindow) -> tuple[int, dict[str, int]]:
        lo = bisect.bisect_right(self.created, w.start_ns)
        hi = bisect.bisect_right(self.created, w.end_ns)
        sel = self.ivs[lo:hi]
        by: dict[str, list[tuple[int, int]]] = {}
        for s, e, c in sel:
            by.setdefault(c, []).append((s, e))
        return union_ns((s, e) for s, e, _ in sel), {c: union_ns(v) for c, v in by.items()}


def rank_timeline(recs: Sequence[TimedOp], cls: Mapping[int, str], context: TimelineContext | None = None,
                  cut_ns: int | None = None) -> RankTimeline:
    """``cls``: id(record) -> group class. ``context``: what came before ``recs`` (folded away);
    ``cut_ns``: also give the context after the ops enqueued up to it (``tail``)."""
    ctx = context or TimelineContext()
    # Each op's sequence number read once, its queue's list sorted by (sequence, enqueue time, the
    # order it came in): the order a stable sort on the first two gives, without a key call an op
    # (a shard builds each rank's timeline twice an iteration: shard_fold_bench --profile)
    queues: dict[QueueKey, list[tuple[int, int, int, int | None, TimedOp]]] = {}
    seqs: dict[SeqKey, list[tuple[int, int]]] = {}
    for i, r in enumerate(recs):
        p2p, created_or_none = r.is_p2p, r.time_created_ns
        seq = r.p2p_seq_id if p2p else r.collective_seq_id
        queues.setdefault((r.pg_id, p2p, r.peer if p2p else None), []).append(
            (seq or 0, created_or_none or 0, i, seq, r))
        if seq is not None and created_or_none is not None:
            seqs.setdefault((r.pg_id, p2p), []).append((seq, created_or_none))
    tail_q = dict(ctx.queues) if cut_ns is not None else {}
    items: list[tuple[int, int, int, str]] = []
    for qkey, q in queues.items():
        q.sort()  # (sequence or 0, enqueue time or 0, arrival): never reaches the op itself
        prev_seq, prev_end = ctx.queues.get(qkey, (None, None))
        for _, created, _, seq, r in q:
            dur = r.duration_ms or 0.0
            # Ops of one group run in order on its stream: an op starts after the previous one ends.
            start = created if prev_end is None or seq is None or prev_seq is None or seq != prev_seq + 1 \
                else max(created, prev_end)
            if r.is_p2p and prev_end is not None:
                start = max(created, prev_end)  # p2p: one stream per peer pair, sequence shared
            end = start + round(dur * 1e6)
            items.append((created, start, end, cls.get(id(r), "other")))
            prev_end, prev_seq = end, seq
            if cut_ns is not None and created <= cut_ns:
                tail_q[qkey] = (seq, end)
    items.sort()
    gaps: list[tuple[int, int]] = []
    tail_s = dict(ctx.seqs) if cut_ns is not None else {}
    for skey, lst in seqs.items():
        lst.sort()
        before = ctx.seqs.get(skey)
        for (s0, t0), (s1, t1) in itertools.pairwise([before, *lst] if before else lst):
            if s1 > s0 + 1:
                gaps.append((min(t0, t1), max(t0, t1)))
        if cut_ns is not None:
            for s, t in lst:
                if t <= cut_ns:
                    tail_s[skey] = (s, t)
    tail = None
    if cut_ns is not None:
        firsts = [c for c, _, _, _ in items[:1] if c <= cut_ns]
        first = min([*firsts, *([ctx.first] if ctx.first is not None else [])], default=None)
        tail = TimelineContext(first, tail_q, tail_s)
    return RankTimeline([c for c, _, _, _ in items], [(s, e, c) for _, s, e, c in items], gaps,
                        ctx.first, tail)

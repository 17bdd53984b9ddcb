"""The step windows of a job whose records change an iteration at a time (pure): what
:func:`perfd.analytics.collectives.collective_windows.step_windows` gives, made again only where the
records changed since the last call.

Why: the root's window fold needs every rank's windows whenever the job's step records change (each
new iteration's fold, each late node's partial). Made whole each time, they cost O(ranks x iterations
held) — 1-3 s of the root's CPU an iteration at 8,000 ranks and 30 iterations
(``perfd bench root-refresh --collectives``), growing with the iterations held — while the job's
other analyses waited on the store that made them. Here a record is known by its identity (the job
store replaces a record it changes, never changes one in place): an iteration whose records are the
same objects as last time is not read again, and a rank's windows before the first iteration that
changed for it are kept (those of iterations let go, before every iteration held, dropped), the rest
made again from its last end before that iteration: a new iteration makes one window a rank, a late
record for an iteration inside the ones held makes those from it on. Each rank's end is read from the
records when it is needed, not kept beside them (at 100,000 ranks that would be every record's
per-rank ends again).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from perfd.analytics.collectives.collective_windows import IterationEnd, StepWindow, iteration_windows
from perfd.core.model import StepRecord


class StepWindowMemo:
    """``update(steps)`` gives ``step_windows(steps)`` and the ranks whose windows changed."""

    def __init__(self) -> None:
        self._by_it: dict[int, list[StepRecord]] = {}  # the records last read, per iteration, in order
        self._its: list[int] = []  # their iterations, in order
        self._own: dict[int, dict[int, StepRecord]] = {}  # iteration -> rank -> its own record (the last)
        self._job: dict[int, IterationEnd] = {}  # iteration -> the job's end ("last"/"all" records)
        self.rank_windows: dict[int, list[StepWindow]] = {}
        self.job_windows: list[StepWindow] = []

    def update(self, steps: Sequence[StepRecord]) -> set[int]:
        """Read ``steps`` (the job's records, in the job store's order); the ranks whose windows may
        have changed. ``rank_windows`` and ``job_windows`` are then ``step_windows(steps)``'s; a
        changed rank's list is a new one (a reader of the last one keeps it whole)."""
        by_it: dict[int, list[StepRecord]] = {}
        for s in steps:
            if s.end_time is not None:
                by_it.setdefault(s.iteration, []).append(s)
        old = self._by_it
        changed = [it for it in by_it.keys() | old.keys() if not _same(by_it.get(it), old.get(it))]
        if not changed:
            return set()
        self._by_it, self._its = by_it, sorted(by_it)
        touched: dict[int, int | None] = {}  # rank -> the first iteration held that changed for it
        first = self._its[0] if self._its else None
        for it in changed:
            recs = by_it.get(it, [])
            own = {s.rank: s for s in recs if isinstance(s.rank, int)}
            if own:
                self._own[it] = own
            else:
                self._own.pop(it, None)
            job = _job_end(recs)
            if job is not None:
                self._job[it] = job
            else:
                self._job.pop(it, None)
            # an iteration let go before every one held only trims (first = None: none is held)
            at = it if first is not None and it >= first else None
            for rank in _ranks(old.get(it, ())) | _ranks(recs):
                cur = touched.get(rank, at)
                touched[rank] = at if cur is None else cur if at is None else min(cur, at)
        for rank, lo in touched.items():
            ws = self._rank(rank, lo, first)
            if ws is None:
                self.rank_windows.pop(rank, None)
            else:
                self.rank_windows[rank] = ws
        self.job_windows = iteration_windows(self._job)
        return set(touched)

    @property
    def iterations(self) -> list[int]:
        """The iterations the records last read hold an end of, in order (a new list at each change:
        a reader of the last one keeps it whole)."""
        return self._its

    def _end(self, it: int, rank: int) -> IterationEnd | None:
        """The rank's end of iteration ``it`` as step_windows reads it: its own record's, else the
        latest of the folds' (the first of equal ones)."""
        own = self._own.get(it, {}).get(rank)
        if own is not None:
            return (own.end_time or 0.0, own)
        best: IterationEnd | None = None
        for s in self._by_it.get(it, ()):
            e = None if isinstance(s.rank, int) else s.rank_end_times.get(rank)
            if e is not None and (best is None or best[0] < e):
                best = (e, s)
        return best

    def _rank(self, rank: int, lo: int | None, first: int | None) -> list[StepWindow] | None:
        """The rank's windows now (None: it has no end): those held that end before its last end
        before ``lo`` (the first iteration held that changed for it; None: none did), less those of
        iterations before ``first`` (let go), then the ones from that end on made again."""
        if first is None:
            return None
        held = self.rank_windows.get(rank, [])
        its = self._its
        i = len(its) if lo is None else bisect.bisect_left(its, lo)
        p = None  # the rank's last end before lo
        while i > 0 and p is None:
            i -= 1
            if self._end(its[i], rank) is not None:
                p = its[i]
        if p is None:
            i, j = 0, 0  # nothing before lo: every window made again
        else:
            j = len(held)
            while j and held[j - 1].iteration > p:
                j -= 1
            i = 0
            while i < j and held[i].iteration - held[i].n_iterations < first:
                i += 1
        tail = {it: e for it in its[bisect.bisect_left(its, p if p is not None else first):]
                if (e := self._end(it, rank)) is not None}
        if not tail and i == j:
            return None
        return held[i:j] + iteration_windows(tail)


def _same(a: list[StepRecord] | None, b: list[StepRecord] | None) -> bool:
    """The same records, object for object (the job store replaces a record it changes)."""
    return a is not None and b is not None and len(a) == len(b) \
        and all(x is y for x, y in zip(a, b, strict=True))


def _ranks(recs: Iterable[StepRecord]) -> set[int]:
    """The ranks whose ends ``recs`` give."""
    out: set[int] = set()
    for s in recs:
        if isinstance(s.rank, int):
            out.add(s.rank)
        else:
            out.update(s.rank_end_times)
    return out


def _job_end(recs: Sequence[StepRecord]) -> IterationEnd | None:
    """The job's end of an iteration as step_windows reads it: its latest record of no rank and no
    ranks' ends (the first of equal ones)."""
    job: StepRecord | None = None
    for s in recs:
        if not isinstance(s.rank, int) and not s.rank_end_times \
                and (job is None or (job.end_time or 0.0) < (s.end_time or 0.0)):
            job = s
    return None if job is None else (job.end_time or 0.0, job)

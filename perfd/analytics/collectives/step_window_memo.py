"""The step windows of a job whose records change an iteration at a time (pure): what
:func:`perfd.analytics.collectives.collective_windows.step_windows` gives, made again only for the
iterations whose records changed since the last call.

Why: the root's window fold needs every rank's windows whenever the job's step records change (each
new iteration's fold, each late node's partial). Made whole each time, they cost O(ranks x iterations
held) — 1-3 s of the root's CPU an iteration at 8,000 ranks and 30 iterations
(``perfd bench root-refresh --collectives``), growing with the iterations held — while the job's
other analyses waited on the store that made them. Here a record is known by its identity (the job
store replaces a record it changes, never changes one in place): an iteration whose records are the
same objects as last time is not read again, and a rank's windows are extended or trimmed when its
iterations only came after (or left before) the ones it held, made whole again otherwise (a late
record for an iteration inside the ones held).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from perfd.analytics.collectives.collective_windows import IterationEnd, StepWindow, iteration_windows
from perfd.model import StepRecord


class StepWindowMemo:
    """``update(steps)`` gives ``step_windows(steps)`` and the ranks whose windows changed."""

    def __init__(self) -> None:
        self._by_it: dict[int, list[StepRecord]] = {}  # the records last read, per iteration, in order
        self._ends: dict[int, dict[int, IterationEnd]] = {}  # rank -> iteration -> its end
        self._job: dict[int, IterationEnd] = {}  # iteration -> the job's end ("last"/"all" records)
        self._cells: dict[int, dict[int, IterationEnd]] = {}  # iteration -> rank -> its end there
        self.rank_windows: dict[int, list[StepWindow]] = {}
        self.job_windows: list[StepWindow] = []

    def update(self, steps: Sequence[StepRecord]) -> set[int]:
        """Read ``steps`` (the job's records, in the job store's order); the ranks whose windows
        changed. ``rank_windows`` and ``job_windows`` are then ``step_windows(steps)``'s; a changed
        rank's list is a new one (a reader of the last one keeps it whole)."""
        by_it: dict[int, list[StepRecord]] = {}
        for s in steps:
            if s.end_time is not None:
                by_it.setdefault(s.iteration, []).append(s)
        changed = [it for it in by_it.keys() | self._by_it.keys()
                   if not _same(by_it.get(it), self._by_it.get(it))]
        self._by_it = by_it
        touched: dict[int, set[int]] = {}  # rank -> its iterations that changed
        job_changed = False
        for it in changed:
            cell, job_end = _cell(by_it.get(it, []))
            old = self._cells.pop(it, {})
            if cell:
                self._cells[it] = cell
            for rank in old.keys() | cell.keys():
                touched.setdefault(rank, set()).add(it)
                ends = self._ends.setdefault(rank, {})
                if rank in cell:
                    ends[it] = cell[rank]
                else:
                    ends.pop(it, None)
            if job_end is not None:
                self._job[it] = job_end
                job_changed = True
            elif self._job.pop(it, None) is not None:
                job_changed = True
        for rank, its in touched.items():
            ends = self._ends[rank]
            if not ends:
                del self._ends[rank]
                self.rank_windows.pop(rank, None)
                continue
            self.rank_windows[rank] = _windows_after(self.rank_windows.get(rank), ends, its)
        if job_changed:
            self.job_windows = iteration_windows(self._job)
        return set(touched)


def _same(a: list[StepRecord] | None, b: list[StepRecord] | None) -> bool:
    """The same records, object for object (the job store replaces a record it changes)."""
    return a is not None and b is not None and len(a) == len(b) \
        and all(x is y for x, y in zip(a, b, strict=True))


def _cell(recs: Sequence[StepRecord]) -> tuple[dict[int, IterationEnd], IterationEnd | None]:
    """One iteration's ends per rank and the job's, as step_windows reads them from its records."""
    own: dict[int, IterationEnd] = {}
    folded: dict[int, IterationEnd] = {}
    job: StepRecord | None = None
    for s in recs:
        end = s.end_time or 0.0
        if isinstance(s.rank, int):
            own[s.rank] = (end, s)
            continue
        if not s.rank_end_times and (job is None or (job.end_time or 0.0) < end):
            job = s
        for rank, e in s.rank_end_times.items():
            held = folded.get(rank)
            if held is None or held[0] < e:
                folded[rank] = (e, s)
    return {**folded, **own}, None if job is None else (job.end_time or 0.0, job)


def _windows_after(held: list[StepWindow] | None, ends: Mapping[int, IterationEnd], changed: set[int]
                   ) -> list[StepWindow]:
    """A rank's windows now: the ones ``held`` (in order of iteration) trimmed of iterations gone
    before the first it holds and extended by iterations after the last it held, when that is all
    that ``changed``; else made whole."""
    if not held:
        return iteration_windows(ends)
    held_last = held[-1].iteration
    gone = [it for it in changed if it not in ends]
    first = min(ends)
    if any(it >= first for it in gone) or any(it <= held_last for it in changed if it in ends):
        return iteration_windows(ends)
    kept = [w for w in held if w.iteration - w.n_iterations >= first] if gone else held
    # from the last window's end on (an iteration after it whose end did not move on made none)
    return kept + iteration_windows({it: end for it, end in ends.items() if it >= held_last})

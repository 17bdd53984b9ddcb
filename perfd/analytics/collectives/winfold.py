"""Per-window communication figures folded as the operations come (pure): what lets the root of a
100,000-rank job keep every rank's per-iteration communication share while it holds 2 of its
operations (perfd.core.collfold.REDUCED_RETENTION).

Why here, and why at the root: a rank's share of an iteration is the union of its collectives'
intervals per group *class* in a step window, and both the class (the job's layout and world size)
and the windows (the job's step records) are the root's; the rows a node's agent sends carry neither
(perfd/core/collfold.py says why the partials keep rows). So the aggregator's store hands each operation
it newly merged (the keyed union tells a new one from one it holds: a redelivery or a second dump)
to the job's :class:`WindowFold`, which:

- keeps each rank's timed Flight Recorder operations *waiting* (``buffer``) until the windows they
  fall in are settled: the job's step records close the window and the rank's operations reach
  ``SETTLE_WINDOWS`` windows past it (an op is sent once final, in dump order: a long one enqueued
  earlier may come a dump later than the ops after it, and the step record that closes an iteration
  may still move until the shards' folds of it are in), and the rank's end of every iteration the
  job's records show inside the window is in (``LATE_END_WINDOWS``: a node's fold the root hands on
  after its later ones);
- then computes each settled window's figures with the same timeline the analysis runs on rows
  (perfd.analytics.collectives.collective_windows.rank_timeline: the same starts, unions and coverage), the
  operations before the window stood for by a :class:`TimelineContext` (each queue's last op, each
  group's last sequence number, the first enqueue time), and keeps the figures (union of all
  intervals, and per class) in one block per iteration, columns of integers (``_Block``), for the
  newest ``max(recent_windows, max_iterations_out)`` iterations: what the analysis reads;
- then lets the operations of those windows go; the rank's *frontier* (the end of its last settled
  window) refuses any operation enqueued before it: a late one, or one the store let go and that
  comes again (a redelivery) — counted (``late``), never counted twice.

The waiting operations are bounded (``PENDING``: per rank, and per job shared over its ranks, as the
store's retention): past it a rank's oldest are folded away without their windows (counted
``pending_dropped``; those windows come out uncovered, absent rather than invented). A job whose step
records never come keeps its ranks' newest operations waiting, no more.

:func:`perfd.analytics.collectives.collective_analysis.finish` reads a :class:`FoldView` (a snapshot the
analysis can read outside the store's lock): the settled figures, and the windows after each rank's
frontier computed from its waiting operations as the rows would give them. Given every operation
before its window settles, the figures are the ones the analysis computes from all the rows
(tests/collectives/test_window_fold.py: byte for byte, with 2 operations a rank held). What it does
not do: a layout that comes after a window settled does not re-class that window; a rank's summary
is over its complete windows among the newest ``max_iterations_out`` iterations (the rows' is over
its latest ``recent_windows`` wherever they lie).
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics.collectives.collective_config import FR, CollectiveConfig
from perfd.analytics.collectives.collective_windows import (
    RankTimeline,
    StepWindow,
    TimelineContext,
    rank_timeline,
    step_windows,
)
from perfd.analytics.collectives.fold_counts import FoldCounts
from perfd.analytics.collectives.groups import classify_group
from perfd.analytics.collectives.rank_shares import Figure, WindowKey, outside_figures
from perfd.core import limits as L
from perfd.core.collfold import GroupRef, OpKey, OpRow, Retention, op_key
from perfd.core.model import ParallelLayout, StepRecord
from perfd.core.winfigures import ABSENT, RankWindow, WindowFigures

# A window's figures are made once the rank's operations reach this many windows past it.
SETTLE_WINDOWS = 1
# ... and, where the job's step records show an iteration inside the window (or before a rank's first)
# that the rank has no end of, once that end comes or its operations reach this many windows past it.
# The end is on its way: the engine's root hands a node's fold of an iteration on after the node's
# later ones where a shard was killed and its messages came again after the next ones, or the shard
# was starved past the root's memory (perfd.engine.rootfold's late path), while the rank's operations
# came on time on the records stream. Settled over the window the ends held then, its operations let
# go, the end could not split it again: the rank's shares of those iterations differed from one
# aggregator's (absent, and the next one's read over them all). 64: the ~50 iterations of a 0.25 s
# iteration that a killed shard's redelivery takes (the engine's ack wait after its lease).
LATE_END_WINDOWS = 64
# Operations waiting for their windows: each rank's newest 4,096, 2,000,000 a job (at 100,000 ranks 20
# a rank: ~3 iterations of a rank running 6 collectives an iteration; a job running more a rank an
# iteration has its windows folded away uncovered at that scale, counted).
PENDING = Retention(per_rank=4096, per_job=2_000_000)



class _Block:
    """One iteration's figures, a rank a row (columns of integers: ~40 bytes a rank)."""

    __slots__ = ("by", "comm", "handed", "ranks", "windows")

    def __init__(self) -> None:
        self.ranks = array("q")
        self.comm = array("q")
        self.windows: list[StepWindow] = []  # the job's windows: one object shared by every row
        self.by: dict[str, array[int]] = {}
        # (a fold handing its figures on) rows settled as handed on provisional: a take leaves them out
        self.handed: set[int] = set()

    def add(self, rank: int, w: StepWindow, comm: int, by: Mapping[str, int]) -> None:
        n = len(self.ranks)
        self.ranks.append(rank)
        self.comm.append(comm)
        self.windows.append(w)
        for c in by:
            if c not in self.by:
                self.by[c] = array("q", [ABSENT]) * n
        for c, col in self.by.items():
            col.append(by.get(c, ABSENT))

    def __len__(self) -> int:
        return len(self.ranks)


@dataclass
class _Rank:
    buffer: dict[OpKey, OpRow] = field(default_factory=dict)  # waiting, by operation
    ctx: TimelineContext = field(default_factory=TimelineContext)  # the operations let go
    frontier: int | None = None  # enqueue time up to which its operations are folded
    newest: int = 0  # the newest enqueue time taken
    settled_start: int | None = None  # the start of its last settled window (a shard's acks read it)
    missing: bool = False  # its settling waits for a step end the job's records show and it lacks
    # (a fold that hands its figures on) the timeline of its waiting operations, under the state it
    # is of (what its newest windows' figures are read from: computed again only when that changed),
    # and what it handed on of each window (iteration -> its figures)
    timeline: tuple[tuple[object, ...], RankTimeline] | None = None
    read: tuple[RankTimeline, list[StepWindow]] | None = None  # the timeline and windows last read
    sent: dict[int, tuple[object, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Bounds:
    """A window list's starts and ends, for bisecting (built once a list)."""

    windows: list[StepWindow]
    starts: list[int]
    ends: list[int]

    @classmethod
    def of(cls, windows: list[StepWindow]) -> _Bounds:
        return cls(windows, [w.start_ns for w in windows], [w.end_ns for w in windows])


class Classes:
    """Each group's class as the analysis gives it (classify_group), for one layout and the world
    size the operations show (the largest group, or the highest rank + 1)."""

    def __init__(self, layout: ParallelLayout | None, biggest: int, top: int, order: str) -> None:
        self.world = (layout.world_size if layout else None) or (max(biggest, top + 1) or None)
        self.layout, self.order = layout, order
        self._of: dict[GroupRef, str] = {}

    def of(self, g: GroupRef) -> str:
        c = self._of.get(g)
        if c is None:
            c = self._of[g] = classify_group(g.pg_ranks, self.layout, self.world, g.pg_desc, self.order)[0]
        return c

    def rows(self, rows: Iterable[OpRow]) -> dict[int, str]:
        known = self._of  # the groups classed already: a dict look-up a row, not a method call
        out: dict[int, str] = {}
        for r in rows:
            c = known.get(r.group)
            out[id(r)] = c if c is not None else self.of(r.group)
        return out


def _figure(w: StepWindow, comm: int, by: Mapping[str, int]) -> tuple[int, int, int, str | None, int,
                                                                       tuple[tuple[str, int], ...]]:
    """A rank's figures of a window as a fold that hands them on compares them with what it handed on."""
    return w.start_ns, w.end_ns, w.n_iterations, w.excluded, comm, tuple(sorted(by.items()))


class WindowFold:
    """One job's per-window figures, folded from its operations as they come (see the module)."""

    def __init__(self, config: CollectiveConfig | None = None, pending: Retention = PENDING,
                 settle: int = SETTLE_WINDOWS, keep: int | None = None, hands_on: bool = False) -> None:
        self.cfg = config or CollectiveConfig()
        # A fold whose figures are taken (take_figures: a shard's) keeps each rank's provisional
        # windows from the timeline its settling built, and hands on only those that changed: a rank's
        # newest windows were computed again at every take, a third of a shard's fold (shard_fold_bench)
        self.hands_on = hands_on
        self.pending_bound, self.settle = pending, settle
        # iterations of figures kept: what the analysis reads; a shard's fold keeps fewer (it hands
        # them on: take_figures)
        self.keep = keep or max(self.cfg.recent_windows, self.cfg.max_iterations_out)
        self.max_rows = L.MAX_FIGURE_ROWS_PER_JOB  # of figures made elsewhere, held (add_figures)
        self.ranks: dict[int, _Rank] = {}
        self.blocks: dict[int, _Block] = {}  # iteration -> its figures
        self.pending = 0
        self.counts = FoldCounts()
        self.steps_key: object = None
        self.layout: ParallelLayout | None = None
        # The iterations the job's step records show an end of, in order, where the store tells them
        # (set_windows): a rank's window over one it has no end of waits for it (LATE_END_WINDOWS). A
        # shard's fold is not told: a node's ends come in the same messages as its operations.
        self._shown: Sequence[int] = ()
        self._job = _Bounds.of([])
        self._per_rank: dict[int, _Bounds] = {}
        self._groups: dict[GroupRef, int] = {}  # group -> its distinct ranks (the world size's)
        self._biggest = 0
        self._top = -1
        self._classes: Classes | None = None
        # Figures made elsewhere (a shard's fold of its ranks' operations), merged by their join, one
        # join an iteration: keeping the newest ``keep`` of them then walks the iterations, not every
        # row held (at 100,000 ranks, millions: every shard message walked them all, which held the
        # root's core — perfd bench root-figures)
        self._outside: dict[int, WindowFigures] = {}
        self._outside_job = ""
        # What take_figures handed on: each block's rows up to, the ranks touched since, retractions
        self._taken: dict[int, int] = {}
        self._touched: set[int] = set()
        self._retracted: list[tuple[int, int]] = []

    # ---- what the store tells it -------------------------------------------------------------------
    def set_steps(self, key: object, steps: Sequence[StepRecord], layout: ParallelLayout | None) -> None:
        """The job's step records (its windows) and layout, when they changed (``key``)."""
        self.set_windows(key, *step_windows(steps), layout)

    def set_windows(self, key: object, rank_windows: Mapping[int, list[StepWindow]],
                    job_windows: list[StepWindow], layout: ParallelLayout | None,
                    changed: Iterable[int] | None = None, shown: Sequence[int] | None = None) -> None:
        """As :meth:`set_steps`, from the windows made already (a StepWindowMemo's, made outside the
        store's lock); only the ``changed`` ranks' are read again (None: every rank's). ``shown``: the
        iterations the records show an end of, in order (None: as they were)."""
        if shown is not None:
            self._shown = shown
        self._job = _Bounds.of(job_windows)
        if changed is None:
            self._per_rank = {r: _Bounds.of(ws) for r, ws in rank_windows.items()}
        for r in changed or ():
            ws = rank_windows.get(r)
            if ws is None:
                self._per_rank.pop(r, None)
            else:
                self._per_rank[r] = _Bounds.of(ws)
        self.layout = layout
        self.steps_key = key
        # windows its waiting operations fall in may have closed: their rows are handed on again
        self._touched.update(r for r, st in self.ranks.items() if st.buffer)

    def set_rank_steps(self, key: object, steps: Sequence[StepRecord], ranks: Iterable[int]) -> None:
        """``ranks``' windows again from ``steps`` (records holding every end of theirs; the others'
        windows, the job's and the layout as they were): a shard's fold, whose new step ends each name
        a node's ranks, where every end built every rank's windows again."""
        rank_windows, _ = step_windows(steps)
        for r in ranks:
            ws = rank_windows.get(r)
            if ws is not None:
                self._per_rank[r] = _Bounds.of(ws)
            st = self.ranks.get(r)
            if st is not None and st.buffer:
                self._touched.add(r)
        self.steps_key = key

    def add(self, rows: Iterable[OpRow]) -> set[int]:
        """Take operations the store newly merged; the ranks they touched (then :meth:`advance`)."""
        touched: set[int] = set()
        c = self.counts
        for row in rows:
            self._see_group(row)
            created, rank = row.time_created_ns, row.rank
            if row.source != FR or row.duration_ms is None or created is None or rank is None:
                c.untimed += 1
                continue
            st = self.ranks.get(rank)
            if st is None:
                st = self.ranks[rank] = _Rank()
            if st.frontier is not None and created <= st.frontier:
                c.late += 1
                continue
            key = op_key(row)
            if key in st.buffer:
                c.again += 1
                continue
            st.buffer[key] = row
            st.newest = max(st.newest, created)
            self.pending += 1
            c.folded += 1
            touched.add(rank)
        self._touched |= touched
        k = self.pending_bound.k(len(self.ranks))
        if k is not None:
            for rank in touched:
                st = self.ranks[rank]
                if len(st.buffer) > k and st.missing:  # its wait ends: what can settle does
                    self._advance(rank, st, wait=False)
                if len(st.buffer) > k:
                    self._fold_away(rank, st, k)
        return touched

    def advance(self, ranks: Iterable[int] | None = None) -> None:
        """Make the figures of every window now settled (of ``ranks``, or of every rank)."""
        for rank in self.ranks if ranks is None else ranks:
            st = self.ranks.get(rank)
            if st is not None and st.buffer:
                self._advance(rank, st)

    def view(self) -> FoldView:
        """A snapshot the analysis reads outside the store's lock (blocks only grow at their end, and
        a rank's context is replaced, never changed; the figures made elsewhere are copied)."""
        outside = {it: list(f.rows.values()) for it, f in self._outside.items()}
        return FoldView({it: (b, len(b)) for it, b in self.blocks.items()},
                        {r: (list(st.buffer.values()), st.ctx, st.frontier) for r, st in self.ranks.items()},
                        self._biggest, self._top, FoldCounts(**vars(self.counts)), outside)

    def newest_figures(self) -> int | None:
        """The newest iteration it holds a figure of (its own or one made elsewhere); None: none."""
        return max([it for it, b in self.blocks.items() if len(b)]
                   + [it for it, f in self._outside.items() if f.rows], default=None)

    # ---- figures made in one fold and read in another (a shard's, the root's) ---------------------
    @property
    def outside(self) -> WindowFigures:
        """The figures made elsewhere, every iteration's in one join (a copy: what tests and readers
        of the whole read)."""
        rows = {k: w for f in self._outside.values() for k, w in f.rows.items()}
        return WindowFigures(self._outside_job, rows)

    def add_figures(self, figs: WindowFigures) -> int:
        """Merge figures a shard's fold made of its ranks (a join: one delivered twice merges once);
        how many went in. The newest ``keep`` iterations are kept, as of the blocks."""
        if not self._outside_job:
            self._outside_job = figs.job
        n = 0
        joins = self._outside
        join, last = None, None
        for key, w in figs.rows.items():  # a message's rows come by iteration: its join looked up once
            it = key[0]
            if it != last or join is None:
                join = joins.get(it)
                if join is None:
                    join = joins[it] = WindowFigures(self._outside_job)
                last = it
            n += join.add(it, w)
        self.counts.received += n
        its = sorted(joins)
        rows = sum(len(j) for j in joins.values())
        for k, it in enumerate(its[:-1]):  # the newest iteration stays, whatever its rows
            if len(its) - k <= self.keep and rows <= self.max_rows:
                break
            gone = len(joins.pop(it))
            rows -= gone
            self.counts.evicted += gone
            if len(its) - k <= self.keep:
                self.counts.evicted_for_rows += gone
        return n

    def take_figures(self, job: str) -> WindowFigures:
        """What this fold made since the last take, to hand on: the rows of settled windows (and a
        settled row taken back by a sequence gap seen later, as uncovered), and for each rank that
        took operations since, its windows after its frontier as its waiting operations give them
        (provisional: a later row of the same window replaces it where the figures are merged)."""
        out = WindowFigures(job)
        for it, i in self._retracted:
            block = self.blocks.get(it)
            if block is not None and i < len(block):
                out.add(it, self._row(block, i, True))
        self._retracted.clear()
        for it, block in self.blocks.items():
            for i in range(self._taken.get(it, 0), len(block)):
                if i not in block.handed:
                    out.add(it, self._row(block, i, True))
            self._taken[it] = len(block)
        if len(self.blocks) > self.keep:  # those kept for this take
            self._evict()
        classes = self._class_map()
        for rank in sorted(self._touched):
            st = self.ranks.get(rank)
            if st is None or not st.buffer:
                continue
            if self.hands_on:
                tl = self._timeline(st, classes)
                # its windows after the frontier that its operations can cover (sorted: by bisection)
                b = self._per_rank.get(rank) or self._job
                lo = 0 if st.frontier is None else bisect.bisect_left(b.starts, st.frontier)
                mine = b.windows[lo:bisect.bisect_right(b.ends, tl.created[-1]) if tl.created else lo]
                if st.read is not None and st.read[0] is tl and st.read[1] == mine:
                    continue  # the same timeline over the same windows: what it handed on last
                st.read = (tl, mine)
                figs = [(w, *tl.window(w)) for w in mine if tl.complete(w)]
            else:
                rows = list(st.buffer.values())
                tl = rank_timeline(rows, classes.rows(rows), st.ctx)
                figs = [(w, *tl.window(w)) for w in self._windows_of(rank)
                        if (st.frontier is None or w.start_ns >= st.frontier) and tl.complete(w)]
            for w, comm, by_ in figs:
                fig = _figure(w, comm, by_)
                if self.hands_on:  # the same figures as handed on before: the join has them
                    if st.sent.get(w.iteration) == fig:
                        continue
                    st.sent[w.iteration] = fig
                out.add(w.iteration, RankWindow(rank, w.start_ns, w.end_ns, w.n_iterations, w.excluded,
                                                comm, fig[5], False, st.newest))
        self._touched.clear()
        return out

    def _timeline(self, st: _Rank, classes: Classes) -> RankTimeline:
        """The rank's waiting operations' timeline: the one its last settling or take built while
        nothing changed since (its windows are read from it as they are now, so new step ends need no
        new timeline), else built again. Its settling's, built before the settled operations were let
        go, gives every window after the frontier as this one would: the same operations in them, each
        after the same predecessor in its queue, the same first operation and gaps."""
        key = (id(classes), id(st.ctx), len(st.buffer), st.newest, st.frontier)
        if st.timeline is not None and st.timeline[0] == key:
            return st.timeline[1]
        rows = list(st.buffer.values())
        tl = rank_timeline(rows, classes.rows(rows), st.ctx)
        st.timeline = (key, tl)
        return tl

    def _row(self, block: _Block, i: int, settled: bool) -> RankWindow:
        w, rank = block.windows[i], block.ranks[i]
        st = self.ranks.get(rank)
        by = tuple(sorted((c, col[i]) for c, col in block.by.items() if col[i] != ABSENT))
        return RankWindow(rank, w.start_ns, w.end_ns, w.n_iterations, w.excluded, block.comm[i], by, settled,
                          st.newest if st is not None else 0)

    # ---- inside ------------------------------------------------------------------------------------
    def _see_group(self, row: OpRow) -> None:
        g = row.group
        if g not in self._groups:
            n = self._groups[g] = len(set(g.pg_ranks)) if g.pg_ranks else 0
            self._biggest = max(self._biggest, n)
        if row.rank is not None and row.rank > self._top:
            self._top = row.rank

    def _class_map(self) -> Classes:
        """The classes for the layout and the world size now (made again only when either changed:
        a world group lists every rank, and classing it costs as much)."""
        c = Classes(self.layout, self._biggest, self._top, self.cfg.order)
        if self._classes is None or (self._classes.layout, self._classes.world) != (c.layout, c.world):
            self._classes = c
        return self._classes

    def _advance(self, rank: int, st: _Rank, wait: bool = True) -> None:
        b = self._per_rank.get(rank) or self._job
        # Settled: starts at or after the frontier, and the rank's ops reach `settle` windows past it
        lo = 0 if st.frontier is None else bisect.bisect_left(b.starts, st.frontier)
        reached = bisect.bisect_right(b.ends, st.newest)  # windows its operations reach
        hi = reached - self.settle  # windows [lo, hi) settled
        if hi > lo and rank in self._per_rank:  # its own ends (a log's job windows have no rank's)
            hi = self._before_missing_end(b, st, lo, hi, reached if wait else None)
        if hi <= lo:
            return
        settled = b.windows[lo:hi]
        cut = settled[-1].end_ns
        rows = list(st.buffer.values())
        tl = rank_timeline(rows, self._class_map().rows(rows), st.ctx, cut)
        self._retract(rank, st, tl.gaps)
        for w in settled:
            if tl.complete(w):
                block = self.blocks.get(w.iteration)
                if block is None:
                    block = self.blocks[w.iteration] = _Block()
                comm, by_ = tl.window(w)
                block.add(rank, w, comm, by_)
                self.counts.windows += 1
                # Settled as handed on provisional: the join keeps that row (only this fold's own later
                # rows could replace it: none after its settling), so no settled copy
                # (docs/evidence/entries/48-scale-history.md)
                sent = st.sent.get(w.iteration) if self.hands_on else None
                if sent is not None and sent == _figure(w, comm, by_):
                    block.handed.add(len(block) - 1)
                    self.counts.settled_as_handed += 1
            else:
                self.counts.uncovered += 1
        self._let_go(st, tl.tail, cut)
        st.settled_start = settled[-1].start_ns
        if self.hands_on:  # what the take reads the windows after the new frontier from
            st.timeline = ((id(self._classes), id(st.ctx), len(st.buffer), st.newest, st.frontier), tl)
            for it in [it for it in st.sent if it <= settled[-1].iteration]:
                del st.sent[it]
        if len(self.blocks) > self.keep:
            self._evict()

    def _evict(self) -> None:
        """The oldest iterations' figures past ``keep`` let go; in a fold that hands them on, only those
        taken (a shard that took a killed one's partitions settles their windows iterations behind its
        others': the oldest was then the one just settled, let go before a take handed it on)."""
        for it in sorted(self.blocks):
            if len(self.blocks) <= self.keep:
                return
            if self.hands_on and self._taken.get(it, 0) < len(self.blocks[it]):
                continue
            self.counts.evicted += len(self.blocks.pop(it))
            self._taken.pop(it, None)

    def _before_missing_end(self, b: _Bounds, st: _Rank, lo: int, hi: int, reached: int | None) -> int:
        """Where the rank's windows [lo, hi) stop settling: at the first over (or, its first, after)
        an iteration the job's records show and it has no end of, while its operations reach fewer
        than LATE_END_WINDOWS windows past it (``reached``; None: no waiting); those settled without
        it are counted (``missing_end``)."""
        shown = self._shown
        st.missing = False
        if not shown:
            return hi
        for i in range(lo, hi):
            w = b.windows[i]
            before = w.iteration - w.n_iterations  # the rank's end before this window's
            j = bisect.bisect_right(shown, before)
            if not ((j < len(shown) and shown[j] < w.iteration) or (i == 0 and shown[0] < before)):
                continue
            if reached is not None and reached - 1 - i < LATE_END_WINDOWS:
                st.missing = True
                return i
            self.counts.missing_end += 1
        return hi

    def _fold_away(self, rank: int, st: _Rank, k: int) -> None:
        """Past the bound: the rank's oldest waiting operations leave without their windows."""
        rows = sorted(st.buffer.values(), key=lambda r: r.time_created_ns or 0)
        cut = rows[len(rows) - k - 1].time_created_ns or 0
        tl = rank_timeline(rows, self._class_map().rows(rows), st.ctx, cut)
        self._retract(rank, st, tl.gaps)
        before = len(st.buffer)
        self._let_go(st, tl.tail, cut)
        self.counts.pending_dropped += before - len(st.buffer)

    def _retract(self, rank: int, st: _Rank, gaps: Sequence[tuple[int, int]]) -> None:
        """A sequence gap from before the frontier (the ops after it came once its windows had
        settled: the ring wrapped between dumps) leaves the windows it spans uncovered, as the rows
        would: their figures go (the gap is seen while the op after it waits: before it is let go)."""
        for a, b in _past(gaps, st.frontier):
            for w in self._windows_of(rank):
                if w.end_ns > (st.frontier or 0):
                    break
                block = self.blocks.get(w.iteration)
                if block is None or not (w.start_ns < b and w.end_ns > a):
                    continue
                for i, r in enumerate(block.ranks):
                    if r == rank and block.comm[i] != ABSENT and block.windows[i] == w:
                        block.comm[i] = ABSENT
                        self._retracted.append((w.iteration, i))
                        self.counts.windows -= 1
                        self.counts.uncovered += 1
                        self.counts.retracted += 1

    def _windows_of(self, rank: int) -> list[StepWindow]:
        return (self._per_rank.get(rank) or self._job).windows

    def _let_go(self, st: _Rank, tail: TimelineContext | None, cut: int) -> None:
        st.ctx = tail or st.ctx
        st.frontier = cut if st.frontier is None else max(st.frontier, cut)
        gone = [key for key, row in st.buffer.items() if (row.time_created_ns or 0) <= cut]
        for key in gone:
            del st.buffer[key]
        self.pending -= len(gone)


@dataclass(frozen=True)
class FoldView:
    """What :func:`perfd.analytics.collectives.collective_analysis.finish` reads of a :class:`WindowFold`."""

    blocks: Mapping[int, tuple[_Block, int]]  # iteration -> its figures, the rows it had then
    waiting: Mapping[int, tuple[list[OpRow], TimelineContext, int | None]]  # rank -> ops, context, frontier
    biggest: int
    top: int
    counts: FoldCounts
    outside: Mapping[int, list[RankWindow]] = field(default_factory=dict)  # iteration -> rows made elsewhere

    def figures(self, windows_of: Callable[[int], list[StepWindow]], layout: ParallelLayout | None,
                order: str) -> dict[int, list[Figure]]:
        """Each rank's complete windows, in window order: those settled, then those after its
        frontier computed from its waiting operations (``windows_of``: the rank's windows now)."""
        out: dict[int, list[Figure]] = {r: [] for r in self.waiting}
        for it in sorted(self.blocks):
            block, n = self.blocks[it]
            cols = list(block.by.items())
            for i in range(n):
                if block.comm[i] != ABSENT:
                    by = {c: col[i] for c, col in cols if col[i] != ABSENT}
                    out.setdefault(block.ranks[i], []).append((block.windows[i], block.comm[i], by))
        shared: dict[WindowKey, StepWindow] = {}  # one window object a window
        for it in sorted(self.outside):
            outside_figures(it, self.outside[it], shared, out)
        if self.outside and self.blocks:  # a rank folded here and elsewhere: its windows in order
            for figs in out.values():
                figs.sort(key=lambda f: f[0].start_ns)
        classes = Classes(layout, self.biggest, self.top, order)
        for rank, (rows, ctx, frontier) in self.waiting.items():
            if not rows:
                continue
            tl = rank_timeline(rows, classes.rows(rows), ctx)
            # a gap the waiting ops show back into settled windows: those are uncovered (_retract)
            for a, b in _past(tl.gaps, frontier):
                out[rank] = [f for f in out[rank] if not (f[0].start_ns < b and f[0].end_ns > a)]
            windows = [w for w in windows_of(rank) if frontier is None or w.start_ns >= frontier]
            out[rank].extend((w, *tl.window(w)) for w in windows if tl.complete(w))
        return out


def _past(gaps: Sequence[tuple[int, int]], frontier: int | None) -> list[tuple[int, int]]:
    """The gaps that reach back before a rank's frontier (into its settled windows)."""
    return [] if frontier is None else [(a, b) for a, b in gaps if a < frontier]

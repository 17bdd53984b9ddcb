"""Per-window communication figures as they travel from where they are folded to where they are read
(pure): a :class:`WindowFigures` is some ranks' figures of some step windows of one job — each rank's
union of its collectives' intervals in a window, and per group class — made by the window fold
(perfd.analytics.collectives.winfold) wherever it runs, and merged where the analysis reads them.

Why figures travel and not the operations: a 100,000-rank job running 6 collectives a rank an
iteration is 600,000 operations an iteration; folding them all where the analysis runs (one root)
costs more than its one core (perfd bench collectives --every-operation). A shard that holds a slice
of the job's nodes holds their step records too (a rank's own window is between its own step ends),
so it can fold its ranks' operations into figures — one row a rank a window, ~40 bytes — and the
root merges the rows.

The merge is a join: rows are keyed by (iteration, rank), and of two rows under one key the greater
under :func:`_order` stays — a *settled* row (the fold let its operations go: final) over a
*provisional* one (computed from operations still waiting, as the analysis reads a rank's newest
windows), then the one computed from the newer operations (``basis``: the newest enqueue time the
rank's fold had taken), then every field, so that any order and any number of deliveries give the
same rows. It sits beside perfd.core.collfold, below both analytics and the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

ABSENT = -1  # a class with no operation in a rank's window (0 is a class whose ops took no time)


class RankWindow(NamedTuple):
    """One rank's figures of one window (its bounds as the rank's step records give them). A tuple:
    the root makes one a rank an iteration, millions held for a 100,000-rank job, and a tuple is
    made several times faster than a frozen dataclass (perfd bench root-figures)."""

    rank: int
    start_ns: int
    end_ns: int
    n_iterations: int
    excluded: str | None
    comm_ns: int  # the union of its intervals enqueued in the window; ABSENT: uncovered after all
    by: tuple[tuple[str, int], ...]  # (group class, union), sorted by class
    settled: bool  # final: the fold let the window's operations go
    basis: int  # the newest enqueue time the rank's fold had taken when it was made


def _order(w: RankWindow) -> tuple[object, ...]:
    return (w.settled, w.basis, w.start_ns, w.end_ns, w.n_iterations, w.excluded or "", w.comm_ns, w.by)


@dataclass
class WindowFigures:
    """Some ranks' figures of one job, keyed by (iteration, rank)."""

    job: str
    rows: dict[tuple[int, int], RankWindow] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, iteration: int, w: RankWindow) -> bool:
        """Whether ``w`` went in: a (iteration, rank) not held, or a greater row under it."""
        key = (iteration, w.rank)
        cur = self.rows.get(key)
        # (a row equal to the one held is not greater: the order reads every field but the rank,
        # which the key holds; an excluded None and "" are one to it, and the first stays). Its first
        # two fields decide most merges (a settled row over a provisional one, a newer basis): read
        # first, without making the two tuples (the root merges ~2 rows a rank an iteration).
        if cur is None:
            greater = True
        elif w.settled != cur.settled:
            greater = w.settled
        elif w.basis != cur.basis:
            greater = w.basis > cur.basis
        else:
            greater = _order(w) > _order(cur)
        if greater:
            self.rows[key] = w
        return greater

    def absorb(self, other: WindowFigures) -> list[tuple[int, RankWindow]]:
        """Merge ``other`` in, in place; the rows that went in (what a reader of the merge updates)."""
        if other.job != self.job:
            raise ValueError(f"merging figures of two jobs ({self.job!r}, {other.job!r})")
        return [(it, w) for (it, _), w in other.rows.items() if self.add(it, w)]

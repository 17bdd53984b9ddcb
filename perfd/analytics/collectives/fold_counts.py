"""What a window fold (perfd.analytics.collectives.winfold.WindowFold) did with what it was given,
counted: each operation and each (rank, window) lands in one of these, so a figure that is absent says
why (pure)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class FoldCounts:
    folded: int = 0  # timed operations taken onto a rank's timeline
    untimed: int = 0  # operations no timeline reads (no duration, enqueue time or rank; not Flight Recorder)
    again: int = 0  # already waiting (a second dump of it)
    late: int = 0  # enqueued before its rank's frontier (its window settled; or a redelivery of one let go)
    pending_dropped: int = 0  # waited past PENDING: folded away without their windows
    windows: int = 0  # (rank, window) figures made
    uncovered: int = 0  # (rank, window) settled that its operations do not cover
    retracted: int = 0  # of the windows made, found uncovered after all (a sequence gap seen later)
    evicted: int = 0  # (rank, window) figures let go with their iteration (older than the kept ones)
    # of those, let go before the iterations' cap for the rows' (limits.MAX_FIGURE_ROWS_PER_JOB)
    evicted_for_rows: int = 0
    # (rank, window) settled over, or first after, an iteration the job's records show that the rank had
    # no end of: waited LATE_END_WINDOWS (or its waiting operations' bound) and came not, or never sent
    missing_end: int = 0
    received: int = 0  # (rank, window) figures made elsewhere (a shard's fold) merged in
    # (rank, window) settled with the figures its provisional row handed on had: not handed on again
    settled_as_handed: int = 0

    def to_json(self) -> dict[str, int]:  # every counter: an int, as the engine's stats type them
        return dict(vars(self))

    @staticmethod
    def summed(counts: Iterable[FoldCounts]) -> FoldCounts:
        """Every counter added over ``counts`` (several jobs' folds: one figure for /api/stats)."""
        total = FoldCounts()
        for c in counts:
            for k, v in vars(c).items():
                setattr(total, k, getattr(total, k) + v)
        return total

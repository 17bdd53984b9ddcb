"""One rank's communication shares, read from its window figures: each window's share of the window and
per group class, and the medians over the rank's recent windows the job's summary is made of. Pure.

The one place this is computed: the job's analysis (perfd.analytics.collectives.collective_analysis)
reads every rank's shares from here, and the engine's shards (perfd.core.commsummary) summarise their
ranks' from here, so that the two answers differ only where a sketch stands in for a median across
ranks.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from perfd.analytics.collectives.collective_windows import StepWindow
from perfd.core.winfigures import ABSENT, RankWindow

Figure = tuple[StepWindow, int, dict[str, int]]  # a window, the union of its intervals, per class
WindowKey = tuple[int, int, int, int, str | None]  # a StepWindow's fields: one object a window


def median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


class WindowShare(NamedTuple):
    """One window of one rank: its communication over its span, overall and per group class. A tuple,
    its fields in the order the analysis reads them by position: one is made a rank a window, millions
    at the engine root's scale (a frozen dataclass is made several times slower)."""

    share: float
    ms: float
    by: dict[str, float]
    n_iterations: int
    excluded: str | None
    iteration: int


@dataclass(frozen=True)
class Recent:
    """A rank's newest ``windows`` windows not excluded: the median share, the weighted share (their
    union over their spans) and the median share of each group class they show (a window without it
    counts 0)."""

    windows: int
    share: float
    weighted: float
    by_group: dict[str, float]


@dataclass(frozen=True)
class RankShares:
    windows: tuple[WindowShare, ...]
    recent: Recent | None  # None: no window that is not excluded


def rank_shares(figures: Sequence[Figure], recent_windows: int) -> RankShares:
    """The shares of one rank's complete windows (in window order), its summary over the newest
    ``recent_windows`` of those not excluded."""
    windows: list[WindowShare] = []
    used: list[tuple[StepWindow, int, dict[str, int]]] = []
    for w, comm, by in figures:
        span = w.end_ns - w.start_ns
        windows.append(WindowShare(comm / span, w.ms, {c: v / span for c, v in by.items()}, w.n_iterations,
                                   w.excluded, w.iteration))
        if w.excluded is None:
            used.append((w, comm, by))
    recent = used[-recent_windows:]
    if not recent:
        return RankShares(tuple(windows), None)
    spans = [w.end_ns - w.start_ns for w, _, _ in recent]
    pairs = list(zip(recent, spans, strict=True))
    seen = {c for _, _, by in recent for c in by}
    return RankShares(tuple(windows), Recent(
        len(recent), median([c / sp for (_, c, _), sp in pairs]) or 0.0,
        sum(c for _, c, _ in recent) / sum(spans),
        {c: median([by.get(c, 0) / sp for (_, _, by), sp in pairs]) or 0.0 for c in sorted(seen)}))


def outside_figures(iteration: int, rows: Iterable[RankWindow], shared: dict[WindowKey, StepWindow],
                    out: dict[int, list[Figure]]) -> None:
    """Rows of ``iteration`` made elsewhere (an agent's or a shard's fold) as each rank's figures, added
    to ``out`` (an uncovered row left out); ``shared``: one window object a window, across calls."""
    for f in rows:
        if f.comm_ns == ABSENT:
            continue
        key = (iteration, f.start_ns, f.end_ns, f.n_iterations, f.excluded)
        w = shared.get(key)
        if w is None:
            w = shared[key] = StepWindow(*key)
        out.setdefault(f.rank, []).append((w, f.comm_ns, dict(f.by)))

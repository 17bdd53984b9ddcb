"""A partition's ranks' communication shares made into a summary (perfd.core.commsummary) from their
window figures, each rank's read as the job's analysis reads it (perfd.analytics.collectives.rank_shares):
what a shard sends its job's root in place of the rows. Pure; handed to the shard by ``perfd shard``
(the engine imports nothing of the analytics).
"""

from __future__ import annotations

from collections.abc import Mapping

from perfd.analytics.collectives.collective_windows import StepWindow
from perfd.analytics.collectives.rank_shares import Figure, WindowKey, outside_figures, rank_shares
from perfd.core.commsummary import CommSummary, IterationPart
from perfd.core.winfigures import WindowFigures


def summarize(job: str, joins: Mapping[int, WindowFigures], recent_windows: int, keep_iterations: int,
              partition: int = 0, epoch: int = 0, seq: int = 0) -> CommSummary:
    """The summary of a partition's rows (iteration -> its rows, as the root's fold holds what it
    receives): each rank's medians over its newest ``recent_windows`` windows not excluded, and the
    newest ``keep_iterations`` iterations."""
    return summarize_figures(job, figures_of(joins), recent_windows, keep_iterations, partition, epoch, seq)


def summarize_figures(job: str, figures: Mapping[int, list[Figure]], recent_windows: int,
                      keep_iterations: int, partition: int = 0, epoch: int = 0, seq: int = 0) -> CommSummary:
    """The summary of some ranks' complete windows (rank -> its figures in window order, as
    perfd.analytics.collectives.winfold.FoldView.figures gives them)."""
    out = CommSummary(job, partition, epoch, seq)
    its: dict[int, IterationPart] = {}
    for rank in sorted(figures):
        rs = rank_shares(figures[rank], recent_windows)
        for w in rs.windows:
            its.setdefault(w.iteration, IterationPart()).add(rank, w.share, w.ms, w.by, w.n_iterations,
                                                              w.excluded)
        if rs.recent is not None:
            r = rs.recent
            out.add_rank(rank, r.share, r.weighted, r.by_group, r.windows)
    out.iterations = {it: its[it] for it in sorted(its)[-keep_iterations:]} if keep_iterations > 0 else {}
    return out


def figures_of(joins: Mapping[int, WindowFigures]) -> dict[int, list[Figure]]:
    """Each rank's windows in window order, as the root's fold reads rows made elsewhere
    (perfd.analytics.collectives.winfold.FoldView.figures: one window object a window; an uncovered row
    left out)."""
    out: dict[int, list[Figure]] = {}
    shared: dict[WindowKey, StepWindow] = {}
    for it in sorted(joins):
        outside_figures(it, joins[it].rows.values(), shared, out)
    return out

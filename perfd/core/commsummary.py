"""One partition's ranks' communication shares, summarised in a size no rank count changes
(:class:`CommSummary`), the merge of a job's partitions (:func:`merge`) and what the merge answers
(:class:`CommAnswer`). Pure.

The job's collective analysis reads every rank's window figures (perfd.analytics.collectives
.collective_analysis ``_shares``): at 100,000 ranks the root holds ~2 M figure rows and a core goes
to reading them. What it answers from them is medians across ranks, counts and extremes, so each
partition's holder can send, in place of its ranks' rows, what the medians are made of:

- exact: the ranks summarised (their count and :func:`perfd.core.sketch.rank_hash`, so that a
  merge of holders that counted a rank twice or missed one is told apart), the most recent windows
  any rank has (the analysis's ``n_windows``); per iteration its ranks, its largest
  ``n_iterations``, the exclusion of its lowest excluded rank (the analysis takes the first in rank
  order) and its ``limits.RANK_RATIO_TOP_K`` ranks of the highest share (the lower rank first on a
  tie); the job's top ranks by their recent median share likewise.
- sketched (perfd.core.sketch.Sketch: DDSketch's logarithmic buckets, each value within
  SKETCH_ACCURACY of it, relative): the median across ranks of each rank's recent median share, its
  weighted share and its share of each group class; per iteration, of the ranks' shares, window
  lengths and class shares. A rank without a class counts 0 for it, as in the analysis: a class's
  sketch holds the ranks that have it, and the answer counts the others as zeros.

A summary is made by perfd.analytics.collectives.comm_summary (each rank's figures read as the
analysis reads them: perfd.analytics.collectives.rank_shares), sent by the shards (perfd.engine), merged
and answered at the job's root. Merging adds counts and buckets (a join: any order, any grouping gives
the same summary); which summaries to merge (a holder's newest of each partition) is the reader's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from perfd.core.limits import RANK_RATIO_TOP_K
from perfd.core.sketch import Sketch, hashes_joined, rank_hash
from perfd.core.winfigures import WindowFigures

Top = list[tuple[int, float]]  # (rank, share), the highest share first, the lower rank first on a tie


def _top(rows: Iterable[tuple[int, float]]) -> Top:
    return sorted(rows, key=lambda rv: (-rv[1], rv[0]))[:RANK_RATIO_TOP_K]


def _merge_sketches(into: dict[str, Sketch], other: Mapping[str, Sketch]) -> None:
    for c, sk in other.items():
        into.setdefault(c, Sketch()).merge(sk)


def _median_with_zeros(sk: Sketch, ranks: int) -> float:
    """The median of ``ranks`` values: those in ``sk`` and zeros for the ranks it lacks."""
    padded = Sketch()
    padded.merge(sk)
    padded.zeros += max(0, ranks - sk.count)
    return padded.median() or 0.0


@dataclass
class IterationPart:
    """One iteration's windows of a partition's ranks."""

    ranks: int = 0
    rank_hash: int = 0
    share: Sketch = field(default_factory=Sketch)
    window_ms: Sketch = field(default_factory=Sketch)
    by: dict[str, Sketch] = field(default_factory=dict)
    n_iterations: int = 0
    excluded: tuple[int, str] | None = None  # (the lowest excluded rank, its exclusion)
    top: Top = field(default_factory=list)

    def add(self, rank: int, share: float, ms: float, by: Mapping[str, float], n_iterations: int,
            excluded: str | None) -> None:
        """One rank's window of the iteration."""
        self.ranks += 1
        self.rank_hash = hashes_joined(self.rank_hash, rank_hash((rank,)))
        self.share.add(share)
        self.window_ms.add(ms)
        for c, v in by.items():
            self.by.setdefault(c, Sketch()).add(v)
        self.n_iterations = max(self.n_iterations, n_iterations)
        if excluded and (self.excluded is None or rank < self.excluded[0]):
            self.excluded = (rank, excluded)
        self.top = _top([*self.top, (rank, share)])

    def merge(self, o: IterationPart) -> None:
        self.ranks += o.ranks
        self.rank_hash = hashes_joined(self.rank_hash, o.rank_hash)
        self.share.merge(o.share)
        self.window_ms.merge(o.window_ms)
        _merge_sketches(self.by, o.by)
        self.n_iterations = max(self.n_iterations, o.n_iterations)
        if o.excluded is not None and (self.excluded is None or o.excluded[0] < self.excluded[0]):
            self.excluded = o.excluded
        self.top = _top([*self.top, *o.top])


@dataclass
class CommSummary:
    """A partition's ranks' shares as its holder (``epoch``: a shard from its start) had them at its
    flush ``seq``: over each rank's recent windows, and per iteration of the newest kept."""

    job: str
    partition: int = 0
    epoch: int = 0
    seq: int = 0
    ranks: int = 0  # ranks with a recent window
    rank_hash: int = 0
    share: Sketch = field(default_factory=Sketch)
    weighted: Sketch = field(default_factory=Sketch)
    by: dict[str, Sketch] = field(default_factory=dict)
    windows: int = 0  # the most recent windows any rank's medians are over
    top: Top = field(default_factory=list)
    iterations: dict[int, IterationPart] = field(default_factory=dict)

    def add_rank(self, rank: int, share: float, weighted: float, by: Mapping[str, float],
                 windows: int) -> None:
        """One rank's medians over its ``windows`` recent windows."""
        self.ranks += 1
        self.rank_hash = hashes_joined(self.rank_hash, rank_hash((rank,)))
        self.share.add(share)
        self.weighted.add(weighted)
        for c, v in by.items():
            self.by.setdefault(c, Sketch()).add(v)
        self.windows = max(self.windows, windows)
        self.top = _top([*self.top, (rank, share)])

    def merge(self, o: CommSummary) -> None:
        """``o`` (another partition's, or another holder's) added in."""
        self.ranks += o.ranks
        self.rank_hash = hashes_joined(self.rank_hash, o.rank_hash)
        self.share.merge(o.share)
        self.weighted.merge(o.weighted)
        _merge_sketches(self.by, o.by)
        self.windows = max(self.windows, o.windows)
        self.top = _top([*self.top, *o.top])
        for it, part in o.iterations.items():
            self.iterations.setdefault(it, IterationPart()).merge(part)


# How a summary is made of a partition's rows (perfd.analytics.collectives.comm_summary.summarize, handed
# to the shard): (job, iteration -> its rows, recent windows, iterations kept, partition, epoch, seq).
Summarize = Callable[[str, Mapping[int, WindowFigures], int, int, int, int, int], "CommSummary"]


def merge(summaries: Iterable[CommSummary]) -> CommSummary | None:
    """The join of ``summaries`` (of one job), None when there are none."""
    out: CommSummary | None = None
    for s in summaries:
        if out is None:
            out = CommSummary(s.job)
        out.merge(s)
    return out


@dataclass(frozen=True)
class IterationAnswer:
    """What the analysis says of one iteration (its IterationComm), the per-rank shares as the top."""

    iteration: int
    ranks: int
    n_iterations: int
    window_ms: float | None
    share: float | None
    by_group: dict[str, float]
    excluded: str | None
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class CommAnswer:
    """What the analysis says of the job's shares (its summary), from summaries: ``share``,
    ``weighted`` and ``by_group`` within the sketch's error of its, the rest exactly its."""

    ranks: int
    share: float | None  # comm_total_share
    weighted: float | None  # weighted_share
    by_group: dict[str, float]  # comm_share_by_group
    windows: int  # n_windows
    top: tuple[tuple[int, float], ...]
    iterations: tuple[IterationAnswer, ...]


def answer(s: CommSummary, max_iterations_out: int) -> CommAnswer:
    """The answer of a (merged) summary: the newest ``max_iterations_out`` iterations, as the analysis
    lists them."""
    its = sorted(s.iterations)[-max_iterations_out:] if max_iterations_out > 0 else []
    return CommAnswer(
        ranks=s.ranks, share=s.share.median() if s.ranks else None,
        weighted=s.weighted.median() if s.ranks else None,
        by_group={c: _median_with_zeros(sk, s.ranks) for c, sk in sorted(s.by.items())} if s.ranks else {},
        windows=s.windows, top=tuple(s.top),
        iterations=tuple(_iteration(it, s.iterations[it]) for it in its))


def _iteration(it: int, p: IterationPart) -> IterationAnswer:
    return IterationAnswer(
        iteration=it, ranks=p.ranks, n_iterations=p.n_iterations, window_ms=p.window_ms.median(),
        share=p.share.median(),
        by_group={c: _median_with_zeros(sk, p.ranks) for c, sk in sorted(p.by.items())},
        excluded=p.excluded[1] if p.excluded is not None else None, top=tuple(p.top))


class CommShares(Protocol):
    """Where a job's analysis reads its shares from summaries (the engine root's RootComm): any thread."""

    def version(self, job: str) -> int:
        """Changes whenever the job's answer may have: 0 while none is held."""
        ...

    def answer(self, job: str) -> CommAnswer | None:
        """The merge of the job's summaries held, answered; None while none is held."""
        ...

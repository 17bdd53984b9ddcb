"""One partition's ranks at one iteration of a job, summarised in a size no rank count changes
(:class:`StepSummary`), what a job's root merges from them (:func:`merge`), and what the merge answers
(:class:`Answer`). Pure; the wire form is perfd.engine.summary_codec.

A shard's partial carries every rank's timers and end: the root's work and memory grow with the ranks
(at 100,000 ranks it saturated a core). A summary carries instead what the job's analysis reads of
the ranks, in two kinds:

- exact: the ranks in and expected; the slowest rank's record (perfd.core.stepfold's order: step time,
  then source; a full tie goes to the record whose encoding sorts first, where one aggregator keeps
  the first arrived); the latest end; each timer's count, sum, min and max (and the max's rank: the
  lower on a tie); each pipeline stage's compute (forward + backward) count, sum and its
  limits.RANK_RATIO_TOP_K slowest ranks (the lower rank first on a tie); the highest and lowest of the
  per-rank figures the analysis takes the extremes of, and their ranks (:class:`Extreme`: each rank's
  exposed communication, its idle share of forward-backward, its compute), each made as the analysis
  makes it. Sums are kept exactly (:class:`ExactSum`, Shewchuk's partials: math.fsum's), so a sum is
  the correctly rounded sum of the values, whatever the shards and the order of merging.
- sketched: each timer's and each stage's values in a log-bucket sketch (perfd.core.sketch.Sketch: a
  quantile, the median too, within SKETCH_ACCURACY of the exact one, relative). The compute ratio (a
  rank's compute over its stage's median: perfd.analytics.steps.stragglers) has the median as its
  divisor, so the ratios (each within SKETCH_ACCURACY / (1 - SKETCH_ACCURACY) of one aggregator's),
  their catalog.RANK_RATIO_BUCKETS histogram and the ranks above the straggler ratio are sketched parts:
  a rank whose ratio is further from a bucket's bound than the error is counted where one aggregator
  counts it.

Merging is a join over partitions: a summary of a partition replaces the one its maker (a shard, from
its start: its epoch) held of it before (the newer flush), so a summary delivered twice counts once;
summaries of different partitions, or of different makers of one partition (its lease moved), add
(perfd.engine.root_summaries.SummaryFold). Sketches add bucket by bucket (integer counts), so a merge's
sketch is the sketch of all the values, in any order and grouping.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from perfd.analytics.common import BACKWARD_COMPUTE, FORWARD_BACKWARD, FORWARD_COMPUTE
from perfd.analytics.steps.stragglers import STRAGGLER_RATIO, RankOrder
from perfd.analytics.steps.vocabulary import vocabulary_of
from perfd.core.catalog import RANK_RATIO_BUCKETS
from perfd.core.limits import RANK_RATIO_TOP_K
from perfd.core.model import ParallelLayout, StepRecord
from perfd.core.sketch import Sketch, hashes_joined, rank_hash
from perfd.core.stepfold import ALL_RANKS, RankFold
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import step_to_pb

QUANTILES: Final = (0.5, 0.99)  # what an answer reads of each timer's sketch
UNKNOWN_STAGE: Final = -1  # the stage of ranks when the layout names none (stage_unknown)
# The stage rows a shard keeps of ranks summarised before their job's layout was read
# (PartitionSummaries.restage): ~110 bytes each, ~29 MB at most; a 16-iteration window of a 16,384-rank
# shard's share whose layout is read late
UNSTAGED_MAX_ROWS: Final = 1 << 18


class ExactSum:
    """A sum of floats kept exactly, as non-overlapping partials (Shewchuk; what math.fsum keeps):
    ``value()`` is the correctly rounded sum whatever the order the values and sums came in."""

    __slots__ = ("partials",)

    def __init__(self, partials: Iterable[float] = ()) -> None:
        self.partials: list[float] = []
        for x in partials:
            self.add(x)

    def add(self, x: float) -> None:
        i = 0
        for y in self.partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                self.partials[i] = lo
                i += 1
            x = hi
        self.partials[i:] = [x]

    def merge(self, other: ExactSum) -> None:
        for x in other.partials:
            self.add(x)

    def value(self) -> float:
        return math.fsum(self.partials)

    def canonical(self) -> list[float]:
        """The partials of the sum as one list of them (from the sum's value alone: equal sums, equal
        lists)."""
        out: list[float] = []
        rest = ExactSum(self.partials)
        while rest.partials and any(rest.partials):
            v = rest.value()
            out.append(v)
            rest.add(-v)
        return out


@dataclass
class TimerSummary:
    count: int = 0
    sum: ExactSum = field(default_factory=ExactSum)
    min: float = math.inf
    max: float = -math.inf
    max_rank: int = -1
    sketch: Sketch = field(default_factory=Sketch)

    def add(self, rank: int, v: float) -> None:
        self.count += 1
        self.sum.add(v)
        self.min = min(self.min, v)
        if v > self.max or (v == self.max and rank < self.max_rank):
            self.max, self.max_rank = v, rank
        self.sketch.add(v)

    def merge(self, o: TimerSummary) -> None:
        self.count += o.count
        self.sum.merge(o.sum)
        self.min = min(self.min, o.min)
        if o.max > self.max or (o.max == self.max and o.max_rank < self.max_rank):
            self.max, self.max_rank = o.max, o.max_rank
        self.sketch.merge(o.sketch)


@dataclass
class Extreme:
    """A per-rank figure's highest and lowest and their ranks (the lower rank on a tie: the first in
    rank order, as the analyses' max() and min() over a rank-ordered map take)."""

    count: int = 0
    max: float = -math.inf
    max_rank: int = -1
    min: float = math.inf
    min_rank: int = -1
    # A partition could not make it as the analysis would (a rank's figure needs the whole job's):
    # the merge has none
    unknown: bool = False

    def add(self, rank: int, v: float) -> None:
        self.merge(Extreme(1, v, rank, v, rank))

    def merge(self, o: Extreme) -> None:
        self.unknown = self.unknown or o.unknown
        if not o.count:
            return
        if not self.count or o.max > self.max or (o.max == self.max and o.max_rank < self.max_rank):
            self.max, self.max_rank = o.max, o.max_rank
        if not self.count or o.min < self.min or (o.min == self.min and o.min_rank < self.min_rank):
            self.min, self.min_rank = o.min, o.min_rank
        self.count += o.count


# The per-rank figures the job's analysis takes the extremes of (perfd.analytics.steps): each rank's
# exposed communication, all of it and its two parts (metrics.exposed_comm: the sum of the rank's
# timers of each set, the worst rank's share), its idle share of forward-backward
# (pipeline.stage_idle: the most and least idle ranks) and, of the same ranks, its forward+backward
# compute (the lighter and heavier stage's).
COMM, COMM_GRAD_SYNC, COMM_PP = "comm", "comm.grad_sync", "comm.pp"
IDLE, IDLE_COMPUTE = "idle", "idle.compute"


@dataclass
class StageSummary:
    count: int = 0
    sum: ExactSum = field(default_factory=ExactSum)
    top: list[tuple[int, float]] = field(default_factory=list)  # (rank, compute), slowest first
    sketch: Sketch = field(default_factory=Sketch)

    def add(self, rank: int, v: float) -> None:
        self.count += 1
        self.sum.add(v)
        self.sketch.add(v)
        self.top = _top([*self.top, (rank, v)])

    def merge(self, o: StageSummary) -> None:
        self.count += o.count
        self.sum.merge(o.sum)
        self.sketch.merge(o.sketch)
        self.top = _top([*self.top, *o.top])


def _top(rows: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """The RANK_RATIO_TOP_K slowest, slowest first, the lower rank first on a tie (as
    perfd.exporters.prometheus.rank_picture_rows orders ratios, which within a stage follow compute)."""
    return sorted(rows, key=lambda rv: (-rv[1], rv[0]))[:RANK_RATIO_TOP_K]


@dataclass
class StepSummary:
    job: str
    iteration: int
    partition: int = 0
    epoch: int = 0
    seq: int = 0
    ranks_in: int = 0
    ranks_expected: int = 0
    slowest: StepRecord | None = None
    end_time: float | None = None
    armed: bool = False
    new_run: bool = False
    timers: dict[str, TimerSummary] = field(default_factory=dict)
    stages: dict[int, StageSummary] = field(default_factory=dict)
    stage_unknown: bool = False
    extremes: dict[str, Extreme] = field(default_factory=dict)
    ranks_hash: int = 0  # rank_hash of its ranks
    _slow: tuple[float, str, bytes] | None = field(default=None, compare=False, repr=False)

    def slow_key(self) -> tuple[float, str, bytes]:
        """The slowest's order (:func:`_slow_key`), made once."""
        if self._slow is None:
            assert self.slowest is not None
            self._slow = _slow_key(self.slowest)
        return self._slow

    def merge(self, o: StepSummary) -> None:
        """``o`` (another partition's) added in."""
        self.ranks_in += o.ranks_in
        self.ranks_hash = hashes_joined(self.ranks_hash, o.ranks_hash)
        self.ranks_expected += o.ranks_expected
        if o.slowest is not None and (self.slowest is None or o.slow_key() > self.slow_key()):
            self.slowest, self._slow = o.slowest, o._slow
        if o.end_time is not None and (self.end_time is None or o.end_time > self.end_time):
            self.end_time = o.end_time
        self.armed = self.armed or o.armed
        self.new_run = self.new_run or o.new_run
        for name, t in o.timers.items():
            self.timers.setdefault(name, TimerSummary()).merge(t)
        self.stage_unknown = self.stage_unknown or o.stage_unknown
        for s, st in o.stages.items():
            self.stages.setdefault(s, StageSummary()).merge(st)
        for name, e in o.extremes.items():
            self.extremes.setdefault(name, Extreme()).merge(e)


def _slow_key(r: StepRecord) -> tuple[float, str, bytes]:
    """perfd.core.stepfold's order of the slowest, a full tie broken by the record's encoding (the same
    whatever arrived first)."""
    m = pb.StepRecord()
    step_to_pb(r, m)
    return (r.step_time_ms if r.step_time_ms is not None else -1.0,
            r.source.detail if r.source is not None else "", m.SerializeToString(deterministic=True))


def stage_function(order: RankOrder) -> Callable[[int], int | None] | None:
    """What ``summarize`` groups a job's ranks by, as the straggler analysis groups them
    (perfd.analytics.steps.stragglers.detect): by pipeline stage; all one stage without a pipeline;
    None where the layout names no pipeline size (the analysis then compares no ranks)."""
    pp = order.layout.pp
    if pp is None:
        return None
    return order.stage if pp > 1 else (lambda rank: 0)


def stages_of(layout: ParallelLayout) -> Callable[[int], int | None] | None:
    """:func:`stage_function` of a job's layout as its info names it (what a shard has of the job)."""
    return stage_function(RankOrder(layout))


def summarize(job: str, iteration: int, ranks: Sequence[StepRecord] | StepRecord,
              stage_of: Callable[[int], int | None] | None, expected: int = 0, partition: int = 0,
              epoch: int = 0, seq: int = 0, new_run: bool = False) -> StepSummary:
    """The summary of one partition's rank records (or their fold, perfd.core.stepfold: per-rank timers
    and ends) of one iteration. ``stage_of``: a rank's pipeline stage (None for the rank: not known;
    ``stage_of`` None: the layout names no pipeline, no per-stage figures, as the straggler analysis
    then compares none); ``expected``: the partition's ranks."""
    recs = [ranks] if isinstance(ranks, StepRecord) else list(ranks)
    # one fold (a node's, as a shard gets it) is read as it is; rank records are folded first
    rec = recs[0] if len(recs) == 1 and recs[0].rank == ALL_RANKS else RankFold(recs).record()
    out = StepSummary(job, iteration, partition, epoch, seq, ranks_expected=expected, new_run=new_run)
    if rec is None:
        return out
    # The slowest's own record, without the per-rank maps a fold carries (the summary has them summed)
    for r in recs:
        bare = dataclasses.replace(r, timers={}, rank_end_times={})
        key = _slow_key(bare)
        if out._slow is None or key > out._slow:
            out.slowest, out._slow = bare, key
    out.end_time, out.armed = rec.end_time, rec.armed
    seen: set[int] = {r.rank for r in recs if isinstance(r.rank, int)} | rec.rank_end_times.keys()
    for name, tv in rec.timers.items():
        seen.update(tv.per_rank)
        t = out.timers[name] = TimerSummary()
        for rk, v in tv.per_rank.items():
            t.add(rk, v)
    out.ranks_in, out.ranks_hash = len(seen), rank_hash(seen)
    if stage_of is not None:
        _add_stages(out, stage_rows(rec), stage_of)
    _extremes(rec, out.extremes)
    return out


def stage_rows(rec: StepRecord) -> list[tuple[int, float]]:
    """Each rank's forward + backward compute, in rank order: what its pipeline stage's summary adds."""
    fwd, bwd = rec.timers.get(FORWARD_COMPUTE), rec.timers.get(BACKWARD_COMPUTE)
    if fwd is None or bwd is None:
        return []
    both = sorted(fwd.per_rank.keys() & bwd.per_rank.keys())
    return [(rk, fwd.per_rank[rk] + bwd.per_rank[rk]) for rk in both]


def _add_stages(out: StepSummary, rows: Iterable[tuple[int, float]],
                stage_of: Callable[[int], int | None]) -> None:
    for rk, v in rows:
        s = stage_of(rk)
        if s is None:
            out.stage_unknown = True
            s = UNKNOWN_STAGE
        out.stages.setdefault(s, StageSummary()).add(rk, v)


def _extremes(rec: StepRecord, out: dict[str, Extreme]) -> None:
    """The per-rank figures' extremes, each rank's figure made as the analysis makes it (the same
    operations in the same order: the same float). A figure is left out where the analysis would not
    read it per rank."""
    voc = vocabulary_of(rec)
    all_names = (*voc.grad_sync, *voc.pp_p2p)
    for key, names in ((COMM, all_names), (COMM_GRAD_SYNC, voc.grad_sync), (COMM_PP, voc.pp_p2p)):
        present = [rec.timers[n] for n in names if n in rec.timers]
        if present and not all(t.per_rank for t in present):
            out[key] = Extreme(unknown=True)
        elif present:
            sums: dict[int, float] = {}
            for t in present:
                for rank, v in t.per_rank.items():
                    sums[rank] = sums.get(rank, 0.0) + v
            e = out[key] = Extreme()
            for rank, v in sums.items():
                e.add(rank, v)
    fwd, bwd, fb = (rec.timers.get(n) for n in (FORWARD_COMPUTE, BACKWARD_COMPUTE, FORWARD_BACKWARD))
    if fwd is None or bwd is None or fb is None or not fwd.per_rank or not bwd.per_rank:
        return
    comp, idle = Extreme(), Extreme()
    for rank in sorted(set(fwd.per_rank) & set(bwd.per_rank)):
        span = fb.per_rank.get(rank)
        if span is None:  # the analysis takes the job's max: not a partition's to know
            out[IDLE], out[IDLE_COMPUTE] = Extreme(unknown=True), Extreme(unknown=True)
            return
        if span > 0:
            c = fwd.per_rank[rank] + bwd.per_rank[rank]
            comp.add(rank, c)
            idle.add(rank, (span - c) / span)
    out[IDLE], out[IDLE_COMPUTE] = idle, comp


class PartitionSummaries:
    """What a shard holds to summarise its partitions: per (job, iteration, partition) the summary of
    the ranks folded in so far and those ranks, each node's fold summarised once and merged in (a
    shard's work per node message is its ranks', not its partition's). A node message whose ranks are
    all in already is a redelivery: nothing changes. One whose ranks are in only in part (a rank sent
    again with other values: a rank is its node's, so not a redelivery) is not folded, and counted."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int, int], tuple[StepSummary, set[int]]] = {}
        self.touched: set[tuple[str, int, int]] = set()
        self.redelivered = 0
        self.overlapping = 0
        # Per (job, iteration, partition), the stage rows (stage_rows) of the ranks summarised before
        # the job's layout was read, in stage_unknown: grouped by stage once it is (restage), so that a
        # job's info read late (a slow bucket) leaves no iteration without its per-stage figures
        self.unstaged: dict[tuple[str, int, int], list[tuple[int, float]]] = {}
        self.unstaged_rows = 0  # their rows, bounded by UNSTAGED_MAX_ROWS
        self.unstaged_dropped = 0  # rows not kept past the bound: their iterations stay stage_unknown

    def add(self, partition: int, fold: StepRecord, ranks: set[int],
            stage_of: Callable[[int], int | None] | None, expected: int = 0, new_run: bool = False,
            layout_unread: bool = False) -> None:
        """``fold`` (a node's) into its partition's summary. ``layout_unread``: ``stage_of`` stands in
        for a layout not read yet (every rank's stage unknown): the ranks' rows are kept for restage."""
        key = (fold.job, fold.iteration, partition)
        have = self.held.get(key)
        if have is not None and ranks <= have[1]:
            self.redelivered += 1
            return
        if have is not None and ranks & have[1]:
            self.overlapping += 1
            return
        one = summarize(fold.job, fold.iteration, fold, stage_of, new_run=new_run)
        if have is None:
            have = self.held[key] = (StepSummary(fold.job, fold.iteration, partition,
                                                 ranks_expected=expected), set())
        have[0].merge(one)
        have[1].update(ranks)
        self.touched.add(key)
        if layout_unread and one.stage_unknown:
            rows = stage_rows(fold)
            if self.unstaged_rows + len(rows) <= UNSTAGED_MAX_ROWS:
                self.unstaged.setdefault(key, []).extend(rows)
                self.unstaged_rows += len(rows)
            else:  # the key stays stage_unknown (restage finds its unknown stage not all kept)
                self.unstaged_dropped += len(rows)

    def restage(self, job: str, stage_of: Callable[[int], int | None] | None) -> int:
        """``job``'s ranks summarised before its layout was read, grouped by stage as ``stage_of`` (the
        layout now read) groups them, their summaries touched (sent again). Returns the summaries
        changed."""
        changed = 0
        for key in [k for k in self.unstaged if k[0] == job]:
            rows = self.unstaged.pop(key)
            self.unstaged_rows -= len(rows)
            have = self.held.get(key)
            unknown = have[0].stages.get(UNKNOWN_STAGE) if have is not None else None
            if have is None or unknown is None or unknown.count != len(rows):
                continue  # its unknown stage holds ranks these rows are not (not the layout's): as it is
            s = have[0]
            del s.stages[UNKNOWN_STAGE]
            s.stage_unknown = False
            if stage_of is not None:
                _add_stages(s, rows, stage_of)
            self.touched.add(key)
            changed += 1
        return changed

    def take(self, epoch: int, seq: int) -> list[StepSummary]:
        """The summaries of the partitions folded into since the last take, made ``epoch``'s
        ``seq``-th (what the root holds the newest of): to be encoded before the next ``add``, whose
        merge they share the parts of."""
        out = []
        for key in sorted(self.touched):
            s = self.held[key][0]
            s.epoch, s.seq = epoch, seq
            out.append(dataclasses.replace(s))
        self.touched.clear()
        return out

    def forget_unstaged(self, job: str) -> None:
        """Let go of the rows kept to group ``job``'s ranks by stage (its summaries stay as they are)."""
        for key in [k for k in self.unstaged if k[0] == job]:
            self.unstaged_rows -= len(self.unstaged.pop(key))

    def drop_before(self, job: str, iteration: int) -> None:
        """Let go of ``job``'s iterations before ``iteration`` (their summaries went out)."""
        for key in [k for k in self.held if k[0] == job and k[1] < iteration]:
            del self.held[key]
            self.touched.discard(key)
            self.unstaged_rows -= len(self.unstaged.pop(key, ()))


def merge(summaries: Iterable[StepSummary]) -> StepSummary:
    """Summaries of different partitions (or holders) of one (job, iteration) as one (partition 0: theirs
    all)."""
    out: StepSummary | None = None
    for s in sorted(summaries, key=lambda s: (s.partition, s.epoch)):
        if out is None:
            out = StepSummary(s.job, s.iteration)
        out.merge(s)
    if out is None:
        raise ValueError("nothing to merge")
    return out


@dataclass
class Answer:
    """What the straggler analysis and /metrics read of an iteration's ranks, from a summary."""

    ranks_in: int
    ranks_expected: int
    slowest: StepRecord | None
    end_time: float | None
    timer_count: dict[str, int]
    timer_sum: dict[str, float]
    timer_min: dict[str, float]
    timer_max: dict[str, tuple[float, int]]  # (max, its rank)
    timer_quantiles: dict[str, dict[float, float]]  # QUANTILES of each timer's ranks (sketched)
    stage_count: dict[int, int]
    stage_sum: dict[int, float]
    stage_median: dict[int, float]  # sketched
    top_ratios: list[tuple[int, float]]  # the RANK_RATIO_TOP_K highest compute ratios (sketched divisor)
    ratio_buckets: list[tuple[float, int]] | None  # (le, ranks at most le), RANK_RATIO_BUCKETS (sketched)
    ratio_sum: float | None
    # The ranks whose ratio passes the straggler ratio, of those named (the top ranks of each stage:
    # all of them where each stage has fewer flagged), and how many they are (sketched)
    flagged: list[int]
    flagged_count: int
    extremes: dict[str, Extreme]  # the per-rank figures' (COMM, IDLE, ...), those the partitions could make
    # A rank's pipeline stage was not known (a shard without the job's info): no per-stage figure is made
    stage_unknown: bool = False


def answer(s: StepSummary, straggler_ratio: float = STRAGGLER_RATIO) -> Answer:
    """``s``'s answer; the compute ratios as perfd.analytics.steps.stragglers.detect makes them: within
    each stage of two ranks or more, over its median (> 0)."""
    medians: dict[int, float] = {}
    if not s.stage_unknown:
        for st, g in s.stages.items():
            m = g.sketch.median()
            if m is not None and m > 0 and g.count >= 2:
                medians[st] = m
    cands = [(r, v / medians[st]) for st, g in s.stages.items() if st in medians for r, v in g.top]
    top = sorted(cands, key=lambda rv: (-rv[1], rv[0]))[:RANK_RATIO_TOP_K]
    buckets: list[tuple[float, int]] | None = None
    ratio_sum: float | None = None
    if medians:
        buckets = [(le, sum(s.stages[st].sketch.at_most(le * m) if math.isfinite(le) else s.stages[st].count
                            for st, m in medians.items())) for le in RANK_RATIO_BUCKETS]
        ratio_sum = math.fsum(s.stages[st].sum.value() / m for st, m in medians.items())
    return Answer(
        s.ranks_in, s.ranks_expected, s.slowest, s.end_time,
        {n: t.count for n, t in sorted(s.timers.items())},
        {n: t.sum.value() for n, t in sorted(s.timers.items())},
        {n: t.min for n, t in sorted(s.timers.items()) if t.count},
        {n: (t.max, t.max_rank) for n, t in sorted(s.timers.items()) if t.count},
        {n: {q: v for q in QUANTILES if (v := t.sketch.quantile(q)) is not None}
         for n, t in sorted(s.timers.items()) if t.count},
        {st: g.count for st, g in sorted(s.stages.items())},
        {st: g.sum.value() for st, g in sorted(s.stages.items())},
        dict(sorted(medians.items())), top, buckets, ratio_sum,
        sorted(r for r, v in cands if v > straggler_ratio),
        sum(g.count - g.sketch.at_most(straggler_ratio * medians[st]) for st, g in s.stages.items()
            if st in medians),
        {n: e for n, e in sorted(s.extremes.items()) if not e.unknown and e.count}, s.stage_unknown)


def answer_json(a: Answer) -> dict[str, object]:
    """``a`` as JSON (the root's /api/stats): the slowest rank's step, not its whole record."""
    slow = a.slowest
    return {
        "ranks_in": a.ranks_in, "ranks_expected": a.ranks_expected, "end_time": a.end_time,
        "slowest": None if slow is None else {
            "step_time_ms": slow.step_time_ms, "source": slow.source.detail if slow.source else None},
        "timer_count": a.timer_count, "timer_sum": a.timer_sum, "timer_min": a.timer_min,
        "timer_max": {n: {"value": v, "rank": r} for n, (v, r) in a.timer_max.items()},
        "timer_quantiles": {n: {str(q): v for q, v in qs.items()} for n, qs in a.timer_quantiles.items()},
        "stage_count": {str(k): v for k, v in a.stage_count.items()},
        "stage_sum": {str(k): v for k, v in a.stage_sum.items()},
        "stage_median": {str(k): v for k, v in a.stage_median.items()},
        "top_ratios": [[r, v] for r, v in a.top_ratios],
        "ratio_buckets": None if a.ratio_buckets is None else [[str(le), n] for le, n in a.ratio_buckets],
        "ratio_sum": a.ratio_sum, "flagged": a.flagged, "flagged_count": a.flagged_count,
        "stage_unknown": a.stage_unknown,
        "extremes": {n: dataclasses.asdict(e) for n, e in a.extremes.items()},
    }

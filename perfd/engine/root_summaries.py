"""What a job's root holds of the shards' step summaries (perfd.engine.stepsummary), read beside the
partials (which stay what the store gets): each partition's holder's newest summary of each recent iteration
(a summary delivered again, or older, changes nothing), and for each iteration the partials made whole
the answer merged from them (:func:`perfd.engine.stepsummary.answer`), the newest ANSWERS_KEPT of each
job, read-only in the root's stats (/api/stats ``engine.summary_answers``). An answer is made again
when a summary of its iteration comes after the iteration was whole: the shards send their summaries
after their partials, and the two streams are read apart. A partition whose lease moved while an
iteration was folded has two holders' summaries of it, each with its ranks: both held, merged
(SummaryFold, below), and answered only when they hold exactly the ranks the partials brought. Pure:
perfd.engine.root reads the stream.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable

from perfd.core.sketch import rank_hash
from perfd.engine import stepsummary as ss
from perfd.engine.rootfold import KEEP_ITERATIONS, RootStats

ANSWERS_KEPT = 4  # a job's newest iterations whose answers are kept
COMPLETE_KEPT = 64  # a job's newest iterations known whole (their answers are made again on a summary)


# Holders (shard epochs) of one partition's iteration whose summaries the root keeps side by side: one
# more each time the partition's lease moves while the iteration is held. Past it the holder the root
# heard from first is let go of (counted: its ranks then missing, the iteration is not answered).
MAX_HOLDERS = 4


class SummaryFold:
    """What a job's root holds of summaries: per (job, iteration), each partition's newest of each
    holder. A holder (a shard, from its start: its epoch) sends its partition's iteration so far, so its
    newer flush replaces its older; but a partition whose lease moved while the iteration was folded
    (a rebalance, a lost lease, a restart) has two holders, each with the ranks it folded: the new
    holder's summary is not the former's made newer, and the two are merged, not one replacing the other
    (that dropped the former holder's ranks from the iteration for good). A node message both folded
    (the former's summary sent, its ack lost) is in both, a rank twice: RootSummaries answers such an
    iteration only when the summaries' ranks (their count and rank_hash) are exactly the partials'. Its
    memory is partitions × holders × (timers + stages) a held iteration, whatever the ranks."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], dict[tuple[int, int], ss.StepSummary]] = {}
        self.replaced = 0  # summaries of a holder's partition newer than the one held (its next flush)
        self.stale = 0  # ... not newer (delivered again): dropped
        self.holders_dropped = 0  # a holder's summary let go of for a newer holder's (past MAX_HOLDERS)

    def add(self, s: ss.StepSummary) -> bool:
        """Hold ``s`` in place of its holder's for its partition; False: the one held is as new (nothing
        changed)."""
        parts = self.held.setdefault((s.job, s.iteration), {})
        key = (s.partition, s.epoch)
        had = parts.get(key)
        if had is not None and had.seq >= s.seq:
            self.stale += 1
            return False
        self.replaced += had is not None
        if had is None:
            # in the order the root first heard from each (a dict's): not by epoch, since a shard
            # running long that takes the partition back is the newest holder with the oldest epoch
            holders = [k for k in parts if k[0] == s.partition]
            if len(holders) >= MAX_HOLDERS:
                del parts[holders[0]]
                self.holders_dropped += 1
        parts[key] = s
        return True

    def holders(self, job: str, iteration: int) -> int:
        """The most holders any partition of the iteration has (1: no lease moved while it was folded)."""
        counts: dict[int, int] = {}
        for p, _ in self.held.get((job, iteration), {}):
            counts[p] = counts.get(p, 0) + 1
        return max(counts.values(), default=0)

    def trim(self, job: str, keep: int) -> None:
        """Let go of ``job``'s iterations but its newest ``keep`` (perfd.engine.rootfold's
        KEEP_ITERATIONS): memory bounded by jobs × keep × partitions × holders."""
        its = sorted(i for j, i in self.held if j == job)
        for i in its[: max(0, len(its) - keep)]:
            del self.held[(job, i)]

    def merged(self, job: str, iteration: int) -> ss.StepSummary | None:
        parts = self.held.get((job, iteration))
        return ss.merge(parts.values()) if parts else None


class RootSummaries:
    def __init__(self, stats: RootStats, keep: int = KEEP_ITERATIONS,
                 world: Callable[[str], int] = lambda job: 0,
                 ranks: Callable[[str, int], Collection[int] | None] = lambda job, it: None) -> None:
        """``world``: the ranks of a job's iteration as the root's fold knows them (0: not known);
        ``ranks``: the ranks the partials brought of an iteration (None: no longer held). An iteration
        a partition of which had two holders is answered only when its summaries hold exactly those."""
        self.stats, self.keep, self.world, self.ranks = stats, keep, world, ranks
        self._exact: OrderedDict[tuple[str, int], int] = OrderedDict()  # rank_hash of a whole one's ranks
        self.fold = SummaryFold()
        self._its: dict[str, set[int]] = {}  # job -> its iterations held in ``fold``
        self._whole: dict[str, OrderedDict[int, None]] = {}  # job -> iterations the partials made whole
        self.answers: dict[str, OrderedDict[int, dict[str, object]]] = {}
        self._overcounted: OrderedDict[tuple[str, int], None] = OrderedDict()  # counted in the stats

    def add(self, summaries: Iterable[ss.StepSummary], admit: Callable[[str], bool]) -> None:
        """Hold each summary in place of its holder's of its partition (``admit(job)``: whether its job
        may be held; refused: counted); answers of whole iterations they touched made again."""
        touched: set[tuple[str, int]] = set()
        fold = self.fold
        for s in summaries:
            self.stats.summaries += 1
            if s.job not in self._its and not admit(s.job):
                self.stats.refused += 1
                continue
            its = self._its.setdefault(s.job, set())
            if s.iteration not in its and len(its) >= self.keep and s.iteration < min(its):
                self.stats.summaries_late += 1
                continue
            replaced, stale, dropped = fold.replaced, fold.stale, fold.holders_dropped
            if fold.add(s):
                its.add(s.iteration)
                touched.add((s.job, s.iteration))
            self.stats.summaries_replaced += fold.replaced - replaced
            self.stats.summaries_stale += fold.stale - stale
            self.stats.summaries_holders_dropped += fold.holders_dropped - dropped
        for job in {j for j, _ in touched}:
            its = self._its[job]
            if len(its) > self.keep:
                fold.trim(job, self.keep)
                its.intersection_update(i for j, i in fold.held if j == job)
        for job, it in touched:
            if it in self._whole.get(job, ()):
                self._answer(job, it)

    def whole(self, job: str, iteration: int) -> None:
        """The partials made ``iteration`` whole: answered from the summaries held of it."""
        done = self._whole.setdefault(job, OrderedDict())
        done[iteration] = None
        while len(done) > COMPLETE_KEPT:
            done.popitem(last=False)
        self._answer(job, iteration)

    def _answer(self, job: str, iteration: int) -> None:
        merged = self.fold.merged(job, iteration)
        if merged is None:
            return
        kept = self.answers.setdefault(job, OrderedDict())
        world = self.world(job)
        if self.fold.holders(job, iteration) > 1 and not self._exactly(job, iteration, merged, world):
            # A partition's lease moved while the iteration was folded. Both holders may have folded a
            # node message (the former's summary went out, its ack did not): a rank counted twice, which
            # a sketch cannot take out, and which a rank still missing would hide from a count. Shown only
            # once the summaries hold the partials' ranks exactly; a rank twice counted, once an iteration.
            kept.pop(iteration, None)
            twice = world and (merged.ranks_in > world or (
                merged.ranks_in == world and (job, iteration) in self._exact))  # the ranks known, not these
            if twice and (job, iteration) not in self._overcounted:
                self._overcounted[(job, iteration)] = None
                while len(self._overcounted) > COMPLETE_KEPT:
                    self._overcounted.popitem(last=False)
                self.stats.summaries_overcounted += 1
            return
        kept[iteration] = {"iteration": iteration, **ss.answer_json(ss.answer(merged))}
        for it in sorted(kept)[: max(0, len(kept) - ANSWERS_KEPT)]:
            del kept[it]

    def _exactly(self, job: str, iteration: int, merged: ss.StepSummary, world: int) -> bool:
        """Whether ``merged`` holds each rank the partials brought of the iteration once, none else."""
        if not world or merged.ranks_in != world:
            return False
        key = (job, iteration)
        if key not in self._exact:
            ranks = self.ranks(job, iteration)
            if ranks is None or len(ranks) != world:
                return False
            self._exact[key] = rank_hash(ranks)  # once an iteration, and only one with two holders
            while len(self._exact) > COMPLETE_KEPT:
                self._exact.popitem(last=False)
        return merged.ranks_hash == self._exact[key]

    def forget(self, job: str) -> None:
        """Let go of ``job`` (its folds left the root's memory, or it began a new run)."""
        for d in (self._exact, self._overcounted):
            for key in [k for k in d if k[0] == job]:
                del d[key]
        for key in [k for k in self.fold.held if k[0] == job]:
            del self.fold.held[key]
        self._its.pop(job, None)
        self._whole.pop(job, None)
        self.answers.pop(job, None)

    def fold_jobs(self) -> set[str]:
        """The jobs whose summaries are held."""
        return set(self._its)

    def to_json(self) -> dict[str, list[dict[str, object]]]:
        """Each job's kept answers, oldest iteration first."""
        # copies first: the aggregator's HTTP threads read this while the event loop adds
        return {job: [kept[i] for i in sorted(kept)] for job, kept in
                ((j, dict(k)) for j, k in dict(self.answers).items())}

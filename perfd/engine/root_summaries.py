"""What a job's root holds of the shards' step summaries (perfd.engine.stepsummary), read beside the
partials (which stay what the store gets): each partition's newest summary of each recent iteration
(a summary delivered again, or older, changes nothing), and for each iteration the partials made whole
the answer merged from them (:func:`perfd.engine.stepsummary.answer`), the newest ANSWERS_KEPT of each
job, read-only in the root's stats (/api/stats ``engine.summary_answers``). An answer is made again
when a summary of its iteration comes after the iteration was whole: the shards send their summaries
after their partials, and the two streams are read apart. A partition whose lease moved while an
iteration was folded has two holders' summaries of it, each with its ranks: both held, merged
(perfd.engine.stepsummary.SummaryFold). Pure: perfd.engine.root reads the stream.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from perfd.engine import stepsummary as ss
from perfd.engine.rootfold import KEEP_ITERATIONS, RootStats

ANSWERS_KEPT = 4  # a job's newest iterations whose answers are kept
COMPLETE_KEPT = 64  # a job's newest iterations known whole (their answers are made again on a summary)


class RootSummaries:
    def __init__(self, stats: RootStats, keep: int = KEEP_ITERATIONS,
                 world: Callable[[str], int] = lambda job: 0) -> None:
        """``world``: the ranks of a job's iteration as the root's fold knows them (0: not known), so
        that an answer holding more (a node message in two holders' summaries) is not shown."""
        self.stats, self.keep, self.world = stats, keep, world
        self.fold = ss.SummaryFold()
        self._its: dict[str, set[int]] = {}  # job -> its iterations held in ``fold``
        self._whole: dict[str, OrderedDict[int, None]] = {}  # job -> iterations the partials made whole
        self.answers: dict[str, OrderedDict[int, dict[str, object]]] = {}

    def add(self, summaries: Iterable[ss.StepSummary], admit: Callable[[str], bool]) -> None:
        """Hold each summary in place of its partition's (``admit(job)``: whether its job may be held;
        refused: counted); answers of whole iterations they touched made again."""
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
        if world and merged.ranks_in > world:
            # Two holders of a partition both folded a node message (the former's summary went out, its
            # ack did not): a rank counted twice, which a sketch cannot take out. Not shown, counted.
            self.stats.summaries_overcounted += 1
            kept.pop(iteration, None)
            return
        kept[iteration] = {"iteration": iteration, **ss.answer_json(ss.answer(merged))}
        for it in sorted(kept)[: max(0, len(kept) - ANSWERS_KEPT)]:
            del kept[it]

    def forget(self, job: str) -> None:
        """Let go of ``job`` (its folds left the root's memory, or it began a new run)."""
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

"""The shards' communication-share summaries (perfd.core.commsummary, made by
perfd.analytics.collectives.comm_summary) against the job's collective
analysis itself (perfd.analytics.collectives.collective_analysis.finish over every rank's window
figures, as the engine root reads the agents' rows): at 1,000 and 8,000 ranks, the exact parts equal,
the medians within the sketch's relative error; and a join: the partitions' summaries merged in any
order are the summary of all the ranks, a rank summarised twice told apart by the ranks' hash."""

from __future__ import annotations

import random
from collections.abc import Collection

import pytest

from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis, finish
from perfd.analytics.collectives.collective_config import CollectiveConfig
from perfd.analytics.collectives.collective_facts import ShareAbsent
from perfd.analytics.collectives.collective_windows import StepWindow
from perfd.analytics.collectives.comm_summary import summarize, summarize_figures
from perfd.analytics.collectives.fold_counts import FoldCounts
from perfd.analytics.collectives.winfold import FoldView
from perfd.core import commsummary as cs
from perfd.core.collfold import CollectivePartial
from perfd.core.limits import RANK_RATIO_TOP_K
from perfd.core.model import StepRecord
from perfd.core.sketch import SKETCH_ACCURACY, rank_hash
from perfd.core.winfigures import RankWindow, WindowFigures
from perfd.report.collective_text import collectives_json

JOB = "comm-job"
S = 1_000_000_000
CLASSES = ("dp", "pp", "tp")


def _job(ranks: int, iterations: int, seed: int) -> dict[int, list[RankWindow]]:
    """Iteration -> every rank's figures: warm-up windows excluded, a capture's window on a few ranks,
    windows a rank lacks (uncovered), classes some ranks or windows lack, a rank whose every window is
    excluded, and shares alike across ranks (ties) beside spread ones."""
    rng = random.Random(seed)
    has_tp = {r for r in range(ranks) if rng.random() < 0.7}
    captured = set(rng.sample(range(ranks), max(1, ranks // 100)))
    out: dict[int, list[RankWindow]] = {}
    for it in range(iterations):
        rows = out[it] = []
        for r in range(ranks):
            if rng.random() < 0.05:
                continue  # uncovered: no figures of this window
            start = it * 2 * S + rng.randrange(0, S // 10)
            span = rng.randrange(S, 3 * S // 2) if r % 10 else S  # a tenth of the ranks step alike
            comm = int(span * (0.25 if r % 10 == 0 else rng.uniform(0.05, 0.6)))
            by = {"dp": int(comm * rng.uniform(0.2, 0.8))}
            if r in has_tp:
                by["tp"] = int(comm * rng.uniform(0.0, 0.5))
            if rng.random() < 0.3:
                by["pp"] = int(comm * rng.uniform(0.0, 0.3))
            excluded = ("warmup" if it < 3 or r == ranks - 1 else
                        "capture" if r in captured and it == iterations // 2 else None)
            rows.append(RankWindow(r, start, start + span, 1 + (r % 3 == 0 and it % 7 == 0), excluded, comm,
                                   tuple((c, by[c]) for c in CLASSES if c in by), True, 0))
    return out


def _joins(rows: dict[int, list[RankWindow]],
           ranks: Collection[int] | None = None) -> dict[int, WindowFigures]:
    """The rows of ``ranks`` (None: all), by iteration, as a shard holds its partition's."""
    return {it: WindowFigures(JOB, {(it, w.rank): w for w in ws if ranks is None or w.rank in ranks})
            for it, ws in rows.items()}


def _analysis(rows: dict[int, list[RankWindow]], cfg: CollectiveConfig) -> CollectiveAnalysis:
    view = FoldView(blocks={}, waiting={}, biggest=0, top=0,
                    counts=FoldCounts(received=sum(map(len, rows.values()))), outside=rows)
    # the job's step windows: any non-empty list has each rank's figures read (their own windows)
    return finish(CollectivePartial(JOB), fold=view, config=cfg, windows=({}, [StepWindow(0, 0, S, 1)]))


def _near(got: float | None, want: float | None) -> bool:
    if got is None or want is None:
        return got is want
    return abs(got - want) <= SKETCH_ACCURACY * abs(want) + 1e-12


def _summaries(rows: dict[int, list[RankWindow]], parts: int, cfg: CollectiveConfig,
               rng: random.Random) -> list[cs.CommSummary]:
    owner = {w.rank: rng.randrange(parts) for ws in rows.values() for w in ws}
    out = []
    for p in range(parts):
        joins = _joins(rows, {r for r, o in owner.items() if o == p})
        out.append(summarize(JOB, joins, cfg.recent_windows, cfg.max_iterations_out, partition=p, epoch=7))
    return out


@pytest.mark.parametrize("ranks, iterations, parts", [(1000, 70, 4), (8000, 12, 16), (7, 9, 3)])
def test_the_merged_summaries_answer_what_the_analysis_of_every_rank_says(
        ranks: int, iterations: int, parts: int) -> None:
    cfg = CollectiveConfig(recent_windows=50, max_iterations_out=min(40, iterations - 2))
    rows = _job(ranks, iterations, seed=ranks)
    want = _analysis(rows, cfg)
    merged = cs.merge(_summaries(rows, parts, cfg, random.Random(1)))
    assert merged is not None
    got = cs.answer(merged, cfg.max_iterations_out)
    assert want.method == "step_windows" and got.ranks == len(want.comm_share_by_rank) == ranks - 1
    assert _near(got.share, want.comm_total_share) and _near(got.weighted, want.weighted_share)
    assert got.by_group.keys() == want.comm_share_by_group.keys() == set(CLASSES)
    assert all(_near(got.by_group[c], v) for c, v in want.comm_share_by_group.items()), (
        got.by_group, want.comm_share_by_group)
    assert got.windows == want.n_windows
    by_share = sorted(want.comm_share_by_rank.items(), key=lambda rv: (-rv[1], rv[0]))
    assert list(got.top) == by_share[:RANK_RATIO_TOP_K]
    assert [a.iteration for a in got.iterations] == [it.iteration for it in want.iterations]
    for a, it in zip(got.iterations, want.iterations, strict=True):
        assert (a.ranks, a.n_iterations, a.excluded) == (len(it.share_by_rank), it.n_iterations, it.excluded)
        assert _near(a.share, it.share) and _near(a.window_ms, it.window_ms), it.iteration
        assert a.by_group.keys() == it.by_group.keys()
        assert all(_near(a.by_group[c], v) for c, v in it.by_group.items()), it.iteration
        ranked = sorted(it.share_by_rank.items(), key=lambda rv: (-rv[1], rv[0]))
        assert list(a.top) == ranked[:RANK_RATIO_TOP_K]
    # the exclusions the job holds reach the answer as the analysis's (the first in rank order)
    assert {a.excluded for a in got.iterations} >= {"capture", "warmup"}


def test_the_merge_is_a_join_and_a_rank_twice_is_told_apart() -> None:
    cfg = CollectiveConfig(max_iterations_out=20)
    rows = _job(300, 30, seed=3)
    whole = summarize(JOB, _joins(rows), cfg.recent_windows, cfg.max_iterations_out)
    rng = random.Random(5)
    parts = _summaries(rows, 5, cfg, rng)
    for _ in range(3):
        rng.shuffle(parts)
        merged = cs.merge(parts)
        assert merged is not None
        assert cs.answer(merged, 20) == cs.answer(whole, 20)
        assert merged.rank_hash == whole.rank_hash == rank_hash(range(299))  # the last: always excluded
    twice = cs.merge([*parts, parts[0]])
    assert twice is not None and twice.rank_hash != whole.rank_hash


def test_a_partition_without_windows_answers_nothing_it_does_not_have() -> None:
    empty = summarize_figures(JOB, {}, 50, 20)
    got = cs.answer(empty, 20)
    assert (got.ranks, got.share, got.weighted, got.by_group, got.windows, got.top, got.iterations) == (
        0, None, None, {}, 0, (), ())
    assert cs.merge([]) is None


def test_ranks_tied_at_the_top_are_listed_lowest_first_whatever_the_partitions() -> None:
    """Ten ranks tied at the highest share: the top lists the eight lowest, as the analysis's ranking
    of every rank's share does, however the ranks were split and merged."""
    cfg = CollectiveConfig(max_iterations_out=5)
    rows = _job(40, 8, seed=11)
    tied = set(range(30, 40, 1)) - {39}  # the last rank's windows are all excluded
    rows = {it: [w._replace(end_ns=w.start_ns + S, comm_ns=9 * S // 10) if w.rank in tied else w for w in ws]
            for it, ws in rows.items()}  # each window of theirs 0.9 exactly
    want = _analysis(rows, cfg)
    ranked = sorted(want.comm_share_by_rank.items(), key=lambda rv: (-rv[1], rv[0]))[:RANK_RATIO_TOP_K]
    assert {r for r, _ in ranked} <= tied and [r for r, _ in ranked] == sorted(r for r, _ in ranked)
    for seed in range(3):
        merged = cs.merge(_summaries(rows, 4, cfg, random.Random(seed)))
        assert merged is not None and list(cs.answer(merged, 5).top) == ranked


def test_the_analysis_given_the_answer_reads_its_shares_from_it() -> None:
    """``finish(shares=...)``, as the engine root's store calls it where its shards summarise: the
    analysis's share fields are the answer's (the per-rank ones its top), the ranks it was over said in
    the method (and in the method's words, where served), and a job with no summarised window says why."""
    cfg = CollectiveConfig(recent_windows=50, max_iterations_out=20)
    rows = _job(500, 30, seed=11)
    want = _analysis(rows, cfg)
    merged = cs.merge(_summaries(rows, 4, cfg, random.Random(2)))
    assert merged is not None
    ans = cs.answer(merged, cfg.max_iterations_out)
    got = finish(CollectivePartial(JOB), config=cfg, shares=ans)
    assert (got.method, got.summarised_ranks, want.summarised_ranks) == ("step_windows", 499, None)
    assert (got.comm_total_share, got.weighted_share, got.n_windows) == (ans.share, ans.weighted, ans.windows)
    assert _near(got.comm_total_share, want.comm_total_share) and got.comm_share_by_group == ans.by_group
    assert got.comm_share_by_rank == dict(ans.top) and len(got.comm_share_by_rank) == RANK_RATIO_TOP_K
    assert [it.iteration for it in got.iterations] == [it.iteration for it in want.iterations]
    for g, w in zip(got.iterations, want.iterations, strict=True):
        assert g.ranks == w.ranks == len(w.share_by_rank) and _near(g.share, w.share)
        assert g.share_by_rank == {r: v for r, v in sorted(w.share_by_rank.items(),
                                                           key=lambda rv: (-rv[1], rv[0]))[:RANK_RATIO_TOP_K]}
    served = collectives_json(got)["method"]
    assert served["summarised_ranks"] == 499 and "499 ranks" in served["detail"]
    assert collectives_json(want)["method"]["summarised_ranks"] is None
    assert "summarised" not in collectives_json(want)["method"]["detail"]
    assert {f.id for f in got.findings} >= {"comm-total-share"}
    empty = finish(CollectivePartial(JOB), config=cfg, shares=cs.answer(cs.CommSummary(JOB), 20))
    assert (empty.comm_total_share, empty.absent, empty.iterations) == (None, ShareAbsent.NO_WINDOW, [])


class _Shares:
    """perfd.core.commsummary.CommShares as the engine root's RootComm gives it: a version and an answer."""

    def __init__(self, answer: cs.CommAnswer | None, version: int = 1) -> None:
        self.held, self.v, self.asked = answer, version, 0

    def version(self, job: str) -> int:
        return self.v if self.held is not None else 0

    def answer(self, job: str) -> cs.CommAnswer | None:
        self.asked += 1
        return self.held


def test_the_store_reads_the_summaries_until_rows_as_new_as_theirs_come() -> None:
    """perfd.aggregator.collectives.CollectiveStore with ``shares`` set (the engine root's): a job's shares
    from the summaries' answer, made again when the summaries change (their version in the analysis's
    key) and not before; figure rows of older iterations (a stray dump the root folded, rows from before
    the shards summarised) leave it so; rows of an iteration as new as the summaries' newest are read
    instead (counted ``shares_mixed``); summaries gone (a job forgotten), the rows."""
    from perfd.aggregator.collectives import CollectiveStore

    cfg = CollectiveConfig(recent_windows=50, max_iterations_out=20)
    rows = _job(60, 30, seed=12)
    merged = cs.merge(_summaries(rows, 2, cfg, random.Random(3)))
    assert merged is not None
    ans = cs.answer(merged, cfg.max_iterations_out)
    newest = ans.iterations[-1].iteration
    store = CollectiveStore(config=cfg, min_recompute_s=0.0)
    shares = store.shares = _Shares(ans)
    store.ingest_partial("node-0", CollectivePartial(JOB), folded=True)

    def inputs() -> tuple[list[StepRecord], None, dict[int, str], None]:
        return [], None, {}, None

    first = store.analysis(JOB, ("steps", 1), inputs)
    assert first is not None and first.summarised_ranks == 59 and first.comm_total_share == ans.share
    assert store.analysis(JOB, ("steps", 1), inputs) is first and shares.asked == 1  # nothing changed
    shares.v = 2
    again = store.analysis(JOB, ("steps", 1), inputs)
    assert again is not first and again is not None and again.summarised_ranks == 59 and shares.asked == 2
    store.ingest_figures(WindowFigures(JOB, {(newest - 5, w.rank): w for w in rows[newest - 5][:3]}))
    old_rows = store.analysis(JOB, ("steps", 1), inputs)
    assert old_rows is not None and old_rows.summarised_ranks == 59 and store.shares_mixed == 0
    store.ingest_figures(WindowFigures(JOB, {(newest, w.rank): w for w in rows[newest][:3]}))
    mixed = store.analysis(JOB, ("steps", 1), inputs)
    assert mixed is not None and mixed.summarised_ranks is None and store.shares_mixed == 1
    assert store.shares_answered == 3
    shares.held = None  # the job forgotten at the root: version 0
    gone = store.analysis(JOB, ("steps", 1), inputs)
    assert gone is not None and gone.summarised_ranks is None and shares.asked == 4

"""The window fold at the shards (perfd.analytics.collectives.shardfold): each shard folds every
operation of its nodes' ranks against their own step ends and hands the root per-window figures
(perfd.core.winfigures); the root's store merges them (a join) beside the store's share of the rows. The
per-iteration shares, and with every row held the whole analysis, are one aggregator's, byte for
byte — figures delivered twice and in any order merging once."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from typing import Any

from perfd.aggregator.collectives import CollectiveStore
from perfd.analytics.collectives import shardfold
from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis, analyze_collectives
from perfd.analytics.collectives.shardfold import ShardCollectives
from perfd.core.collfold import Retention, for_sending, reduce
from perfd.core.model import CollectiveRecord, StepRecord
from perfd.core.winfigures import RankWindow, WindowFigures
from perfd.report.collective_text import collectives_json
from tests.collectives.test_collective_partial import (
    ITERATIONS,
    LAYOUT,
    NODES,
    PER_NODE,
    RANK_NODES,
    WORLD,
    synthetic_job,
)
from tests.collectives.test_window_fold import TWO_A_RANK, _shares

SHARDS = 2


def _node(r: CollectiveRecord | StepRecord) -> int:
    return (r.rank if isinstance(r.rank, int) else 0) // PER_NODE


def _through_shards(recs: list[CollectiveRecord], steps: list[StepRecord], keep: Retention,
                    again: bool = False) -> tuple[CollectiveStore, list[StepRecord], list[WindowFigures]]:
    """Each iteration: every node's operations to its shard (all of them), the store's share of them
    to the root's store; then the iteration's step records, to the shards (their ranks') and the root;
    then each shard's figures to the root. ``again``: every figures message delivered a second time,
    the later ones first."""
    store = CollectiveStore(reduced_retention=keep, min_recompute_s=0.0)
    held: list[StepRecord] = []
    store.fold_inputs = lambda job: ((len(held), LAYOUT), lambda: (list(held), LAYOUT))
    shards = [ShardCollectives() for _ in range(SHARDS)]
    for sh in shards:
        sh.set_layout("j", LAYOUT)
    sent: list[WindowFigures] = []
    its = sorted({s.iteration for s in steps})
    ends = {it: max(round((s.end_time or 0) * 1e9) for s in steps if s.iteration == it) for it in its}
    prev = None
    for it in [*its, None]:
        batch = [r for r in recs if (prev is None or (r.time_created_ns or 0) > ends[prev])
                 and (it is None or (r.time_created_ns or 0) <= ends[it])]
        for n in range(NODES):
            mine = [r for r in batch if _node(r) == n]
            if mine:
                shards[n % SHARDS].add(reduce("j", mine))
                store.ingest_partial(f"node-{n}", for_sending(reduce("j", mine), keep), folded=True)
        if it is not None:
            these = [s for s in steps if s.iteration == it]
            for n in range(NODES):
                shards[n % SHARDS].add_steps([s for s in these if _node(s) == n])
            held.extend(these)
            prev = it
        for sh in shards:
            for figs in sh.take():
                sent.append(figs)
                store.ingest_figures(figs)
    if again:
        for figs in reversed(sent):
            store.ingest_figures(figs)
    return store, held, sent


def _analysis(store: CollectiveStore, steps: Sequence[StepRecord]) -> CollectiveAnalysis:
    got = store.analysis("j", (len(steps),), lambda: (list(steps), LAYOUT, {}, None), force=True)
    assert got is not None
    return got


def test_the_shards_figures_give_every_ranks_per_iteration_share_with_two_operations_a_rank_held() -> None:
    recs, steps = synthetic_job()
    want = analyze_collectives("j", recs, steps, layout=LAYOUT)
    assert len(want.iterations) == ITERATIONS - 1
    store, held, sent = _through_shards(recs, steps, TWO_A_RANK)
    jc = store.jobs["j"]
    assert jc.partial is not None and len(jc.partial) == 2 * WORLD
    assert jc.fold is not None and jc.fold.counts.folded == 0  # nothing folded at the root
    assert jc.fold.counts.received >= WORLD * (ITERATIONS - 1)
    got = _analysis(store, held)
    assert all(len(it.share_by_rank) == WORLD for it in got.iterations)
    assert _shares(got) == _shares(want)
    # Provisional rows first; a window's settled row only where its figures differ from the provisional
    # one handed on (the join keeps that one): no (iteration, rank) handed on twice with one figures
    assert any(not w.settled for f in sent for w in f.rows.values())
    handed: dict[tuple[int, int], list[tuple[object, ...]]] = {}
    for f in sent:
        for k, w in f.rows.items():
            handed.setdefault(k, []).append(_figures(w))
    assert all(len(v) == len(set(v)) for v in handed.values())
    # what settled as it was handed on stands in the join as the provisional row it was
    assert any(not w.settled for (it, _), w in jc.fold.outside.rows.items() if it < ITERATIONS - 2)


def _figures(w: RankWindow) -> tuple[object, ...]:
    """A row's figures: all but whether it is settled and the basis it was made from."""
    return w.start_ns, w.end_ns, w.n_iterations, w.excluded, w.comm_ns, w.by


def test_partials_the_shards_folded_leave_the_step_windows_to_the_analysis() -> None:
    """The root's store makes no step windows as folded partials come (it folds none of their
    operations; at 100,000 ranks each making cost ~0.9 s of the root's CPU, at every partial that
    came after its steps changed): the analysis makes them before it reads the fold."""
    recs, steps = synthetic_job()
    store, held, _ = _through_shards(recs, steps, TWO_A_RANK)
    fold = store.jobs["j"].fold
    assert fold is not None and fold.steps_key is None and fold.counts.received > 0
    got = _analysis(store, held)
    assert fold.steps_key is not None
    assert len(got.iterations) == ITERATIONS - 1


def test_figures_delivered_twice_in_any_order_merge_once() -> None:
    recs, steps = synthetic_job()
    want = _shares(analyze_collectives("j", recs, steps, layout=LAYOUT))
    store, held, sent = _through_shards(recs, steps, TWO_A_RANK, again=True)
    assert _shares(_analysis(store, held)) == want
    fold = store.jobs["j"].fold
    assert fold is not None
    rows = dict(fold.outside.rows)
    merged = WindowFigures("j")
    shuffled = list(sent)
    random.Random(3).shuffle(shuffled)
    for figs in shuffled:
        merged.absorb(figs)
    assert merged.rows == rows  # any order, any number of deliveries: the same rows


def test_every_row_held_the_root_answers_as_one_aggregator_byte_for_byte() -> None:
    recs, steps = synthetic_job()
    want = json.dumps(collectives_json(analyze_collectives("j", recs, steps, layout=LAYOUT,
                                                           rank_nodes=RANK_NODES)), sort_keys=True)
    store, held, _ = _through_shards(recs, steps, Retention(per_rank=512, per_job=250_000))
    assert json.dumps(collectives_json(_analysis(store, held)), sort_keys=True) == want


def test_the_join_keeps_a_settled_row_over_a_provisional_one_whatever_comes_first() -> None:
    prov = RankWindow(3, 10, 20, 1, None, 4, (("tp", 4),), False, 25)
    final = RankWindow(3, 10, 20, 1, None, 5, (("tp", 5),), True, 24)
    a, b = WindowFigures("j"), WindowFigures("j")
    assert a.add(7, prov) and a.add(7, final) and not a.add(7, prov)
    assert b.add(7, final) and not b.add(7, prov)
    assert a.rows == b.rows == {(7, 3): final}


def test_the_root_keeps_the_newest_iterations_of_figures_and_the_analysis_reads_them_by_iteration() -> None:
    """WindowFold.add_figures (the root's store): figures of more iterations than it keeps leave the
    oldest first, whatever order their messages came in; a late row of an iteration already let go
    does not come back; what the analysis reads (the view) is each iteration's rows, in the order
    they first came."""
    from perfd.analytics.collectives.winfold import WindowFold

    fold = WindowFold(keep=3)

    def row(rank: int, it: int, settled: bool = True) -> RankWindow:
        return RankWindow(rank, 10 * it, 10 * it + 9, 1, None, it + rank, (("dp", it),), settled, 10 * it + 9)

    for its in ((4, 2), (5, 1), (3,)):
        figs = WindowFigures("j")
        for it in its:
            for rank in (1, 0):
                figs.add(it, row(rank, it, settled=False))
        fold.add_figures(figs)
    assert sorted({it for it, _ in fold.outside.rows}) == [3, 4, 5]
    late = WindowFigures("j")
    late.add(1, row(0, 1))
    late.add(4, row(0, 4))  # settles a provisional row
    assert fold.add_figures(late) == 2  # both went in; iteration 1 left again at once
    assert sorted({it for it, _ in fold.outside.rows}) == [3, 4, 5]
    view = fold.view().outside
    assert {it: [w.rank for w in ws] for it, ws in view.items()} == {3: [1, 0], 4: [1, 0], 5: [1, 0]}
    assert view[4][1] == row(0, 4) and not view[4][0].settled
    assert fold.counts.received == 3 * 2 + 2 + 2 + 2


def test_the_root_holds_the_newest_whole_iterations_of_figures_within_its_rows_cap() -> None:
    """Past limits.MAX_FIGURE_ROWS_PER_JOB rows the oldest iterations go, whole, before the iterations'
    own cap would take them, counted apart (at 100,000 ranks 100 iterations of rows were GBs); the
    newest iteration stays whatever its rows."""
    from perfd.analytics.collectives.winfold import WindowFold

    fold = WindowFold(keep=10)
    fold.max_rows = 25
    for it in range(1, 6):
        figs = WindowFigures("j")
        for rank in range(10):
            figs.add(it, RankWindow(rank, 10 * it, 10 * it + 9, 1, None, 5, (("dp", 5),), True, 10 * it + 9))
        fold.add_figures(figs)
    assert sorted({it for it, _ in fold.outside.rows}) == [4, 5]
    assert fold.counts.evicted == fold.counts.evicted_for_rows == 30
    fold.max_rows = 5
    big = WindowFigures("j")
    for rank in range(10):
        big.add(6, RankWindow(rank, 60, 69, 1, None, 5, (("dp", 5),), True, 69))
    fold.add_figures(big)
    assert sorted({it for it, _ in fold.outside.rows}) == [6]


def _node_folds(steps: list[StepRecord]) -> dict[tuple[int, int], StepRecord]:
    """(iteration, node) -> the node's fold of its ranks' records, each rank's own end in it (what a
    node message's step partial carries to a shard)."""
    from perfd.engine.partial import Partial

    out = {}
    for it in sorted({s.iteration for s in steps}):
        for n in range(NODES):
            p = Partial("j", it)
            p.add_records([s for s in steps if s.iteration == it and _node(s) == n])
            fold = p.fold
            assert fold is not None and len(fold.rank_end_times) == PER_NODE
            out[(it, n)] = fold
    return out


class _EveryRecord(ShardCollectives):
    """The reference: every new step end reads every record held again (all ranks' windows)."""

    def add_steps(self, records: Iterable[StepRecord]) -> None:
        super().add_steps(records)
        for j in self.jobs.values():
            j.changed = None


def test_step_ends_with_every_node_message_give_the_windows_all_the_records_give(monkeypatch: Any) -> None:
    """As ``perfd shard`` folds: each node message's operations, then its step ends, one node at a
    time, past the iterations a shard keeps. A new end reads again only the records naming its ranks
    (an index by rank, forgetting what the iterations kept forget); the settled figures are those of a
    fold that reads every record again at every change."""
    # 5 of the job's 9 iterations of ends kept (fewer would forget windows that operations still wait
    # on, in the reference only: the reason a shard keeps 12)
    monkeypatch.setattr(shardfold, "KEEP_STEP_ITERATIONS", 5)
    recs, steps = synthetic_job()
    folds = _node_folds(steps)
    its = sorted({s.iteration for s in steps})
    ends = {it: max(round((s.end_time or 0) * 1e9) for s in steps if s.iteration == it) for it in its}
    joined: list[WindowFigures] = []
    settled_rows: list[int] = []
    settled_as_handed: list[int] = []
    # the reference caches nothing either: it hands on every settled row, where the shard's fold leaves
    # out those that settled as it handed them on provisional
    for sh in (ShardCollectives(), _EveryRecord(cache=False)):
        sh.set_layout("j", LAYOUT)
        got = WindowFigures("j")
        rows = 0  # settled rows handed on
        prev = None
        for it in its:
            for n in range(NODES):
                mine = [r for r in recs if _node(r) == n and (r.time_created_ns or 0) <= ends[it]
                        and (prev is None or (r.time_created_ns or 0) > ends[prev])]
                if mine:
                    sh.add(reduce("j", mine))
                sh.add_steps([folds[(it, n)]])
                if n % 3 == 2:  # a flush now and then, as the shard's
                    for f in sh.take():
                        got.absorb(f)
                        rows += sum(w.settled for w in f.rows.values())
            prev = it
        for f in sh.take():
            got.absorb(f)
            rows += sum(w.settled for w in f.rows.values())
        joined.append(got)
        settled_rows.append(rows)
        j = sh.jobs["j"]
        settled_as_handed.append(j.fold.counts.settled_as_handed)
        assert len(j.steps) == 5
        assert {e[0] for es in j.by_rank.values() for e in es} == set(j.steps)
        assert set(j.by_rank) == set(range(WORLD))
    settled = {k: w for k, w in joined[1].rows.items() if w.settled}
    assert len(settled) == WORLD * (ITERATIONS - 2)  # iterations 1..6 settled: the last two wait
    # the join of what the shard's fold handed on holds the reference's settled figures
    assert {k: _figures(joined[0].rows[k]) for k in settled} == {k: _figures(w) for k, w in settled.items()}
    # every settled window either handed on settled or counted as settled as it was handed on
    assert 0 < settled_as_handed[0] and settled_rows[0] + settled_as_handed[0] == len(settled)
    assert settled_as_handed[1] == 0 and settled_rows[1] == len(settled)


def test_a_fold_holds_at_most_max_jobs_the_least_recently_touched_goes(monkeypatch: Any) -> None:
    """A shard or an agent lives through many jobs: a job's fold does not stay for ever after it."""
    monkeypatch.setattr(shardfold, "MAX_JOBS", 3)
    sh = ShardCollectives()
    for job in ("a", "b", "c"):
        sh.add_steps([StepRecord(job=job, iteration=1, rank=0, end_time=1.0, rank_end_times={0: 1.0})])
    # a, touched again: the newest
    sh.add_steps([StepRecord(job="a", iteration=2, rank=0, end_time=2.0, rank_end_times={0: 2.0})])
    sh.add_steps([StepRecord(job="d", iteration=1, rank=0, end_time=1.0, rank_end_times={0: 1.0})])
    assert list(sh.jobs) == ["c", "a", "d"] and sh.jobs_forgotten == 1  # b, touched least recently
    assert sorted(sh.jobs["a"].steps) == [1, 2]  # a job kept keeps what it held


def _fold_in_order(order: list[tuple[int, int]], recs: list[CollectiveRecord], steps: list[StepRecord],
                   take_every: int = 3) -> WindowFigures:
    """A shard's fold fed each (iteration, node)'s message in ``order`` (its operations since the
    iteration before, then its step ends), taken now and then: the join of what it handed on."""
    folds = _node_folds(steps)
    its = sorted({s.iteration for s in steps})
    ends = {it: max(round((s.end_time or 0) * 1e9) for s in steps if s.iteration == it) for it in its}
    sh = ShardCollectives()
    sh.set_layout("j", LAYOUT)
    got = WindowFigures("j")
    for k, (it, n) in enumerate(order):
        prev = its[its.index(it) - 1] if its.index(it) else None
        mine = [r for r in recs if _node(r) == n and (r.time_created_ns or 0) <= ends[it]
                and (prev is None or (r.time_created_ns or 0) > ends[prev])]
        if mine:
            sh.add(reduce("j", mine))
        sh.add_steps([folds[(it, n)]])
        if k % take_every == take_every - 1:
            for f in sh.take():
                got.absorb(f)
    for f in sh.take():
        got.absorb(f)
    return got


def test_a_node_whose_messages_come_iterations_behind_the_others_still_has_its_windows(
        monkeypatch: Any) -> None:
    """A shard that took over a killed one's partitions folds their messages again once the engine's ack
    wait ran out, iterations behind its other nodes'. Its fold keeps each rank's newest step records
    and lets go of no figures before a take handed them on: the late node's windows are all made, with
    the figures an in-order fold gives. (It kept the job's newest iterations: the late node's records
    went as they came, and with them every window of its ranks.)"""
    monkeypatch.setattr(shardfold, "KEEP_STEP_ITERATIONS", 3)
    monkeypatch.setattr(shardfold, "KEEP_FIGURE_ITERATIONS", 2)
    recs, steps = synthetic_job()
    its = sorted({s.iteration for s in steps})
    in_order = _fold_in_order([(it, n) for it in its for n in (0, 1)], recs, steps)
    late = _fold_in_order([(it, 0) for it in its] + [(it, 1) for it in its], recs, steps)
    node1 = {k for k in in_order.rows if k[1] // PER_NODE == 1}
    assert len(node1) >= PER_NODE * (ITERATIONS - 3)
    assert {k for k in late.rows if k[1] // PER_NODE == 1} == node1
    assert {k: _figures(late.rows[k]) for k in node1} == {k: _figures(in_order.rows[k]) for k in node1}

"""The same answer from step summaries (perfd.engine.stepsummary) as one aggregator, on a replay of the
same records: 125 nodes x 8 ranks (1,000 ranks) and 1,000 x 8 (8,000). Each rank's clock is a real
recorded H100 loop (tests/engine/records.py), its compute split into Megatron's forward and backward
timers (what the per-rank straggler analysis reads), with stragglers and exact ties put in. The ranks
go as their nodes' folds (what an agent sends) to the partition of their node (perfd.engine.subjects),
are summarised there (a shard's), encoded and decoded, delivered twice and in any order to the root's
SummaryFold, and merged.

Exact parts are compared for equality with one aggregator's fold (perfd.core.stepfold) and its straggler
analysis (perfd.analytics.steps.stragglers.detect) and /metrics' top ranks and ratio histogram
(perfd.exporters.prometheus): ranks, the slowest rank's record, the latest end, each timer's count,
min, max and sum (the correctly rounded sum: math.fsum), each stage's count, sum and slowest ranks.
Sketched parts are held to the sketch's stated error: each stage's median, the compute ratios of the
top ranks, the histogram (a rank counted where one aggregator counts it unless its ratio is within the
error of a bound) and the count of ranks past the straggler ratio."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest

from perfd.analytics.common import BACKWARD_COMPUTE, FORWARD_BACKWARD, FORWARD_COMPUTE
from perfd.analytics.steps.metrics import exposed_comm
from perfd.analytics.steps.pipeline import analytic_bubble, stage_idle
from perfd.analytics.steps.stragglers import STRAGGLER_RATIO, RankOrder, detect
from perfd.core.limits import RANK_RATIO_TOP_K
from perfd.core.model import HOOK_COMPUTE, ParallelLayout, Provenance, StepRecord, TimerValue
from perfd.core.sketch import SKETCH_ACCURACY, Sketch
from perfd.core.stepfold import fold_ranks
from perfd.engine import stepsummary as ss
from perfd.engine import summary_codec as codec
from perfd.engine.partial import Partial
from perfd.engine.root_summaries import SummaryFold
from perfd.engine.subjects import DEFAULT_PARTITIONS, partition_of
from perfd.exporters.prometheus import rank_picture_rows, rank_ratio_buckets
from perfd.transport.gen import perfd_pb2 as pb
from tests.engine.records import RANKS_PER_NODE, job_records

JOB = "summary-job"
ITERATIONS = 3
PP = 4
A = SKETCH_ACCURACY


def megatron(nodes: int, iterations: int = ITERATIONS, job: str = JOB) -> dict[int, list[list[StepRecord]]]:
    """The recorded ranks with forward and backward compute timers (a third and two thirds of the
    hook's compute), a few ranks made slow, and two ranks of one stage tied at its slowest."""
    out = job_records(job, nodes, iterations)
    world = nodes * RANKS_PER_NODE
    slow = {7: 1.4, world // 2 + 3: 1.25, world - 1: 1.12}
    for node, its in out.items():
        for k, recs in enumerate(its):
            fixed = []
            for r in recs:
                assert isinstance(r.rank, int)
                c = r.timers[HOOK_COMPUTE].per_rank[r.rank] * slow.get(r.rank, 1.0)
                if r.rank in (1, 2):  # a tie at the top of stage 0
                    c = 500.0 + k
                f, b = c / 3, c - c / 3
                # the step's rest as the span's idle, its gradient sync and pipeline waits
                span = max(c, r.step_time_ms or c) * 1.05
                rest = span - c
                timers = {**r.timers, FORWARD_COMPUTE: TimerValue(f, f, {r.rank: f}),
                          BACKWARD_COMPUTE: TimerValue(b, b, {r.rank: b}),
                          FORWARD_BACKWARD: TimerValue(span, span, {r.rank: span}),
                          "all-grads-sync": TimerValue(rest / 2, rest / 2, {r.rank: rest / 2}),
                          "forward-recv": TimerValue(rest / 5, rest / 5, {r.rank: rest / 5}),
                          "backward-send": TimerValue(rest / 7, rest / 7, {r.rank: rest / 7})}
                assert r.source is not None
                fixed.append(dataclasses.replace(r, timers=timers,
                                                 source=Provenance("megatron", r.source.detail)))
            its[k] = fixed
        out[node] = its
    return out


def _layout(world: int) -> RankOrder:
    return RankOrder(ParallelLayout(world_size=world, tp=1, pp=PP, dp=world // PP, cp=1))


def _engine(by_node: dict[int, list[list[StepRecord]]], it: int, order: RankOrder, seed: int
            ) -> ss.StepSummary:
    """Iteration ``it`` through the path: node folds -> each partition's summary (encoded) ->
    delivered twice, shuffled, with an older flush of each partition -> the root's fold, merged."""
    by_part: dict[int, list[StepRecord]] = {}
    for node, its in by_node.items():
        p = Partial(JOB, it)
        p.add_records(its[it - 1])
        assert p.fold is not None
        by_part.setdefault(partition_of(JOB, f"node-{node}", DEFAULT_PARTITIONS), []).append(p.fold)
    wire = []
    for part, folds in by_part.items():
        older = ss.summarize(JOB, it, folds[: len(folds) // 2], order.stage, partition=part, epoch=1, seq=1)
        newest = ss.summarize(JOB, it, folds, order.stage, partition=part, epoch=1, seq=2)
        wire += [codec.encode(older), codec.encode(newest), codec.encode(newest)]
    rng = random.Random(seed)
    rng.shuffle(wire)
    fold = SummaryFold()
    for data in wire:
        fold.add(codec.decode(data))
    merged = fold.merged(JOB, it)
    assert merged is not None
    return merged


def _bracket(value: float, lo: float, hi: float) -> bool:
    """``value`` within the sketch's error of [lo, hi]."""
    return lo * (1 - A) <= value <= hi * (1 + A)


@pytest.mark.parametrize("nodes", [125, 1000])
def test_same_answer_as_one_aggregator(nodes: int) -> None:
    by_node = megatron(nodes)
    world = nodes * RANKS_PER_NODE
    order = _layout(world)
    for it in range(1, ITERATIONS + 1):
        ranks = [r for its in by_node.values() for r in its[it - 1]]
        one = fold_ranks(ranks)  # one aggregator's fold of the ranks' records
        st = detect(one, order)
        got = ss.answer(_engine(by_node, it, order, seed=it), STRAGGLER_RATIO)

        # exact
        assert got.ranks_in == world
        # the slowest rank's record (a fold's, as one aggregator's: its rank is named by its source)
        assert got.slowest is not None
        assert (got.slowest.step_time_ms, got.slowest.source, got.slowest.fields) == (
            one.step_time_ms, one.source, one.fields)
        assert got.end_time == one.end_time
        for name, tv in one.timers.items():
            assert got.timer_count[name] == len(tv.per_rank)
            assert got.timer_sum[name] == math.fsum(tv.per_rank.values())
            assert got.timer_min[name] == tv.min_ms
            top = max(tv.per_rank.items(), key=lambda rv: (rv[1], -rv[0]))
            assert got.timer_max[name] == (tv.max_ms, top[0]) == (top[1], top[0])
            xs = sorted(tv.per_rank.values())
            for q, v in got.timer_quantiles[name].items():  # the value at rank q·(n-1), within the error
                assert abs(v - xs[int(q * (len(xs) - 1))]) <= A * xs[int(q * (len(xs) - 1))]
        stages: dict[int, dict[int, float]] = {}
        fwd, bwd = one.timers[FORWARD_COMPUTE].per_rank, one.timers[BACKWARD_COMPUTE].per_rank
        for r in fwd:
            s = order.stage(r)
            assert s is not None
            stages.setdefault(s, {})[r] = fwd[r] + bwd[r]
        assert got.stage_count == {s: len(g) for s, g in sorted(stages.items())}
        assert got.stage_sum == {s: math.fsum(g.values()) for s, g in sorted(stages.items())}
        want_top = sorted(((r, c) for g in stages.values() for r, c in g.items()),
                          key=lambda rc: (-st.per_rank_ratio[rc[0]], rc[0]))[:RANK_RATIO_TOP_K]
        picture = rank_picture_rows(JOB, st.per_rank_ratio)
        assert [int(lab["rank"]) for lab, _, _ in picture] == [r for r, _ in want_top]

        # the per-rank figures other analyses take the extremes of: the same answer from those alone
        step = one.step_time_ms
        assert step is not None
        comm = exposed_comm(one)
        assert comm.method == "per-rank" and comm.worst_rank == got.extremes[ss.COMM].max_rank
        for part, key in ((comm.total, ss.COMM), (comm.grad_sync, ss.COMM_GRAD_SYNC), (comm.pp, ss.COMM_PP)):
            assert part.value == got.extremes[key].max / step
        idle = stage_idle(one, PP, analytic_bubble(PP, 8, None))
        assert idle.method == "per-rank"
        ex, cx = got.extremes[ss.IDLE], got.extremes[ss.IDLE_COMPUTE]
        assert (idle.idle_max.value, idle.idle_min.value) == (ex.max, ex.min)
        assert (max(idle.per_rank_idle, key=lambda r: idle.per_rank_idle[r]),
                min(idle.per_rank_idle, key=lambda r: idle.per_rank_idle[r])) == (ex.max_rank, ex.min_rank)
        assert (idle.lighter_compute_ms, idle.heavier_compute_ms) == (cx.min, cx.max)

        # sketched: each stage's median, within the error of its middle values
        for s, g in stages.items():
            xs = sorted(g.values())
            assert _bracket(got.stage_median[s], xs[(len(xs) - 1) // 2], xs[len(xs) // 2])
            assert abs(got.stage_median[s] / statistics.median(xs) - 1) <= A
        # the top ranks: the same ranks (where their ratios are apart by more than the error), each
        # ratio within the error of one aggregator's
        assert len(got.top_ratios) == len(picture)
        for r, ratio in got.top_ratios:
            assert abs(ratio / st.per_rank_ratio[r] - 1) <= A / (1 - A) + 1e-12
        want_ratios = [v for _, _, v in picture]
        for i in range(len(picture)):  # a cut the error cannot cross: the same ranks above it
            if i + 1 == len(picture) or want_ratios[i] > want_ratios[i + 1] * (1 + 4 * A):
                assert ({r for r, _ in got.top_ratios[: i + 1]}
                        == {int(lab["rank"]) for lab, _, _ in picture[: i + 1]}) or i + 1 == len(picture)
        # the histogram: each bound's count between one aggregator's at the bound moved by the error
        want_b = rank_ratio_buckets(st.per_rank_ratio)
        assert want_b is not None and got.ratio_buckets is not None and got.ratio_sum is not None
        ratios = list(st.per_rank_ratio.values())
        e = (1 + A) / (1 - A)
        for (le, n), (label, wn) in zip(got.ratio_buckets, want_b[0], strict=True):
            assert label == ("+Inf" if le == math.inf else repr(le))
            lo = sum(1 for v in ratios if v <= le / e / e)
            hi = sum(1 for v in ratios if v <= le * e * e)
            assert lo <= n <= hi and lo <= wn <= hi
        assert abs(got.ratio_sum / want_b[1] - 1) <= A / (1 - A) + 1e-12
        flagged = set(st.per_rank_flagged)
        assert set(got.flagged) <= flagged | {r for r in st.per_rank_ratio
                                              if st.per_rank_ratio[r] > STRAGGLER_RATIO / e}
        assert {7, world // 2 + 3} <= set(got.flagged)
        near = sum(1 for v in ratios if STRAGGLER_RATIO / e / e < v <= STRAGGLER_RATIO * e * e)
        assert abs(got.flagged_count - len(flagged)) <= near


@pytest.mark.parametrize("pp", [None, 1, 2])
def test_stages_as_the_straggler_analysis_groups_them(pp: int | None) -> None:
    """Without a pipeline every rank is one stage's, without a pipeline size none is compared (no
    ratios), as detect() does: the top ranks and the histogram agree with one aggregator's."""
    by_node = megatron(16)
    world = 16 * RANKS_PER_NODE
    order = RankOrder(ParallelLayout(world_size=world, tp=1, pp=pp, dp=world // (pp or 1), cp=1))
    ranks = [r for its in by_node.values() for r in its[0]]
    st = detect(fold_ranks(ranks), order)
    got = ss.answer(ss.summarize(JOB, 1, ranks, ss.stage_function(order)), STRAGGLER_RATIO)
    if pp is None:
        assert not st.per_rank_ratio and not got.top_ratios and got.ratio_buckets is None
        return
    want = rank_picture_rows(JOB, st.per_rank_ratio)
    assert [r for r, _ in got.top_ratios][:2] == [int(lab["rank"]) for lab, _, _ in want][:2]
    for r, v in got.top_ratios:
        assert abs(v / st.per_rank_ratio[r] - 1) <= A / (1 - A) + 1e-12


def test_merge_is_a_join() -> None:
    """Any grouping and order of partitions merges to the same bytes; one summary of all the ranks
    is that merge (but for who made it); a partition's older flush and a redelivery change nothing."""
    by_node = megatron(40)
    order = _layout(40 * RANKS_PER_NODE)
    folds = []
    for its in by_node.values():
        p = Partial(JOB, 1)
        p.add_records(its[0])
        assert p.fold is not None
        folds.append(p.fold)
    parts = [ss.summarize(JOB, 1, folds[i::5], order.stage, partition=i) for i in range(5)]
    want = codec.encode(ss.merge(parts))
    rng = random.Random(7)
    for _ in range(5):
        rng.shuffle(parts)
        assert codec.encode(ss.merge(parts)) == want
        left = ss.merge(parts[:2])
        right = ss.merge(parts[2:])
        right.partition = 1
        assert codec.encode(ss.merge([left, right])) == want
    whole = ss.summarize(JOB, 1, folds, order.stage)
    assert codec.encode(whole) == want


def test_wire_size_is_fixed_in_ranks() -> None:
    """A summary's size grows with the timers, stages and the spread of the values, not with the
    ranks: 8x the ranks, within a small factor of the bytes (the sketches' buckets)."""
    sizes = []
    for nodes in (25, 200):
        by_node = megatron(nodes)
        order = _layout(nodes * RANKS_PER_NODE)
        ranks = [r for its in by_node.values() for r in its[0]]
        sizes.append(len(codec.encode(ss.summarize(JOB, 1, ranks, order.stage))))
    assert sizes[1] < 2 * sizes[0] and sizes[1] < 8_000


def test_wire_versions_and_malformed() -> None:
    s = ss.summarize(JOB, 1, [r for its in megatron(2).values() for r in its[0]], None)
    m = pb.StepSummary()
    codec.to_pb(s, m)
    m.version = codec.VERSION + 1
    with pytest.raises(ValueError, match="version"):
        codec.from_pb(m)
    codec.to_pb(s, m)
    m.slowest.iteration = 9
    with pytest.raises(ValueError, match="another job or iteration"):
        codec.from_pb(m)


def test_sketch_and_sums_on_random_values() -> None:
    """Zeros, ties and values over nine decades: every quantile within the error of the exact value at
    its rank, the median within it of statistics.median, sums exact, and merging in pieces the same
    sketch as adding one by one."""
    rng = random.Random(11)
    for _ in range(20):
        xs = [0.0] * rng.randint(0, 5) + [10 ** rng.uniform(-3, 6) for _ in range(rng.randint(1, 400))]
        xs += xs[: rng.randint(0, 10)]  # ties
        rng.shuffle(xs)
        one = Sketch()
        for x in xs:
            one.add(x)
        pieces = []
        for k in range(0, len(xs), 37):
            p = Sketch()
            for x in xs[k:k + 37]:
                p.add(x)
            pieces.append(p)
        merged = Sketch()
        for p in reversed(pieces):
            merged.merge(p)
        assert (merged.bins, merged.zeros) == (one.bins, one.zeros)
        srt = sorted(xs)
        for q in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0):
            want = srt[int(q * (len(srt) - 1))]
            got = one.quantile(q)
            assert got is not None and abs(got - want) <= A * want
        med = one.median()
        assert med is not None and abs(med - statistics.median(xs)) <= A * statistics.median(xs)


def test_exact_sum_is_order_free() -> None:
    rng = random.Random(3)
    xs = [rng.uniform(-1, 1) * 10 ** rng.randint(-8, 8) for _ in range(2000)]
    a, b = ss.ExactSum(xs[:700]), ss.ExactSum(xs[700:])
    b.merge(a)
    assert b.value() == math.fsum(xs)
    assert b.canonical() == ss.ExactSum(reversed(xs)).canonical()


def test_a_figure_one_partition_cannot_make_is_none() -> None:
    """A rank without its own forward-backward has its idle read against the job's longest (one
    aggregator's pipeline.stage_idle): no partition holds that, so the merge names no idle extremes
    rather than a wrong one; the other figures stay."""
    by_node = megatron(4)
    order = _layout(4 * RANKS_PER_NODE)
    parts = []
    for n, its in by_node.items():
        recs = its[0]
        if n == 3:
            timers = {k: v for k, v in recs[0].timers.items() if k != FORWARD_BACKWARD}
            recs = [dataclasses.replace(recs[0], timers=timers), *recs[1:]]
        parts.append(ss.summarize(JOB, 1, recs, order.stage, partition=n))
    got = ss.answer(ss.merge(parts), STRAGGLER_RATIO)
    assert ss.IDLE not in got.extremes and ss.IDLE_COMPUTE not in got.extremes
    assert ss.COMM in got.extremes and got.extremes[ss.COMM].count == 4 * RANKS_PER_NODE


def test_a_shard_summarises_node_by_node() -> None:
    """A shard's partition summary made node message by node message is the summary of all the
    partition's ranks at once (the same bytes); a node message delivered again changes nothing; one
    whose ranks are in only in part is not folded, and counted."""
    by_node = megatron(12)
    order = _layout(12 * RANKS_PER_NODE)
    held = ss.PartitionSummaries()
    folds = []
    for n, its in by_node.items():
        p = Partial(JOB, 1)
        p.add_records(its[0])
        assert p.fold is not None
        folds.append(p.fold)
        held.add(3, p.fold, p.ranks, order.stage)
        if n == 5:
            held.add(3, p.fold, p.ranks, order.stage)  # delivered again
    (got,) = held.take(epoch=2, seq=9)
    want = ss.summarize(JOB, 1, folds, order.stage, partition=3, epoch=2, seq=9)
    assert codec.encode(got) == codec.encode(want)
    assert held.redelivered == 1 and held.take(2, 10) == []
    p = Partial(JOB, 1)
    p.add_records([*by_node[0][0][:2], *by_node[0][0][:1]])
    p.add_records([dataclasses.replace(by_node[0][0][0], rank=10_000)])
    assert p.fold is not None
    held.add(3, p.fold, p.ranks, order.stage)
    assert held.overlapping == 1 and held.take(2, 11) == []
    held.drop_before(JOB, 2)
    assert held.held == {}


def _held_before_the_layout(by_node: dict[int, list[list[StepRecord]]], read_after: int,
                            order: RankOrder | None) -> tuple[ss.PartitionSummaries, list[StepRecord]]:
    """One partition's node folds, the first ``read_after`` summarised before the job's layout was read
    (as a shard that took the partition over does: every rank's stage unknown), the rest with it."""
    held, folds = ss.PartitionSummaries(), []
    for n, its in by_node.items():
        p = Partial(JOB, 1)
        p.add_records(its[0])
        assert p.fold is not None
        folds.append(p.fold)
        unread = n < read_after
        stage = (lambda rank: None) if unread else (order.stage if order is not None else None)
        held.add(3, p.fold, p.ranks, stage, layout_unread=unread)
    return held, folds


@pytest.mark.parametrize("pipeline", [True, False], ids=["stages", "no-pipeline"])
def test_ranks_summarised_before_the_layout_was_read_are_grouped_by_stage_once_it_is(pipeline: bool) -> None:
    """The summary a restage leaves is the summary made with the layout from the start (the same bytes),
    sent again; a layout with no pipeline leaves no stage and nothing unknown."""
    by_node = megatron(12)
    order = _layout(12 * RANKS_PER_NODE) if pipeline else None
    held, folds = _held_before_the_layout(by_node, 5, order)
    (before,) = held.take(epoch=2, seq=9)
    assert before.stage_unknown and held.unstaged_rows == 5 * RANKS_PER_NODE
    assert held.restage(JOB, order.stage if order is not None else None) == 1
    assert held.unstaged == {} and held.unstaged_rows == 0
    (got,) = held.take(epoch=2, seq=10)
    want = ss.summarize(JOB, 1, folds, order.stage if order is not None else None, partition=3, epoch=2,
                        seq=10)
    assert not got.stage_unknown and codec.encode(got) == codec.encode(want)
    assert held.restage(JOB, None) == 0  # nothing left to group


def test_rows_past_the_bound_are_not_kept_and_their_summary_stays_stage_unknown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past UNSTAGED_MAX_ROWS a partition's unknown stage is no longer all kept: a restage leaves it as
    it is (stage_unknown, said) rather than group some of its ranks; the rows dropped are counted, and
    those kept let go with their iteration."""
    monkeypatch.setattr(ss, "UNSTAGED_MAX_ROWS", 3 * RANKS_PER_NODE)
    order = _layout(12 * RANKS_PER_NODE)
    held, _ = _held_before_the_layout(megatron(12), 5, order)
    assert (held.unstaged_rows, held.unstaged_dropped) == (3 * RANKS_PER_NODE, 2 * RANKS_PER_NODE)
    assert held.restage(JOB, order.stage) == 0 and held.unstaged_rows == 0
    held.take(2, 9)
    (s, _) = held.held[(JOB, 1, 3)]
    assert s.stage_unknown and s.stages[ss.UNKNOWN_STAGE].count == 5 * RANKS_PER_NODE
    held2, _ = _held_before_the_layout(megatron(12), 5, order)
    held2.drop_before(JOB, 2)
    assert held2.unstaged == {} and held2.unstaged_rows == 0


def test_the_root_holds_each_holders_newest_within_its_iterations() -> None:
    """Per (job, iteration) the newest of each partition's holder (by its flush), the older and the same
    one again counted and dropped; another holder's (the partition's lease moved) held beside it, not in
    its place; a job's iterations but the newest ``keep`` let go."""
    recs = [r for its in megatron(2).values() for r in its[0]]
    fold = SummaryFold()
    for it in range(1, 6):
        for epoch, seq in ((1, 5), (1, 4), (2, 1), (2, 1), (2, 2)):
            fold.add(ss.summarize(JOB, it, recs, None, partition=0, epoch=epoch, seq=seq))
    assert (fold.replaced, fold.stale) == (5, 10)
    assert all(sorted(p) == [(0, 1), (0, 2)] and p[(0, 1)].seq == 5 and p[(0, 2)].seq == 2
               for p in fold.held.values())
    fold.trim(JOB, 3)
    assert sorted(i for _, i in fold.held) == [3, 4, 5]


def test_a_root_that_reads_no_summaries_passes_them_by() -> None:
    """An EngineBatch carrying summaries decodes as a batch of nothing else to the partials' decoder (a
    root that does not read them folds nothing and counts nothing undecodable); its summaries read back."""
    from perfd.engine.partial import decode

    s = ss.summarize(JOB, 1, [r for its in megatron(2).values() for r in its[0]], None, partition=4)
    b = pb.EngineBatch(id="s:1:1", sender="s")
    codec.to_pb(s, b.step_summaries.add())
    d = decode(b.SerializeToString())
    assert (d.partials, d.figures, d.job_info_json, d.records) == ([], [], {}, None)
    (back,) = [codec.from_pb(m) for m in pb.EngineBatch.FromString(b.SerializeToString()).step_summaries]
    assert codec.encode(back) == codec.encode(s)

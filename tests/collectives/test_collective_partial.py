"""The collective analysis in phases (perfd.core.collfold): reduce, merge, finish.
A merge is a join (associative, commutative, idempotent, with or without the per-rank bound), and
the analysis of partials merged in any order and grouping is byte for byte the one-aggregator
analysis of all their records: the recorded H200 Flight Recorder dumps and a synthetic 64-rank job
(TP groups in a node, DP groups across nodes, the world group; a slow rank; per-rank step windows)."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfd.analytics.collectives.collective_analysis import analyze_collectives, finish
from perfd.core import collfold
from perfd.core.collfold import (
    CollectivePartial,
    GroupRef,
    OpKey,
    OpRow,
    Retention,
    for_sending,
    merge,
    merge_all,
    reduce,
)
from perfd.core.model import CollectiveRecord, ParallelLayout, StepRecord
from perfd.core.stepfold import fold_ranks
from perfd.report.collective_text import collectives_json, hang_text
from tests.collectives.collective_helpers import fr, load_fixture_records, step

NODES, PER_NODE, ITERATIONS, TP_OPS = 8, 8, 8, 6
WORLD = NODES * PER_NODE
SLOW_RANK = 13
LAYOUT = ParallelLayout(world_size=WORLD, tp=PER_NODE, pp=1, dp=NODES)
RANK_NODES = {r: f"node-{r // PER_NODE}" for r in range(WORLD)}


def synthetic_job(seed: int = 7) -> tuple[list[CollectiveRecord], list[StepRecord]]:
    """A 64-rank job: per iteration each rank runs TP_OPS all-reduces on its node's TP group (pg
    10 + node), one 128 MiB all-reduce on its DP group (pg 20 + local rank, across nodes, no
    description: the layout classes it), and a barrier on the world (pg 0); per-rank step records
    100 ms apart. Every rank names a group alike (PyTorch numbers groups in creation order, and
    every rank creates every group). ``SLOW_RANK``
    arrives last at its collectives (its durations are the shortest)."""
    rng = random.Random(seed)
    recs: list[CollectiveRecord] = []
    steps: list[StepRecord] = []
    world = list(range(WORLD))
    for r in world:
        node, local = divmod(r, PER_NODE)
        tp = [node * PER_NODE + i for i in range(PER_NODE)]
        dp = [n * PER_NODE + local for n in range(NODES)]
        seqs = {0: 0, 10 + node: 0, 20 + local: 0}
        for it in range(ITERATIONS + 1):
            base = 100.0 * it
            steps.append(step(r, it, base + 99.0))
            t = base + 1.0
            for _ in range(TP_OPS):
                dur = 0.5 + rng.random() * (0.2 if r == SLOW_RANK else 4.0)
                recs.append(fr(r, seqs[10 + node], t, dur, pg=10 + node, ranks=tp,
                               desc="TENSOR_MODEL_PARALLEL_GROUP"))
                seqs[10 + node] += 1
                t += 6.0 + rng.random()
            dur = 10.0 + rng.random() * (0.5 if r == SLOW_RANK else 20.0)
            recs.append(fr(r, seqs[20 + local], t, dur, pg=20 + local, ranks=dp, desc="undefined",
                           nbytes=128 << 20, busbw=(128 << 20) / dur / 1e6))
            seqs[20 + local] += 1
            recs.append(fr(r, seqs[0], t + 40.0, 0.3 + rng.random(), ranks=world, op="barrier", nbytes=0))
            seqs[0] += 1
    return recs, steps


def _json(p: CollectivePartial, steps: Sequence[StepRecord], **kw: object) -> str:
    return json.dumps(collectives_json(finish(p, steps, **kw)), sort_keys=True)  # type: ignore[arg-type]


def _raw_json(job: str, recs: Sequence[CollectiveRecord], steps: Sequence[StepRecord], **kw: object) -> str:
    return json.dumps(collectives_json(analyze_collectives(job, recs, steps, **kw)), sort_keys=True)  # type: ignore[arg-type]


def _split_merge(job: str, recs: Sequence[CollectiveRecord], rng: random.Random, pieces: int,
                 bound: Retention | None = None) -> CollectivePartial:
    """``recs`` reduced in ``pieces`` random pieces (some records in two: a re-delivery), merged in a
    random order and grouping."""
    parts: list[list[CollectiveRecord]] = [[] for _ in range(pieces)]
    for r in recs:
        parts[rng.randrange(pieces)].append(r)
        if rng.random() < 0.05:
            parts[rng.randrange(pieces)].append(r)
    todo = [reduce(job, p, bound) for p in parts]
    while len(todo) > 1:
        rng.shuffle(todo)
        a, b = todo.pop(), todo.pop()
        todo.append(merge(a, b, bound))
    return todo[0]


@pytest.mark.slow
def test_the_synthetic_job_split_across_partials_in_any_order_gives_the_one_aggregator_answer() -> None:
    recs, steps = synthetic_job()
    kw = {"layout": LAYOUT, "rank_nodes": RANK_NODES, "gpu_name": "NVIDIA H200"}
    want = _raw_json("j", recs, steps, **kw)
    a = json.loads(want)
    # The analysis has what the test means it to: per-iteration shares, DP bandwidth, the slow rank.
    # (the last window has no record enqueued after it: not covered)
    assert a["method"]["name"] == "step_windows" and len(a["iterations"]) == ITERATIONS - 1
    assert {g["class"] for g in a["groups"]} == {"tp", "dp", "world"}
    assert [b["group"] for b in a["bandwidth"]] == ["dp"]
    assert f"collective-last-rank-{SLOW_RANK}" in {f["id"] for f in a["findings"]}
    # Per node, as the agents reduce, merged in shuffled orders and groupings.
    rng = random.Random(1)
    by_node = [reduce("j", [r for r in recs if RANK_NODES[r.rank or 0] == f"node-{n}"]) for n in range(NODES)]
    for _ in range(3):
        rng.shuffle(by_node)
        assert _json(merge_all("j", by_node), steps, **kw) == want
    for pieces in (2, 5, 23):
        assert _json(_split_merge("j", recs, rng, pieces), steps, **kw) == want
    # A bound that holds every rank's operations changes nothing.
    per_rank = (ITERATIONS + 1) * (TP_OPS + 2)
    every = Retention(per_rank=per_rank, per_job=per_rank * WORLD)
    assert _json(_split_merge("j", recs, rng, 7, every), steps, **kw) == want
    # Without steps or layout too (the observation window, classes from descriptions only).
    assert _json(_split_merge("j", recs, rng, 9), ()) == _raw_json("j", recs, ())


def test_the_ranks_step_records_folded_as_the_engine_folds_them_keep_each_ranks_windows() -> None:
    """The engine's root holds one ``"all"`` fold an iteration (a node's agent folds its ranks, the
    shards and the root fold those): each rank's own end travels in the fold (``rank_end_times``), so
    the per-rank windows, and every share read over them, are the ranks' own records'. The ranks'
    steps end up to 4 ms apart, as a real job's do; without the ranks' ends the job's windows (the
    slowest rank's end) give other shares."""
    recs, steps = synthetic_job()
    rng = random.Random(5)
    own = [dataclasses.replace(s, end_time=(s.end_time or 0.0) + rng.random() * 0.004) for s in steps]
    by_it: dict[int, dict[int, list[StepRecord]]] = {}
    for s in own:
        by_it.setdefault(s.iteration, {}).setdefault((s.rank if isinstance(s.rank, int) else 0) // PER_NODE,
                                                     []).append(s)
    # per node, then the nodes' folds in a shuffled order and grouping, as the shards and the root do
    folded = []
    for _, nodes in sorted(by_it.items()):
        node_folds = [fold_ranks(rs) for rs in nodes.values()]
        rng.shuffle(node_folds)
        folded.append(fold_ranks([fold_ranks(node_folds[:3]), fold_ranks(node_folds[3:])]))
    assert all(sorted(f.rank_end_times) == list(range(WORLD)) for f in folded)
    kw = {"layout": LAYOUT, "rank_nodes": RANK_NODES, "gpu_name": "NVIDIA H200"}
    want = _raw_json("j", recs, own, **kw)
    assert _raw_json("j", recs, folded, **kw) == want
    assert _json(_split_merge("j", recs, rng, 7), folded, **kw) == want
    # the case the ends are for: the job's windows alone read another share
    bare = [dataclasses.replace(f, rank_end_times={}) for f in folded]
    assert _raw_json("j", recs, bare, **kw) != want
    a = json.loads(want)
    assert a["method"]["name"] == "step_windows" and len(a["iterations"]) == ITERATIONS - 1


@pytest.mark.slow
def test_a_bounded_merge_keeps_each_ranks_newest_operations_whatever_the_order() -> None:
    recs, steps = synthetic_job()
    keep = 3 * (TP_OPS + 2)  # the last three iterations
    newest = [r for r in recs if (r.time_created_ns or 0) >= min(
        (x.time_created_ns or 0) for x in recs if x.rank == r.rank and x.collective_seq_id is not None
        and x.pg_id == 10 + (r.rank or 0) // PER_NODE and x.collective_seq_id >= (ITERATIONS - 2) * TP_OPS)]
    rng = random.Random(3)
    for retention in (Retention(per_rank=keep), Retention(per_job=keep * WORLD + WORLD - 1),
                      Retention(per_rank=keep + 5, per_job=keep * WORLD)):
        got = [_split_merge("j", recs, rng, n, retention) for n in (1, 4, 17)]
        assert got[0] == got[1] == got[2] == reduce("j", newest), retention
        assert all(len(g) == keep * WORLD for g in got)
        # What each node's agent sends (bounded for the job's world, which its rows show): the same.
        sent = [for_sending(reduce("j", [r for r in recs if (r.rank or 0) // PER_NODE == n]), retention)
                for n in range(NODES)]
        assert merge_all("j", sent, retention) == got[0], retention
        assert max(len(p) for p in sent) == keep * PER_NODE
    assert _json(got[1], steps, layout=LAYOUT) == _raw_json("j", newest, steps, layout=LAYOUT)


def test_the_recorded_h200_dumps_through_partials_give_the_one_aggregator_answer() -> None:
    for mode in ("timing", "normal", "batch_p2p", "hang"):
        recs = load_fixture_records(mode)
        want = _raw_json("j", recs, ())
        per_rank = [reduce("j", [r for r in recs if r.rank == rank]) for rank in (1, 0)]
        assert _json(merge_all("j", per_rank), ()) == want, mode
        assert _json(_split_merge("j", recs, random.Random(5), 6), ()) == want, mode


# ---- the join laws, over partials of arbitrary operations ----------------------------------------------

_STATES = st.sampled_from([None, "scheduled", "started", "completed"])


@st.composite
def _records(draw: st.DrawFn) -> list[CollectiveRecord]:
    """Operations of 4 ranks on 2 groups; an op (rank, group, seq) may come twice, in another state
    or with another duration (two dumps), with its own enqueue time."""
    n = draw(st.integers(0, 24))
    out = []
    for _ in range(n):
        rank, pg, seq = draw(st.integers(0, 3)), draw(st.integers(0, 1)), draw(st.integers(0, 5))
        dur = draw(st.one_of(st.none(), st.floats(0.01, 50.0)))
        rec = fr(rank, seq, 10.0 * seq + rank + 100 * pg, dur, pg=pg, ranks=[0, 1, 2, 3],
                 state=draw(_STATES) or "completed", p2p=draw(st.booleans()) and pg == 1)
        if draw(st.booleans()):
            rec = dataclasses.replace(rec, state=None)
        out.append(rec)
    return out


def _partial(recs: list[CollectiveRecord], bound: Retention | None) -> CollectivePartial:
    return reduce("j", recs, bound)


_RETENTIONS = st.one_of(st.none(), st.builds(Retention, st.one_of(st.none(), st.integers(1, 6)),
                                             st.one_of(st.none(), st.integers(1, 30))))


@pytest.mark.slow
@settings(max_examples=200)
@given(_records(), _records(), _records(), _RETENTIONS)
def test_merge_is_a_join(ra: list[CollectiveRecord], rb: list[CollectiveRecord], rc: list[CollectiveRecord],
                         bound: Retention | None) -> None:
    a, b, c = (_partial(r, bound) for r in (ra, rb, rc))
    assert merge(a, b, bound) == merge(b, a, bound)
    assert merge(merge(a, b, bound), c, bound) == merge(a, merge(b, c, bound), bound)
    assert merge(a, a, bound) == a
    # in place as the store merges: the same
    acc = _partial([], bound)
    for p in (c, a, b, a):
        acc.absorb(p, bound)
    assert acc == merge(merge(a, b, bound), c, bound)
    # and reducing in pieces is reducing at once
    assert merge(a, b, bound) == _partial(ra + rb, bound) == _partial(rb + ra, bound)
    # the analysis reads the set, not the order it came in
    assert _json(merge(a, b, bound), ()) == _json(merge(b, a, bound), ())


def test_a_resolved_hang_stays_resolved_when_the_retention_lets_its_rows_go() -> None:
    """Rank 0 hung at all-reduce #5 of group 0, then completed it and went on to group 1: a partial
    that keeps each rank's newest operation (on group 1) still knows rank 0 got past #5 of group 0."""
    from tests.collectives.test_collectives_aggregator import _hang_event

    recs = [fr(0, s, 10.0 * s, 1.0) for s in range(7)] + [fr(0, s, 100.0 + s, 1.0, pg=1) for s in range(3)]
    hang = [_hang_event("a", 1.0, "0", not_joined="1")]
    keep = Retention(per_rank=1)
    whole = finish(reduce("j", recs), (), hang_events=hang)
    (h,) = whole.hangs
    assert h.resolved and not whole.active_hangs
    parts = [reduce("j", recs[:4], keep), reduce("j", recs[4:7], keep), reduce("j", recs[7:], keep)]
    kept = merge_all("j", parts, keep)
    assert len(kept) == 1 and next(iter(kept.ops.values())).pg_id == 1  # group 0's rows are gone
    (h,) = finish(kept, (), hang_events=hang).hangs
    assert h.resolved, hang_text(h)


_G = GroupRef("pg0", None, None, None)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 5)), st.one_of(st.none(), st.integers(0, 9)),
                          st.booleans()), max_size=30, unique_by=lambda x: (x[1], x[2])),
       st.one_of(st.none(), st.integers(0, 31)))
def test_a_streams_bound_keeps_its_newest_rows_in_the_enqueue_order(items: list[tuple[int | None, int | None,
                                                                                       bool]],
                                                                    k: int | None) -> None:
    """The bound lets go of the oldest rows by the whole enqueue order (time, untimed first, then the
    key), ties at the cut's time included, as a sort of every row by that order does."""
    rows: dict[OpKey, OpRow] = {("fr", 0, 1, seq, p2p): OpRow("fr", "allreduce", _G, 0, 1, time_created_ns=t)
                                for t, seq, p2p in items}
    ordered = sorted(rows.items(), key=collfold._enqueue_order)
    want = dict(rows) if k is None else dict(ordered[-k:] if k else [])
    got = dict(rows)
    assert collfold._bound_stream(got, k) == len(rows) - len(want)
    assert got == want

"""The engine's fold (perfd.core.stepfold, perfd.engine.partial, perfd.engine.rootfold.RootFold) on real
recorded clocks: any grouping, any order, any number of deliveries gives the one-aggregator fold;
the wire form round-trips; malformed input is refused with a reason."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfd.core.model import StepRecord
from perfd.core.stepfold import RUN_FIELD, fold_ranks
from perfd.engine.partial import Partial, RunMarks, decode, encode, from_pb, partials_of
from perfd.engine.rootfold import IDLE_FORGET_S, RootFold
from perfd.transport.gen import perfd_pb2 as pb
from tests.engine.records import job_records

NODES = 4
BY_NODE = job_records("j", NODES, 3)
RANKS = [r for n in range(NODES) for r in BY_NODE[n][0]]  # iteration 1, 32 ranks
T_END = max(r.end_time or 0.0 for n in range(NODES) for its in BY_NODE[n] for r in its)


def _grouped(recs: list[StepRecord], cuts: list[int], order: list[int]) -> list[Partial]:
    """``recs`` in ``order``, cut into groups at ``cuts``, each group one node's Partial."""
    shuffled = [recs[i] for i in order]
    bounds = sorted({0, len(shuffled), *[c % (len(shuffled) + 1) for c in cuts]})
    return [partials_of(shuffled[a:b], f"m{a}")[0] for a, b in itertools.pairwise(bounds) if b > a]


@settings(max_examples=60)
@given(st.lists(st.integers(0, 64), max_size=6), st.randoms(use_true_random=False), st.integers(0, 3))
def test_any_grouping_order_and_redelivery_folds_to_the_single_aggregators_record(cuts, rnd, again):
    order = list(range(len(RANKS)))
    rnd.shuffle(order)
    parts = _grouped(RANKS, cuts, order)
    parts += [parts[rnd.randrange(len(parts))] for _ in range(again)]  # delivered more than once
    acc = Partial("j", 1)
    for p in parts:
        acc.merge(p)
    assert acc.fold == fold_ranks(RANKS)  # what the aggregator folds from the ranks' own records
    assert acc.ranks == {r.rank for r in RANKS}


def test_the_fold_is_the_slowest_rank_with_every_ranks_timers_in_rank_order():
    f = fold_ranks(list(reversed(RANKS)))
    # Ranks 3 and 8 play the same recording: a tie, broken by the source, not by arrival order.
    slow = max(RANKS, key=lambda r: (r.step_time_ms or 0, r.source.detail if r.source else ""))
    assert slow.source is not None and slow.source.detail == "rank8:pid4008"
    assert f.rank == "all" and f.step_time_ms == slow.step_time_ms and f.source == slow.source
    for tv in f.timers.values():
        assert list(tv.per_rank) == sorted(tv.per_rank) == list(range(NODES * 8))
        assert tv.min_ms == min(tv.per_rank.values()) and tv.max_ms == max(tv.per_rank.values())
    assert f.end_time == max(r.end_time or 0 for r in RANKS)


def test_a_partial_round_trips_through_its_wire_form():
    p = partials_of(RANKS[:8], "agent:e:1")[0]
    p.job_level["last"] = StepRecord(job="j", iteration=1, rank="last", step_time_ms=5.0)
    d = decode(encode("agent:e:1", "agent", 7, [p], {"j": '{"framework": "megatron"}'}))
    assert (d.id, d.sender, d.created_ns, d.job_info_json) == ("agent:e:1", "agent", 7,
                                                               {"j": '{"framework": "megatron"}'})
    (q,) = d.partials
    assert (q.job, q.iteration, q.ranks, q.messages) == ("j", 1, set(range(8)), {"agent:e:1"})
    assert q.fold is not None and p.fold is not None
    assert q.fold.step_time_ms == p.fold.step_time_ms and q.fold.timers == p.fold.timers
    # each rank's own end, for the communication share's per-rank windows
    assert q.fold.rank_end_times == p.fold.rank_end_times == {r.rank: r.end_time for r in RANKS[:8]}
    assert q.job_level["last"].step_time_ms == 5.0 and not q.new_run
    (r,) = decode(encode("agent:e:2", "agent", 7, partials_of(RANKS[:8], "agent:e:2", {("j", 1)}))).partials
    assert r.new_run


def _odd_ranks(m: pb.Partial) -> None:
    m.ranks_le = b"\x01\x02\x03"


def _fold_of_another_job(m: pb.Partial) -> None:
    m.fold.job = "other"


def _job_level_of_a_rank(m: pb.Partial) -> None:
    m.job_level.add().rank = 3


@pytest.mark.parametrize("make, why", [(_odd_ranks, "whole uint32"), (_fold_of_another_job, "another job"),
                                       (_job_level_of_a_rank, "a rank")])
def test_a_malformed_partial_is_refused_with_its_reason(make, why):
    m = pb.Partial(job="j", iteration=1)
    m.fold.job, m.fold.iteration = "j", 1
    make(m)
    with pytest.raises(ValueError, match=why):
        from_pb(m)
    with pytest.raises(ValueError):
        decode(b"\xff\xff\xff not protobuf")


class _Store:
    def __init__(self) -> None:
        self.folds: dict[int, StepRecord] = {}

    def held(self, job: str, it: int) -> StepRecord | None:
        return self.folds.get(it)


def test_the_root_counts_redeliveries_completes_iterations_and_folds_a_late_partial_with_the_store():
    rf, store = RootFold(keep=2), _Store()
    rnd = random.Random(3)
    for it in (1, 2, 3):
        parts = [partials_of(BY_NODE[n][it - 1], f"n{n}:{it}")[0] for n in range(NODES)]
        rnd.shuffle(parts)
        out, _ = rf.add(parts + parts[:1], store.held, now=0.0)  # one node message twice
        (fold,) = [r for r in out if r.rank == "all"]
        store.folds[it] = fold
    assert rf.stats.redelivered == 3 and rf.stats.node_messages == 3 * NODES
    # Iteration 1 became whole while it was all the job had shown (no world to hold it to): not
    # counted; 2 and 3 were held to the 32 ranks seen. keep=2: iteration 1 left memory.
    assert rf.stats.complete == 2 and sorted(rf.jobs["j"]) == [2, 3]
    # A node's message of iteration 1 arrives again, late: folded with what the store holds, not alone.
    out, _ = rf.add([partials_of(BY_NODE[0][0], "n0:1")[0]], store.held, now=0.0)
    (fold,) = out
    assert fold == store.folds[1] == fold_ranks([r for n in range(NODES) for r in BY_NODE[n][0]])
    # ... and counted as what it is, a redelivery: no message, iteration or lag counted again.
    assert rf.stats.late == 1 and rf.stats.redelivered == 4 and rf.stats.node_messages == 3 * NODES
    assert rf.stats.complete == 2 and len(rf.stats.lag_s) == 2


def test_a_partial_that_comes_after_its_iteration_left_memory_completes_it_once():
    """A shard's partial delayed past the root's memory (a killed shard's partitions, redelivered
    after the lease and the ack wait): its ranks and messages still count once, and the iteration
    it makes whole is counted whole then, with the lag it really had."""
    rf, store = RootFold(keep=1), _Store()
    for it in (1, 2, 3):
        nodes = range(NODES) if it != 2 else range(1, NODES)  # node 0's message of 2 is delayed
        parts = [partials_of(BY_NODE[n][it - 1], f"n{n}:{it}")[0] for n in nodes]
        out, _ = rf.add(parts, store.held, now=T_END + it)
        store.folds[it] = next(r for r in out if r.rank == "all")
    assert sorted(rf.jobs["j"]) == [3] and rf.stats.complete == 1  # 3; 2 left memory short of node 0
    late = partials_of(BY_NODE[0][1], "n0:2")[0]
    for _ in range(2):  # and once more, redelivered
        out, _ = rf.add([late], store.held, now=T_END + 40.0)
        (fold,) = out
        assert fold == fold_ranks([r for n in range(NODES) for r in BY_NODE[n][1]])
        store.folds[2] = fold
    assert rf.stats.late == 2 and rf.stats.redelivered == 1 and rf.stats.node_messages == 3 * NODES
    assert fold.end_time is not None and rf.stats.complete == 2
    assert sorted(rf.stats.lag_s)[-1] == pytest.approx(T_END + 40.0 - fold.end_time)
    assert sorted(rf.jobs["j"]) == [3]  # it did not come back into memory


def test_an_iteration_is_whole_only_once_the_world_its_job_info_names_is_in():
    """Before every partition's shard has flushed, the job's first iterations reach the root from some
    nodes only. Held to the ranks shown so far, iteration 2 of those nodes alone read whole (its lag
    understated, then handed on again as the rest came); held to the world the job's info names, it is
    whole once every node is in, and so is iteration 1."""
    rf, store = RootFold(), _Store()
    rf.note_world("j", NODES * 8)
    early = range(NODES // 2)  # one shard's nodes flushed; the other's not yet
    for it in (1, 2):
        rf.add([partials_of(BY_NODE[n][it - 1], f"n{n}:{it}")[0] for n in early], store.held, now=T_END + it)
    assert rf.stats.complete == 0 and not rf.stats.lag_s
    for it in (1, 2):
        rf.add([partials_of(BY_NODE[n][it - 1], f"n{n}:{it}")[0] for n in range(NODES // 2, NODES)],
               store.held, now=T_END + 5.0)
    assert rf.stats.complete == 2  # both, the first included: the info named the world
    assert all(lag >= 5.0 for lag in rf.stats.lag_s), rf.stats.lag_s
    # An info that names fewer ranks than the job shows is not believed: the ranks shown hold it.
    small = RootFold()
    small.note_world("j", 8)
    small.add([partials_of(BY_NODE[n][0], f"n{n}:1")[0] for n in range(NODES)], store.held, now=T_END)
    assert small.stats.complete == 0  # its first iteration: nothing yet to hold it to
    small.add([partials_of(BY_NODE[0][1], "n0:2")[0]], store.held, now=T_END)
    assert small.world("j") == NODES * 8 and small.stats.complete == 0
    small.add([partials_of(BY_NODE[n][1], f"n{n}:2")[0] for n in range(1, NODES)], store.held, now=T_END)
    assert small.stats.complete == 1


def test_a_node_marks_where_its_ranks_processes_changed_and_the_root_counts_that_restart_once():
    marks = RunMarks()
    assert marks.new_runs(BY_NODE[0][0]) == set()  # first seen: nothing to compare with
    assert marks.new_runs(BY_NODE[0][1]) == set()  # the same processes
    moved = [dataclasses.replace(r, iteration=1, fields={**r.fields, "pid": "9" + r.fields["pid"]})
             for r in BY_NODE[0][2]]
    assert marks.new_runs(moved) == {("j", 1)}
    # The root: iterations 1-3 of the first run; then, in one batch, node 1's last message of the old
    # run's iteration 3 and every node's iteration 1 of the new run, each marked.
    rf, store = RootFold(), _Store()
    for it in (1, 2):
        out, _ = rf.add([partials_of(BY_NODE[n][it - 1], f"n{n}:{it}")[0] for n in range(NODES)], store.held)
        store.folds[it] = next(r for r in out if r.rank == "all")
    old = partials_of(BY_NODE[1][2], "n1:3")[0]
    new = [partials_of(BY_NODE[n][0], f"n{n}:r2:1", {("j", 1)})[0] for n in range(NODES)]
    assert all(p.new_run for p in new) and not old.new_run
    out, _ = rf.add([old, *new], store.held)
    folds = [r for r in out if r.rank == "all"]
    # The old run's fold goes first and unmarked; the new run's iteration 1 is not folded with the
    # store's (the old run's iteration 1) and carries the run the store reads.
    assert [(r.iteration, r.fields.get(RUN_FIELD)) for r in folds] == [(3, None), (1, "2")]
    assert folds[1] == dataclasses.replace(fold_ranks([r for n in range(NODES) for r in BY_NODE[n][0]]),
                                           fields={**folds[1].fields})
    assert rf.stats.new_runs == 1 and rf.runs["j"] == (2, 1)
    # A redelivered mark of the same restart is not another.
    rf.add([partials_of(BY_NODE[2][0], "n2:r2:1b", {("j", 1)})[0]], store.held)
    assert rf.stats.new_runs == 1


def test_partials_go_in_as_few_messages_as_fit_the_engines_largest_and_each_once():
    """A shard's flush (perfd.engine.shard): the job's partials spread over messages under the byte
    bound, each partial in exactly one, the job info in the first, every message its own id; a
    partial that alone is over the bound is refused, not sent to be refused by the engine."""
    from perfd.engine.partial import encode_batches

    parts = [partials_of(BY_NODE[n][0], f"m{n}")[0] for n in range(NODES)]
    one = len(encode("x", "s", 0, parts[:1]))
    ids = iter(f"b{k}" for k in itertools.count())
    out = encode_batches(lambda: next(ids), "s", 7, parts, {"j": "{}"}, max_bytes=2 * one + 300)
    assert len(out) == 2 and all(len(data) <= 2 * one + 300 for _, data in out)
    got = [decode(data) for _, data in out]
    assert [d.id for d in got] == [bid for bid, _ in out] == ["b0", "b1"]
    assert [d.job_info_json for d in got] == [{"j": "{}"}, {}]
    assert sorted(m for d in got for p in d.partials for m in p.messages) == [f"m{n}" for n in range(NODES)]
    assert encode_batches(lambda: "only", "s", 7, [], {"j": "{}"}, max_bytes=10_000)[0][0] == "only"
    assert encode_batches(lambda: "none", "s", 7, [], None, max_bytes=10_000) == []
    with pytest.raises(ValueError, match="over the"):
        encode_batches(lambda: "x", "s", 7, parts, None, max_bytes=one // 2)


def test_a_job_silent_long_enough_leaves_the_roots_memory_and_comes_back_from_the_store():
    rf, store = RootFold(), _Store()
    out, _ = rf.add([partials_of(BY_NODE[n][0], f"n{n}:1")[0] for n in range(2)], store.held, now=T_END)
    store.folds[1] = next(r for r in out if r.rank == "all")
    rf.runs["j"] = (2, 1)  # a run it had counted: kept
    other = partials_of([replace_job(r, "other") for r in BY_NODE[0][0]], "o:1")[0]
    rf.add([other], store.held, now=T_END + IDLE_FORGET_S + 1)
    assert "j" not in rf.jobs and "j" not in rf.ranks and rf.stats.jobs_forgotten == 1 and "other" in rf.jobs
    assert rf.runs["j"] == (2, 1)
    # Its other nodes' partials of iteration 1, after all: folded with what the store holds.
    out, _ = rf.add([partials_of(BY_NODE[n][0], f"n{n}:1")[0] for n in range(2, NODES)], store.held,
                    now=T_END + IDLE_FORGET_S + 2)
    (fold,) = [r for r in out if r.rank == "all"]
    assert dataclasses.replace(fold, fields={}) == dataclasses.replace(fold_ranks(RANKS), fields={})
    assert fold.fields.get(RUN_FIELD) == "2"


def replace_job(r: StepRecord, job: str) -> StepRecord:
    return dataclasses.replace(r, job=job)


def test_an_iteration_goes_to_the_store_when_whole_and_at_most_once_a_second_before(
        monkeypatch: pytest.MonkeyPatch):
    """A fold's record copies its per-rank maps: the root hands an iteration to the store on its first
    partial, then at most every HAND_ON_S while it is not whole, at once when it is, and what it held
    back when a flush is due, when the iteration leaves memory, or (every) when the root stops."""
    from perfd.engine import rootfold
    from perfd.engine.rootfold import HAND_ON_S

    monkeypatch.setattr(rootfold, "HAND_ON_MIN_RANKS", 1)  # as a job of 4,096 ranks and more is
    rf, by_node = RootFold(keep=2), job_records("j", NODES, 6)
    out, _ = rf.add([partials_of(by_node[n][0], f"n{n}:1")[0] for n in range(NODES)], now=0.0)
    assert [r.iteration for r in out] == [1]  # the first iteration, whole on arrival: its world

    def add(node: int, it: int, now: float) -> list[int]:
        got, _ = rf.add([partials_of(by_node[node][it - 1], f"n{node}:{it}")[0]], now=now)
        return [r.iteration for r in got]

    assert add(0, 2, 1.0) == [2]  # first seen
    assert add(1, 2, 1.1) == [] and add(2, 2, 1.2) == []  # held back: handed 0.1 and 0.2 s ago
    assert rf.flush(1.5) == []
    (fold,) = rf.flush(1.0 + HAND_ON_S)  # due: what nodes 0-2 folded
    assert fold.iteration == 2 and len(fold.rank_end_times) == 3 * 8
    assert add(3, 2, 2.1) == [2] and rf.stats.complete == 1  # whole: at once, counted once
    assert add(0, 3, 3.0) == [3] and add(1, 3, 3.1) == []
    assert [r.iteration for r in rf.flush(3.2, every=True)] == [3]  # the root stops leading
    assert add(2, 3, 3.3) == []
    # Iteration 4's first partial goes at once, and what 3 held back before it: a rank's ends reach the
    # store in the order of its iterations.
    assert add(0, 4, 3.4) == [3, 4]
    assert add(1, 4, 3.5) == []  # held back, and gone before 5's first partial
    assert add(0, 5, 3.6) == [4, 5]
    assert add(0, 6, 3.7) == [6]  # nothing held back: 6 alone
    assert rf.flush(10.0) == []  # nothing folded into 5 or 6 since they went


def test_a_small_jobs_iteration_goes_to_the_store_on_every_partial():
    """Below HAND_ON_MIN_RANKS a fold's record is cheap: every partial hands it on, as one aggregator
    gets the ranks' records."""
    rf, by_node = RootFold(), job_records("j", NODES, 2)
    rf.add([partials_of(by_node[n][0], f"n{n}:1")[0] for n in range(NODES)], now=0.0)
    for n in range(NODES - 1):
        out, _ = rf.add([partials_of(by_node[n][1], f"n{n}:2")[0]], now=1.0 + n / 100)
        assert [r.iteration for r in out] == [2]
    assert rf.stats.held_back == 0


def test_a_logs_record_goes_to_the_store_at_once_and_in_the_order_it_came(monkeypatch: pytest.MonkeyPatch):
    """A job's log record (Megatron-LM's ``last``) is not held back with its iteration's fold: a run's
    first record reaching the store after later ones would end the run they belong to (seen: the root
    handed iteration 1's after 12-20's, and the store closed the run of 12-20)."""
    from perfd.engine import rootfold

    monkeypatch.setattr(rootfold, "HAND_ON_MIN_RANKS", 1)
    rf, by_node = RootFold(), job_records("j", NODES, 3)
    rf.add([partials_of(by_node[n][0], f"n{n}:1")[0] for n in range(NODES)], now=0.0)
    assert [r.iteration for r in rf.add([partials_of(by_node[0][1], "n0:2")[0]], now=1.0)[0]] == [2]
    logged = dataclasses.replace(by_node[1][1][0], rank="last", timers={}, source=None)
    p = partials_of([logged, *by_node[1][1]], "n1:2")[0]
    out, _ = rf.add([p], now=1.1)  # 0.1 s after iteration 2 went: held back, but for its log record
    assert sorted(str(r.rank) for r in out) == ["all", "last"] and {r.iteration for r in out} == {2}
    assert rf.flush(5.0) == []


def test_the_root_holds_a_job_to_the_world_its_info_names():
    """The root reads the world from the job info a node sends (through the partials stream, as the
    shards pass it on) and holds the job's iterations to it; an info that does not decode names none."""
    from perfd.aggregator.engine_sink import EngineSink
    from perfd.aggregator.guard import Guard
    from perfd.aggregator.state import AggregatorState
    from perfd.core.jobinfo_json import job_info_to_json
    from perfd.core.limits import Limits
    from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ParallelLayout
    from perfd.core.refusals import Refusals
    from perfd.engine import subjects as S
    from perfd.engine.root import Root

    sink = EngineSink(AggregatorState(), Guard(Limits(), Refusals()))
    root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), sink, "root-a")
    info = JobInfo(framework=HOOK_FRAMEWORK, layout=ParallelLayout(world_size=NODES * 8))
    root.handle([encode("i", "node-0", 0, (), {"j": job_info_to_json(info)}),
                 encode("x", "node-1", 0, (), {"k": "{"})])
    assert root.fold.world("j") == NODES * 8 and root.stats.undecodable == 1

    def nodes(ns: range) -> list[bytes]:
        return [encode(f"n{n}:1", f"node-{n}", 0, partials_of(BY_NODE[n][0], f"n{n}:1")) for n in ns]

    root.handle(nodes(range(2)))
    assert root.stats.complete == 0
    root.handle(nodes(range(2, NODES)))
    assert root.stats.complete == 1

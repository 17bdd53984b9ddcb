"""A node's collective records reduced (perfd.core.collfold) on the engine's wire
(perfd.engine.collective_codec): read back equal, malformed ones refused, what a row costs, and the
root reading a reduced message, an older agent's records as sent, and a redelivery, into the same
analysis one aggregator gives."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.state import AggregatorState
from perfd.core.collfold import CollectivePartial, reduce
from perfd.core.model import CollectiveRecord
from perfd.engine import collective_codec as cc
from perfd.engine import subjects as S
from perfd.engine.partial import decode, encode
from perfd.engine.root import Root
from perfd.report.collective_text import collectives_json
from perfd.transport.codec import encode_batch
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.series import SeriesTable
from tests.collectives.collective_helpers import load_fixture_records
from tests.collectives.test_collective_partial import PER_NODE, synthetic_job


def _wire(p: CollectivePartial) -> pb.CollectivePartial:
    m = pb.CollectivePartial()
    cc.to_pb(p, m)
    return m


def _inspector_like() -> list[CollectiveRecord]:
    """What the Inspector sends (no global rank or process-group uid; host, pid, communicator), and
    values the Flight Recorder never has: a duration that is no float32, a negative-going clock."""
    base = CollectiveRecord(job="j", source="nccl_inspector", op="all_reduce", comm_id="0x7f8c496ae9f661",
                            group_rank=3, group_size=8, nnodes=2, collective_seq_id=11, bytes=1 << 30,
                            time_completed_ns=5, busbw_gbs=123.456, host="gpu-a", pid=4242,
                            timing_source="kernel_gpu", duration_ms=0.1)
    return [base, dataclasses.replace(base, collective_seq_id=12, duration_ms=None, busbw_gbs=None,
                                      host=None, time_created_ns=2_000),
            dataclasses.replace(base, collective_seq_id=13, time_created_ns=1_000, op="send", is_p2p=True,
                                p2p_seq_id=4, peer=1, pg_name="p2p", comm_id=None)]


@pytest.mark.parametrize("mode", ["timing", "normal", "batch_p2p", "hang"])
def test_a_partial_reads_back_equal(mode: str) -> None:
    p = reduce("j", load_fixture_records(mode))
    assert cc.from_pb(_wire(p)) == p and len(p) > 0


def test_synthetic_and_inspector_rows_read_back_equal() -> None:
    recs, _ = synthetic_job()
    for p in (reduce("j", recs), reduce("j", _inspector_like()), reduce("j", [])):
        m = pb.CollectivePartial()
        m.ParseFromString(_wire(p).SerializeToString())
        assert cc.from_pb(m) == p


def test_a_malformed_partial_is_refused() -> None:
    good = _wire(reduce("j", load_fixture_records("timing")))

    def broken(change: str) -> pb.CollectivePartial:
        m = pb.CollectivePartial()
        m.CopyFrom(good)
        if change == "short_row_column":
            del m.op[-1]
        elif change == "short_nullable_column":
            del m.collective_seq_id[-1]
        elif change == "long_nullable_column":
            m.busbw_gbs.append(1.0)
        elif change == "string_index":
            m.op[0] = len(m.strings) + 5
        elif change == "group_index":
            m.group[0] = len(m.groups)
        elif change == "ranks":
            m.groups[0].ranks_runs.append(1)
        elif change == "ranks_count":
            m.groups[0].ranks_runs[2] = 0
        elif change == "ranks_huge":
            m.groups[0].ranks_runs[2] = 1 << 40
        elif change == "no_source":
            m.source[0] = 0
        return m

    for change in ("short_row_column", "short_nullable_column", "long_nullable_column", "string_index",
                   "group_index", "ranks", "ranks_count", "ranks_huge", "no_source"):
        with pytest.raises(ValueError):
            cc.from_pb(broken(change))


@pytest.mark.parametrize("ranks", [[], [5], list(range(100_000)), list(range(3, 100_000, 8)),
                                   [7, 3, 3, 9, 1, 2], [0, 1, 2, 3, 8, 9, 10, 11, -4]])
def test_group_ranks_go_as_runs(ranks: list[int]) -> None:
    runs = cc.runs_of(ranks)
    assert cc.ranks_of_runs(runs) == tuple(ranks)
    if len(ranks) > 2 and len(set(ranks)) == len(ranks) and ranks == sorted(ranks) and len(ranks) > 9:
        assert len(runs) == 3  # a world group or a data-parallel group is one run


def test_a_100k_rank_world_group_costs_a_few_bytes_and_one_object_at_the_root() -> None:
    world = list(range(100_000))
    recs = [dataclasses.replace(r, pg_ranks=world, group_size=len(world), rank=r.rank)
            for r in load_fixture_records("timing")]
    m = _wire(reduce("j", recs))
    assert all(len(g.ranks_runs) == 3 for g in m.groups) and m.ByteSize() < 12_000
    a, b = cc.from_pb(m), cc.from_pb(m)  # two messages naming the same groups: one object each
    assert a == b and len({id(row.group) for p in (a, b) for row in p.ops.values()}) == len(m.groups)


def test_what_a_row_costs_on_the_wire() -> None:
    """Measured: a timed Flight Recorder row is ~31 bytes (the synthetic job's node: 576 rows, 18,062
    bytes) to ~34 (the H200 dumps: 252 rows, 8,640 bytes, 8 of which a computed bus bandwidth), where
    the same records as sent cost ~122 and ~256 bytes each (encode_batch: their provenance, dtype,
    raw names and ranks lists)."""
    recs, _ = synthetic_job()
    for rs in ([r for r in recs if (r.rank or 0) < PER_NODE], load_fixture_records("timing")):
        reduced = _wire(reduce("j", rs)).ByteSize()
        raw = encode_batch("a", 1, (), (), (), SeriesTable(), collectives=rs).ByteSize()
        assert reduced / len(rs) < 36, reduced / len(rs)
        assert reduced < raw / 3, (reduced, raw)


def _analysis_json(state: AggregatorState) -> str:
    got = state.collective_analysis("j", force=True)
    assert got is not None
    return json.dumps(collectives_json(got), sort_keys=True)  # as served: findings worded


def test_the_root_reads_reduced_and_as_sent_records_into_the_one_aggregator_answer() -> None:
    recs = load_fixture_records("timing")
    single = AggregatorState()
    for rank in (0, 1):
        single.ingest_collectives(f"node-{rank}/j", [r for r in recs if r.rank == rank])
    want = _analysis_json(single)

    def messages(reduced_ranks: set[int]) -> list[bytes]:
        out = []
        for rank in (0, 1):
            rs = [r for r in recs if r.rank == rank]
            agent = f"node-{rank}/j"
            if rank in reduced_ranks:
                out.append(encode(f"{agent}:e:1", agent, 1, (), collectives=[reduce("j", rs)]))
            else:  # an agent from before: its records as sent
                batch = encode_batch(agent, 1, (), (), (), SeriesTable(), collectives=rs)
                out.append(encode(f"{agent}:e:1", agent, 1, (), records=batch))
        return out

    for reduced in ({0, 1}, {1}, set()):
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[]))
        root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), EngineSink(agg.state, agg.guard), "root-a")
        msgs = messages(reduced)
        assert [bool(decode(m).collectives) for m in msgs] == [r in reduced for r in (0, 1)]
        root.handle_records(msgs)
        assert root.stats.collectives == len(recs) and root.stats.collective_partials == len(reduced)
        assert _analysis_json(agg.state) == want, reduced
        root.handle_records(msgs)  # read again (a standby replaying the stream): held once
        assert _analysis_json(agg.state) == want, reduced
        assert agg.state.collectives.jobs["j"].rank_agent == {0: "node-0/j", 1: "node-1/j"}


def test_the_store_counts_what_its_retention_drops_and_what_came_again() -> None:
    from perfd.aggregator.collectives import CollectiveStore
    from perfd.core.collfold import Retention

    recs = load_fixture_records("timing")
    store = CollectiveStore(reduced_retention=Retention(per_rank=10))
    for rank in (0, 1):
        store.ingest_partial(f"node-{rank}/j", reduce("j", [r for r in recs if r.rank == rank]))
    store.ingest_partial("node-0/j", reduce("j", [r for r in recs if r.rank == 0]))  # again
    jc = store.jobs["j"]
    n0 = sum(1 for r in recs if r.rank == 0)
    assert jc.partial is not None and len(jc.partial) == 20 == jc.partial_rows
    # each rank's oldest, counted each time they are let go (rank 0's again: as the store of records
    # as sent counts a redelivered record it had dropped)
    assert store.dropped == jc.dropped == len(recs) - 20 + n0 - 10
    assert store.merged_again == 10  # rank 0's newest, held already
    assert jc.rank_agent == {0: "node-0/j", 1: "node-1/j"}
    # The rows the store counts as it merges (what the refresh reads, not walking every rank) are
    # those it holds, also where the job's bound shrinks every rank's share as ranks arrive
    shared = CollectiveStore(reduced_retention=Retention(per_job=15))
    for rank in (0, 1, 0):
        shared.ingest_partial(f"node-{rank}/j", reduce("j", [r for r in recs if r.rank == rank]))
        held = shared.jobs["j"]
        assert held.partial is not None and held.partial_rows == len(held.partial)
    assert shared.jobs["j"].partial_rows == 14  # 7 a rank


_OPT_INT = st.one_of(st.none(), st.integers(-(1 << 40), 1 << 62))
_OPT_FLOAT = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False),
                       st.floats(width=32, allow_nan=False, allow_infinity=False))
_OPT_STR = st.one_of(st.none(), st.text(max_size=8))


@st.composite
def _any_record(draw: st.DrawFn) -> CollectiveRecord:
    ranks = draw(st.one_of(st.none(), st.lists(st.integers(0, 1 << 20), max_size=40)))
    return CollectiveRecord(
        job="j", source=draw(st.sampled_from(["flight_recorder", "nccl_inspector"])),
        op=draw(st.text(min_size=1, max_size=6)), rank=draw(_OPT_INT), pg_id=draw(_OPT_INT),
        pg_name=draw(_OPT_STR), pg_desc=draw(_OPT_STR), comm_id=draw(_OPT_STR), pg_ranks=ranks or None,
        group_rank=draw(_OPT_INT), group_size=draw(_OPT_INT), nnodes=draw(_OPT_INT),
        collective_seq_id=draw(_OPT_INT), p2p_seq_id=draw(_OPT_INT), is_p2p=draw(st.booleans()),
        peer=draw(_OPT_INT), bytes=draw(_OPT_INT), state=draw(_OPT_STR), time_created_ns=draw(_OPT_INT),
        duration_ms=draw(_OPT_FLOAT), busbw_gbs=draw(_OPT_FLOAT), host=draw(_OPT_STR), pid=draw(_OPT_INT))


@pytest.mark.slow
@settings(max_examples=200)
@given(st.lists(_any_record(), max_size=12))
def test_any_rows_read_back_equal(recs: list[CollectiveRecord]) -> None:
    p = reduce("j", recs)
    m = pb.CollectivePartial()
    m.ParseFromString(_wire(p).SerializeToString())
    assert cc.from_pb(m) == p


def test_a_costly_analysis_is_made_again_no_sooner_than_ten_times_its_cost() -> None:
    from perfd.aggregator.collectives import CollectiveStore
    from perfd.core.limits import ANALYSIS_COST_FACTOR

    recs = load_fixture_records("timing")
    store = CollectiveStore(min_recompute_s=0.0)

    def inputs() -> Any:
        return [], None, {}, None

    store.ingest_partial("node-0/j", reduce("j", [r for r in recs if r.rank == 0]))
    first = store.analysis("j", (), inputs)
    assert first is not None and store.jobs["j"].analysis_cost > 0
    store.jobs["j"].analysis_cost = 60.0  # as if it took a minute
    store.ingest_partial("node-1/j", reduce("j", [r for r in recs if r.rank == 1]))
    assert store.analysis("j", (), inputs) is first  # changed, but not 10 minutes old
    again = store.analysis("j", (), inputs, force=True)  # the API's forced one is made
    assert again is not first and again is not None and again.n_records == len(recs)
    assert ANALYSIS_COST_FACTOR == 10


def test_a_stall_reads_each_ranks_newest_operation_from_what_came_reduced_as_from_records() -> None:
    from perfd.aggregator.collectives import CollectiveStore

    recs = load_fixture_records("timing")
    as_sent, reduced = CollectiveStore(), CollectiveStore()
    as_sent.ingest("node-0/j", recs)
    reduced.ingest_partial("node-0/j", reduce("j", recs))
    got = reduced.last_per_rank("j")[1]
    assert got == as_sent.last_per_rank("j")[1] and sorted(got) == [0, 1]
    assert got[0]["pg"] == "default_pg" and got[0]["source"] == "flight_recorder"


@st.composite
def _colliding(draw: st.DrawFn) -> CollectiveRecord:
    """Few identities, each field from a few values: two records of one operation often differ in
    one field only, any of them."""
    def pick(*vals: Any) -> Any:
        return draw(st.sampled_from(vals))

    return CollectiveRecord(
        job="j", source="flight_recorder", op=pick("all_reduce", "broadcast"), rank=pick(0, 1),
        pg_id=pick(0, 1), pg_name=pick("0", None), pg_desc=pick("default_pg", None),
        comm_id=pick(None, "0xa"), pg_ranks=pick(None, [0, 1]), group_rank=pick(None, 0, 1),
        group_size=pick(None, 2), nnodes=pick(None, 1), collective_seq_id=pick(0, 1, 2),
        p2p_seq_id=pick(None, 0, 1), peer=pick(None, 1), bytes=pick(None, 8),
        state=pick("completed", "started", None), time_created_ns=pick(0, 1, 2),
        duration_ms=pick(None, 1.0, 2.0), busbw_gbs=pick(None, 3.0), host=pick(None, "a", "b"),
        pid=pick(None, 1, 2))


@pytest.mark.slow
@settings(max_examples=200)
@given(*(st.lists(_colliding(), max_size=8) for _ in range(3)))
def test_merge_is_a_join_whatever_two_records_of_one_operation_differ_in(
        ra: list[CollectiveRecord], rb: list[CollectiveRecord], rc: list[CollectiveRecord]) -> None:
    from perfd.core.collfold import merge

    a, b, c = (reduce("j", r) for r in (ra, rb, rc))
    assert merge(a, b) == merge(b, a) and merge(a, a) == a
    assert merge(merge(a, b), c) == merge(a, merge(b, c)) == reduce("j", rc + rb + ra)

"""Collective records on the wire: round trips (absent stays absent), rank-list table, AgentClient
submit, and a real grpc.aio stream on loopback."""

from __future__ import annotations

import asyncio
import time
from dataclasses import fields

import pytest

from perfd.core.model import CollectiveRecord, Provenance
from perfd.transport import AgentClient, DecodedBatch, IngestServer
from perfd.transport.codec import decode_batch, encode_batch
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.series import SeriesTable

pytestmark = pytest.mark.timeout(60)


def _full() -> CollectiveRecord:
    return CollectiveRecord(
        job="llama", source="flight_recorder", op="all_reduce", rank=3, raw_op="nccl:all_reduce",
        pg_id=2, pg_name="2", pg_desc="DATA_PARALLEL_GROUP", comm_id="0x7f8c496ae9f661",
        pg_ranks=[1, 3, 5, 7], group_rank=1, group_size=4, nnodes=2, collective_seq_id=41,
        p2p_seq_id=9, is_p2p=False, peer=None, bytes=268_435_456, dtype="BFloat16", state="completed",
        time_created_ns=1_795_298_553_711_622_788, time_completed_ns=1_795_298_553_811_622_788,
        duration_ms=0.93, algbw_gbs=288.6, busbw_gbs=432.9, timing_source="kernel_gpu", host="gpu-7",
        pid=4242, provenance=Provenance("nccl", "flight_recorder:/run/fr/fr_dump_3"))


def _roundtrip(*recs: CollectiveRecord) -> tuple[pb.Batch, list[CollectiveRecord]]:
    b = encode_batch("a", 1, [], [], [], SeriesTable(), collectives=list(recs))
    wire = pb.Batch.FromString(b.SerializeToString())
    return wire, decode_batch(wire, {}).collectives


def test_full_collective_record_round_trips_exactly():
    rec = _full()
    _, (back,) = _roundtrip(rec)
    assert back == rec


def test_absent_fields_stay_none_never_zero():
    rec = CollectiveRecord(job="j", source="nccl_inspector", op="send", is_p2p=True)
    _, (back,) = _roundtrip(rec)
    assert back == rec
    for f in fields(CollectiveRecord):
        if f.name not in ("job", "source", "op", "is_p2p"):
            assert getattr(back, f.name) is None, f.name


def test_zero_values_are_kept_as_zero():
    rec = CollectiveRecord(job="j", source="flight_recorder", op="all_reduce", rank=0, pg_id=0,
                           collective_seq_id=0, bytes=0, duration_ms=0.0, peer=0, group_rank=0,
                           pg_ranks=[0], time_created_ns=0)
    _, (back,) = _roundtrip(rec)
    assert back == rec
    assert back.rank == 0 and back.duration_ms == 0.0 and back.bytes == 0 and back.pg_ranks == [0]


def test_rank_lists_are_sent_once_per_batch_and_shared_on_decode():
    big = list(range(0, 1024, 2))
    recs = [CollectiveRecord(job="j", source="flight_recorder", op="all_reduce", rank=r,
                             pg_ranks=list(big), collective_seq_id=s) for r in (0, 2) for s in range(50)]
    recs.append(CollectiveRecord(job="j", source="flight_recorder", op="all_reduce", rank=0, pg_ranks=[0, 1]))
    wire, back = _roundtrip(*recs)
    assert len(wire.rank_lists) == 2
    assert [r.pg_ranks for r in back] == [r.pg_ranks for r in recs]
    assert back[0].pg_ranks is back[99].pg_ranks  # one list object per distinct group
    assert len(wire.SerializeToString()) < 20_000  # 100 records of a 512-rank group


def test_unknown_rank_list_index_is_a_decode_error():
    b = pb.Batch(agent_id="a", seq=1)
    c = b.collectives.add(job="j", source="flight_recorder", op="all_reduce")
    c.pg_ranks_index = 3
    with pytest.raises(ValueError, match="rank list 3"):
        decode_batch(pb.Batch.FromString(b.SerializeToString()), {})


def test_the_index_one_past_the_rank_list_table_is_a_decode_error_and_the_last_one_decodes():
    b = pb.Batch(agent_id="a", seq=1)
    b.rank_lists.add().ranks.extend([0, 1])
    b.rank_lists.add().ranks.extend([2, 3])
    last = b.collectives.add(job="j", source="flight_recorder", op="all_reduce")
    last.pg_ranks_index = 1
    assert [r.pg_ranks for r in decode_batch(pb.Batch.FromString(b.SerializeToString()), {}).collectives] \
        == [[2, 3]]
    last.pg_ranks_index = 2
    with pytest.raises(ValueError, match="rank list 2; the batch has 2"):
        decode_batch(pb.Batch.FromString(b.SerializeToString()), {})


def test_batch_without_collectives_decodes_to_an_empty_list():
    b = encode_batch("a", 1, [], [], [{"kind": "x", "time_ns": 1}], SeriesTable())
    assert decode_batch(pb.Batch.FromString(b.SerializeToString()), {}).collectives == []


def test_agent_client_submit_spools_collectives_only_batches():
    c = AgentClient("127.0.0.1:1", "a1")
    assert c.submit() == 0
    seq = c.submit(collectives=[_full()])
    assert seq == 1
    (item,) = c.spool.pending()
    back = decode_batch(pb.Batch.FromString(item[1]), {})
    assert back.collectives == [_full()]
    c.close()


def test_collectives_cross_a_real_stream():
    got: list[DecodedBatch] = []

    async def body() -> None:
        srv = IngestServer(lambda agent, b: got.append(b))
        port = await srv.start("127.0.0.1", 0)
        c = AgentClient(f"127.0.0.1:{port}", "a1", node="n1", jobs=["llama"], backoff_initial_s=0.05)
        task = asyncio.create_task(c.run())
        try:
            c.submit(collectives=[_full(), CollectiveRecord(job="llama", source="flight_recorder",
                                                            op="barrier", rank=1)])
            deadline = time.monotonic() + 15
            while not got and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            c.close()
            await srv.stop(None)

    asyncio.run(asyncio.wait_for(body(), 40))
    assert got, "no batch arrived"
    assert got[0].collectives[0] == _full()
    assert got[0].collectives[1].rank == 1 and got[0].collectives[1].duration_ms is None

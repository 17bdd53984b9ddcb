"""Messages the engine lets go before the root reads them (the partials and records streams keep an
hour and a few GiB: perfd.engine.subjects) are counted and said, never silently missing: a root that
fell that far behind, or was away that long, lost them to the jobs' analysis. The events have a stream
of their own, which the collective records' volume never crowds out. Real nats-server: the records
stream made with a small byte limit, the root away while more than that is published."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.core import events as E
from perfd.core.collfold import reduce
from perfd.core.limits import Limits
from perfd.core.model import CollectiveRecord
from perfd.core.refusals import Refusals
from perfd.engine import subjects as S
from perfd.engine.connect import ensure_streams
from perfd.engine.natsd import NatsCluster
from perfd.engine.partial import encode
from perfd.engine.root import Root
from perfd.engine.rootfold import stream_gap
from perfd.transport.codec import encode_batch
from perfd.transport.series import SeriesTable
from tests.engine.test_natsd import _need_nats_server

JOB = "skipped"


def test_the_gap_is_the_sequence_numbers_a_read_did_not_get() -> None:
    assert stream_gap(0, [1, 2, 3]) == 0  # a first read starts at the stream's first message kept
    assert stream_gap(0, [40, 41]) == 0
    assert stream_gap(3, [4, 5, 6]) == 0
    assert stream_gap(3, [9, 10]) == 5  # 4-8 let go
    assert stream_gap(3, [4, 7, 8, 12]) == 2 + 3
    assert stream_gap(3, []) == 0


def _events_message(k: int) -> bytes:
    """A node's events message: an XID."""
    ev = {"kind": E.XID.name, "job": JOB, "severity": "critical", "text": f"XID 79 #{k}",
          "time": time.time(), "labels": {"node": "node-0", "gpu": "0"}, "payload": {"xid": 79, "gpu": 0}}
    batch = encode_batch("node-0", k, (), (), [ev], SeriesTable())
    return encode(f"node-0:ev:{k}", "node-0", k, (), records=batch)


def _records_message(k: int) -> bytes:
    """A node's records message: its ranks' operations, reduced (~1 KB)."""
    recs = [CollectiveRecord(job=JOB, source="flight_recorder", op="all_reduce", rank=r, pg_id=1, pg_name="1",
                             pg_desc="TENSOR_MODEL_PARALLEL_GROUP", pg_ranks=list(range(8)), group_rank=r,
                             group_size=8, collective_seq_id=k, bytes=16 << 20, state="completed",
                             time_created_ns=1_700_000_000_000_000_000 + k * 10**9, duration_ms=1.5)
            for r in range(8)]
    return encode(f"node-0:ops:{k}", "node-0", k, (), collectives=[reduce(JOB, recs)])


@pytest.mark.timeout(120)
def test_records_the_stream_let_go_while_the_root_was_away_are_counted_and_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _need_nats_server()
    size = len(_records_message(0))
    monkeypatch.setattr(S, "RECORDS_MAX_BYTES", 30 * size)  # the stream holds ~30 of them at most
    cluster = NatsCluster(tmp_path / "nats", 1)
    cluster.start()
    try:
        cfg = S.EngineConfig(tuple(cluster.urls))
        root = Root(cfg, EngineSink(AggregatorState(), Guard(Limits(), Refusals())), "root-a")

        async def publish(ks: range) -> int:
            """Publish records messages ``ks``; the records stream's first sequence kept after."""
            import nats

            nc = await nats.connect(list(cluster.urls))
            try:
                await ensure_streams(nc, cfg)  # as the root makes them (the small limit)
                js = nc.jetstream()
                for k in ks:
                    await js.publish(S.records_subject(JOB), _records_message(k),
                                     headers={"Nats-Msg-Id": str(k)})
                    if k % 10 == 0:  # an event now and then, on its own stream
                        await js.publish(S.events_subject(JOB), _events_message(k),
                                         headers={"Nats-Msg-Id": f"ev{k}"})
                info = await js.stream_info(S.RECORDS_STREAM)
                return int(info.state.first_seq)
            finally:
                await nc.close()

        async def lead_until(read: int) -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(root.run(stop))
            t0 = time.monotonic()
            while root.stats.node_records_messages < read and time.monotonic() - t0 < 60:
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.wait_for(task, 30)

        async def main() -> int:
            assert await publish(range(5)) == 1
            await lead_until(5)
            assert root.stats.records_skipped == 0, root.stats
            first = await publish(range(5, 105))  # the root away: the stream keeps the newest ~30
            await lead_until(5 + 105 - first + 1 + 11)  # and the 11 events messages
            return first

        with caplog.at_level(logging.WARNING, logger="perfd.engine"):
            first = asyncio.run(main())
        assert first > 6, first
        # every events message read, whatever the records stream let go: 0, 10, ..., 100
        assert root.stats.events == 11 and root.stats.events_skipped == 0, root.stats
        assert root.stats.node_records_messages == 5 + 105 - first + 1 + 11
        assert root.stats.records_skipped == first - 6  # 6 .. first-1: let go, never read
        assert root.stats.partials_skipped == 0
        said = [r.getMessage() for r in caplog.records if "let go by the engine" in r.getMessage()]
        assert len(said) == 1 and f"{first - 6} message(s) of the records stream" in said[0], said
    finally:
        cluster.stop()

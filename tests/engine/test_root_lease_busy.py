"""The root's lease held on its keeper's thread (perfd.engine.lease_keeper, as a shard's): real
nats-server, a shard and a root in process, each on its own event loop and thread as their commands run
them. A root whose store takes longer than the lease's TTL to take a fold in (its loop held past it)
still leads afterwards, without a break: with the renewal on the root's loop it lost the lease there
(a loaded run of the 8,000-rank same-answer test: "lease root: lost"). And a root whose lease is
taken from it stops leading, counts it, and leads again once the lease is free."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.core.limits import Limits
from perfd.core.model import StepRecord
from perfd.core.refusals import Refusals
from perfd.engine import subjects as S
from perfd.engine.connect import ensure_streams
from perfd.engine.root import Root
from perfd.engine.shard import Shard
from tests.engine.engine_driver import Plan, Rig, js_call, nc_call, rig_under
from tests.engine.test_shard_lease_busy import OwnLoop
from tests.procs import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# The leases' TTL here (the bucket made by the rig, the shard's and the root's keepers): half the
# engine's default, as in tests/engine/test_shard_lease_busy.py
TTL_S = 3.0
BLOCK_S = 1.5 * TTL_S  # the store's one slow take: the root's loop held past a lease's life
ITERATIONS = 6


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from rig_under(tmp_path, lease_ttl_s=TTL_S)


class _SlowSink(EngineSink):
    """The aggregator's sink, its first take of the root's records holding the loop BLOCK_S."""

    def __init__(self) -> None:
        super().__init__(AggregatorState(), Guard(Limits(), Refusals()))
        self.blocked = 0

    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord], now: float | None = None) -> object:
        if not self.blocked:
            self.blocked += 1
            time.sleep(BLOCK_S)  # the interpreter's lock held by turns, as a store's long take holds it
        return super().ingest_steps(agent_id, steps, now)


def _lease_holder(rig: Rig) -> tuple[str, int] | None:
    """The root lease's holder and revision now (None: free)."""
    async def get(js: object) -> tuple[str, int] | None:
        kv = await js.key_value(S.LEASES_BUCKET)  # type: ignore[attr-defined]
        try:
            e = await kv.get(S.ROOT_LEASE)
        except Exception:  # no such key, or deleted: free
            return None
        return (e.value.decode(), e.revision) if e.value else None
    return js_call(rig.urls, get)


def _leads_then_runs(rig: Rig, root: Root) -> tuple[OwnLoop, OwnLoop]:
    rig.start_cluster()
    nc_call(rig.urls, lambda nc: ensure_streams(nc, rig.cfg()))
    assert rig.cfg().lease_ttl_s == TTL_S
    shard = OwnLoop(Shard(rig.cfg(), "shard-a")).start()
    rt = OwnLoop(root).start()
    wait_for(lambda: root.stats.leader or rt.error is not None, 60, "the root leading")
    return shard, rt


def test_a_root_whose_store_holds_its_loop_past_the_lease_ttl_keeps_leading(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="perfd.engine")
    sink = _SlowSink()
    root = Root(rig.cfg(), sink, "root-a")
    shard, rt = _leads_then_runs(rig, root)
    try:
        held = _lease_holder(rig)
        assert held is not None and held[0] == "root-a"
        plan = Plan(nodes=2, iterations=ITERATIONS, period_s=0.5)
        load = rig.start_load(plan)
        try:
            load.finish(60)
        finally:
            load.close()
        total = 2 * ITERATIONS
        wait_for(lambda: root.stats.node_messages >= total or rt.error is not None, 90,
                 "every node message at the root")
        # whole: every iteration but perhaps the first (the job sends no info naming its world, so
        # the first is whole only where both nodes' messages came in one read: engine_driver's rule)
        wait_for(lambda: root.stats.complete >= ITERATIONS - 1 or rt.error is not None, 60,
                 "every iteration whole")
        after = _lease_holder(rig)
        stats = root.stats
        leading = stats.leader
    finally:
        rt.stop()
        shard.stop()
    assert rt.error is None and shard.error is None, (rt.error, shard.error)
    assert sink.blocked == 1  # the loop was held BLOCK_S, past the TTL
    # The lease renewed all along: the same holder, never let go (a lost one is counted, and taken
    # again by a create: the revision would then be a new key's, and the holder logged as leading twice)
    assert leading and stats.leadership_lost == 0
    said = [r.getMessage() for r in caplog.records if r.name == "perfd.engine"]
    assert sum("root-a: leads" in m for m in said) == 1, said
    assert not [m for m in said if "lost" in m], said
    assert after is not None and after[0] == "root-a" and after[1] > held[1]
    assert stats.node_messages == total and stats.redelivered == 0 and stats.late == 0


def test_a_root_whose_lease_is_taken_stops_leading_and_leads_again(rig: Rig) -> None:
    root = Root(rig.cfg(), _SlowSink(), "root-a")
    root.sink.blocked = 1  # type: ignore[attr-defined]  # no slow take here
    shard, rt = _leads_then_runs(rig, root)
    try:
        held = _lease_holder(rig)
        assert held is not None

        async def take(js: object) -> None:  # another holder's, for one update: the root's next renewal fails
            kv = await js.key_value(S.LEASES_BUCKET)  # type: ignore[attr-defined]
            await kv.update(S.ROOT_LEASE, b"root-b", last=held[1])
        js_call(rig.urls, take)
        wait_for(lambda: root.stats.leadership_lost >= 1 or rt.error is not None, 30, "the loss seen")
        # root-b never renews: its key expires with the TTL, and root-a takes the lease again
        wait_for(lambda: root.stats.leader or rt.error is not None, 30, "leading again")
        again = _lease_holder(rig)
        lost = root.stats.leadership_lost
    finally:
        rt.stop()
        shard.stop()
    assert rt.error is None and shard.error is None, (rt.error, shard.error)
    assert lost == 1
    assert again is not None and again[0] == "root-a"

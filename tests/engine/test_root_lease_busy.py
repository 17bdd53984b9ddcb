"""The root's lease held on its keeper's thread (perfd.engine.lease_keeper, as a shard's): real
nats-server, a shard and a root in process, each on its own event loop and thread as their commands run
them. A root whose store takes longer than the lease's TTL to take a fold in (its loop held past it)
still leads afterwards, without a break: with the renewal on the root's loop it lost the lease there
(a loaded run of the 8,000-rank same-answer test: "lease root: lost"). A root whose lease is taken
from it stops leading, counts it, and leads again once the lease is free. And a hung root (its loop
silent past its keeper's stall limit) stops acting before its standby can take the lead."""

from __future__ import annotations

import asyncio
import functools
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
from perfd.engine import root as root_module
from perfd.engine import subjects as S
from perfd.engine.connect import ensure_streams
from perfd.engine.lease_keeper import LeaseKeeper
from perfd.engine.root import Root
from perfd.engine.shard import Shard
from tests.engine.engine_driver import Plan, Rig, js_call, nc_call, rig_under
from tests.engine.test_shard_jobinfo import Bucket
from tests.engine.test_shard_lease_busy import TTL_S, OwnLoop
from tests.procs import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# The leases' TTL (TTL_S: half the engine's default) and the rig made with it, as the shard's tests
BLOCK_S = 1.5 * TTL_S  # the store's one slow take: the root's loop held past a lease's life
HUNG_S = 3 * TTL_S  # ... and past the keeper's stall limit (STALL_S) and a TTL after it: a hung root
STALL_S = 1.0
ITERATIONS = 6


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from rig_under(tmp_path, lease_ttl_s=TTL_S)


class _SlowSink(EngineSink):
    """The aggregator's sink, its first take of the root's records holding the loop ``block_s`` (a
    sleep: the keeper's thread runs meanwhile at once, where a CPU-bound take lets it in within the
    interpreter's switch interval); the root's partials messages counted as they were then."""

    def __init__(self, block_s: float = BLOCK_S) -> None:
        super().__init__(AggregatorState(), Guard(Limits(), Refusals()))
        self.block_s = block_s
        self.blocked = 0
        self.batches_then: int | None = None
        self.root: Root | None = None

    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord], now: float | None = None) -> object:
        if not self.blocked:
            self.blocked += 1
            time.sleep(self.block_s)
            self.batches_then = self.root.stats.batches if self.root is not None else None
        return super().ingest_steps(agent_id, steps, now)


def _key(rig: Rig, key: str = S.ROOT_LEASE) -> tuple[str, int] | None:
    """A key of the leases bucket, its value and revision now (None: free): the root lease's holder, or
    the HTTP the leading root advertises."""
    async def get(js: object) -> tuple[str, int] | None:
        kv = await js.key_value(S.LEASES_BUCKET)  # type: ignore[attr-defined]
        try:
            e = await kv.get(key)
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
        held = _key(rig)
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
        after = _key(rig)
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
    root = Root(rig.cfg(), _SlowSink(block_s=0.0), "root-a")
    shard, rt = _leads_then_runs(rig, root)
    try:
        held = _key(rig)
        assert held is not None

        async def take(js: object) -> None:  # another holder's, for one update: the root's next renewal fails
            kv = await js.key_value(S.LEASES_BUCKET)  # type: ignore[attr-defined]
            await kv.update(S.ROOT_LEASE, b"root-b", last=held[1])
        js_call(rig.urls, take)
        wait_for(lambda: root.stats.leadership_lost >= 1 or rt.error is not None, 30, "the loss seen")
        # root-b never renews: its key expires with the TTL, and root-a takes the lease again (a new
        # key: read from the bucket, not from root-a's flag, which its teardown clears a moment late)
        wait_for(lambda: ((h := _key(rig)) is not None and h[0] == "root-a") or rt.error is not None, 30,
                 "root-a holding the lease again")
        wait_for(lambda: root.stats.leader or rt.error is not None, 30, "leading again")
        again = _key(rig)
        lost = root.stats.leadership_lost
    finally:
        rt.stop()
        shard.stop()
    assert rt.error is None and shard.error is None, (rt.error, shard.error)
    assert lost == 1
    assert again is not None and again[0] == "root-a"


def test_a_hung_root_stops_acting_before_its_standby_leads(rig: Rig, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A root whose loop is silent past its keeper's stall limit (HUNG_S: the limit and a TTL past it)
    loses the lead to its standby, and once its loop turns again it folds nothing more, counts the loss
    and leaves the standby's advertised HTTP alone: its keeper's ``held`` ended with the TTL past its
    last renewal, before the standby could take the key."""
    caplog.set_level(logging.INFO, logger="perfd.engine")
    monkeypatch.setattr(root_module, "LeaseKeeper", functools.partial(LeaseKeeper, loop_stall_s=STALL_S))
    sink = _SlowSink(block_s=HUNG_S)
    a = Root(rig.cfg(), sink, "root-a", advertise_http="http://a")
    sink.root = a
    shard, ra = _leads_then_runs(rig, a)
    b = Root(rig.cfg(), EngineSink(AggregatorState(), Guard(Limits(), Refusals())), "root-b",
             advertise_http="http://b")
    rb = OwnLoop(b).start()
    plan = Plan(nodes=2, iterations=4 * ITERATIONS, period_s=0.5)
    try:
        load = rig.start_load(plan)
        try:
            load.finish(90)
        finally:
            load.close()
        wait_for(lambda: sink.batches_then is not None or ra.error is not None, 60, "root-a's take ended")
        wait_for(lambda: a.stats.leadership_lost >= 1 or ra.error is not None, 30, "root-a's loss seen")
        wait_for(lambda: b.stats.node_messages >= 2 * plan.iterations or rb.error is not None, 90,
                 "every node message at root-b")
        advertised, holder = _key(rig, S.ROOT_HTTP_KEY), _key(rig)
        a_batches, b_stats, b_leading = a.stats.batches, b.stats, b.stats.leader
    finally:
        rb.stop()
        ra.stop()
        shard.stop()
    assert ra.error is None and rb.error is None and shard.error is None, (ra.error, rb.error, shard.error)
    assert a.stats.leadership_lost == 1 and b_leading and b_stats.leadership_lost == 0
    assert holder is not None and holder[0] == "root-b"
    # root-a folded nothing past the take it was stuck in: its lead had ended by its keeper's clock
    assert a_batches == sink.batches_then, (a_batches, sink.batches_then)
    # and it took back no HTTP but its own: root-b's stands
    assert advertised is not None and advertised[0] == "http://b"
    # root-b rebuilt the job from the stream: every node message once
    assert b_stats.node_messages == 2 * plan.iterations and b_stats.redelivered == 0


class _Advertised(Bucket):
    """The leases bucket as far as a root's advertised HTTP goes, its deletes kept."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[tuple[str, int | None]] = []

    async def delete(self, key: str, last: int | None = None) -> bool:
        self.deleted.append((key, last))
        self.data.pop(key, None)
        return True


def test_a_root_takes_back_only_its_own_advertised_http() -> None:
    """A lead lost: the next leader may have put its HTTP already, which stays (a standby would forward
    nowhere until that leader's next put); this root's own goes, by its revision."""
    kv = _Advertised()
    root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), _SlowSink(block_s=0.0), "root-a",
                advertise_http="http://a")
    kv.data[S.ROOT_HTTP_KEY] = b"http://b"
    asyncio.run(root._unadvertise(kv))
    assert kv.data == {S.ROOT_HTTP_KEY: b"http://b"} and kv.deleted == []
    kv.data[S.ROOT_HTTP_KEY] = b"http://a"
    asyncio.run(root._unadvertise(kv))
    assert kv.data == {} and kv.deleted == [(S.ROOT_HTTP_KEY, 1)]

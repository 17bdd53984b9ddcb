"""A shard whose fold keeps its event loop busy past a lease's TTL still holds its partitions
(perfd.engine.lease_keeper): real nats-server, a shard in process whose collective fold blocks the loop
a while for every message (an injected fold), the node messages of a job with collectives waiting in
the stream when it starts, so that it folds a fetch's worth of them in one go. Its leases are renewed
on the keeper's thread meanwhile: none lost, every message folded, the partitions still its own.
With the renewals on the shard's loop, as before, the same run lost them. And a hung shard (its loop
silent, not busy) still lets its leases go."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from perfd.analytics.collectives.shardfold import ShardCollectives
from perfd.core.collfold import CollectivePartial
from perfd.core.model import ParallelLayout, StepRecord
from perfd.core.winfigures import WindowFigures
from perfd.engine import subjects as S
from perfd.engine.connect import ensure_streams
from perfd.engine.lease_keeper import LeaseKeeper
from perfd.engine.shard import Shard
from tests.engine.engine_driver import Plan, Rig, nc_call, rig_under, stream_state
from tests.engine.test_engine_collectives_faults import PERIOD_S, Job
from tests.procs import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ITERATIONS = 8  # one node: one partition's messages, a fetch of them folded 8 at a time (YIELD_EVERY)
# The leases' TTL in these cases (the rig's --engine-lease-ttl: the bucket made here, the shard, the
# keepers): half the engine's default S.LEASE_TTL_S, and every wait below is counted in it (a keeper
# renews every TTL / 3, as with the default), so each case sees the same renewals and expiries in half
# the time. The hung keeper's lease is gone LOOP_STALL_S (1 s) + TTL after its loop fell silent at
# most, 1 s inside the TTL + 2 renewals the test waits (3 s with the default TTL).
TTL_S = 3.0
RENEW_S = TTL_S / 3
LOOP_STALL_S = 1.0
BLOCK_S = 0.6  # each message's fold holds the loop this long: 8 of them well past TTL_S (1.6 x)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """The engine tests' rig (tests/engine/conftest.py), its leases' TTL TTL_S."""
    yield from rig_under(tmp_path, lease_ttl_s=TTL_S)


class _BusyFold:
    """ShardCollectives, each message's operations folded after blocking the loop BLOCK_S."""

    def __init__(self) -> None:
        self.inner = ShardCollectives()
        self.blocked = 0

    def add_steps(self, records: Iterable[StepRecord]) -> None:
        self.inner.add_steps(records)

    def set_layout(self, job: str, layout: ParallelLayout | None) -> None:
        self.inner.set_layout(job, layout)

    def add(self, part: CollectivePartial) -> None:
        time.sleep(BLOCK_S)  # the interpreter's lock held by turns, as a long fold holds it
        self.blocked += 1
        self.inner.add(part)

    def take(self) -> list[WindowFigures]:
        return self.inner.take()

    def fold_counts(self) -> dict[str, int]:
        return self.inner.fold_counts()

    def settled_from(self, job: str, rank: int) -> int | None:
        return self.inner.settled_from(job, rank)

    @property
    def jobs_forgotten(self) -> int:
        return self.inner.jobs_forgotten


class Runs(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


class OwnLoop:
    """A shard's or a root's own event loop on a thread, as ``perfd shard`` and ``perfd aggregator
    --engine`` run them, with the longest stretch the loop went without a turn (a probe task's)."""

    def __init__(self, owner: Runs) -> None:
        self.owner = owner
        self.longest_stall_s = 0.0
        self.error: BaseException | None = None
        self._ctl: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._thread = threading.Thread(target=self._run, name="own-loop", daemon=True)

    def start(self) -> OwnLoop:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # shown by the test
            self.error = exc

    async def _main(self) -> None:
        stop = asyncio.Event()
        self._ctl.append((asyncio.get_running_loop(), stop))
        probe = asyncio.create_task(self._probe())
        try:
            await self.owner.run(stop)
        finally:
            probe.cancel()

    async def _probe(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            self.longest_stall_s = max(self.longest_stall_s, now - last)
            last = now

    def stop(self) -> None:
        if self._ctl:
            loop, stop = self._ctl[0]
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(60)


def test_a_shard_whose_fold_holds_its_loop_past_the_lease_ttl_keeps_its_leases(rig: Rig) -> None:
    rig.start_cluster()
    nc_call(rig.urls, lambda nc: ensure_streams(nc, rig.cfg()))
    assert rig.cfg().renew_s == RENEW_S
    plan = Plan(nodes=1, iterations=ITERATIONS, period_s=PERIOD_S)
    load = rig.start_load(plan, Job(plan).feed)
    load.finish(60)  # every message in the stream before the shard starts: one fetch takes them all
    total = int(stream_state(rig.urls, S.NODES_STREAM)["messages"])  # (the records stream has the rest)
    assert total == ITERATIONS

    fold = _BusyFold()
    shard = Shard(rig.cfg(), "busy", collectives=fold)
    balanced = _count_balances(shard)
    st = OwnLoop(shard).start()
    try:
        wait_for(lambda: shard.stats.node_messages >= total or st.error, 120, "every message folded")
        # then a renewal round of the keeper's past the fold, which would find a lease lost by then, and a
        # balance round begun after it, which would drop the lease found lost (each: two begun since
        # read, so one begun after the reading has ended)
        keeper = shard._keeper
        assert keeper is not None
        renewals = keeper.renewals
        wait_for(lambda: keeper.renewals >= renewals + 2 or st.error, 60, "a renewal round after the fold")
        rounds = balanced[0]
        wait_for(lambda: balanced[0] >= rounds + 2 or st.error, 60, "a balance round after that renewal")
        stats: dict[str, Any] = shard.stats.to_json()
    finally:
        st.stop()
    assert st.error is None, st.error
    assert fold.blocked >= ITERATIONS
    assert st.longest_stall_s > TTL_S  # the fold did hold the loop past a lease's life
    # every message folded (some twice: held past the ack wait by a fold this slow, delivered again)
    assert stats["node_messages"] >= total
    assert stats["leases_lost"] == 0
    assert stats["leases_taken"] == rig.partitions
    assert stats["partitions"] == list(range(rig.partitions))


def _count_balances(shard: Shard) -> list[int]:
    """The shard's balance rounds ended, counted in the list's one item."""
    ended = [0]
    balance = shard._balance

    async def counted(*args: Any) -> None:
        await balance(*args)
        ended[0] += 1

    setattr(shard, "_balance", counted)  # noqa: B010  (an instance's method replaced: mypy refuses the =)
    return ended


def test_a_keeper_not_hearing_from_its_shards_loop_lets_its_leases_go(rig: Rig) -> None:
    """A hung shard (its loop silent past the keeper's loop_stall_s, not merely busy) is not kept
    alive by its keeper: the lease expires, another shard takes it, and the first, once its loop
    turns again, finds it lost."""
    rig.start_cluster()
    nc_call(rig.urls, lambda nc: ensure_streams(nc, rig.cfg()))
    key = S.partition_lease(0)

    async def main() -> tuple[list[bool], list[str], bool]:
        hung = LeaseKeeper(rig.cfg(), "hung", "member.hung", loop_stall_s=LOOP_STALL_S)
        other = LeaseKeeper(rig.cfg(), "other", loop_stall_s=LOOP_STALL_S)
        await hung.start()
        await other.start()
        try:
            assert await hung.acquire(key)
            await _beating(hung, TTL_S + 2 * RENEW_S)  # renewed past the TTL
            kept = [hung.held(key), not await other.acquire(key)]
            await asyncio.sleep(TTL_S + 2 * RENEW_S)  # silent: let go
            taken = await other.acquire(key)
            await _beating(hung, 2 * RENEW_S)  # its loop turns again
            return [*kept, taken, not hung.held(key)], hung.take_lost(), hung.stalled > 0
        finally:
            await hung.close()
            await other.close()

    flags, lost, stalled = asyncio.run(main())
    assert flags == [True, True, True, True]
    assert lost == [key]
    assert stalled


async def _beating(keeper: LeaseKeeper, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        keeper.beat()
        await asyncio.sleep(0.2)

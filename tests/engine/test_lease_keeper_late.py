"""Where a lease's renewal time went, when a round came too late to keep it (perfd.engine.lease_keeper):
the real LeaseKeeper on its thread, its renewal rounds running, over the in-memory leases bucket of
tests/engine/test_lease_keeper_held.py. A round that began past its time by more than the margin a
lease has between two renewals (the keeper's thread not run) and one whose answers came later than
that margin (the engine slow) are each counted apart and said in a warning: a lease lost under load
then says which of the two lost it."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from perfd.engine import subjects as S
from perfd.engine.lease_keeper import LeaseKeeper
from tests.engine.test_lease_keeper_held import _KV
from tests.procs import wait_for

TTL_S = 0.3  # a renewal every 0.1 s, a lease's margin between two of them 0.2 s
HOLD_S = 0.45  # past the margin by more than a round's period, wherever in a round it begins


class _SlowKV(_KV):
    """The bucket, its updates (a renewal) answered ``HOLD_S`` late once ``slow`` is set: an engine slow
    to answer."""

    slow = False

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        if self.slow:
            await asyncio.sleep(HOLD_S)
        return await super().update(key, value, last)


def _hold() -> None:
    """The keeper's loop held ``HOLD_S``: its thread not run, as a starved process's."""
    time.sleep(HOLD_S)


async def _renewing(kv: _KV) -> LeaseKeeper:
    keeper = LeaseKeeper(S.EngineConfig(("nats://127.0.0.1:1",), lease_ttl_s=TTL_S), "s1")
    keeper._thread.start()

    async def connected() -> None:  # the keeper on the in-memory bucket, its renewal rounds running
        keeper._kv = kv
        keeper._task = asyncio.create_task(keeper._renew_loop())

    await keeper._call(connected())
    assert await keeper.acquire("partition.0")
    return keeper


def test_a_round_answered_past_the_margin_is_the_engines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="perfd.engine")

    async def main() -> int:
        kv = _SlowKV()
        keeper = await _renewing(kv)
        kv.slow = True
        await asyncio.to_thread(wait_for, lambda: keeper.slow_rounds >= 1, 30, "a slow round counted")
        kv.slow = False
        await keeper.close()
        return keeper.slow_rounds

    assert asyncio.run(main()) >= 1
    said = [r.getMessage() for r in caplog.records]
    assert any("renewal round's answers were read" in m and "the engine slow" in m for m in said), said


def test_a_round_begun_past_the_margin_is_the_keepers_thread(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="perfd.engine")

    async def main() -> int:
        keeper = await _renewing(_KV())
        keeper._loop.call_soon_threadsafe(_hold)
        await asyncio.to_thread(wait_for, lambda: keeper.late_rounds >= 1, 30, "a late round counted")
        await keeper.close()
        return keeper.late_rounds

    assert asyncio.run(main()) >= 1
    said = [r.getMessage() for r in caplog.records]
    assert any("renewal round began" in m and "threads not run" in m for m in said), said

"""Where a lease's renewal time went, when its leases lapsed between two rounds (perfd.engine.lease_keeper):
the real LeaseKeeper on its thread, its renewal rounds running, over the in-memory leases bucket of
tests/engine/test_lease_keeper_held.py. A round whose answers are read more than a TTL after the round
before it was sent is counted and said, with how late it began (the keeper's thread not run) and how
long its answers took (the engine slow): a lease lost under load then says which of the two lost it."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from perfd.engine import subjects as S
from perfd.engine.lease_keeper import LeaseKeeper
from tests.engine.test_lease_keeper_held import _KV
from tests.procs import wait_for

TTL_S = 0.3  # a renewal round every 0.1 s
HOLD_S = 0.45  # past the TTL, wherever in a round it begins


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


def _lapse(caplog: pytest.LogCaptureFixture) -> tuple[float, float, float]:
    """The first lapse said: (since the round before was sent, how late it began, its answers' time)."""
    said = [r for r in caplog.records if "they lapsed meanwhile" in r.getMessage()]
    assert said, [r.getMessage() for r in caplog.records]
    args = said[0].args
    assert isinstance(args, tuple)
    _holder, since, _ttl, late, answered = args
    assert isinstance(since, float) and isinstance(late, float) and isinstance(answered, float)
    return since, late, answered


def test_a_round_answered_past_the_ttl_says_the_engines_time(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="perfd.engine")

    async def main() -> int:
        kv = _SlowKV()
        keeper = await _renewing(kv)
        kv.slow = True
        await asyncio.to_thread(wait_for, lambda: keeper.lapses >= 1, 30, "a lapse counted")
        kv.slow = False
        await keeper.close()
        return keeper.lapses

    assert asyncio.run(main()) >= 1
    since, _late, answered = _lapse(caplog)
    assert since > TTL_S and answered >= HOLD_S


def test_a_round_begun_past_the_ttl_says_the_keepers_thread(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="perfd.engine")

    async def main() -> int:
        keeper = await _renewing(_KV())
        renew = keeper._renew_all
        held: list[bool] = []

        async def renew_then_hold() -> None:  # the hold lands while the loop waits for the next round
            await renew()
            if not held:
                held.append(True)
                asyncio.get_running_loop().call_later(0.01, _hold)

        keeper._renew_all = renew_then_hold  # type: ignore[method-assign]
        await asyncio.to_thread(wait_for, lambda: keeper.lapses >= 1, 30, "a lapse counted")
        await keeper.close()
        return keeper.lapses

    assert asyncio.run(main()) >= 1
    since, late, _answered = _lapse(caplog)
    renew_s = TTL_S / 3
    assert since > TTL_S and late >= HOLD_S - renew_s

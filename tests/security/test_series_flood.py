"""Series refused at the cap cost nothing that stays.

The issue's probe: 20 agents × 50,000 series filled the aggregator's 1,000,000-series cap (RSS 53 →
1,396 MB); two more rounds of 1,000,000 series, every one refused at ``series_cap``, took it to
2,291 and then 3,161 MB, kept after the streams closed (~0.87 KB per refused series: their
definitions stayed in the streams' tables and the per-agent refused sets). Here a refused definition
is kept nowhere: the ingest server asks the aggregator's caps before it enters a stream's table.
Real gRPC agents on loopback. What a real ``perfd aggregator`` process's RSS does through such
floods (recorded in docs/reliability.md) is the machine's, measured by `perfd bench memory --scenario
series-flood`; here, what it holds.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from pathlib import Path

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.core import limits as L
from perfd.core.model import Sample
from perfd.transport.client import AgentClient
from perfd.transport.series import Series
from tests.inproc import pipeline

pytestmark = pytest.mark.slow


def _samples(agent: str, n: int, t: float) -> list[Sample]:
    return [Sample("perfd_gpu_power_watts", float(i), t, {"node": agent, "gpu": str(i % 8),
                                                           "uuid": f"GPU-{agent}-{i:08d}"}) for i in range(n)]


async def _flood(target: str, agents: list[str], n: int) -> None:
    """Each agent defines ``n`` series (one batch with a sample of each), then its stream closes."""
    for a in agents:
        c = AgentClient(target, a)
        c.submit(_samples(a, n, time.time()))
        t = asyncio.create_task(c.run())
        try:
            assert await c.flush(120)
        finally:
            t.cancel()
            try:
                await t
            except asyncio.CancelledError:
                pass
            c.table.clear()  # the agent's own definitions (this process) are not the aggregator's


def _live_series() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Series)


def test_refused_series_are_held_nowhere_and_admitted_ones_keep_their_samples() -> None:
    cap = 1_000

    async def main() -> None:
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[],
                                          limits=L.Limits(max_series=cap)))
        await agg.start()
        target = f"127.0.0.1:{agg.grpc_port}"
        try:
            await _flood(target, ["held"], cap)  # fills the cap
            assert agg.guard.series == cap
            base = _live_series()
            await _flood(target, [f"refused-{k}" for k in range(5)], 5_000)
            # Counted at each definition: the agent's Hello and its batch define every series.
            assert agg.refusals.get(L.REFUSED_SERIES) == 2 * 25_000
            # Nothing of the 25,000 refused series stayed (streams' tables, kept Hello tables, the
            # aggregator's caches): the build held every one of them.
            assert _live_series() - base < 100
            assert all(len(t) == 0 for a, t in agg.server._tables.tables() if a.startswith("refused"))
            assert not any(a.startswith("refused") for a in agg._series)
            # The refused agents' samples were dropped (counted), never an error; the held agent's
            # series keep their values.
            counters = agg.server.counters()
            assert counters["deliver_errors"] == 0
            assert agg.state.stats_json()["samples_undefined"] == 25_000
            held = agg.state.nodes.latest("held", "perfd_gpu_power_watts",
                                          (("gpu", "3"), ("node", "held"), ("uuid", "GPU-held-00000003")))
            assert held is not None and held.value == 3.0
        finally:
            await agg.stop()

    asyncio.run(main())


@pytest.mark.slow
def test_one_identity_holds_at_most_its_quota_of_series(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Before, one client identity held 500,000 series (~940 MB). Three agents of one
    address (loopback: one identity without credentials) each defining the per-agent most, 50,000, at
    a real aggregator (`perfd aggregator`'s configuration, in the test's process) with the default
    quota: 100,000 held, the rest refused (``series_quota``)."""
    caplog.set_level(logging.WARNING, logger="perfd")  # the aggregator's log, as `perfd` writes it
    with pipeline(tmp_path, "--no-rules") as p:
        n = L.MAX_SERIES_PER_AGENT
        p.call(_flood(p.target, [f"same-address-{k}" for k in range(3)], n), "the three agents' series", 400)
        t = p.json("/api/stats")["transport"]
        print(f"FIGURES series quota: 3 agents of one identity defining {n} series each: {t['series_held']} "
              f"held, {t.get('refused_series_quota')} refusals (each definition is refused twice: Hello and "
              f"batch)")
        assert t["series_held"] == L.MAX_SERIES_PER_IDENTITY == 100_000
        assert t.get("refused_series_quota", 0) >= 3 * n - L.MAX_SERIES_PER_IDENTITY
        assert "refused (series_quota)" in caplog.text

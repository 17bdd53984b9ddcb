"""One malformed event must not take the aggregator down, now or at its next start.

The attack: any client (its Hello naming a job of its own) sends
``{"kind": "gpu_processes", "labels": {"node": "n", "gpu": "0"}, "payload": [{"rank": 0, "job": "victim"}]}``
— a process entry without a ``pid``. Rank placement raised ``KeyError: 'pid'`` on every tick: /metrics
and every job endpoint answered 500, stall checks failed, and since the event was journalled, a
restart on the same ``--state-dir`` exited 1.

Here: an aggregator with a state dir, in process (its rules loop's ticks run by the test, over what
arrived), the victim's host and the attacker as real gRPC agents (the transport's own AgentClient). The
malformed entry is refused at the edge and counted (``malformed_event``); every endpoint answers 200; a
restart on the same state starts. A second test writes the event into a journal the way the journal
always wrote accepted batches (perfd.aggregator.durable.Journal, ``kept=None``) and starts an aggregator
on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.durable import Journal
from perfd.aggregator.state_store import StateStore
from perfd.core.model import StepRecord
from perfd.transport.client import AgentClient
from perfd.transport.codec import encode_batch
from perfd.transport.series import SeriesTable
from tests.faults.streams import streaming
from tests.procs import get_json, http_get

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
JOB = "victim"
ATTACK: dict[str, Any] = {"kind": "gpu_processes", "labels": {"node": "n", "gpu": "0"},
          "payload": [{"rank": 0, "job": JOB}]}
# A few more of the same sort: entries of the wrong type where the aggregator reads a number.
MORE: list[dict[str, Any]] = [
    {"kind": "gpu_processes", "labels": {"node": "n", "gpu": "1"},
     "payload": [{"pid": "not-a-pid", "rank": 1, "job": JOB}, {"pid": 7, "rank": "one", "job": JOB}]},
    {"kind": "rank_processes", "job": "theirs", "time": 0.0, "text": "",
     "payload": {"job": "theirs", "ranks": [{"rank": 0}, {"pid": 3, "rank": None}]}},
    {"kind": "job_phase", "job": "theirs", "time": 0.0, "text": "",
     "payload": {"job": "theirs", "phase": "checkpoint", "state": "begin", "iteration": "soon"}},
]


def _endpoints(base: str) -> dict[str, int]:
    """Every GET path of the aggregator and what it answered."""
    paths = ["/metrics", "/healthz", "/api/stats", "/api/jobs", "/api/events", "/api/captures",
             *(f"/api/jobs/{JOB}/{p}" for p in ("summary", "iterations", "incidents", "gpus"))]
    out = {}
    for p in paths:
        try:
            with urllib.request.urlopen(base + p, timeout=10) as r:
                out[p] = r.status
        except urllib.error.HTTPError as e:
            out[p] = e.code
    return out


def _refused(base: str, reason: str) -> float:
    m = re.search(rf'^perfd_aggregator_refused_total\{{reason="{reason}"\}} (\S+)$',
                  http_get(f"{base}/metrics").decode(), re.M)
    return float(m.group(1)) if m else 0.0


async def _attack(target: str) -> None:
    host = AgentClient(target, "host-agent", jobs=[JOB])
    attacker = AgentClient(target, "attacker", jobs=["theirs"])
    async with streaming(host) as h, streaming(attacker) as a:
        t0 = time.time()
        h.submit(steps=[StepRecord(job=JOB, iteration=i, rank="last", end_time=t0 - 3 + i * 0.1,
                                   step_time_ms=100.0) for i in range(1, 31)])
        assert await h.flush(30)
        a.submit(events=[ATTACK, *MORE])
        assert await a.flush(30)


def _all_ok(base: str) -> dict[str, int]:
    got = _endpoints(base)
    assert all(code == 200 for code in got.values()), got
    return got


@contextlib.asynccontextmanager
async def _aggregator(state: Path) -> AsyncIterator[tuple[Aggregator, str, str]]:
    """An aggregator in process on loopback, as ``perfd aggregator --no-rules --state-dir STATE`` runs,
    its rules loop's ticks the test's (:func:`_ticks`): (it, its gRPC target, its HTTP base URL)."""
    agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], rules_interval_s=3600.0,
                                      state_dir=str(state)))
    await agg.start()
    try:
        assert agg.http is not None
        yield agg, f"127.0.0.1:{agg.grpc_port}", f"http://127.0.0.1:{agg.http.port}"
    finally:
        await agg.stop()


async def _ticks(agg: Aggregator, n: int = 3) -> None:
    """Several ticks of the rules loop (analysis, stall checks, rules, housekeeping, the state store) over
    what arrived: what a tick would have raised on is read by each."""
    for _ in range(n):
        await asyncio.to_thread(agg.tick)


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """perfd's own tracebacks. Not asyncio's about gRPC's process-wide poller: an earlier test's
    in-process aggregator, on an event loop since closed, leaves it calling into that loop ("Event loop is
    closed"), logged in whichever test runs next in the process — nothing of this test's aggregator."""
    return [r.getMessage() for r in caplog.records if r.exc_info is not None and r.name.startswith("perfd")]


def test_one_malformed_event_takes_no_endpoint_down_and_no_restart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    state = tmp_path / "state"

    async def main() -> tuple[float, list[dict[str, Any]]]:
        async with _aggregator(state) as (agg, target, base):
            await _attack(target)
            await _ticks(agg)
            await asyncio.to_thread(_all_ok, base)
            refused = await asyncio.to_thread(_refused, base, "malformed_event")
        # The same state again: it starts, and answers.
        async with _aggregator(state) as (agg, _target, base):
            await _ticks(agg)
            await asyncio.to_thread(_all_ok, base)
            its = (await asyncio.to_thread(get_json, f"{base}/api/jobs/{JOB}/iterations"))["iterations"]
        return refused, its

    refused, its = asyncio.run(main())
    # The entry, both entries of the second list, the two rank entries, the phase.
    assert refused == 6.0
    assert not _tracebacks(caplog), _tracebacks(caplog)
    said = [r.getMessage() for r in caplog.records if "refused (malformed_event)" in r.getMessage()]
    assert said and any("pid" in m for m in said), said
    assert len(its) == 30


def test_a_journal_holding_a_malformed_event_restarts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The journal as the aggregator wrote it before the edge refused such events: a batch kept
    whole (``kept=None``) with the issue's event among good ones. A restart skips and counts it."""
    caplog.set_level(logging.INFO)
    state = tmp_path / "state"
    store = StateStore(str(state))
    table = SeriesTable()
    t0 = time.time()
    good = StepRecord(job=JOB, iteration=1, rank="last", end_time=t0, step_time_ms=100.0)
    b = encode_batch("host-agent", 1, [], [good], [ATTACK, *MORE], table)
    j = Journal(store)
    j.hello("host-agent", [JOB])
    j.batch("host-agent", b)
    j.seq("host-agent", "e", 1)
    assert j.commit()
    store.close()

    async def main() -> tuple[list[dict[str, Any]], float]:
        async with _aggregator(state) as (agg, _target, base):
            await _ticks(agg)
            await asyncio.to_thread(_all_ok, base)
            its = (await asyncio.to_thread(get_json, f"{base}/api/jobs/{JOB}/iterations"))["iterations"]
            return its, await asyncio.to_thread(_refused, base, "malformed_event")

    its, refused = asyncio.run(main())
    assert [it["iteration"] for it in its] == [1]
    assert refused == 6.0 and not _tracebacks(caplog), _tracebacks(caplog)

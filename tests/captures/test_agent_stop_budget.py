"""The agent's stop keeps its budget on its own clock, whatever its steps take: every step here is busy
for every second it is given (a ManualClock moved by the step itself), so the stop is the budget's
arithmetic and nothing else. The real processes' stop (SIGTERM with a Kineto capture waiting) is
tests/captures/test_agent_stop.py; how many seconds it takes on a machine is that test's print."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import ClassVar

import pytest

from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent
from perfd.agent.stop_budget import CAPTURE_STOP_S, FLOOR_S, SHUTDOWN_BUDGET_S, StopBudget
from perfd.core.clock import ManualClock


class Busy:
    """Each part of the agent its stop calls, taking all it is given (``overrun``: more than that)."""

    def __init__(self, clock: ManualClock, overrun: dict[str, float] | None = None) -> None:
        self.clock = clock
        self.given: dict[str, float] = {}
        self.overrun = overrun or {}

    def _take(self, name: str, timeout: float) -> None:
        self.given[name] = timeout
        self.clock.advance(timeout + self.overrun.get(name, 0.0))


class Scheduler(Busy):
    states: ClassVar[dict[str, object]] = {}  # no collectors: what the last drain forwards is nothing

    def stop(self, timeout_s: float) -> None:
        self._take("collectors", timeout_s)

    def drain(self) -> list[object]:
        return []


class Captures(Busy):
    def close(self, timeout_s: float) -> None:
        self._take("captures", timeout_s)


class Client(Busy):
    closed = False

    async def flush(self, timeout: float) -> bool:
        self._take("flush", timeout)
        return False

    def close(self) -> None:
        self.closed = True


class Http(Busy):
    def stop(self, timeout: float) -> None:
        self._take("http", timeout)


async def _stop(overrun: dict[str, float] | None = None) -> tuple[dict[str, float], float]:
    clock = ManualClock()
    agent = Agent(AgentConfig(job="j", node="n1", metrics_port=None, collectors={}))
    agent.monotonic = clock.monotonic
    client = Client(clock, overrun)
    parts = [Scheduler(clock, overrun), Captures(clock, overrun), client, Http(clock, overrun)]
    agent.scheduler, agent.captures, agent.client, agent.http = parts  # type: ignore[assignment]

    async def stream() -> None:
        await asyncio.Event().wait()  # ends at its cancel

    agent._client_task = asyncio.create_task(stream())
    await asyncio.sleep(0)
    t0 = clock.monotonic()
    await agent._shutdown()
    assert agent._client_task.cancelled() and client.closed
    given = {k: v for p in parts for k, v in p.given.items()}
    return given, clock.monotonic() - t0


def test_every_step_busy_for_all_it_is_given_stops_within_the_budget(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="perfd.agent.node_agent"):
        given, took = asyncio.run(_stop())
    assert took <= SHUTDOWN_BUDGET_S
    # Each step its share of what the ones before it left, the captures no more than theirs.
    shared = SHUTDOWN_BUDGET_S - 2 * FLOOR_S
    assert given["collectors"] == pytest.approx(0.4 * shared)
    left = shared - given["collectors"]
    assert given["captures"] == pytest.approx(min(CAPTURE_STOP_S, 0.3 * left))
    left -= given["captures"]
    assert given["flush"] == pytest.approx(0.6 * left)
    assert given["http"] == pytest.approx(max(FLOOR_S, 0.5 * (left - given["flush"])))
    # The log line names each step with the agent's clock at its end, and the whole stop.
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("agent stopped in")]
    m = re.fullmatch(r"agent stopped in ([0-9.]+) s \((.*)\)", line)
    assert m and float(m.group(1)) == pytest.approx(took, abs=0.01), line
    assert [p.split(" ")[0] for p in m.group(2).split(", ")] == ["collectors", "forward", "captures", "flush",
                                                                "stream", "http"], line


def test_a_step_past_the_deadline_leaves_the_last_two_their_floors_inside_the_budget() -> None:
    # The flush runs past the shared deadline: the stream's wait and the HTTP server's close still run,
    # each for its floor, and those floors were kept out of the deadline the others shared.
    budget_overrun = SHUTDOWN_BUDGET_S  # the flush takes what it is given and this much more
    given, took = asyncio.run(_stop({"flush": budget_overrun}))
    assert given["http"] == FLOOR_S
    budget = StopBudget(ManualClock().monotonic)
    assert budget.deadline - budget.t0 + 2 * FLOOR_S == pytest.approx(SHUTDOWN_BUDGET_S)
    # The stop is over the budget by the flush's overrun, and by nothing of the budget's own.
    assert SHUTDOWN_BUDGET_S < took <= SHUTDOWN_BUDGET_S + budget_overrun


def test_the_budget_reads_only_the_clock_it_was_given() -> None:
    clock = ManualClock(monotonic=100.0)
    budget = StopBudget(clock.monotonic, budget_s=1.0, floors=1)
    assert budget.left() == pytest.approx(1.0 - FLOOR_S)
    clock.advance(0.5)
    assert budget.left(0.5) == pytest.approx((0.5 - FLOOR_S) * 0.5)
    budget.mark("a")
    clock.advance(2.0)
    assert budget.left() == 0.0 and budget.floored() == FLOOR_S
    assert budget.phases == ["a 0.50s"] and budget.took() == pytest.approx(2.5)

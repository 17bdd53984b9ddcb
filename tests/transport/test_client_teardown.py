"""An agent's stream ends whole when its session does (perfd.core.phase): its write loop, parked on
its wake, is woken by a submit in the very turn its session's teardown cancels it. On Python 3.11
``asyncio.wait_for`` then drops the cancel; the loop, written ``while True``, went on sending heartbeats
on a stream nobody read, and the teardown awaiting it never ended — an agent whose aggregator stopped
acknowledging (the watchdog's case) never reconnected. In process, a stand-in call."""

from __future__ import annotations

import asyncio
from pathlib import Path

from perfd.core.phase import Phase
from perfd.transport.client import AgentClient


class _Call:
    """A stream the aggregator stopped answering: writes go into the void."""

    def __init__(self) -> None:
        self.writes = 0
        self.written = asyncio.Event()

    async def write(self, request: bytes) -> None:
        self.writes += 1
        self.written.set()


def test_the_write_loop_ends_with_its_session_when_a_wake_lands_with_the_cancel() -> None:
    async def body() -> tuple[Phase, int, int, bool]:
        c = AgentClient("127.0.0.1:1", "agent-a", heartbeat_s=0.2)
        c._loop, c._wake = asyncio.get_running_loop(), asyncio.Event()
        call, phase = _Call(), Phase("perfd agent agent-a")
        task = phase.spawn(c._write_loop(call, phase.over))  # type: ignore[arg-type]
        await call.written.wait()  # its first heartbeat: then parked on its wake until the next
        parked = call.writes
        c._wake.set()  # a submit's wake ...
        await asyncio.sleep(0)  # ... whose wait ends in this turn, before the loop's task wakes
        await phase.end(timeout_s=2.0)  # the session's teardown: its cancel lands with the wake
        return phase, parked, call.writes, task.done()

    phase, parked, writes, ended = asyncio.run(body())
    assert ended and phase.stuck == 0
    assert writes - parked <= 1  # a heartbeat at most before it saw the end, none after


def test_a_closed_clients_run_ends_at_its_next_round_without_its_cancel(tmp_path: Path) -> None:
    """run() is cancelled, then close() called; where the cancel was lost (above), closing ends it at
    its next round (here: its next reconnect, nothing listening) instead of leaving it retrying."""
    from perfd.transport.spool import Spool

    async def body() -> bool:
        c = AgentClient("127.0.0.1:9", "agent-a", spool=Spool(tmp_path / "spool"), backoff_initial_s=0.05,
                        backoff_max_s=0.05)
        task = asyncio.create_task(c.run())
        await asyncio.sleep(0)  # its first stream begun: nothing listens, it fails and backs off
        c.close()  # no cancel at all: the lost one's case
        done, _ = await asyncio.wait({task}, timeout=10.0)
        task.cancel()
        return task in done

    assert asyncio.run(body())


def test_a_live_streams_write_loop_ends_once_the_client_is_closed() -> None:
    """On a stream the aggregator answers, close() ends the write loop at its next round (a heartbeat's
    wait at most), cancel or none."""
    async def body() -> bool:
        c = AgentClient("127.0.0.1:1", "agent-a", heartbeat_s=0.2)
        c._loop, c._wake = asyncio.get_running_loop(), asyncio.Event()
        call = _Call()
        task = asyncio.create_task(c._write_loop(call, asyncio.Event()))  # type: ignore[arg-type]
        await call.written.wait()
        c._closed = True  # what close() sets (its spool closed too, not needed here)
        done, _ = await asyncio.wait({task}, timeout=5.0)
        task.cancel()
        return task in done

    assert asyncio.run(body())

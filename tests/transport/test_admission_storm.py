"""Admission says no while the aggregator is saturated, and says when to come back (issue 54 item 8:
4,500 agents connecting at once got 1,259 connected, p50 34 s, and 0 overload refusals — the event
loop's lag, all admission read, stayed under its 5 s while the loop had no time left).

A real grpc.aio ingest server in a process of its own, its loop kept busy on a CPU (work that leaves it a
few ms between pieces: its lag stays far under its limit), and 20 real AgentClients connecting: each is
refused (``overloaded``) with a time to come back, waits that out with jitter instead of its own
50 ms backoff, and gets in once the loop has time again; an agent connected before keeps its Acks.
The loop's business, and the opening streams' count and wait, each refuse on their own.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from multiprocessing.connection import Connection
from typing import Any

import grpc
import pytest

from perfd import limits as L
from perfd.transport import AgentClient, IngestServer
from perfd.transport.admission import StreamRefused, admit_stream
from perfd.transport.client import retry_after

AGENTS = 20
BUSY_S = 3.0


def _burn(seconds: float) -> None:
    """The calling thread on a CPU for ``seconds`` (what decoding and admitting Hellos keep a loop at)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _serve_busy(pipe: Connection) -> None:
    """A child process: an ingest server whose loop is kept ~95% busy on a CPU while asked (40 ms of
    work, then 2 ms for everything else: its lag stays ~40 ms); says its port, then what it refused."""
    async def main() -> None:
        # Liveness ticks of 0.5 s (the Hello timeout / 4): the loop's business is read twice a second.
        srv = IngestServer(lambda agent, b: None, limits=L.Limits(hello_timeout_s=2.0), ack_interval_s=0.2)
        pipe.send(await srv.start("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        busy = {"on": False}

        def work() -> None:
            if busy["on"]:
                _burn(0.04)
                loop.call_later(0.002, work)

        while True:
            cmd = await asyncio.to_thread(pipe.recv)
            if cmd == "busy":
                busy["on"] = True
                work()
                while srv.backlog.busy < srv.limits.max_loop_busy:
                    await asyncio.sleep(0.05)
                pipe.send(srv.backlog.busy)
            elif cmd == "idle":
                busy["on"] = False
                pipe.send(srv.loop_lag_s)
            else:
                pipe.send((srv.refusals.get(L.REFUSED_OVERLOADED), srv.streams_opened))
                await srv.stop(None)
                return

    asyncio.run(main())


def test_new_streams_are_refused_with_a_hint_while_the_loop_has_no_time_left() -> None:
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_serve_busy, args=(child,), daemon=True)
    proc.start()
    hints: list[float] = []

    async def ask(cmd: str) -> Any:
        parent.send(cmd)
        return await asyncio.to_thread(parent.recv)

    async def body() -> tuple[list[AgentClient], float, float, tuple[int, int]]:
        port = await asyncio.to_thread(parent.recv)
        early = AgentClient(f"127.0.0.1:{port}", "early", jobs=["j"], heartbeat_s=0.2)
        t_early = asyncio.create_task(early.run())
        while not early.connected:
            await asyncio.sleep(0.02)
        await ask("busy")
        clients = [AgentClient(f"127.0.0.1:{port}", f"a{k:02d}", jobs=["j"], backoff_initial_s=0.05,
                               backoff_max_s=0.3) for k in range(AGENTS)]
        for c in clients:  # what each refused stream was told (the client consumes it)
            note = c._note_error

            def noting(e: BaseException, note: Any = note) -> None:
                note(e)
                if (h := retry_after(e)) is not None:
                    hints.append(h)
            c._note_error = noting  # type: ignore[method-assign]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        await asyncio.sleep(BUSY_S)
        assert not any(c.connected for c in clients)
        assert early.connected  # its Heartbeats are still answered
        lag = await ask("idle")
        t0 = time.monotonic()
        while not all(c.connected for c in clients):
            assert time.monotonic() - t0 < 60, sum(c.connected for c in clients)
            await asyncio.sleep(0.05)
        took = time.monotonic() - t0
        for t in [*tasks, t_early]:
            t.cancel()
        await asyncio.gather(*tasks, t_early, return_exceptions=True)
        return clients, took, lag, await ask("stop")

    try:
        clients, took, lag, (refused, opened) = asyncio.run(body())
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    print(f"FIGURES saturated loop (lag {lag:.2f} s, under its {L.MAX_LOOP_LAG_S:g} s limit): {AGENTS} "
          f"agents refused {refused} times in {BUSY_S:g} s, hints {min(hints):.1f}-{max(hints):.1f} s; "
          f"all in {took:.1f} s after the loop had time again ({opened} streams opened)")
    assert lag < L.MAX_LOOP_LAG_S  # the lag alone would have let them all in
    assert refused >= AGENTS and len(hints) == refused  # each refusal said when to come back
    assert all(L.MIN_RETRY_AFTER_S <= h <= L.MAX_RETRY_AFTER_S for h in hints)
    # Each came back after the hint (>= 0.5 s with its jitter), not at its own 50-300 ms backoff.
    assert refused <= AGENTS * (BUSY_S / (0.5 * L.MIN_RETRY_AFTER_S) + 2), refused
    assert all("overloaded" in c.last_error for c in clients)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"opening": 512}, "512 streams wait for their first Ack"),
    ({"first_ack_wait_s": 6.0}, "waited 6.0 s for its first Ack"),
    ({"loop_busy": 0.95}, "busy 95%"),
    ({"loop_lag_s": 7.0}, "runs 7.0 s late"),
])
def test_each_sign_of_saturation_refuses_with_a_retry_hint(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(StreamRefused) as got:
        admit_stream(10, kwargs.pop("loop_lag_s", 0.0), L.Limits(), **kwargs)
    assert got.value.code == grpc.StatusCode.UNAVAILABLE and got.value.reason == L.REFUSED_OVERLOADED
    assert says in str(got.value)
    (key, ms), = got.value.trailing_metadata()
    assert key == L.RETRY_AFTER_KEY and 1000 * L.MIN_RETRY_AFTER_S <= int(ms) <= 1000 * L.MAX_RETRY_AFTER_S
    admit_stream(10, 0.0, L.Limits(), opening=511, first_ack_wait_s=4.9, loop_busy=0.89)  # below: let in

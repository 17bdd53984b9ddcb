"""Admission says no while the aggregator cannot answer new streams in time, and says when to come back
(without it, 4,500 agents connecting at once got 1,259 connected, p50 34 s, and 0 overload
refusals — the event loop's lag, all admission read, stayed under its 5 s while Hellos queued).

A real grpc.aio ingest server in a process of its own, each Hello costing its loop 25 ms on a CPU (a big
series table's decode and admission), and 200 real AgentClients connecting at once: the loop's lag
stays under its limit (it runs between Hellos; past it only where other processes hold the CPUs), and
the streams waiting queue inside gRPC where the server cannot count them, but the loop has no time
left: new streams are refused (``overloaded``), also while the lag is within its limit,
and told to come back after as long as that has lasted; the refused wait it out with jitter instead
of their own 50 ms backoff, and every agent gets in — without a storm of reconnections.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import grpc
import pytest

from perfd.core import limits as L
from perfd.transport import AgentClient, IngestServer
from perfd.transport.admission import StreamRefused, admit_stream
from perfd.transport.client import retry_after
from tests.procs import load_per_cpu

AGENTS = 200
HELLO_COST_S = 0.025
STARVED = 2.0  # the server's loop this many times its lag limit late: its process was starved of CPU
LOADED_PER_CPU = 2.0  # the machine's load per CPU past which a refusal's status may come too late to read


def _burn(seconds: float) -> None:
    """The calling thread on a CPU for ``seconds`` (what decoding and admitting Hellos keep a loop at)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _serve(pipe: Connection) -> None:
    """A child process: an ingest server whose Hellos each cost its loop HELLO_COST_S on a CPU; says its
    port, then (asked) its loop lag, what it refused, how many streams it opened, and how many of its
    overload refusals it made while its loop's lag was within its limit (another sign refused them)."""
    from perfd.transport import server as server_module

    real = admit_stream  # the name server.py calls (perfd.transport.admission's)
    lag_within = [0]

    def admit(open_streams: int, loop_lag_s: float, limits: L.Limits, *rest: Any) -> None:
        """The server's own admission, each overload refusal counted by the lag it was made at."""
        try:
            real(open_streams, loop_lag_s, limits, *rest)
        except StreamRefused as exc:
            if exc.reason == L.REFUSED_OVERLOADED and loop_lag_s <= limits.max_loop_lag_s:
                lag_within[0] += 1
            raise

    vars(server_module)["admit_stream"] = admit

    async def main() -> None:
        # Liveness ticks of 0.5 s (the Hello timeout / 4): the loop's business is read twice a second.
        # And the loop refused on once busy 1 s on end (10 s by default: the test's storm is shorter).
        limits = L.Limits(hello_timeout_s=2.0, max_loop_busy_s=1.0)
        srv = IngestServer(lambda agent, b: None, on_hello=lambda info: _burn(HELLO_COST_S), limits=limits,
                           ack_interval_s=0.2)
        pipe.send(await srv.start("127.0.0.1", 0))
        lag = 0.0
        while not await asyncio.to_thread(pipe.poll, 0.1):
            lag = max(lag, srv.loop_lag_s)
        pipe.recv()
        pipe.send((lag, srv.refusals.get(L.REFUSED_OVERLOADED), srv.streams_opened, lag_within[0]))
        await srv.stop(None)

    asyncio.run(main())


@dataclass
class _Storm:
    """What one storm gave: the agents, how long they took to get in, the server's figures (its loop's
    largest lag, its overload refusals, the streams it opened, the refusals made with the lag within its
    limit) and what the agents read (the refusals, their hints, each agent's hints with when it read
    them)."""

    clients: list[AgentClient]
    took: float
    lag: float
    refused: int
    opened: int
    lag_within: int
    hints: list[float]
    read: list[BaseException]
    said: dict[str, list[tuple[float, float]]]


def _storm() -> _Storm:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child,), daemon=True)
    proc.start()
    hints: list[float] = []
    read: list[BaseException] = []  # the refusals the agents read as such
    # Each agent's refusals that said when to come back: (when it was read, the hint).
    said: dict[str, list[tuple[float, float]]] = {}

    async def body() -> tuple[list[AgentClient], float]:
        port = await asyncio.to_thread(parent.recv)
        clients = [AgentClient(f"127.0.0.1:{port}", f"a{k:03d}", jobs=["j"], backoff_initial_s=0.05,
                               backoff_max_s=0.3) for k in range(AGENTS)]
        for c in clients:  # what each refused stream was told (the client consumes it)
            note = c._note_error

            def noting(e: BaseException, note: Any = note, agent: str = c.agent_id) -> None:
                note(e)
                if L.REFUSED_OVERLOADED in str(e.details() if isinstance(e, grpc.aio.AioRpcError) else e):
                    read.append(e)
                if (h := retry_after(e)) is not None:
                    hints.append(h)
                    said.setdefault(agent, []).append((time.monotonic(), h))
            c._note_error = noting  # type: ignore[method-assign]
        t0 = time.monotonic()
        tasks = [asyncio.create_task(c.run()) for c in clients]
        while not all(c.connected for c in clients):
            assert time.monotonic() - t0 < 120, sum(c.connected for c in clients)
            await asyncio.sleep(0.05)
        took = time.monotonic() - t0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return clients, took

    try:
        clients, took = asyncio.run(body())
        parent.send("stop")
        lag, refused, opened, lag_within = parent.recv()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return _Storm(clients, took, lag, refused, opened, lag_within, hints, read, said)


@pytest.mark.slow
def test_a_connect_storm_is_refused_with_a_retry_hint_and_every_agent_gets_in() -> None:
    st = _storm()
    starved = st.refused == 0 and st.lag > STARVED * L.Limits().max_loop_lag_s
    if starved or st.opened > AGENTS:
        # The machine's other processes held the CPUs: the server's process starved (a full suite on 2
        # CPUs once held its loop 19 s late: all 200 streams admitted before any sign could show, none
        # refused), or the admitted agents' Hellos timed out and they opened streams again (a CI run at
        # 4.5 per CPU: 267 streams for 200 agents). The storm says nothing of admission then. Once more,
        # its figures printed; a second such storm fails below.
        print(f"FIGURES connect storm on a loaded machine: loop lag {st.lag:.1f} s, {st.refused} refusals, "
              f"{st.opened} streams opened, load {load_per_cpu():.1f} per CPU: once more")
        st = _storm()
    clients, took, lag, refused, opened, lag_within = (st.clients, st.took, st.lag, st.refused, st.opened,
                                                       st.lag_within)
    hints, read, said = st.hints, st.read, st.said
    refused_agents = sum(1 for c in clients if c.reconnects)
    # The figures whatever came of the storm, the machine's load with them: a CI run under a load of
    # 5 per CPU read no hint at all, and the line that said so raised on min() of nothing instead.
    said_hints = f"{min(hints):.1f}-{max(hints):.1f} s" if hints else "none"
    print(f"FIGURES connect storm: {AGENTS} agents, {HELLO_COST_S * 1e3:.0f} ms a Hello (lag at most "
          f"{lag:.2f} s): all connected in {took:.1f} s; {refused} overload refusals of {refused_agents} "
          f"agents, {lag_within} made while the loop's lag was within its limit, {len(read)} read as "
          f"refusals, hints {said_hints}, {opened} streams opened, load {load_per_cpu():.1f} per CPU")
    # Refused while the lag alone would have let them in (the other signs: the loop's business, the
    # streams waiting for their first Ack). Not the lag's maximum over the storm: on a machine whose other
    # processes hold the CPUs (a full suite, load 3.8 per CPU) the server waited for one past its limit
    # too (5.9 s), and then refuses for that as well, rightly.
    assert lag_within > 0, (lag, refused, lag_within)
    # Each refusal an agent read said when to come back, whether it came as the read's error or through
    # a failed write. A refusal whose status did not come within the client's 2 s (a loaded machine)
    # reads as the write's own error: the agent backs off on its own then, and the server counted it.
    # On a machine this loaded (a fresh clone's CI at 3.4 per CPU) that was 158 of 278: at least 90%
    # are read as refusals only where it is not.
    load = load_per_cpu()
    assert refused > 0 and len(hints) == len(read) and 0 < len(read) <= refused, \
        (refused, len(read), len(hints), load)
    assert len(read) >= 0.9 * refused or load >= LOADED_PER_CPU, (refused, len(read), len(hints), load)
    assert all(L.MIN_RETRY_AFTER_S <= h <= L.MAX_RETRY_AFTER_S for h in hints)
    # The refused came back after the hint, not at their own 50-300 ms backoff: an agent's next refusal
    # comes at least half its hint after the last (the client's jitter draws 0.5-1.5 of it). Not a count
    # of refusals an agent: how many it meets grows with how long the storm lasts, which a loaded machine
    # stretches (in CI once 25 s, 805 refusals of 169 agents, hints 1-2 s, each still kept).
    early = [(agent, round(t1 - t0, 3), h) for agent, times in said.items()
             for (t0, h), (t1, _) in itertools.pairwise(times) if t1 - t0 < 0.5 * h]
    assert not early, early[:5]
    # Nothing timed out and reconnected: every agent got in, on one stream each.
    assert opened == AGENTS, (refused, refused_agents, opened)
    # An agent that came back came back from a refusal: its last error says so, but for the refusals
    # read as a failed write's own error (above: the server counted them, the agent did not) and a few
    # a loaded machine adds (a CI run had one such agent, whose error it did not print): 5% at most.
    other = [c.last_error for c in clients if c.reconnects and "overloaded" not in c.last_error]
    print(f"FIGURES agents whose last error was not a refusal: {len(other)} {sorted(set(other))[:3]}")
    assert len(other) <= max(refused - len(read), 0) + 0.05 * refused_agents, (refused, len(read), other[:3])


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"opening": 512}, "512 streams wait for their first Ack (room for 512"),
    ({"opening": 900, "answer_rate": 150.0}, "900 streams wait for their first Ack (room for 750 at 150/s"),
    ({"first_ack_wait_s": 11.0}, "wait 11.0 s for their first Ack"),
    ({"loop_lag_s": 7.0}, "runs 7.0 s late"),
    ({"busy": 0.95, "busy_for_s": 12.0}, "busy 95% of the time for 12 s"),
])
def test_each_sign_of_saturation_refuses_with_a_retry_hint(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(StreamRefused) as got:
        admit_stream(10, kwargs.pop("loop_lag_s", 0.0), L.Limits(), **kwargs)
    assert got.value.code == grpc.StatusCode.UNAVAILABLE and got.value.reason == L.REFUSED_OVERLOADED
    assert says in str(got.value)
    (key, ms), = got.value.trailing_metadata()
    assert key == L.RETRY_AFTER_KEY and 1000 * L.MIN_RETRY_AFTER_S <= int(ms) <= 1000 * L.MAX_RETRY_AFTER_S
    admit_stream(10, 0.0, L.Limits(), opening=511, first_ack_wait_s=9.9, busy=0.89, busy_for_s=60.0)
    admit_stream(10, 0.0, L.Limits(), busy=0.99, busy_for_s=9.0)  # a burst shorter than the limit: let in
    admit_stream(10, 0.0, L.Limits(), opening=700, answer_rate=150.0)  # room for 750 at that rate


def test_a_refusal_read_through_a_failed_write_keeps_its_retry_hint() -> None:
    """A refused stream's status reaches the agent either as the read's error or, when its next write
    fails first, through the call's status (StreamEnded): the second way lost the trailing metadata,
    so that agent retried at its own 50 ms backoff instead of the hint (3 of 269 refusals in a loaded
    run of the storm above)."""
    from perfd.transport.client import _ended_with

    async def refuse(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async for _ in requests:  # the first message read, the stream refused with a hint
            context.set_trailing_metadata(((L.RETRY_AFTER_KEY, "1500"),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "overloaded: test")
        yield b""  # pragma: no cover - never reached

    async def body() -> tuple[BaseException | None, float | None]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "t.T", {"S": grpc.stream_stream_rpc_method_handler(refuse)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                call = ch.stream_stream("/t.T/S")()
                failed = None
                for _ in range(200):  # writes until one fails on the closed stream
                    try:
                        await call.write(b"x")
                    except Exception as e:
                        failed = e
                        break
                    await asyncio.sleep(0.01)
                ended = await _ended_with(call)
                return failed, retry_after(ended) if ended is not None else None
        finally:
            await server.stop(None)

    failed, hint = asyncio.run(body())
    assert failed is not None  # the write path was the one taken
    assert hint == 1.5

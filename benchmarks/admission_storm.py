"""`perfd bench admission`: a connect storm on one ingest server whose loop has no time left — what
admission refused, what the agents read of it, and how long every agent took to get in.

    perfd bench admission [--agents 200] [--hello-ms 25] [--runs 1] [--json]

Each run: a real grpc.aio ingest server in a process of its own, each Hello costing its loop
``--hello-ms`` on a CPU (a big series table's decode and admission), and ``--agents`` real
AgentClients connecting at once from this process. Without admission's signs other than the loop's
lag, 4,500 agents connecting at once got 1,259 connected, p50 34 s, and 0 overload refusals: the
lag stayed under its 5 s while Hellos queued inside gRPC, where the server cannot count them. The
figures say whether the loop's business (or the streams waiting for their first Ack) refused while
the lag alone would have let them in, whether each refusal the agents read carried its hint, whether
a refused agent came back after its hint rather than at its own 50-300 ms backoff, and whether every
agent got in on one stream.

Wall-clock figures of real processes: a machine whose other processes hold the CPUs starves the
server's process (its loop then runs late and admits the queued streams before any sign shows), and
moves every figure. The suite proves the signs, the hint and the client's wait on an injected clock
(tests/transport/test_admission_storm.py); this measures what they give on the machine it runs on.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import multiprocessing as mp
import os
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from perfd.core import limits as L  # noqa: E402
from perfd.transport import AgentClient, IngestServer  # noqa: E402
from perfd.transport.admission import StreamRefused, admit_stream  # noqa: E402
from perfd.transport.client import retry_after  # noqa: E402

DEADLINE_S = 120.0  # a storm not over by then is reported as such (agents_connected < agents)


def _burn(seconds: float) -> None:
    """The calling thread on a CPU for ``seconds`` (what decoding and admitting Hellos keep a loop at)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _serve(pipe: Connection, hello_cost_s: float) -> None:
    """A child process: an ingest server whose Hellos each cost its loop ``hello_cost_s`` on a CPU;
    says its port, then (asked) its loop's largest lag, its overload refusals, the streams it opened,
    and how many of its overload refusals it made while the lag was within its limit."""
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
        # And the loop refused on once busy 1 s on end (10 s by default: a storm of 200 is shorter).
        limits = L.Limits(hello_timeout_s=2.0, max_loop_busy_s=1.0)
        srv = IngestServer(lambda agent, b: None, on_hello=lambda info: _burn(hello_cost_s), limits=limits,
                           ack_interval_s=0.2)
        pipe.send(await srv.start("127.0.0.1", 0))
        lag = 0.0
        while not await asyncio.to_thread(pipe.poll, 0.1):
            lag = max(lag, srv.loop_lag_s)
        pipe.recv()
        pipe.send((lag, srv.refusals.get(L.REFUSED_OVERLOADED), srv.streams_opened, lag_within[0]))
        await srv.stop(None)

    asyncio.run(main())


async def storm(agents: int, hello_cost_s: float) -> dict[str, Any]:
    """One storm's figures (see the module's docstring). Every storm of a run on one event loop: grpc.aio
    binds its poller to the first loop it meets, and a second asyncio.run() hung on the closed one."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, hello_cost_s), daemon=True)
    proc.start()
    hints: list[float] = []
    read = 0  # the refusals the agents read as such
    said: dict[str, list[tuple[float, float]]] = {}  # each agent's hints: (when read, the hint)

    def answer() -> Any:
        """The server's next message; a server gone quiet for a minute is the bench's error."""
        if not parent.poll(60):
            raise RuntimeError(f"the storm's server (pid {proc.pid}) said nothing for 60 s")
        return parent.recv()

    try:
        port = await asyncio.to_thread(answer)
        clients = [AgentClient(f"127.0.0.1:{port}", f"a{k:05d}", jobs=["j"], backoff_initial_s=0.05,
                               backoff_max_s=0.3) for k in range(agents)]
        for c in clients:  # what each refused stream was told (the client consumes it)
            note = c._note_error

            def noting(e: BaseException, note: Any = note, agent: str = c.agent_id) -> None:
                nonlocal read
                note(e)
                if L.REFUSED_OVERLOADED in str(e.details() if isinstance(e, grpc.aio.AioRpcError) else e):
                    read += 1
                if (h := retry_after(e)) is not None:
                    hints.append(h)
                    said.setdefault(agent, []).append((time.monotonic(), h))
            c._note_error = noting  # type: ignore[method-assign]
        t0 = time.monotonic()
        tasks = [asyncio.create_task(c.run()) for c in clients]
        while not all(c.connected for c in clients) and time.monotonic() - t0 < DEADLINE_S:
            await asyncio.sleep(0.05)
        took, connected = time.monotonic() - t0, sum(c.connected for c in clients)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        parent.send("stop")
        lag, refused, opened, lag_within = await asyncio.to_thread(answer)
    finally:
        await asyncio.to_thread(proc.join, 10)
        if proc.is_alive():
            proc.kill()
    # A refused agent that came back sooner than half its hint (the client draws 0.5-1.5 of it).
    early = sum(1 for times in said.values() for (t0, h), (t1, _) in itertools.pairwise(times)
                if t1 - t0 < 0.5 * h)
    return {
        "agents": agents, "hello_cost_ms": round(hello_cost_s * 1e3, 1),
        "agents_connected": connected,
        "took_s": round(took, 2), "loop_lag_max_s": round(lag, 2),
        "overload_refusals": refused, "refused_agents": sum(1 for c in clients if c.reconnects),
        "refusals_lag_within_limit": lag_within, "refusals_read": read,
        "hints": len(hints), "hint_min_s": min(hints, default=None), "hint_max_s": max(hints, default=None),
        "came_back_early": early, "streams_opened": opened,
        "other_last_errors": sum(1 for c in clients if c.reconnects and "overloaded" not in c.last_error),
        "load_per_cpu": round(os.getloadavg()[0] / len(os.sched_getaffinity(0)), 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench admission", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=200, help="agents connecting at once (default %(default)s)")
    ap.add_argument("--hello-ms", type=float, default=25.0,
                    help="the server loop's CPU a Hello (default %(default)s)")
    ap.add_argument("--runs", type=int, default=1,
                    help="storms, each on a fresh server (default %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if a.agents < 1 or a.runs < 1 or a.hello_ms < 0:
        ap.error("--agents and --runs must be positive, --hello-ms not negative")
    # Each refused agent logs its refusal (a line per change of error): here they are the figures' counts.
    logging.getLogger("perfd.transport.client").setLevel(logging.ERROR)
    runs: list[dict[str, Any]] = []

    async def storms() -> None:
        for r in range(a.runs):
            runs.append(await storm(a.agents, a.hello_ms / 1e3))
            if not a.json:
                print(f"storm {r + 1}: " + ", ".join(f"{k} {v}" for k, v in runs[-1].items()), flush=True)

    asyncio.run(storms())
    if a.json:
        print(json.dumps({"runs": runs}))
    # A storm that did not end with every agent in is the bench's failure, whatever its figures.
    return 0 if all(x["agents_connected"] == x["agents"] for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

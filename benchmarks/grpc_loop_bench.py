"""The gRPC message path alone: what one inbound message, and one Ack, cost a grpc.aio server.

    python benchmarks/grpc_loop_bench.py --streams 1000 --pairs 4
    python benchmarks/grpc_loop_bench.py --streams 1000 --pairs 4 --loops uvloop --ack-intervals 2,5
    python benchmarks/grpc_loop_bench.py --streams 1000 --pairs 4 --loops uvloop \
        --grpc-experiments ,-event_engine_listener

A bare grpc.aio server (no perfd code: raw bytes in, an Ack-sized reply every ``--ack-intervals``
seconds per stream, as perfd's ingest coalesces Acks) in one process, run with each
``--grpc-experiments`` value as its GRPC_EXPERIMENTS ("" for gRPC's defaults), ``--streams`` client
streams each writing a 2 KB message a second from another (gRPC's defaults); the server process's
CPU over ``--seconds`` after ``--warmup``. Every combination of the options' values runs once per round,
``--pairs`` rounds, so each comparison is made within one run. This is the floor under perfd's own
work at N agents a second (benchmarks/README.md, "Scale").
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale_bench import free_port
from perfd.core import limits as L


def _server(port: int, loop: str, ack_interval: float) -> None:
    import grpc

    async def handler(requests: Any, context: Any) -> AsyncIterator[bytes]:
        last = time.monotonic()
        async for _ in requests:
            now = time.monotonic()
            if now - last >= ack_interval:
                last = now
                yield b"ack"

    async def main() -> None:
        s = grpc.aio.server()
        h = grpc.stream_stream_rpc_method_handler(handler)
        s.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.S", {"S": h}),))
        s.add_insecure_port(f"127.0.0.1:{port}")
        await s.start()
        await s.wait_for_termination()

    if loop == "uvloop":
        import uvloop
        uvloop.run(main())
    else:
        asyncio.run(main())


def _load(port: int, streams: int) -> None:
    import grpc

    async def one(ch: Any, i: int) -> None:
        call = ch.stream_stream("/bench.S/S")()
        reader = asyncio.create_task(call.read())  # keeps the reply side drained
        payload = os.urandom(2000)
        await asyncio.sleep(i % 1000 / 1000)
        while True:
            await call.write(payload)
            if reader.done():
                reader = asyncio.create_task(call.read())
            await asyncio.sleep(1.0)

    async def main() -> None:
        chans = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(streams)]
        await asyncio.gather(*(one(c, i) for i, c in enumerate(chans)))

    asyncio.run(main())


def measure(loop: str, streams: int, warmup: float, seconds: float, ack_interval: float = L.ACK_INTERVAL_S,
            experiments: str = "") -> float:
    import psutil

    sock_port = free_port()
    ctx = mp.get_context("spawn")
    srv = ctx.Process(target=_server, args=(sock_port, loop, ack_interval), daemon=True)
    before = os.environ.pop("GRPC_EXPERIMENTS", None)
    try:  # a spawned child takes the environment as it is at start
        if experiments:
            os.environ["GRPC_EXPERIMENTS"] = experiments
        srv.start()
    finally:
        os.environ.pop("GRPC_EXPERIMENTS", None)
        if before is not None:
            os.environ["GRPC_EXPERIMENTS"] = before
    time.sleep(1.0)
    load = ctx.Process(target=_load, args=(sock_port, streams), daemon=True)
    load.start()
    try:
        time.sleep(warmup)
        ps = psutil.Process(srv.pid)
        c0, t0 = ps.cpu_times(), time.perf_counter()
        time.sleep(seconds)
        c1, t1 = ps.cpu_times(), time.perf_counter()
        return ((c1.user + c1.system) - (c0.user + c0.system)) / (t1 - t0)
    finally:
        load.kill()
        srv.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=4, help="rounds, each running every combination once")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--loops", default="asyncio,uvloop", help="event loops to compare (default: %(default)s)")
    ap.add_argument("--ack-intervals", default=f"{L.ACK_INTERVAL_S:g}",
                    help="seconds between a stream's Acks, comma-separated (default: perfd's, %(default)s)")
    ap.add_argument("--grpc-experiments", default="",
                    help="the server's GRPC_EXPERIMENTS values, comma-separated runs of ';'-joined flags "
                         "('' = gRPC's defaults; default: %(default)r)")
    ns = ap.parse_args(argv)
    configs = [(loop, float(a), e.replace(";", ",")) for loop in ns.loops.split(",")
               for a in ns.ack_intervals.split(",") for e in ns.grpc_experiments.split(",")]
    got: dict[tuple[str, float, str], list[float]] = {c: [] for c in configs}

    def name(c: tuple[str, float, str]) -> str:
        return f"{c[0]:8s} ack every {c[1]:g} s, GRPC_EXPERIMENTS={c[2] or '(default)'}"

    for _ in range(ns.pairs):
        for c in configs:
            got[c].append(measure(c[0], ns.streams, ns.warmup, ns.seconds, c[1], c[2]))
            print(f"{name(c)}: {got[c][-1]:.3f} core", flush=True)
    base = configs[0]
    print(f"{ns.streams} streams, {ns.streams} messages/s; {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}")
    for c in configs:
        mean = statistics.mean(got[c])
        lower = sum(1 for x, y in zip(got[base], got[c], strict=True) if y < x)
        ratio = mean / statistics.mean(got[base])
        vs = "" if c == base else f" ({ratio:.2f} of the first; lower in {lower} of {ns.pairs} rounds)"
        print(f"  {name(c)}: {mean:.3f} core{vs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

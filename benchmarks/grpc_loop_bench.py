"""The gRPC message path alone, per event loop: what one inbound message costs a grpc.aio server.

    python benchmarks/grpc_loop_bench.py --streams 1000 --pairs 4

A bare grpc.aio server (no perfd code: raw bytes in, an Ack-sized reply every 2 s per stream, as
perfd's ingest coalesces Acks) in one process, ``--streams`` client streams each writing a 2 KB
message a second from another; the server process's CPU over ``--seconds`` after ``--warmup``,
asyncio's loop and uvloop alternated ``--pairs`` times. This is the floor under perfd's own work
at N agents a second (benchmarks/README.md, "Scale").
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


def _server(port: int, loop: str) -> None:
    import grpc

    async def handler(requests: Any, context: Any) -> AsyncIterator[bytes]:
        last = time.monotonic()
        async for _ in requests:
            now = time.monotonic()
            if now - last >= 2.0:
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


def measure(loop: str, streams: int, warmup: float, seconds: float) -> float:
    import psutil

    sock_port = free_port()
    ctx = mp.get_context("spawn")
    srv = ctx.Process(target=_server, args=(sock_port, loop), daemon=True)
    srv.start()
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
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ns = ap.parse_args(argv)
    got: dict[str, list[float]] = {"asyncio": [], "uvloop": []}
    for _ in range(ns.pairs):
        for loop in got:
            got[loop].append(measure(loop, ns.streams, ns.warmup, ns.seconds))
            print(f"{loop:8s} {got[loop][-1]:.3f} core", flush=True)
    a, u = statistics.mean(got["asyncio"]), statistics.mean(got["uvloop"])
    lower = sum(1 for x, y in zip(got["asyncio"], got["uvloop"], strict=True) if y < x)
    print(f"{ns.streams} streams, {ns.streams} messages/s: asyncio {a:.3f} core, uvloop {u:.3f} core "
          f"(uvloop/asyncio {u / a:.2f}; uvloop lower in {lower} of {ns.pairs} pairs); "
          f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

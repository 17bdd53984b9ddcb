"""Aggregator ingest rate: one IngestServer process, N AgentClients in another, on loopback.

    .venv/bin/python benchmarks/ingest_bench.py --agents 1,8 --samples 1000,5000 --seconds 10

The aggregator side is the real ``IngestServer`` (grpc.aio, decode, dedupe, cumulative acks) with
a counting ``on_batch``; the agents are real ``AgentClient``s (in-memory spools, columnar submit
with pre-resolved series ids, windowed sends), all in one child process so the server process
measures only itself. Each agent keeps at most two windows of batches pending, so the agents go
exactly as fast as the aggregator acknowledges. Counted: samples and batches delivered to
``on_batch`` during the measured window (after a warm-up), and the server process's CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a plain script

from perfd.transport import AgentClient, DecodedBatch, IngestServer


def _agents_main(port: int, n_agents: int, samples_per_batch: int, window: int, n_series: int,
                 stop: MpEvent, report: Connection) -> None:
    async def main() -> None:
        clients = [AgentClient(f"127.0.0.1:{port}", f"bench-{i}", window=window) for i in range(n_agents)]
        columns = []
        for c in clients:
            sids = [c.series_id("bench_metric", {"gpu": str(k % 8), "k": str(k)}) for k in range(n_series)]
            ids = [sids[j % n_series] for j in range(samples_per_batch)]
            t0 = time.time_ns()
            columns.append((ids, [t0 + j for j in range(samples_per_batch)],
                            [float(j) for j in range(samples_per_batch)]))
        tasks = [asyncio.create_task(c.run()) for c in clients]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        while not stop.is_set():
            # Top every agent up to two windows pending, then yield: the aggregator's acks pace us.
            for c, cols in zip(clients, columns, strict=True):
                while c.spool.pending_count() < 2 * window:
                    c.submit(columns=cols)
            await asyncio.sleep(0.001)
        agent_cores = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        counters = [c.counters() for c in clients]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        report.send({
            "agent_cpu_cores": agent_cores,
            "agent_batches_sent": sum(x["batches_sent"] for x in counters),
            "agent_resent": sum(x["resent"] for x in counters),
            "agent_reconnects": sum(x["reconnects"] for x in counters),
        })

    asyncio.run(main())


def run_ingest_bench(n_agents: int, samples_per_batch: int, seconds: float, *, window: int = 16,
                     n_series: int = 256, warmup_s: float = 2.0,
                     ack_interval_s: float = 0.002, sink: str = "count") -> dict[str, Any]:
    """Measure samples/s and batches/s ingested by one aggregator process; returns the numbers.

    ``sink="count"`` measures the transport alone (the callback only counts); ``sink="aggregator"``
    hands every batch to the real aggregator's ingest (latest value per series, job state)."""

    async def main() -> dict[str, Any]:
        got = {"batches": 0, "samples": 0}
        real: Any = None
        if sink == "aggregator":
            from perfd.aggregator.daemon import Aggregator, AggregatorConfig

            real = Aggregator(AggregatorConfig()).on_batch

        def on_batch(agent: str, b: DecodedBatch) -> None:
            if real is not None:
                real(agent, b)
            got["batches"] += 1
            got["samples"] += len(b.values)

        srv = IngestServer(on_batch, ack_interval_s=ack_interval_s)
        port = await srv.start("127.0.0.1", 0)
        ctx = mp.get_context("spawn")  # never fork a process that has gRPC threads running
        stop = ctx.Event()
        rx, tx = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_agents_main,
                           args=(port, n_agents, samples_per_batch, window, n_series, stop, tx), daemon=True)
        proc.start()
        try:
            await asyncio.sleep(warmup_s)
            b0, s0, c0, w0 = got["batches"], got["samples"], time.process_time(), time.perf_counter()
            await asyncio.sleep(seconds)
            b1, s1, c1, w1 = got["batches"], got["samples"], time.process_time(), time.perf_counter()
            stop.set()
            agent: dict[str, Any] = await asyncio.get_running_loop().run_in_executor(
                None, lambda: rx.recv() if rx.poll(30) else {})
        finally:
            stop.set()
            await asyncio.get_running_loop().run_in_executor(None, proc.join, 30)
            if proc.is_alive():
                proc.kill()
            await srv.stop(None)
        wall = w1 - w0
        sc = srv.counters()
        return {
            "sink": sink,
            "agents": n_agents,
            "samples_per_batch": samples_per_batch,
            "seconds": round(wall, 2),
            "samples_per_s": (s1 - s0) / wall,
            "batches_per_s": (b1 - b0) / wall,
            "server_cpu_cores": (c1 - c0) / wall,
            "samples_per_server_cpu_s": (s1 - s0) / max(c1 - c0, 1e-9),
            "acks_per_batch": sc["acks_sent"] / max(sc["batches"], 1),
            "duplicates": sc["duplicates"],
            "decode_errors": sc["decode_errors"],
            **agent,
        }

    return asyncio.run(main())


def machine() -> dict[str, str]:
    import google.protobuf
    import grpc

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": str(os.cpu_count()), "cpu": cpu, "python": platform.python_version(),
            "grpcio": grpc.__version__, "protobuf": google.protobuf.__version__}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'agents':>6} {'samples/batch':>13} {'samples/s':>12} {'batches/s':>10} "
          f"{'server cores':>12} {'samples/cpu-s':>13} {'agent cores':>11} {'acks/batch':>10} {'dups':>5}")
    for r in rows:
        print(f"{r['agents']:>6} {r['samples_per_batch']:>13} {r['samples_per_s']:>12,.0f} "
              f"{r['batches_per_s']:>10,.0f} {r['server_cpu_cores']:>12.2f} "
              f"{r['samples_per_server_cpu_s']:>13,.0f} {r.get('agent_cpu_cores', float('nan')):>11.2f} "
              f"{r['acks_per_batch']:>10.2f} {r['duplicates']:>5}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="1,8", help="comma-separated agent counts")
    ap.add_argument("--samples", default="1000,5000", help="comma-separated samples per batch")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--sink", choices=["count", "aggregator"], default="count",
                    help="count: the transport alone; aggregator: the real aggregator ingest")
    ns = ap.parse_args(argv)
    print(" ".join(f"{k}={v}" for k, v in machine().items()))
    rows = []
    for a in (int(x) for x in ns.agents.split(",")):
        for s in (int(x) for x in ns.samples.split(",")):
            rows.append(run_ingest_bench(a, s, ns.seconds, window=ns.window, sink=ns.sink))
            print_table(rows[-1:])
    print()
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

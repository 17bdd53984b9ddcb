"""`perfd bench scale`: one real `perfd aggregator` process under many simulated agents.

    perfd bench scale --agents 500 --seconds 20 [--procs 2] [--json]

The aggregator runs as it would in production (its own process, the shipped rule pack, /metrics);
the load comes from ``--procs`` separate processes, each running its share of the agents as real
``AgentClient`` streams (perfd's own protocol and codec) in one asyncio loop. Each agent stands for a
node of one training job: it sends 8 GPUs × 25 NVML-like series (200 samples, each series' newest
value every ``--sample-interval`` s, as the agent forwards them) and every second the job-level step
record of the iteration it is on (``--step-agents K``: only the first K agents do); agent 0 also
sends the step records of a probe job whose step time carries a marker, so the time from a sample
leaving an agent to the derived series showing on /metrics can be measured (/metrics is polled
until the marker appears).

Reported (``--json``: one object): agents, agents_connected (the aggregator's count: streams that
carried a message within its silence limit), samples_per_s (ingested by the aggregator over the
measured window), offered_samples_per_s, aggregator_cpu_cores and aggregator_rss_bytes (psutil on
its process), aggregator_gc_cores (its garbage collector), aggregator_thread_cpu_cores (by thread:
"main" is the event loop, "event_engine" gRPC's own threads, "python3" the HTTP and worker
threads), metrics_scrape_s and metrics_bytes (median of the scrapes), latency_p50_s and
latency_p99_s (sample to /metrics), and the load processes' CPU. Everything runs on this machine:
with 2 cores the load processes compete with the aggregator, so read the figures as a lower bound
of what a dedicated aggregator host does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfd.agent.config import AgentConfig  # noqa: E402
from perfd.aggregator.loops import EVENT_LOOPS, event_loop_runner  # noqa: E402
from perfd.aggregator.runtime import tune_gc  # noqa: E402
from perfd.core import limits as L  # noqa: E402

GPUS, SERIES_PER_GPU = 8, 25
PROBE_JOB = "scale-probe"


def _load(port: int, first: int, n: int, stop: MpEvent, marks: Any, cpu: Any, sample_every: float,
          step_agents: int | None) -> None:
    """One load process: agents ``first`` .. ``first + n - 1``, each a real AgentClient stream."""
    from perfd.core.model import StepRecord
    from perfd.transport import AgentClient

    # 2,000 clients in one process keep as many reads pending as the aggregator does: the same
    # collector thresholds, or this process's collections take CPU the aggregator needs.
    tune_gc()

    async def main() -> None:
        clients = [AgentClient(f"127.0.0.1:{port}", f"node-{i:05d}", jobs=["scale-job"])
                   for i in range(first, first + n)]
        ids = [[c.series_id(f"perfd_gpu_metric_{k}", {"gpu": str(g), "node": f"node-{first + j:05d}"})
                for g in range(GPUS) for k in range(SERIES_PER_GPU)] for j, c in enumerate(clients)]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        t_connect = time.perf_counter()
        connected_after: list[float | None] = [None] * len(clients)  # s from start to the first Ack
        it = 0
        t_cpu = time.process_time()
        t_wall = time.perf_counter()
        while not stop.is_set():
            tick = time.perf_counter()
            it += 1
            now_ns = time.time_ns()
            for j, c in enumerate(clients):
                if connected_after[j] is None and c.connected:
                    connected_after[j] = tick - t_connect
                if c.spool.pending_count() > c.window:
                    continue  # the aggregator is behind: what a real agent's spool holds back
                # What a real agent forwards (perfd.agent.reduce): each series' newest value every
                # `sample_every` seconds; the step record of each iteration at once.
                send_samples = sample_every <= 1.0 or (it + first + j) % round(sample_every) == 0
                vals = [float((it + k) % 100) for k in range(len(ids[j]))] if send_samples else []
                steps = []
                if step_agents is None or first + j < step_agents:
                    steps.append(StepRecord(job="scale-job", iteration=it, rank="last", end_time=now_ns / 1e9,
                                            step_time_ms=1000.0))
                if first + j == 0:  # the probe: its step time says when it left
                    mark = 1000.0 + (it % 1000)
                    steps.append(StepRecord(job=PROBE_JOB, iteration=it, rank="last", end_time=now_ns / 1e9,
                                            step_time_ms=mark))
                    marks.put((mark, time.time()))
                if not steps and not vals:
                    continue  # nothing new on this node this second: a real agent sends nothing
                c.submit(steps=steps, columns=(ids[j] if vals else [], [now_ns] * len(vals), vals))
            await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - tick)))
        cpu.put(((time.process_time() - t_cpu) / max(1e-9, time.perf_counter() - t_wall), connected_after))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _thread_cpu(ps: Any) -> dict[str, float]:
    """CPU seconds of the process's threads by kind: "main" (the event loop), then each OS thread
    name (Python's own threads are all "python3"; gRPC names its "event_engine", ...)."""
    out: dict[str, float] = {}
    for t in ps.threads():
        try:
            name = Path(f"/proc/{ps.pid}/task/{t.id}/comm").read_text().strip()
        except OSError:  # not Linux, or the thread has just ended
            name = "thread"
        key = "main" if t.id == ps.pid else name
        out[key] = out.get(key, 0.0) + t.user_time + t.system_time
    return out


def _get(url: str, timeout: float = 30.0) -> tuple[bytes, float]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read()
    return body, time.perf_counter() - t0


def _probe_value(text: str) -> float | None:
    key = f'perfd_job_step_time_seconds{{job_name="{PROBE_JOB}"}} '
    for line in text.splitlines():
        if line.startswith(key):
            return float(line[len(key):]) * 1000.0
    return None


def run_scale(agents: int, seconds: float, procs: int, warmup_s: float = 5.0,
              sample_every: float = 1.0, step_agents: int | None = None,
              event_loop: str = EVENT_LOOPS[0]) -> dict[str, Any]:
    import psutil

    grpc_port, http_port = free_port(), free_port()
    # The aggregator's output: removed after a run, kept (and named on stderr) when the run failed.
    tmp = tempfile.mkdtemp(prefix="perfd-scale-")
    ok = False
    out = open(os.path.join(tmp, "aggregator.out"), "wb")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    import subprocess

    agg = subprocess.Popen([sys.executable, "-m", "perfd.app.cli", "aggregator", "--grpc-port",
                            str(grpc_port),
                            "--http-port", str(http_port), "--gpu", "NVIDIA H100 80GB HBM3",
                            "--event-loop", event_loop,
                            # every simulated agent comes from this one address: one identity
                            "--max-series-per-identity", str(max(L.MAX_SERIES_PER_IDENTITY,
                                                                 2 * agents * GPUS * SERIES_PER_GPU))],
                           cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http_port}"
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    marks, cpu = ctx.Queue(), ctx.Queue()
    loaders = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"{base}/healthz", 2)
                break
            except OSError:
                if time.monotonic() > deadline or agg.poll() is not None:
                    raise RuntimeError("the aggregator did not start") from None
                time.sleep(0.2)
        per = [agents // procs + (1 if i < agents % procs else 0) for i in range(procs)]
        first = 0
        for n in per:
            p = ctx.Process(target=_load, daemon=True,
                            args=(grpc_port, first, n, stop, marks, cpu, sample_every, step_agents))
            p.start()
            loaders.append(p)
            first += n
        ps = psutil.Process(agg.pid)
        time.sleep(warmup_s)

        def stats() -> dict[str, Any]:
            return dict(json.loads(_get(f"{base}/api/stats")[0]))

        s0, c0, t0, th0 = stats(), ps.cpu_times(), time.perf_counter(), _thread_cpu(ps)
        sent: dict[float, float] = {}
        lat: list[float] = []
        scrapes: list[tuple[float, int]] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            while not marks.empty():
                m, t = marks.get()
                sent[m] = t
            body, took = _get(f"{base}/metrics")
            scrapes.append((took, len(body)))
            v = _probe_value(body.decode(errors="replace"))
            if v is not None and round(v, 3) in sent:
                lat.append(time.time() - sent.pop(round(v, 3)))
            time.sleep(0.2)
        s1, c1, t1, th1 = stats(), ps.cpu_times(), time.perf_counter(), _thread_cpu(ps)
        rss = ps.memory_info().rss
        wall = t1 - t0
        tr = s1.get("transport") or {}
        gc0, gc1 = (s0.get("transport") or {}).get("gc_ms"), tr.get("gc_ms")
        res: dict[str, Any] = {
            "agents": agents, "procs": procs, "seconds": seconds,
            "agents_connected": tr.get("agents_connected"),
            "samples_per_s": (s1["samples_ingested"] - s0["samples_ingested"]) / wall,
            "offered_samples_per_s": agents * GPUS * SERIES_PER_GPU / max(1.0, round(sample_every)),
            "node_samples_per_s_on_agents": agents * GPUS * SERIES_PER_GPU,
            "sample_interval_s": sample_every,
            "step_agents": agents if step_agents is None else min(step_agents, agents),
            "event_loop": event_loop_runner(event_loop)[0],
            "overloaded_refusals": tr.get("refused_overloaded", 0),
            "hellos_reused": tr.get("hellos_reused"),
            "step_records_per_s": (s1["step_records_ingested"] - s0["step_records_ingested"]) / wall,
            "aggregator_cpu_cores": ((c1.user + c1.system) - (c0.user + c0.system)) / wall,
            "aggregator_rss_bytes": rss,
            "aggregator_gc_cores": (gc1 - gc0) / 1000 / wall if gc0 is not None and gc1 is not None else None,
            "aggregator_thread_cpu_cores": {k: round(max(0.0, v - th0.get(k, 0.0)) / wall, 4)
                                            for k, v in sorted(th1.items())},
            "metrics_scrape_s": statistics.median(x[0] for x in scrapes) if scrapes else None,
            "metrics_scrape_max_s": max(x[0] for x in scrapes) if scrapes else None,
            "metrics_bytes": int(statistics.median(x[1] for x in scrapes)) if scrapes else None,
            "latency_p50_s": statistics.median(lat) if lat else None,
            "latency_p99_s": sorted(lat)[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
            "latency_samples": len(lat),
            "stream_resends": tr.get("duplicates"),
            "streams_opened": tr.get("streams_opened"),
            "warmup_s": warmup_s,
        }
        stop.set()
        loads = []
        for _ in loaders:
            try:
                loads.append(cpu.get(timeout=30))
            except Exception:
                break
        res["load_cpu_cores"] = sum(x[0] for x in loads) if loads else None
        # The connect storm: every agent starts at once; when each first counted as connected (1 s ticks).
        after = sorted(t for x in loads for t in x[1] if t is not None)
        res["connect_p50_s"] = round(after[len(after) // 2], 1) if after else None
        res["connect_p99_s"] = round(after[min(len(after) - 1, int(0.99 * len(after)))], 1) if after else None
        res["never_connected"] = sum(1 for x in loads for t in x[1] if t is None)
        res["machine"] = f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}"
        ok = True
        return res
    finally:
        stop.set()
        for p in loaders:
            p.join(10)
            if p.is_alive():
                p.kill()
        agg.terminate()
        try:
            agg.wait(15)
        except Exception:
            agg.kill()
        out.close()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"perfd bench scale: the aggregator's output is kept in {tmp}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=100, help="simulated agents (nodes) (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window (default: %(default)s)")
    ap.add_argument("--procs", type=int, default=2, help="load processes (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--warmup", type=float, default=5.0,
                    help="seconds between starting the agents and the measured window: thousands of "
                         "agents connecting at once take a while (default: %(default)s)")
    ap.add_argument("--sample-interval", type=float, default=AgentConfig.aggregator_sample_interval_s,
                    help="seconds between an agent's forwarded values of one series, as perfd.agent.reduce "
                         "does (default: the agent's default, %(default)s; 1: every 1 Hz sample)")
    ap.add_argument("--step-agents", type=int, default=None,
                    help="how many agents send the job's step record every second (default: all, the "
                         "shape of the step hook on every rank; 1: a Megatron log, whose iteration "
                         "lines come from the node of the last rank — the others send only their "
                         "reduced samples)")
    ap.add_argument("--event-loop", choices=EVENT_LOOPS, default=EVENT_LOOPS[0],
                    help="the aggregator's --event-loop (default: %(default)s)")
    ns = ap.parse_args(argv)
    if ns.step_agents is not None and ns.step_agents < 0:
        print("perfd bench scale: --step-agents must be >= 0", file=sys.stderr)
        return 2
    if ns.agents < 1 or ns.procs < 1 or ns.seconds <= 0 or ns.warmup < 0:
        print("perfd bench scale: --agents, --procs and --seconds must be positive, --warmup >= 0",
              file=sys.stderr)
        return 2
    res = run_scale(ns.agents, ns.seconds, min(ns.procs, ns.agents), warmup_s=ns.warmup,
                    sample_every=ns.sample_interval, step_agents=ns.step_agents, event_loop=ns.event_loop)
    if ns.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:24s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

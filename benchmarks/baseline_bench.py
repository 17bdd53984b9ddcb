"""`perfd bench baseline`: what one steady GPU sighting of a big job costs the aggregator.

    perfd bench baseline [--nodes 1,10,100,1000] [--gpus 8] [--calls 20] [--json]

While a job steps with no incident open, each new analysis of it takes a steady sighting of its GPUs
at most every BASELINE_EVERY_S (perfd.aggregator.incidents): ``Sightings.baseline_sighting``
reads the job's GPU view, places every rank (``place_ranks``) and computes ``gpu_hints`` for all of
them, then adds the evidence to ``GpuBaseline``. ``perfd bench scale`` never reaches that work (its
agents send no process lists, so no rank is placed and the sighting returns early).

Here one in-process ``Aggregator`` (no server) is fed through its real ingest path, as a gRPC stream
would leave it: for each of N nodes an agent ``node-NNNNN`` says hello for the job, then sends one
batch (``encode_batch`` → ``decode_batch`` → ``Aggregator.on_batch``) holding, per GPU, the NVML
collector's series (the names and labels collectors/nvml emits, throttle flags for every reason) and
its ``gpu_processes`` event, built by the collector's own ``ProcessTracker`` with one training
process per GPU that declares RANK, LOCAL_RANK, WORLD_SIZE and PERFD_JOB; node 0 sends the job's
step record. Every 97th GPU runs 12 °C hot with its SM clock 25% low, and every 89th holds a foreign
process, so some hints carry evidence. Before each timed call node 0 sends a fresh step record
(untimed) so the job is stepping; the benchmark fails if any rank is left unplaced or a call did not
add a sighting (the early return would measure nothing).

Timed per call (``time.perf_counter`` and process CPU time, median and p90 over ``--calls``):
the sighting, and its parts (``gpu_view``, ``place_ranks``, ``gpu_hints`` over all ranks); and
``Sightings.gpu_snapshot`` for an incident naming one rank and for one naming none (the job's GPUs that stand
out), reading the view anew each call (``one_rank``, ``no_rank``; the rank placement held, as no
process list changes) and from a view already read (``*_view_held``: another incident of the same
analysis pass, or a big job's kept view), and the view's read alone (``view_read``);
``snapshot_view_kept_s``: how long a pass's snapshots keep one view of a job of this size.
``cpu_share_at_1hz``: the sighting's median CPU time / BASELINE_EVERY_S, the share of one core such a
job would cost while it steps at one sighting per BASELINE_EVERY_S; ``interval_s`` and
``cpu_share_at_interval``: the interval ``GpuBaseline.due`` keeps for a job of this size (stretched
above BASELINE_RANKS_PER_EVERY_S ranks) and the share at that rate. A sighting is taken at most that
often, and only when a new analysis comes (a job stepping slower takes one per step). Also timed:
``job_overview`` (its liveness asks whether any rank is placed; /metrics and the rules ask for it)
and ``placed_ranks``, both with the job's placement held.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.gpu_views import SIGHTING_SERIES as _SIGHTING_SERIES
from perfd.aggregator.incidents import BASELINE_EVERY_S
from perfd.aggregator.runtime import GC_THRESHOLDS
from perfd.aggregator.snapshot import overview_of
from perfd.analytics.incidents.attribution import gpu_hints, place_ranks
from perfd.analytics.incidents.detect import Incident
from perfd.collectors.nvml.collector import THROTTLE_REASONS
from perfd.collectors.nvml.processes import GpuProcess, ProcessTracker
from perfd.core.model import StepRecord
from perfd.transport.codec import decode_batch, encode_batch
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.series import SeriesTable

JOB = "bench-job"
MODEL = "NVIDIA H100 80GB HBM3"
HOT_EVERY, COTENANT_EVERY = 97, 89  # every k-th GPU of the job stands out (hot and slow; a co-tenant)


def _gpu_values(rank: int) -> dict[str, float]:
    """One GPU's NVML readings (the collector's names), a steady H100 under training load."""
    hot = rank % HOT_EVERY == HOT_EVERY - 1
    return {
        "perfd_gpu_utilization_ratio": 0.98, "perfd_gpu_memory_utilization_ratio": 0.41,
        "perfd_gpu_memory_used_bytes": 61e9, "perfd_gpu_memory_total_bytes": 85e9,
        "perfd_gpu_power_watts": 540.0 + rank % 7, "perfd_gpu_power_limit_watts": 700.0,
        "perfd_gpu_energy_joules_total": 1e7 + rank,
        "perfd_gpu_temperature_celsius": 62.0 + (12 if hot else 0),
        "perfd_gpu_sm_clock_hertz": 1.98e9 * (0.75 if hot else 1.0), "perfd_gpu_mem_clock_hertz": 2.619e9,
        "perfd_gpu_throttle_reasons": 0.0, "perfd_gpu_xid_errors_total": 0.0, "perfd_gpu_processes": 1.0,
    }


class _Node:
    """One node's agent: its series table, stream table and sequence number."""

    def __init__(self, j: int, nodes: int, gpus: int) -> None:
        self.id = f"node-{j:05d}"
        self.j, self.nodes, self.gpus = j, nodes, gpus
        self.table = SeriesTable()
        self.stream: dict[int, Any] = {}  # the aggregator's side of this stream (decode_batch's table)
        self.seq = 0

    def _env(self, pid: int) -> dict[str, int | str]:
        local = pid - self._pid0
        if not 0 <= local < self.gpus:
            return {}  # a co-tenant: its environment declares no rank of this job
        return {"rank": self.j * self.gpus + local, "local_rank": local,
                "world_size": self.nodes * self.gpus, "job": JOB}

    @property
    def _pid0(self) -> int:
        return 100_000 + self.j * 1_000

    def batch(self, agg: Aggregator, now: float, steps: list[StepRecord]) -> None:
        """Samples and process events of its GPUs (``steps`` too), through encode, decode and on_batch."""
        tracker = ProcessTracker(lookup=lambda pid: ("python", "python pretrain_gpt.py --bf16"),
                                 env_lookup=self._env, user_lookup=lambda pid: "trainer")
        ids: list[int] = []
        vals: list[float] = []
        events: list[dict[str, Any]] = []
        for g in range(self.gpus):
            rank = self.j * self.gpus + g
            labels = {"gpu": str(g), "uuid": f"GPU-{self.j:05d}-{g}", "model": MODEL}
            for name, v in _gpu_values(rank).items():
                ids.append(self.table.id_for(name, {**labels, "node": self.id}))
                vals.append(v)
            for reason, _bit in THROTTLE_REASONS:  # throttle_zeros: every reason, 0 when inactive
                ids.append(self.table.id_for("perfd_gpu_throttle_active",
                                             {**labels, "reason": reason, "node": self.id}))
                vals.append(0.0)
            procs = [GpuProcess(self._pid0 + g, 60_000_000_000)]
            if rank % COTENANT_EVERY == COTENANT_EVERY - 1:
                procs.append(GpuProcess(900_000 + rank, 2_000_000_000))  # declares no rank: foreign
            ev = tracker.update(dict(labels), procs, now)
            assert ev is not None
            ev["labels"]["node"] = self.id  # what the agent adds (perfd.agent.node_agent)
            events.append(dict(ev))
        ns = int(now * 1e9)
        self.send(agg, encode_batch(self.id, self._next(), [], steps, events, self.table, created_ns=ns,
                                    columns=(ids, [ns] * len(ids), vals)))

    def send_steps(self, agg: Aggregator, steps: list[StepRecord]) -> None:
        self.send(agg, encode_batch(self.id, self._next(), [], steps, [], self.table))

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def send(self, agg: Aggregator, b: pb.Batch) -> None:
        raw = pb.AgentMessage(batch=b).SerializeToString()
        d = decode_batch(pb.AgentMessage.FromString(raw).batch, self.stream)
        agg.on_batch(d.agent_id, d)


def _step(it: int) -> StepRecord:
    return StepRecord(job=JOB, iteration=it, rank="last", end_time=time.time(), step_time_ms=1000.0)


def _timed(fn: Callable[[], Any], calls: int) -> dict[str, float]:
    """Median and p90 of wall and process CPU seconds per call (the collector on, as in production)."""
    wall, cpu = [], []
    for _ in range(calls):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return {"wall_s_median": statistics.median(wall), "wall_s_p90": _p90(wall),
            "cpu_s_median": statistics.median(cpu), "cpu_s_p90": _p90(cpu)}


def _p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10, method="inclusive")[-1] if len(xs) > 1 else xs[0]


def build(nodes: int, gpus: int) -> tuple[Aggregator, list[_Node]]:
    """An aggregator holding one job of ``nodes`` × ``gpus`` ranks, each placed on its GPU."""
    agg = Aggregator(AggregatorConfig(rules_files=[], gpu=MODEL))
    agents = [_Node(j, nodes, gpus) for j in range(nodes)]
    now = time.time()
    for a in agents:
        agg.on_hello_jobs(a.id, [JOB])  # what the server does with a Hello
        a.batch(agg, now, [_step(0)] if a.j == 0 else [])
    return agg, agents


def run(nodes: int, gpus: int, calls: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    agg, agents = build(nodes, gpus)
    built_s = time.perf_counter() - t0
    st = agg.state
    ranks = nodes * gpus
    procs = st.gpu_procs(JOB)
    placed = place_ranks(procs, job=JOB)
    if len(placed) != ranks or sorted(placed) != list(range(ranks)):
        raise SystemExit(f"perfd bench baseline: {len(placed)} of {ranks} ranks placed: the sighting would "
                         "not measure the real work")
    n_before = st.gpu_baseline.sightings(JOB)
    times: list[float] = []
    cpus: list[float] = []
    for i in range(calls):
        agents[0].send_steps(agg, [_step(i + 1)])  # the job is stepping (untimed)
        t, c = time.perf_counter(), time.process_time()
        st.sightings.baseline_sighting(JOB, time.time())
        cpus.append(time.process_time() - c)
        times.append(time.perf_counter() - t)
    taken = st.gpu_baseline.sightings(JOB) - n_before
    if taken != calls:
        raise SystemExit(f"perfd bench baseline: {taken} of {calls} calls took a sighting (early return)")
    seen = st.gpu_baseline._seen.get(JOB)
    kinds = sorted({k for _r, k in seen}) if seen else []
    interval = st.gpu_baseline.interval_s(JOB)  # what due() waits between two sightings of this job

    procs, values, throttles = st.gpu_view(JOB, _SIGHTING_SERIES)
    parts = {
        "gpu_view": _timed(lambda: st.gpu_view(JOB, _SIGHTING_SERIES), calls),  # as the sighting reads it
        "gpu_view_all_series": _timed(lambda: st.gpu_view(JOB), calls),  # every GPU series (the API's view)
        "place_ranks": _timed(lambda: place_ranks(procs, job=JOB), calls),
        "gpu_hints": _timed(lambda: gpu_hints(sorted(placed), placed, values, throttles, procs, time.time()),
                            calls),
    }
    common: dict[str, Any] = {"first_iteration": 1, "last_iteration": 2, "n_iterations": 2, "cost_s": 1.0,
                              "steady_step_ms": 1000.0, "median_step_ms": 1500.0, "max_step_ms": 2000.0,
                              "open": True}
    one = Incident(id="bench-one", kinds=["straggler"], ranks=[ranks - 1], **common)
    none = Incident(id="bench-none", kinds=["slow-steps"], ranks=[], **common)
    snap_one = st.sightings.gpu_snapshot(JOB, one)
    snap_none = st.sightings.gpu_snapshot(JOB, none)
    view = st.sightings.read_view(JOB)
    snapshot = {  # the view read anew each call (the placement held: no process list changed)
        "one_rank": {**_timed(lambda: st.sightings.gpu_snapshot(JOB, one), calls),
                     "ranks_in_snapshot": len(snap_one)},
        "no_rank": {**_timed(lambda: st.sightings.gpu_snapshot(JOB, none), calls),
                    "ranks_in_snapshot": len(snap_none)},
        "view_read": _timed(lambda: st.sightings.read_view(JOB), calls),  # once per pass at most
        # from a view already read (another incident of the same pass, or a big job's kept view)
        "one_rank_view_held": _timed(lambda: st.sightings.gpu_snapshot(JOB, one, view), calls),
        "no_rank_view_held": _timed(lambda: st.sightings.gpu_snapshot(JOB, none, view), calls),
    }
    st.placed_ranks(JOB)  # held from here on (the snapshots above already filled it)
    sight = {"wall_s_median": statistics.median(times), "wall_s_p90": _p90(times),
             "cpu_s_median": statistics.median(cpus), "cpu_s_p90": _p90(cpus)}
    return {"nodes": nodes, "gpus_per_node": gpus, "ranks": ranks, "ranks_placed": len(placed),
            "calls": calls, "sightings_taken": taken, "evidence_kinds_seen": kinds,
            "build_s": round(built_s, 3), "sighting": sight,
            "cpu_share_at_1hz": sight["cpu_s_median"] / BASELINE_EVERY_S,
            "baseline_every_s": BASELINE_EVERY_S, "interval_s": interval,
            "cpu_share_at_interval": sight["cpu_s_median"] / interval, "parts": parts,
            "gpu_snapshot": snapshot,
            # how long a pass's snapshots keep one view of this job (0: read at every pass)
            "snapshot_view_kept_s": max(0.0, interval - BASELINE_EVERY_S),
            "job_overview": _timed(lambda: overview_of(st.snapshot(JOB)), calls),  # placement held
            "placed_ranks": _timed(lambda: st.placed_ranks(JOB), calls)}  # held: a copy of the mapping


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench baseline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,10,100,1000",
                    help="comma-separated job sizes in nodes (default: %(default)s)")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs (ranks) per node (default: %(default)s)")
    ap.add_argument("--calls", type=int, default=20, help="timed calls per size (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ns = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in ns.nodes.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or ns.gpus < 1 or ns.calls < 1:
        print("perfd bench baseline: --nodes (comma-separated), --gpus and --calls must be >= 1",
              file=sys.stderr)
        return 2
    out: dict[str, Any] = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                           "cpus": os.cpu_count(), "python": platform.python_version(),
                           "gc_thresholds": list(GC_THRESHOLDS), "runs": []}
    # The aggregator process's collector thresholds (perfd.aggregator.runtime.tune_gc), restored after.
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        for n in sizes:
            gc.collect()
            out["runs"].append(run(n, ns.gpus, ns.calls))
    finally:
        gc.set_threshold(*before)
    if ns.json:
        print(json.dumps(out, indent=1))
        return 0
    for r in out["runs"]:
        s, p = r["sighting"], r["parts"]
        at = f"; every {r['interval_s']:.1f} s: {r['cpu_share_at_interval'] * 100:.2f}%" \
            if r["interval_s"] != r["baseline_every_s"] else ""
        ms = {k: v["cpu_s_median"] * 1e3 for k, v in p.items()}
        snap = {k: v["cpu_s_median"] * 1e3 for k, v in r["gpu_snapshot"].items()}
        print(f"{r['nodes']} nodes x {r['gpus_per_node']} GPUs ({r['ranks_placed']} ranks placed): sighting "
              f"{s['cpu_s_median'] * 1e3:.2f} ms CPU median (p90 {s['cpu_s_p90'] * 1e3:.2f}, wall "
              f"{s['wall_s_median'] * 1e3:.2f}) = {r['cpu_share_at_1hz'] * 100:.2f}% of a core at one per "
              f"{r['baseline_every_s']:g} s{at}; gpu_view {ms['gpu_view']:.2f}, place_ranks "
              f"{ms['place_ranks']:.2f}, gpu_hints {ms['gpu_hints']:.2f} ms; gpu_snapshot one rank "
              f"{snap['one_rank']:.2f} ms, none {snap['no_rank']:.2f} ms (view held: "
              f"{snap['one_rank_view_held']:.2f}, {snap['no_rank_view_held']:.2f}); job_overview "
              f"{r['job_overview']['cpu_s_median'] * 1e3:.2f} ms")
    print(f"({out['machine']}, {out['cpus']} CPUs, python {out['python']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

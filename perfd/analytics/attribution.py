"""Join ranks with the state of their GPUs: where each rank runs, and why a slow one may be slow.

Pure: the aggregator hands in what the agents reported (process lists with the rank each process
declares in its environment, and the latest NVML values of each GPU). A rank whose GPU cannot be
named stays unplaced; nothing is inferred from GPU indices or rank order.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GpuKey = tuple[str, str]  # (node, gpu index)

# Throttle reasons that slow a GPU down (gpu_idle and applications_clocks are not slowdowns).
SLOWING_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake",
                   "sync_boost")


@dataclass
class RankPlacement:
    rank: int
    node: str
    gpu: str
    pid: int
    local_rank: int | None = None
    world_size: int | None = None


@dataclass
class GpuHint:
    rank: int
    node: str | None
    gpu: str | None
    observations: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "gpu": self.gpu,
                "observations": list(self.observations), "evidence": dict(self.evidence)}


def place_ranks(processes: Mapping[GpuKey, Sequence[Mapping[str, Any]]],
                world_size: int | None = None) -> dict[int, RankPlacement]:
    """rank -> placement from the per-GPU process lists. With ``world_size`` given, processes that
    declare another world size belong to another job and are not placed."""
    out: dict[int, RankPlacement] = {}
    for (node, gpu), procs in sorted(processes.items()):
        for p in procs:
            rank = p.get("rank")
            if not isinstance(rank, int):
                continue
            ws = p.get("world_size")
            if world_size is not None and isinstance(ws, int) and ws != world_size:
                continue
            out[rank] = RankPlacement(rank, node, gpu, int(p["pid"]), p.get("local_rank"), ws)
    return out


def foreign_processes(placement: RankPlacement,
                      procs: Sequence[Mapping[str, Any]],
                      job_pids: Iterable[int]) -> list[Mapping[str, Any]]:
    """Processes on a rank's GPU that are not ranks of this job (a co-tenant, a stray notebook)."""
    mine = set(job_pids)
    return [p for p in procs if int(p.get("pid", -1)) not in mine]


def _median(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def gpu_hints(candidates: Sequence[int], placements: Mapping[int, RankPlacement],
              gpu_values: Mapping[GpuKey, Mapping[str, float]],
              throttles: Mapping[GpuKey, Sequence[str]],
              processes: Mapping[GpuKey, Sequence[Mapping[str, Any]]]) -> list[GpuHint]:
    """For each candidate (a straggler or slow rank), what its GPU shows against the job's other
    GPUs: lower SM clock, an active slowing throttle reason, higher temperature, another process."""
    job_gpus = {(p.node, p.gpu) for p in placements.values()}
    job_pids = [p.pid for p in placements.values()]
    med_clock = _median(gpu_values.get(k, {}).get("perfd_gpu_sm_clock_hertz") for k in job_gpus)
    med_temp = _median(gpu_values.get(k, {}).get("perfd_gpu_temperature_celsius") for k in job_gpus)
    hints = []
    for rank in candidates:
        pl = placements.get(rank)
        if pl is None:
            hints.append(GpuHint(rank, None, None, [
                f"rank {rank}'s GPU is unknown: no process on the job's nodes declares RANK={rank} "
                "(the agent needs the host pid namespace to read it)"]))
            continue
        key = (pl.node, pl.gpu)
        vals = gpu_values.get(key, {})
        h = GpuHint(rank, pl.node, pl.gpu, evidence={"pid": pl.pid, **{
            k: vals[k] for k in ("perfd_gpu_sm_clock_hertz", "perfd_gpu_power_watts",
                                 "perfd_gpu_temperature_celsius", "perfd_gpu_utilization_ratio")
            if k in vals}})
        clock = vals.get("perfd_gpu_sm_clock_hertz")
        if clock is not None and med_clock and clock < 0.95 * med_clock:
            h.observations.append(f"SM clock {clock / 1e6:.0f} MHz, {100 * (1 - clock / med_clock):.0f}% "
                                  f"below the job's median {med_clock / 1e6:.0f} MHz")
        slowing = [r for r in throttles.get(key, ()) if r in SLOWING_REASONS]
        if slowing:
            h.observations.append("clocks throttled: " + ", ".join(slowing))
            h.evidence["throttle_reasons"] = slowing
        temp = vals.get("perfd_gpu_temperature_celsius")
        if temp is not None and med_temp is not None and temp >= med_temp + 10:
            h.observations.append(f"temperature {temp:.0f} C against the job's median {med_temp:.0f} C")
        others = foreign_processes(pl, processes.get(key, ()), job_pids)
        if others:
            names = ", ".join(
                f"pid {p.get('pid')} ({p.get('cmdline') or p.get('name') or 'name not visible'})"
                for p in others[:3])
            h.observations.append(f"shares its GPU with {len(others)} other process(es): {names}")
            h.evidence["foreign_processes"] = [dict(p) for p in others]
        if not h.observations:
            h.observations.append("its GPU looks like the others (clock, throttling, temperature, no "
                                  "other process): look at its data loading or host instead")
        hints.append(h)
    return hints

"""Join ranks with the state of their GPUs: where each rank runs, and why a slow one may be slow.

Pure: the aggregator hands in what the agents reported (process lists with the rank each process
declares in its environment, and the latest NVML values of each GPU). A rank whose GPU cannot be
named stays unplaced; nothing is inferred from GPU indices or rank order.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeGuard

from perfd.analytics import thresholds as th
from perfd.analytics.incidents.evidence import Evidence, EvidenceKind, causal_key

GpuKey = tuple[str, str]  # (node, gpu index)

# Throttle reasons that slow a GPU down (gpu_idle and applications_clocks are not slowdowns), and
# those of them the hardware asserts (a fault or an emergency brake, above any software limit).
SLOWING_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake",
                   "sync_boost")
HARDWARE_REASONS = ("hw_slowdown", "hw_thermal", "hw_power_brake")
CLOCK_DROP_RATIO = th.CLOCK_DROP_RATIO.value
HOT_DELTA_C = th.HOT_DELTA_C.value
POWER_AT_LIMIT = th.POWER_AT_LIMIT.value
# The GPU values gpu_hints reads (besides the throttle flags): a caller may fetch only these.
HINT_SERIES = ("perfd_gpu_sm_clock_hertz", "perfd_gpu_power_watts", "perfd_gpu_power_limit_watts",
               "perfd_gpu_temperature_celsius", "perfd_gpu_utilization_ratio")


@dataclass
class RankPlacement:
    rank: int
    node: str
    gpu: str
    pid: int
    local_rank: int | None = None
    world_size: int | None = None


class GpuSeen(str, enum.Enum):
    """What a rank's GPU shows against the job's others, as its observations say it (worded where
    shown: perfd.report.incident_text.seen_text; the items are the hint's or the snapshot's)."""

    NO_GPU = "no_gpu"  # a CPU job's rank on no GPU: nothing to say of a GPU
    UNPLACED = "unplaced"  # its GPU is unknown (no placement)
    LIKE_OTHERS = "like_others"  # nothing stands out: look at its data loading or host
    ITEMS = "items"  # its items, each its own sentence


def gpu_seen(placed: bool, items: Sequence[Evidence], cpu_only: bool = False) -> GpuSeen:
    """The kind of a rank's observations; ``cpu_only``: the job computes on CPUs."""
    if not placed:
        return GpuSeen.NO_GPU if cpu_only else GpuSeen.UNPLACED
    return GpuSeen.ITEMS if items else GpuSeen.LIKE_OTHERS


@dataclass
class GpuHint:
    """What a rank's GPU shows against the job's other GPUs: typed evidence (``items``), and the
    numbers read (``evidence``). Its sentences and JSON are made where shown
    (perfd.report.incident_text.gpu_observations, hint_json)."""

    rank: int
    node: str | None
    gpu: str | None
    items: list[Evidence] = field(default_factory=list)
    evidence: dict[str, float | list[str]] = field(default_factory=dict)
    placed: bool = True


def place_ranks(processes: Mapping[GpuKey, Sequence[Mapping[str, object]]],
                world_size: int | None = None, job: str | None = None) -> dict[int, RankPlacement]:
    """rank -> placement from the per-GPU process lists. Processes that declare another world size
    (with ``world_size`` given) or another job (``job`` given; PERFD_JOB in their environment) belong
    to another job and are not placed: on a shared GPU they stay foreign processes. A process
    without an int ``pid`` and ``rank`` is not placed (the aggregator refuses such entries where
    they arrive, perfd.core.events.checked; a list from anywhere else must not raise here either)."""
    out: dict[int, RankPlacement] = {}
    for (node, gpu), procs in sorted(processes.items()):
        for p in procs:
            rank, pid = p.get("rank"), p.get("pid")
            if not _is_int(rank) or not _is_int(pid):
                continue
            declared = p.get("job")
            if job is not None and isinstance(declared, str) and declared and declared != job:
                continue
            ws = p.get("world_size")
            if world_size is not None and isinstance(ws, int) and ws != world_size:
                continue
            local = p.get("local_rank")
            out[rank] = RankPlacement(rank, node, gpu, pid, local if _is_int(local) else None,
                                      ws if _is_int(ws) else None)
    return out


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def foreign_processes(placement: RankPlacement,
                      procs: Sequence[Mapping[str, object]],
                      job_pids: Iterable[int]) -> list[Mapping[str, object]]:
    """Processes on a rank's GPU that are not ranks of this job (a co-tenant, a stray notebook).
    ``job_pids`` as a set is used as it is: a caller asking for every rank passes one set, not a
    copy per rank (8,000 ranks: 8,000 copies of 8,000 pids per call)."""
    mine = job_pids if isinstance(job_pids, (set, frozenset)) else set(job_pids)
    return [p for p in procs if p.get("pid") not in mine]


def _median(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def gpu_hints(candidates: Sequence[int], placements: Mapping[int, RankPlacement],
              gpu_values: Mapping[GpuKey, Mapping[str, float]],
              throttles: Mapping[GpuKey, Sequence[str]],
              processes: Mapping[GpuKey, Sequence[Mapping[str, object]]],
              now: float | None = None) -> list[GpuHint]:
    """For each candidate (a straggler or slow rank), what its GPU shows against the job's other
    GPUs, as typed evidence seen at ``now``: another process, throttle reasons (hardware slowdown,
    thermal, power cap), a temperature well above the others, a lower SM clock."""
    job_gpus = {(p.node, p.gpu) for p in placements.values()}
    job_pids = frozenset(p.pid for p in placements.values())  # once, for every candidate
    med_clock = _median(gpu_values.get(k, {}).get("perfd_gpu_sm_clock_hertz") for k in job_gpus)
    med_temp = _median(gpu_values.get(k, {}).get("perfd_gpu_temperature_celsius") for k in job_gpus)
    hints = []
    for rank in candidates:
        pl = placements.get(rank)
        if pl is None:
            hints.append(GpuHint(rank, None, None, placed=False))
            continue
        key = (pl.node, pl.gpu)
        vals = gpu_values.get(key, {})
        h = GpuHint(rank, pl.node, pl.gpu, evidence={"pid": pl.pid, **{
            k: vals[k] for k in HINT_SERIES if k in vals}})

        def add(kind: EvidenceKind, worst: float | None, key_: str = "", **detail: object) -> None:
            h.items.append(Evidence(kind, h.rank, key_, worst, now, now, 1,  # noqa: B023 (called at once)
                                    {"node": h.node, "gpu": h.gpu, **detail}))  # noqa: B023

        for p in foreign_processes(pl, processes.get(key, ()), job_pids):
            mem = p.get("used_memory_bytes")
            add(EvidenceKind.FOREIGN_PROCESS, float(mem) if isinstance(mem, (int, float)) else None,
                str(p.get("pid")), **{k: p.get(k) for k in ("pid", "cmdline", "name", "user",
                                                             "used_memory_bytes") if p.get(k) is not None})
        reasons = [r for r in throttles.get(key, ()) if r in SLOWING_REASONS]
        if reasons:
            h.evidence["throttle_reasons"] = reasons
        hw = [r for r in reasons if r in HARDWARE_REASONS]
        if hw:
            add(EvidenceKind.HW_SLOWDOWN, float(len(hw)), ",".join(hw), reasons=hw)
        temp = vals.get("perfd_gpu_temperature_celsius")
        hot = (temp is not None and med_temp is not None and len(job_gpus) > 1
               and temp >= med_temp + HOT_DELTA_C)
        if "sw_thermal" in reasons or hot:
            add(EvidenceKind.THERMAL, temp, reasons=[r for r in reasons if r == "sw_thermal"],
                median_celsius=med_temp if len(job_gpus) > 1 else None)
        power, limit = vals.get("perfd_gpu_power_watts"), vals.get("perfd_gpu_power_limit_watts")
        # The flag alone is no cap that slows anything: NVML raises it for a moment on a GPU far below
        # its limit (seen: 309 W of 700 W in a data-loader stall). A cap is the GPU at its limit.
        at_limit = power is None or not limit or power >= POWER_AT_LIMIT * limit
        if "sw_power_cap" in reasons and at_limit:
            add(EvidenceKind.POWER_CAP, power, power_limit_watts=limit)
        clock = vals.get("perfd_gpu_sm_clock_hertz")
        if clock is not None and med_clock and len(job_gpus) > 1 and clock < CLOCK_DROP_RATIO * med_clock:
            add(EvidenceKind.CLOCK_DROP, clock, median_hertz=med_clock)
        h.items.sort(key=causal_key)
        hints.append(h)
    return hints


def xid_evidence(rank: int, before: float | None, now_count: float | None, xid_last: float | None,
                 now: float | None) -> Evidence | None:
    """An XID error on a rank's GPU *during* an incident: its count rose since ``before`` (an old
    XID from before the incident is history, not this incident's cause)."""
    if before is None or now_count is None or now_count <= before:
        return None
    return Evidence(EvidenceKind.XID, rank, "xid", xid_last, now, now, 1,
                    {"xid_errors": now_count - before, "xid_last": xid_last})

"""Typed evidence from a rank process's host state (collectors/ranks, the ``rank_processes`` event):
stopped, gone, OOM-killed, CPU contention with the processes that caused it, CPU-quota throttling,
memory pressure or swap, blocked in I/O. Pure: a rank's observation (perfd.core.events.RankHost, as the
agent reported it) in, :class:`perfd.analytics.incidents.evidence.Evidence` out, with the numbers the verdict
renderer (perfd.report.incident_text) puts in its sentences. The thresholds are
perfd.core.shared_thresholds' (each says why).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from perfd.analytics.incidents.evidence import Evidence, EvidenceKind
from perfd.core import shared_thresholds as th
from perfd.core.record_json import JsonRecord
from perfd.core.typed import obj, objs

K = EvidenceKind


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def foreign_others(obs: Mapping[str, object]) -> list[dict[str, object]]:
    """The named processes on the rank's CPUs that are not the job's own, largest share first."""
    others: list[dict[str, object]] = [dict(o) for o in objs(obs.get("others")) if not o.get("own")]
    return sorted(others, key=lambda o: -(_num(o.get("cpu_ratio")) or 0.0))


class CpuRoom(str, enum.Enum):
    """Whether a rank's CPUs can take more work (another data-loader worker). ``str``: JSON as is."""

    FULL = "full"  # its allowed CPUs busy, or its cgroup's quota used up or throttling it
    ROOM = "room"


@dataclass(frozen=True)
class CpuUse(JsonRecord):
    """How a rank's process and its own children (data-loader workers) use the CPUs it may run on:
    what decides between more workers and cheaper transforms (perfd.report.incident_text)."""

    rank: int
    room: CpuRoom
    rank_cores: float | None  # the rank process itself
    children_cores: float | None  # its descendants: the job's own, never "other processes"
    children: int | None
    cpus: int | None  # how many CPUs it may run on (affinity)
    busy_ratio: float | None  # their busy share, every process on them
    quota_cores: float | None  # its cgroup's CPU quota
    throttled_ratio: float | None
    node: str | None = None
    observed_at: float | None = None  # epoch s, when its agent observed it
    # A finished (or stalled) job's: the last observation taken while it stepped, said as such (after
    # its exit its process shows no workers and no load: "its 0 child process(es)").
    while_running: bool = False


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def cpu_use(rank: int, obs: Mapping[str, object]) -> CpuUse | None:
    """What one observation of the rank's process says of its CPUs (None: it says nothing of them —
    nor does a process that is gone: no workers, no load). Full: the allowed CPUs busy past
    CPU_FULL_SHARE, or the process and its children using that share of the cgroup's quota, or the
    quota throttling it (CPU_THROTTLED_SHARE)."""
    if obs.get("state") in ("gone", "zombie"):
        return None
    allowed = obs.get("allowed_cpus")
    cpus = len(allowed) if isinstance(allowed, list) and allowed else None
    busy, quota = _num(obs.get("allowed_busy_ratio")), _num(obs.get("cpu_quota_cores"))
    throttled = _num(obs.get("throttled_ratio"))
    mine, kids = _num(obs.get("cpu_cores")), _num(obs.get("children_cpu_cores"))
    full_share = th.CPU_FULL_SHARE.value
    used = (mine or 0.0) + (kids or 0.0) if mine is not None or kids is not None else None
    if busy is None and throttled is None and (quota is None or used is None):
        return None
    full = ((busy is not None and busy >= full_share)
            or (throttled is not None and throttled >= th.CPU_THROTTLED_SHARE.value)
            or (quota is not None and used is not None and used >= full_share * quota))
    node = obs.get("node")
    return CpuUse(rank, CpuRoom.FULL if full else CpuRoom.ROOM, mine, kids, _int(obs.get("children")), cpus,
                  busy, quota, throttled, node if isinstance(node, str) else None,
                  _num(obs.get("observed_at")))


def job_cpu_use(observations: Mapping[int, Mapping[str, object]], ranks: Iterable[int] | None = None
                ) -> CpuUse | None:
    """The CPU use that decides a data-loading remedy for the job (or for ``ranks``): a rank whose
    CPUs are full if any (its loader cannot get more CPU), else the busiest rank with room."""
    want = set(ranks) if ranks is not None else None
    got = [u for r, obs in sorted(observations.items())
           if (want is None or r in want) and (u := cpu_use(r, obs)) is not None]
    if not got:
        return None
    return max(got, key=lambda u: (u.room is CpuRoom.FULL, u.busy_ratio or 0.0, -u.rank))


def oom_evidence(rank: int, before: int | None, obs: Mapping[str, object]) -> Evidence | None:
    """An OOM kill in the rank's cgroup during an incident: the cgroup's count rose since ``before``
    (its count when the incident opened), or the rank's process is gone and the count rose since the
    agent began following it (the kill that ended it may precede the incident's first sighting)."""
    kills = obs.get("oom_kills")
    if not isinstance(kills, int):
        return None
    new = kills - before if before is not None else 0
    since = obs.get("oom_kills_since_follow")
    gone_by_oom = obs.get("state") in ("gone", "zombie") and isinstance(since, int) and since > 0
    if new <= 0 and not gone_by_oom:
        return None
    t = _num(obs.get("observed_at"))
    return Evidence(K.OOM_KILL, rank, "", float(max(new, since if isinstance(since, int) else 0)), t, t, 1,
                    {"pid": obs.get("pid"), "cgroup": obs.get("cgroup"), "oom_kills": kills})


def host_items(rank: int, obs: Mapping[str, object], node: str | None = None,
               swap_in_bytes_per_s: float | None = None) -> list[Evidence]:
    """What one observation of rank ``rank``'s process explains (OOM kills need the count when
    the incident opened: :func:`oom_evidence`). ``swap_in``: the node's swap-in rate at the time."""
    t = _num(obs.get("observed_at"))
    pid = obs.get("pid")
    base: dict[str, object] = {"pid": pid, "node": node}
    out: list[Evidence] = []

    def add(kind: EvidenceKind, worst: float | None, first: float | None = None, **detail: object) -> None:
        out.append(Evidence(kind, rank, "", worst, first if first is not None else t, t, 1,
                            {**base, **{k: v for k, v in detail.items() if v is not None}}))

    state = obs.get("state")
    if state == "stopped":
        since = _num(obs.get("state_since"))
        add(K.PROCESS_STOPPED, (t - since) if t is not None and since is not None else None, since,
            state=state, since=since)
    elif state in ("gone", "zombie"):
        add(K.PROCESS_GONE, 1.0, _num(obs.get("state_since")), state=state)
    wait = _num(obs.get("wait_ratio"))
    others = foreign_others(obs)
    share = _num(obs.get("others_ratio"))
    demand = _num(obs.get("cpu_demand_cores"))
    wants = demand is None or demand >= th.STALL_IDLE_CPU_CORES.value  # a share of almost nothing: no
    if wait is not None and wait >= th.CPU_WAIT_CONTENTION.value and share is not None \
            and share >= th.CPU_OTHERS_SHARE.value and others and wants:
        add(K.CPU_CONTENTION, wait, others=others, others_ratio=share, allowed_cpus=obs.get("allowed_cpus"),
            cpu_cores=_num(obs.get("cpu_cores")), allowed_busy_ratio=_num(obs.get("allowed_busy_ratio")))
    throttled = _num(obs.get("throttled_ratio"))
    if throttled is not None and throttled >= th.CPU_THROTTLED_SHARE.value:
        add(K.CPU_THROTTLED, throttled, cgroup=obs.get("cgroup"),
            quota_cores=_num(obs.get("cpu_quota_cores")), wait_ratio=wait,
            throttled_s=_num(obs.get("throttled_s")))
    got = obs.get("pressure")
    pressure = obj(got)
    mem = _num(pressure.get("memory"))
    swapping = swap_in_bytes_per_s is not None and swap_in_bytes_per_s >= th.SWAP_IN_BYTES_PER_S.value
    if (mem is not None and mem >= th.MEMORY_PRESSURE_SHARE.value) or swapping:
        add(K.MEMORY_PRESSURE, mem, pressure_source=obs.get("pressure_source"),
            swap_in_bytes_per_second=swap_in_bytes_per_s)
    io = _num(pressure.get("io"))
    if state == "disk_sleep" or (io is not None and io >= th.IO_PRESSURE_SHARE.value):
        add(K.IO_BLOCKED, io, state=state, pressure_source=obs.get("pressure_source"))
    return out

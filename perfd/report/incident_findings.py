"""What a report says of incidents: one finding and one recommendation each, and which of them
perfd's own capture made (never the headline). Made where the report is built (build_report), not in
the analysis: they word the incident (its cause line, its action) for a person.

The incidents are typed: analysed offline (perfd.analytics.incidents.detect.Incident) or as the live
aggregator kept them (perfd/aggregator/incident_records.TrackedIncident); both are a
:class:`ReportedIncident`. Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from perfd.analytics.breakdown.advice_registry import data_loading
from perfd.analytics.finding_types import Finding, FindingOrigin, Recommendation, Severity
from perfd.analytics.incidents.detect import CAPTURE, HANG, CaptureDuring, Incident
from perfd.analytics.incidents.evidence import EvidenceKind, Missing, Verdict
from perfd.analytics.incidents.host_evidence import CpuUse, job_cpu_use
from perfd.core.typed import objs
from perfd.report.data_text import DATA_ACTIONS
from perfd.report.incident_text import EVIDENCE_SOURCE_TEXT, cause_line, cpu_use_text, cpus_text

K = EvidenceKind


class ReportedIncident(Protocol):
    """An incident as the report reads it: analysed offline (:class:`Incident` itself) or as the
    live aggregator kept it (perfd/aggregator/incident_records.TrackedIncident: its cost refined by a
    stall it carried, its duration as of the analysis that last recorded it, the captures that ran
    during it). JSON only where it is served: :meth:`to_json`."""

    @property
    def incident(self) -> Incident: ...

    @property
    def duration_s(self) -> float | None: ...

    @property
    def captures(self) -> Sequence[CaptureDuring]: ...

    def to_json(self) -> dict[str, object]: ...


def incident_findings(incidents: Sequence[ReportedIncident], run_s: float | None,
                      cpu: CpuUse | None = None) -> tuple[list[Finding], list[Recommendation]]:
    """One finding per incident (as analysed offline, or as the live aggregator kept it with the
    GPU evidence of the time), with a recommendation whose impact is
    the share of the run it cost. A stretch only perfd's own capture disturbed is no incident and
    gets no finding here (the summary lists it apart). ``cpu``: the job's ranks' CPU use now, for an
    incident whose own host snapshot says nothing of it (a data-loading action depends on it)."""
    fs: list[Finding] = []
    rs: list[Recommendation] = []
    for rep in incidents:
        if is_disturbance(rep):
            continue
        inc = rep.incident
        first, last = inc.first_iteration, inc.last_iteration
        kinds, cost = list(inc.kinds), inc.cost_s
        lost = f"{cost:.1f} s lost" if isinstance(cost, (int, float)) else "time lost unknown"
        span = f"iteration {first}" if first == last else f"iterations {first}–{last}"
        dur = rep.duration_s
        during = f" over {dur:.0f} s" if isinstance(dur, (int, float)) else ""
        fid = f"incident-{inc.id}"
        caps = [c for c in rep.captures if c.started_at is not None]
        cap_text = "".join(f" Capture {c.id} ({c.tool}, ranks {_ranks(c.ranks)}) ran during it"
                           + (f": {c.findings[0].title}" if c.findings else "") + "."
                           for c in caps)
        steps = (f" {inc.n_iterations} iteration(s); steady time per step "
                 f"{_ms(inc.steady_step_ms)}, "
                 f"median during {_ms(inc.median_step_ms)}, worst {_ms(inc.max_step_ms)}. "
                 "Left out of the steady-state statistics." if inc.n_iterations else "")
        cap_cost = inc.capture_cost_s
        if isinstance(cap_cost, (int, float)):
            steps += f" perfd's capture cost {cap_cost:.1f} s more inside it (not counted as lost)."
        fs.append(Finding(fid, Severity.CRITICAL if HANG in kinds else Severity.WARNING,
                          f"Incident {span}: {lost}" + (" (still open)" if inc.open else ""),
                          f"{cause_line(inc)}{during}.{steps}{cap_text}",
                          # the incident by its id: its evidence, verdict and captures are the
                          # incident's own (each fact once: the report sits beside the incidents)
                          {"incident": inc.id, "kinds": kinds, "ranks": list(inc.ranks), "cost_s": cost,
                           "cause": inc.verdict.cause.value if inc.verdict and inc.verdict.cause else None},
                          span, EVIDENCE_SOURCE_TEXT[src] if (src := inc.evidence.source) is not None else "",
                          FindingOrigin.INCIDENT))
        impact = (cost / run_s) if isinstance(cost, (int, float)) and run_s else None
        action, used = _action(inc, cpu)
        detail = cause_line(inc) + (f"; {cpu_use_text(used)}" if used is not None else "")
        dl = data_loading(used, inc.cpu_only) if _data_wait(inc) else None
        v = inc.verdict
        # two incidents of one cause on the same ranks ask for the same thing: one recommendation
        same = (HANG in kinds, v.cause if v is not None else None, v.rank if v is not None else None,
                tuple(inc.ranks))
        rs.append(Recommendation("", fid, 0, action, detail, impact, data_loading=dl,
                                 same_as=same if dl is None else None))
    return fs, rs


def _ranks(ranks: Sequence[int] | None) -> list[int] | None:
    return list(ranks) if ranks is not None else None  # printed as the record's JSON list


def incident_cpu_use(inc: Incident) -> CpuUse | None:
    """The CPU use of the incident's ranks as its host snapshots saw them while it happened."""
    hosts = {r: s.host for r, s in (inc.evidence.gpu or {}).items() if r >= 0 and s.host is not None}
    return job_cpu_use(hosts, list(inc.ranks) or None) if hosts else None


def is_disturbance(rep: ReportedIncident) -> bool:
    """A stretch only perfd's own capture disturbed (kept state from before they were listed apart)."""
    return rep.incident.kinds == [CAPTURE]


def _action(inc: Incident, cpu: CpuUse | None = None) -> tuple[str, CpuUse | None]:
    """The incident's action, and the CPU use it was chosen by (a data-loading action only)."""
    if HANG in inc.kinds:
        return ("Find why the named rank(s) never reached the collective (their last Flight Recorder "
                "entries, a dead process, a lost GPU); set a NCCL timeout so a hang fails fast"), None
    used = (incident_cpu_use(inc) or cpu) if _data_wait(inc) else None
    return action_text(inc.verdict, list(inc.ranks), used, inc.cpu_only), used


def _data_wait(inc: Incident) -> bool:
    """Slow data leads the incident (its action is a data-loading one: perfd.analytics.finding_types
    .DataLoading)."""
    return HANG not in inc.kinds and inc.verdict is not None and inc.verdict.cause is EvidenceKind.DATA_WAIT


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f} ms"


def _host_action(v: Verdict, d: Mapping[str, object]) -> str | None:
    """The first thing to do when the rank's process or its host explains the incident."""
    pid = d.get("pid")
    who = f"rank {v.rank}'s process" + (f" (pid {pid})" if pid is not None else "")
    if v.cause is K.PROCESS_STOPPED:
        return (f"Find what stopped {who}: a debugger attached, a SIGSTOP from a scheduler "
                "(suspend, preemption) or a frozen cgroup; `kill -CONT` it or restart the job, and set a "
                "NCCL timeout so the other ranks do not wait for ever")
    if v.cause in (K.OOM_KILL, K.PROCESS_GONE):
        return (f"{who[0].upper()}{who[1:]} died: read the kernel log (dmesg: OOM kills) and its "
                "output; give the job more host memory or use less (fewer data-loader workers, less "
                "pinned memory), then restart it from its last checkpoint")
    if v.cause is K.CPU_CONTENTION:
        others = objs(d.get("others"))
        pids = ", ".join(str(o.get("pid")) for o in others[:4])
        return (f"Keep other processes off rank {v.rank}'s {cpus_text(d.get('allowed_cpus'))}"
                + (f" (pid {pids})" if pids else "") + ": give the job dedicated cores (cpuset / taskset, "
                "the Kubernetes static CPU manager) or move the other processes away")
    if v.cause is K.CPU_THROTTLED:
        return ("Raise or remove the job's CPU limit (Kubernetes resources.limits.cpu, cgroup cpu.max): "
                "its quota throttles the rank and its data-loader workers")
    if v.cause is K.MEMORY_PRESSURE:
        return ("Give the job's node more free memory (fewer data-loader workers or prefetched batches, "
                "no other memory-hungry processes); turn swap off for training nodes")
    if v.cause is K.IO_BLOCKED:
        return ("Check the storage the job reads and writes (data, checkpoints): its latency and "
                "throughput, other jobs on it; stage data on local disk")
    return None


def action_text(v: Verdict | None, ranks: Sequence[int] = (), cpu: CpuUse | None = None,
                cpu_only: bool = False) -> str:
    """The first thing to do about an incident with this verdict (``cpu``: the rank's CPU use, which
    decides a data-loading action; ``cpu_only``: the job computes on CPUs, no GPU to check)."""
    r = v.rank if v is not None and v.rank is not None else (ranks[0] if ranks else None)
    who = f"rank {r}'s GPU" if r is not None else "the job's GPUs"
    if cpu_only and (v is None or v.lead is None or v.cause in (K.RANK_COMPUTE_RATIO, K.STRAGGLER_LINE)):
        whose = f"rank {r}'s" if r is not None else "the job's"
        return (f"Check {whose} own work and host: uneven data or sharding, host-side stalls (checkpointing, "
                "evaluation, garbage collection), other processes on its CPUs")
    if v is None or v.lead is None:
        if r is not None:
            return (
                f"Check rank {r}: its GPU (clocks, throttle reasons, other processes, XID errors), then "
                "uneven data or sharding and host-side stalls"
            )
        return (
            "Look for host-side causes of the slow stretch: checkpointing, evaluation, other jobs on the node"
        )
    d: Mapping[str, Any] = v.lead.detail
    host = _host_action(v, d)
    if host is not None:
        return host
    if v.cause in (K.XID, K.HW_SLOWDOWN):
        return (
            f"Drain {who} and check its health (XID codes in the driver log, nvidia-smi -q, the node's "
            "hardware monitoring); reschedule the job without it"
        )
    if v.cause is K.FOREIGN_PROCESS:
        return (
            f"Keep other processes off {who} (exclusive-process compute mode, or the scheduler's GPU "
            f"isolation): pid {d.get('pid', v.lead.key)} ran there during the incident"
        )
    if v.cause is K.THERMAL:
        return f"Check {who}'s cooling: airflow, fans, inlet temperature (no other process explains it)"
    if v.cause is K.POWER_CAP:
        return (
            f"Check {who}'s power limit and power delivery (nvidia-smi -q -d POWER: enforced against "
            "default limit); no other process explains it"
        )
    if v.cause is K.CLOCK_DROP:
        return f"Check {who}'s clocks: locked or application clocks, throttle reasons"
    if v.cause is K.AFTER_CAPTURE:
        return (
            "perfd's capture cost this: a Kineto trace leaves CUPTI on every later kernel launch unless "
            "the job runs with TEARDOWN_CUPTI=1 (perfd launch --kineto sets it; set it in the job's "
            "environment otherwise); restart the job's ranks with it when convenient, and until then stop "
            "on-demand captures of this job (raise the rule's cooldown or drop the rule)"
        )
    if v.cause is K.CAPTURE_FINDING:
        return (
            f"Look for contention on {who}: the same kernels ran slower while captured (other processes, "
            "MPS clients, clocks)"
        )
    if v.cause is K.DATA_WAIT:
        return DATA_ACTIONS[data_loading(cpu, cpu_only)]
    if v.cause in (K.RANK_COMPUTE_RATIO, K.STRAGGLER_LINE):
        gpu_known = Missing.GPU_STATE not in v.missing and Missing.RANK_PLACEMENT not in v.missing
        if gpu_known:
            return (
                f"Check rank {v.rank}'s own work: uneven data or sharding, host-side stalls (CPU "
                "contention, garbage collection); its GPU showed no fault, no co-tenant, no throttling"
            )
        return (
            f"Check rank {v.rank}'s GPU (clocks, throttle reasons, other processes, XID errors: an agent "
            "with NVML on its node shows them), then uneven data or sharding"
        )
    return (
        "Communication slowed: check the links and peers of the rank's process groups; overlap "
        "communication with compute"
    )

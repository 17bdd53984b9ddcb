"""What a report says of incidents: one finding and one recommendation each, and which of them
perfd's own capture made (never the headline). Made where the report is built (build_report), not in
the analysis: they word the incident (its cause line, its action) for a person.

The incidents are typed: analysed offline (perfd.analytics.incidents.detect.Incident) or as the live
aggregator kept them (perfd/aggregator/incident_records.TrackedIncident); both are a
:class:`ReportedIncident`. Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from perfd.analytics.finding_types import Finding, FindingOrigin, Recommendation, Severity
from perfd.analytics.incidents.detect import CAPTURE, HANG, CaptureDuring, Incident
from perfd.analytics.incidents.evidence import EvidenceKind
from perfd.analytics.incidents.host_evidence import CpuUse, job_cpu_use
from perfd.analytics.incidents.verdict_text import action_text, cpu_use_text


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
                          f"{inc.cause}{during}.{steps}{cap_text}",
                          # the incident by its id: its evidence, verdict and captures are the
                          # incident's own (each fact once: the report sits beside the incidents)
                          {"incident": inc.id, "kinds": kinds, "ranks": list(inc.ranks), "cost_s": cost,
                           "cause": inc.verdict.cause.value if inc.verdict and inc.verdict.cause else None},
                          span, inc.evidence.source or "", FindingOrigin.INCIDENT))
        impact = (cost / run_s) if isinstance(cost, (int, float)) and run_s else None
        action, used = _action(inc, cpu)
        detail = inc.cause + (f"; {cpu_use_text(used)}" if used is not None else "")
        rs.append(Recommendation("", fid, 0, action, detail, impact))
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
    v = inc.verdict
    used = (incident_cpu_use(inc) or cpu) if v is not None and v.cause is EvidenceKind.DATA_WAIT else None
    return action_text(v, list(inc.ranks), used, inc.cpu_only), used


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f} ms"

"""An incident as the aggregator's tracker keeps it (perfd/aggregator/incidents.py), typed.

The incident itself (perfd.analytics.incidents.detect.Incident, with the evidence and verdict the tracker
gathered while it ran) and what only the tracker adds: the captures that ran during it, when it was
first seen and last updated, its cost's two parts when it carries a live stall, and why a stall it
carried was withdrawn. JSON only at the tracker's edges (the HTTP API, the state store, the events):
:meth:`TrackedIncident.to_json` gives the keys they have always carried, in the same order, and
:func:`tracked_from_json` is the state store's load, the one place JSON becomes an incident again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from perfd.aggregator.capture_records import CaptureSeen
from perfd.analytics.incidents.detect import CAPTURE, STALL, Incident
from perfd.analytics.incidents.evidence import verdict_from_json
from perfd.analytics.incidents.incident_evidence import IncidentEvidence, Withdrawal
from perfd.analytics.incidents.stall import silence_cost_s
from perfd.core.events import INCIDENT_OPENED
from perfd.core.record_json import JsonWritten
from perfd.report.incident_text import cause_line, unworded_evidence, worded_evidence


@dataclass(frozen=True)
class CostParts(JsonWritten):
    """An incident that carries a live stall: its steps' part of the cost (Σ step − steady median;
    goodput's incident part) and the stall's silence beyond one usual interval."""

    steps_s: float | None
    silence_s: float | None


@dataclass(frozen=True)
class TrackedIncident:
    incident: Incident  # never mutated once kept: a change is a new record (dataclasses.replace)
    duration_s: float | None  # as of the analysis that last recorded it (a stall closed later keeps it)
    # The job's captures taken during it, as the capture coordinator recorded them then
    captures: tuple[CaptureSeen, ...]
    first_seen: float
    updated_at: float
    cost_parts: CostParts | None = None
    stall_withdrawn: Withdrawal | None = None  # the stall it carried was taken back, and why
    run: int | None = None  # the job's run it happened in, once a later run replaced that one's records

    @property
    def id(self) -> str:
        return self.incident.id

    @property
    def kinds(self) -> list[str]:
        return self.incident.kinds

    @property
    def open(self) -> bool:
        return self.incident.open

    @property
    def disturbance(self) -> bool:
        """A stretch only perfd's own capture disturbed (kept state from before they were listed apart)."""
        return self.incident.kinds == [CAPTURE]

    def step_cost_s(self) -> float | None:
        """The part of its cost that lies in its steps' time (goodput's incident part)."""
        return self.cost_parts.steps_s if self.cost_parts is not None else self.incident.cost_s

    def to_json(self) -> dict[str, object]:
        out = worded_evidence(self.incident, self.incident.to_json())  # its source, observations in words
        out["cause"] = cause_line(self.incident)  # worded here: the API's, the events' and the state's
        out["duration_s"] = self.duration_s
        out.update(captures=[c.to_json() for c in self.captures], first_seen=self.first_seen,
                   updated_at=self.updated_at)
        if self.cost_parts is not None:
            out["cost_parts"] = self.cost_parts.to_json()
        if self.stall_withdrawn is not None:
            out["stall_withdrawn"] = self.stall_withdrawn.value
        if self.run is not None:
            out["run"] = self.run
        return out


def with_stall_cost(rec: TrackedIncident) -> TrackedIncident:
    """An incident that carries a live stall: its cost is the larger of its steps' (Σ step − steady
    median) and the stall's silence beyond one usual interval — a stop between two steps lies in no
    step's time (perfd.analytics.incidents.stall.silence_cost_s), one inside a step in both (never added).
    Both
    parts stay in ``cost_parts``: goodput counts only the steps' part as incident (the silence is
    already its window's stall or other part). A stall alone has no steps' part."""
    inc = rec.incident
    if STALL not in inc.kinds:
        return rec
    steps = rec.cost_parts.steps_s if rec.cost_parts is not None else (
        None if inc.kinds == [STALL] else inc.cost_s)
    silence = silence_cost_s(inc.evidence.stall)
    have = [v for v in (steps, silence) if v is not None]
    return replace(rec, incident=replace(inc, cost_s=max(have) if have else None),
                   cost_parts=CostParts(steps, silence))


def tracked_from_json(d: Mapping[str, Any]) -> TrackedIncident:
    """Back from :meth:`TrackedIncident.to_json` (the state store's load)."""
    ev = d.get("evidence")
    inc = Incident(
        id=str(d["id"]), first_iteration=int(d["first_iteration"]), last_iteration=int(d["last_iteration"]),
        kinds=[str(k) for k in d.get("kinds") or []], ranks=[int(r) for r in d.get("ranks") or []],
        n_iterations=int(d.get("n_iterations") or 0), cost_s=d.get("cost_s"),
        steady_step_ms=d.get("steady_step_ms"), median_step_ms=d.get("median_step_ms"),
        max_step_ms=d.get("max_step_ms"), start_time=d.get("start_time"), end_time=d.get("end_time"),
        open=bool(d.get("open")), cause=str(d.get("cause") or ""),
        evidence=(IncidentEvidence.from_json(unworded_evidence(ev)) if isinstance(ev, Mapping)
                  else IncidentEvidence()),
        verdict=verdict_from_json(d.get("verdict"), as_written=True), capture_cost_s=d.get("capture_cost_s"),
        single_rank=bool(d.get("single_rank")), cpu_only=bool(d.get("cpu_only")))
    parts = d.get("cost_parts")
    why = d.get("stall_withdrawn")
    return TrackedIncident(
        inc, d.get("duration_s"), tuple(seen for c in d.get("captures") or []
                                        if isinstance(c, Mapping) and (seen := CaptureSeen.from_json(c))),
        d.get("first_seen") or 0.0, d.get("updated_at") or 0.0,
        CostParts(parts.get("steps_s"), parts.get("silence_s")) if isinstance(parts, Mapping) else None,
        Withdrawal(why) if why in Withdrawal._value2member_map_ else None,
        d.get("run") if isinstance(d.get("run"), int) else None)


def incident_event(kind: str, job: str, rec: TrackedIncident, withdrawn: Withdrawal | None = None
                   ) -> dict[str, object]:
    """The event of an incident opening (a warning) or closing (perfd.core.events), as it goes on the wire;
    one withdrawn (it was not one) says why in its text and payload."""
    inc = rec.incident
    opened = kind == INCIDENT_OPENED.name
    cost = inc.cost_s
    text = (f"incident {inc.id} withdrawn ({withdrawn.value}): it was not one" if withdrawn is not None
            else f"incident {inc.id} {'opened' if opened else 'closed'}: {cause_line(inc)}"
            + (f" ({cost:.1f} s lost)" if cost is not None else ""))
    return {"kind": kind, "severity": "warning" if opened else "info", "job": job, "time": rec.updated_at,
            "text": text,
            "labels": {"job": job, "incident": inc.id},
            "links": {"incident": inc.id, "steps": f"{inc.first_iteration}-{inc.last_iteration}"},
            "payload": {"id": inc.id, "first_iteration": inc.first_iteration,
                        "last_iteration": inc.last_iteration, "ranks": list(inc.ranks),
                        "kinds": list(inc.kinds),
                        "cost_s": cost, "open": inc.open, "cause": cause_line(inc),
                        **({"withdrawn": withdrawn.value} if withdrawn is not None else {})}}

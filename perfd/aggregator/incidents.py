"""Incidents as the aggregator saw them: kept for the job's lifetime with the evidence of the time.

perfd.analytics.incidents finds incidents in a job's iterations; only the live aggregator knows
what the involved ranks' GPUs showed *while* it happened (clocks, throttle reasons, power,
temperature, XID errors, the processes sharing the GPU with their pid and command line), which
collectives were stuck, and which captures ran. The GPU state is gone once the episode ends (the
node view keeps latest values only), so this tracker takes a snapshot on every update while an
incident is open and keeps it after it closes. It emits an event when an incident opens and when it
closes, and counts incidents and seconds lost per job for /metrics. Bounded: MAX_INCIDENTS per job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from perfd.analytics.incidents import MAX_INCIDENTS, Incident, cause_text
from perfd.events import INCIDENT_CLOSED, INCIDENT_OPENED

Emit = Callable[[list[dict[str, Any]]], None]
# incident -> {rank: GPU snapshot} of the ranks it involves (or of the job's GPUs that stand out)
Snapshot = Callable[[Incident], dict[str, Any]]


class IncidentTracker:
    def __init__(self, emit: Emit, max_per_job: int = MAX_INCIDENTS) -> None:
        self._lock = threading.Lock()
        self.emit = emit
        self.max_per_job = max_per_job
        self._jobs: dict[str, dict[str, dict[str, Any]]] = {}  # job -> incident id -> JSON
        self.opened_total: dict[str, int] = {}
        self.lost_s_total: dict[str, float] = {}  # closed incidents' cost + the open ones' so far

    def update(self, job: str, found: Sequence[Incident], snapshot: Snapshot,
               captures: Sequence[Mapping[str, Any]], now: float) -> None:
        """Merge the incidents an analysis found into the job's record of them."""
        events: list[dict[str, Any]] = []
        with self._lock:
            kept = self._jobs.setdefault(job, {})
            for inc in found:
                key = self._match(kept, inc)
                prev = kept.get(key) if key else None
                if prev is not None and not prev["open"] and not inc.open:
                    continue  # closed and already recorded with its evidence of the time
                gpu: dict[str, Any] = dict(prev["evidence"].get("gpu", {})) if prev else {}
                if inc.open or prev is None:
                    fresh = snapshot(inc)  # the evidence as it is now, while it happens
                    gpu.update(fresh)
                hint = _hint_text(gpu, inc.ranks)
                doc = inc.to_json()
                doc["cause"] = cause_text(inc, hint)
                doc["evidence"] = {**doc["evidence"], "gpu": gpu}
                doc["captures"] = _overlapping(captures, inc, now)
                doc["first_seen"] = prev["first_seen"] if prev else now
                doc["updated_at"] = now
                if prev is None:
                    self.opened_total[job] = self.opened_total.get(job, 0) + 1
                    events.append(_event(INCIDENT_OPENED.name, job, doc, "warning"))
                elif prev["open"] and not inc.open:
                    events.append(_event(INCIDENT_CLOSED.name, job, doc, "info"))
                if prev is not None and key != inc.id:
                    kept.pop(key or "", None)
                kept[inc.id] = doc
            self.lost_s_total[job] = max(self.lost_s_total.get(job, 0.0),
                                         sum(d.get("cost_s") or 0.0 for d in kept.values()))
            if len(kept) > self.max_per_job:  # the costliest stay
                for k, _ in sorted(kept.items(), key=lambda kv: kv[1].get("cost_s") or 0.0)[
                        : len(kept) - self.max_per_job]:
                    kept.pop(k)
        if events:
            self.emit(events)

    def export(self) -> dict[str, Any]:
        """Everything kept, as JSON (for the aggregator's state store)."""
        with self._lock:
            return {"jobs": {j: dict(v) for j, v in self._jobs.items()},
                    "opened_total": dict(self.opened_total), "lost_s_total": dict(self.lost_s_total)}

    def load(self, doc: Mapping[str, Any]) -> None:
        """Back from :meth:`export`: incidents already reported are matched, never re-announced."""
        with self._lock:
            self._jobs = {str(j): {str(k): dict(d) for k, d in v.items()}
                          for j, v in doc.get("jobs", {}).items()}
            self.opened_total = {str(j): int(n) for j, n in doc.get("opened_total", {}).items()}
            self.lost_s_total = {str(j): float(n) for j, n in doc.get("lost_s_total", {}).items()}

    @staticmethod
    def _match(kept: Mapping[str, dict[str, Any]], inc: Incident) -> str | None:
        """The recorded incident this one continues: same id, else an overlapping iteration range
        (an incident grows at both ends as iterations arrive and the steady median settles)."""
        if inc.id in kept:
            return inc.id
        for k, d in kept.items():
            if d["first_iteration"] <= inc.last_iteration and inc.first_iteration <= d["last_iteration"] \
                    and set(d["kinds"]) & set(inc.kinds):
                return k
        return None

    def incidents(self, job: str) -> list[dict[str, Any]]:
        with self._lock:
            return sorted((dict(d) for d in self._jobs.get(job, {}).values()),
                          key=lambda d: (d["first_iteration"], d["id"]))

    def open_incidents(self, job: str) -> list[dict[str, Any]]:
        return [d for d in self.incidents(job) if d.get("open")]

    def metric_rows(self) -> list[tuple[Mapping[str, str], str, float]]:
        with self._lock:
            rows: list[tuple[Mapping[str, str], str, float]] = []
            for job, n in sorted(self.opened_total.items()):
                rows.append(({"job_name": job}, "perfd_job_incidents_total", float(n)))
                rows.append(({"job_name": job}, "perfd_job_incident_lost_seconds_total",
                             float(self.lost_s_total.get(job, 0.0))))
                n_open = sum(1 for d in self._jobs.get(job, {}).values() if d.get("open"))
                rows.append(({"job_name": job}, "perfd_job_incidents_open", float(n_open)))
            return rows


def _hint_text(gpu: Mapping[str, Any], ranks: Sequence[int]) -> str | None:
    """The GPU observations of the first named rank that has any (else of any rank that has)."""
    order = [str(r) for r in ranks] + [k for k in gpu if k not in {str(r) for r in ranks}]
    for r in order:
        obs = [o for o in (gpu.get(r) or {}).get("observations", []) if "looks like the others" not in o]
        if obs:
            return f"rank {r}'s GPU: " + "; ".join(obs)
    return None


def _overlapping(captures: Sequence[Mapping[str, Any]], inc: Incident, now: float) -> list[dict[str, Any]]:
    """Captures of the job taken during the incident, with their findings."""
    if inc.start_time is None:
        return []
    end = inc.end_time if inc.end_time is not None and not inc.open else now
    out = []
    for c in captures:
        t = c.get("started_at") or c.get("requested_at")
        if isinstance(t, (int, float)) and inc.start_time - 1.0 <= t <= end + 1.0:
            out.append({k: c.get(k) for k in ("id", "tool", "ranks", "status", "origin", "requested_at",
                                              "started_at", "finished_at", "findings", "bottleneck")})
    return out


def _event(kind: str, job: str, doc: Mapping[str, Any], severity: str) -> dict[str, Any]:
    verb = "opened" if kind == INCIDENT_OPENED.name else "closed"
    cost = doc.get("cost_s")
    return {"kind": kind, "severity": severity, "job": job, "time": doc.get("updated_at"),
            "text": f"incident {doc['id']} {verb}: {doc.get('cause', '')}"
                    + (f" ({cost:.1f} s lost)" if isinstance(cost, (int, float)) else ""),
            "labels": {"job": job, "incident": str(doc["id"])},
            "links": {"incident": str(doc["id"]),
                      "steps": f"{doc['first_iteration']}-{doc['last_iteration']}"},
            "payload": {k: doc.get(k) for k in ("id", "first_iteration", "last_iteration", "ranks", "kinds",
                                                "cost_s", "open", "cause")}}

"""Incidents as the aggregator saw them: kept for the job's lifetime with the evidence of the time.

perfd.analytics.incidents.detect finds incidents in a job's iterations; only the live aggregator knows
what the involved ranks' GPUs showed *while* it happened (clocks, throttle reasons, power,
temperature, XID errors, the processes sharing the GPU with their pid and command line), which
collectives were stuck, and which captures ran. The GPU state is gone once the episode ends (the
node view keeps latest values only), so this tracker takes a snapshot on every update while an
incident is open and keeps it after it closes. It emits an event when an incident opens and when it
closes, and counts incidents and seconds lost per job for /metrics. Bounded: MAX_INCIDENTS per job.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from perfd.aggregator.capture_records import CaptureRecord, CaptureSeen
from perfd.aggregator.incident_records import (
    TrackedIncident,
    incident_event,
    tracked_from_json,
    with_stall_cost,
)
from perfd.analytics.incidents.attribution import xid_evidence
from perfd.analytics.incidents.detect import MAX_INCIDENTS, STALL, Incident
from perfd.analytics.incidents.evidence import Evidence, EvidenceKind, Missing, cause_label, decide, merge
from perfd.analytics.incidents.host_evidence import oom_evidence
from perfd.analytics.incidents.incident_evidence import IncidentEvidence, RankSnapshot, Withdrawal, as_kept
from perfd.core import catalog
from perfd.core.events import INCIDENT_CLOSED, INCIDENT_OPENED

log = logging.getLogger(__name__)

BASELINE_EVERY_S = 1.0  # a steady sighting of the job's GPUs at most this often (a short job has seconds)
BASELINE_MIN_SIGHTINGS = 3  # before this many, nothing is said about steady state
BASELINE_LEVELS = 60  # the newest steady values kept per (rank, kind) on a scale: their median is its level
# A sighting costs ~25 us of CPU per placed rank (8,000 ranks: ~0.2 s on a 2-core VM; `perfd bench
# baseline`): a job of more ranks than this is sighted proportionally less often (8,000 ranks: every
# ~7.8 s), so no job's sightings cost more than one of this many ranks at BASELINE_EVERY_S (~2.5% of a
# core there). Jobs up to this size: every BASELINE_EVERY_S, as before.
BASELINE_RANKS_PER_EVERY_S = 1024

Emit = Callable[[list[dict[str, Any]]], None]
# incident -> {rank: GPU snapshot} of the ranks it involves (or of the job's GPUs that stand out)
Snapshot = Callable[[Incident], Mapping[int, RankSnapshot]]


def _refine_closed(rec: TrackedIncident, inc: Incident, now: float) -> TrackedIncident:
    """A recorded closed incident as the latest analysis sees its iterations: its end, cost and
    steady step firm up as more calm steps follow (an early incident is seen first against a few
    steps only), and so does what its steps show (the data wait's share of the slowdown): its verdict
    is decided again over that and the GPU and host evidence kept of the time it ran, so that its cause
    and the iterations' marks (the same analysis) never disagree."""
    kept = rec.incident
    if STALL in kept.kinds:
        return rec  # its cost is the stall's too (with_stall_cost): left as recorded
    same = ((inc.last_iteration, inc.cost_s, inc.steady_step_ms, inc.evidence.observed)
            == (kept.last_iteration, kept.cost_s, kept.steady_step_ms, kept.evidence.observed))
    if same:
        return rec
    steps = inc.evidence  # what the steps show, as the latest analysis reads them
    ev = replace(kept.evidence, observed=steps.observed, named_by_iterations=steps.named_by_iterations,
                 rank_compute_ratio_max=steps.rank_compute_ratio_max,
                 straggler_line_max_rank=steps.straggler_line_max_rank,
                 disturbed_by_capture=steps.disturbed_by_capture)
    verdict = kept.verdict
    if verdict is not None:
        live = [as_kept(e) for e in kept.evidence.gpu_observed or ()]
        verdict = decide([*live, *inc.observed(), *_capture_evidence(rec.captures)], inc.ranks,
                         verdict.missing, stalled=False)
    out = replace(kept, last_iteration=inc.last_iteration, n_iterations=inc.n_iterations, cost_s=inc.cost_s,
                  steady_step_ms=inc.steady_step_ms, median_step_ms=inc.median_step_ms,
                  max_step_ms=inc.max_step_ms, end_time=inc.end_time, ranks=list(inc.ranks),
                  capture_cost_s=inc.capture_cost_s, evidence=ev, verdict=verdict)
    # a new verdict: its line is worded from it where shown (an older perfd's recorded line goes)
    out = replace(out, cause="" if verdict is not None else inc.cause)
    return replace(rec, incident=out, updated_at=now)


class GpuBaseline:
    """What each rank's GPU showed while its job ran steadily (no incident open): how often each kind
    of evidence was seen there. A power cap or a co-tenant present in steady state too cannot explain
    a departure from it; the incident's evidence carries the share (``in_steady_state``) and the
    verdict leaves such items out of its causes (perfd.analytics.incidents.evidence.decide)."""

    def __init__(self, every_s: float = BASELINE_EVERY_S) -> None:
        self._lock = threading.Lock()
        self.every_s = every_s
        self._n: dict[str, int] = {}  # job -> steady sightings taken
        self._seen: dict[str, Counter[tuple[int, str]]] = {}  # job -> (rank, kind) -> sightings
        # job -> (rank, kind) -> its worst values in those sightings (kinds on a scale: their level)
        self._levels: dict[str, dict[tuple[int, str], deque[float]]] = {}
        self._at: dict[str, float] = {}
        self._ranks: dict[str, int] = {}  # job -> ranks in its last sighting

    def interval_s(self, job: str) -> float:
        """Seconds between the job's sightings: ``every_s``, stretched for a job of more than
        BASELINE_RANKS_PER_EVERY_S ranks (as many as its last sighting held) in proportion."""
        with self._lock:
            ranks = self._ranks.get(job, 0)
        return self.every_s * max(1.0, ranks / BASELINE_RANKS_PER_EVERY_S)

    def due(self, job: str, now: float) -> bool:
        every = self.interval_s(job)
        with self._lock:
            return now - self._at.get(job, float("-inf")) >= every

    def add(self, job: str, items_by_rank: Mapping[int, Sequence[Evidence]], now: float) -> None:
        with self._lock:
            self._at[job] = now
            self._ranks[job] = len(items_by_rank)
            self._n[job] = self._n.get(job, 0) + 1
            seen = self._seen.setdefault(job, Counter())
            levels = self._levels.setdefault(job, {})
            for rank, items in items_by_rank.items():
                seen.update({(rank, e.kind.value) for e in items})
                for e in items:
                    if e.spec.steady_margin is not None and e.worst is not None:
                        levels.setdefault((rank, e.kind.value), deque(maxlen=BASELINE_LEVELS)).append(e.worst)

    def forget(self, job: str) -> None:
        with self._lock:
            for d in (self._n, self._seen, self._at, self._ranks, self._levels):
                d.pop(job, None)

    def sightings(self, job: str) -> int:
        """Steady sightings taken of the job."""
        with self._lock:
            return self._n.get(job, 0)

    def annotate(self, job: str, items: Sequence[Evidence]) -> list[Evidence]:
        """The items with the share of steady sightings that showed them (once there are enough)."""
        with self._lock:
            n, seen = self._n.get(job, 0), self._seen.get(job, Counter())
            levels = {k: statistics.median(v) for k, v in self._levels.get(job, {}).items() if v}
        if n < BASELINE_MIN_SIGHTINGS:
            return list(items)
        out = []
        for e in items:
            if e.rank is None:
                out.append(e)
                continue
            key = (e.rank, e.kind.value)
            extra = {"in_steady_state": seen[key] / n}
            if key in levels:
                extra["steady_worst"] = levels[key]
            out.append(dataclasses.replace(e, detail={**e.detail, **extra}))
        return out


class IncidentTracker:
    def __init__(self, emit: Emit, max_per_job: int = MAX_INCIDENTS) -> None:
        self._lock = threading.Lock()
        self.emit = emit
        self.max_per_job = max_per_job
        self._jobs: dict[str, dict[str, TrackedIncident]] = {}  # job -> incident id -> its record
        self.opened_total: dict[str, int] = {}
        self.lost_s_total: dict[str, float] = {}  # closed incidents' cost + the open ones' so far

    def update(self, job: str, found: Sequence[Incident], snapshot: Snapshot,
               captures: Sequence[CaptureRecord], now: float) -> None:
        """Merge the incidents an analysis found into the job's record of them. While an incident is
        open, every update adds what the involved ranks' GPUs show now to the evidence it has seen
        (typed, with first/last sighting and worst value); the verdict is decided over all of it, so
        a cause seen while it ran is not lost when the GPU looks different at its close."""
        events: list[dict[str, Any]] = []
        with self._lock:
            kept = self._jobs.setdefault(job, {})
            # A record the analysis now ends sooner (its stretch split by cause, perfd.analytics.
            # incidents.split): what was seen of its iterations after the cut goes on with the next piece.
            cut: _Cut | None = None
            for inc in found:
                if inc.kinds == [STALL] and inc.id not in kept and (carrier := _taken_over(kept, inc)):
                    # The analysis' incident of these iterations took the live stall over: it gets the
                    # stall's latest (closed: its whole silence), and with it the cost's floor.
                    c = kept[carrier].incident
                    kept[carrier] = with_stall_cost(replace(kept[carrier], incident=replace(
                        c, evidence=replace(c.evidence, stall=inc.evidence.stall))))
                    continue
                key = self._match(kept, inc)
                prev = kept.get(key) if key else None
                handed: IncidentEvidence | None = None
                if cut is not None and prev is None and inc.first_iteration <= cut.last:
                    handed, later = _at_end(cut.later, inc)
                    cut = _Cut(cut.kept, later, cut.last) if later is not None else None
                else:
                    cut = None
                if prev is not None and not inc.open and (cut_now := _cut(prev, inc, found)) is not None:
                    prev, cut = cut_now.kept, cut_now
                # A live stall these iterations end (their slow step is the stop): one episode.
                stalls = [] if STALL in inc.kinds else _stall_records(kept, inc, key)
                if prev is None and stalls:
                    prev, key = stalls[0], stalls[0].id
                if prev is not None and not prev.open and not inc.open and not stalls:
                    # Closed and recorded with its GPU and host evidence of the time. What its steps
                    # show is re-read while a later analysis sees the same stretch (_refine_closed);
                    # once warm-up or retention takes its start, what was recorded stays.
                    if inc.first_iteration == prev.incident.first_iteration:
                        kept[key or inc.id] = _refine_closed(prev, inc, now)
                    continue
                rec = self._record(inc, prev, stalls, snapshot, captures, now, handed)
                for d in stalls:
                    kept.pop(d.id, None)
                if prev is None:
                    self.opened_total[job] = self.opened_total.get(job, 0) + 1
                    events.append(incident_event(INCIDENT_OPENED.name, job, rec))
                elif prev.open and not inc.open:
                    events.append(incident_event(INCIDENT_CLOSED.name, job, rec))
                if prev is not None and key != inc.id:
                    kept.pop(key or "", None)
                kept[inc.id] = rec
            self.lost_s_total[job] = max(self.lost_s_total.get(job, 0.0),
                                         sum(d.incident.cost_s or 0.0 for d in kept.values()))
            if len(kept) > self.max_per_job:  # the costliest stay
                for k, _ in sorted(kept.items(), key=lambda kv: kv[1].incident.cost_s or 0.0)[
                        : len(kept) - self.max_per_job]:
                    kept.pop(k)
        if events:
            self.emit(events)

    @staticmethod
    def _record(inc: Incident, prev: TrackedIncident | None, stalls: Sequence[TrackedIncident],
                snapshot: Snapshot, captures: Sequence[CaptureRecord], now: float,
                handed: IncidentEvidence | None = None) -> TrackedIncident:
        """``inc`` as recorded now: what it carried before (``prev``) and the live stalls it takes over
        (``stalls``), with what its ranks' GPUs and hosts show now while it is open. ``handed``: what
        was seen of its iterations while they were part of another record's stretch (split since)."""
        pev = prev.incident.evidence if prev is not None else handed
        gpu: dict[int, RankSnapshot] = dict(pev.gpu or {}) if pev is not None else {}
        live = [as_kept(e) for e in pev.gpu_observed or ()] if pev is not None else []
        xid_base: dict[int, float] = dict(pev.xid_at_open or {}) if pev is not None else {}
        oom_base: dict[int, int] = dict(pev.oom_at_open or {}) if pev is not None else {}
        for d in stalls:
            if d is not prev:
                live = merge(live, [as_kept(e) for e in d.incident.evidence.gpu_observed or ()])
                gpu = {**(d.incident.evidence.gpu or {}), **gpu}
        if inc.open or prev is None:
            for r, snap in snapshot(inc).items():  # the evidence as it is now, while it happens
                items = [as_kept(e) for e in snap.items]
                count = snap.gpu_values.get("perfd_gpu_xid_errors_total")
                if isinstance(count, (int, float)):
                    xid_base.setdefault(r, float(count))
                    x = xid_evidence(r, xid_base[r], float(count), snap.gpu_values.get("perfd_gpu_xid_last"),
                                     snap.taken_at)
                    items += [x] if x is not None else []
                host = snap.host
                if host is not None:  # the rank's process on its host (collectors/ranks)
                    kills = host.get("oom_kills")
                    if isinstance(kills, int):
                        oom_base.setdefault(r, kills)
                    o = oom_evidence(r, oom_base.get(r), host)
                    items += [o] if o is not None else []
                live = merge(live, [e for e in items if not _began_after(e, inc)])
                if _worth_keeping(items, gpu.get(r)):
                    gpu[r] = replace(snap, items=tuple(items))
        caps = _overlapping(captures, inc, now)
        verdict = decide([*live, *inc.observed(), *_capture_evidence(caps)], inc.ranks, _missing(inc, gpu),
                         stalled=inc.kinds == [STALL])
        ev = replace(inc.evidence, gpu=gpu, gpu_observed=tuple(live), xid_at_open=xid_base,
                     oom_at_open=oom_base)
        # its own lists: the analysis' incident is not the record's (as the JSON docs once copied them)
        out = replace(inc, kinds=list(inc.kinds), ranks=list(inc.ranks), verdict=verdict,
                      cause="", evidence=ev)  # worded from the verdict where shown
        first_seen = prev.first_seen if prev is not None else now
        if stalls:  # the stall seen live, with its ranks' states and stacks, stays with it
            # The episode began where the stall did: slow steps a few iterations after a pause
            # that lies between steps (seen under load: 1304 for a stall at 1301) take it over.
            began = min(d.incident.first_iteration for d in stalls)
            out = replace(out, kinds=sorted({*out.kinds, STALL}),
                          evidence=replace(ev, stall=stalls[-1].incident.evidence.stall),
                          first_iteration=min(out.first_iteration, began))
            first_seen = min(d.first_seen for d in stalls)
        elif prev is not None and STALL in prev.kinds and STALL not in out.kinds:
            out = replace(out, kinds=sorted({*out.kinds, STALL}),  # taken over before: it stays so
                          evidence=replace(ev, stall=pev.stall if pev is not None else None),
                          first_iteration=min(out.first_iteration, prev.incident.first_iteration))
        return with_stall_cost(TrackedIncident(out, inc.duration_s, tuple(caps), first_seen, now))

    def close_orphan_stalls(self, job: str, now: float) -> int:
        """Close the job's open live-stall incidents no stall watch holds any more (kept across an
        aggregator restart while the job resumed meanwhile): an open stall reaches forward to the
        next incident, which it would otherwise take for its own. Returns how many it closed."""
        events = []
        with self._lock:
            kept = self._jobs.get(job, {})
            for k, rec in kept.items():
                inc = rec.incident
                if inc.kinds == [STALL] and inc.open:
                    closed = replace(inc, open=False, end_time=inc.end_time or now)
                    rec = kept[k] = replace(rec, incident=closed, updated_at=now)
                    events.append(incident_event(INCIDENT_CLOSED.name, job, rec))
        if events:
            self.emit(events)
        return len(events)

    def withdraw(self, job: str, incident_id: str, now: float, why: Withdrawal) -> bool:
        """Take back an incident seen live that turned out not to be one (a stall that was the job's
        exit): it is closed with ``withdrawn`` set (an INCIDENT_CLOSED event says so) and no longer
        listed. True when there was one."""
        with self._lock:
            rec = self._jobs.get(job, {}).pop(incident_id, None)
        if rec is None:
            return False
        inc = rec.incident
        rec = replace(rec, incident=replace(inc, open=False, end_time=inc.end_time or now, cost_s=0.0),
                      updated_at=now)
        self.emit([incident_event(INCIDENT_CLOSED.name, job, rec, why)])
        return True

    def withdraw_stall(self, job: str, first_iteration: int, now: float, why: Withdrawal) -> bool:
        """Take back the live stall that began at ``first_iteration``: alone, it is withdrawn; taken
        over by the analysis' incident of its iterations, that incident loses it (its kind, its
        evidence, the silence in its cost) and keeps what its own steps show."""
        if self.withdraw(job, f"stall-{first_iteration}", now, why):
            return True
        with self._lock:
            kept = self._jobs.get(job, {})
            carrier = next((k for k, d in kept.items() if STALL in d.kinds and d.kinds != [STALL]
                            and d.incident.evidence.stall is not None
                            and d.incident.first_iteration <= first_iteration
                            <= d.incident.last_iteration + 1),
                           None)
            if carrier is None:
                return False
            rec = kept[carrier]
            inc = rec.incident
            steps = rec.step_cost_s()
            kept[carrier] = replace(rec, incident=replace(
                inc, kinds=[k for k in inc.kinds if k != STALL], evidence=replace(inc.evidence, stall=None),
                cost_s=steps), updated_at=now, cost_parts=None, stall_withdrawn=why)
        log.info("job %s: incident %s keeps its steps, not the stall at iteration %d (%s)", job, carrier,
                 first_iteration, why.value)
        return True

    def close_open(self, job: str, now: float, why: str, end_time: float | None = None) -> int:
        """Close every open incident of the job: its run or the job itself ended, so no later step
        can continue one (nested incidents stayed open after a job's end). Each keeps its cost and
        evidence; an INCIDENT_CLOSED event says ``why``. Returns how many were closed."""
        events = []
        with self._lock:
            kept = self._jobs.get(job, {})
            for key, rec in list(kept.items()):
                if not rec.open:
                    continue
                inc = rec.incident
                closed = replace(inc, open=False, end_time=inc.end_time or end_time or now)
                rec = replace(rec, incident=closed, updated_at=now)
                kept[key] = rec
                ev = incident_event(INCIDENT_CLOSED.name, job, rec)
                ev["text"] = f"incident {inc.id} closed: {why}"
                events.append(ev)
        if events:
            self.emit(events)
        return len(events)

    def retire_run(self, job: str, run: int, now: float) -> None:
        """Run ``run`` of the job ended (a new run replaced its records): its incidents are closed and
        kept under the run's name, so that the new run's, whose iteration numbers may repeat (a restart
        from iteration 1), are never merged into them."""
        self.close_open(job, now, f"run {run} of the job ended (a new run began)")
        with self._lock:
            kept = self._jobs.get(job)
            if not kept:
                return
            for key in [k for k, d in kept.items() if d.run is None]:
                rec = kept.pop(key)
                kept[f"run{run}:{key}"] = replace(rec, run=run)

    def forget(self, job: str) -> None:
        """The job was pruned: its incidents go with it (the totals on /metrics too)."""
        with self._lock:
            for d in (self._jobs, self.opened_total, self.lost_s_total):
                d.pop(job, None)

    def export(self) -> dict[str, Any]:
        """Everything kept, as JSON (for the aggregator's state store)."""
        with self._lock:
            jobs = {j: dict(v) for j, v in self._jobs.items()}
            opened, lost = dict(self.opened_total), dict(self.lost_s_total)
        return {"jobs": {j: {k: rec.to_json() for k, rec in v.items()} for j, v in jobs.items()},
                "opened_total": opened, "lost_s_total": lost}

    def load(self, doc: Mapping[str, Any]) -> None:
        """Back from :meth:`export`: incidents already reported are matched, never re-announced."""
        jobs = {str(j): {str(k): tracked_from_json(d) for k, d in v.items()}
                for j, v in doc.get("jobs", {}).items()}
        with self._lock:
            self._jobs = jobs
            self.opened_total = {str(j): int(n) for j, n in doc.get("opened_total", {}).items()}
            self.lost_s_total = {str(j): float(n) for j, n in doc.get("lost_s_total", {}).items()}

    @staticmethod
    def _match(kept: Mapping[str, TrackedIncident], inc: Incident) -> str | None:
        """The recorded incident this one continues: same id, else an overlapping iteration range
        (an incident grows at both ends as iterations arrive and the steady median settles)."""
        if inc.id in kept:
            return inc.id
        for k, d in kept.items():
            if d.run is None and _overlaps(d, inc) and set(d.kinds) & set(inc.kinds):
                return k
        return None

    def typed_incidents(self, job: str) -> tuple[TrackedIncident, ...]:
        """The job's incidents as kept, by first iteration."""
        with self._lock:
            recs = list(self._jobs.get(job, {}).values())
        return tuple(sorted(recs, key=lambda d: (d.incident.first_iteration, d.id)))

    def has_open(self, job: str) -> bool:
        with self._lock:
            return any(d.open for d in self._jobs.get(job, {}).values())

    def incidents(self, job: str) -> list[dict[str, Any]]:
        """The job's incidents as JSON (the HTTP API's)."""
        return [d.to_json() for d in self.typed_incidents(job)]

    def open_incidents(self, job: str) -> list[dict[str, Any]]:
        return [d.to_json() for d in self.typed_incidents(job) if d.open]

    def metric_rows(self, jobs: Iterable[str] = ()) -> list[tuple[Mapping[str, str], str, float]]:
        """The incident counters of every job that had one, and of ``jobs`` (those holding data) at 0:
        increase() needs a sample before a counter's first rise to count it (without it one read 2.03
        for three incidents when the counter appeared at 1 with the first). Then one cause series per
        cause among each job's open incidents (none once they closed)."""
        with self._lock:
            rows: list[tuple[Mapping[str, str], str, float]] = []
            for job in sorted(set(self.opened_total) | set(jobs)):
                n = self.opened_total.get(job, 0)
                rows.append(({"job_name": job}, "perfd_job_incidents_total", float(n)))
                rows.append(({"job_name": job}, "perfd_job_incident_lost_seconds_total",
                             float(self.lost_s_total.get(job, 0.0))))
                n_open = sum(1 for d in self._jobs.get(job, {}).values() if d.open)
                rows.append(({"job_name": job}, "perfd_job_incidents_open", float(n_open)))
            for job, kept in sorted(self._jobs.items()):
                for cause in sorted({cause_label(d.incident.verdict) for d in kept.values() if d.open}):
                    rows.append(({"job_name": job, "cause": cause}, catalog.JOB_INCIDENT_CAUSE_INFO, 1.0))
            return rows


@dataclasses.dataclass(frozen=True)
class _Cut:
    """A record cut short at ``inc``'s end: the record with what was seen up to then (``kept``), and
    what was seen after it (``later``, for the piece of the stretch that follows, up to ``last``)."""

    kept: TrackedIncident
    later: IncidentEvidence
    last: int


def _at_end(ev: IncidentEvidence, inc: Incident) -> tuple[IncidentEvidence, IncidentEvidence | None]:
    """Live evidence split at the end of ``inc``: what was seen up to it (an item by its first
    sighting), and what was seen after it (by its last sighting; a rank's snapshot by when it was
    taken), None while ``inc`` is open or reaches the end of what was seen. An item seen across the
    end is in both: its sightings are not kept one by one."""
    end = inc.end_time
    items = tuple(ev.gpu_observed or ())
    if inc.open or end is None:
        return ev, None
    mine = replace(ev, gpu_observed=tuple(e for e in items if e.first_seen is None or e.first_seen <= end))
    after = tuple(e for e in items if e.last_seen is not None and e.last_seen > end)
    gpu = {r: snap for r, snap in (ev.gpu or {}).items() if snap.taken_at > end}
    if not after and not gpu:
        return mine, None
    return mine, IncidentEvidence(gpu=gpu, gpu_observed=after, xid_at_open=ev.xid_at_open,
                                  oom_at_open=ev.oom_at_open)


def _cut(rec: TrackedIncident, inc: Incident, found: Sequence[Incident]) -> _Cut | None:
    """``rec`` as far as ``inc`` (closed) now reaches, where the analysis split its stretch by cause
    (another of ``found`` begins in what it recorded after ``inc``): what was seen after ``inc``'s end
    is the later piece's (a CPU contention seen while load-slowed steps ran never blames the data-slow
    steps before them). An incident that only ends sooner keeps all it saw (its last sightings come
    after its last step: a refresh follows the records)."""
    kept = rec.incident
    if STALL in kept.kinds or not any(inc.last_iteration < o.first_iteration <= kept.last_iteration
                                      for o in found if o is not inc):
        return None
    mine, later = _at_end(kept.evidence, inc)
    out = _Cut(replace(rec, incident=replace(kept, evidence=mine)), later or IncidentEvidence(),
               kept.last_iteration)
    return out


def _overlaps(d: TrackedIncident, inc: Incident) -> bool:
    kept = d.incident
    return kept.first_iteration <= inc.last_iteration and inc.first_iteration <= kept.last_iteration


def _stall_records(kept: Mapping[str, TrackedIncident], inc: Incident,
                   key: str | None) -> list[TrackedIncident]:
    """Live stalls (kept alone) over the iterations ``inc`` covers: it takes them over. An open stall
    reaches to whatever iteration comes next (steps done before the stop arrive with those after
    it, from the stopped process: the slow one may be any of them)."""
    return [d for k, d in kept.items() if k != key and d.kinds == [STALL]
            and (_overlaps(d, inc) or (d.open and inc.last_iteration >= d.incident.first_iteration))]


def _taken_over(kept: Mapping[str, TrackedIncident], inc: Incident) -> str | None:
    """The incident of the analysis that has taken this stall's iterations over (it carries the
    stall), by its key; None when none has."""
    return next((k for k, d in kept.items() if STALL in d.kinds and d.kinds != [STALL] and _overlaps(d, inc)),
                None)


# Evidence whose first sighting is when it began (a process's state change), not when it was looked at.
_ONSET_KINDS = frozenset({EvidenceKind.PROCESS_STOPPED, EvidenceKind.PROCESS_GONE})


def _began_after(e: Evidence, inc: Incident) -> bool:
    """A process stopped or gone only after the incident's last step: not its cause (an analysis
    incident stays open after its last step while no record follows it — the live stall is the
    stop's own incident)."""
    return (e.kind in _ONSET_KINDS and STALL not in inc.kinds and inc.end_time is not None
            and e.first_seen is not None and e.first_seen > inc.end_time)


def _tier(items: Sequence[Evidence]) -> int:
    return min((int(e.spec.tier) for e in items), default=99)


def _worth_keeping(items: Sequence[Evidence], old: RankSnapshot | None) -> bool:
    """Keep a rank's newest snapshot unless the kept one shows a cause higher in the causal order
    (the GPU as it was while the co-tenant ran, not after it left)."""
    return old is None or _tier(items) <= _tier(old.items)


def _missing(inc: Incident, gpu: Mapping[int, RankSnapshot]) -> list[Missing]:
    out = [] if inc.ranks or inc.single_rank else [Missing.PER_RANK_TIMERS]
    placed = [s for s in gpu.values() if s.placed and s.gpu is not None]
    if not placed and not inc.cpu_only:  # a CPU-only job's GPU is no missing input: it has none
        out.append(Missing.RANK_PLACEMENT if gpu else Missing.GPU_STATE)
    return out


def _capture_evidence(caps: Sequence[CaptureSeen]) -> list[Evidence]:
    """A capture during the incident whose kernels ran slower than in steady state."""
    out = []
    for c in caps:
        for rank, ratio in c.slowdown.items():
            if str(rank).isdigit() and isinstance(ratio, (int, float)):
                t = c.started_at
                out.append(Evidence(EvidenceKind.CAPTURE_FINDING, int(rank), c.id, float(ratio),
                                    t, c.finished_at or t, 1, {"capture": c.id, "tool": c.tool}))
    return out


def _overlapping(captures: Sequence[CaptureRecord], inc: Incident, now: float) -> list[CaptureSeen]:
    """Captures of the job taken during the incident, with their findings."""
    if inc.start_time is None:
        return []
    end = inc.end_time if inc.end_time is not None and not inc.open else now
    out = []
    for c in captures:
        t = c.started_at  # a capture that never started ran during nothing
        if isinstance(t, (int, float)) and inc.start_time - 1.0 <= t <= end + 1.0:
            out.append(CaptureSeen.of(c))
    return out

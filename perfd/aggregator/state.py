"""The aggregator's in-memory state: jobs, their step records and analyses, node samples.

Ingest is called from the gRPC event loop; readers (HTTP /metrics and the JSON API) run in another
thread, so every access goes through one lock. Ingest does no analysis: a job is marked dirty and
its analysis is recomputed on the next read, at most every ``min_recompute_s`` (a busy job is not
re-analysed once per batch).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfd.aggregator.collectives import CollectiveStore, metric_rows
from perfd.aggregator.serving import ServingStore
from perfd.analytics.attribution import place_ranks
from perfd.analytics.collectives import CollectiveAnalysis
from perfd.analytics.megatron_job import RunAnalysis, analyze_run
from perfd.model import SERVING_DATA_EVENT, CollectiveRecord, JobInfo, StepRecord, TimerValue

log = logging.getLogger(__name__)

LabelKey = tuple[tuple[str, str], ...]
GpuKey = tuple[str, str]  # (node, gpu index)


@dataclass
class NodeSeries:
    """Latest value of one time series from one agent."""

    name: str
    labels: LabelKey
    time_ns: int
    value: float


@dataclass
class JobState:
    name: str
    job_info: JobInfo | None = None
    job_info_agent: str | None = None
    # (iteration, rank scope) -> record. Re-delivery of a batch replaces, never duplicates.
    records: dict[tuple[int, str], StepRecord] = field(default_factory=dict)
    agents: set[str] = field(default_factory=set)
    gpu_name: str | None = None  # from the NVML samples of the job's agents ("model" label)
    analysis: RunAnalysis | None = None
    analysis_time: float = 0.0
    dirty: bool = False
    last_step_time: float = 0.0  # wall time the last step record arrived


@dataclass
class Stats:
    samples: int = 0
    steps: int = 0
    events: int = 0
    batches: int = 0
    dropped_steps: int = 0  # older than the retention window
    analysis_errors: int = 0
    started: float = field(default_factory=time.time)


class AggregatorState:
    def __init__(self, max_iterations_per_job: int = 5000, min_recompute_s: float = 0.5,
                 gpu_override: str | None = None, peak_tflops: float | None = None) -> None:
        self._lock = threading.Lock()
        self.jobs: dict[str, JobState] = {}
        self.series: dict[tuple[str, str, LabelKey], NodeSeries] = {}  # (agent, name, labels)
        self.agent_job: dict[str, str] = {}
        self.agent_seen: dict[str, float] = {}
        self.events: list[dict[str, Any]] = []  # newest last, bounded
        # (node, gpu) -> (agent, latest process list from the NVML collector)
        self.gpu_procs: dict[GpuKey, tuple[str, list[dict[str, Any]]]] = {}
        # SGLang records per job and their analysis (its own lock; see aggregator/serving).
        self.serving = ServingStore()
        # node -> latest GPU -> pod allocation from the k8s collector (kubelet pod-resources)
        self.gpu_pods: dict[str, list[dict[str, Any]]] = {}
        # Called (outside the lock) with every event ingested: capture progress goes to the
        # capture coordinator this way.
        self.event_listeners: list[Callable[[dict[str, Any]], None]] = []
        self.stats = Stats()
        self.max_iterations = max_iterations_per_job
        self.min_recompute_s = min_recompute_s
        self.gpu_override = gpu_override
        self.peak_tflops = peak_tflops
        self.transport_stats: Mapping[str, int] | None = None  # set by the server for /api/stats
        # NCCL collective records and hang events, per job (its own lock; see aggregator/collectives).
        self.collectives = CollectiveStore()

    # ---- ingest (gRPC side) -----------------------------------------------------------------
    def _job(self, name: str) -> JobState:
        js = self.jobs.get(name)
        if js is None:
            js = self.jobs[name] = JobState(name)
        return js

    def hello(self, agent_id: str, jobs: Sequence[str]) -> None:
        with self._lock:
            self.agent_seen[agent_id] = time.time()
            for j in jobs:
                self._job(j).agents.add(agent_id)
                self.agent_job[agent_id] = j

    def ingest_samples(self, agent_id: str, series_defs: Mapping[int, tuple[str, LabelKey]],
                       series_ids: Sequence[int], timestamps_ns: Sequence[int],
                       values: Sequence[float]) -> None:
        """Keep the latest value per series. Columnar in, no object per sample: the dict built
        from zip keeps the last occurrence of each id, at C speed."""
        latest = dict(zip(series_ids, zip(timestamps_ns, values, strict=True), strict=True))
        with self._lock:
            self.stats.samples += len(values)
            self.agent_seen[agent_id] = time.time()
            for sid, (ts, val) in latest.items():
                name, labels = series_defs[sid]
                key = (agent_id, name, labels)
                cur = self.series.get(key)
                if cur is None:
                    self.series[key] = NodeSeries(name, labels, ts, val)
                elif ts >= cur.time_ns:
                    cur.time_ns, cur.value = ts, val
                if name == "perfd_gpu_memory_total_bytes":  # any GPU series names the model
                    model = dict(labels).get("model")
                    job = self.agent_job.get(agent_id)
                    if model and job:
                        self._job(job).gpu_name = model

    def ingest_job_info(self, agent_id: str, job: str, info: JobInfo) -> None:
        with self._lock:
            js = self._job(job)
            js.agents.add(agent_id)
            js.job_info, js.job_info_agent = info, agent_id
            js.dirty = True

    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord]) -> None:
        with self._lock:
            self.stats.steps += len(steps)
            for rec in steps:
                js = self._job(rec.job)
                js.agents.add(agent_id)
                js.records[(rec.iteration, str(rec.rank))] = rec
                js.dirty = True
                js.last_step_time = time.time()
                if len(js.records) > self.max_iterations:
                    oldest = min(js.records)
                    del js.records[oldest]
                    self.stats.dropped_steps += 1

    def ingest_collectives(self, agent_id: str, recs: Sequence[CollectiveRecord]) -> None:
        with self._lock:
            self.agent_seen[agent_id] = time.time()
            for job in {r.job for r in recs}:
                self._job(job).agents.add(agent_id)
        self.collectives.ingest(agent_id, recs)

    def ingest_events(self, agent_id: str, events: Sequence[dict[str, Any]]) -> None:
        for ev in events:
            if ev.get("kind") == "nccl_hang":  # merged across agents by the collective analysis
                self.collectives.add_hang_event(agent_id, ev)
        with self._lock:
            self.stats.events += len(events)
            for ev in events:
                labels = ev.get("labels") or {}
                if ev.get("kind") == SERVING_DATA_EVENT:  # data for the analysis, not history
                    if (job := self.serving.ingest(ev.get("payload"))) is not None:
                        self._job(job).agents.add(agent_id)
                    continue
                if ev.get("kind") == "gpu_processes" and isinstance(ev.get("payload"), list):
                    # The latest process list of each GPU replaces the previous one.
                    key = (labels.get("node", agent_id), labels.get("gpu", "?"))
                    self.gpu_procs[key] = (agent_id, list(ev["payload"]))
                    continue  # state, not history: kept above, not in the event log
                if ev.get("kind") == "gpu_pods" and isinstance(ev.get("payload"), list):
                    self.gpu_pods[labels.get("node", agent_id)] = list(ev["payload"])
                    continue
                self.events.append({**ev, "agent": agent_id})
            del self.events[:-1000]
        for listener in self.event_listeners:
            for ev in events:
                listener(ev)

    def gpu_view(self, job: str) -> tuple[dict[GpuKey, list[dict[str, Any]]],
                                          dict[GpuKey, dict[str, float]], dict[GpuKey, list[str]]]:
        """For the job's agents: process lists, latest GPU values and active throttle reasons,
        each keyed by (node, gpu)."""
        with self._lock:
            js = self.jobs.get(job)
            agents = set(js.agents) if js else set()
            procs = {k: list(v[1]) for k, v in self.gpu_procs.items() if v[0] in agents}
            values: dict[GpuKey, dict[str, float]] = {}
            throttles: dict[GpuKey, list[str]] = {}
            for (agent, name, labels), s in self.series.items():
                if agent not in agents or not name.startswith("perfd_gpu_"):
                    continue
                lab = dict(labels)
                key = (lab.get("node", agent), lab.get("gpu", "?"))
                if "reason" in lab:
                    if name == "perfd_gpu_throttle_active" and s.value >= 1:
                        throttles.setdefault(key, []).append(lab["reason"])
                    continue
                if "type" not in lab:
                    values.setdefault(key, {})[name] = s.value
            return procs, values, throttles

    def pods_by_gpu(self) -> dict[GpuKey, dict[str, Any]]:
        """(node, gpu index) -> the pod and container its GPU is allocated to (collectors/k8s),
        joined on the GPU UUID of the node's NVML series, or on the index the kubelet gave."""
        with self._lock:
            index_of = {(dict(lab).get("node", agent), dict(lab)["uuid"]): dict(lab).get("gpu", "?")
                        for (agent, name, lab) in self.series
                        if name == "perfd_gpu_memory_total_bytes" and "uuid" in dict(lab)}
            out: dict[GpuKey, dict[str, Any]] = {}
            for node, owners in self.gpu_pods.items():
                for o in owners:
                    uuid = o.get("uuid")
                    gpu = index_of.get((node, str(uuid))) if uuid else o.get("gpu")
                    if gpu is not None:
                        out[(node, str(gpu))] = o
            return out

    # ---- read side (HTTP thread) --------------------------------------------------------------
    def analysis(self, job: str, force: bool = False) -> RunAnalysis | None:
        """The job's analysis, recomputed if new data arrived (rate-limited)."""
        with self._lock:
            js = self.jobs.get(job)
            if js is None:
                return None
            stale = js.dirty and (force or time.time() - js.analysis_time >= self.min_recompute_s)
            if js.analysis is not None and not stale:
                return js.analysis
            info = js.job_info or JobInfo()
            records = job_level_steps(list(js.records.values()))
            gpu = self.gpu_override or js.gpu_name
            js.dirty = False
        # Analysis outside the lock: ingest must never wait for it.
        try:
            result = analyze_run(info, records, gpu_name=gpu, peak_tflops=self.peak_tflops,
                                 job_name=job)
        except Exception:
            with self._lock:
                self.stats.analysis_errors += 1
                js.dirty = True
            raise
        with self._lock:
            js.analysis, js.analysis_time = result, time.time()
        return result

    def collective_analysis(self, job: str, force: bool = False) -> CollectiveAnalysis | None:
        """The job's collective analysis (None when no collective record or hang event came in)."""
        with self._lock:
            js = self.jobs.get(job)
            steps_key = (len(js.records), js.last_step_time) if js else (0, 0.0)

        def inputs() -> tuple[list[StepRecord], Any, dict[int, str], str | None]:
            procs, _values, _thr = self.gpu_view(job)
            placed = {r: p.node for r, p in place_ranks(procs).items()}
            with self._lock:
                js = self.jobs.get(job)
                if js is None:
                    return [], None, placed, self.gpu_override
                layout = js.job_info.layout if js.job_info else None
                return list(js.records.values()), layout, placed, self.gpu_override or js.gpu_name

        return self.collectives.analysis(job, steps_key, inputs, force=force)

    def collective_rows(self, per_rank: bool = True) -> list[tuple[Mapping[str, str], str, float]]:
        """/metrics rows of every job's collective analysis, plus the store's own counters."""
        rows: list[tuple[Mapping[str, str], str, float]] = []
        for job in self.collectives.job_names():
            try:
                a = self.collective_analysis(job)
            except Exception:  # counted in the store; one bad job must not break the scrape
                log.exception("collective analysis of job %s failed", job)
                continue
            if a is not None:
                rows.extend(metric_rows(job, a, per_rank))
        rows.append(({}, "perfd_aggregator_collective_records_total", float(self.collectives.ingested)))
        rows.append(({}, "perfd_aggregator_collective_records_dropped_total",
                     float(self.collectives.dropped)))
        return rows

    def serving_view(self, job: str) -> dict[str, Any] | None:
        """Latest serving numbers (catalog names) and report of a serving job; None if not one."""
        return self.serving.view(job)

    def recent_events(self, job: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        with self._lock:
            evs = [e for e in self.events if job is None or e.get("job") in ("", None, job)
                   or (e.get("labels") or {}).get("job") == job]
        return evs[-limit:]

    def job_names(self) -> list[str]:
        with self._lock:
            return sorted(self.jobs)

    def job_overview(self, job: str) -> dict[str, Any] | None:
        with self._lock:
            js = self.jobs.get(job)
            if js is None:
                return None
            its = sorted(it for it, _ in js.records)
            return {
                "job": job,
                "agents": sorted(js.agents),
                "gpu": self.gpu_override or js.gpu_name,
                "iterations_seen": len(js.records),
                "first_iteration": its[0] if its else None,
                "last_iteration": its[-1] if its else None,
                "has_job_info": js.job_info is not None,
                "last_step_age_s": (time.time() - js.last_step_time) if js.last_step_time else None,
            }

    def node_series(self) -> list[tuple[str, NodeSeries]]:
        """(agent id, series) pairs for export; a copy, safe to iterate without the lock."""
        with self._lock:
            return [(k[0], NodeSeries(s.name, s.labels, s.time_ns, s.value))
                    for k, s in self.series.items()]

    def stats_json(self) -> dict[str, Any]:
        with self._lock:
            now = time.time()
            out: dict[str, Any] = {
                "samples_ingested": self.stats.samples,
                "step_records_ingested": self.stats.steps,
                "events_ingested": self.stats.events,
                "step_records_dropped_retention": self.stats.dropped_steps,
                "analysis_errors": self.stats.analysis_errors,
                "serving_records_ingested": self.serving.records,
                "serving_errors": dict(self.serving.errors),
                "jobs": len(self.jobs),
                "agents_seen": {a: round(now - t, 3) for a, t in self.agent_seen.items()},
                "uptime_s": round(now - self.stats.started, 3),
            }
        if self.transport_stats is not None:
            out["transport"] = dict(self.transport_stats)
        return out


def job_level_steps(records: list[StepRecord]) -> list[StepRecord]:
    """One record per iteration for :func:`analyze_run`. Records of one rank each (the step hook)
    are folded into one ``"all"`` record per iteration when the job has no job-level records: the
    slowest rank's step (the iteration ends when it does), timers merged per rank."""
    job_level = [r for r in records if not isinstance(r.rank, int)]
    if job_level or not records:
        return job_level
    by_it: dict[int, list[StepRecord]] = {}
    for r in records:
        by_it.setdefault(r.iteration, []).append(r)
    out = []
    for rs in by_it.values():
        slow = max(rs, key=lambda r: r.step_time_ms if r.step_time_ms is not None else -1.0)
        timers: dict[str, TimerValue] = {}
        for r in rs:
            for name, tv in r.timers.items():
                t = timers.setdefault(name, TimerValue())
                vals = dict(tv.per_rank) or ({r.rank: tv.max_ms} if isinstance(r.rank, int)
                                             and tv.max_ms is not None else {})
                t.per_rank.update(vals)
        for t in timers.values():
            if t.per_rank:
                t.min_ms, t.max_ms = min(t.per_rank.values()), max(t.per_rank.values())
        ends = [r.end_time for r in rs if r.end_time is not None]
        out.append(dataclasses.replace(slow, rank="all", timers=timers, end_time=max(ends) if ends else None))
    return out

"""The aggregator's state, split by concern; this class only wires the parts together.

- perfd/aggregator/jobs.py — job store: job info, step records, agents, the cached run analysis;
- perfd/aggregator/nodes.py — node/GPU view: latest node series, process lists, GPU -> pod;
- perfd/aggregator/collectives.py — NCCL collective records and hangs;
- perfd/aggregator/eventlog.py — the event log, and the routing of events by kind (perfd.events);
- perfd/aggregator/incidents.py — each job's incidents with the GPU evidence of the time;
- perfd/aggregator/hosts.py — each job's rank processes on their hosts, announced pauses, stacks;
- perfd/aggregator/stalls.py — each job's live stall (opened within seconds, closed when steps resume);
- perfd/aggregator/serving.py — SGLang records per job and their analysis (serving view);
- perfd/aggregator/class_inputs.py — what a job's analysis reads of the other parts (GPM, captures);
- perfd/aggregator/snapshot.py — each job as its consumers read it (an immutable JobSnapshot), built
  here at each analysis refresh and whenever the state changed since;
- perfd/aggregator/stats.py — the counters /api/stats serves.

Ingest is called from the gRPC event loop; readers (HTTP /metrics and the JSON API, the rules loop)
run in other threads: each part has its own lock, and no method holds two at once. A job's snapshot
is built outside every lock (each part read under its own) and stored whole: a reader holds an
immutable one while the next is built.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from perfd.aggregator.capture_records import CaptureRecord
from perfd.aggregator.class_inputs import CaptureSource, ClassInputs, NoCaptures
from perfd.aggregator.collectives import CollectiveStore, FoldInputs, metric_rows
from perfd.aggregator.eventlog import EventLog
from perfd.aggregator.gpu_views import (
    PlacementCache,
    SnapshotView,
)
from perfd.aggregator.hosts import HostView
from perfd.aggregator.incidents import GpuBaseline, IncidentTracker
from perfd.aggregator.jobs import (
    RETAIN_BYTES,
    RETAIN_ITERATIONS,
    JobState,
    JobStore,
    StepConflicts,
    job_level_steps,
)
from perfd.aggregator.nodes import GpuKey, NodeSeries, NodeView
from perfd.aggregator.serving import ServingStore
from perfd.aggregator.sightings import Sightings
from perfd.aggregator.snapshot import Analysed, JobSnapshot, Snapshots
from perfd.aggregator.stalls import SendCommand, StallWatch
from perfd.aggregator.stats import Stats, stats_json
from perfd.analytics.collectives.analysis import CollectiveAnalysis
from perfd.analytics.collectives.config import CollectiveConfig
from perfd.analytics.incidents.attribution import RankPlacement
from perfd.analytics.incidents.detect import STEP_FACTOR, Incident, hang_incident
from perfd.analytics.incidents.incident_evidence import RankSnapshot, Withdrawal
from perfd.analytics.ncu.arming import ArmingCost, is_the_arming
from perfd.analytics.steps.liveness import ENDED
from perfd.analytics.steps.run_analysis import RunAnalysis
from perfd.collfold import CollectivePartial
from perfd.events import (
    GPU_PODS,
    GPU_PROCESSES,
    JOB_PHASE,
    NCCL_HANG,
    RANK_PROCESSES,
    RANK_STACKS,
    SERVING_DATA,
    STEP_CONFLICT,
)
from perfd.exporters.prometheus import Row
from perfd.limits import REFUSAL_LOG_INTERVAL_S
from perfd.model import CollectiveRecord, JobInfo, StepRecord
from perfd.transport.series import SeriesKey

log = logging.getLogger(__name__)

__all__ = ["AggregatorState", "GpuKey", "JobState", "NodeSeries", "job_level_steps"]

class AggregatorState:
    def __init__(self, max_iterations_per_job: int = RETAIN_ITERATIONS, min_recompute_s: float = 0.5,
                 gpu_override: str | None = None, peak_tflops: float | None = None,
                 max_bytes_per_job: int = RETAIN_BYTES) -> None:
        self.jobs = JobStore(max_iterations_per_job, min_recompute_s, gpu_override, peak_tflops,
                             max_bytes_per_job)
        self.nodes = NodeView()
        self._placements = PlacementCache(self.nodes)  # each job's rank placement (see gpu_views)
        self.collectives = CollectiveStore()  # its own lock; see aggregator/collectives
        self.collectives.fold_inputs = self._fold_inputs  # its window fold reads the job's steps
        self.log = EventLog()
        self.stats = Stats()
        # The transport's counters, taken when /api/stats or /metrics asks (once per read: each
        # call walks every stream). Set by the aggregator.
        self.transport_stats: Callable[[], dict[str, int]] | None = None
        self.engine_stats: Callable[[], dict[str, Any]] | None = None  # a job's root (perfd.engine)
        # Bumped by every change a job's snapshot shows that no part's own version says (ingest,
        # incidents, settings): a snapshot built at another generation is built anew when asked for.
        self._generation = 0  # guarded by _generation_lock (ingest, the refresher and HTTP all bump it)
        self._generation_lock = threading.Lock()
        self._job_stale_after_s: float | None = None  # --job-stale-after (None: from the job's steps)
        self.snapshots = Snapshots(self._build_snapshot, self._snapshot_version)
        # SGLang records per job and their analysis (its own lock; see aggregator/serving).
        self.serving = ServingStore()
        self.incidents = IncidentTracker(lambda evs: self.ingest_events("aggregator", evs))
        self.gpu_baseline = GpuBaseline()
        self.hosts = HostView()  # the jobs' rank processes on their hosts (collectors/ranks)
        self.stalls = StallWatch()  # live stalls; the aggregator sets stalls.send (stacks requests)
        self._tracked: dict[str, RunAnalysis] = {}  # job -> the analysis incidents were taken from
        # (job, holder, sender) -> (when its conflict event was last emitted, records since)
        self.replaying = False  # the state store's replay: its events come back with the documents
        self._conflicts: dict[tuple[str, str, str], tuple[float, int]] = {}
        # The capture coordinator, once it attaches (attach_captures): the jobs' capture records.
        self._captures: CaptureSource = NoCaptures()
        self.inputs = ClassInputs(self.jobs, self.nodes, self.incidents, self.captures_of,
                                  lambda: self._job_stale_after_s)
        # What the jobs' GPUs and hosts show, read for their incidents and steady baselines.
        self.sightings = Sightings(self.jobs, self.nodes, self.hosts, self._placements, self.gpu_baseline,
                                   self.inputs.stepping)
        self.jobs.capture_windows = self.inputs.capture_windows
        self.jobs.class_inputs = self.inputs.class_inputs
        self.jobs.placed_gpu = lambda job: self.nodes.model_of(job, self.jobs.agents_of(job))
        self.log.handle(GPU_PROCESSES, self.nodes.on_gpu_processes)
        self.log.handle(GPU_PODS, self.nodes.on_gpu_pods)
        self.log.handle(NCCL_HANG, self._on_hang)
        self.log.handle(SERVING_DATA, self._on_serving_data)
        self.log.handle(RANK_PROCESSES, self.hosts.on_rank_processes)
        self.log.handle(JOB_PHASE, self.hosts.on_job_phase)
        self.log.handle(RANK_STACKS, self.hosts.on_rank_stacks)

    def _bump(self) -> None:
        """Something a job's snapshot shows changed: the next read builds it anew."""
        with self._generation_lock:
            self._generation += 1

    @property
    def job_stale_after_s(self) -> float | None:
        return self._job_stale_after_s

    @job_stale_after_s.setter
    def job_stale_after_s(self, value: float | None) -> None:
        self._job_stale_after_s = value
        self._bump()

    def configure(self, collectives: CollectiveConfig | None,
                  collectives_per_job: Mapping[str, CollectiveConfig], job_stale_after_s: float | None,
                  stall_phase_max_s: float) -> None:
        """The aggregator's settings: link capabilities for the collective analysis (all jobs, and per
        job), --job-stale-after and --stall-phase-max-s."""
        if collectives is not None:
            self.collectives.config = collectives
        self.collectives.job_config.update(collectives_per_job)
        self.job_stale_after_s = job_stale_after_s
        self.stalls.phase_max_s = stall_phase_max_s

    def connect(self, standing: Callable[[str, str], int], send: SendCommand) -> None:
        """The aggregator's guard and server: who keeps an iteration two hosts wrote (its standing),
        and how a stall asks its agents for the ranks' stacks."""
        self.jobs.standing = standing
        self.stalls.send = send

    def jobs_on(self, agent_id: str) -> set[str]:
        """The jobs whose processes run on the agent's GPUs (a node agent reports them)."""
        return self.nodes.jobs_on(agent_id)

    def agents_seen(self) -> dict[str, float]:
        """agent -> when it was last seen."""
        return self.nodes.agents_seen()

    def holds_data(self, job: str) -> bool:
        """The job has step records or job info, collective records or serving records."""
        return self.jobs.has_data(job) or self.collectives.has_job(job) or job in self.serving.job_names()

    def activity(self, job: str) -> tuple[float, float] | None:
        """(when its last step arrived, or 0.0; when anything of it last did); None: not held."""
        return self.jobs.activity(job)

    def attach_captures(self, source: CaptureSource) -> None:
        """The capture coordinator: every event ingested goes to it (the capture progress the agents
        report), and its records are what captures_of and arming_of read."""
        self._captures = source
        self.log.listeners.append(source.on_event)

    def captures_of(self, job: str) -> list[CaptureRecord]:
        """The job's capture records, for incidents and for marking the iterations a capture
        disturbed."""
        return self._captures.of_job(job)

    def arming_of(self, job: str) -> ArmingCost | None:
        """What arming ncu costs the job's armed ranks (perfd.analytics.ncu.arming), for its report: as
        the job's analysis measures it from its armed steps (against its previous run), else as the
        capture coordinator does from an ncu capture's ranks (against the unarmed ranks)."""
        a = self.jobs.cached_analysis(job)
        if a is not None and a.summary.arming is not None:
            return a.summary.arming
        return self._captures.arming(job)

    # ---- ingest (gRPC side) -----------------------------------------------------------------
    def hello(self, agent_id: str, jobs: Sequence[str], now: float | None = None, node: str | None = None,
              capabilities: Mapping[str, str] | None = None) -> None:
        self.nodes.seen(agent_id)
        if node is not None:  # a live Hello (a replayed one holds only its jobs)
            self.nodes.said_hello(agent_id, node, capabilities or {})
        self.jobs.hello(agent_id, jobs, now)
        self._bump()

    def series_defined(self, agent_id: str, series_ids: Sequence[int]) -> None:
        """A stream of the agent (re)defined these series ids (before samples that use them)."""
        self.nodes.defined(agent_id, series_ids)

    def ingest_samples(self, agent_id: str, series_defs: Mapping[int, SeriesKey],
                       series_ids: Sequence[int], timestamps_ns: Sequence[int],
                       values: Sequence[float]) -> None:
        self.nodes.ingest_samples(agent_id, series_defs, series_ids, timestamps_ns, values,
                                  lambda model: self._note_gpu_model(agent_id, model))
        self._bump()  # a GPU model named: the job's overview shows it

    def _note_gpu_model(self, agent_id: str, model: str) -> None:
        """The GPU model an agent's series name: its own job's (a sidecar with NVML), and that of
        each job placed on its GPUs (a node agent's: the peak table of their MFU needs it)."""
        self.jobs.note_gpu_model(agent_id, model)
        for job in self.nodes.jobs_on(agent_id):
            self.jobs.set_gpu_model(job, model)

    def ingest_job_info(self, agent_id: str, job: str, info: JobInfo, now: float | None = None) -> None:
        self.jobs.ingest_job_info(agent_id, job, info, now)
        self._bump()

    def note_folded_ranks(self, job: str, ranks: Collection[int]) -> None:
        self.jobs.note_folded_ranks(job, ranks)
        self._bump()

    def held_fold(self, job: str, iteration: int) -> StepRecord | None:
        return self.jobs.held_fold(job, iteration)

    def forget_job(self, job: str) -> None:
        """Drop everything held of the job (perfd.aggregator.lifecycle prunes it)."""
        self.jobs.forget(job)
        self.collectives.forget(job)
        self.serving.forget(job)
        self.incidents.forget(job)
        self.gpu_baseline.forget(job)
        self.hosts.forget(job)
        self.stalls.forget(job)
        self._placements.forget(job)
        self.sightings.forget(job)
        self._tracked.pop(job, None)
        self.inputs.forget(job)
        self.snapshots.forget(job)
        self._conflicts = {k: v for k, v in self._conflicts.items() if k[0] != job}
        self._bump()

    def forget_agent(self, agent_id: str) -> None:
        """Drop what the agent sent that is not a job's (its node series, process lists)."""
        self.nodes.forget_agent(agent_id)
        self.jobs.forget_agent(agent_id)
        self.hosts.forget_agent(agent_id)
        self._bump()

    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord], now: float | None = None
                     ) -> StepConflicts:
        """Hold the records; those of another agent for an (iteration, rank) already held are kept
        out, and an event names both agents (at most one per job, holder and sender every
        REFUSAL_LOG_INTERVAL_S: a flood of conflicting records must not push real events out of
        the bounded log). Returns what was kept out, for the caller to count."""
        out = self.jobs.ingest_steps(agent_id, steps, now)
        for job in {r.job for r in steps}:  # its processes as observed until now: while it stepped
            self.hosts.stepped(job, now)
        self._bump()
        for job, runs in out.ended_runs.items():  # a run ended: its incidents end with it
            for run in runs:
                self.incidents.retire_run(job, run, time.time() if now is None else now)
        if not (out.other_agent or out.displaced) or self.replaying:
            return out
        now = time.time()
        evs = []
        for (job, ahead), its in out.displaced.items():  # rare: once per squatted stretch reached
            evs.append({"kind": STEP_CONFLICT.name, "severity": "warning", "job": job, "time": now,
                        "text": f"{len(its)} step record(s) of job {job[:80]} held from agent {ahead[:80]} "
                                f"were written ahead of the job (e.g. iteration {its[0]}): replaced by agent "
                                f"{agent_id[:80]}'s, which continues it",
                        "labels": {"holder": ahead, "sender": agent_id},
                        "payload": {"job": job, "holder": ahead, "sender": agent_id, "records": len(its),
                                    "iterations": sorted(set(its))[:20], "outcome": "replaced"}})
        for (job, holder), its in out.other_agent.items():
            key = (job, holder, agent_id)
            pending = self._conflicts.get(key)
            n = len(its) + (pending[1] if pending is not None else 0)
            if pending is not None and now - pending[0] < REFUSAL_LOG_INTERVAL_S:
                self._conflicts[key] = (pending[0], n)
                continue
            self._conflicts[key] = (now, 0)
            evs.append({"kind": STEP_CONFLICT.name, "severity": "warning", "job": job, "time": now,
                        "text": f"{n} step record(s) of job {job[:80]} from agent {agent_id[:80]} for "
                                f"iterations already held from agent {holder[:80]} (e.g. {its[0]}): "
                                f"refused, the held records kept",
                        "labels": {"holder": holder, "sender": agent_id},
                        "payload": {"job": job, "holder": holder, "sender": agent_id, "records": n,
                                    "iterations": sorted(set(its))[:20]}})
        if len(self._conflicts) > 10_000:  # senders and jobs come from the network: keep it bounded
            self._conflicts = {k: v for k, v in self._conflicts.items()
                               if now - v[0] < REFUSAL_LOG_INTERVAL_S}
        if evs:
            self.ingest_events("aggregator", evs)
        return out

    def ingest_collectives(self, agent_id: str, recs: Sequence[CollectiveRecord]) -> None:
        self.nodes.seen(agent_id)
        for job in {r.job for r in recs}:
            self.jobs.add_agent(job, agent_id)
        self.collectives.ingest(agent_id, recs)
        self._bump()

    def ingest_collective_partial(self, agent_id: str, partial: CollectivePartial) -> None:
        """A node's collective records as its agent reduced them (the engine path)."""
        self.nodes.seen(agent_id)
        self.jobs.add_agent(partial.job, agent_id)
        self.collectives.ingest_partial(agent_id, partial)
        self._bump()

    def ingest_events(self, agent_id: str, evs: Sequence[Mapping[str, Any]]) -> None:
        self.log.ingest(agent_id, evs)
        self._bump()  # process lists, rank hosts, serving records: what a snapshot shows

    def _on_hang(self, agent_id: str, ev: Mapping[str, Any]) -> bool:
        self.collectives.add_hang_event(agent_id, ev)  # merged across agents by the analysis
        return True

    def _on_serving_data(self, agent_id: str, ev: Mapping[str, Any]) -> bool:
        """SGLang records for the job's serving analysis (state: the window, not history)."""
        job = self.serving.ingest(ev.get("payload"))
        if job is None:
            return False  # refused and counted by the serving store
        self.jobs.add_agent(job, agent_id)
        return True

    # ---- read side (HTTP thread, rules loop) -----------------------------------------------------
    def gpu_view(self, job: str, names: Collection[str] | None = None
                 ) -> tuple[dict[GpuKey, list[dict[str, Any]]], dict[GpuKey, dict[str, float]],
                            dict[GpuKey, list[str]]]:
        """For the job's agents: process lists, latest GPU values and active throttle reasons,
        each keyed by (node, gpu); ``names``: only these GPU series. The job's GPUs are those its
        processes declare, whatever agent reports them, and its own agents' others
        (perfd.placement): a node agent's GPUs join the job that runs on them."""
        return self.nodes.gpu_view(self.jobs.agents_of(job), names, job=job)

    def gpu_procs(self, job: str) -> dict[GpuKey, list[dict[str, Any]]]:
        """The process lists of the job's GPUs (rank placement), without their values."""
        return self.nodes.procs_of(self.jobs.agents_of(job), job=job)

    def placed_ranks(self, job: str, world_size: int | None = None) -> dict[int, RankPlacement]:
        """place_ranks over :meth:`gpu_procs` (a copy; its RankPlacements are shared, never mutate
        them), held until a process list of the job changes or its agents do (gpu_views). What a
        job's snapshot holds as its placement; its consumers read it there."""
        return dict(self._placements.get(job, self.jobs.agents_of(job), world_size).ranks)

    def job_gpu_series(self, job: str) -> list[tuple[str, NodeSeries]]:
        """(agent, series) of the GPU series of the job's GPUs (as :meth:`gpu_view` finds them)."""
        return self.nodes.job_gpu_series(job, self.jobs.agents_of(job))

    def series_job(self, agent: str, series: NodeSeries) -> str | None:
        """The job a node series is exported in: a GPU series in the job its GPU's processes
        declare, else (and every other series) in its agent's job; None: no job."""
        agent_job = self.jobs.job_of(agent)
        if not series.name.startswith("perfd_gpu_"):
            return agent_job
        lab = dict(series.labels)
        return self.nodes.gpu_job(agent, (lab.get("node", agent), lab.get("gpu", "?")), agent_job)

    def pods_by_gpu(self) -> dict[GpuKey, dict[str, Any]]:
        return self.nodes.pods_by_gpu()

    def analysis(self, job: str, force: bool = False) -> RunAnalysis | None:
        """The job's analysis, recomputed if new data arrived (rate-limited); each new analysis
        updates the job's incidents with the evidence the aggregator holds now."""
        a = self.jobs.analysis(job, force)
        if a is not None and self._tracked.get(job) is not a:
            self._tracked[job] = a
            self._track_incidents(job, a)
            self.snapshots.get(job, rebuild=True)  # the job's snapshot of this analysis
        return a

    def cached_analysis(self, job: str) -> RunAnalysis | None:
        """The last analysis, never recomputed here (a scrape never waits on an analysis; the
        aggregator's refresher keeps it current)."""
        return self.jobs.cached_analysis(job)

    # ---- snapshots: what every consumer reads -----------------------------------------------------
    def snapshot(self, job: str, analysed: Analysed = Analysed.CACHED, force: bool = False
                 ) -> JobSnapshot | None:
        """The job's latest snapshot (perfd.aggregator.snapshot); None for a job the store does not
        hold. ``analysed``: CACHED, the refresher's last analysis (/metrics: a scrape never waits on
        one); SERVED, computed here only for a job that has none yet (the JSON API); CURRENT,
        recomputed if new data arrived, rate-limited unless ``force`` (the rules, W&B)."""
        snap = self.snapshots.get(job)
        if snap is None:  # an unknown job is not analysed
            return None
        if analysed is Analysed.CURRENT or (analysed is Analysed.SERVED and snap.analysis is None):
            self.analysis(job, force=force)
            return self.snapshots.get(job)
        return snap

    def _snapshot_version(self, job: str) -> Hashable:
        """What a snapshot of the job shows depends on: the generation (ingest, incidents, settings),
        the job's step records (their count and last time), the placement's version, the stall
        watch's, and the analysis held (its identity: a snapshot holds the analysis, so its id is not
        reused while one is held)."""
        return (self._generation, self.jobs.steps_key(job), self.nodes.placement_version,
                self.stalls.version(job), id(self.jobs.cached_analysis(job)))

    def _build_snapshot(self, job: str, version: Hashable) -> JobSnapshot | None:
        ov = self.jobs.overview(job)
        if ov is None:
            return None
        agents = self.jobs.agents_of(job)
        placement = self._placements.get(job, agents)  # held: no placing per snapshot
        names_agents = set(agents)
        return JobSnapshot(
            job=job, agents=frozenset(agents), version=version, overview=MappingProxyType(ov),
            analysis=self.jobs.cached_analysis(job), placed_ranks=MappingProxyType(dict(placement.ranks)),
            processes_alive=bool(placement.ranks) if placement.gpus else None,
            nodes=frozenset(self.nodes.job_nodes(job, agents)),
            incidents=self.incidents.typed_incidents(job),
            stall=self.stalls.stalled(job), stale_after_override_s=self._job_stale_after_s,
            gpus=lambda names=None, procs=True: self.nodes.gpu_view(names_agents, names, job=job,
                                                                     procs=procs),
            hosts=lambda now=None: self.hosts.observations(job, now),
            hosts_last_running=lambda: self.hosts.last_running(job), ended=self.hosts.ended(job),
            mfu_alert_off=getattr(self.jobs.job_info(job), "mfu_alert", None) is False)

    def refresh(self) -> None:
        """Analyse every job that has new data and update its incidents (the aggregator's periodic
        tick: incidents open and close while nobody reads the API, and what /metrics and the API
        serve stays at most one tick old)."""
        self.jobs.log_retention()  # what retention dropped, one line per job and minute
        for job in self.job_names():
            try:
                self.analysis(job)
            except Exception:  # counted in the job store's stats; other jobs go on
                log.exception("analysis of job %s failed", job)
            try:
                self.collective_analysis(job)  # a job with collective records and no steps too
            except Exception:  # counted in the collective store
                log.exception("collective analysis of job %s failed", job)
            try:
                self.stalls.tick(self, job)  # every tick: a stall shows while no data comes
            except Exception:
                log.exception("stall check of job %s failed", job)
            snap = self.snapshots.get(job, rebuild=True)  # what every reader reads until the next tick
            ended = snap.ended if snap is not None else None
            if ended is not None and snap is not None and snap.state_at()[0] == ENDED \
                    and self.incidents.has_open(job):  # the job ended: so did its incidents
                self.incidents.close_open(job, time.time(), f"the job ended: {ended[1]}", ended[0])
                self._bump()

    def _track_incidents(self, job: str, a: RunAnalysis) -> None:
        found = list(a.incidents)
        try:
            coll = self.collective_analysis(job)
        except Exception:  # counted in the collective store
            coll = None
        last_it = a.iterations[-1].iteration if a.iterations else None
        now = time.time()
        open_now = self.incidents.has_open(job) or bool(a.incidents and a.incidents[-1].open)
        # Steady sightings only while the newest step is steady too: the seconds a slowdown takes to
        # become an incident (its cost past the floor) must not teach the baseline that its cause is
        # the job's normal state (a short job has few sightings: those seconds were most of them).
        last = a.iterations[-1] if a.iterations else None
        med = a.summary.median("step_time_ms") if last is not None else None
        calm = last is not None and last.steady_state and last.step_time_ms is not None and med is not None \
            and 0 < last.step_time_ms <= STEP_FACTOR * med
        if not open_now and calm and self.gpu_baseline.due(job, now):
            self.sightings.baseline_sighting(job, now)
        for h in coll.hangs if coll is not None else []:
            found.append(hang_incident(h, last_it, now))
        self.track_live_incidents(job, found, now)

    def track_live_incidents(self, job: str, found: Sequence[Incident], now: float) -> None:
        """Merge incidents into the job's record, each given what its ranks' GPUs and hosts show now
        (the analysis' incidents, a collective hang, a live stall: perfd/aggregator/stalls.py)."""
        views: list[SnapshotView] = []  # this pass's view of the job's GPUs: read once, whatever is open

        def snapshot(inc: Incident) -> Mapping[int, RankSnapshot]:
            if not views:
                views.append(self.sightings.view(job))
            if inc.id in views[0].served:  # a big job's kept view: already sighted for this incident
                return {}
            views[0].served.add(inc.id)
            return self.sightings.gpu_snapshot(job, inc, views[0])

        arming = self.arming_of(job)
        if arming is not None:  # the armed rank's slower life is the arming's cost, not an incident
            armed = [inc for inc in found if is_the_arming(inc, arming)]
            for inc in armed:  # opened while the arming was not known yet (no ncu capture had ended)
                self.incidents.withdraw(job, inc.id, now, Withdrawal.NCU_ARMING)
            found = [inc for inc in found if all(inc is not a for a in armed)]
        self.incidents.update(job, found, snapshot, self.captures_of(job), now)
        self._bump()  # the job's incidents: its snapshot shows them
        if not self.incidents.has_open(job):
            self.sightings.forget(job)

    def collective_analysis(self, job: str, force: bool = False, cached: bool = False
                            ) -> CollectiveAnalysis | None:
        """The job's collective analysis (None when no collective record or hang event came in);
        ``cached``: the last one whatever its age, if there is one (the JSON API)."""

        def inputs() -> tuple[list[StepRecord], Any, dict[int, str], str | None]:
            placed = {r: p.node for r, p in self._placements.get(job, self.jobs.agents_of(job)).ranks.items()}
            got = self.jobs.records_and_layout(job)
            if got is None:
                return [], None, placed, self.jobs.gpu_override
            records, layout, gpu = got
            return records, layout, placed, gpu

        return self.collectives.analysis(job, self.jobs.steps_key(job), inputs, force=force, cached=cached)

    def _fold_inputs(self, job: str) -> FoldInputs:
        """The job's step records' key (with its layout) and a call for them: its windows."""
        info = self.jobs.job_info(job)
        layout = info.layout if info else None
        got = lambda: (self.jobs.records_and_layout(job) or ([], None, None))[:2]  # noqa: E731
        return (self.jobs.steps_key(job), layout), got

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
        return self.log.recent(job, limit)

    def job_names(self) -> list[str]:
        return self.jobs.names()

    def jobs_with_data(self) -> list[str]:
        """Jobs holding step records or job info (not those only named in a Hello): their counters
        are on /metrics from their first record, at 0 until they count something."""
        return [j for j in self.jobs.names() if self.jobs.has_data(j)]

    def job_agents(self, job: str) -> set[str]:
        return self.jobs.agents_of(job)

    def job_of_agent(self, agent_id: str) -> str | None:
        return self.jobs.job_of(agent_id)

    def job_view_rows(self) -> tuple[list[Row], list[Row]]:
        """/metrics rows beside the jobs' snapshots: every job's incident counters (those holding
        data at 0) and the serving jobs' gauges."""
        return self.incidents.metric_rows(self.jobs_with_data()), self.serving.rows()

    def step_histograms(self, jobs: Sequence[str]) -> list[tuple[str, list[tuple[str, float]], float]]:
        """The step-time histograms of ``jobs`` (perfd.aggregator.jobs)."""
        return self.jobs.step_histograms(jobs)

    def own_counters(self) -> dict[str, int]:
        """The aggregator's own ingest counters on /metrics."""
        return {"perfd_aggregator_samples_total": self.nodes.samples,
                "perfd_aggregator_step_records_total": self.jobs.stats.steps}

    def host_series(self, agents: Collection[str]) -> list[tuple[str, NodeSeries]]:
        """(agent, series) of the host series (perfd_host_*) of ``agents``."""
        return [(a, s) for a, s in self.nodes.snapshot() if a in agents and s.name.startswith("perfd_host_")]

    def gpu_sources(self, agents: Collection[str], nodes: Collection[str]) -> list[dict[str, Any]]:
        """What each of ``agents`` and every agent on ``nodes`` said of its NVML collector in its Hello."""
        out = []
        for agent in sorted(set(agents) | self.nodes.agents_on(nodes)):
            said = self.nodes.hello_of(agent)
            if said is not None:
                out.append({"agent": agent, "node": said[0], "nvml": said[1].get("nvml")})
        return out

    def agent_nodes(self, agents: Collection[str]) -> dict[str, str]:
        """agent -> its node: where the GPU processes it reports run, else (for ``agents``) the node
        its Hello named (a job's sidecar reads no GPU: its ranks are placed by the node's agent)."""
        node_of = self.nodes.node_of_agent()
        for agent in agents:
            said = self.nodes.hello_of(agent) if agent not in node_of else None
            if said is not None and said[0]:
                node_of[agent] = said[0]
        return node_of

    def records_and_layout(self, job: str) -> tuple[list[StepRecord], Any, str | None] | None:
        """The job's step records, layout and GPU (perfd.aggregator.jobs), for a capture's diagnosis."""
        return self.jobs.records_and_layout(job)

    def job_info(self, job: str) -> JobInfo | None:
        """The job's start-up facts (perfd.aggregator.jobs)."""
        return self.jobs.job_info(job)

    def hook_seen(self, job: str) -> dict[int, tuple[str, float]]:
        """rank -> (its step hook's pid, when its latest hook record arrived) (perfd.aggregator.jobs)."""
        return self.jobs.hook_seen(job)

    def capture_windows(self, job: str) -> list[tuple[float, float]]:
        """(start, end) of the job's captures, as the job store marks their iterations disturbed."""
        return self.jobs.capture_windows(job)

    def set_new_normal(self, job: str, iteration: int | None) -> int | None:
        """The job's lasting shift is its new normal from ``iteration`` (perfd.aggregator.jobs)."""
        at = self.jobs.set_new_normal(job, iteration)
        self._bump()
        return at

    # ---- the state store's documents (perfd.aggregator.durable) -----------------------------------
    def incidents_doc(self) -> dict[str, Any]:
        """Every job's incidents as the state store keeps them (IncidentTracker.export)."""
        return self.incidents.export()

    def load_incidents(self, doc: Mapping[str, Any]) -> None:
        """The incidents the state store kept, back at start."""
        self.incidents.load(doc)

    def new_normals(self) -> dict[str, int]:
        """job -> the iteration its new normal starts at (perfd.aggregator.jobs)."""
        return self.jobs.new_normals()

    def restore_events(self, evs: Sequence[Mapping[str, Any]]) -> None:
        """The aggregator's own events the state store kept, back into the event log."""
        self.log.restore(evs)

    def node_series(self, node_series: bool = True) -> list[tuple[str, NodeSeries]]:
        """(agent id, series) pairs for export, GPU and host series only when ``node_series``; a
        copy, safe to iterate without a lock."""
        return self.nodes.snapshot(node_series)

    def stats_json(self) -> dict[str, Any]:
        """/api/stats: perfd.aggregator.stats."""
        return stats_json(self)

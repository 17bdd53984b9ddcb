"""The analysis side of the aggregator's state: each job's analysis (the job store's, given what it reads
of the other parts: class_inputs.ClassInputs), the incidents each new analysis, a collective hang or a
live stall opens, its collective analysis, and each job's snapshot (perfd.aggregator.snapshot), built
here at each analysis refresh and whenever the state changed since (the change count,
perfd.aggregator.state_changes).

Called from the aggregator's refresher and rules threads and the HTTP threads; it writes the
incident tracker (its writes are marked, like the ingest side's) and reads every other part under that
part's own lock. A job's snapshot is built outside every lock and stored whole: a reader holds an
immutable one while the next is built.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from perfd.aggregator.capture_book import CaptureBook
from perfd.aggregator.capture_records import CaptureRecord, arming_of
from perfd.aggregator.class_inputs import ClassInputs
from perfd.aggregator.collectives import CollectiveStore, metric_rows
from perfd.aggregator.gpu_views import PlacementCache, SnapshotView
from perfd.aggregator.hosts import HostView
from perfd.aggregator.incidents import GpuBaseline, IncidentTracker
from perfd.aggregator.jobs import JobStore
from perfd.aggregator.nodes import NodeView
from perfd.aggregator.sightings import Sightings
from perfd.aggregator.snapshot import Analysed, JobSnapshot, Snapshots
from perfd.aggregator.stalls import StallWatch
from perfd.aggregator.state_changes import Changes, writes
from perfd.analytics.breakdown.bottleneck import GpmReading, GpmWhen
from perfd.analytics.breakdown.diagnosis import TimelineClass
from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis
from perfd.analytics.incidents.cadence import PauseSighting
from perfd.analytics.incidents.detect import STEP_FACTOR, Incident, hang_incident
from perfd.analytics.incidents.incident_evidence import RankSnapshot, Withdrawal
from perfd.analytics.run.arming import ArmingCost, is_the_arming
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.steps.liveness import ENDED
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.core.model import StepRecord
from perfd.exporters.prometheus import Row

log = logging.getLogger(__name__)


class JobAnalyses:
    def __init__(self, changes: Changes, jobs: JobStore, nodes: NodeView, collectives: CollectiveStore,
                 incidents: IncidentTracker, hosts: HostView, stalls: StallWatch, placements: PlacementCache,
                 gpu_baseline: GpuBaseline, captures: CaptureBook,
                 job_stale_after_s: float | None = None, clock: Clock = REAL_CLOCK) -> None:
        """``captures``: the capture records the coordinator keeps (read here, never written);
        ``job_stale_after_s``: --job-stale-after (None: from each job's own steps); ``clock``: "now"
        for the incidents found and the snapshots' liveness."""
        self.clock = clock
        self.changes = changes
        self.jobs = jobs
        self.nodes = nodes
        self.collectives = collectives
        self.incidents = incidents
        self.hosts = hosts
        self.stalls = stalls
        self.placements = placements
        self.gpu_baseline = gpu_baseline
        self.job_stale_after_s = job_stale_after_s
        self._captures = captures
        self.inputs = ClassInputs(jobs, nodes, incidents, self.captures_of, lambda: job_stale_after_s)
        # What the jobs' GPUs and hosts show, read for their incidents and steady baselines.
        self.sightings = Sightings(jobs, nodes, hosts, placements, gpu_baseline, self.inputs.stepping)
        self.snapshots = Snapshots(self._build_snapshot, self._snapshot_version)
        self._tracked: dict[str, RunAnalysis] = {}  # job -> the analysis incidents were taken from
        # A job whose collective analysis is costly (CollectiveStore.costly: ~20 s of CPU at 100,000
        # ranks) has it made here, one at a time, at the store's own cadence (ANALYSIS_COST_FACTOR
        # times what the last took), never on the refresh that renews the per-iteration answer: made
        # there, each one held every job's step analysis, snapshot and stall check back for as long.
        # A daemon thread, started at the first costly job: an interpreter exiting (the aggregator
        # stopped) does not wait for an analysis in progress (~20 s at 100,000 ranks), as it would
        # for a ThreadPoolExecutor's worker; the analysis holds nothing that must be written out.
        self._work: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._queued: set[str] = set()  # jobs whose collective analysis waits for the worker
        self._queue_lock = threading.Lock()
        self._track_lock = threading.Lock()  # the worker's incident updates and the refresh's, in turn
        # One refresh at a time: the refresh loop and the rules tick each run one, on two worker threads,
        # and two stall checks of a job at once opened its stall twice, or brought back one the other
        # had withdrawn as the job's exit
        self._refresh_lock = threading.Lock()

    def forget(self, job: str) -> None:
        """The job was pruned: what its analyses left here goes."""
        self.sightings.forget(job)
        self._tracked.pop(job, None)
        self.inputs.forget(job)
        self.snapshots.forget(job)

    # ---- what an analysis reads of the other parts (perfd.aggregator.job_inputs.AnalysisInputs) -----
    def captures_of(self, job: str) -> list[CaptureRecord]:
        """The job's capture records (copies, as of now), for incidents and for marking the iterations a
        capture disturbed."""
        return self._captures.of_job(job)

    def arming_of(self, job: str) -> ArmingCost | None:
        """What arming ncu costs the job's armed ranks (perfd.analytics.run.arming), for its report: as
        the job's analysis measures it from its armed steps (against its previous run), else as the
        capture coordinator does from an ncu capture's ranks (against the unarmed ranks)."""
        a = self.jobs.cached_analysis(job)
        if a is not None and a.summary.arming is not None:
            return a.summary.arming
        return arming_of(self._captures.latest_ncu(job), self.jobs.records_and_layout, self.capture_windows)

    def capture_windows(self, job: str) -> list[tuple[float, float]]:
        """(start, end) of the job's captures, as the job store marks their iterations disturbed."""
        return self.inputs.capture_windows(job)

    def class_inputs(self, job: str, span: tuple[float | None, float | None]
                     ) -> tuple[GpmReading | None, TimelineClass | None, GpmWhen]:
        return self.inputs.class_inputs(job, span)

    def pause_sightings(self, job: str) -> tuple[PauseSighting, ...]:
        """What the job's ranks showed while it was between steps (the stall watch's ticks)."""
        return self.stalls.sightings(job)

    def placed_gpu(self, job: str) -> str | None:
        """The model of the job's GPUs as their process lists name them (perfd.aggregator.nodes)."""
        return self.nodes.model_of(job, self.jobs.agents_of(job))

    # ---- analyses and incidents --------------------------------------------------------------------
    def analysis(self, job: str, force: bool = False) -> RunAnalysis | None:
        """The job's analysis, recomputed if new data arrived (rate-limited); each new analysis
        updates the job's incidents with the evidence the aggregator holds now."""
        a = self.jobs.analysis(job, force, self)
        if a is not None and self._tracked.get(job) is not a:
            self._took(job, a)
            self.snapshots.get(job, rebuild=True)  # the job's snapshot of this analysis
        elif self._failure_unseen(job):
            self.snapshots.get(job, rebuild=True)  # what it serves says that its analysis failed
        return a

    def _failure_unseen(self, job: str) -> bool:
        """The job's analysis failed since its snapshot was built (JobState.analysis_failed)."""
        js, snap = self.jobs.jobs.get(job), self.snapshots.get(job)
        return js is not None and snap is not None and js.analysis_failures != snap.overview.analysis_failures

    @writes
    def _took(self, job: str, a: RunAnalysis) -> None:
        """A new analysis of the job: its snapshot shows it, and the incidents it found. Only the one the
        store holds: a thread handed an analysis the store has since replaced with a newer (tracked
        already, or about to be) tracks nothing, or the older's incidents would reopen what the newer
        closed."""
        with self._track_lock:
            if self.jobs.cached_analysis(job) is not a:
                return
            self._tracked[job] = a
            self._track_incidents(job, a)

    def _track_incidents(self, job: str, a: RunAnalysis) -> None:
        found = list(a.incidents)
        try:
            coll = self.collective_analysis(job)
        except Exception:  # counted in the collective store
            coll = None
        last_it = a.iterations[-1].iteration if a.iterations else None
        now = self.clock.time()
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
        # A pause seen once was an incident; at its next occurrence on a cadence it is the loop's own
        # (perfd.analytics.incidents.cadence): the first is named then, taken back as an incident.
        for rec in self.incidents.typed_incidents(job) if a.summary.pauses else ():
            inc = rec.incident
            if any(c.covers(inc.first_iteration) and c.covers(inc.last_iteration) for c in a.summary.pauses):
                self.incidents.withdraw(job, inc.id, now, Withdrawal.CADENCE_PAUSE)
        self.track_live_incidents(job, found, now)

    @writes
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
        if not self.incidents.has_open(job):
            self.sightings.forget(job)

    @writes
    def _close_ended(self, job: str, ended: tuple[float, str]) -> None:
        """The job ended: so did its incidents."""
        self.incidents.close_open(job, self.clock.time(), f"the job ended: {ended[1]}", ended[0])

    def collective_analysis(self, job: str, force: bool = False, cached: bool = False
                            ) -> CollectiveAnalysis | None:
        """The job's collective analysis (None when no collective record or hang event came in);
        ``cached``: the last one whatever its age, if there is one (the JSON API). A costly one
        (CollectiveStore.costly) is the last one made unless ``force``: the worker makes the next
        (None until its first is made)."""
        if not force and self.collectives.costly(job):
            self._queue_collectives(job)
            return self.collectives.held(job)
        return self._collective_analysis(job, force, cached)

    def _collective_analysis(self, job: str, force: bool = False, cached: bool = False
                             ) -> CollectiveAnalysis | None:
        def inputs() -> tuple[list[StepRecord], Any, dict[int, str], str | None]:
            placed = {r: p.node for r, p in self.placements.get(job, self.jobs.agents_of(job)).ranks.items()}
            got = self.jobs.records_and_layout(job)
            if got is None:
                return [], None, placed, self.jobs.gpu_override
            records, layout, gpu = got
            return records, layout, placed, gpu

        return self.collectives.analysis(job, self.jobs.steps_key(job), inputs, force=force, cached=cached)

    def _queue_collectives(self, job: str) -> None:
        with self._queue_lock:
            if job in self._queued:
                return
            self._queued.add(job)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work_loop, name="perfd-collectives", daemon=True)
                self._worker.start()
        self._work.put(job)

    def _work_loop(self) -> None:
        while True:
            self._collectives_in_worker(self._work.get())

    def _collectives_in_worker(self, job: str) -> None:
        """A costly job's collective analysis, when due; a new one with hangs, or after one with hangs,
        goes to the job's incidents at once (a hung job makes no new step analysis to carry them)."""
        with self._queue_lock:
            self._queued.discard(job)
        try:
            before = self.collectives.held(job)
            a = self._collective_analysis(job)
        except Exception:  # counted in the collective store
            log.exception("collective analysis of job %s failed", job)
            return
        if a is not None and a is not before and (a.hangs or (before is not None and before.hangs)):
            self._retrack(job)
            self.snapshots.get(job, rebuild=True)

    @writes
    def _retrack(self, job: str) -> None:
        """The job's incidents again, from its last analysis and the collective analysis made now."""
        with self._track_lock:
            tracked = self._tracked.get(job)
            if tracked is not None:
                self._track_incidents(job, tracked)

    def collective_rows(self, per_rank: bool = True) -> list[Row]:
        """/metrics rows of every job's collective analysis, plus the store's own counters."""
        rows: list[Row] = []
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

    def refresh(self) -> None:
        """Analyse every job that has new data and update its incidents (the aggregator's periodic
        tick: incidents open and close while nobody reads the API, and what /metrics and the API
        serve stays at most one tick old). One at a time: a second waits for the first, then finds
        only what came since."""
        with self._refresh_lock:
            self._refresh()

    def _refresh(self) -> None:
        self.jobs.log_retention()  # what retention dropped, one line per job and minute
        for job in self.jobs.names():
            try:
                self.analysis(job)
            except Exception:  # counted in the job store's stats; other jobs go on
                log.exception("analysis of job %s failed", job)
            try:
                # A job with collective records and no steps too; a costly one is queued for the worker
                self.collective_analysis(job)
            except Exception:  # counted in the collective store
                log.exception("collective analysis of job %s failed", job)
            try:
                self.stalls.tick(self, job)  # every tick: a stall shows while no data comes
            except Exception:
                log.exception("stall check of job %s failed", job)
            snap = self.snapshots.get(job, rebuild=True)  # what every reader reads until the next tick
            ended = snap.ended if snap is not None else None
            if ended is not None and snap is not None and snap.state_at()[0] == ENDED \
                    and self.incidents.has_open(job):
                self._close_ended(job, ended)

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
            a = self.analysis(job, force=force)
            snap = self.snapshots.get(job)
            if a is not None and snap is not None and snap.analysis is not a:
                # Another thread is tracking this analysis (its snapshot comes after the incidents),
                # and the snapshot held is of the one before it: built now, not served older.
                snap = self.snapshots.get(job, rebuild=True)
            return snap
        return snap

    def _snapshot_version(self, job: str) -> Hashable:
        """What a snapshot of any job shows moves only with a write of the state: its change count."""
        return self.changes.count

    def _build_snapshot(self, job: str, version: Hashable) -> JobSnapshot | None:
        ov = self.jobs.overview(job)
        if ov is None:
            return None
        # One set of the job's agents for every reader below (12,500 of them at 100,000 GPUs), and
        # the placement's ranks as held (read-only, never changed: a new placement is a new mapping)
        agents = frozenset(self.jobs.agents_of(job))
        placement = self.placements.get(job, agents)  # held: no placing per snapshot
        return JobSnapshot(
            job=job, agents=agents, version=version, overview=ov,
            analysis=self.jobs.cached_analysis(job), placed_ranks=placement.ranks,
            processes_alive=bool(placement.ranks) if placement.gpus else None,
            nodes=self.nodes.job_nodes(job, agents),
            incidents=self.incidents.typed_incidents(job),
            stall=self.stalls.stalled(job), stale_after_override_s=self.job_stale_after_s,
            gpus=lambda names=None, procs=True: self.nodes.gpu_view(agents, names, job=job, procs=procs),
            hosts=lambda now=None: self.hosts.observations(job, now),
            hosts_last_running=lambda: self.hosts.last_running(job), ended=self.hosts.ended(job),
            mfu_alert_off=getattr(self.jobs.job_info(job), "mfu_alert", None) is False, clock=self.clock)

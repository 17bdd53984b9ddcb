"""One job as the aggregator's consumers read it: an immutable :class:`JobSnapshot`, built by the state
(perfd.aggregator.state) at each analysis refresh and whenever the state changed since the last one,
and held in :class:`Snapshots` (the latest per job). /metrics, the rule scopes, the JSON API, the W&B
sink and the stall watch read the snapshot; none asks the state for an analysis or a placement of its
own.

What changes with the clock alone is computed when read, from the snapshot and ``now``, exactly as
the state computed it before there were snapshots: the age of the job's last step, its liveness state
(from that age), its stalled seconds and the stall part of its goodput. GPU values and the ranks' host
observations are read through the snapshot's views when asked: they change with every batch (a copy
per refresh would be staler than what /metrics served), and a copy of every GPU series of an
8,000-rank job at every refresh would cost what no consumer asks for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from perfd.aggregator.hosts import HostObservation
from perfd.aggregator.incident_records import TrackedIncident
from perfd.aggregator.job_state import JobOverview
from perfd.aggregator.nodes import GpuView
from perfd.analytics.incidents.attribution import RankPlacement
from perfd.analytics.incidents.detect import HANG
from perfd.analytics.incidents.stall import StallCheck
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.steps.goodput import Goodput, with_incidents, with_stall
from perfd.analytics.steps.iteration import IterationResult
from perfd.analytics.steps.iteration_table import Table
from perfd.analytics.steps.liveness import ENDED, RUNNING, STALLED, job_state, stale_after
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.report.incident_text import stall_text

log = logging.getLogger(__name__)

FAILED_LOG_INTERVAL_S = 60.0  # a job whose snapshot fails to build is logged at most this often
# Process lists, latest values and active throttle reasons of the job's GPUs, each keyed by (node, gpu).


class Analysed(Enum):
    """How current a snapshot's analysis must be when asked for (AggregatorState.snapshot)."""

    CACHED = "cached"  # the refresher's last one, never computed on the way (/metrics, the stall watch)
    SERVED = "served"  # ... computed only for a job that has none yet (the JSON API)
    CURRENT = "current"  # recomputed if new data arrived, rate-limited (the rules, W&B)


class GpuReader(Protocol):
    def __call__(self, names: Collection[str] | None = None, procs: bool = True) -> GpuView: ...


class HostReader(Protocol):
    def __call__(self, now: float | None = None) -> dict[int, HostObservation]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSnapshot:
    """A job as of one build: its store overview, analysis, placement, incidents and live stall, and
    views of its GPUs and rank hosts. Never mutated: a reader in another thread holds a consistent one
    while the state builds the next."""

    job: str
    agents: frozenset[str]  # the agents that sent the job's records
    # The state's change count when built (perfd.aggregator.state_changes): Snapshots builds a new one
    # when it moved, so nothing read from a snapshot is staler than the state itself.
    version: Hashable
    # The job store's overview (perfd.aggregator.jobs.JobStore.overview); its ``last_step_age_s`` is
    # recomputed from ``now`` when read (:meth:`overview_at`).
    overview: JobOverview
    analysis: RunAnalysis | None  # the last analysis, as the refresher left it
    placed_ranks: Mapping[int, RankPlacement]  # rank -> node, GPU (the state's held placement)
    processes_alive: bool | None  # some rank placed (None: no process list of the job's GPUs)
    nodes: frozenset[str]  # the nodes the job runs on (perfd_job_node_info)
    incidents: tuple[TrackedIncident, ...]  # as the incident tracker keeps them (immutable records)
    stall: StallCheck | None  # the job's open stall's latest check (perfd.aggregator.stalls)
    stale_after_override_s: float | None  # --job-stale-after
    gpus: GpuReader  # the job's GPUs: processes, values, throttles, read when called
    hosts: HostReader  # rank -> its process's newest host observation, read when called
    hosts_last_running: Callable[[], dict[int, HostObservation]]  # ... the newest while it ran
    # (when, why) its processes ended as its agents report them (its launch manifest, its ranks gone):
    # the job is ended at once, not once its last step is stale (perfd.aggregator.hosts)
    ended: tuple[float, str] | None = None
    mfu_alert_off: bool = False  # the job opted out of the MFU alert (its job info's mfu_alert is False)
    clock: Clock = REAL_CLOCK  # the state's: "now" for the readings below when none is given

    # ---- the analysis ------------------------------------------------------------------------
    @property
    def latest(self) -> IterationResult | None:
        """The latest analysed iteration (None before the first)."""
        a = self.analysis
        return a.iterations[-1] if a is not None and a.iterations else None

    @property
    def iterations(self) -> Table[IterationResult] | None:
        """The analysed iterations, the latest last (None before the first): for a reader of a few
        of the latest's fields, which need not build the whole row (:attr:`latest`)."""
        a = self.analysis
        return a.iterations if a is not None and a.iterations else None

    @property
    def median_step_s(self) -> float | None:
        """The median step time of the job's analysis, in seconds (None without one)."""
        med_ms = self.analysis.summary.median("step_time_ms") if self.analysis is not None else None
        return med_ms / 1e3 if med_ms else None

    # ---- computed when read: they change with the clock, not with the state ----------------------
    def last_step_age_s(self, now: float) -> float | None:
        last = self.overview.last_step_time
        return (now - float(last)) if last else None

    def state_at(self, now: float | None = None) -> tuple[str, str]:
        """(state, why): running | stalled | ended, from the last step's age at ``now``; a live stall
        says stalled within seconds."""
        now = self.clock.time() if now is None else now
        if self.ended is not None and self.ended[0] >= self._last_step_end() - 1.0:
            return ENDED, self.ended[1]  # its processes ended after its last step: ended, whatever its age
        med_s = self.median_step_s
        state, why = job_state(self.last_step_age_s(now), med_s, self.processes_alive,
                               self.stale_after_override_s)
        live = self.stall
        if live is not None and state in (RUNNING, ENDED):
            # An open stall has seen its rank processes there (stopped, idle): not ended, whatever the
            # age of its last step says (a SIGSTOPped hook job once read "ended" after
            # 60 s while its own stall said "stalled", and could be pruned as ended).
            state, why = STALLED, stall_text(live.silent_s, live.cadence_s, live.reasons)
        return state, why

    def _last_step_end(self) -> float:
        """When the job's last step ended, by its own clock where its record says (a log's last record
        can arrive after the processes exited: it is held until the log goes quiet), else when it
        arrived; 0 without one."""
        its = self.iterations
        end = its.get(len(its) - 1, "end_time") if its is not None else None
        if end is not None:
            return float(end)
        last = self.overview.last_step_time
        return float(last) if last else 0.0

    def overview_at(self, now: float | None = None) -> dict[str, Any]:
        """The job's overview with its liveness (``state`` running | stalled | ended), as /api/jobs
        serves it."""
        now = self.clock.time() if now is None else now
        ov = self.overview.to_json()
        ov["last_step_age_s"] = self.last_step_age_s(now)  # same place in the JSON as the store's
        state, why = self.state_at(now)
        if self.stall is not None:
            ov["stall"] = self.stall.to_json()  # its ranks, each rank's process state
        med_s = self.median_step_s
        ov.update(state=state, state_reason=why,
                  stale_after_s=stale_after(med_s, self.stale_after_override_s),
                  analysis_error=self.analysis_error())
        return ov

    def analysis_error(self) -> dict[str, Any] | None:
        """Why the job's latest analysis failed, since when and how many failed in all; None while its
        analysis succeeds. What it serves is then its last good analysis, or none."""
        ov = self.overview
        if ov.analysis_failure is None:
            return None
        return {"error": ov.analysis_failure, "since": ov.analysis_failed_since,
                "failures": ov.analysis_failures,
                "serving": "the last analysis that succeeded" if self.analysis is not None else "no analysis"}

    def stalled_seconds(self, now: float | None = None) -> float | None:
        """Seconds since the last step while stalled, 0.0 while running, None when ended."""
        now = self.clock.time() if now is None else now
        state, _ = self.state_at(now)
        if state == ENDED:
            return None
        return float(self.last_step_age_s(now) or 0.0) if state == STALLED else 0.0

    def goodput(self, now: float | None = None) -> Goodput | None:
        """The job's goodput (perfd.analytics.steps.goodput) as of ``now``: its analysis' split with the
        incident part the cost of the incidents the job lists (the same incidents, whatever the
        source: a hang's time is stall, not incident, and so is a live stall's silence between steps:
        only the part of an incident's cost in its steps' time counts), plus the time since its last
        step while it is stalled."""
        now = self.clock.time() if now is None else now
        run_gp = self.analysis.summary.goodput if self.analysis is not None else None
        if run_gp is None:
            return None
        listed = [c for i in self.incidents if not i.disturbance
                  and HANG not in i.kinds and (c := i.step_cost_s()) is not None]
        gp = with_incidents(run_gp, float(sum(listed)))
        if self.state_at(now)[0] == STALLED:
            return with_stall(gp, float(self.last_step_age_s(now) or 0.0))
        return gp

    def incident_docs(self) -> list[dict[str, Any]]:
        """The incidents as JSON (what the API serves)."""
        return [i.to_json() for i in self.incidents]

    def open_incidents(self) -> list[TrackedIncident]:
        return [i for i in self.incidents if i.open]


def overview_of(snap: JobSnapshot | None, now: float | None = None) -> dict[str, Any] | None:
    """The job's overview with its liveness at ``now`` (/api/jobs); None for no snapshot (no job)."""
    return snap.overview_at(now) if snap is not None else None


def overviews_of(snaps: Iterable[JobSnapshot | None], now: float | None = None) -> list[dict[str, Any]]:
    """The jobs' overviews (/api/jobs), a job of no snapshot left out: one pruned between the listing
    of the jobs' names and the read of its snapshot (a flood's 1,000 jobs going as its stream closed
    gave a client ``null`` entries, and it failed on one)."""
    return [o for o in (overview_of(s, now) for s in snaps) if o is not None]


def latest_of_running(snapshots: Iterable[JobSnapshot], now: float | None = None
                      ) -> dict[str, Table[IterationResult]]:
    """{job: its analysed iterations, the latest last} of the jobs running at ``now``: the latest is
    what /metrics exports as the job's derived gauges and the rules evaluate (a stalled or ended
    job's leave both), read from the table's columns (perfd.exporters.prometheus.latest_series). No
    ``now``: each snapshot's clock's."""
    out: dict[str, Table[IterationResult]] = {}
    for snap in snapshots:
        its = snap.iterations
        if its is not None and snap.state_at(now)[0] == RUNNING:
            out[snap.job] = its
    return out


class SnapshotSink(Protocol):
    """Where a job's snapshot is published (W&B: perfd.aggregator.wandb_sync). Returns the number of
    rows written."""

    def publish(self, snapshot: JobSnapshot) -> int: ...


class Snapshots:
    """The latest snapshot of each job. ``build(job, version)`` makes one (None: no such job);
    ``version(job)`` says what the state's parts are now. Built outside the lock (a build reads the
    state's parts, each under its own lock): two threads may build the same job's at once, and the
    one stored last wins, both being whole.

    A build that raises (a bug, or a value no check foresaw) is counted in ``errors`` and logged at
    most once a minute per job, and the job's last snapshot is served meanwhile: one job's bad value
    never answers 500 for /metrics and every other job's endpoints."""

    def __init__(self, build: Callable[[str, Hashable], JobSnapshot | None],
                 version: Callable[[str], Hashable]) -> None:
        self._build = build
        self._version = version
        self._lock = threading.Lock()
        self._held: dict[str, JobSnapshot] = {}  # guarded by _lock
        self.errors = 0  # builds that raised
        self._logged: dict[str, float] = {}  # job -> when a failed build of it was last logged

    def get(self, job: str, rebuild: bool = False) -> JobSnapshot | None:
        """The job's latest snapshot, built anew when the state changed since it was (or ``rebuild``:
        an analysis refresh); None for a job the state does not hold (or whose every build failed)."""
        v = self._version(job)
        with self._lock:
            held = self._held.get(job)
        if held is not None and held.version == v and not rebuild:
            return held
        try:
            snap = self._build(job, v)
        except Exception:
            self._failed(job)
            return held
        with self._lock:
            if snap is None:
                self._held.pop(job, None)
            else:
                self._held[job] = snap
        return snap

    def _failed(self, job: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.errors += 1
            last = self._logged.get(job)
            if last is not None and now - last < FAILED_LOG_INTERVAL_S:
                return
            if len(self._logged) >= 10_000:  # job names come from the network
                self._logged.clear()
            self._logged[job] = now
        log.exception("the snapshot of job %s could not be built: its last one is served (failed builds "
                      "are counted in /api/stats snapshot_errors)", job[:80])

    def forget(self, job: str) -> None:
        with self._lock:
            self._held.pop(job, None)
            self._logged.pop(job, None)

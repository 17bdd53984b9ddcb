"""The aggregator's state: its parts, built here and handed to the two sides that use them, and one
object over both for the aggregator and its tests.

The parts, split by concern:

- perfd/aggregator/jobs.py — job store: job info, step records, agents, the cached run analysis;
- perfd/aggregator/nodes.py — node/GPU view: latest node series, process lists, GPU -> pod;
- perfd/aggregator/collectives.py — NCCL collective records and hangs;
- perfd/aggregator/eventlog.py — the event log, and the routing of events by kind (perfd.core.events);
- perfd/aggregator/incidents.py — each job's incidents with the GPU evidence of the time;
- perfd/aggregator/hosts.py — each job's rank processes on their hosts, announced pauses, stacks;
- perfd/aggregator/stalls.py — each job's live stall (opened within seconds, closed when steps resume);
- perfd/aggregator/serving.py — SGLang records per job and their analysis (serving view);
- perfd/aggregator/stats.py — the counters /api/stats serves.

The sides, each built with the parts it uses:

- perfd/aggregator/state_ingest.py — the ingest side: what the transport, the engine's root and the
  durable replay call (every method a write);
- perfd/aggregator/job_analyses.py — each job's analysis, the incidents it opens, and its snapshot
  (perfd/aggregator/snapshot.py): what every reader reads of a job;
- perfd/aggregator/state_reads.py — the plain reads beside the snapshots.

Every write moves one change count (perfd/aggregator/state_changes.py); a job's snapshot is built at
one count and anew when asked for at another. Ingest is called from the gRPC event loop; readers
(HTTP /metrics and the JSON API, the rules loop) run in other threads: each part has its own lock, and
no method holds two at once. The readers are typed against Protocols of what they read
(perfd/aggregator/state_readers.py, stalls.StallSource, stats.CounterSources, wiring.HeldState,
engine_sink.StateSink), which this object gives them; nothing outside the aggregator reaches into a
part through it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial

from perfd.aggregator.capture_book import CaptureBook
from perfd.aggregator.capture_records import CaptureRecord
from perfd.aggregator.collectives import CollectiveStore, FoldInputs
from perfd.aggregator.eventlog import EventLog, Listener
from perfd.aggregator.gpu_views import PlacementCache
from perfd.aggregator.hosts import HostView
from perfd.aggregator.incidents import GpuBaseline, IncidentTracker
from perfd.aggregator.job_analyses import JobAnalyses
from perfd.aggregator.jobs import (
    JobState,
    JobStats,
    JobStore,
    RecordsLayout,
    Standing,
    StepConflicts,
    job_level_steps,
)
from perfd.aggregator.nodes import GpuKey, GpuView, NodeSeries, NodeView
from perfd.aggregator.serving import ServingStore, ServingView
from perfd.aggregator.snapshot import Analysed, JobSnapshot
from perfd.aggregator.stalls import SendCommand, StallWatch
from perfd.aggregator.state_changes import Changes
from perfd.aggregator.state_ingest import StateIngest
from perfd.aggregator.state_reads import StateReads
from perfd.aggregator.stats import Stats, stats_json
from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis
from perfd.analytics.collectives.collective_config import CollectiveConfig
from perfd.analytics.incidents.attribution import RankPlacement
from perfd.analytics.incidents.detect import Incident
from perfd.analytics.incidents.stall import PHASE_MAX_S
from perfd.analytics.run.arming import ArmingCost
from perfd.analytics.run.run_result import RunAnalysis
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.core.collfold import CollectivePartial
from perfd.core.events import GpuOwner, GpuProcess
from perfd.core.limits import RETAIN_BYTES, RETAIN_ITERATIONS
from perfd.core.model import CollectiveRecord, JobInfo, StepRecord
from perfd.core.winfigures import WindowFigures
from perfd.exporters.prometheus import Row
from perfd.transport.series import SeriesKey

__all__ = ["AggregatorState", "GpuKey", "JobState", "NodeSeries", "job_level_steps"]


def job_fold_inputs(jobs: JobStore) -> Callable[[str], FoldInputs]:
    """What the collective store's window fold reads of a job's steps: their key (with the job's
    layout) and a call for them."""

    def inputs(job: str) -> FoldInputs:
        info = jobs.job_info(job)
        layout = info.layout if info else None
        got = lambda: (jobs.records_and_layout(job) or ([], None, None))[:2]  # noqa: E731
        return (jobs.steps_key(job), layout), got

    return inputs


class AggregatorState:
    def __init__(self, max_iterations_per_job: int = RETAIN_ITERATIONS, min_recompute_s: float = 0.5,
                 gpu_override: str | None = None, peak_tflops: float | None = None,
                 max_bytes_per_job: int = RETAIN_BYTES, *, collectives: CollectiveConfig | None = None,
                 collectives_per_job: Mapping[str, CollectiveConfig] | None = None,
                 job_stale_after_s: float | None = None, stall_phase_max_s: float = PHASE_MAX_S,
                 standing: Standing | None = None, send: SendCommand | None = None,
                 clock: Clock = REAL_CLOCK) -> None:
        """The aggregator's settings: retention (--retain-iterations, --retain-mib), the analysis'
        GPU and peak (--gpu, --peak-tflops), link capabilities for the collective analysis (all jobs,
        and per job), --job-stale-after and --stall-phase-max-s; who keeps an iteration two hosts
        wrote (``standing``: the guard's) and how a stall asks its agents for the ranks' stacks
        (``send``: the server's send_command); ``clock``: what every part of it reads as now
        (perfd.core.clock: a test's ManualClock moves it)."""
        self.clock = clock
        changes = Changes()
        jobs = JobStore(max_iterations_per_job, min_recompute_s, gpu_override, peak_tflops, max_bytes_per_job,
                        standing, clock)
        self.nodes = nodes = NodeView(clock)
        placements = PlacementCache(nodes)  # each job's rank placement (see gpu_views)
        self.collectives = CollectiveStore(config=collectives, job_config=collectives_per_job,
                                           fold_inputs=job_fold_inputs(jobs))  # its fold reads the steps
        self.log = EventLog()
        self.stats = Stats(started=clock.time())
        # The transport's counters, taken when /api/stats or /metrics asks (once per read: each
        # call walks every stream). Set by the aggregator once its server runs.
        self.transport_stats: Callable[[], dict[str, int]] | None = None
        self.engine_stats: Callable[[], dict[str, object]] | None = None  # a job's root (perfd.engine)
        self.serving = ServingStore(clock=clock)
        # Its events go to the log; every call of it comes within a write of the state.
        self.incidents = IncidentTracker(partial(self.log.ingest, "aggregator"))
        self.gpu_baseline = GpuBaseline()
        self.hosts = HostView(clock=clock)  # the jobs' rank processes on their hosts (collectors/ranks)
        self.stalls = StallWatch(changes, send, stall_phase_max_s, clock)
        # The capture records: the coordinator (perfd.aggregator.captures) writes them, the analyses read
        # them.
        self.capture_book = CaptureBook()
        self._analyses = JobAnalyses(changes, jobs, nodes, self.collectives, self.incidents, self.hosts,
                                     self.stalls, placements, self.gpu_baseline, self.capture_book,
                                     job_stale_after_s, clock)
        self._reads = StateReads(jobs, nodes, self.collectives, self.log, self.serving, self.incidents,
                                 self.hosts, placements)
        self._ingest = StateIngest(changes, jobs, nodes, self.collectives, self.log, self.serving,
                                   self.incidents, self.hosts,
                                   holders=(self.gpu_baseline, self.stalls, placements, self._analyses),
                                   clock=clock)
        self.snapshots = self._analyses.snapshots
        self.sightings = self._analyses.sightings

    def add_event_listener(self, listener: Listener) -> None:
        """Every event ingested from now on goes to ``listener`` too (the capture coordinator takes the
        capture progress the agents report)."""
        self.log.listeners.append(listener)

    @property
    def job_stale_after_s(self) -> float | None:
        return self._analyses.job_stale_after_s

    def stats_json(self) -> dict[str, object]:
        """/api/stats: perfd.aggregator.stats."""
        return stats_json(self)

    # ---- the ingest side (perfd.aggregator.state_ingest) ----------------------------------------------
    @property
    def replaying(self) -> bool:
        return self._ingest.replaying

    @replaying.setter
    def replaying(self, value: bool) -> None:
        self._ingest.replaying = value

    def hello(self, agent_id: str, jobs: Sequence[str], now: float | None = None, node: str | None = None,
              capabilities: Mapping[str, str] | None = None) -> None:
        self._ingest.hello(agent_id, jobs, now, node, capabilities)

    def series_defined(self, agent_id: str, series_ids: Sequence[int]) -> None:
        self._ingest.series_defined(agent_id, series_ids)

    def ingest_samples(self, agent_id: str, series_defs: Mapping[int, SeriesKey], series_ids: Sequence[int],
                       timestamps_ns: Sequence[int], values: Sequence[float]) -> None:
        self._ingest.ingest_samples(agent_id, series_defs, series_ids, timestamps_ns, values)

    def ingest_job_info(self, agent_id: str, job: str, info: JobInfo, now: float | None = None) -> None:
        self._ingest.ingest_job_info(agent_id, job, info, now)

    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord], now: float | None = None
                     ) -> StepConflicts:
        return self._ingest.ingest_steps(agent_id, steps, now)

    def ingest_collectives(self, agent_id: str, recs: Sequence[CollectiveRecord]) -> None:
        self._ingest.ingest_collectives(agent_id, recs)

    def ingest_events(self, agent_id: str, evs: Sequence[Mapping[str, object]]) -> None:
        self._ingest.ingest_events(agent_id, evs)

    def note_folded_ranks(self, job: str, ranks: Collection[int]) -> None:
        self._ingest.note_folded_ranks(job, ranks)

    def held_fold(self, job: str, iteration: int) -> StepRecord | None:
        return self._ingest.held_fold(job, iteration)

    def ingest_collective_partial(self, agent_id: str, partial: CollectivePartial,
                                  folded: bool = False) -> None:
        self._ingest.ingest_collective_partial(agent_id, partial, folded)

    def ingest_window_figures(self, figs: WindowFigures) -> None:
        self._ingest.ingest_window_figures(figs)

    def set_new_normal(self, job: str, iteration: int | None) -> int | None:
        return self._ingest.set_new_normal(job, iteration)

    def set_gpu_model(self, job: str, model: str) -> None:
        self._ingest.set_gpu_model(job, model)

    def load_incidents(self, doc: Mapping[str, object]) -> None:
        self._ingest.load_incidents(doc)

    def restore_events(self, evs: Sequence[Mapping[str, object]]) -> None:
        self._ingest.restore_events(evs)

    def forget_job(self, job: str) -> None:
        self._ingest.forget_job(job)

    def forget_agent(self, agent_id: str) -> None:
        self._ingest.forget_agent(agent_id)

    # ---- analyses, incidents, snapshots (perfd.aggregator.job_analyses) ---------------------------------
    def refresh(self) -> None:
        self._analyses.refresh()

    def analysis(self, job: str, force: bool = False) -> RunAnalysis | None:
        return self._analyses.analysis(job, force)

    def snapshot(self, job: str, analysed: Analysed = Analysed.CACHED, force: bool = False
                 ) -> JobSnapshot | None:
        return self._analyses.snapshot(job, analysed, force)

    def collective_analysis(self, job: str, force: bool = False, cached: bool = False
                            ) -> CollectiveAnalysis | None:
        return self._analyses.collective_analysis(job, force, cached)

    def collective_rows(self, per_rank: bool = True) -> list[Row]:
        return self._analyses.collective_rows(per_rank)

    def track_live_incidents(self, job: str, found: Sequence[Incident], now: float) -> None:
        self._analyses.track_live_incidents(job, found, now)

    def captures_of(self, job: str) -> list[CaptureRecord]:
        return self._analyses.captures_of(job)

    def arming_of(self, job: str) -> ArmingCost | None:
        return self._analyses.arming_of(job)

    def capture_windows(self, job: str) -> list[tuple[float, float]]:
        return self._analyses.capture_windows(job)

    # ---- plain reads (perfd.aggregator.state_reads) ---------------------------------------------------
    def job_names(self) -> list[str]:
        return self._reads.job_names()

    def jobs_with_data(self) -> list[str]:
        return self._reads.jobs_with_data()

    def holds_data(self, job: str) -> bool:
        return self._reads.holds_data(job)

    def activity(self, job: str) -> tuple[float, float] | None:
        return self._reads.activity(job)

    def job_agents(self, job: str) -> set[str]:
        return self._reads.job_agents(job)

    def job_of_agent(self, agent_id: str) -> str | None:
        return self._reads.job_of_agent(agent_id)

    def jobs_on(self, agent_id: str) -> set[str]:
        return self._reads.jobs_on(agent_id)

    def agents_seen(self) -> dict[str, float]:
        return self._reads.agents_seen()

    def rank_host_agents(self, job: str) -> set[str]:
        return self._reads.rank_host_agents(job)

    def hello_of(self, agent_id: str) -> tuple[str, dict[str, str]] | None:
        return self._reads.hello_of(agent_id)

    def cached_analysis(self, job: str) -> RunAnalysis | None:
        return self._reads.cached_analysis(job)

    def job_info(self, job: str) -> JobInfo | None:
        return self._reads.job_info(job)

    def records_and_layout(self, job: str) -> RecordsLayout | None:
        return self._reads.records_and_layout(job)

    def step_records(self, job: str) -> list[StepRecord]:
        return self._reads.step_records(job)

    def hook_seen(self, job: str) -> dict[int, tuple[str, float]]:
        return self._reads.hook_seen(job)

    def step_histograms(self, jobs: Sequence[str]) -> list[tuple[str, list[tuple[str, float]], float]]:
        return self._reads.step_histograms(jobs)

    @property
    def job_stats(self) -> JobStats:
        return self._reads.job_stats

    def own_counters(self) -> dict[str, int]:
        return self._reads.own_counters()

    def new_normals(self) -> dict[str, int]:
        return self._reads.new_normals()

    def gpu_models(self) -> dict[str, str]:
        return self._reads.gpu_models()

    def gpu_view(self, job: str, names: Collection[str] | None = None) -> GpuView:
        return self._reads.gpu_view(job, names)

    def gpu_procs(self, job: str) -> dict[GpuKey, list[GpuProcess]]:
        return self._reads.gpu_procs(job)

    def placed_ranks(self, job: str, world_size: int | None = None) -> dict[int, RankPlacement]:
        return self._reads.placed_ranks(job, world_size)

    def job_gpu_series(self, job: str) -> list[tuple[str, NodeSeries]]:
        return self._reads.job_gpu_series(job)

    def series_job(self, agent: str, series: NodeSeries) -> str | None:
        return self._reads.series_job(agent, series)

    def pods_by_gpu(self) -> dict[GpuKey, GpuOwner]:
        return self._reads.pods_by_gpu()

    def node_series(self, node_series: bool = True) -> list[tuple[str, NodeSeries]]:
        return self._reads.node_series(node_series)

    def host_series(self, agents: Collection[str]) -> list[tuple[str, NodeSeries]]:
        return self._reads.host_series(agents)

    def gpu_sources(self, agents: Collection[str], nodes: Collection[str]) -> list[dict[str, object]]:
        return self._reads.gpu_sources(agents, nodes)

    def agent_nodes(self, agents: Collection[str]) -> dict[str, str]:
        return self._reads.agent_nodes(agents)

    def recent_events(self, job: str | None = None, limit: int = 200) -> list[dict[str, object]]:
        return self._reads.recent_events(job, limit)

    def events_page(self, query: Mapping[str, Sequence[str]]) -> tuple[int, dict[str, object]]:
        return self._reads.events_page(query)

    def incidents_doc(self) -> dict[str, object]:
        return self._reads.incidents_doc()

    def serving_view(self, job: str) -> ServingView | None:
        return self._reads.serving_view(job)

    def job_view_rows(self) -> tuple[list[Row], list[Row]]:
        return self._reads.job_view_rows()

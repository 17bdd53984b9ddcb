"""The read side of the aggregator's state beside the jobs' snapshots: what /metrics, the JSON API, the
capture coordinator, the lifecycle and the state store read of the parts it is built with (the job
store, the node view, the collective and serving stores, the event log, the incident tracker, the rank
hosts, the placements). Nothing here writes; each read takes only its part's own lock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from perfd.aggregator.collectives import CollectiveStore
from perfd.aggregator.eventlog import EventLog
from perfd.aggregator.gpu_views import PlacementCache
from perfd.aggregator.hosts import HostView
from perfd.aggregator.incidents import IncidentTracker
from perfd.aggregator.jobs import JobStats, JobStore, RecordsLayout
from perfd.aggregator.nodes import GpuKey, GpuView, NodeSeries, NodeView
from perfd.aggregator.serving import ServingStore, ServingView
from perfd.analytics.incidents.attribution import RankPlacement
from perfd.analytics.run.run_result import RunAnalysis
from perfd.core.events import GpuOwner, GpuProcess
from perfd.core.model import JobInfo, StepRecord
from perfd.exporters.prometheus import Row


class StateReads:
    def __init__(self, jobs: JobStore, nodes: NodeView, collectives: CollectiveStore, log: EventLog,
                 serving: ServingStore, incidents: IncidentTracker, hosts: HostView,
                 placements: PlacementCache) -> None:
        self.jobs = jobs
        self.nodes = nodes
        self.collectives = collectives
        self.log = log
        self.serving = serving
        self.incidents = incidents
        self.hosts = hosts
        self.placements = placements

    # ---- jobs and agents ------------------------------------------------------------------------------
    def job_names(self) -> list[str]:
        return self.jobs.names()

    def jobs_with_data(self) -> list[str]:
        """Jobs holding step records or job info (not those only named in a Hello): their counters
        are on /metrics from their first record, at 0 until they count something."""
        return [j for j in self.jobs.names() if self.jobs.has_data(j)]

    def holds_data(self, job: str) -> bool:
        """The job has step records or job info, collective records or serving records."""
        return self.jobs.has_data(job) or self.collectives.has_job(job) or job in self.serving.job_names()

    def activity(self, job: str) -> tuple[float, float] | None:
        """(when its last step arrived, or 0.0; when anything of it last did); None: not held."""
        return self.jobs.activity(job)

    def job_agents(self, job: str) -> set[str]:
        return self.jobs.agents_of(job)

    def job_of_agent(self, agent_id: str) -> str | None:
        return self.jobs.job_of(agent_id)

    def jobs_on(self, agent_id: str) -> set[str]:
        """The jobs whose processes run on the agent's GPUs (a node agent reports them)."""
        return self.nodes.jobs_on(agent_id)

    def agents_seen(self) -> dict[str, float]:
        """agent -> when it was last seen."""
        return self.nodes.agents_seen()

    def rank_host_agents(self, job: str) -> set[str]:
        """The agents that report the job's rank processes (collectors/ranks)."""
        return self.hosts.agents_of(job)

    def hello_of(self, agent_id: str) -> tuple[str, dict[str, str]] | None:
        """(node, capabilities) the agent's live Hello said; None: none."""
        return self.nodes.hello_of(agent_id)

    # ---- the job store ------------------------------------------------------------------------------
    def cached_analysis(self, job: str) -> RunAnalysis | None:
        """The last analysis, never recomputed here (a scrape never waits on an analysis; the
        aggregator's refresher keeps it current)."""
        return self.jobs.cached_analysis(job)

    def job_info(self, job: str) -> JobInfo | None:
        """The job's start-up facts (perfd.aggregator.jobs)."""
        return self.jobs.job_info(job)

    def records_and_layout(self, job: str) -> RecordsLayout | None:
        """The job's step records, layout and GPU (perfd.aggregator.jobs), for a capture's diagnosis."""
        return self.jobs.records_and_layout(job)

    def step_records(self, job: str) -> list[StepRecord]:
        """The job's step records held (none: [])."""
        got = self.jobs.records_and_layout(job)
        return got[0] if got is not None else []

    def hook_seen(self, job: str) -> dict[int, tuple[str, float]]:
        """rank -> (its step hook's pid, when its latest hook record arrived) (perfd.aggregator.jobs)."""
        return self.jobs.hook_seen(job)

    def step_histograms(self, jobs: Sequence[str]) -> list[tuple[str, list[tuple[str, float]], float]]:
        """The step-time histograms of ``jobs`` (perfd.aggregator.jobs)."""
        return self.jobs.step_histograms(jobs)

    @property
    def job_stats(self) -> JobStats:
        """The job store's counters (records taken, refused, dropped; runs; analysis errors)."""
        return self.jobs.stats

    def own_counters(self) -> dict[str, int]:
        """The aggregator's own ingest counters on /metrics."""
        return {"perfd_aggregator_samples_total": self.nodes.samples,
                "perfd_aggregator_step_records_total": self.jobs.stats.steps}

    def new_normals(self) -> dict[str, int]:
        """job -> the iteration its new normal starts at (perfd.aggregator.jobs)."""
        return self.jobs.new_normals()

    def gpu_models(self) -> dict[str, str]:
        """job -> the model of its GPUs its agents' series named (for the state store)."""
        return self.jobs.gpu_models()

    # ---- GPUs, nodes and hosts ------------------------------------------------------------------------
    def gpu_view(self, job: str, names: Collection[str] | None = None) -> GpuView:
        """For the job's agents: process lists, latest GPU values and active throttle reasons,
        each keyed by (node, gpu); ``names``: only these GPU series. The job's GPUs are those its
        processes declare, whatever agent reports them, and its own agents' others
        (perfd.core.placement): a node agent's GPUs join the job that runs on them."""
        return self.nodes.gpu_view(self.jobs.agents_of(job), names, job=job)

    def gpu_procs(self, job: str) -> dict[GpuKey, list[GpuProcess]]:
        """The process lists of the job's GPUs (rank placement), without their values."""
        return self.nodes.procs_of(self.jobs.agents_of(job), job=job)

    def placed_ranks(self, job: str, world_size: int | None = None) -> dict[int, RankPlacement]:
        """place_ranks over :meth:`gpu_procs` (a copy; its RankPlacements are shared, never mutate
        them), held until a process list of the job changes or its agents do (gpu_views). What a
        job's snapshot holds as its placement; its consumers read it there."""
        return dict(self.placements.get(job, self.jobs.agents_of(job), world_size).ranks)

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

    def pods_by_gpu(self) -> dict[GpuKey, GpuOwner]:
        return self.nodes.pods_by_gpu()

    def node_series(self, node_series: bool = True) -> list[tuple[str, NodeSeries]]:
        """(agent id, series) pairs for export, GPU and host series only when ``node_series``; a
        copy, safe to iterate without a lock."""
        return self.nodes.snapshot(node_series)

    def host_series(self, agents: Collection[str]) -> list[tuple[str, NodeSeries]]:
        """(agent, series) of the host series (perfd_host_*) of ``agents``."""
        return [(a, s) for a, s in self.nodes.snapshot() if a in agents and s.name.startswith("perfd_host_")]

    def gpu_sources(self, agents: Collection[str], nodes: Collection[str]) -> list[dict[str, object]]:
        """What each of ``agents`` and every agent on ``nodes`` said of its NVML collector in its Hello."""
        out: list[dict[str, object]] = []
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

    # ---- events, incidents, serving ----------------------------------------------------------------
    def recent_events(self, job: str | None = None, limit: int = 200) -> list[dict[str, object]]:
        return self.log.recent(job, limit)

    def events_page(self, query: Mapping[str, Sequence[str]]) -> tuple[int, dict[str, object]]:
        """GET /api/events (perfd.aggregator.eventlog.EventLog.api_page): (status, body)."""
        return self.log.api_page(query)

    def incidents_doc(self) -> dict[str, object]:
        """Every job's incidents as the state store keeps them (IncidentTracker.export)."""
        return self.incidents.export()

    def serving_view(self, job: str) -> ServingView | None:
        """Latest serving numbers (catalog names) and report of a serving job; None if not one."""
        return self.serving.view(job)

    def job_view_rows(self) -> tuple[list[Row], list[Row]]:
        """/metrics rows beside the jobs' snapshots: every job's incident counters (those holding
        data at 0) and the serving jobs' gauges."""
        return self.incidents.metric_rows(self.jobs_with_data()), self.serving.rows()

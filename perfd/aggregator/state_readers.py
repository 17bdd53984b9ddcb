"""What the aggregator's readers read of its state, one Protocol each: the jobs' snapshots (every
reader: W&B, the lifecycle, the capture coordinator, the HTTP side), and what the HTTP side
(perfd.aggregator.http) and the capture coordinator (perfd.aggregator.captures) read beside them.
perfd.aggregator.state.AggregatorState gives them all; the readers never import it (the smaller
readers name theirs where they are: stalls.StallSource, stats.CounterSources, job_rows.JobRowSource,
wiring.HeldState, engine_sink.StateSink).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from perfd.aggregator.capture_book import CaptureBook
from perfd.aggregator.eventlog import Listener
from perfd.aggregator.job_rows import JobRowSource
from perfd.aggregator.jobs import RecordsLayout
from perfd.aggregator.nodes import GpuKey, NodeSeries
from perfd.aggregator.serving import ServingView
from perfd.aggregator.snapshot import Analysed, JobSnapshot
from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis
from perfd.analytics.run.arming import ArmingCost
from perfd.analytics.run.run_result import RunAnalysis
from perfd.core.clock import Clock
from perfd.core.events import GpuOwner, GpuProcess
from perfd.core.model import JobInfo


class JobReader(Protocol):
    """The jobs held and each one's snapshot (perfd.aggregator.snapshot; ``analysed``: how current its
    analysis must be)."""

    def job_names(self) -> list[str]: ...

    def snapshot(self, job: str, analysed: Analysed = Analysed.CACHED, force: bool = False
                 ) -> JobSnapshot | None: ...


class HttpState(JobReader, JobRowSource, Protocol):
    """What /metrics and the JSON API read (perfd.aggregator.http), and the two things they write: a
    job's new normal (POST .../new-normal), and the analysis it asks for at once after it."""

    @property
    def clock(self) -> Clock: ...  # what "now" is for what they serve (perfd.core.clock)

    @property
    def transport_stats(self) -> Callable[[], dict[str, int]] | None: ...

    def stats_json(self) -> dict[str, object]: ...

    def own_counters(self) -> dict[str, int]: ...

    def step_histograms(self, jobs: Sequence[str]) -> list[tuple[str, list[tuple[str, float]], float]]: ...

    def node_series(self, node_series: bool = True) -> list[tuple[str, NodeSeries]]: ...

    def series_job(self, agent: str, series: NodeSeries) -> str | None: ...

    def host_series(self, agents: Collection[str]) -> list[tuple[str, NodeSeries]]: ...

    def job_gpu_series(self, job: str) -> list[tuple[str, NodeSeries]]: ...

    def gpu_procs(self, job: str) -> dict[GpuKey, list[GpuProcess]]: ...

    def gpu_sources(self, agents: Collection[str], nodes: Collection[str]) -> list[dict[str, object]]: ...

    def pods_by_gpu(self) -> dict[GpuKey, GpuOwner]: ...

    def serving_view(self, job: str) -> ServingView | None: ...

    def arming_of(self, job: str) -> ArmingCost | None: ...

    def collective_analysis(self, job: str, force: bool = False, cached: bool = False
                            ) -> CollectiveAnalysis | None: ...

    def events_page(self, query: Mapping[str, Sequence[str]]) -> tuple[int, dict[str, object]]: ...

    def set_new_normal(self, job: str, iteration: int | None) -> int | None: ...

    def analysis(self, job: str, force: bool = False) -> RunAnalysis | None: ...


class CaptureState(JobReader, JobRowSource, Protocol):
    """What the capture coordinator (perfd.aggregator.captures) reads: the jobs' snapshots and rows
    (its rules' scopes), their agents and nodes, hooks, records and capture windows (a capture's
    target and diagnosis); the capture records it keeps (the state's, which its analyses read), the
    events ingested (the agents' capture progress) and its own events it logs."""

    capture_book: CaptureBook

    def add_event_listener(self, listener: Listener) -> None: ...

    def ingest_events(self, agent_id: str, evs: Sequence[Mapping[str, object]]) -> None: ...

    def job_agents(self, job: str) -> set[str]: ...

    def agent_nodes(self, agents: Collection[str]) -> dict[str, str]: ...

    def hook_seen(self, job: str) -> dict[int, tuple[str, float]]: ...

    def job_info(self, job: str) -> JobInfo | None: ...

    def records_and_layout(self, job: str) -> RecordsLayout | None: ...

    def capture_windows(self, job: str) -> list[tuple[float, float]]: ...

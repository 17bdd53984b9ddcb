"""The aggregator's parts as its lifecycle (perfd.aggregator.retention) and its durable state
(perfd.aggregator.durable) reach them: a Protocol that perfd.aggregator.daemon.Aggregator satisfies, so
that those modules take the aggregator without importing the module that builds it (main imports
them). Properties, not attributes: read-only, so the aggregator's own, more precise types fit. Its
state as :class:`HeldState`: what the two read and write of it (perfd.aggregator.state gives it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from perfd.aggregator.capture_book import CaptureBook
from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.guard import Guard
from perfd.aggregator.job_state import JobStats
from perfd.aggregator.state_readers import JobReader
from perfd.aggregator.state_store import StateStore
from perfd.aggregator.wandb_sync import WandbSync
from perfd.core.limits import Limits
from perfd.transport.codec import DecodedBatch
from perfd.transport.delivery import Kept
from perfd.transport.server import IngestServer


class HeldState(JobReader, Protocol):
    """What the lifecycle reads of each job and agent and drops of them, and what the durable state
    saves of the state and puts back at start (its replay goes through the aggregator's ingest)."""

    replaying: bool  # the state store's replay runs: its step conflicts are not logged anew
    capture_book: CaptureBook  # the capture records (the state store keeps them; put back at start)

    @property
    def job_stats(self) -> JobStats: ...  # what retention evicted (the trim follows byte evictions)

    def agents_seen(self) -> dict[str, float]: ...

    def job_agents(self, job: str) -> set[str]: ...

    def holds_data(self, job: str) -> bool: ...

    def activity(self, job: str) -> tuple[float, float] | None: ...

    def forget_job(self, job: str) -> None: ...

    def forget_agent(self, agent_id: str) -> None: ...

    def incidents_doc(self) -> dict[str, object]: ...

    def new_normals(self) -> dict[str, int]: ...

    def gpu_models(self) -> dict[str, str]: ...

    def recent_events(self, job: str | None = None, limit: int = 200) -> list[dict[str, object]]: ...

    def load_incidents(self, doc: Mapping[str, object]) -> None: ...

    def set_new_normal(self, job: str, iteration: int | None) -> int | None: ...

    def set_gpu_model(self, job: str, model: str) -> None: ...

    def restore_events(self, evs: Sequence[Mapping[str, object]]) -> None: ...


class Limited(Protocol):
    @property
    def limits(self) -> Limits: ...


class AggregatorParts(Protocol):
    @property
    def cfg(self) -> Limited: ...
    @property
    def state(self) -> HeldState: ...
    @property
    def guard(self) -> Guard: ...
    @property
    def server(self) -> IngestServer: ...
    @property
    def captures(self) -> CaptureCoordinator: ...
    @property
    def store(self) -> StateStore | None: ...
    @property
    def wandb(self) -> WandbSync | None: ...

    def forget_series(self, agent_id: str) -> None: ...

    def on_batch(self, agent_id: str, batch: DecodedBatch, arrived_at: float | None = None) -> Kept: ...

    def on_hello_jobs(self, agent_id: str, jobs: Sequence[str], now: float | None = None,
                      node: str | None = None, capabilities: Mapping[str, str] | None = None
                      ) -> list[str]: ...

    def ingest_job_info_text(self, agent_id: str, job: str, text: str, now: float | None = None) -> bool: ...

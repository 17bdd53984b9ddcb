"""The aggregator's parts as its lifecycle (perfd.aggregator.lifecycle) and its durable state
(perfd.aggregator.durable) reach them: a Protocol that perfd.aggregator.main.Aggregator satisfies, so
that those modules take the aggregator without importing the module that builds it (main imports
them). Properties, not attributes: read-only, so the aggregator's own, more precise types fit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.aggregator.store import StateStore
from perfd.aggregator.wandb_sync import WandbSync
from perfd.limits import Limits
from perfd.transport.codec import DecodedBatch
from perfd.transport.delivery import Kept
from perfd.transport.server import IngestServer


class Limited(Protocol):
    @property
    def limits(self) -> Limits: ...


class AggregatorParts(Protocol):
    @property
    def cfg(self) -> Limited: ...
    @property
    def state(self) -> AggregatorState: ...
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

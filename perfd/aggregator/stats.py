"""What the aggregator has taken in, refused and dropped since it started: its counters as /api/stats
serves them (samples, step records, events, serving records, collectives; retention and refusals;
the jobs and agents seen; the transport's counters when the aggregator has set them)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from perfd.aggregator.collectives import CollectiveStore
from perfd.aggregator.eventlog import EventLog
from perfd.aggregator.jobs import JobStats
from perfd.aggregator.memory import memory_stats
from perfd.aggregator.nodes import NodeView
from perfd.aggregator.serving import ServingStore
from perfd.aggregator.snapshot import Snapshots
from perfd.core.clock import Clock


@dataclass
class Stats:
    batches: int = 0
    started: float = field(default_factory=time.time)


class CounterSources(Protocol):
    """What the counters are read from: the aggregator's state (perfd.aggregator.state), by its parts
    (a Protocol, so that this module does not import the state that serves it)."""

    @property
    def job_stats(self) -> JobStats: ...
    def job_names(self) -> list[str]: ...
    @property
    def nodes(self) -> NodeView: ...
    @property
    def log(self) -> EventLog: ...
    @property
    def collectives(self) -> CollectiveStore: ...
    @property
    def serving(self) -> ServingStore: ...
    @property
    def snapshots(self) -> Snapshots: ...
    @property
    def stats(self) -> Stats: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def transport_stats(self) -> Callable[[], dict[str, int]] | None: ...
    @property
    def engine_stats(self) -> Callable[[], dict[str, object]] | None: ...


def stats_json(state: CounterSources) -> dict[str, object]:
    """The aggregator's counters as /api/stats serves them (the transport's too, when set)."""
    now = state.clock.time()
    js = state.job_stats
    out: dict[str, object] = {
        "samples_ingested": state.nodes.samples,
        "samples_undefined": state.nodes.undefined_samples,  # their series refused or never defined
        "step_records_ingested": js.steps,
        "events_ingested": state.log.ingested,
        "events_malformed": dict(state.log.malformed),
        # hang events held; the window fold's operations folded, waiting, late (collectives/winfold)
        "collectives": {**state.collectives.hang_stats(), "window_fold": state.collectives.fold_counts(),
                        "shares_answered": state.collectives.shares_answered,
                        "shares_mixed": state.collectives.shares_mixed},
        # held, bytes, last_seq, cut (events kept cut), cut_bytes, pools, share_evicted (event_share)
        "event_log": state.log.stats(),
        "serving_records_ingested": state.serving.records,
        "serving_errors": dict(state.serving.errors),
        "step_records_dropped_retention": js.dropped_steps,
        "step_records_too_old": js.too_old,
        "step_records_implausible": js.implausible,
        "new_runs": js.new_runs,
        "step_records_replaced_by_new_run": js.replaced_by_new_run,
        "step_records_of_ended_runs": js.ended_run_records,
        "iterations_evicted_retention": js.evicted_iterations,
        "iterations_evicted_retention_bytes": js.evicted_iterations_bytes,
        "analysis_errors": js.analysis_errors,
        "snapshot_errors": state.snapshots.errors,  # job snapshots that failed to build (the last one served)
        "step_records_conflicting": js.conflicts,
        "step_records_worse_duplicates": js.worse_duplicates,
        "jobs": len(state.job_names()),
        "agents_seen": {a: round(now - t, 3) for a, t in state.nodes.agents_seen().items()},
        "uptime_s": round(now - state.stats.started, 3),
        "process": memory_stats(),  # RSS, what the C allocator holds in use and free, Python's blocks
    }
    if state.transport_stats is not None:
        out["transport"] = state.transport_stats()
    if state.engine_stats is not None:
        out["engine"] = state.engine_stats()
    return out

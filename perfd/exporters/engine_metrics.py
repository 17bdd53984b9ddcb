"""The engine's counters as Prometheus families (catalog names: perfd/core/catalog_engine.py): a job's
root's (perfd.engine.rootfold.RootStats, on the aggregator's /metrics with --engine) and a shard's
(perfd.engine.shard.ShardStats, on ``perfd shard --metrics-port``), and the engine's streams and
consumers as the leading root last read them (perfd.engine.engine_state.EngineState). Read from those
objects at scrape time, each value where the engine counts it: nothing here counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from perfd.engine.rootfold import EVERY_JOB_ONLY
from perfd.engine.subjects import ROOT_STREAMS, STREAM_LABELS
from perfd.exporters.prometheus import Row, build_info_families, series_families

if TYPE_CHECKING:
    from perfd.engine.engine_state import EngineState
    from perfd.engine.root_comm import CommCounts
    from perfd.engine.rootfold import RootStats
    from perfd.engine.shard import ShardStats
    from perfd.engine.shard_comm import CommStats

# catalog name -> the RootStats counter it is
_ROOT_COUNTERS = {
    "perfd_engine_root_leadership_lost_total": "leadership_lost",
    "perfd_engine_root_partials_total": "partials",
    "perfd_engine_root_node_messages_total": "node_messages",
    "perfd_engine_root_redelivered_total": "redelivered",
    "perfd_engine_root_late_total": "late",
    "perfd_engine_root_refused_total": "refused",
    "perfd_engine_root_undecodable_total": "undecodable",
    "perfd_engine_root_iterations_complete_total": "complete",
    "perfd_engine_root_held_back": "held_back",
    "perfd_engine_root_summaries_total": "summaries",
    "perfd_engine_root_summaries_overcounted_total": "summaries_overcounted",
    "perfd_engine_root_led_elsewhere_total": "led_elsewhere",
    "perfd_engine_root_jobs_led_elsewhere": "jobs_led_elsewhere",
}
# The streams whose skipped messages RootStats counts (``<stream>_skipped``): every one the root reads
_STREAMS = tuple(STREAM_LABELS[name] for name in ROOT_STREAMS)
_SUMMARIES_DROPPED = ("stale", "late", "holders_dropped")  # RootStats ``summaries_<reason>``
# RootStats.lag_quantiles' quantile -> its gauge
_LAG = {0.5: "perfd_engine_root_completion_lag_p50_seconds",
        0.99: "perfd_engine_root_completion_lag_p99_seconds"}

_COMM_DROPPED = ("stale", "partial_holder", "refused")  # CommCounts' own names
# catalog name -> the CommStats counter it is (a shard's communication summaries)
_SHARD_COMM = {
    "perfd_engine_shard_comm_rows_refused_total": "rows_refused",
    "perfd_engine_shard_comm_summarising_errors_total": "summary_errors",
    "perfd_engine_shard_comm_summarising_cpu_seconds_total": "summary_cpu_s",
    "perfd_engine_shard_comm_saved_messages_total": "saved_messages",
    "perfd_engine_shard_comm_rows_read_back_total": "rows_replayed",
    "perfd_engine_shard_comm_read_back_errors_total": "replay_errors",
    "perfd_engine_shard_comm_purge_errors_total": "purge_errors",
}

_SHARD_COUNTERS = {
    "perfd_engine_shard_node_messages_total": "node_messages",
    "perfd_engine_shard_undecodable_total": "undecodable",
    "perfd_engine_shard_delivered_again_total": "delivered_again",
    "perfd_engine_shard_partials_published_total": "partials_published",
    "perfd_engine_shard_batches_published_total": "batches_published",
    "perfd_engine_shard_summaries_published_total": "summaries_published",
    "perfd_engine_shard_comm_summaries_published_total": "comm_summaries_published",
    "perfd_engine_shard_publish_errors_total": "publish_errors",
    "perfd_engine_shard_messages_resent_total": "messages_resent",
    "perfd_engine_shard_leases_taken_total": "leases_taken",
    "perfd_engine_shard_leases_lost_total": "leases_lost",
    "perfd_engine_shard_takeover_waits_total": "takeover_waits",
    "perfd_engine_shard_consumer_restarts_total": "consumer_restarts",
    "perfd_engine_shard_job_infos_read_total": "job_infos_read",
    "perfd_engine_shard_job_info_put_errors_total": "job_info_put_errors",
    "perfd_engine_shard_job_info_gets_late_total": "job_info_gets_late",
    "perfd_engine_shard_summaries_restaged_total": "summaries_restaged",
    "perfd_engine_shard_stage_rows_dropped_total": "stage_rows_dropped",
}


def engine_rows(engine: EngineState) -> list[Row]:
    """The engine's streams and consumers as the leading root last read them; none before a read."""
    if engine.read_at is None:
        return [({}, "perfd_engine_state_read_errors_total", float(engine.read_errors))]
    rows: list[Row] = [({}, "perfd_engine_state_read_errors_total", float(engine.read_errors))]
    for name, st in engine.streams.items():
        rows += [({"stream": name}, "perfd_engine_stream_messages", float(st.messages)),
                 ({"stream": name}, "perfd_engine_stream_bytes", float(st.bytes))]
        if st.max_bytes is not None:
            rows.append(({"stream": name}, "perfd_engine_stream_limit_bytes", float(st.max_bytes)))
    for name, c in engine.consumers.items():
        rows += [({"consumer": name}, "perfd_engine_consumer_pending", float(c.pending)),
                 ({"consumer": name}, "perfd_engine_consumer_ack_pending", float(c.ack_pending)),
                 ({"consumer": name}, "perfd_engine_consumer_redelivered", float(c.redelivered))]
    return rows


def root_rows(stats: RootStats, comm: CommCounts | None = None) -> list[Row]:
    """The root's series: (labels, catalog name, value); ``comm``: its communication summaries' counts."""
    rows: list[Row] = [({}, "perfd_engine_root_leader", float(stats.leader))]
    if comm is not None:
        rows += [({}, "perfd_engine_root_comm_summaries_total", float(comm.received)),
                 ({}, "perfd_engine_root_comm_holders_replaced_total", float(comm.holders_replaced))]
        rows += [({"reason": r}, "perfd_engine_root_comm_summaries_dropped_total", float(getattr(comm, r)))
                 for r in _COMM_DROPPED]
    rows += [({}, name, float(getattr(stats, attr))) for name, attr in _ROOT_COUNTERS.items()
             if stats.reads_every_job or attr not in EVERY_JOB_ONLY]
    if stats.reads_every_job:  # a job's own root cannot tell what its streams let go (rootfold.RootStats)
        rows += [({"stream": s}, "perfd_engine_root_skipped_total", float(getattr(stats, f"{s}_skipped")))
                 for s in _STREAMS]
    rows += [({"reason": r}, "perfd_engine_root_summaries_dropped_total",
              float(getattr(stats, f"summaries_{r}"))) for r in _SUMMARIES_DROPPED]
    # No iteration whole yet: no lag series (absent, not 0 s)
    rows += [({}, _LAG[q], v) for q, v in stats.lag_quantiles().items()]
    return rows


class RootMetrics:
    """A prometheus_client collector: the root's counters at scrape time (registered by the aggregator
    that runs one: without --engine none of its series exist), and the engine's streams as the root last
    read them (``engine``: the root's current EngineState; a root that does not lead holds none read)."""

    def __init__(self, stats: RootStats, engine: Callable[[], EngineState | None] | None = None,
                 comm: CommCounts | None = None) -> None:
        self.stats = stats
        self.engine = engine
        self.comm = comm

    def collect(self) -> Iterator[Metric]:
        rows = root_rows(self.stats, self.comm)
        engine = self.engine() if self.engine is not None else None
        if engine is not None:
            rows += engine_rows(engine)
        yield from series_families(rows)


def shard_rows(stats: ShardStats, comm: CommStats | None = None) -> list[Row]:
    """``comm``: the shard's communication summaries' counts (absent without --comm-summaries)."""
    rows: list[Row] = [({}, name, float(getattr(stats, attr))) for name, attr in _SHARD_COUNTERS.items()]
    rows.append(({}, "perfd_engine_shard_partitions_held", float(len(stats.partitions))))
    if comm is not None:
        rows += [({}, name, float(getattr(comm, attr))) for name, attr in _SHARD_COMM.items()]
    return rows


class ShardMetrics:
    """A prometheus_client collector: the shard's counters at scrape time, and perfd_build_info."""

    def __init__(self, stats: Callable[[], ShardStats], comm: CommStats | None = None) -> None:
        self.stats = stats
        self.comm = comm

    def collect(self) -> Iterator[Metric]:
        yield from series_families(shard_rows(self.stats(), self.comm))
        yield from build_info_families()

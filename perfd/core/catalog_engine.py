"""The engine's metrics (perfd/engine: a job's root inside ``perfd aggregator --engine``, the
``perfd shard`` processes): part of the ONE catalog, perfd/core/catalog.py, which makes each row here a
MetricDef of its CATALOG. Apart only because catalog.py stands at the module size limit; pure data, read
through the catalog (catalog.get, catalog.names), never on its own.

Each is a counter or gauge of perfd.engine.rootfold.RootStats or perfd.engine.shard.ShardStats (the
communication summaries': perfd.engine.root_comm.CommCounts, perfd.engine.shard_comm.CommStats), derived
at scrape time by perfd.exporters.engine_metrics; absent where no root (an aggregator without --engine)
or no shard runs, never 0.
"""

from __future__ import annotations

from typing import Literal

Row = tuple[str, Literal["gauge", "counter"], str, str, tuple[str, ...]]  # name, kind, unit, help, labels

ROOT_SOURCE = "perfd aggregator --engine (perfd.engine.rootfold.RootStats)"
SHARD_SOURCE = "perfd shard --metrics-port (perfd.engine.shard.ShardStats)"

ROOT: tuple[Row, ...] = (
    ("perfd_engine_root_leader", "gauge", "count",
     "1 while this aggregator leads as the jobs' root (holds the root lease), 0 while it stands by", ()),
    ("perfd_engine_root_leadership_lost_total", "counter", "count",
     "Times this aggregator lost the root lease while leading (not renewed within its TTL: the engine "
     "away, or the root's event loop silent past the keeper's stall limit; or taken); it then stands by",
     ()),
    ("perfd_engine_root_partials_total", "counter", "count", "Shard partials the root read and folded", ()),
    ("perfd_engine_root_node_messages_total", "counter", "count",
     "Distinct node messages folded in through the partials", ()),
    ("perfd_engine_root_redelivered_total", "counter", "count",
     "Node messages that arrived again (a shard's redelivery): folded once, counted here", ()),
    ("perfd_engine_root_late_total", "counter", "count",
     "Partials of an iteration no longer in the root's memory, folded with the store's record", ()),
    ("perfd_engine_root_refused_total", "counter", "count",
     "Partials and job infos of a job the aggregator held no room for (its jobs cap)", ()),
    ("perfd_engine_root_undecodable_total", "counter", "count", "Messages the root could not decode", ()),
    ("perfd_engine_root_skipped_total", "counter", "count",
     "Messages the engine let go before the root read them (the stream's limits: size, age), by stream; "
     "lost to the job's analysis. Absent on a job's own root (--engine-job), which cannot tell", ("stream",)),
    ("perfd_engine_root_iterations_complete_total", "counter", "count",
     "Iterations made whole (every rank of the job folded in)", ()),
    ("perfd_engine_root_held_back", "gauge", "count",
     "Iterations folded into since they last went to the store (0: the store holds all the root read)", ()),
    # The lag's quantiles as gauges, not a histogram or summary: the root keeps the newest lags only
    # (perfd.engine.rootfold.LAG_SAMPLES), no running count or sum to make one of.
    ("perfd_engine_root_completion_lag_p50_seconds", "gauge", "seconds",
     "Seconds from an iteration's last rank step end to its being whole at the root: the median over the "
     "newest iterations the root keeps the lag of (perfd.engine.rootfold.LAG_SAMPLES)", ()),
    ("perfd_engine_root_completion_lag_p99_seconds", "gauge", "seconds",
     "Seconds from an iteration's last rank step end to its being whole at the root: the 99th percentile "
     "over the newest iterations the root keeps the lag of", ()),
    ("perfd_engine_root_summaries_total", "counter", "count", "Shard step summaries the root read", ()),
    ("perfd_engine_root_summaries_dropped_total", "counter", "count",
     "Shard step summaries dropped, by reason: stale (delivered again, or older than its holder's held), "
     "late (of an iteration no longer held), holders_dropped (a partition's first-heard holder let go of "
     "past MAX_HOLDERS: the iteration then goes unanswered)", ("reason",)),
    ("perfd_engine_root_comm_summaries_total", "counter", "count",
     "Shard communication-share summaries the root read (perfd shard --comm-summaries): each partition's "
     "newest is what the job's collective analysis reads its shares from", ()),
    ("perfd_engine_root_comm_summaries_dropped_total", "counter", "count",
     "Shard communication-share summaries dropped, by reason: stale (delivered again, or not newer than "
     "the partition's held), partial_holder (a new holder's of fewer ranks than its former's: its first, "
     "of the few nodes it had then), refused (of a job the root does not take, or a partition the engine "
     "does not have)", ("reason",)),
    ("perfd_engine_root_comm_holders_replaced_total", "counter", "count",
     "A partition's communication-share summary from a new holder taken in place of its former holder's "
     "(a lease moved, a shard restarted): the partition's shares are then over its new holder's rows only",
     ()),
    ("perfd_engine_root_summaries_overcounted_total", "counter", "count",
     "Iterations whose summary answer was withheld: a partition's two holders both held a rank (its lease "
     "moved mid-iteration and a node message went to both)", ()),
    ("perfd_engine_root_led_elsewhere_total", "counter", "count",
     "Messages of jobs a root of their own leads (perfd aggregator --engine-job), left to it by the root "
     "of every job", ()),
    ("perfd_engine_root_jobs_led_elsewhere", "gauge", "count",
     "Jobs a root of their own leads now (its key in the engine's job-roots bucket: put within the hour), "
     "whose messages the root of every job leaves to it", ()),
    # The engine's own state, as the leading root of every job reads it from JetStream
    # (perfd.engine.engine_state): served by it only, absent before its first read
    ("perfd_engine_stream_messages", "gauge", "count",
     "Messages an engine stream holds now, by stream (JetStream's own count, read by the leading root of "
     "every job)",
     ("stream",)),
    ("perfd_engine_stream_bytes", "gauge", "bytes",
     "Bytes an engine stream holds now, by stream: past its limit the engine lets the oldest go",
     ("stream",)),
    ("perfd_engine_stream_limit_bytes", "gauge", "bytes",
     "An engine stream's byte limit, by stream (absent where it has none)", ("stream",)),
    ("perfd_engine_consumer_pending", "gauge", "count",
     "Node messages of a partition not yet delivered to a shard, by partition consumer: the shards' "
     "backlog", ("consumer",)),
    ("perfd_engine_consumer_ack_pending", "gauge", "count",
     "Node messages of a partition delivered to its shard and not acknowledged yet, by consumer",
     ("consumer",)),
    ("perfd_engine_consumer_redelivered", "gauge", "count",
     "Node messages of a partition delivered more than once and not acknowledged yet, by consumer",
     ("consumer",)),
    ("perfd_engine_state_read_errors_total", "counter", "count",
     "Reads of the engine's stream and consumer state that failed (the last read stays served)", ()),
)

SHARD: tuple[Row, ...] = (
    ("perfd_engine_shard_node_messages_total", "counter", "count", "Node messages the shard folded", ()),
    ("perfd_engine_shard_undecodable_total", "counter", "count", "Node messages the shard could not decode",
     ()),
    ("perfd_engine_shard_delivered_again_total", "counter", "count",
     "Node messages delivered to the shard more than once (an ack wait ran out: the shard's loop held past "
     "it, or a partition moved with messages out); the root folds each once", ()),
    ("perfd_engine_shard_partials_published_total", "counter", "count",
     "Partials the shard published to the jobs' roots", ()),
    ("perfd_engine_shard_batches_published_total", "counter", "count",
     "Messages those partials went out in", ()),
    ("perfd_engine_shard_summaries_published_total", "counter", "count",
     "Partition step summaries the shard published", ()),
    ("perfd_engine_shard_comm_summaries_published_total", "counter", "count",
     "Partition communication-share summaries the shard published (of the figures its agents folded)", ()),
    ("perfd_engine_shard_comm_rows_refused_total", "counter", "count",
     "Window-figure rows the shard did not summarise: a window of no length (with --comm-summaries)", ()),
    ("perfd_engine_shard_comm_summarising_errors_total", "counter", "count",
     "Communication-share summaries that failed (logged; the partition summarised again at the job's next "
     "round; with --comm-summaries)", ()),
    ("perfd_engine_shard_comm_summarising_cpu_seconds_total", "counter", "seconds",
     "CPU the shard's communication-share summaries took (with --comm-summaries)", ()),
    ("perfd_engine_shard_comm_saved_messages_total", "counter", "count",
     "Agents' window-figure messages the shard saved to the engine before acknowledging them, for its "
     "partitions' next holders to read back (with --comm-summaries)", ()),
    ("perfd_engine_shard_comm_rows_read_back_total", "counter", "count",
     "Window-figure rows read back from the engine that the shard did not hold (a partition taken over; "
     "with --comm-summaries)", ()),
    ("perfd_engine_shard_comm_read_back_errors_total", "counter", "count",
     "Readings back of a partition's saved rows that failed or ended early, and saved messages that did "
     "not decode (logged; what was read is kept; with --comm-summaries)", ()),
    ("perfd_engine_shard_comm_purge_errors_total", "counter", "count",
     "Purges of saved rows the shard let go of that the engine did not do (logged; they age out with the "
     "stream; with --comm-summaries)", ()),
    ("perfd_engine_shard_publish_errors_total", "counter", "count",
     "Publishes the engine did not acknowledge (their node messages left unacknowledged: delivered again)",
     ()),
    ("perfd_engine_shard_messages_resent_total", "counter", "count",
     "Node messages in partials a failed publish held, sent again (where the engine had stored the first, "
     "the root reads them twice and folds them once: its redelivered count)", ()),
    ("perfd_engine_shard_partitions_held", "gauge", "count", "Partitions of the node stream held now", ()),
    ("perfd_engine_shard_leases_taken_total", "counter", "count", "Partition leases taken", ()),
    ("perfd_engine_shard_leases_lost_total", "counter", "count", "Partition leases lost", ()),
    ("perfd_engine_shard_takeover_waits_total", "counter", "count",
     "Partitions taken with a previous holder's messages due again first (redeliveries waited for)", ()),
    ("perfd_engine_shard_consumer_restarts_total", "counter", "count", "Partition consumers restarted", ()),
    ("perfd_engine_shard_job_infos_read_total", "counter", "count",
     "Job infos read from the engine's job-info bucket: a job whose node message carried none that this "
     "shard had not read (a partition taken over), its ranks then grouped by pipeline stage at once", ()),
    ("perfd_engine_shard_job_info_put_errors_total", "counter", "count",
     "Job infos the engine's job-info bucket refused (full, or the engine away): a shard taking the job's "
     "partitions over then waits for the agents' next send", ()),
    ("perfd_engine_shard_job_info_gets_late_total", "counter", "count",
     "Job-info bucket gets not answered within the fold's wait (the engine slow): the job's info read "
     "when the answer comes, the ranks folded meanwhile grouped by stage then", ()),
    ("perfd_engine_shard_summaries_restaged_total", "counter", "count",
     "Partition step summaries whose ranks were grouped by pipeline stage once their job's info was read "
     "(folded before it: stage unknown), sent again", ()),
    ("perfd_engine_shard_stage_rows_dropped_total", "counter", "count",
     "Ranks folded while their job's info was on its way whose rows were not kept to group them by stage "
     "(the shard's bound on them reached): their iterations stay stage unknown", ()),
)

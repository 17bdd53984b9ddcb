"""The job series /metrics exports and the rules read, listed once, from the jobs' snapshots
(perfd.aggregator.snapshot): for /metrics (perfd.aggregator.http) and for the rules' scopes
(perfd.aggregator.rule_scopes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from perfd.aggregator.snapshot import JobSnapshot
from perfd.analytics.breakdown.budget import metric_rows as budget_rows
from perfd.analytics.steps.goodput import metric_rows as goodput_rows
from perfd.analytics.steps.iteration import IterationResult
from perfd.analytics.steps.iteration_table import Table
from perfd.analytics.steps.liveness import ENDED, STALLED
from perfd.core import catalog
from perfd.exporters.prometheus import Row, iteration_rows


class JobRowSource(Protocol):
    """What the job rows read beside the snapshots (AggregatorState gives it)."""

    def collective_rows(self, per_rank: bool = True) -> list[Row]: ...

    def job_view_rows(self) -> tuple[list[Row], list[Row]]: ...


def rank_rows(latest: Mapping[str, Table[IterationResult]], snaps: Mapping[str, JobSnapshot]) -> list[Row]:
    """perfd_job_rank_info: where each rank of a running job runs (the snapshot's placement)."""
    rows: list[Row] = []
    for job in sorted(latest):
        snap = snaps.get(job)
        for r, pl in (snap.placed_ranks.items() if snap is not None else ()):
            rows.append(({"job_name": job, "rank": str(r), "node": pl.node, "gpu": pl.gpu},
                         "perfd_job_rank_info", 1.0))
    return rows


def liveness_rows(snaps: Sequence[JobSnapshot], now: float, node_info: bool = False) -> list[Row]:
    """/metrics rows: each job's last step time and state (kept for every known job). With
    ``node_info`` (/metrics, not the rules): the nodes each job that has not ended runs on,
    perfd_job_node_info, in the same pass over the jobs. Bounded by nodes, so exported under
    --no-rank-series too: the join of a node agent's host series, which carry no job_name, to
    the job on(node) (without it, blank host panels). A join key, not a value: no rule scope holds
    it (perfd.rules.rule_types.carrying_scopes). State, stalled seconds and goodput are computed from
    the snapshot at ``now`` (they change with the clock between refreshes)."""
    rows: list[Row] = []
    for snap in snaps:
        job, ov = snap.job, snap.overview
        state, _ = snap.state_at(now)
        if ov.last_step_time:
            rows.append(({"job_name": job}, "perfd_job_last_step_timestamp_seconds",
                         float(ov.last_step_time)))
        rows.append(({"job_name": job, "state": state}, "perfd_job_state_info", 1.0))
        if snap.mfu_alert_off:  # for every known job, like its state: the alert rule leaves it out
            rows.append(({"job_name": job}, catalog.JOB_MFU_ALERT_OPT_OUT, 1.0))
        for name, n in (("perfd_job_skipped_iterations_total", ov.skipped_iterations_total),
                        ("perfd_job_nan_iterations_total", ov.nan_iterations_total)):
            if n is not None:  # counters: kept for every known job, like the state
                rows.append(({"job_name": job}, name, float(n)))
        if state != ENDED:
            rows.append(({"job_name": job}, catalog.JOB_STALLED_SECONDS,
                         float(snap.last_step_age_s(now) or 0.0) if state == STALLED else 0.0))
            if node_info:
                rows.extend(({"job_name": job, "node": node}, catalog.JOB_NODE_INFO, 1.0)
                            for node in sorted(snap.nodes))
        rows.extend(goodput_rows(job, gp, catalog.GOODPUT_RATIO, catalog.JOB_TIME)
                    if (gp := snap.goodput(now)) is not None else ())
        a = snap.analysis
        if a is not None and state != ENDED:
            rows.extend(budget_rows(job, a.summary.step_budget, catalog.STEP_BUDGET_SECONDS,
                                    catalog.STEP_BUDGET_RATIO))
    return rows


def job_row_groups(source: JobRowSource, snaps: Sequence[JobSnapshot],
                   latest: Mapping[str, Table[IterationResult]], now: float, per_rank: bool = True,
                   node_info: bool = False) -> list[list[Row]]:
    """Every job series beside the latest iterations' own, in /metrics' order: rank placement,
    collectives, incidents, liveness, serving. ``latest``: {job: its analysed iterations, the latest
    last} of the running jobs (perfd.aggregator.snapshot.latest_of_running)."""
    incidents, serving = source.job_view_rows()
    by_job = {s.job: s for s in snaps}
    return [rank_rows(latest, by_job) if per_rank else [], source.collective_rows(per_rank), incidents,
            liveness_rows(snaps, now, node_info), serving]


def job_rows(source: JobRowSource, snaps: Sequence[JobSnapshot], latest: Mapping[str, Table[IterationResult]],
             now: float, per_rank: bool = True) -> list[Row]:
    """Every job series /metrics exports, as (labels, catalog name, value): the latest iterations'
    series, then :func:`job_row_groups`' (what the rules' scopes hold)."""
    rows: list[Row] = []
    for job, iterations in sorted(latest.items()):
        rows.extend(iteration_rows(job, iterations, per_rank))
    for group in job_row_groups(source, snaps, latest, now, per_rank):
        rows.extend(group)
    return rows

"""The /metrics rows of each job's liveness, goodput and step budget, made in one pass over the
jobs (for /metrics and for the rules' job scope, perfd.aggregator.rule_scopes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from perfd import catalog
from perfd.analytics.budget import metric_rows as budget_rows
from perfd.analytics.goodput import metric_rows as goodput_rows
from perfd.analytics.liveness import ENDED, STALLED

if TYPE_CHECKING:
    from perfd.aggregator.state import AggregatorState


Row = tuple[Mapping[str, str], str, float]


def liveness_rows(state: AggregatorState, node_info: bool = False) -> list[Row]:
    """/metrics rows: each job's last step time and state (kept for every known job). With
    ``node_info`` (/metrics, not the rules): the nodes each job that has not ended runs on,
    perfd_job_node_info, in the same pass over the jobs. Bounded by nodes, so exported under
    --no-rank-series too: the join of a node agent's host series, which carry no job_name, to
    the job on(node) (issue 37: blank host panels). A join key, not a value: no rule scope holds
    it (perfd.rules.model.carrying_scopes)."""
    rows: list[Row] = []
    for job in state.job_names():
        ov = state.job_overview(job)
        if ov is None:
            continue
        if ov.get("last_step_time"):
            rows.append(({"job_name": job}, "perfd_job_last_step_timestamp_seconds",
                         float(ov["last_step_time"])))
        rows.append(({"job_name": job, "state": ov["state"]}, "perfd_job_state_info", 1.0))
        for name, key in (("perfd_job_skipped_iterations_total", "skipped_iterations_total"),
                          ("perfd_job_nan_iterations_total", "nan_iterations_total")):
            if ov.get(key) is not None:  # counters: kept for every known job, like the state
                rows.append(({"job_name": job}, name, float(ov[key])))
        if ov["state"] != ENDED:
            rows.append(({"job_name": job}, catalog.JOB_STALLED_SECONDS,
                         float(ov.get("last_step_age_s") or 0.0) if ov["state"] == STALLED else 0.0))
            if node_info:
                rows.extend(({"job_name": job, "node": node}, catalog.JOB_NODE_INFO, 1.0)
                            for node in sorted(state.job_nodes(job)))
        rows.extend(goodput_rows(job, gp, catalog.GOODPUT_RATIO, catalog.JOB_TIME)
                    if (gp := state.goodput(job, ov)) is not None else ())
        a = state.jobs.cached_analysis(job)
        if a is not None and ov["state"] != ENDED:
            rows.extend(budget_rows(job, a.summary.step_budget, catalog.STEP_BUDGET_SECONDS,
                                    catalog.STEP_BUDGET_RATIO))
    return rows

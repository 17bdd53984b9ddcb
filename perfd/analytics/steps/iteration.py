"""The iteration type: the metrics of one iteration (one step record), as the run's analysis
(perfd.analytics.run.run_analysis) computes them and every layer above reads them. Here, in steps/,
so that the per-iteration modules (row codes, the table that keeps a run's rows) name it without
importing the run level."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics.steps.iteration_table import CITED
from perfd.analytics.steps.provenance import Cited
from perfd.core import catalog


def json_value(v: object) -> object:
    """Plain JSON values; non-finite floats become None (JSON has no NaN)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [json_value(x) for x in v]
    return v


def _internal(why: str, summary: bool = False) -> Any:
    """A numeric field that is deliberately not a catalog metric (``why``); ``summary``: its
    steady-state median is kept in the summary for the findings."""
    return field(default=None, metadata={"internal": why, "summary": summary})


@dataclass
class IterationResult:
    """The metrics of one iteration (one step record); None = absent, see ``sources``."""

    iteration: int
    end_time: float | None = _internal("wall time (epoch s) the iteration ended: a timestamp, not a "
                                       "measurement (W&B rows take it as their _timestamp)")
    step_time_ms: float | None = None
    logged_tflops_per_gpu: float | None = None  # the log's own figure
    model_tflops_per_gpu: float | None = None  # perfd's (formula, else logged, else 6N)
    tflops_rel_gap: float | None = None  # (perfd − logged) / logged
    tflops_check_ok: bool | None = None
    mfu: float | None = None  # ratio in [0, 1]
    mfu_vs_measured_ceiling: float | None = _internal("MFU against the measured matmul ceiling: a "
                                                      "finding's context, not a dashboard number", True)
    data_share: float | None = None
    outside_share: float | None = None
    in_step_ms: float | None = _internal("the time inside the step hook's step (begin -> end), beside its "
                                         "period: the step time less the time between the steps", True)
    comm_exposed_share: float | None = None
    comm_exposed_dp_share: float | None = None
    comm_exposed_pp_share: float | None = None
    comm_method: str | None = None
    optimizer_ms: float | None = _internal("the optimizer step's timer (Megatron's 'optimizer'): the step "
                                           "budget's cross-check of a capture's optimizer kernels", True)
    pp_bubble_analytic: float | None = None
    pp_idle_min: float | None = None  # heavier stage
    pp_idle_max: float | None = None  # lighter stage
    pp_imbalance: float | None = None  # pp_idle_max − pp_bubble_analytic
    pp_lighter_compute_ms: float | None = _internal("evidence of the stage-imbalance finding", True)
    pp_heavier_compute_ms: float | None = _internal("evidence of the stage-imbalance finding", True)
    pp_idle_method: str | None = None
    straggler_rtt_ratio: float | None = None
    straggler_rtt_max_rank: int | None = _internal("a rank number, not a measurement")
    straggler_rtt_min_rank: int | None = _internal("a rank number, not a measurement")
    straggler_between_stages: bool = False
    straggler_compute_spread: float | None = _internal("max/min forward-backward across ranks: "
                                                       "the straggler finding's evidence", True)
    straggler_compute_spread_flagged: bool | None = None
    straggler_candidate_ranks: list[int] = field(default_factory=list)
    # rank -> its forward+backward compute / the median of its stage (per-rank timers only)
    straggler_rank_compute_ratio: dict[int, float] = field(default_factory=dict)
    straggler_notes: list[Cited] = field(default_factory=list)  # codes (Kind.NOTE): said in the legend
    bottleneck: str = "unknown"
    lm_loss: float | None = None
    incident_lost_ms: float | None = None  # step − steady median, inside an incident only
    steady_state: bool = False
    excluded_reason: Cited | None = None  # why it is out of the steady state: a code (Kind.EXCLUDED)
    armed: bool = False  # its rank ran armed for a capture (perfd.core.armed): the profiler's step, never
                         # steady
    # metric -> its source, or why it is absent, as a code and the iteration's numbers (shown as
    # English by perfd.report.provenance_text.line); a run's table keeps the codes and numbers
    sources: dict[str, Cited] = field(default_factory=dict, metadata={CITED: True})


def job_value(metric: catalog.MetricDef, it: IterationResult) -> float | None:
    """One job metric of an iteration result, in the catalog unit; None when absent (never 0)."""
    return catalog.in_unit(metric, getattr(it, metric.attr)) if metric.attr is not None else None


def job_values(it: IterationResult, show: catalog.Show | None = None) -> dict[str, float]:
    """{catalog name: value} of every job metric present in an iteration result (W&B, the report;
    /metrics reads the run's columns through catalog.in_unit); absent values are left out."""
    return {m.name: v for m in catalog.job_metrics(show) if (v := job_value(m, it)) is not None}

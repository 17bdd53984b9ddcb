"""The whole-run parts of a run analysis (perfd.analytics.run_analysis): the steady-state summary
with the class and its votes, perfd's capture disturbances, the job block. Split from the per-
iteration analysis to keep each module readable; pure, no I/O.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perfd.analytics import bottleneck as bn
from perfd.analytics import windows
from perfd.analytics.common import median
from perfd.analytics.diagnosis import StepShares, TimelineClass, classify_job
from perfd.analytics.flops import FlopsResult
from perfd.analytics.gpus import PeakResult, gpu_memory_mib
from perfd.analytics.incidents import Incident
from perfd.analytics.iteration_table import Table
from perfd.analytics.steady import SteadyState
from perfd.analytics.stragglers import PersistentStragglers
from perfd.model import JobInfo, ParallelLayout

if TYPE_CHECKING:
    from perfd.analytics.run_analysis import IterationResult


# The summary's values that are shares of the step or rates: time-weighted over the steady steps (a
# share summed ÷ the step time summed; FLOPs summed ÷ time summed), so that an irregular series (a
# two-worker loader's alternating waits) gives the shares of its sums, never of one mode. Every other
# value is the median over the steady iterations, the step time their mean.
TIME_WEIGHTED: frozenset[str] = frozenset({
    "mfu", "model_tflops_per_gpu", "logged_tflops_per_gpu", "mfu_vs_measured_ceiling", "data_share",
    "comm_exposed_share", "comm_exposed_dp_share", "comm_exposed_pp_share", "pp_idle_max", "pp_idle_min",
    "pp_imbalance"})


# How the summary reduced each value over the steady steps, for the report's sources and headings.
REDUCTIONS_TEXT = "shares and rates time-weighted, step time the mean, the rest medians"


def reduction_of(name: str) -> str:
    """How the summary's value ``name`` was taken over the steady steps, in words."""
    if name in TIME_WEIGHTED:
        return "time-weighted (Σ over the steps ÷ Σ step time)"
    return "mean" if name == "step_time_ms" else "median"


def summarize(table: Table[IterationResult], steady_rows: Sequence[int], steady: SteadyState,
             pers: PersistentStragglers, lay: ParallelLayout, gpm: bn.GpmReading | None,
             timeline: TimelineClass | None, gpm_when: str, metrics: Sequence[str] = ()) -> dict[str, Any]:
    def steady_values(name: str) -> list[Any]:
        values = list(table.column(name))
        return [values[i] for i in steady_rows]

    med: dict[str, Any] = {}
    step_col = steady_values("step_time_ms")
    for name in metrics:
        if name in TIME_WEIGHTED:  # a share or a rate: summed over the steady steps (windows.weighted)
            med[name] = windows.weighted(steady_values(name), step_col)
        elif name == "step_time_ms":  # time per step over the steady steps, not one mode of them
            known = [v for v in step_col if v is not None]
            med[name] = statistics.fmean(known) if known else None
        else:
            med[name] = median(steady_values(name))
    # Jitter is what neither the data wait nor the step's size explains: a two-worker loader's
    # alternating waits are the data-loading finding's, batches of different lengths are by design.
    # So: the time a step spent after its batch was on hand, less what its work (the hook's FLOPs)
    # explains (windows.unexplained_cv).
    tflops = steady_values("model_tflops_per_gpu")
    busy = [s * (1.0 - d) if s is not None and d is not None else s
            for s, d in zip(step_col, steady_values("data_share"), strict=True)]
    cv = windows.unexplained_cv(busy, [t * s if t is not None and s is not None else None
                                       for t, s in zip(tflops, step_col, strict=True)])
    checks = [(ok, gap) for ok, gap in zip(steady_values("tflops_check_ok"), steady_values("tflops_rel_gap"),
                                           strict=True) if ok is not None]
    gaps = [abs(gap) for _, gap in checks if gap is not None]
    cls = classify_job(step_shares(med["data_share"], med["comm_exposed_share"], med["comm_exposed_dp_share"],
                               lay.pp, med["pp_idle_max"], med["pp_bubble_analytic"], med["mfu"]),
                       gpm, timeline, gpm_when)
    its = steady.iterations
    post = sorted(s for s in itertools.islice(table.column("step_time_ms"), steady.warmup_records, None)
                  if s is not None)
    between = steady_values("straggler_between_stages")
    return {
        # over every iteration after warm-up, incidents included: the tail is where the time goes
        "step_time_distribution_ms": ({"p50": pctl(post, 0.5), "p90": pctl(post, 0.9),
                                       "p99": pctl(post, 0.99), "max": post[-1], "n": len(post),
                                       "over": "iterations after warm-up, incidents included"}
                                      if post else None),
        "n_iterations": len(table),
        "n_steady": len(steady_rows),
        "steady_first_iteration": its[0] if its else None,
        "steady_last_iteration": its[-1] if its else None,
        "warmup_records": steady.warmup_records,
        "excluded": {str(k): v for k, v in sorted(steady.excluded.items())},
        "excluded_kinds": {str(k): v.value for k, v in sorted(steady.kinds.items())},
        "medians": med,
        "step_time_cv": cv,
        "tflops_check_n": len(checks),
        "tflops_check_n_disagree": sum(1 for ok, _ in checks if ok is False),
        "tflops_check_max_abs_gap": max(gaps) if gaps else None,
        "bottleneck": cls.cls.value,
        "bottleneck_reason": cls.reason,
        "bottleneck_evidence": cls.evidence_json(),
        "bottleneck_sources": dict(cls.sources),
        "straggler_persistent_ranks": pers.ranks,
        "straggler_flag_fraction": {str(k): v for k, v in pers.fraction.items()},
        "straggler_between_stages_fraction": (sum(1 for b in between if b) / len(steady_rows)
                                              if len(steady_rows) else None),
        "straggler_compute_spread_fraction": pers.anonymous_fraction,
    }


def disturbances_json(ds: Sequence[Incident]) -> dict[str, Any]:
    """perfd's own captures' disturbance: how many stretches and iterations, and the excess time they
    took apart from the incidents (a stretch inside an incident names it: its time is that incident's
    capture_cost_s, not counted again)."""
    costs = [s for d in ds if d.evidence.inside_incident is None
             for s in (d.cost_s, d.capture_cost_s) if s is not None]
    return {"n": len(ds), "iterations": sum(d.n_iterations for d in ds),
            "excess_s": sum(costs) if costs else None,
            "stretches": [{"first_iteration": d.first_iteration, "last_iteration": d.last_iteration,
                           "excess_s": d.capture_cost_s,
                           **({"inside_incident": d.evidence.inside_incident}
                              if d.evidence.inside_incident is not None else {})} for d in ds]}


def step_shares(data: float | None, comm: float | None, grad_sync: float | None, pp: int | None,
            idle_max: float | None, bubble: float | None, mfu_: float | None) -> StepShares:
    return StepShares(data, comm, grad_sync, pp, idle_max, bubble, mfu_)


def pctl(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (no interpolation: a value that occurred)."""
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def job_block(job: JobInfo, name: str | None, world: int | None, gpu_name: str | None, peak: PeakResult,
               dtype: str | None, dtype_src: str, fl: FlopsResult) -> dict[str, Any]:
    lay = job.layout
    return {
        "name": name,
        "framework": job.framework,
        "framework_version": job.framework_version,
        "torch_version": job.torch_version,
        "timing_log_option": job.timing_log_option,
        "log_interval": job.log_interval,
        "wandb_run_id": job.wandb_run_id,
        "layout": {**dataclasses.asdict(lay), "world_size": world, "microbatches": lay.microbatches()},
        "model": dataclasses.asdict(job.spec),
        "gpu": {
            "name": gpu_name,
            "model": peak.gpu_model,
            "dtype": dtype,
            "dtype_source": dtype_src,
            "peak_tflops": peak.peak_tflops,
            "peak_source": str(peak.source) if peak.source else None,
            "peak_reason": peak.reason,
            "measured_ceiling_tflops": peak.measured_ceiling_tflops,
            "memory_mib": gpu_memory_mib(gpu_name),
        },
        "flops_per_iteration": fl.flops_per_iteration,
        "flops_formula": fl.formula,
        "flops_source": str(fl.source) if fl.source else None,
        "flops_missing": list(fl.missing),
        "flops_notes": list(fl.notes),
        "flops_breakdown": dict(fl.breakdown),
    }

"""Analysis of one Megatron-LM run: per-iteration metrics, steady-state summary, findings.

``analyze_run(job, records)`` is pure: it takes what the log parser produced (JobInfo and the
StepRecords) and returns a RunAnalysis. Every number carries its source; a number whose inputs
are missing is None (JSON null) with the reason, never 0.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from perfd import catalog
from perfd.analytics import bottleneck as bn
from perfd.analytics.common import MetricValue, finite, median
from perfd.analytics.diagnosis import TimelineClass, classify_job
from perfd.analytics.findings import Finding, Recommendation, derive_findings, order_findings
from perfd.analytics.flops import FORMULA_6N, FlopsResult, model_flops
from perfd.analytics.gpus import PeakResult, normalize_dtype, peak_tflops
from perfd.analytics.incidents import Incident, detect_incidents, incident_findings
from perfd.analytics.metrics import crosscheck_tflops, data_share, exposed_comm, mfu, throughput_per_gpu
from perfd.analytics.pipeline import analytic_bubble, stage_idle
from perfd.analytics.steady import SteadyState, steady_state
from perfd.analytics.stragglers import PersistentStragglers, StragglerResult, detect, persistent, rank_order
from perfd.model import JobInfo, ParallelLayout, Provenance, StepRecord


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
    megatron_tflops_per_gpu: float | None = None  # the log's own figure
    model_tflops_per_gpu: float | None = None  # perfd's (formula, else logged, else 6N)
    tflops_rel_gap: float | None = None  # (perfd − logged) / logged
    tflops_check_ok: bool | None = None
    mfu: float | None = None  # ratio in [0, 1]
    mfu_vs_measured_ceiling: float | None = _internal("MFU against the measured matmul ceiling: a "
                                                      "finding's context, not a dashboard number", True)
    data_share: float | None = None
    comm_exposed_share: float | None = None
    comm_exposed_dp_share: float | None = None
    comm_exposed_pp_share: float | None = None
    comm_method: str | None = None
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
    straggler_notes: list[str] = field(default_factory=list)
    bottleneck: str = "unknown"
    lm_loss: float | None = None
    incident_lost_ms: float | None = None  # step − steady median, inside an incident only
    steady_state: bool = False
    excluded_reason: str | None = None
    sources: dict[str, str] = field(default_factory=dict)  # metric -> source, or "absent: why"

    def to_json(self) -> dict[str, Any]:
        return {k: _json_value(v) for k, v in dataclasses.asdict(self).items()}


# Per-iteration metrics summarised as medians over the steady state: the catalog's summary metrics
# and the internal fields the findings need.
SUMMARY_METRICS: tuple[str, ...] = (
    *(m.attr for m in catalog.job_metrics(catalog.SUMMARY) if m.attr),
    *(f.name for f in dataclasses.fields(IterationResult) if f.metadata.get("summary")),
)


@dataclass
class RunAnalysis:
    """Everything analyze_run found: job block, iterations, summary, findings, recommendations."""

    job: dict[str, Any]
    iterations: list[IterationResult]
    summary: dict[str, Any]
    findings: list[Finding]
    recommendations: list[Recommendation]
    steady: SteadyState
    stragglers: PersistentStragglers
    flops: FlopsResult
    peak: PeakResult
    incidents: list[Incident] = field(default_factory=list)

    def steady_iterations(self) -> list[IterationResult]:
        return [it for it in self.iterations if it.steady_state]

    def to_json(self) -> dict[str, Any]:
        """Keys: job, iterations, summary, incidents. None stays None (null), never 0. The report is built
        above this layer (perfd.report.analysis_json adds it)."""
        return {
            "job": _json_value(self.job),
            "iterations": [it.to_json() for it in self.iterations],
            "summary": _json_value(self.summary),
            "incidents": [_json_value(i.to_json()) for i in self.incidents],
        }


def _json_value(v: Any) -> Any:
    """Plain JSON values; non-finite floats become None (JSON has no NaN)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_value(x) for x in v]
    return v


def _world_size(lay: ParallelLayout) -> int | None:
    if lay.world_size is not None:
        return lay.world_size
    if None not in (lay.tp, lay.pp, lay.dp, lay.cp):
        assert lay.tp and lay.pp and lay.dp and lay.cp
        return lay.tp * lay.pp * lay.dp * lay.cp
    return None


def _microbatches(lay: ParallelLayout, gbs: int | None) -> int | None:
    """Micro-batches per iteration per DP replica for a given global batch."""
    if gbs is None or gbs == lay.global_batch_size:
        return lay.microbatches()
    if lay.micro_batch_size and lay.dp and gbs % (lay.micro_batch_size * lay.dp) == 0:
        return gbs // (lay.micro_batch_size * lay.dp)
    return None


def resolve_dtype(job: JobInfo, dtype: str | None) -> tuple[str | None, str]:
    """Training dtype: the argument, else the model spec, else Megatron's --bf16/--fp16/--fp8."""
    if dtype is not None:
        return normalize_dtype(dtype), "argument"
    if job.spec.dtype is not None:
        return normalize_dtype(job.spec.dtype), "model spec"
    args = job.arguments
    fp8 = args.get("fp8")
    if fp8 is not None and fp8.strip() not in ("None", "False", ""):
        return "fp8", "arguments: fp8"
    if args.get("bf16") == "True":
        return "bf16", "arguments: bf16"
    if args.get("fp16") == "True":
        return "fp16", "arguments: fp16"
    if args.get("bf16") == "False" and args.get("fp16") == "False":
        return "fp32", "arguments: neither bf16 nor fp16"
    return None, "unknown"


def _src(m: MetricValue) -> str:
    if m.value is None:
        return f"absent: {m.reason or 'unknown'}"
    text = str(m.source) if m.source else "analytics"
    return f"{text} [{m.reason}]" if m.reason else text


@dataclass
class AnalysisMemo:
    """Per-iteration work kept from one analysis of a growing run to the next (the aggregator keeps
    one per job): an iteration whose record is the *same object* as last time, under the same job
    context, is not computed again, so a new iteration costs its own work — the per-rank straggler
    detection, exposed communication and stage idle — not a re-run over the history. What depends
    on the whole run (steady state, incidents, the class with GPM and the timeline, the summary) is
    still derived from every iteration, from these results. Plain data owned by the caller; the
    analysis stays a function of its inputs (the same result with or without a memo: tested)."""

    key: tuple[Any, ...] | None = None
    entries: dict[int, tuple[StepRecord, IterationResult, StragglerResult]] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0


@dataclass
class _Context:
    """What every iteration's metrics depend on besides its record."""

    job: JobInfo
    world: int | None
    peak: PeakResult
    ranks: Any
    flops_cache: dict[int | None, FlopsResult]


def _iteration(rec: StepRecord, ctx: _Context) -> tuple[IterationResult, StragglerResult]:
    """The metrics of one record that need only the record and the job (see AnalysisMemo)."""
    job, lay, world, peak, ranks, flops_cache = (ctx.job, ctx.job.layout, ctx.world, ctx.peak, ctx.ranks,
                                                 ctx.flops_cache)
    it = IterationResult(rec.iteration, end_time=finite(rec.end_time),
                         step_time_ms=finite(rec.step_time_ms),
                         megatron_tflops_per_gpu=finite(rec.logged_tflops_per_gpu),
                         lm_loss=finite(rec.lm_loss))
    srcs = it.sources
    srcs["step_time_ms"] = str(rec.source) if rec.source else "megatron: elapsed time per iteration"
    srcs["lm_loss"] = ("megatron: lm loss" if it.lm_loss is not None
                       else "absent: no lm loss on this iteration (NaN loss removes the field)")
    srcs["megatron_tflops_per_gpu"] = ("megatron: throughput per GPU (TFLOP/s/GPU)"
                                       if it.megatron_tflops_per_gpu is not None
                                       else "absent: not in the log (needs --log-throughput)")

    # Throughput, MFU, cross-check.
    gbs = rec.global_batch_size if rec.global_batch_size is not None else lay.global_batch_size
    if gbs not in flops_cache:
        flops_cache[gbs] = model_flops(job.spec, gbs, job.framework_version)
    fl = flops_cache[gbs]
    tput = MetricValue.absent(fl.reason() or "model FLOPs unknown")
    if fl.available and fl.formula != FORMULA_6N:
        tput = throughput_per_gpu(fl.flops_per_iteration, it.step_time_ms, world, fl.source)
    if tput.value is None and it.megatron_tflops_per_gpu is not None:
        tput = MetricValue(it.megatron_tflops_per_gpu, Provenance(
            "megatron", "logged throughput per GPU (perfd's formula unavailable: "
                        f"{tput.reason})"))
    if tput.value is None and fl.available and fl.formula == FORMULA_6N:
        tput = throughput_per_gpu(fl.flops_per_iteration, it.step_time_ms, world, fl.source)
    it.model_tflops_per_gpu = tput.value
    srcs["model_tflops_per_gpu"] = srcs["tflops_rel_gap"] = _src(tput)
    if tput.source is not None and tput.source.collector == "analytics":
        chk = crosscheck_tflops(tput.value, it.megatron_tflops_per_gpu)
        it.tflops_rel_gap, it.tflops_check_ok = chk.rel_gap, chk.agrees
    m = mfu(tput, peak)
    it.mfu = m.value
    srcs["mfu"] = _src(m)
    if tput.value is not None and peak.measured_ceiling_tflops:
        it.mfu_vs_measured_ceiling = tput.value / peak.measured_ceiling_tflops

    d = data_share(rec)
    it.data_share = d.value
    srcs["data_share"] = _src(d)

    comm = exposed_comm(rec)
    it.comm_exposed_share = comm.total.value
    it.comm_exposed_dp_share = comm.grad_sync.value
    it.comm_exposed_pp_share = comm.pp.value
    it.comm_method = comm.method
    srcs["comm_exposed_share"] = _src(comm.total)
    srcs["comm_exposed_dp_share"] = _src(comm.grad_sync)
    srcs["comm_exposed_pp_share"] = _src(comm.pp)

    bubble = analytic_bubble(lay.pp, _microbatches(lay, gbs), lay.vpp)
    idle = stage_idle(rec, lay.pp, bubble)
    it.pp_bubble_analytic = bubble.value
    it.pp_idle_max, it.pp_idle_min = idle.idle_max.value, idle.idle_min.value
    it.pp_imbalance = idle.imbalance.value
    it.pp_lighter_compute_ms, it.pp_heavier_compute_ms = idle.lighter_compute_ms, idle.heavier_compute_ms
    it.pp_idle_method = idle.method
    srcs["pp_bubble_analytic"] = _src(bubble)
    srcs["pp_idle_max"] = _src(idle.idle_max)
    srcs["pp_idle_min"] = _src(idle.idle_min)
    srcs["pp_imbalance"] = _src(idle.imbalance)

    st = detect(rec, ranks)
    it.straggler_rtt_ratio = st.rtt_ratio
    it.straggler_rtt_max_rank, it.straggler_rtt_min_rank = st.rtt_max_rank, st.rtt_min_rank
    it.straggler_between_stages = st.line_between_stages
    it.straggler_compute_spread = st.compute_spread
    it.straggler_compute_spread_flagged = st.compute_spread_flagged
    it.straggler_candidate_ranks = st.flagged_ranks
    it.straggler_rank_compute_ratio = dict(st.per_rank_ratio)
    it.straggler_notes = list(st.notes)
    srcs["straggler"] = ("megatron: straggler detector line (MnRtt/MxRtt)" if rec.straggler
                         else "megatron: timers only (no straggler line; needs --log-straggler)")
    srcs["straggler_rtt_ratio"] = srcs["straggler"]
    return it, st



def analyze_run(
    job: JobInfo,
    records: list[StepRecord],
    gpu_name: str | None = None,
    peak_tflops: float | None = None,
    dtype: str | None = None,
    *,
    job_name: str | None = None,
    gpm: bn.GpmReading | None = None,
    timeline: TimelineClass | None = None,
    memo: AnalysisMemo | None = None,
) -> RunAnalysis:
    """Analyse a Megatron run's step records (any order; one record per logged iteration).
    ``memo``: keep per-iteration work for the next analysis of the same, grown run."""
    return _analyze(job, records, gpu_name, peak_tflops, dtype, job_name, gpm, timeline, memo)


def _analyze(job: JobInfo, records: Sequence[StepRecord], gpu_name: str | None,
             peak_override: float | None, dtype: str | None, job_name: str | None,
             gpm: bn.GpmReading | None, timeline: TimelineClass | None,
             memo: AnalysisMemo | None = None) -> RunAnalysis:
    lay = job.layout
    world = _world_size(lay)
    canon_dtype, dtype_src = resolve_dtype(job, dtype)
    peak = peak_tflops(gpu_name, canon_dtype, peak_override)
    flops_job = model_flops(job.spec, lay.global_batch_size, job.framework_version)
    flops_cache: dict[int | None, FlopsResult] = {lay.global_batch_size: flops_job}
    ranks = rank_order(lay, job.arguments)
    ordered = sorted(records, key=lambda r: r.iteration)
    steady = steady_state(ordered)

    ctx = _Context(job, world, peak, ranks, flops_cache)
    key = (job, gpu_name, peak_override, dtype)
    if memo is not None and memo.key != key:
        memo.key, memo.entries = key, {}
    iterations: list[IterationResult] = []
    straggler_results: dict[int, StragglerResult] = {}
    for rec in ordered:
        kept = memo.entries.get(rec.iteration) if memo is not None else None
        if kept is not None and kept[0] is rec:
            it, st = dataclasses.replace(kept[1]), kept[2]  # a copy: the lines below set its fields
            memo.hits += 1  # type: ignore[union-attr]
        else:
            base, st = _iteration(rec, ctx)
            if memo is not None:
                memo.entries[rec.iteration] = (rec, base, st)
                memo.misses += 1
            it = dataclasses.replace(base)
        straggler_results[rec.iteration] = st
        it.steady_state = steady.steady.get(rec.iteration, False)
        it.excluded_reason = steady.excluded.get(rec.iteration)
        it.bottleneck = classify_job(it.data_share, it.comm_exposed_share, it.comm_exposed_dp_share,
                                     lay.pp, it.pp_idle_max, it.pp_bubble_analytic, it.mfu, gpm,
                                     timeline).cls
        iterations.append(it)
    if memo is not None and len(memo.entries) > len(ordered):  # evicted iterations leave the memo
        present = {r.iteration for r in ordered}
        for i in [i for i in memo.entries if i not in present]:
            del memo.entries[i]

    incidents = _mark_incidents(iterations, ordered, steady)
    steady_its = [it for it in iterations if it.steady_state]
    pers = persistent([straggler_results[it.iteration] for it in steady_its])
    summary = _summary(iterations, steady_its, steady, pers, lay, gpm, timeline)
    job_block = _job_block(job, job_name, ordered, world, gpu_name, peak, canon_dtype, dtype_src,
                           flops_job)
    summary["incidents_n"] = len(incidents)
    summary["incidents_cost_s"] = (sum(i.cost_s for i in incidents if i.cost_s is not None)
                                   if incidents else None)
    analysis = RunAnalysis(job_block, iterations, summary, [], [], steady, pers, flops_job, peak, incidents)
    fs, rs = derive_findings(analysis, job)
    run_s = sum(it.step_time_ms for it in iterations if it.step_time_ms is not None) / 1e3
    inc_f, inc_r = incident_findings([i.to_json() for i in incidents], run_s or None)
    analysis.findings, analysis.recommendations = order_findings([*fs, *inc_f], [*rs, *inc_r])
    return analysis


def _mark_incidents(iterations: list[IterationResult], ordered: Sequence[StepRecord],
                    steady: SteadyState) -> list[Incident]:
    """Find the incidents, take their iterations out of the steady state (saying which incident),
    and note each one's time lost against the steady median."""
    incidents, ref = detect_incidents(iterations, {r.iteration: r.end_time for r in ordered},
                                      {r.iteration: r.disturbed_by_capture for r in ordered},
                                      steady.warmup_records, steady.reference_step_ms)
    by_it = {it.iteration: it for it in iterations}
    for inc in incidents:
        for i in range(inc.first_iteration, inc.last_iteration + 1):
            it = by_it.get(i)
            if it is None:
                continue
            if it.step_time_ms is not None and ref is not None:
                it.incident_lost_ms = it.step_time_ms - ref
            reason = f"incident {inc.id}: {inc.cause}"
            it.steady_state, it.excluded_reason = False, reason
            steady.steady[i] = False
            steady.excluded[i] = reason
    return incidents


def _summary(iterations: list[IterationResult], steady_its: list[IterationResult], steady: SteadyState,
             pers: PersistentStragglers, lay: ParallelLayout, gpm: bn.GpmReading | None,
             timeline: TimelineClass | None) -> dict[str, Any]:
    med: dict[str, Any] = {}
    for name in SUMMARY_METRICS:
        med[name] = median(getattr(it, name) for it in steady_its)
    steps = [it.step_time_ms for it in steady_its if it.step_time_ms is not None]
    cv = (statistics.pstdev(steps) / statistics.fmean(steps)) if len(steps) >= 2 else None
    checks = [it for it in steady_its if it.tflops_check_ok is not None]
    gaps = [abs(it.tflops_rel_gap) for it in checks if it.tflops_rel_gap is not None]
    cls = classify_job(med["data_share"], med["comm_exposed_share"], med["comm_exposed_dp_share"], lay.pp,
                       med["pp_idle_max"], med["pp_bubble_analytic"], med["mfu"], gpm, timeline)
    its = steady.iterations
    post = sorted(it.step_time_ms for it in iterations[steady.warmup_records:] if it.step_time_ms is not None)
    return {
        # over every iteration after warm-up, incidents included: the tail is where the time goes
        "step_time_distribution_ms": ({"p50": _pctl(post, 0.5), "p90": _pctl(post, 0.9),
                                       "p99": _pctl(post, 0.99), "max": post[-1], "n": len(post),
                                       "over": "iterations after warm-up, incidents included"}
                                      if post else None),
        "n_iterations": len(iterations),
        "n_steady": len(steady_its),
        "steady_first_iteration": its[0] if its else None,
        "steady_last_iteration": its[-1] if its else None,
        "warmup_records": steady.warmup_records,
        "excluded": {str(k): v for k, v in sorted(steady.excluded.items())},
        "medians": med,
        "step_time_cv": cv,
        "tflops_check_n": len(checks),
        "tflops_check_n_disagree": sum(1 for it in checks if it.tflops_check_ok is False),
        "tflops_check_max_abs_gap": max(gaps) if gaps else None,
        "bottleneck": cls.cls,
        "bottleneck_reason": cls.reason,
        "bottleneck_evidence": dict(cls.evidence),
        "bottleneck_sources": dict(cls.sources),
        "straggler_persistent_ranks": pers.ranks,
        "straggler_flag_fraction": {str(k): v for k, v in pers.fraction.items()},
        "straggler_between_stages_fraction": (
            sum(1 for it in steady_its if it.straggler_between_stages) / len(steady_its)
            if steady_its else None),
        "straggler_compute_spread_fraction": pers.anonymous_fraction,
    }


def _pctl(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (no interpolation: a value that occurred)."""
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def _job_block(job: JobInfo, job_name: str | None, records: Sequence[StepRecord], world: int | None,
               gpu_name: str | None, peak: PeakResult, dtype: str | None, dtype_src: str,
               fl: FlopsResult) -> dict[str, Any]:
    lay = job.layout
    name = job_name or (records[0].job if records else None)
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
        },
        "flops_per_iteration": fl.flops_per_iteration,
        "flops_formula": fl.formula,
        "flops_source": str(fl.source) if fl.source else None,
        "flops_missing": list(fl.missing),
        "flops_notes": list(fl.notes),
        "flops_breakdown": dict(fl.breakdown),
    }

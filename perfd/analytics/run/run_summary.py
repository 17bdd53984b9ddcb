"""The whole-run parts of a run analysis (perfd.analytics.run.run_analysis): the steady-state summary
with the class and its votes, perfd's capture disturbances, the job block. Split from the per-
iteration analysis to keep each module readable; pure, no I/O.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown import bottleneck as bn
from perfd.analytics.breakdown.budget import StepBudget, classify
from perfd.analytics.breakdown.diagnosis import StepShares, TimelineClass, classify_job
from perfd.analytics.common import median
from perfd.analytics.incidents.cadence import CadencePause
from perfd.analytics.incidents.detect import Incident
from perfd.analytics.run.arming import ArmingCost
from perfd.analytics.run.runs import Runs
from perfd.analytics.steps import beat, windows
from perfd.analytics.steps.flops import FlopsResult
from perfd.analytics.steps.goodput import Goodput
from perfd.analytics.steps.gpus import PeakResult, gpu_memory_mib
from perfd.analytics.steps.iteration_table import Table
from perfd.analytics.steps.provenance import Cited
from perfd.analytics.steps.steady import ExcludedRange, Exclusion, SteadyState, excluded_ranges
from perfd.analytics.steps.stragglers import PersistentStragglers
from perfd.core.model import DEVICES, Device, JobInfo, ModelSpec, ParallelLayout, TextEnum
from perfd.core.record_json import JsonRecord, JsonWritten, unless_none

if TYPE_CHECKING:
    from perfd.analytics.steps.iteration import IterationResult


# The summary's values that are shares of the step or rates: time-weighted over the steady steps (a
# share summed ÷ the step time summed; FLOPs summed ÷ time summed), so that an irregular series (a
# two-worker loader's alternating waits) gives the shares of its sums, never of one mode. Every other
# value is the median over the steady iterations, the step time their mean.
TIME_WEIGHTED: frozenset[str] = frozenset({
    "mfu", "model_tflops_per_gpu", "logged_tflops_per_gpu", "mfu_vs_measured_ceiling", "data_share",
    "outside_share", "comm_exposed_share", "comm_exposed_dp_share", "comm_exposed_pp_share", "pp_idle_max",
    "pp_idle_min", "pp_imbalance"})


# Times per step whose summary value is their mean over the steady steps (time per step over them,
# whatever the pattern inside: a two-worker loader's alternation, an accumulation every N steps).
MEAN_TIMES: frozenset[str] = frozenset({"step_time_ms", "in_step_ms"})

# How the summary reduced each value over the steady steps, for the report's sources and headings.
REDUCTIONS_TEXT = "shares and rates time-weighted, step time the mean, the rest medians"


class Reduction(TextEnum):
    """How the summary took a value over the steady steps (the JSON's ``reductions``): the values are
    served under the key ``medians``, which only the MEDIAN ones are."""

    TIME_WEIGHTED = "time-weighted"  # Σ over the steps ÷ Σ step time (TIME_WEIGHTED)
    MEAN = "mean"  # MEAN_TIMES
    MEDIAN = "median"


def reduction(name: str) -> Reduction:
    """How the summary's value ``name`` was taken over the steady steps."""
    if name in TIME_WEIGHTED:
        return Reduction.TIME_WEIGHTED
    return Reduction.MEAN if name in MEAN_TIMES else Reduction.MEDIAN


def steady_medians(table: Table[IterationResult], steady_rows: Sequence[int],
                   metrics: Sequence[str]) -> dict[str, float | None]:
    """Each summary metric over the steady iterations: time-weighted (TIME_WEIGHTED), the step time's
    mean, or the median."""
    step_col = _steady_values(table, steady_rows, "step_time_ms")
    med: dict[str, float | None] = {}
    for name in metrics:
        if name in TIME_WEIGHTED:  # a share or a rate: summed over the steady steps (windows.weighted)
            med[name] = windows.weighted(_steady_values(table, steady_rows, name), step_col)
        elif name in MEAN_TIMES:  # time per step over the steady steps, not one mode of them
            known = [v for v in _steady_values(table, steady_rows, name) if v is not None]
            med[name] = statistics.fmean(known) if known else None
        else:
            med[name] = median(_steady_values(table, steady_rows, name))
    return med


def _steady_values(table: Table[IterationResult], steady_rows: Sequence[int], name: str) -> list[Any]:
    values = list(table.column(name))
    return [values[i] for i in steady_rows]


NO_SHARES = StepShares()  # nothing beside the numbers: Megatron's names, every collective timed


def as_budgeted(timeline: TimelineClass | None, budget: StepBudget | None) -> TimelineClass | None:
    """The capture's vote as the run's step budget reads the same capture: the budget is brought back to
    the unprofiled step where the profiler slowed it (its host-side idle rescaled), the capture's own
    class is not; one set of class shares, so the bottleneck line and the status line never disagree
    (they once said sync 6% and 5% of one step)."""
    if timeline is None or budget is None or not isinstance(timeline.reason, bn.ClassBasis) \
            or timeline.reason.decided is None:
        return timeline
    c = classify(budget)
    if c is None:
        return timeline
    return dataclasses.replace(timeline, cls=c.cls, reason=dataclasses.replace(timeline.reason, decided=c))


def summarize(table: Table[IterationResult], steady_rows: Sequence[int], steady: SteadyState,
              pers: PersistentStragglers, lay: ParallelLayout, gpm: bn.GpmReading | None,
              timeline: TimelineClass | None, gpm_when: bn.GpmWhen, med: Mapping[str, float | None], *,
              incidents: Sequence[Incident], jitter: Mapping[str, float | None],
              disturbances: CaptureDisturbances, goodput: Goodput | None,
              memory_mib: Mapping[str, float] | None, step_budget: StepBudget | None,
              shares_of: StepShares = NO_SHARES) -> RunSummary:
    """The run's summary over its steady iterations ``steady_rows``, with ``med`` their
    steady_medians, and what the whole run adds: its incidents, jitter, perfd's capture
    disturbances, goodput, memory report and step budget. ``shares_of``: what the step shares carry
    beside the medians (the untimed collectives, the data timer's name)."""
    def steady_values(name: str) -> list[Any]:
        return _steady_values(table, steady_rows, name)

    step_col = steady_values("step_time_ms")
    # Jitter is what neither the data wait nor the step's size explains: a two-worker loader's
    # alternating waits are the data-loading finding's, batches of different lengths are by design.
    # So: the time a step spent after its batch was on hand, less what its work (the hook's FLOPs)
    # explains (windows.unexplained_cv).
    tflops = steady_values("model_tflops_per_gpu")
    busy = [s * (1.0 - d) if s is not None and d is not None else s
            for s, d in zip(step_col, steady_values("data_share"), strict=True)]
    work = [t * s if t is not None and s is not None else None for t, s in zip(tflops, step_col, strict=True)]
    cv = windows.unexplained_cv(busy, work)
    # Read only where the steps jitter (the finding it feeds): what its slow steps cost, on a timer?
    jitters = cv is not None and cv > th.JITTER_CV.value
    slow = beat.slow_steps(steady_values("end_time"), busy, work) if jitters else None
    checks = [(ok, gap) for ok, gap in zip(steady_values("tflops_check_ok"), steady_values("tflops_rel_gap"),
                                           strict=True) if ok is not None]
    gaps = [abs(gap) for _, gap in checks if gap is not None]
    cls = classify_job(step_shares(med["data_share"], med["comm_exposed_share"], med["comm_exposed_dp_share"],
                                   lay.pp, med["pp_idle_max"], med["pp_bubble_analytic"], med["mfu"],
                                   like=shares_of),
                       gpm, as_budgeted(timeline, step_budget), gpm_when)
    its = steady.iterations
    post = sorted(s for s in itertools.islice(table.column("step_time_ms"), steady.warmup_records, None)
                  if s is not None)
    between = steady_values("straggler_between_stages")
    return RunSummary(
        # over every iteration after warm-up, incidents included: the tail is where the time goes
        step_time_distribution=(StepTimeDistribution(p50=pctl(post, 0.5), p90=pctl(post, 0.9),
                                                      p99=pctl(post, 0.99), max=post[-1], n=len(post))
                                if post else None),
        n_iterations=len(table),
        n_steady=len(steady_rows),
        steady_first_iteration=its[0] if its else None,
        steady_last_iteration=its[-1] if its else None,
        warmup_records=steady.warmup_records,
        excluded=dict(sorted(steady.excluded.items())),
        excluded_kinds=dict(sorted(steady.kinds.items())),
        excluded_ranges=excluded_ranges(steady.kinds, steady.refs, steady.steady),
        medians=dict(med),
        step_time_cv=cv,
        slow_steps=slow,
        tflops_check_n=len(checks),
        tflops_check_n_disagree=sum(1 for ok, _ in checks if ok is False),
        tflops_check_max_abs_gap=max(gaps) if gaps else None,
        bottleneck=cls,
        straggler_persistent_ranks=tuple(pers.ranks),
        straggler_flag_fraction=dict(pers.fraction),
        straggler_between_stages_fraction=(sum(1 for b in between if b) / len(steady_rows)
                                           if len(steady_rows) else None),
        straggler_compute_spread_fraction=pers.anonymous_fraction,
        incidents_n=len(incidents),
        incidents_cost_s=incidents_cost_s(incidents),
        jitter=jitter,
        capture_disturbances=disturbances,
        goodput=goodput,
        memory_mib=memory_mib,
        step_budget=step_budget,
    )


def incidents_cost_s(incidents: Sequence[Incident]) -> float | None:
    """The time the incidents cost together; None without incidents (and 0 when none says its cost)."""
    return sum(i.cost_s for i in incidents if i.cost_s is not None) if incidents else None


def step_shares(data: float | None, comm: float | None, grad_sync: float | None, pp: int | None,
                idle_max: float | None, bubble: float | None, mfu_: float | None,
                like: StepShares = NO_SHARES) -> StepShares:
    """The shares, with what ``like`` carries beside them (untimed collectives, the data timer)."""
    return dataclasses.replace(like, data_share=data, comm_exposed=comm, comm_grad_sync=grad_sync, pp=pp,
                               pp_idle_max=idle_max, pp_bubble_analytic=bubble, mfu=mfu_)


def pctl(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (no interpolation: a value that occurred)."""
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def job_block(job: JobInfo, name: str | None, world: int | None, gpu_name: str | None, peak: PeakResult,
              dtype: str | None, dtype_src: Cited, fl: FlopsResult) -> JobBlock:
    lay = job.layout
    return JobBlock(
        name=name,
        framework=job.framework,
        framework_version=job.framework_version,
        device=job.device,
        torch_version=job.torch_version,
        timing_log_option=job.timing_log_option,
        log_interval=job.log_interval,
        wandb_run_id=job.wandb_run_id,
        layout=JobLayout.of(lay, world),
        model=copy.deepcopy(job.spec),  # the block keeps the spec of its time: the job's may change
        gpu=JobGpu(
            name=gpu_name,
            model=peak.gpu_model,
            dtype=dtype,
            dtype_source=dtype_src,
            peak_tflops=peak.peak_tflops,
            peak_source=peak.source,
            peak_reason=peak.reason,
            measured_ceiling_tflops=peak.measured_ceiling_tflops,
            memory_mib=gpu_memory_mib(gpu_name),
        ),
        flops=JobFlops(
            per_iteration=fl.flops_per_iteration,
            formula=fl.formula,
            source=str(fl.source) if fl.source else None,
            missing=tuple(fl.missing),
            notes=tuple(fl.notes),
            breakdown=dict(fl.breakdown),
        ),
    )


# --- the summary's and the job block's types ---------------------------------------------------------
# Each value's to_json is the JSON the analysis has always served (the HTTP API, files, W&B): the
# same keys in the same order, None kept as null.

DISTRIBUTION_OVER = "iterations after warm-up, incidents included"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimeDistribution(JsonRecord):
    """Nearest-rank percentiles of the step time (ms) over ``over``."""

    p50: float
    p90: float
    p99: float
    max: float
    n: int
    over: str = DISTRIBUTION_OVER


@dataclass(frozen=True, slots=True, kw_only=True)
class DisturbanceStretch(JsonRecord):
    """One stretch of iterations a perfd capture disturbed; ``inside_incident``: the incident it lies
    in (its time is that incident's capture_cost_s)."""

    first_iteration: int
    last_iteration: int
    excess_s: float | None
    inside_incident: str | None = field(default=None, metadata=unless_none())


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureDisturbances(JsonWritten):
    """perfd's own captures' disturbance: how many stretches and iterations, and the excess time they
    took apart from the incidents (a stretch inside an incident names it: its time is that incident's
    capture_cost_s, not counted again)."""

    n: int = 0
    iterations: int = 0
    excess_s: float | None = None
    stretches: tuple[DisturbanceStretch, ...] = ()

    @classmethod
    def of(cls, ds: Sequence[Incident]) -> CaptureDisturbances:
        costs = [s for d in ds if d.evidence.inside_incident is None
                 for s in (d.cost_s, d.capture_cost_s) if s is not None]
        return cls(n=len(ds), iterations=sum(d.n_iterations for d in ds),
                   excess_s=sum(costs) if costs else None,
                   stretches=tuple(DisturbanceStretch(
                       first_iteration=d.first_iteration, last_iteration=d.last_iteration,
                       excess_s=d.capture_cost_s, inside_incident=d.evidence.inside_incident)
                       for d in ds))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """The whole-run summary of a run analysis: the steady state, its steady values (keyed by catalog
    attribute: ``median``; each taken as :func:`reduction` says: shares and rates time-weighted, the
    step time the mean, the rest medians), the class with its votes, stragglers, incidents, goodput and
    the step budget."""

    step_time_distribution: StepTimeDistribution | None
    n_iterations: int
    n_steady: int
    steady_first_iteration: int | None
    steady_last_iteration: int | None
    warmup_records: int
    excluded: Mapping[int, Cited]  # iteration -> why it is not steady, a code (Kind.EXCLUDED)
    excluded_kinds: Mapping[int, Exclusion]
    # the same as ranges of (kind, incident or capture): what JSON carries (steady.excluded_ranges)
    excluded_ranges: tuple[ExcludedRange, ...] = ()
    medians: Mapping[str, float | None]  # SUMMARY_METRICS -> its steady value (TIME_WEIGHTED, ...)
    step_time_cv: float | None
    tflops_check_n: int
    tflops_check_n_disagree: int
    tflops_check_max_abs_gap: float | None
    bottleneck: bn.Bottleneck
    straggler_persistent_ranks: tuple[int, ...]
    straggler_flag_fraction: Mapping[int, float]  # rank -> share of steady iterations it was flagged in
    straggler_between_stages_fraction: float | None
    straggler_compute_spread_fraction: float | None
    incidents_n: int = 0
    incidents_cost_s: float | None = None
    # perfd.analytics.incidents.detect Detection.jitter
    jitter: Mapping[str, float | None] = field(default_factory=dict)
    capture_disturbances: CaptureDisturbances = CaptureDisturbances()
    goodput: Goodput | None = None
    memory_mib: Mapping[str, float] | None = None  # the largest of each memory report value
    step_budget: StepBudget | None = None
    slow_steps: beat.SlowSteps | None = None  # a jitter's slow steps, their cost and period (steps/beat.py)
    # The job's runs: the current one, whose figures these are, the earlier runs' digests (steps/runs.py)
    runs: Runs = field(default_factory=Runs)
    arming: ArmingCost | None = None  # what running armed (under ncu) cost the current run's steps
    # the loop's own pauses at a cadence (perfd.analytics.incidents.cadence): neither incidents nor jitter
    pauses: tuple[CadencePause, ...] = ()

    def median(self, name: str) -> float | None:
        """The steady value of summary metric ``name`` (an IterationResult attribute); None when absent."""
        return self.medians.get(name)

    def to_json(self) -> dict[str, Any]:
        dist = self.step_time_distribution
        return {
            "step_time_distribution_ms": dist.to_json() if dist is not None else None,
            "n_iterations": self.n_iterations,
            "n_steady": self.n_steady,
            "steady_first_iteration": self.steady_first_iteration,
            "steady_last_iteration": self.steady_last_iteration,
            "warmup_records": self.warmup_records,
            "excluded": [r.to_json() for r in self.excluded_ranges],
            # The key is the API's since its first version; ``reductions`` says how each value was taken.
            "medians": dict(self.medians),
            "reductions": {k: reduction(k).value for k in self.medians},
            "step_time_cv": self.step_time_cv,
            "slow_steps": self.slow_steps.to_json() if self.slow_steps is not None else None,
            "tflops_check_n": self.tflops_check_n,
            "tflops_check_n_disagree": self.tflops_check_n_disagree,
            "tflops_check_max_abs_gap": self.tflops_check_max_abs_gap,
            # its reason, each source's vote and where each number comes from follow it where served
            # (perfd.report.bottleneck_text.bottleneck_json, by perfd.report.row_json.run_json)
            "bottleneck": self.bottleneck.cls.value,
            "straggler_persistent_ranks": list(self.straggler_persistent_ranks),
            "straggler_flag_fraction": {str(k): v for k, v in self.straggler_flag_fraction.items()},
            "straggler_between_stages_fraction": self.straggler_between_stages_fraction,
            "straggler_compute_spread_fraction": self.straggler_compute_spread_fraction,
            "incidents_n": self.incidents_n,
            "incidents_cost_s": self.incidents_cost_s,
            "jitter": dict(self.jitter),
            "capture_disturbances": self.capture_disturbances.to_json(),
            "goodput": self.goodput.to_json() if self.goodput is not None else None,
            "memory_mib": dict(self.memory_mib) if self.memory_mib is not None else None,
            "step_budget": self.step_budget.to_json() if self.step_budget is not None else None,
            "runs": self.runs.to_json(),
            "arming": self.arming.to_json() if self.arming is not None else None,
            "pauses": [c.to_json() for c in self.pauses],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class JobLayout(JsonWritten):
    """The job's parallel layout as its sources stated it (perfd.core.model.ParallelLayout, in its field
    order), the world size resolved and the micro-batches per iteration derived."""

    world_size: int | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    vpp: int | None = None
    micro_batch_size: int | None = None
    global_batch_size: int | None = None
    num_microbatches: int | None = None
    microbatches: int | None = None

    @classmethod
    def of(cls, lay: ParallelLayout, world: int | None) -> JobLayout:
        return cls(**{**dataclasses.asdict(lay), "world_size": world, "microbatches": lay.microbatches()})

    @classmethod
    def from_json(cls, d: object) -> JobLayout:
        if not isinstance(d, Mapping):
            return cls()
        return cls(**{f.name: d.get(f.name) for f in dataclasses.fields(cls)})


def _name(c: Cited | None) -> str | None:
    return c.code.name if c is not None else None


# JobGpu's fields that hold codes: sentences in the JSON as served, not read back.
_WORDED = ("dtype_source", "peak_source", "peak_reason")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobGpu:
    name: str | None = None  # as the job's GPU reported it
    model: str | None = None  # the model its peak was looked up as
    dtype: str | None = None
    # where the dtype and the peak come from, or why there is none: codes, worded where shown
    # (report.row_json.job_json)
    dtype_source: Cited | None = None
    peak_tflops: float | None = None
    peak_source: Cited | None = None
    peak_reason: Cited | None = None
    measured_ceiling_tflops: float | None = None
    memory_mib: float | None = None

    @classmethod
    def from_json(cls, d: object) -> JobGpu:
        """Back from the JSON as served: its ``dtype_source``, ``peak_source`` and ``peak_reason`` are
        sentences there, not read back (a page made from that JSON shows its report, already worded)."""
        if not isinstance(d, Mapping):
            return cls()
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)
                      if f.name in d and f.name not in _WORDED})

    def to_json(self) -> dict[str, str | float | None]:
        """``dtype_source``, ``peak_source`` and ``peak_reason`` as their codes' names: the edge that
        serves them words them in their places."""
        return {"name": self.name, "model": self.model, "dtype": self.dtype,
                "dtype_source": _name(self.dtype_source), "peak_tflops": self.peak_tflops,
                "peak_source": _name(self.peak_source), "peak_reason": _name(self.peak_reason),
                "measured_ceiling_tflops": self.measured_ceiling_tflops, "memory_mib": self.memory_mib}


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFlops:
    """The model's FLOPs per iteration at the job's global batch (perfd.analytics.steps.flops.FlopsResult)."""

    per_iteration: float | None = None
    formula: str | None = None
    source: str | None = None
    missing: tuple[str, ...] = ()
    notes: tuple[Cited, ...] = ()  # codes (FlopsResult.notes), worded where shown
    breakdown: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobBlock:
    """The job a run analysis is of: its name, framework, layout, model, GPU and FLOPs."""

    name: str | None = None
    framework: str | None = None
    framework_version: str | None = None
    device: Device | None = None  # where it computes (perfd.core.model.JobInfo.device): "cpu", "cuda",
                                  # unknown
    torch_version: str | None = None
    timing_log_option: str | None = None
    log_interval: int | None = None
    wandb_run_id: str | None = None
    layout: JobLayout = JobLayout()
    model: ModelSpec = field(default_factory=ModelSpec)
    gpu: JobGpu = JobGpu()
    flops: JobFlops = JobFlops()

    def to_json(self) -> dict[str, Any]:
        fl = self.flops
        return {
            "name": self.name,
            "framework": self.framework,
            "framework_version": self.framework_version,
            "device": self.device,
            "torch_version": self.torch_version,
            "timing_log_option": self.timing_log_option,
            "log_interval": self.log_interval,
            "wandb_run_id": self.wandb_run_id,
            "layout": self.layout.to_json(),
            "model": dataclasses.asdict(self.model),
            "gpu": self.gpu.to_json(),
            "flops_per_iteration": fl.per_iteration,
            "flops_formula": fl.formula,
            "flops_source": fl.source,
            "flops_missing": list(fl.missing),
            "flops_notes": [n.code.name for n in fl.notes],  # worded where served (report.row_json)
            "flops_breakdown": dict(fl.breakdown),
        }

    @classmethod
    def from_json(cls, d: object) -> JobBlock:
        """Back from to_json, for a block read as JSON (the aggregator's answer): what it lacks is
        left unknown."""
        if not isinstance(d, Mapping):
            return cls()
        spec = d["model"] if isinstance(d.get("model"), Mapping) else {}
        known = {f.name for f in dataclasses.fields(ModelSpec)}
        return cls(
            name=d.get("name"), framework=d.get("framework"), framework_version=d.get("framework_version"),
            device=d.get("device") if d.get("device") in DEVICES else None,
            torch_version=d.get("torch_version"), timing_log_option=d.get("timing_log_option"),
            log_interval=d.get("log_interval"), wandb_run_id=d.get("wandb_run_id"),
            layout=JobLayout.from_json(d.get("layout")),
            model=ModelSpec(**{k: v for k, v in spec.items() if k in known}),
            gpu=JobGpu.from_json(d.get("gpu")),
            flops=JobFlops(per_iteration=d.get("flops_per_iteration"), formula=d.get("flops_formula"),
                           source=d.get("flops_source"), missing=tuple(d.get("flops_missing") or ()),
                           # its notes: sentences as served, not read back (as JobGpu's sources)
                           breakdown=dict(d.get("flops_breakdown") or {})))

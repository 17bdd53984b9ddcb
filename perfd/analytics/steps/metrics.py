"""Per-iteration metrics over one step record: throughput, MFU, data-loading and exposed
communication shares (docs/design.md §2). Pure functions; every result names its source.

Phases are read through the record's source vocabulary (perfd.analytics.steps.vocabulary.Vocabulary):
Megatron's timers, the step hook's data wait, ... Timer values are per-iteration means over the
source's interval (Megatron's log interval, one step for the hook), in ms, like the step time they
are divided by.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfd.analytics.common import finite, record_source, timer_max
from perfd.analytics.steps.gpus import PeakResult
from perfd.analytics.steps.provenance import Code, Measured, cite
from perfd.analytics.steps.vocabulary import vocabulary_of
from perfd.core.model import Provenance, StepRecord

# Megatron prints its throughput with one decimal: allow for that rounding in the cross-check.
LOGGED_TFLOPS_RESOLUTION = 0.05
CROSSCHECK_REL_TOLERANCE = 0.01


@dataclass(frozen=True)
class LoggedThroughput:
    """A framework's own throughput figure, and how far perfd's may be from it."""

    source: str  # what the log line calls it
    rel_tolerance: float
    resolution: float  # half the last printed digit


# Per framework. torchtitan: 2% — its FLOPs count includes 6·(norm weights) per token, which no
# GEMM performs, and its time is the span between two log calls, perfd's the span between the
# lines' arrival; it prints two decimals.
LOGGED_THROUGHPUT: dict[str, LoggedThroughput] = {
    "megatron": LoggedThroughput("megatron: throughput per GPU (TFLOP/s/GPU)", CROSSCHECK_REL_TOLERANCE,
                                 LOGGED_TFLOPS_RESOLUTION),
    "torchtitan": LoggedThroughput("torchtitan: tflops (per device)", 0.02, 0.005),
}


def logged_throughput_source(framework: str) -> str:
    known = LOGGED_THROUGHPUT.get(framework)
    return known.source if known else f"{framework}: logged throughput per GPU"


def throughput_per_gpu(
    flops_per_iteration: float | None,
    step_time_ms: float | None,
    world_size: int | None,
    flops_source: Provenance | None = None,
) -> Measured:
    """Achieved model TFLOP/s per GPU = FLOPs ÷ (step seconds · 1e12 · world size)."""
    missing = tuple(n for n, x in (("model FLOPs", flops_per_iteration), ("step time", step_time_ms),
                                   ("world size", world_size)) if x is None)
    if missing:
        return Measured.absent(Code.MISSING, missing)
    assert flops_per_iteration is not None and step_time_ms is not None and world_size is not None
    if step_time_ms <= 0 or world_size <= 0:
        return Measured.absent(Code.NON_POSITIVE, step_time_ms, world_size)
    value = flops_per_iteration / (step_time_ms / 1e3 * 1e12 * world_size)
    what = flops_source.detail if flops_source else "model FLOPs"
    return Measured(value, cite(Code.THROUGHPUT, world_size, what))


def mfu(tflops_per_gpu: Measured, peak: PeakResult) -> Measured:
    """MFU as a ratio in [0, 1] (not percent): achieved TFLOP/s per GPU ÷ peak dense TFLOP/s."""
    if tflops_per_gpu.value is None:
        return Measured.absent_as(tflops_per_gpu.cite)
    if peak.peak_tflops is None:
        return Measured.absent_as(peak.reason if peak.reason is not None else cite(Code.PEAK_UNKNOWN))
    src = peak.source.args[0] if peak.source else cite(Code.PEAK_VALUE, peak.peak_tflops)  # its detail
    return Measured(tflops_per_gpu.value / peak.peak_tflops, cite(Code.MFU, src))


@dataclass(frozen=True)
class CrossCheck:
    """perfd's throughput against the framework's logged figure."""

    model_tflops: float | None
    logged_tflops: float | None
    rel_gap: float | None  # (model - logged) / logged
    tolerance: float | None  # max(1%, rounding of the logged figure)
    agrees: bool | None  # None when either side is absent


def crosscheck_tflops(model_tflops: float | None, logged_tflops: float | None,
                      framework: str = "megatron") -> CrossCheck:
    """Relative gap; beyond max(tolerance, resolution/logged) it disagrees (Megatron: 1%, and it
    rounds to 0.1; torchtitan: LOGGED_THROUGHPUT)."""
    if model_tflops is None or logged_tflops is None or logged_tflops <= 0:
        return CrossCheck(model_tflops, logged_tflops, None, None, None)
    known = LOGGED_THROUGHPUT.get(framework, LOGGED_THROUGHPUT["megatron"])
    gap = (model_tflops - logged_tflops) / logged_tflops
    tol = max(known.rel_tolerance, known.resolution / logged_tflops)
    return CrossCheck(model_tflops, logged_tflops, gap, tol, abs(gap) <= tol)


def data_share(rec: StepRecord) -> Measured:
    """Data wait (max across ranks) ÷ step time: Megatron's batch-generator timer, the hook's data
    wait. >0.2 bottleneck, <0.05 healthy."""
    voc = vocabulary_of(rec)
    name = next((n for n in voc.data_wait if n in rec.timers), None)
    wait = timer_max(rec.timers.get(name)) if name is not None else None
    if name is None or wait is None:
        return Measured.absent(voc.data_wait_absent)
    step = finite(rec.step_time_ms)
    if step is None or step <= 0:
        return Measured.absent(Code.NO_STEP_TIME)
    return Measured(wait / step, cite(Code.TIMER_SHARE, voc.source, name, voc.across_ranks, wait, step,
                                      record_source(rec)))


def outside_share(rec: StepRecord) -> Measured:
    """Host time between the steps that was neither a data fetch nor an announced pause (the step
    hook's ``outside-step``, max across ranks) ÷ step time: logging, an evaluation or a loader the
    hook does not see, time the job spends that no step names."""
    voc = vocabulary_of(rec)
    name = next((n for n in voc.outside if n in rec.timers), None)
    took = timer_max(rec.timers.get(name)) if name is not None else None
    if name is None or took is None:
        return Measured.absent(voc.outside_absent)
    step = finite(rec.step_time_ms)
    if step is None or step <= 0:
        return Measured.absent(Code.NO_STEP_TIME)
    return Measured(took / step, cite(Code.TIMER_SHARE, voc.source, name, voc.across_ranks, took, step,
                                      record_source(rec)))


@dataclass(frozen=True)
class CommShare:
    """Exposed communication from Megatron timers, as a share of the step.

    ``method`` says which values were summed:
    - "sum-of-max" (minmax/max timers): each timer's max across ranks, i.e. the longest any rank
      was blocked in it (it includes waiting for late peers). Maxima of different timers may come
      from different ranks (with PP they do: each stage starts different p2p timers), so the sum
      is an upper bound of any single rank's exposed communication.
    - "per-rank" (``--timing-log-option all``): per-rank sums, and the worst rank's share.
    The PP part is p2p send/recv wait; it includes waiting for the peer stage (bubble and stage
    imbalance), so it overlaps with the pipeline idle measures rather than adding to them.
    """

    total: Measured
    grad_sync: Measured  # the "DP part": grad reduce / param gather / finalize-grads all-reduces
    pp: Measured  # pipeline p2p
    timers_ms: dict[str, float] = field(default_factory=dict)  # timer -> ms used in the sum
    method: str | None = None
    worst_rank: int | None = None


def _per_rank_sums(rec: StepRecord, names: tuple[str, ...]) -> dict[int, float] | None:
    present = [rec.timers[n] for n in names if n in rec.timers]
    if not present or not all(t.per_rank for t in present):
        return None
    sums: dict[int, float] = {}
    for t in present:
        for rank, v in t.per_rank.items():
            sums[rank] = sums.get(rank, 0.0) + v
    return sums


def exposed_comm(rec: StepRecord) -> CommShare:
    """Exposed communication share (total, grad-sync/DP part, PP part) from the source's timers."""
    voc = vocabulary_of(rec)
    grad_sync_timers, pp_p2p_timers = voc.grad_sync, voc.pp_p2p
    step = finite(rec.step_time_ms)
    present = [n for n in (*grad_sync_timers, *pp_p2p_timers) if n in rec.timers]
    if not present:
        none = Measured.absent(voc.comm_absent)
        return CommShare(none, none, none)
    if step is None or step <= 0:
        none = Measured.absent(Code.NO_STEP_TIME)
        return CommShare(none, none, none)
    src = record_source(rec)
    all_names = (*grad_sync_timers, *pp_p2p_timers)
    per_rank = _per_rank_sums(rec, all_names)
    timers_ms = {n: v for n in present if (v := timer_max(rec.timers[n])) is not None}

    def part(names: tuple[str, ...], label: str) -> Measured:
        used = tuple(n for n in names if n in timers_ms)
        if not used:
            return Measured.absent(Code.NO_TIMERS, label)
        if per_rank is not None:
            sums = _per_rank_sums(rec, names)
            if sums:
                rank, worst = max(sums.items(), key=lambda kv: kv[1])
                return Measured(worst / step,
                                cite(Code.COMM_PER_RANK, voc.source, used, rank, worst, step, src))
        total_ms = sum(timers_ms[n] for n in used)
        # One timer's max is one rank's; a sum of maxima may mix ranks: the sentence says so.
        code = Code.COMM_ONE_MAX if len(used) == 1 else Code.COMM_SUM_OF_MAX
        return Measured(total_ms / step, cite(code, voc.source, used, total_ms, step, src))

    worst_rank = None
    if per_rank:
        worst_rank = max(per_rank.items(), key=lambda kv: kv[1])[0]
    return CommShare(
        total=part(all_names, "communication"),
        grad_sync=part(grad_sync_timers, "gradient-sync"),
        pp=part(pp_p2p_timers, "pipeline p2p"),
        timers_ms=timers_ms,
        method="per-rank" if per_rank is not None else "sum-of-max",
        worst_rank=worst_rank,
    )

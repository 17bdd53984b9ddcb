"""Bounds of the values a job states about itself, declared once (docs/reliability.md).

A model size or layout no GPU cluster could hold (``num_layers`` 10^29, ``hidden_size`` 1e308) is
not a fact about a job: it is a corrupt or hostile input, and fed to the FLOPs formula or the
pipeline estimates it costs unbounded time (Python integers grow without limit) or overflows
floats. Every source of JobInfo — the Megatron parser on the agent, the JSON decoder on the
aggregator — passes it through :func:`check_job_info`, which removes each value outside these
bounds (it becomes absent, never 0) and returns one reason per value removed, for the caller to
count. The bounds are generous: ten times beyond the largest published configurations.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import fields
from typing import cast

from perfd.core.model import (
    DEVICES,
    HOOK_IN_STEP_FIELD,
    PACKAGES,
    JobInfo,
    ModelSpec,
    ParallelLayout,
    StepRecord,
    TimerValue,
)

REASON = "value-out-of-range"  # counted as malformed:<REASON> (parser) / job_info_value (aggregator)

# Inclusive [low, high] of each integer field. Every field counts things, so 0 and below are wrong.
SPEC_BOUNDS: dict[str, tuple[int, int]] = {
    "num_layers": (1, 10_000),
    "hidden_size": (1, 1 << 20),
    "ffn_hidden_size": (1, 1 << 22),
    "num_attention_heads": (1, 1 << 16),
    "kv_channels": (1, 1 << 16),
    "num_query_groups": (1, 1 << 16),
    "seq_length": (1, 1 << 26),
    "padded_vocab_size": (1, 1 << 26),
    "vocab_size": (1, 1 << 26),
    "num_experts": (1, 1 << 16),
    "moe_router_topk": (1, 1 << 10),
    "moe_ffn_hidden_size": (1, 1 << 22),
    "moe_shared_expert_ffn_hidden_size": (1, 1 << 22),
    "moe_layer_freq": (1, 10_000),  # an int (every n-th layer) or each element of a list
    "mtp_num_layers": (1, 1_000),
    "parameter_count": (1, 10**16),
}
LAYOUT_BOUNDS: dict[str, tuple[int, int]] = {
    "world_size": (1, 1 << 22),
    "tp": (1, 1 << 16),
    "pp": (1, 1 << 16),
    "dp": (1, 1 << 22),
    "cp": (1, 1 << 16),
    "ep": (1, 1 << 16),
    "vpp": (1, 1 << 12),
    "micro_batch_size": (1, 1 << 20),
    "global_batch_size": (1, 1 << 26),
    "num_microbatches": (1, 1 << 24),
}
LOG_INTERVAL_BOUNDS = (1, 1 << 30)
MAX_TIMER_MS = 1e12
# Any one number of a serving log line (requests, tokens, tokens/s, ms): past this it is corrupt,
# and a handful of such values overflow a float sum (fsum raised OverflowError at 1.7e308).
MAX_SERVING_VALUE = 1e15  # a start-up timer longer than ~30 years is not a measurement


def in_bounds(value: object, low: int, high: int) -> bool:
    """An int (not a bool) within [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _layer_freq_ok(value: object, low: int, high: int) -> bool:
    if isinstance(value, list):
        return len(value) <= high and all(in_bounds(v, 0, 1) for v in value)
    return in_bounds(value, low, high)


def _check(obj: ModelSpec | ParallelLayout, bounds: dict[str, tuple[int, int]], where: str) -> list[str]:
    out: list[str] = []
    for f in fields(obj):
        if f.name not in bounds:
            continue
        value = getattr(obj, f.name)
        if value is None:
            continue
        low, high = bounds[f.name]
        ok = _layer_freq_ok(value, low, high) if f.name == "moe_layer_freq" else in_bounds(value, low, high)
        if not ok:
            setattr(obj, f.name, None)
            out.append(f"{where}.{f.name} {_short(value)} outside [{low}, {high}]")
    return out


def _short(value: object) -> str:
    big = isinstance(value, int) and value.bit_length() >= 200  # repr of a huge int is slow
    text = f"~2^{value.bit_length()}" if big and isinstance(value, int) else repr(value)
    return text[:80]


def check_job_info(info: JobInfo) -> list[str]:
    """Remove every value of ``info`` outside its bounds (it becomes None) and return one reason
    per value removed. Pure; cost bounded by the number of fields (and a list's length)."""
    reasons = _check(info.spec, SPEC_BOUNDS, "spec") + _check(info.layout, LAYOUT_BOUNDS, "layout")
    if info.log_interval is not None and not in_bounds(info.log_interval, *LOG_INTERVAL_BOUNDS):
        reasons.append(f"log_interval {_short(info.log_interval)} outside {list(LOG_INTERVAL_BOUNDS)}")
        info.log_interval = None
    if info.device is not None and info.device not in DEVICES:
        reasons.append(f"device {_short(info.device)} not one of {list(DEVICES)}")
        info.device = None
    for name, timer in list(info.startup_timers.items()):
        values = [timer.min_ms, timer.max_ms, *timer.per_rank.values()]
        if not all(v is None or (isinstance(v, (int, float)) and math.isfinite(v) and abs(v) <= MAX_TIMER_MS)
                   for v in values):
            reasons.append(f"startup timer {name[:80]} not a finite time")
            del info.startup_timers[name]
    bad = [k for k, v in info.packages.items() if k not in PACKAGES or not isinstance(v, str) or len(v) > 64]
    for k in bad:
        reasons.append(f"package {_short(k)} unknown or its version not a short string")
        del info.packages[k]
    if info.started_at is not None and not (isinstance(info.started_at, (int, float))
                                            and math.isfinite(info.started_at) and info.started_at >= 0):
        reasons.append(f"started_at {_short(info.started_at)} not a finite epoch time")
        info.started_at = None
    return reasons


# ---- per-step values ------------------------------------------------------------------------------
# The numbers a step record carries (a Megatron iteration line and its timer, memory and straggler
# lines; a step hook's datagram; a record over the network). Two step times of 1e308 (finite floats)
# overflowed the analysis' float sums (fsum: OverflowError), and the job's analysis failed on every
# tick. Every source passes its records through :func:`check_step_record` before
# any sum: a value outside these bounds becomes absent (never 0) and is counted as
# malformed:<STEP_REASON> (parser, hook) or step_value (aggregator, perfd.core.limits.REFUSED_STEP_VALUE).
STEP_REASON = "step-value-out-of-range"
MAX_STEP_MS = 86_400_000.0  # a day: no step, and no timed part of one, lasts longer
MAX_EPOCH_S = 1e10  # the year 2286: an end time past it (or before 1970) is no clock's
# What a value computed in fp32 (or bf16/fp16) can hold: a loss, a grad norm or a loss scale past it
# is no computation's. A diverged run's nan/inf loss or grad norm is its framework's own word and
# is kept (every reader reads them through perfd.analytics.common.finite; they enter no sum).
FP32_MAX = 3.4028234663852886e38
MAX_TFLOPS_PER_GPU = 1e6  # a GPU's TFLOP/s: ~500 times the H200's dense FP8 peak
# A step's tokens (the job's, all ranks): the largest global batch times the longest sequence that
# LAYOUT_BOUNDS and SPEC_BOUNDS admit; its FLOPs: ten thousand times a frontier model's step.
MAX_TOKENS_PER_STEP = float(LAYOUT_BOUNDS["global_batch_size"][1] * SPEC_BOUNDS["seq_length"][1])
MAX_FLOPS_PER_STEP = 1e25
MAX_MEMORY_MB = float(1 << 30)  # a rank's memory report: a PiB
# Any one quantity of Megatron's straggler line (ms, W, °C, %, MHz, TFLOP/s): past it, corrupt.
MAX_STRAGGLER_VALUE = 1e9
# Inclusive [low, high] of each float field of a StepRecord; ``NONFINITE_KEPT``: where nan/inf is the
# source's statement, not corruption.
STEP_FLOAT_BOUNDS: dict[str, tuple[float, float]] = {
    "end_time": (0.0, MAX_EPOCH_S),
    "step_time_ms": (0.0, MAX_STEP_MS),
    "logged_tflops_per_gpu": (0.0, MAX_TFLOPS_PER_GPU),
    "learning_rate": (0.0, FP32_MAX),
    "lm_loss": (-FP32_MAX, FP32_MAX),
    "loss_scale": (0.0, FP32_MAX),
    "grad_norm": (0.0, FP32_MAX),
    "tokens_per_step": (0.0, MAX_TOKENS_PER_STEP),
    "flops_per_step": (0.0, MAX_FLOPS_PER_STEP),
}
NONFINITE_KEPT = frozenset({"lm_loss", "grad_norm"})
STEP_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "train_iters": (0, 1 << 50),
    "consumed_samples": (0, 1 << 62),
    "global_batch_size": LAYOUT_BOUNDS["global_batch_size"],
    # A record's counts of skipped or NaN iterations cannot exceed the iterations it covers.
    "skipped_iterations": (0, LOG_INTERVAL_BOUNDS[1]),
    "nan_iterations": (0, LOG_INTERVAL_BOUNDS[1]),
    "interval": LOG_INTERVAL_BOUNDS,
}
# Fields (text, as the source printed them) that the analysis reads as numbers.
STEP_FIELD_BOUNDS: dict[str, tuple[float, float]] = {HOOK_IN_STEP_FIELD: (0.0, MAX_STEP_MS)}


def in_range(value: object, low: float, high: float) -> bool:
    """A number (int or float, not a bool) within the finite [low, high]: so never nan or inf, which
    compare False (a comparison, not isfinite: every record's values pass here)."""
    if type(value) is not float and type(value) is not int:
        return False
    return low <= value <= high


_NUMBER_TYPES = frozenset({float, int})


def all_in_range(values: Collection[object], low: float, high: float) -> bool:
    """``all(in_range(v, low, high) for v in values)``, in loops the interpreter runs in C: a job's root
    checks every rank's timers and end of each fold it hands on (100,000 ranks a timer), where the
    generator was half of its partials' work. The same answer: every type exactly int or float; then
    min() and max(), which skip a nan past the first value (a comparison with nan is False) and give nan
    where it is the first, so within the bounds they say every other value is; then no nan (every value
    a bounded number by then: math.isnan cannot overflow)."""
    if not values:
        return True
    if not _NUMBER_TYPES.issuperset(map(type, values)):
        return False
    nums = cast("Collection[float]", values)
    return low <= min(nums) and max(nums) <= high and not any(map(math.isnan, nums))


def check_step_record(rec: StepRecord) -> list[str]:
    """Remove every value of ``rec`` outside its bounds (a field becomes None; a timer, a memory value,
    a straggler quantity, a rank's end time or a numeric text field is left out) and return one reason
    per value removed. Pure but for ``rec``; cost bounded by the record's size."""
    out: list[str] = []
    for name, (low, high) in STEP_FLOAT_BOUNDS.items():
        v = getattr(rec, name)
        if v is None or in_range(v, low, high):
            continue
        if name in NONFINITE_KEPT and isinstance(v, float) and not math.isfinite(v):
            continue
        setattr(rec, name, None)
        out.append(f"{name} {_short(v)} outside [{low:g}, {high:g}]")
    for name, (ilow, ihigh) in STEP_INT_BOUNDS.items():
        v = getattr(rec, name)
        if v is not None and not in_bounds(v, ilow, ihigh):
            setattr(rec, name, None)
            out.append(f"{name} {_short(v)} outside [{ilow}, {ihigh}]")
    bad = [t for t, tv in rec.timers.items() if not _times_ok(tv)]
    for tname in bad:
        del rec.timers[tname]
        out.append(f"timer {tname[:80]} not a time within [0, {MAX_STEP_MS:g}] ms")
    for rank, report in rec.memory_mb.items():
        for key in [k for k, v in report.items() if not in_range(v, 0.0, MAX_MEMORY_MB)]:
            value = report.pop(key)
            out.append(f"rank {rank} memory {key[:80]} {_short(value)} outside [0, {MAX_MEMORY_MB:g}] MB")
    if rec.straggler is not None:
        quantities, top = rec.straggler.quantities, MAX_STRAGGLER_VALUE
        for q in [q for q, (lo, hi) in quantities.items()
                  if not (in_range(lo.value, 0.0, top) and in_range(hi.value, 0.0, top))]:
            del quantities[q]
            out.append(f"straggler {q[:80]} outside [0, {MAX_STRAGGLER_VALUE:g}]")
    ends = rec.rank_end_times
    for rank in [] if all_in_range(ends.values(), 0.0, MAX_EPOCH_S) else \
            [r for r, t in ends.items() if not in_range(t, 0.0, MAX_EPOCH_S)]:
        when = rec.rank_end_times.pop(rank)
        out.append(f"rank {rank} end time {_short(when)} outside [0, {MAX_EPOCH_S:g}]")
    for key, (low, high) in STEP_FIELD_BOUNDS.items():
        text = rec.fields.get(key)
        if text is not None and not in_range(_number(text), low, high):
            del rec.fields[key]
            out.append(f"field {key} {text[:80]!r} not a number within [{low:g}, {high:g}]")
    return out


def _times_ok(tv: TimerValue) -> bool:
    lo, hi = tv.min_ms, tv.max_ms
    if (lo is not None and not in_range(lo, 0.0, MAX_STEP_MS)) or (
            hi is not None and not in_range(hi, 0.0, MAX_STEP_MS)):
        return False
    return all_in_range(tv.per_rank.values(), 0.0, MAX_STEP_MS)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None

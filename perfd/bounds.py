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
from dataclasses import fields

from perfd.model import DEVICES, PACKAGES, JobInfo, ModelSpec, ParallelLayout

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

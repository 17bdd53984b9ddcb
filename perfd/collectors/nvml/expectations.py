"""docs/design.md §2's GPM table as checks on per-phase medians (ratios in [0, 1]).

Used by the GPU verification script (tests/gpu/verify_nvml.py) and by the replay tests on a real
recording: a recording that does not reproduce the table is not a good demo or test input.
A check whose metric is absent (e.g. no GPM on this GPU) is reported as skipped, never as passed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    phase: str
    metric: str
    op: str  # ">=" or "<="
    bound: float
    why: str


# Measured on an H200 (docs/design.md §2): matmul 93.5 % tensor, copy 87.8 % DRAM bandwidth, tiny
# kernels 34 % NVML util but 0.04 % SM util. Bounds leave room for other GPUs and window jitter.
CHECKS: tuple[Check, ...] = (
    Check("idle", "perfd_gpu_utilization_ratio", "<=", 0.05, "idle: no kernel resident"),
    Check("idle", "perfd_gpu_sm_util_ratio", "<=", 0.05, "idle: SMs idle"),
    Check("matmul", "perfd_gpu_utilization_ratio", ">=", 0.90, "matmul: a kernel always resident"),
    Check("matmul", "perfd_gpu_tensor_util_ratio", ">=", 0.50, "matmul: tensor cores busy"),
    Check("matmul", "perfd_gpu_sm_util_ratio", ">=", 0.80, "matmul: SMs busy"),
    Check("copy", "perfd_gpu_utilization_ratio", ">=", 0.90, "copy: a kernel always resident"),
    Check("copy", "perfd_gpu_dram_bw_util_ratio", ">=", 0.50, "copy: DRAM bandwidth high"),
    Check("copy", "perfd_gpu_tensor_util_ratio", "<=", 0.05, "copy: no tensor work"),
    Check("launch", "perfd_gpu_utilization_ratio", ">=", 0.05, "launch-bound: NVML util > 0"),
    Check("launch", "perfd_gpu_sm_util_ratio", "<=", 0.05, "launch-bound: SM util ~0"),
    Check("launch", "perfd_gpu_tensor_util_ratio", "<=", 0.05, "launch-bound: no tensor work"),
)


def evaluate(medians: dict[str, dict[str, float]]) -> list[dict[str, object]]:
    """One row per check: phase, metric, bound, median (or None), status pass/fail/skipped."""
    rows: list[dict[str, object]] = []
    for c in CHECKS:
        value = medians.get(c.phase, {}).get(c.metric)
        if value is None:
            status = "skipped"
        elif (value >= c.bound) if c.op == ">=" else (value <= c.bound):
            status = "pass"
        else:
            status = "fail"
        rows.append({"phase": c.phase, "metric": c.metric, "op": c.op, "bound": c.bound, "median": value,
                     "status": status, "why": c.why})
    return rows

"""Small shared pieces of the analytics: a value with its source, timer names, timer access."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from perfd.core.model import (
    Provenance,
    StepRecord,
    TimerValue,
)
from perfd.core.model import (
    TextEnum as TextEnum,  # declared below analytics (perfd.core.model's enums use it too)
)

# Megatron timers that the CPU timeline blocks on while gradients are synchronised after the
# backward pass (finalize_model_grads and the distributed optimizer): DP grad reduce / param
# gather plus the extra all-reduces (tied embeddings across the first/last stage, TP-replicated
# layernorm grads). Old Megatron (2021-22) spelt them backward-*-all-reduce.
GRAD_SYNC_TIMERS: tuple[str, ...] = (
    "all-grads-sync",
    "params-all-gather",
    "embedding-grads-all-reduce",
    "non-tensor-parallel-grads-all-reduce",
    "layernorm-grads-all-reduce",
    "conditional-embedder-grads-all-reduce",
    "backward-params-all-reduce",
    "backward-embedding-all-reduce",
    "backward-layernorm-all-reduce",
)

# Pipeline point-to-point timers (megatron/core/pipeline_parallel/p2p_communication.py). A stage
# only starts the ones it uses: with p = 2 the first stage records forward-send,
# forward-send-backward-recv and backward-recv, the last stage the other three. They include the
# time spent waiting for the peer stage, i.e. the pipeline bubble.
PP_P2P_TIMERS: tuple[str, ...] = (
    "forward-recv",
    "forward-send",
    "backward-recv",
    "backward-send",
    "forward-send-backward-recv",
    "backward-send-forward-recv",
)

FORWARD_BACKWARD = "forward-backward"
FORWARD_COMPUTE = "forward-compute"
BACKWARD_COMPUTE = "backward-compute"
BATCH_GENERATOR = "batch-generator"
OPTIMIZER = "optimizer"


def timer_max(t: TimerValue | None) -> float | None:
    """Max across ranks (ms per iteration): max_ms, else the max of the per-rank values."""
    if t is None:
        return None
    if t.max_ms is not None:
        return t.max_ms
    if t.per_rank:
        return max(t.per_rank.values())
    return None


def timer_min(t: TimerValue | None) -> float | None:
    """Min across ranks (ms per iteration): min_ms, else the min of the per-rank values."""
    if t is None:
        return None
    if t.min_ms is not None:
        return t.min_ms
    if t.per_rank:
        return min(t.per_rank.values())
    return None


def record_source(rec: StepRecord) -> Provenance:
    """Where a step record came from, for provenance: a record without one (tests, older spools) is
    named by its job and iteration."""
    return rec.source if rec.source is not None else Provenance(rec.job, f"iteration {rec.iteration}")


def finite(x: float | None) -> float | None:
    """x, or None when x is None, NaN or infinite."""
    if x is None or not math.isfinite(x):
        return None
    return x


def median(values: Iterable[float | None]) -> float | None:
    """Median of the present, finite values; None when there are none."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(xs) if xs else None


def pp_stage_of_rank(rank: int, world_size: int | None, tp: int | None, pp: int | None,
                     dp: int | None, cp: int | None, order: str = "tp-cp-ep-dp-pp") -> int | None:
    """Pipeline stage of a global rank under Megatron's rank order (an inference on the order).

    Megatron's default order "tp-cp-ep-dp-pp" makes pp the slowest-varying coordinate
    (stage = rank // (world / pp)); ``--use-tp-pp-dp-mapping`` gives "tp-pp-dp"
    (stage = (rank // tp) % pp). Returns None when the layout is not known well enough.
    """
    if not pp or pp < 1:
        return None
    if pp == 1:
        return 0
    if order.startswith("tp-pp"):
        return (rank // tp) % pp if tp else None
    per_stage = world_size // pp if world_size else None
    if per_stage is None and tp and dp and cp:
        per_stage = tp * dp * cp
    return rank // per_stage if per_stage else None

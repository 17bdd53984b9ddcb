"""Small shared pieces of the analytics: a value with its source, timer names, timer access."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from perfd.model import (
    HOOK_COMPUTE,
    HOOK_DATA_WAIT,
    HOOK_OUTSIDE,
    Provenance,
    StepRecord,
    TimerValue,
)
from perfd.model import TextEnum as TextEnum  # declared below analytics (perfd.model's enums use it too)

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


@dataclass(frozen=True)
class Vocabulary:
    """How one source's step records say the framework-neutral phases of a step.

    The phases: the step itself (``StepRecord.step_time_ms``), data wait, compute, exposed
    communication (gradient sync and pipeline point-to-point), optimizer and pipeline idle. Each
    analysis reads a phase through the record's vocabulary, so it is named for what it measures,
    not for a framework, and a source is mapped here once. An empty tuple: the source does not
    time that phase (the metric is then absent, with ``*_absent`` saying why and where to get it).
    Flight Recorder windows are not a step source: their total communication share comes from the
    collective records (perfd.analytics.collectives.collective_analysis), whatever the step source.
    """

    source: str  # Provenance.collector of the records this vocabulary reads
    data_wait: tuple[str, ...]
    compute: tuple[str, ...]
    grad_sync: tuple[str, ...]
    pp_p2p: tuple[str, ...]
    optimizer: tuple[str, ...]
    data_wait_absent: str
    comm_absent: str
    throughput_absent: str = "the source states no throughput of its own"
    straggler_absent: str = "no straggler line: the per-rank step records only"
    # How the values across ranks are read: "max across ranks" for Megatron's minmax timers, the
    # slowest rank's value for records folded from per-rank hooks.
    across_ranks: str = "max across ranks"
    # Host time between two steps that was neither a data fetch nor an announced pause (the step
    # hook's periods hold it); a source whose step time covers the whole iteration has none to say.
    outside: tuple[str, ...] = ()
    outside_absent: str = "the source's step time covers the whole iteration"


MEGATRON_VOCABULARY = Vocabulary(
    "megatron", data_wait=(BATCH_GENERATOR,), compute=(FORWARD_COMPUTE, BACKWARD_COMPUTE),
    grad_sync=GRAD_SYNC_TIMERS, pp_p2p=PP_P2P_TIMERS, optimizer=(OPTIMIZER,),
    data_wait_absent="no batch-generator timer (needs --timing-log-level >= 1)",
    comm_absent="no communication timers in the log (needs --timing-log-level >= 1; p2p timers need "
                "level 2)",
    throughput_absent="not in the log (needs --log-throughput)",
    straggler_absent="timers only (no straggler line; needs --log-straggler)")
HOOK_VOCABULARY = Vocabulary(
    "hook", data_wait=(HOOK_DATA_WAIT,), compute=(HOOK_COMPUTE,), grad_sync=(), pp_p2p=(), optimizer=(),
    data_wait_absent="the step hook reported no data wait (iterate the loader through hook.loader(...), or "
                     "call hook.data_ready() once the batch is in)",
    comm_absent="the step hook does not time communication: the total share comes from the Flight "
                "Recorder (perfd launch --flight-recorder --fr-timing)",
    outside=(HOOK_OUTSIDE,),
    outside_absent="no time between the steps measured (the first step of a series, or a hook older than "
                   "the step period)")
TORCHTITAN_VOCABULARY = Vocabulary(
    "torchtitan", data_wait=(), compute=(), grad_sync=(), pp_p2p=(), optimizer=(),
    data_wait_absent="torchtitan's log line has no data-loading time (only its TensorBoard/W&B metrics "
                     "do): add the perfd step hook for it",
    comm_absent="torchtitan's log does not time communication: the total share comes from the Flight "
                "Recorder (perfd launch --flight-recorder --fr-timing)",
    throughput_absent="no tflops on the step line",
    straggler_absent="no straggler line: per-rank step lines ([rankN]: prefix) only")
VOCABULARIES: dict[str, Vocabulary] = {v.source: v for v in (MEGATRON_VOCABULARY, HOOK_VOCABULARY,
                                                              TORCHTITAN_VOCABULARY)}
# A job's framework (JobInfo.framework) -> the vocabulary its steps speak: a plain PyTorch job's come
# from the step hook (before, its data-loading line named Megatron's batch-generator timer).
FRAMEWORK_VOCABULARIES: dict[str, Vocabulary] = {**VOCABULARIES, "pytorch": HOOK_VOCABULARY}


def vocabulary_of(rec: StepRecord) -> Vocabulary:
    """The vocabulary of a record's source (its provenance's collector). A record without a known
    source is read as Megatron's, the one source whose records may come without provenance (tests,
    older spools), unless it carries the hook's data-wait timer."""
    if rec.source is not None and rec.source.collector in VOCABULARIES:
        return VOCABULARIES[rec.source.collector]
    return HOOK_VOCABULARY if HOOK_DATA_WAIT in rec.timers else MEGATRON_VOCABULARY


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

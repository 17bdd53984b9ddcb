"""What a remedy says, as a code and its arguments (issue 57): its action, what it costs, its notes and the
basis of its gain (perfd.analytics.advice.remedies: Advice, Gain) are :class:`Said` values, each a
:class:`Say` code and the job's own numbers and names (an option as the release spells it, the ops that
own a sync). No English here: each code's sentence is declared once where it is shown
(perfd.report.remedy_text.TEMPLATE), which also words the recommendations, the smaller remedies' finding
and the plan's items made of them. Pure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union


class Say(enum.Enum):
    """One sentence of a remedy; the comment lists its arguments, in order (a nested :class:`Said` is a
    sentence of its own, None says nothing)."""

    # Options the job's release does or does not take (remedies.flags_for).
    NOT_AN_OPTION = enum.auto()  # the option, the newest release recorded
    NOT_IN_RELEASE = enum.auto()  # the option, the job's release
    VERSION_UNKNOWN = enum.auto()  # the option, the newest release recorded
    # A gain's basis, widened and combined (remedies: with_spread, FitContext.replayed).
    SPREAD = enum.auto()  # spread ms, SPREAD_SHARE | NO_STEP, OWN_SPREAD | None
    SPREAD_SHARE = enum.auto()  # the spread's share of the step
    NO_STEP = enum.auto()
    OWN_SPREAD = enum.auto()
    WITH_SPREAD = enum.auto()  # the basis, its SPREAD
    REPLAYED = enum.auto()  # what the replay ran without, host scale, its low, high, job ms, traced ms
    REPLAY_AND_SLICES = enum.auto()  # REPLAYED, its low, high ms, the slices' basis, their low, high ms
    # Attention dropout.
    DROPOUT_BASIS = enum.auto()  # dropout ms, the removed kernels' low, high factor
    DROPOUT_COST = enum.auto()  # the job's dropout (or THE_DEFAULT)
    THE_DEFAULT = enum.auto()
    DROPOUT_REPLAYED = enum.auto()  # dropout ms, the host time's low, high factor
    DROPOUT_FLAG = enum.auto()  # the flag
    DROPOUT_SDPA = enum.auto()
    # Fused attention.
    FUSED_ATTENTION_BASIS = enum.auto()  # attention ms, TFLOP, low, high share, ceiling, fast, slow ms
    NOT_FLASH_BACKEND = enum.auto()
    FUSED_ATTENTION_INSTALL = enum.auto()  # the flags
    FUSED_ATTENTION_FLAGS = enum.auto()  # the flags
    FUSED_ATTENTION_TORCHTITAN = enum.auto()
    FUSED_ATTENTION_SDPA = enum.auto()
    # Scale-mask-softmax fusion.
    SOFTMAX_BASIS = enum.auto()  # mask and copies ms, low, high factor
    SOFTMAX_INSTALL = enum.auto()
    SOFTMAX_REMOVE = enum.auto()
    SOFTMAX_NO_EXTENSIONS = enum.auto()
    # Cross-entropy fusion.
    CE_BASIS = enum.auto()  # loss ms, passes, saved ms, low, high factor
    CE_FLAGS = enum.auto()  # the flags
    # Recomputation.
    FULL_RECOMPUTE_BASIS = enum.auto()  # layer ms, attention ms, back ms, low, high factor
    RECOMPUTE_LESS = enum.auto()
    RECOMPUTE_LESS_COST = enum.auto()  # PEAK_ROOM | None
    PEAK_ROOM = enum.auto()  # peak GiB, GPU GiB
    FREE_MEMORY = enum.auto()
    FREE_MEMORY_BASIS = enum.auto()  # attention's forward ms, attention ms
    FREE_MEMORY_COST = enum.auto()  # peak GiB, GPU GiB
    # Fused layers.
    FUSED_LAYERS_BASIS = enum.auto()  # pointwise ms, low, high factor
    TE_LAYERS_INSTALL = enum.auto()  # the flags
    TE_LAYERS = enum.auto()  # the flags
    TE_UNSHOWN = enum.auto()
    FUSED_LAYERS_TORCHTITAN = enum.auto()
    FUSED_LAYERS_COMPILE = enum.auto()
    # Bigger GEMMs.
    GEMM_BASIS = enum.auto()  # share of the ceiling, GEMM ms, ms at target, target, low, high factor
    BIGGER_GEMMS_MEGATRON = enum.auto()
    BIGGER_GEMMS = enum.auto()
    # Host synchronisations and Megatron-LM's timers.
    SYNC_BASIS = enum.auto()  # syncs a step, their owners, idle ms, low, high factor
    REMOVE_SYNCS = enum.auto()
    TIMER_BASIS = enum.auto()  # idle ms, micro-batches, low, high factor
    TIMER_REPLAYED = enum.auto()  # micro-batches
    HOST_JITTER = enum.auto()  # the basis, jitter ms, robust deviations
    TIMER_LEVEL = enum.auto()
    TIMER_COST = enum.auto()
    # The micro-batch.
    MEMORY_UNKNOWN = enum.auto()
    MEMORY_PEAK = enum.auto()  # peak GiB, new peak GiB, GPU GiB
    WITH_BUBBLE = enum.auto()  # the memory cost, stages, bubble now, bubble after, micro-batches, after
    MICRO_BATCH_BASIS = enum.auto()  # m, m/2, timers ms, low, high, launch ms, low, high, per-step ms
    MICRO_BATCH_REPLAYED = enum.auto()  # m/2, new size, m, size, kernels' low, high factor
    MICRO_BATCH = enum.auto()  # the flag, the global batch
    # CUDA graphs.
    GRAPHS_BASIS = enum.auto()  # low, high share back, launch ms, replay cost's share of the step
    GRAPHS_REPLAYED = enum.auto()  # the host time's low, high factor
    GRAPHS_FLAG = enum.auto()  # the flag
    GRAPHS_COST = enum.auto()
    GRAPHS_COMPILE = enum.auto()
    # The optimizer phase.
    FOREACH_ADAM = enum.auto()
    PER_TENSOR_ADAM = enum.auto()
    OPTIMIZER_BASIS = enum.auto()  # the Adam's kind, its ms, low, high factor, OPT_SCALE | None, OPT_LAUNCH
    OPT_SCALE = enum.auto()  # scale and copy ms, low, high factor
    OPT_LAUNCH = enum.auto()  # launch gaps ms, low, high factor
    FUSED_OPTIMIZER_INSTALL = enum.auto()  # the Adam's kind
    FUSED_OPTIMIZER_TORCHTITAN = enum.auto()
    FUSED_OPTIMIZER_TORCH = enum.auto()
    TE_APEX_UNSHOWN = enum.auto()
    GRAD_NORM_BASIS = enum.auto()  # syncs a step, idle ms, low, high, norm kernels ms, low, high factor
    GRAD_NORM = enum.auto()
    GRAD_ACCUM_BASIS = enum.auto()  # kernels ms, SIDE_STREAM | None, exposed ms, low, high factor
    SIDE_STREAM = enum.auto()  # ms on the side stream
    GRAD_ACCUM_INSTALL = enum.auto()
    GRAD_ACCUM = enum.auto()
    # Communication, data, pipeline.
    OVERLAP_BASIS = enum.auto()  # exposed ms, low, high factor
    OVERLAP_FLAGS = enum.auto()  # the flags
    OVERLAP_COST = enum.auto()
    OVERLAP_DDP = enum.auto()
    DATA_BASIS = enum.auto()  # data wait ms, low, high factor
    DATA_LOADER = enum.auto()  # the data-loading action (the incidents' too)
    DATA_KNOBS = enum.auto()  # the framework (perfd.analytics.advice.remedies.Framework value)
    PIPELINE_BASIS = enum.auto()  # pipeline wait ms, low, high factor
    PIPELINE_MEGATRON = enum.auto()
    PIPELINE = enum.auto()


Arg = Union[int, float, str, None, "Said"]


@dataclass(frozen=True, slots=True)
class Said:
    """One sentence: its code and its arguments (positional, as its template takes them)."""

    code: Say
    args: tuple[Arg, ...] = ()


def say(code: Say, *args: Arg) -> Said:
    return Said(code, args)

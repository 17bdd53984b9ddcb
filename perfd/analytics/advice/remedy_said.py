"""What a remedy says, as a code and its arguments: its action, what it costs, its notes and the
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
    """One sentence of a remedy and its arity (how many positional arguments its sentence takes,
    perfd.report.remedy_text.TEMPLATE); the comment lists them, in order (a nested :class:`Said` is a
    sentence of its own, None says nothing). The member's name is the code."""

    # Options the job's release does or does not take (remedies.flags_for).
    NOT_AN_OPTION = 2  # the option, the newest release recorded
    NOT_IN_RELEASE = 2  # the option, the job's release
    VERSION_UNKNOWN = 2  # the option, the newest release recorded
    # A gain's basis, widened and combined (remedies: with_spread, FitContext.replayed).
    SPREAD = 3  # spread ms, SPREAD_SHARE | NO_STEP, OWN_SPREAD | None
    SPREAD_SHARE = 1  # the spread's share of the step
    NO_STEP = 0
    OWN_SPREAD = 0
    WITH_SPREAD = 2  # the basis, its SPREAD
    REPLAYED = 6  # what the replay ran without, host scale, its low, high, job ms, traced ms
    REPLAY_AND_SLICES = 6  # REPLAYED, its low, high ms, the slices' basis, their low, high ms
    # Attention dropout.
    DROPOUT_BASIS = 3  # dropout ms, the removed kernels' low, high factor
    DROPOUT_COST = 1  # the job's dropout (or THE_DEFAULT)
    THE_DEFAULT = 0
    DROPOUT_REPLAYED = 3  # dropout ms, the host time's low, high factor
    DROPOUT_FLAG = 1  # the flag
    DROPOUT_SDPA = 0
    # Fused attention.
    FUSED_ATTENTION_BASIS = 7  # attention ms, TFLOP, low, high share, ceiling, fast, slow ms
    NOT_FLASH_BACKEND = 0
    FUSED_ATTENTION_INSTALL = 1  # the flags
    FUSED_ATTENTION_FLAGS = 1  # the flags
    FUSED_ATTENTION_TORCHTITAN = 0
    FUSED_ATTENTION_SDPA = 0
    FUSED_ATTENTION_HF = 0
    # Scale-mask-softmax fusion.
    SOFTMAX_BASIS = 3  # mask and copies ms, low, high factor
    SOFTMAX_INSTALL = 0
    SOFTMAX_REMOVE = 0
    SOFTMAX_NO_EXTENSIONS = 0
    # Cross-entropy fusion.
    CE_BASIS = 5  # loss ms, passes, saved ms, low, high factor
    CE_FLAGS = 1  # the flags
    FUSED_CE_BASIS = 4  # loss ms, low, high share of it saved, ZERO_GRAD_GOES | None
    ZERO_GRAD_GOES = 3  # the zero-filled gradient's ms, low, high factor
    FUSED_LINEAR_CE = 0  # a plain PyTorch loop's action
    FUSED_LINEAR_CE_HF = 0
    FUSED_CE_COST = 0
    FUSED_CE_COST_HF = 1  # the Trainer's compile option
    LOSS_ONLY_BASIS = 3  # the zero-filled gradient's ms, low, high factor
    LOSS_ONLY = 0  # a plain PyTorch loop's action
    # Recomputation.
    FULL_RECOMPUTE_BASIS = 5  # layer ms, attention ms, back ms, low, high factor
    RECOMPUTE_LESS = 0
    RECOMPUTE_LESS_COST = 1  # PEAK_ROOM | None
    PEAK_ROOM = 2  # peak GiB, GPU GiB
    FREE_MEMORY = 0
    FREE_MEMORY_BASIS = 2  # attention's forward ms, attention ms
    FREE_MEMORY_COST = 2  # peak GiB, GPU GiB
    RECOMPUTE_OFF = 0  # a plain loop's: activation checkpointing off
    RECOMPUTE_OFF_TORCHTITAN = 1  # the flag
    RECOMPUTE_OFF_HF = 1  # the flag
    RECOMPUTE_OFF_LIGHTNING = 0
    RECOMPUTE_OFF_COST = 0
    RECOMPUTE_BASIS = 4  # recomputed launches a step, their ms, the kernels' low, high factor
    RECOMPUTE_REPLAYED = 4  # launches, their ms, the host time's low, high factor
    CHECKPOINT_FORWARD = 3  # RECOMPUTE_REPLAYED, a forward launch's host µs, a backward launch's
    # Fused layers.
    FUSED_LAYERS_BASIS = 3  # pointwise ms, low, high factor
    FUSED_REPLAYED = 7  # launches, fusable launches, their ms, launches' low, high, kernels' low, high factor
    HOST_SIDE_UNMODELLED = 2  # the replay's basis, the GPU's side alone (the range's low end)
    TE_LAYERS_INSTALL = 1  # the flags
    TE_LAYERS = 1  # the flags
    TE_UNSHOWN = 0
    FUSED_LAYERS_TORCHTITAN = 1  # the flag
    FUSED_LAYERS_COMPILE = 0
    FUSED_LAYERS_HF = 2  # the flags, the Liger option
    FUSED_LAYERS_LIGHTNING = 0
    # Bigger GEMMs.
    GEMM_BASIS = 6  # share of the ceiling, GEMM ms, ms at target, target, low, high factor
    BIGGER_GEMMS_MEGATRON = 0
    BIGGER_GEMMS = 0
    BIGGER_GEMMS_HF = 2  # the batch option, the accumulation option
    BIGGER_GEMMS_LIGHTNING = 0
    BIGGER_GEMMS_TORCHTITAN = 2  # the local batch option, the global batch option
    # Host synchronisations and Megatron-LM's timers.
    SYNC_BASIS = 6  # syncs a step, their owners, idle ms, refill idle ms, low, high factor
    REMOVE_SYNCS = 0
    REMOVE_SYNCS_HF = 2  # the NaN filter's flag, the logging flag
    NAN_FILTER_COST = 0
    REMOVE_SYNCS_LIGHTNING = 1  # the Trainer's logging flag
    REMOVE_SYNCS_TORCHTITAN = 1  # the logging flag
    TIMER_BASIS = 4  # idle ms, micro-batches, low, high factor
    TIMER_REPLAYED = 1  # micro-batches
    HOST_JITTER = 3  # the basis, jitter ms, robust deviations
    TIMER_LEVEL = 0
    TIMER_COST = 0
    # The micro-batch.
    MEMORY_UNKNOWN = 0
    MEMORY_PEAK = 3  # peak GiB, new peak GiB, GPU GiB
    WITH_BUBBLE = 6  # the memory cost, stages, bubble now, bubble after, micro-batches, after
    MICRO_BATCH_BASIS = 9  # m, m/2, timers ms, low, high, launch ms, low, high, per-step ms
    MICRO_BATCH_REPLAYED = 6  # m/2, new size, m, size, kernels' low, high factor
    MICRO_BATCH = 2  # the flag, the global batch
    # ... in a plain PyTorch loop (its micro-batches counted in the trace)
    # m, m/2, tiny gaps ms, their share, longer ms, low, high, ACCUMULATE_GOES, WEIGHT_CASTS_GO, SPLITK_GO
    MICRO_BATCH_TORCH_BASIS = 10
    ACCUMULATE_GOES = 3  # AccumulateGrad ms, low, high share
    WEIGHT_CASTS_GO = 3  # the weights' and gradients' cast kernels a micro-batch, their ms a step, share
    SPLITK_GO = 3  # the split-K reductions a micro-batch, their ms a step, the share that may go
    MICRO_BATCH_TORCH_REPLAYED = 4  # m/2, m, kernels' low, high factor
    MICRO_BATCH_TORCH = 3
    MICRO_BATCH_HF = 3
    MICRO_BATCH_LIGHTNING = 3  # m, m/2, the factor
    ACTIVATION_MEMORY = 1  # the factor
    ONE_MICRO_BATCH = 1  # m
    # CUDA graphs.
    GRAPHS_BASIS = 4  # low, high share back, launch ms, replay cost's share of the step
    GRAPHS_REPLAYED = 2  # the host time's low, high factor
    GRAPHS_FLAG = 1  # the flag
    GRAPHS_COST = 0
    GRAPHS_COMPILE = 0
    GRAPHS_HF = 2  # the compile mode's flag, the compile option
    GRAPHS_LIGHTNING = 0
    GRAPHS_THIN_BASIS = 7  # host ms, device ms, their ratio, launch gaps ms, low, high share back, cost share
    GRAPHS_COMPILED = 0  # a compiled job's action
    GRAPHS_COMPILED_COST = 1  # torch.compile's graphs: GRAPHS_KEEP (or a framework's)
    # what torch.compile's graphs need of a loop that keeps a call's outputs: where the mark goes
    GRAPHS_KEEP = 0  # a plain loop's
    GRAPHS_KEEP_HF = 0
    GRAPHS_KEEP_LIGHTNING = 0
    # The optimizer phase.
    FOREACH_ADAM = 0
    PER_TENSOR_ADAM = 0
    FOREACH_OF = 1  # the optimizer's class (torch.optim's, as the trace's step annotation names it)
    PER_PARAMETER_OF = 1  # the optimizer's class
    OPTIMIZER_BASIS = 6  # the Adam's kind, its ms, low, high factor, OPT_SCALE | None, OPT_LAUNCH
    # the phase's ms, the update's kind, its ms, the class, low, high factor, OPT_LAUNCH | None
    OPTIMIZER_CLASS_BASIS = 7
    OPT_SCALE = 3  # scale and copy ms, low, high factor
    OPT_LAUNCH = 3  # launch gaps ms, low, high factor
    FUSED_OPTIMIZER_INSTALL = 1  # the Adam's kind
    FUSED_OPTIMIZER_TORCHTITAN = 0
    FUSED_OPTIMIZER_TORCH = 0
    FUSED_OPTIMIZER_CLASS = 1  # the optimizer's class
    FUSED_OPTIMIZER_HF = 1  # the flag
    FUSED_OPTIMIZER_LIGHTNING = 1  # the optimizer's class
    TE_APEX_UNSHOWN = 0
    GRAD_NORM_BASIS = 7  # syncs a step, idle ms, low, high, norm kernels ms, low, high factor
    GRAD_NORM = 0
    GRAD_ACCUM_BASIS = 5  # kernels ms, SIDE_STREAM | None, exposed ms, low, high factor
    SIDE_STREAM = 1  # ms on the side stream
    GRAD_ACCUM_INSTALL = 0
    GRAD_ACCUM = 0
    # Communication, data, pipeline.
    OVERLAP_BASIS = 3  # exposed ms, low, high factor
    OVERLAP_FLAGS = 1  # the flags
    OVERLAP_COST = 0
    OVERLAP_DDP = 0
    OVERLAP_HF = 2  # the unused-parameters flag, the bucket flag
    OVERLAP_LIGHTNING = 0
    DATA_BASIS = 3  # data wait ms, low, high factor
    DATA_REPLAYED = 3  # the training thread's fetches ms a step, low, high factor left
    DATA_LOADER = 0  # the data-loading action (the incidents' too)
    DATA_KNOBS = 1  # the framework (perfd.analytics.advice.remedies.Framework value)
    PIPELINE_BASIS = 3  # pipeline wait ms, low, high factor
    PIPELINE_MEGATRON = 0
    PIPELINE = 0

    arity: int

    def __new__(cls, arity: int) -> Say:
        # Numbered in declaration order (codes of one arity are still distinct members).
        obj = object.__new__(cls)
        obj._value_ = len(cls.__members__) + 1
        obj.arity = arity
        return obj


Arg = Union[int, float, str, None, "Said"]


@dataclass(frozen=True, slots=True)
class Said:
    """One sentence: its code and its arguments (positional, as its template takes them)."""

    code: Say
    args: tuple[Arg, ...] = ()


def say(code: Say, *args: Arg) -> Said:
    return Said(code, args)

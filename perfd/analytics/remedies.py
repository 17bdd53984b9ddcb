"""What to do about each part of a step's budget, per framework: the one declared catalogue of
remedies (issue "why not closer to the limit", item 3). Pure data plus the gain arithmetic.

A remedy is keyed by the budget part it acts on (perfd.analytics.budget.Part) and the job's
framework (:class:`Framework`: Megatron-LM's real flags; the PyTorch equivalents for the step hook,
torchtitan and Hugging Face / Lightning jobs). ``removes`` is the share of that part's time the remedy
typically takes away, with why; the expected gain derived from it is an upper bound said as "up to"
(:func:`gain`). Nothing here reads a budget: perfd.analytics.budget_findings decides which remedies a
job's measured budget calls for.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfd.analytics.budget import Part
from perfd.analytics.common import TextEnum
from perfd.analytics.verdict_text import DATA_LOADING_ACTION


class Framework(TextEnum):
    MEGATRON = "megatron"
    PYTORCH = "pytorch"  # the step hook (plain loops, Hugging Face Trainer, Lightning)
    TORCHTITAN = "torchtitan"

    @staticmethod
    def of(name: str | None) -> Framework:
        """A JobInfo.framework value; any other framework gets the PyTorch remedies."""
        try:
            return Framework(str(name))
        except ValueError:
            return Framework.PYTORCH


@dataclass(frozen=True)
class Remedy:
    action: str
    removes: float  # the share of the part's time it typically takes away (an upper bound's basis)
    why: str  # where that share comes from
    how: str = ""  # the framework's own knobs, where the action is said the same for every framework


_FUSED_ATTENTION = ("FlashAttention computes QKᵀ, the mask, softmax, dropout and ·V in one kernel without "
                    "writing the s×s score matrix: the unfused kernels' time mostly goes")
_FUSED_OPTIMIZER = ("a fused (multi-tensor) Adam updates every parameter in a few kernels instead of one "
                    "chain of elementwise kernels per parameter group")
_FUSION = "fusing elementwise chains writes each activation once instead of once per operation"
_LAUNCH = "CUDA graphs replay the step's kernels without the host launching each one"
_SYNC = "the GPU stops waiting on the host once nothing in the step forces a synchronisation"
_OVERLAP = "the reduce runs behind the backward pass instead of after it"
_DATA = "with enough workers and prefetch the next batch is ready when the step ends"
_MEMCPY = ("copies of whole tensors on the device are pure memory traffic; which code issues them decides "
           "whether they can go (a capture with CPU ops names the callers)")

REMEDIES: dict[Part, dict[Framework, Remedy]] = {
    Part.ATTENTION: {
        Framework.MEGATRON: Remedy(
            "Fuse attention: Transformer Engine with flash attention (--transformer-impl transformer_engine "
            "--attention-backend flash); without TE, at least --masked-softmax-fusion (the fused "
            "scale-mask-softmax kernel)", 0.8, _FUSED_ATTENTION),
        Framework.PYTORCH: Remedy(
            "Use torch.nn.functional.scaled_dot_product_attention (FlashAttention / cuDNN backends) instead "
            "of an explicit softmax(QKᵀ)·V with a masked fill", 0.8, _FUSED_ATTENTION),
        Framework.TORCHTITAN: Remedy(
            "Use SDPA or flex attention in the model (torchtitan's own models do): the custom attention "
            "here runs softmax as kernels of its own", 0.8, _FUSED_ATTENTION),
    },
    Part.OPTIMIZER: {
        Framework.MEGATRON: Remedy(
            "A fused optimizer: install Apex or Transformer Engine so Megatron uses FusedAdam (it falls back "
            "to torch's per-tensor kernels without them); with DP > 1 add --use-distributed-optimizer",
            0.7, _FUSED_OPTIMIZER),
        Framework.PYTORCH: Remedy("torch.optim.AdamW(params, fused=True) (or foreach=True)", 0.7,
                                  _FUSED_OPTIMIZER),
        Framework.TORCHTITAN: Remedy("--optimizer.implementation fused", 0.7, _FUSED_OPTIMIZER),
    },
    Part.POINTWISE: {
        Framework.MEGATRON: Remedy(
            "Fuse the pointwise work: Transformer Engine layers (--transformer-impl transformer_engine), "
            "--bias-gelu-fusion / --bias-swiglu-fusion, --bias-dropout-fusion, persistent layer norm, "
            "--gradient-accumulation-fusion", 0.5, _FUSION),
        Framework.PYTORCH: Remedy("torch.compile the model (fuses elementwise and normalisation chains)",
                                  0.5, _FUSION),
        Framework.TORCHTITAN: Remedy("--compile.enable (torch.compile the model)", 0.5, _FUSION),
    },
    Part.MEMCPY: {
        Framework.MEGATRON: Remedy(
            "Find what issues the device-to-device copies (a Kineto capture with CPU ops names the "
            "aten::copy_ callers): same-dtype .copy_()/.contiguous()/.clone(); without Apex/TE Megatron "
            "copies gradients and parameters tensor by tensor (--gradient-accumulation-fusion needs them)",
            0.5, _MEMCPY),
        Framework.PYTORCH: Remedy(
            "Find what issues the copies (a Kineto capture with CPU ops names the aten::copy_ callers): "
            ".contiguous()/.clone()/.to() in the step; host copies: pin_memory and non_blocking=True",
            0.5, _MEMCPY),
        Framework.TORCHTITAN: Remedy(
            "Find what issues the copies (a Kineto capture with CPU ops names the aten::copy_ callers)",
            0.5, _MEMCPY),
    },
    Part.COMM_EXPOSED: {
        Framework.MEGATRON: Remedy(
            "Overlap communication with compute: --overlap-grad-reduce --overlap-param-gather with "
            "--use-distributed-optimizer (and a larger --ddp-bucket-size)", 0.7, _OVERLAP),
        Framework.PYTORCH: Remedy(
            "Overlap communication: DDP buckets overlap with backward by default (check no_sync and "
            "find_unused_parameters); FSDP: backward_prefetch and forward_prefetch", 0.6, _OVERLAP),
        Framework.TORCHTITAN: Remedy(
            "Overlap communication: FSDP2 prefetch, --parallelism.fsdp_reshard_after_forward; async TP",
            0.6, _OVERLAP),
    },
    Part.IDLE_SHORT: {
        Framework.MEGATRON: Remedy(
            "Cut launch overhead: CUDA graphs (--enable-cuda-graph with Transformer Engine) and a larger "
            "--micro-batch-size (fewer, bigger kernels)", 0.8, _LAUNCH),
        Framework.PYTORCH: Remedy(
            "Cut launch overhead: torch.compile(mode=\"reduce-overhead\") (CUDA graphs) and a larger batch "
            "per step", 0.8, _LAUNCH),
        Framework.TORCHTITAN: Remedy("Cut launch overhead: --compile.enable and a larger local batch", 0.8,
                                     _LAUNCH),
    },
    Part.IDLE_LONG: {
        Framework.MEGATRON: Remedy(
            "Remove host waits from the step: --timing-log-level 2 and --log-interval 1 synchronise the "
            "device every step (keep them for diagnosis, not production); no .item()/print in custom "
            "code", 0.7, _SYNC),
        Framework.PYTORCH: Remedy(
            "Remove host waits from the step: .item(), .cpu(), printing tensors, torch.cuda.synchronize(); "
            "log every N steps", 0.7, _SYNC),
        Framework.TORCHTITAN: Remedy("Remove host waits from the step: a larger --metrics.log_freq", 0.7,
                                     _SYNC),
    },
    Part.DATA: {  # one action (an incident's verdict says the same), the framework's knobs in ``how``
        Framework.MEGATRON: Remedy(DATA_LOADING_ACTION, 0.9, _DATA, "Megatron-LM: --num-workers"),
        Framework.PYTORCH: Remedy(DATA_LOADING_ACTION, 0.9, _DATA,
                                  "DataLoader(num_workers=N, pin_memory=True, prefetch_factor=4, "
                                  "persistent_workers=True)"),
        Framework.TORCHTITAN: Remedy(DATA_LOADING_ACTION, 0.9, _DATA, "torchtitan: more data-loader workers"),
    },
    Part.PIPELINE: {
        Framework.MEGATRON: Remedy(
            "Shrink the pipeline wait: more micro-batches per iteration (a larger --global-batch-size or "
            "a smaller --micro-batch-size), interleaved stages (--num-layers-per-virtual-pipeline-stage), "
            "or rebalance layers between stages (--decoder-last-pipeline-num-layers)", 0.5,
            "the 1F1B bubble is (p−1)/(m+p−1): it halves as the micro-batches double"),
        Framework.PYTORCH: Remedy("Shrink the pipeline wait: more micro-batches per step, an interleaved "
                                  "schedule, balanced stages", 0.5,
                                  "the 1F1B bubble is (p−1)/(m+p−1): it halves as the micro-batches double"),
        Framework.TORCHTITAN: Remedy(
            "Shrink the pipeline wait: more microbatches (--parallelism.pipeline_parallel_microbatch_size), "
            "an interleaved schedule (Interleaved1F1B)", 0.5,
            "the 1F1B bubble is (p−1)/(m+p−1): it halves as the micro-batches double"),
    },
    Part.GEMM: {  # only called for when the GEMMs run far below the ceiling (budget_findings)
        Framework.MEGATRON: Remedy(
            "Bigger GEMMs: a larger --micro-batch-size, hidden and FFN sizes multiples of 128; FP8 "
            "(Transformer Engine --fp8-format hybrid) doubles the peak", 0.5,
            "GEMM efficiency rises with the size of the matrices"),
        Framework.PYTORCH: Remedy("Bigger GEMMs: a larger batch per step, dimensions multiples of 128", 0.5,
                                  "GEMM efficiency rises with the size of the matrices"),
        Framework.TORCHTITAN: Remedy("Bigger GEMMs: a larger local batch; Float8 training (--float8)", 0.5,
                                     "GEMM efficiency rises with the size of the matrices"),
    },
}


def remedy(part: Part, framework: Framework) -> Remedy | None:
    by = REMEDIES.get(part)
    return None if by is None else by.get(framework) or by.get(Framework.PYTORCH)


def gain(step_ms: float, part_ms: float, removes: float, mfu: float | None) -> tuple[float, float | None]:
    """(ms per step saved, MFU afterwards) if ``removes`` of ``part_ms`` goes: MFU scales with 1/step
    (the same FLOPs in less time). An upper bound: the remedy's typical share, said as "up to"."""
    saved = max(0.0, min(part_ms * removes, step_ms))
    after = mfu * step_ms / (step_ms - saved) if mfu is not None and step_ms - saved > 0 else None
    return saved, after

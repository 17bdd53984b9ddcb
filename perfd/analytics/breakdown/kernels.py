"""GPU kernel categories from kernel names (capture analysis, docs/design.md §3 "Captures").

A capture lists thousands of kernels by name; a person needs the few categories that say what the
GPU spent its time on: matrix multiplies, attention, pointwise work, normalisation, reductions, the
optimizer, and NCCL by operation. Names come from cuBLAS/cuBLASLt (``nvjet_*``, ``*gemm*``,
``*xmma*``), CUTLASS, FlashAttention / cuDNN attention, PyTorch's ATen kernels
(``vectorized_elementwise_kernel``, ``reduce_kernel``, ``softmax_warp_forward``, ...), Apex /
Transformer Engine, and NCCL (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``). The order of the
checks matters (an attention kernel may contain "gemm"; ``multi_tensor_apply`` contains "tensor"),
so it is written out here once. No library does this for ATen/NCCL names, hence by hand.

ATen's kernel names carry the C++ lambdas they were instantiated with (ncu spells them
``[lambda() (instance 2)]``) (``masked_fill_kernel(...)::
{lambda()#1}::operator()``); those fragments are cut before matching, or "lambda" would read as the
LAMB optimizer: on a real H100 Megatron-LM capture that made a masked fill, a dropout scale, GELU
and a bf16 copy "optimizer" kernels (25% of the kernel time, against the 5% Megatron's own
optimizer timer measured). "hadamard" goes too (it holds "adam").
"""

from __future__ import annotations

import functools
import re

GEMM = "gemm"
ATTENTION = "attention"
ELEMENTWISE = "elementwise"
NORMALIZATION = "normalization"
REDUCTION = "reduction"
OPTIMIZER = "optimizer"
MEMCPY = "memcpy"  # copies and memsets (timeline events of their own, not kernels)
OTHER = "other"
NCCL_PREFIX = "nccl:"  # NCCL kernels: "nccl:" + operation (allreduce, allgather, sendrecv, ...)

CATEGORIES: tuple[str, ...] = (GEMM, ATTENTION, ELEMENTWISE, NORMALIZATION, REDUCTION, OPTIMIZER, MEMCPY,
                               OTHER)
NCCL_OPS: tuple[str, ...] = ("allreduce", "allgather", "reducescatter", "sendrecv", "broadcast", "reduce",
                             "alltoall")

_OPTIMIZER = ("multi_tensor", "adam", "sgd_", "lamb", "adagrad", "fused_optimizer")
_ATTENTION = ("flash", "fmha", "attention", "attn", "softmax", "sdpa", "mha_", "scaled_dot")
_NORMALIZATION = ("layer_norm", "layernorm", "rms_norm", "rmsnorm", "batch_norm", "batchnorm",
                  "group_norm", "ln_fwd", "ln_bwd", "norm_kernel")
_GEMM = ("gemm", "nvjet", "xmma", "cutlass", "cublas", "matmul", "splitkreduce", "s884", "s1688",
         "h884", "h1688", "hmma", "wgmma", "sm90_", "sm80_", "ampere_", "volta_", "turing_")
_REDUCTION = ("reduce_kernel", "reduce_", "reduction", "_sum_", "argmax", "cross_entropy", "nll_loss",
              "norm_", "topk", "cumsum")
_ELEMENTWISE = ("elementwise", "dropout", "gelu", "silu", "swiglu", "relu", "bias", "add_", "mul_",
                "copy", "fill", "index", "cat", "where", "cast", "rope", "rotary", "masked", "clamp",
                "pow", "tanh", "exp", "scatter", "gather")


def nccl_op(name: str) -> str:
    """The NCCL operation of a kernel name (``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` ->
    ``allreduce``); "other" for one this table does not know."""
    low = name.lower().replace("_", "")
    for op in ("reducescatter", "allreduce", "allgather", "sendrecv", "broadcast", "alltoall"):
        if op in low:
            return op
    return "reduce" if "reduce" in low else "other"


_LAMBDA = re.compile(r"\{lambda\([^{}]*\)#\d+\}|\[lambda\([^\[\]]*\) \(instance \d+\)\]|lambda|hadamard")


def _matchable(name: str) -> str:
    """The name lower-cased, without C++ lambda fragments (see the module doc)."""
    return _LAMBDA.sub("", name.lower())


# Distinct kernel names a function of the name alone keeps its answer for (here and in
# perfd.analytics.ncu.join). A trace's launches repeat a few hundred names: the H100 Megatron-LM
# recording's ~110,000 launches made its analysis scan the same names again, launch by launch.
NAMES_CACHED = 4096


@functools.lru_cache(maxsize=NAMES_CACHED)
def category(name: str) -> str:
    """The category of one kernel name (see the module doc for the order of the checks)."""
    low = _matchable(name)
    if "nccl" in low:
        return NCCL_PREFIX + nccl_op(name)
    for cat, keys in ((OPTIMIZER, _OPTIMIZER), (ATTENTION, _ATTENTION), (NORMALIZATION, _NORMALIZATION),
                      (GEMM, _GEMM), (REDUCTION, _REDUCTION), (ELEMENTWISE, _ELEMENTWISE)):
        if any(k in low for k in keys):
            return cat
    return OTHER


# The loss's log-softmax over the logits (PyTorch's cunn_SoftMaxForward<..., LogSoftMaxForwardEpilogue>,
# Inductor's triton_..._log_softmax_...): a softmax kernel that is no attention's, in every job with a
# cross-entropy, fused attention or not (nanoGPT's and the Trainer's on cuDNN's SDPA read as unfused).
_LOG_SOFTMAX = ("log_softmax", "logsoftmax")


def is_softmax(name: str) -> bool:
    """Softmax as a kernel of its own: attention computed unfused (QKᵀ, softmax, ·V apart); the loss's
    log-softmax is not attention's."""
    low = name.lower()
    return "softmax" in low and not any(k in low for k in _LOG_SOFTMAX)


def is_mask_fill(name: str) -> bool:
    """A masked fill: in a model whose attention runs unfused (softmax kernels of its own), the step
    that applies the attention mask to the scores before the softmax (Megatron-LM's local attention
    without --masked-softmax-fusion: ``attention_scores.masked_fill_(mask, -10000.0)``)."""
    return "masked_fill" in name.lower()


# PyTorch's own layer-norm (and RMS-norm) kernels launch one block per row (aten/src/ATen/native/cuda/
# layer_norm_kernel.cu: <<<M, ...>>> with M the rows normalised): their grid's x is the rows, the
# tokens of a micro-batch (mbs x seq in Megatron-LM's [s, b, h] layout; / TP under sequence
# parallelism, / CP). Checked on the H100 traces in tests/data/captures: 8192 rows for mbs 4 x seq
# 2048, 4096 for 4 x 1024, 256 for 1 x 256. Other libraries' norms (Transformer Engine, Apex) tile
# rows differently: not listed.
ROW_NORM_KERNELS = frozenset({"vectorized_layer_norm_kernel", "RowwiseMomentsCUDAKernel",
                              "LayerNormForwardCUDAKernel", "layer_norm_grad_input_kernel",
                              "layer_norm_grad_input_kernel_vectorized"})
_ROW_NORM = re.compile(r"(?:^|[\s:])(?:" + "|".join(sorted(ROW_NORM_KERNELS)) + r")\s*(?:[<(]|$)")


def is_row_norm(name: str) -> bool:
    """A PyTorch layer-norm kernel whose grid's x counts the rows it normalises (ROW_NORM_KERNELS):
    the function itself, as Kineto and ncu spell it (namespaces, templates, parameters) or nsys's
    short name, not a kernel that merely names it in its template arguments."""
    return _ROW_NORM.search(name.split("<", 1)[0] + ("<" if "<" in name else "")) is not None

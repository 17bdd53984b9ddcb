"""Which part of a training step an op's GPU work belongs to: the one declared table of rules for
op-level attribution (issue "remedies an engineer can apply without checking", item 1). Pure data
and name matching; perfd.capture.ops applies them to a capture's op tree.

Three kinds of evidence, best first, each a table below:

- **module frames** (a Kineto capture with Python stacks: ``nn.Module: DotProductAttention_3``): the
  innermost module whose class this table knows decides — a Linear inside an attention block is a
  linear layer, everything else under core attention is attention;
- **op names** (the CPU op that launched the kernel, the ops around it, the autograd node that runs
  its backward): ``aten::layer_norm`` is normalisation, ``_VocabParallelCrossEntropy`` the loss, a
  batched matmul … softmax … batched matmul run of sibling ops is core attention (Megatron-LM's local
  attention: baddbmm, masked_fill_, softmax, dropout, bmm; an eager Hugging Face attention:
  matmul, add, softmax, dropout, matmul), ``aten::scaled_dot_product_attention`` fused attention;
- **kernel names** alone (a capture with no CPU ops): the fallback, which cannot tell attention's
  matmuls from a linear layer's (both are GEMMs) nor attention's dropout from the hidden dropout.

No library maps PyTorch / Megatron-LM op and module names onto these parts, hence by hand; the names
come from real traces (tests/data/captures/kineto_h100_megatron/ops_*) and are matched on lower case.
"""

from __future__ import annotations

import re

from perfd.analytics.breakdown import kernels as kc
from perfd.analytics.breakdown.step_parts import Part

# --- module classes (``nn.Module: <Class>_<n>``) ------------------------------------------------------
_MODULE = re.compile(r"^nn\.Module:\s*([A-Za-z0-9_.]+?)(?:_\d+)?$")
# Core attention: everything from QKᵀ to ·V (Megatron-LM local and TE, FlashAttention wrappers).
_CORE_ATTENTION = ("dotproductattention", "coreattention", "flashselfattention", "flashattention",
                   "scaleddotproduct", "fusedscalemasksoftmax", "sdpa", "flexattention")
_LINEAR = ("linear", "conv1d")  # nn.Linear, Column/RowParallelLinear, TELinear, HF GPT-2's Conv1D
_NORM = ("norm",)  # LayerNorm, RMSNorm, WrappedTorchNorm, FusedLayerNorm
_EMBEDDING = ("embedding",)
_MLP = ("mlp", "feedforward", "ffn")  # what is left inside an MLP once its linears are out: the activation


def module_class(frame_name: str) -> str | None:
    """``nn.Module: DotProductAttention_3`` → ``DotProductAttention``; None for another frame."""
    m = _MODULE.match(frame_name.strip())
    return m.group(1).rsplit(".", 1)[-1] if m else None


def module_part(cls: str) -> Part | None:
    """The part a module class decides by itself (None: it does not; look further out)."""
    low = cls.lower()
    if any(k in low for k in _CORE_ATTENTION):
        return Part.ATTENTION
    if any(k in low for k in _LINEAR):
        return Part.LINEAR
    if any(k in low for k in _NORM):
        return Part.NORM
    if any(k in low for k in _EMBEDDING):
        return Part.EMBEDDING
    return None


def is_mlp_module(cls: str) -> bool:
    low = cls.lower()
    return any(k in low for k in _MLP) and not any(k in low for k in _LINEAR)


def is_attention_block(cls: str) -> bool:
    """An attention block (projections and core attention together: SelfAttention, LlamaAttention):
    its ops outside a Linear are attention's."""
    return "attention" in cls.lower()


# --- op names ---------------------------------------------------------------------------------------
BACKWARD_UNIT = "autograd::engine::evaluate_function:"  # the autograd engine running one node
ACCUMULATE_GRAD = "accumulategrad"  # a leaf's gradient accumulated (and the hooks run on it)
OPTIMIZER_ANNOTATIONS = ("optimizer.step#", "optimizer.zero_grad#")  # torch.optim's own record_function
STEP_ANNOTATIONS = ("optimizer.step#", "profilerstep#")  # one per training step in a trace

_BATCHED_MATMUL = ("aten::bmm", "aten::baddbmm")
_MATMUL_WRAPPERS = ("aten::matmul", "aten::einsum")  # a batched matmul when a bmm runs inside
_SOFTMAX = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax", "scaledmaskedsoftmax",
            "scaleduppertriangmaskedsoftmax", "scaledsoftmax")
_FUSED_ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention",
                    "flashattn", "flash_attn", "fused_attn", "fusedattn", "flex_attention")

# Op and backward-node names (lower case) that decide a part by themselves: exact names first, then
# substrings (longer, more specific ones before the generic ones; the first match wins). Exact
# because a substring would mix them up: "bmmbackward0" (attention's) holds "mmbackward".
_EXACT: dict[str, Part] = {
    "aten::mm": Part.LINEAR, "aten::addmm": Part.LINEAR, "aten::_scaled_mm": Part.LINEAR,
    "aten::linear": Part.LINEAR, "mmbackward0": Part.LINEAR, "addmmbackward0": Part.LINEAR,
    "aten::relu": Part.ACTIVATION, "relubackward0": Part.ACTIVATION, "aten::glu": Part.ACTIVATION,
    "glubackward0": Part.ACTIVATION,
}
_SUBSTRINGS: tuple[tuple[str, Part], ...] = (
    ("crossentropy", Part.LOSS), ("cross_entropy", Part.LOSS), ("nll_loss", Part.LOSS),
    ("log_softmax", Part.LOSS), ("logsoftmax", Part.LOSS),
    ("embedding", Part.EMBEDDING),
    ("layer_norm", Part.NORM), ("layernorm", Part.NORM), ("rms_norm", Part.NORM), ("rmsnorm", Part.NORM),
    ("group_norm", Part.NORM), ("batch_norm", Part.NORM),
    ("linear", Part.LINEAR),  # aten::linear, Megatron's LinearWithGradAccumulationAndAsyncCommunication
    ("gelu", Part.ACTIVATION), ("silu", Part.ACTIVATION), ("swiglu", Part.ACTIVATION),
    ("geglu", Part.ACTIVATION),
    ("_foreach_", Part.OPTIMIZER), ("multi_tensor", Part.OPTIMIZER), ("fused_adam", Part.OPTIMIZER),
    ("_fused_sgd", Part.OPTIMIZER),
)


def is_batched_matmul(name: str) -> bool:
    return name.lower() in _BATCHED_MATMUL


def is_matmul_wrapper(name: str) -> bool:
    return name.lower() in _MATMUL_WRAPPERS


def is_softmax(name: str) -> bool:
    low = name.lower()
    return low in _SOFTMAX[:3] or any(k in low for k in _SOFTMAX[3:])


def is_fused_attention(name: str) -> bool:
    low = name.lower()
    return any(k in low for k in _FUSED_ATTENTION)


def op_part(name: str) -> Part | None:
    """The part an op (or autograd node) name decides by itself; None when it does not."""
    low = name.lower()
    if is_fused_attention(low):
        return Part.ATTENTION
    exact = _EXACT.get(low)
    if exact is not None:
        return exact
    return next((part for key, part in _SUBSTRINGS if key in low), None)


def is_optimizer_annotation(name: str) -> bool:
    low = name.lower()
    return low.startswith(OPTIMIZER_ANNOTATIONS)


def is_step_annotation(name: str) -> bool:
    return name.lower().startswith(STEP_ANNOTATIONS)


def is_profiler_step(name: str) -> bool:
    """torch.profiler's ``ProfilerStep#N``, around each step of a loop that calls ``prof.step()``."""
    return name.lower().startswith(STEP_ANNOTATIONS[1])


def is_step_mark(name: str) -> bool:
    """torch.optim's step annotation: the optimizer phase of a training step is around it."""
    return name.lower().startswith(OPTIMIZER_ANNOTATIONS[0])


# An autograd node run by the engine (Kineto: ``AddmmBackward0`` inside its evaluate_function; NVTX's
# emit_nvtx: the node's own range), a compiled region's backward (``CompiledFunctionBackward``)
_AUTOGRAD_NODE = re.compile(r"Backward\d*$")


def is_backward_range(name: str) -> bool:
    """A range of the backward pass: the engine running a node, or the node itself. A step annotation
    that holds one wraps a closure (``optimizer.step(closure)``: forward and backward inside it)."""
    return name.startswith(BACKWARD_UNIT) or _AUTOGRAD_NODE.search(name) is not None


DATA_ANNOTATIONS = ("enumerate(dataloader)",)  # torch's DataLoader iteration, as the profiler marks it


def is_data_annotation(name: str) -> bool:
    return name.lower().startswith(DATA_ANNOTATIONS)


# --- Inductor's kernels ------------------------------------------------------------------------------
# torch.compile runs a compiled region as one op (``CompiledFunction``, its backward
# ``CompiledFunctionBackward``), which names no part; Inductor names each kernel it generates after the
# aten ops it fused (``triton_red_fused__log_softmax__unsafe_view_prepare_softmax_online_view_15``). A
# fused log-softmax is the cross-entropy's: nanoGPT's compiled loss is such kernels (forward, and the
# backward's softmax − one-hot), ~10 ms a step of its H200 recording that the region's op alone left in
# "other pointwise". A kernel that fused only nll_loss_forward beside a layer norm's backward (the loss's
# scalar gradient folded into it) is not: the log-softmax is the loss's own pass over the logits.
_INDUCTOR = "triton_"
_INDUCTOR_LOSS = ("_log_softmax",)


def fused_kernel_part(name: str) -> Part | None:
    """The part an Inductor kernel's name decides where its op (a compiled region) decides none."""
    low = name.lower()
    if low.startswith(_INDUCTOR) and any(k in low for k in _INDUCTOR_LOSS):
        return Part.LOSS
    return None


# --- kernel names (the fallback) ----------------------------------------------------------------------
def kernel_part(name: str, unfused_attention: bool) -> Part:
    """The part of a kernel known by its name alone. ``unfused_attention``: the capture has softmax
    kernels of its own, so a masked fill there is the attention mask (kernels.is_mask_fill). GEMMs stay
    :data:`Part.GEMM`: a name does not say whether a matmul is attention's or a linear layer's."""
    cat = kc.category(name)
    low = name.lower()
    if cat.startswith(kc.NCCL_PREFIX):
        return Part.PIPELINE if cat == kc.NCCL_PREFIX + "sendrecv" else Part.COMM_EXPOSED
    if cat == kc.GEMM:
        return Part.GEMM
    if cat == kc.ATTENTION:
        return Part.ATTENTION
    if cat == kc.OPTIMIZER:
        return Part.OPTIMIZER
    if cat == kc.NORMALIZATION:
        return Part.NORM
    if unfused_attention and kc.is_mask_fill(name):
        return Part.ATTENTION
    if any(k in low for k in ("gelu", "silu", "swiglu", "geglu")):
        return Part.ACTIVATION
    if any(k in low for k in ("cross_entropy", "nll_loss", "log_softmax", "logsoftmax")):
        return Part.LOSS
    if "embedding" in low:
        return Part.EMBEDDING
    return Part.POINTWISE


def frame_part(name: str) -> Part | None:
    """A Python frame's part: a module class this table knows, or a function of the loss, the
    optimizer or the data-parallel gradient machinery."""
    cls = module_class(name)
    if cls is not None:
        part = module_part(cls)
        if part is None and is_mlp_module(cls):
            return Part.ACTIVATION
        return part
    path, _, func = name.partition("): ")
    low_path, low_func = path.lower(), func.lower()
    if "loss" in low_func or "cross_entropy" in low_func:
        return Part.LOSS
    if "/optimizer/" in low_path or "torch/optim/" in low_path:
        return Part.OPTIMIZER
    # the data-parallel gradient machinery (Megatron's hooks, finalize_model_grads, zero_grad_buffer),
    # not the wrapper's forward, which holds the whole model
    if ("/distributed/" in low_path or "param_and_grad_buffer" in low_path) and (
            "grad" in low_func or "hook" in low_func):
        return Part.GRAD_REDUCE
    return None

"""What the step's pointwise work is made of: each kernel of the budget's pointwise part
(perfd.analytics.breakdown.step_parts.Part.POINTWISE) told by what it computes — the cross-entropy,
GELU, a normalisation, SiLU's gating, rotary embeddings, residual adds, casts, the zero-fill of the
logits' gradient — so that the part is named for what it holds in this job (perfd.report.budget_text).
Pure: names in, a kind out; perfd.capture.op_kinds applies these rules to a trace's ops.

Three kinds of evidence, best first:

- **the op's place among its siblings** (an eager model, whose ops run one by one): a normalisation
  written out in Python is ``pow, mean, add, rsqrt, mul, mul`` (Hugging Face's LlamaRMSNorm); a rotary
  embedding ``mul, neg, cat, mul, add`` (rotate_half); the gate of a SwiGLU MLP the ``mul`` after its
  ``silu`` (:func:`sequence_kinds`); the backward of each is its forward op's;
- **a compiled kernel's name**: inductor names each kernel by the ops it fused
  (``triton_per_fused__to_copy_add_native_layer_norm_backward_view_5``) (:func:`kernel_kind`);
- **the op's own name** (``aten::to`` a cast, ``aten::add`` a residual add) (:func:`op_kind`).
"""

from __future__ import annotations

from collections.abc import Sequence

from perfd.analytics.common import TextEnum


class PointwiseKind(TextEnum):
    CROSS_ENTROPY = "cross_entropy"  # log-softmax and NLL over the logits (compiled: one fused kernel)
    GELU = "gelu"
    SILU = "silu"  # SiLU and the gate product of a SwiGLU MLP
    LAYER_NORM = "layer_norm"
    RMS_NORM = "rms_norm"
    ROTARY = "rotary"  # rotary position embeddings (their cos/sin tables too)
    RESIDUAL = "residual"  # adds: the residual stream's, a bias's
    DROPOUT = "dropout"
    CAST = "cast"  # dtype conversions (.to, autocast's copies)
    GRAD_FILL = "grad_fill"  # zero-fills of a gradient buffer in the backward
    LOGITS_GRAD_FILL = "logits_grad_fill"  # ... the one the cross-entropy's backward writes next
    EMBEDDING = "embedding"
    COPY = "copy"  # layout copies: cat, transposes made contiguous, clones
    OTHER = "other"  # reductions and ops none of the above names


# Ops that launch nothing (views, shape queries): transparent in a sequence of siblings.
VIEWS = frozenset({
    "aten::view", "aten::slice", "aten::transpose", "aten::t", "aten::reshape", "aten::unsqueeze",
    "aten::squeeze", "aten::expand", "aten::_unsafe_view", "aten::as_strided", "aten::detach",
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::size", "aten::select", "aten::narrow",
    "aten::split", "aten::chunk", "aten::alias", "aten::permute", "aten::flatten", "aten::lift_fresh",
    "aten::resolve_conj", "aten::resolve_neg", "aten::result_type", "aten::is_nonzero", "aten::item",
    "aten::_local_scalar_dense", "aten::arange",
})
_CASTS = ("aten::to", "aten::_to_copy", "aten::type_as", "aten::copy_")
_ADDS = ("aten::add", "aten::add_")
_MULS = ("aten::mul", "aten::mul_")
# The ops before an RMS normalisation's rsqrt, back to its square (variance + eps: add; mean; pow)
_RMS_BEFORE = ("aten::add", "aten::mean", "aten::pow", *_CASTS)
_RMS_AFTER = (*_MULS, *_CASTS)  # x * rsqrt(...), the cast back, the weight's multiply
_ROTARY_AFTER = ("aten::cat", *_MULS, *_ADDS)  # cat(-x2, x1), · sin, the sum with x · cos
_REACH = 3  # ops (views aside) a pattern looks back or ahead for its members

# A compiled kernel's name lists the ops inductor fused into it; the first key found decides (the loss's
# kernels fuse a view or an embedding's index too, a normalisation's backward the residual add).
_KERNEL_KEYS: tuple[tuple[str, PointwiseKind], ...] = (
    ("log_softmax", PointwiseKind.CROSS_ENTROPY), ("nll_loss_backward", PointwiseKind.CROSS_ENTROPY),
    ("cross_entropy", PointwiseKind.CROSS_ENTROPY),
    ("layer_norm", PointwiseKind.LAYER_NORM), ("rms_norm", PointwiseKind.RMS_NORM),
    ("rsqrt", PointwiseKind.RMS_NORM),
    ("gelu", PointwiseKind.GELU), ("silu", PointwiseKind.SILU),
    ("dropout", PointwiseKind.DROPOUT), ("embedding", PointwiseKind.EMBEDDING),
    ("nll_loss", PointwiseKind.CROSS_ENTROPY),
    ("bfloat16_copy", PointwiseKind.CAST), ("float16_copy", PointwiseKind.CAST),
)
_FUSED_PREFIX = ("triton_poi_fused_", "triton_per_fused_", "triton_red_fused_")
_LAYOUT = ("cat", "transpose", "clone", "permute", "view", "unsafe_view", "t", "expand", "slice", "squeeze",
           "unsqueeze", "select", "split", "as_strided")


def _fused_ops(name: str) -> str | None:
    """The op list of an inductor kernel's name (``_to_copy_add`` for ``triton_poi_fused__to_copy_add_13``),
    None for another kernel."""
    for p in _FUSED_PREFIX:
        if name.startswith(p):
            body = name[len(p):]
            head, _, tail = body.rpartition("_")
            return head if tail.isdigit() else body
    return None


def is_fused_kernel(name: str) -> bool:
    """A kernel inductor generated (its name lists the ops it fused)."""
    return _fused_ops(name.lower()) is not None


def kernel_kind(name: str) -> PointwiseKind | None:
    """What a kernel computes by its name alone: inductor's fused names, the cast kernels of ATen
    (None: a generic elementwise kernel says nothing of what it is for)."""
    low = name.lower()
    kind = next((k for key, k in _KERNEL_KEYS if key in low), None)
    if kind is not None:
        return kind
    ops = _fused_ops(low)
    if ops is None:
        return None
    # what is left once the casts and views are out of the list: adds, or layout only
    rest = ops.replace("_to_copy", "").replace("unsafe_view", "").strip("_")
    words = [w for w in rest.split("_") if w]
    if not words:
        return PointwiseKind.CAST if "_to_copy" in ops else PointwiseKind.COPY
    if all(w == "add" or w in _LAYOUT for w in words) and "add" in words:
        return PointwiseKind.RESIDUAL
    if all(w in _LAYOUT for w in words):
        return PointwiseKind.CAST if "_to_copy" in ops else PointwiseKind.COPY
    return PointwiseKind.OTHER


def op_kind(op: str, backward: bool) -> PointwiseKind | None:
    """What an op computes by its own name (``backward``: it runs under a backward node)."""
    low = op.lower()
    if backward and low in ("aten::fill_", "aten::zero_", "aten::zeros", "aten::zeros_like"):
        return PointwiseKind.GRAD_FILL
    if "dropout" in low:
        return PointwiseKind.DROPOUT
    if low in ("aten::cos", "aten::sin"):
        return PointwiseKind.ROTARY  # the position tables; no other layer of a transformer takes them
    if not backward and low in _ADDS:
        return PointwiseKind.RESIDUAL
    if low in _CASTS[:3]:
        return PointwiseKind.CAST
    if low in ("aten::cat", "aten::clone", "aten::contiguous", "aten::copy_"):
        return PointwiseKind.COPY
    return None


def _mark(out: list[PointwiseKind | None], lo: int, hi: int, kind: PointwiseKind) -> None:
    for j in range(lo, hi + 1):
        if out[j] is None:
            out[j] = kind


def sequence_kinds(names: Sequence[str]) -> list[PointwiseKind | None]:
    """The kind of each op of one run of sibling forward ops (views left out by the caller) that a
    pattern of its neighbours decides; None where none does (its own name may, :func:`op_kind`)."""
    low = [n.lower() for n in names]
    out: list[PointwiseKind | None] = [None] * len(low)
    for k, name in enumerate(low):
        if name == "aten::rsqrt":  # x * rsqrt(mean(x²) + eps) * w, written out
            lo = k
            for j in range(k - 1, max(k - 1 - 2 * _REACH, -1), -1):
                if low[j] not in _RMS_BEFORE:
                    break
                lo = j
                if low[j] == "aten::pow":
                    if j > 0 and low[j - 1] in _CASTS:  # the cast to fp32 before squaring
                        lo = j - 1
                    break
            hi, muls = k, 0
            for j in range(k + 1, min(k + 1 + _REACH, len(low))):
                if low[j] not in _RMS_AFTER or (low[j] in _MULS and muls == 2):
                    break
                muls += low[j] in _MULS
                hi = j
            _mark(out, lo, hi, PointwiseKind.RMS_NORM)
        elif name == "aten::neg" and "aten::cat" in low[k + 1:k + 3]:  # rotate_half: cat(-x2, x1)
            lo = next((j for j in range(k - 1, max(k - 1 - _REACH, -1), -1) if low[j] in _MULS), k)
            hi = k
            for j in range(k + 1, min(k + 1 + _REACH, len(low))):
                if low[j] not in _ROTARY_AFTER:
                    break
                hi = j
                if low[j] in _ADDS:  # x · cos + rotate_half(x) · sin: the add closes it
                    break
            _mark(out, lo, hi, PointwiseKind.ROTARY)
    for k, name in enumerate(low):
        if out[k] is None and name in _MULS:
            before = low[max(k - _REACH, 0):k]
            if "aten::silu" in before:  # act(gate(x)) * up(x): the gate's product
                out[k] = PointwiseKind.SILU
            elif "aten::gelu" in before:
                out[k] = PointwiseKind.GELU
    return out

"""The remedies, one small function each (:data:`REMEDIES`), fitted to one job: each reads the step
budget (divided by op: perfd.capture.ops) and the job's configuration
(perfd.analytics.advice.remedies.JobConfig) and returns Advice — the options it sets (only those the
job's release accepts, never one already set), what it needs that the job lacks, what it costs, its
gain as a range from a model of what the change removes and what it adds (the constants and why:
perfd.analytics.advice.remedies), and what that gain is made of (its removals, which a plan counts once
where remedies overlap: perfd.analytics.advice.plan). The gaps' and the optimizer's remedies are in
perfd.analytics.advice.remedy_steps. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from perfd.analytics import thresholds as th
from perfd.analytics.advice import megatron_options as mo
from perfd.analytics.advice.remedies import (
    FUSED_ATTENTION_OF_CEILING,
    FUSED_POINTWISE,
    GEMM_TO_TARGET,
    MERGED_PASSES,
    RECOMPUTED_FORWARD,
    REMOVED_KERNELS,
    Advice,
    FitContext,
    Framework,
    Gain,
    RemedyId,
    Removal,
    flags_for,
    gain_of,
    merged,
    named,
    op_ms,
    ranged,
    removal,
    with_spread,
)
from perfd.analytics.advice.remedy_steps import (
    cuda_graphs,
    data_loader,
    fused_optimizer,
    grad_accum_fusion,
    grad_norm,
    micro_batch,
    overlap_comm,
    pipeline_wait,
    timer_sync,
)
from perfd.analytics.breakdown.budget import BudgetPart
from perfd.analytics.breakdown.replay_table import DROPOUT_HOST, Change
from perfd.analytics.breakdown.step_parts import Part
from perfd.model import PACKAGE_APEX, PACKAGE_FLASH_ATTN, PACKAGE_TE

# --- attention: its ops in three slices that the remedies acting on it share -----------------------------
DROPOUT_OPS = ("dropout",)
MASK_OPS = ("masked_fill", "copy", "clone", "fill_", "new_zeros")


def attention_slices(att: BudgetPart) -> tuple[float, float, float]:
    """(dropout, mask fill and score copies, the rest) of attention per step, by the ops that issued
    their kernels; the rest is the part less the two (its matmuls and softmax)."""
    drop, mask = op_ms(att, *DROPOUT_OPS), op_ms(att, *MASK_OPS)
    return drop, mask, max(att.ms - drop - mask, 0.0)


ATT_DROPOUT, ATT_MASK, ATT_REST = "attention:dropout", "attention:mask", "attention:rest"


def attention_dropout(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    att = b.get(Part.ATTENTION)
    if att is None or att.detail.get("fused"):
        return None
    drop = attention_slices(att)[0]
    if not named(b, drop):
        return None
    basis = (
        f"the attention dropout's kernels, forward and backward: {drop:.0f} ms per step by op, run no "
        f"more (× {REMOVED_KERNELS[0]:g}–{REMOVED_KERNELS[1]:g}: the gaps around them move too)"
    )
    removes = (removal(ATT_DROPOUT, drop, REMOVED_KERNELS),)
    current = cfg.arg("attention_dropout")
    cost = (
        f"regularisation: attention dropout {current or 'the default'} → 0 (large-model pretraining "
        "recipes mostly use 0; watch the validation loss)"
    )
    if cfg.framework is Framework.MEGATRON:
        flags, notes = flags_for(cfg, ("--attention-dropout", "0.0"))
        if not flags:
            return None
        gaps_gain = gain_of(removes, basis)
        replayed = c.replayed(Change.DROPOUT, f"without the attention dropout's kernels ({drop:.0f} ms by "
                              f"op; the host time before each × {DROPOUT_HOST[1]:g}–{DROPOUT_HOST[0]:g})",
                              gaps_gain)
        return Advice(RemedyId.ATTENTION_DROPOUT, Part.ATTENTION,
                      f"Drop attention dropout: {flags[0].text()}",
                      replayed or gaps_gain, flags, cost=cost, notes=notes, removes=removes,
                      replay=Change.DROPOUT if replayed else None)
    return Advice(
        RemedyId.ATTENTION_DROPOUT,
        Part.ATTENTION,
        "Drop attention dropout: dropout_p=0.0 in scaled_dot_product_attention (attention_dropout=0 "
        "or attn_pdrop=0 in a Hugging Face config)",
        gain_of(removes, basis),
        cost=cost,
        removes=removes,
    )


def fused_attention(c: FitContext) -> Advice | None:
    """Attention in one kernel (FlashAttention, cuDNN's): every slice of the unfused attention goes
    (its dropout and mask with it), its FLOPs come back at a share of the matmul ceiling. In
    Megatron-LM Transformer Engine brings it; ``--attention-backend flash`` would make TE use only the
    separate flash-attn package, so it is named only where the start-up shows flash-attn: otherwise
    ``auto`` (the default) lets TE choose its cuDNN fused attention."""
    b, cfg = c.budget, c.config
    att = b.get(Part.ATTENTION)
    if att is None or att.detail.get("fused") or not named(b, att.ms):
        return None
    flops, ceiling = att.detail.get("flops"), b.ceiling_tflops
    gain: Gain | None = None
    removes: tuple[Removal, ...] = ()
    if isinstance(flops, (int, float)) and flops > 0 and ceiling:
        lo_t = flops / (FUSED_ATTENTION_OF_CEILING[0] * ceiling * 1e9)
        hi_t = flops / (FUSED_ATTENTION_OF_CEILING[1] * ceiling * 1e9)
        drop, mask, rest = attention_slices(att)
        removes = (removal(ATT_DROPOUT, drop), removal(ATT_MASK, mask), removal(ATT_REST, rest),
                   Removal("fused_attention:kernel", -lo_t, -hi_t))
        gain = gain_of(removes, f"attention's {att.ms:.0f} ms per step out, its {flops / 1e12:.1f} TFLOP per "
                       f"step back in at {FUSED_ATTENTION_OF_CEILING[0]:g}–{FUSED_ATTENTION_OF_CEILING[1]:g} "
                       f"of the {ceiling:g} TFLOP/s matmul ceiling ({hi_t:.0f}–{lo_t:.0f} ms): fused "
                       "attention never writes the s×s scores")
    if cfg.framework is Framework.MEGATRON:
        flash = cfg.present(PACKAGE_FLASH_ATTN)
        wanted: list[tuple[str, str | None]] = [("--transformer-impl", "transformer_engine")]
        wanted.append(("--attention-backend", "flash" if flash else "auto"))
        flags, notes = flags_for(cfg, *wanted)
        if not flash:
            notes = (*notes, "not --attention-backend flash: with it Transformer Engine uses only the "
                     "separate "
                     "flash-attn package (and turns off its cuDNN fused attention), which the job's start-up "
                     "does not show; auto (or fused) lets TE pick its cuDNN fused attention")
        needs = (PACKAGE_TE,) if cfg.missing(PACKAGE_TE) else ()
        what = " ".join(f.text() for f in flags)
        act = (f"Fused attention: install Transformer Engine, then {what}" if needs
               else f"Fused attention: {what}")
        requires = (PACKAGE_TE, PACKAGE_FLASH_ATTN) if flash else (PACKAGE_TE,)
        return Advice(RemedyId.FUSED_ATTENTION, Part.ATTENTION, act, gain, flags, needs=needs, notes=notes,
                      removes=removes, requires=requires)
    if cfg.framework is Framework.TORCHTITAN:
        return Advice(RemedyId.FUSED_ATTENTION, Part.ATTENTION,
                      "Fused attention: SDPA or flex attention in the model (torchtitan's own models use "
                      "them)",
                      gain, removes=removes)
    return Advice(
        RemedyId.FUSED_ATTENTION,
        Part.ATTENTION,
        "Fused attention: "
        "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) in place of "
        'softmax(QKᵀ)·V (attn_implementation="sdpa" in Hugging Face)',
        gain,
        removes=removes,
    )


def softmax_fusion(c: FitContext) -> Advice | None:
    """Megatron-LM's fused scale-mask-softmax (Apex's CUDA extension scaled_masked_softmax_cuda): the
    mask pass and the copies autograd makes of the s×s scores for the in-place masked fill go; the
    softmax itself stays (one read, one write)."""
    b, cfg = c.budget, c.config
    att = b.get(Part.ATTENTION)
    if cfg.framework is not Framework.MEGATRON or att is None or att.detail.get("fused"):
        return None
    if cfg.arg("masked_softmax_fusion") != "False":
        return None
    extra = attention_slices(att)[1]
    if not named(b, extra):
        return None
    ok = mo.exists("--no-masked-softmax-fusion", cfg.version) is not False
    needs = (PACKAGE_APEX,) if not cfg.present(PACKAGE_APEX) else ()
    basis = (
        f"the mask fill and the copies of the score matrix autograd makes for it: {extra:.0f} ms per step "
        f"by op (× {REMOVED_KERNELS[0]:g}–{REMOVED_KERNELS[1]:g}); the fused kernel's softmax costs what "
        "the unfused one does"
    )
    act = ("Fuse scale, mask and softmax: "
           + ("install Apex with its CUDA extensions (the fused kernels scaled_masked_softmax_cuda), then "
              if needs else "") + "remove --no-masked-softmax-fusion")
    removes = (removal(ATT_MASK, extra, REMOVED_KERNELS),)
    notes = () if cfg.missing(PACKAGE_APEX) or not needs else (
        "the start-up does not show Apex's CUDA extensions; without scaled_masked_softmax_cuda the job "
        "refuses to start (seen on an H100: No module named 'scaled_masked_softmax_cuda')",)
    return Advice(RemedyId.SOFTMAX_FUSION, Part.ATTENTION, act, gain_of(removes, basis),
                  remove=("--no-masked-softmax-fusion",) if ok else (), needs=needs, notes=notes,
                  removes=removes, requires=(PACKAGE_APEX,))


# Megatron-LM's native fused cross-entropy (megatron/core/fusions/fused_cross_entropy.py) runs the loss in
# four compiled functions: the cast with the max; the shifted exp with its sum and the target's logit;
# the division; and the whole backward.
_CE_GROUPS: tuple[tuple[str, ...], ...] = (
    ("aten::copy_", "aten::to", "aten::max"),
    ("aten::sub", "aten::exp", "aten::sum", "aten::masked_fill", "aten::index", "aten::lt", "aten::ge"),
    ("aten::div", "aten::log"),
    ("backward",),
)


def ce_fusion(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    loss = b.get(Part.LOSS)
    if cfg.framework is not Framework.MEGATRON or loss is None or not named(b, loss.ms):
        return None
    saved = merged(loss, _CE_GROUPS)
    if saved <= 0:
        return None
    wanted: list[tuple[str, str | None]] = [("--cross-entropy-loss-fusion", None)]
    if mo.exists("--cross-entropy-fusion-impl", cfg.version) is not False:
        wanted.append(("--cross-entropy-fusion-impl", "native"))  # TE's needs Transformer Engine
    flags, notes = flags_for(cfg, *wanted)
    if not any(f.option == "--cross-entropy-loss-fusion" for f in flags):
        return None
    basis = (
        f"the loss's {loss.ms:.0f} ms per step in {len(_CE_GROUPS)} fused passes instead of one kernel per "
        f"op: each merged group costs its longest op, {saved:.0f} ms saved (× {MERGED_PASSES[0]:g}–"
        f"{MERGED_PASSES[1]:g}: what torch.compile fuses varies)"
    )
    return Advice(
        RemedyId.CE_FUSION,
        Part.LOSS,
        "Fuse the cross-entropy: " + " ".join(f.text() for f in flags),
        ranged(saved, MERGED_PASSES, basis),
        flags,
        notes=notes,
        removes=(removal("loss:passes", saved, MERGED_PASSES),),
    )


# The parts a layer's forward runs (what recomputation runs again)
_LAYER_PARTS = (Part.LINEAR, Part.GEMM, Part.ATTENTION, Part.ACTIVATION, Part.NORM, Part.POINTWISE)


def recompute(c: FitContext) -> Advice | None:
    """Activation recomputation, both ways: a job that recomputes every layer (``full``) where the
    log's memory report leaves room recomputes core attention only (``selective``: its s×s
    activations are the large ones) and wins the rest of the repeated forward back; a job short of
    memory that recomputes nothing frees attention's activations for the price of its forward."""
    b, cfg = c.budget, c.config
    if cfg.framework is not Framework.MEGATRON or not b.has_kernels:
        return None
    gran = cfg.arg("recompute_granularity")
    layers = sum(b.ms(p) for p in _LAYER_PARTS)
    att = b.ms(Part.ATTENTION)
    peak, total = cfg.memory_mib.get("max allocated"), cfg.gpu_memory_mib
    flags, notes = flags_for(cfg, ("--recompute-granularity", "selective"))
    if not flags:
        return None
    if gran == "full":
        again = (layers - att) / 3  # the forward of everything but core attention, run once more
        basis = (
            f"full recomputation runs each layer's forward twice: {layers:.0f} ms of layer work per step, "
            f"a third of it forward; selective keeps recomputing core attention ({att:.0f} ms) and no "
            f"more: {again:.0f} ms back (× {RECOMPUTED_FORWARD[0]:g}–{RECOMPUTED_FORWARD[1]:g})"
        )
        room = (
            f"; the log's peak is {peak / 1024:.1f} GiB of {total / 1024:.0f} GiB"
            if peak is not None and total is not None
            else ""
        )
        return Advice(
            RemedyId.RECOMPUTE,
            Part.LINEAR,
            "Recompute less: --recompute-granularity selective (core attention only) instead of full",
            ranged(again, RECOMPUTED_FORWARD, basis),
            flags,
            remove=("--recompute-method",),
            cost="memory: the layers' activations but attention's are kept" + room,
            notes=notes,
        )
    if gran not in (None, "None") or peak is None or total is None or peak < th.MEMORY_HEADROOM.value * total:
        return None
    fwd = att / 3
    return Advice(
        RemedyId.RECOMPUTE,
        Part.ATTENTION,
        "Free memory: --recompute-granularity selective (core attention's s×s activations recomputed, "
        "not kept)",
        Gain(
            -fwd * RECOMPUTED_FORWARD[1],
            -fwd * RECOMPUTED_FORWARD[0],
            f"attention's forward ({fwd:.0f} ms of its {att:.0f} ms) runs again in the backward",
        ),
        flags,
        cost=f"the step runs longer; the log's peak {peak / 1024:.1f} GiB of {total / 1024:.0f} GiB "
        "comes down (room for a larger micro-batch)",
        notes=notes,
    )


def fused_layers(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    parts = [p for p in (b.get(Part.NORM), b.get(Part.ACTIVATION), b.get(Part.POINTWISE)) if p is not None]
    ms = sum(p.ms for p in parts)
    if not named(b, ms):
        return None
    removes = tuple(removal(f"{p.part.value}:all", p.ms, FUSED_POINTWISE) for p in parts)
    basis = (
        f"normalisation, activation and other pointwise work: {ms:.0f} ms per step, each activation written "
        f"once instead of once per op (× {FUSED_POINTWISE[0]:g}–{FUSED_POINTWISE[1]:g})"
    )
    if cfg.framework is Framework.MEGATRON:
        if cfg.arg("transformer_impl") == "transformer_engine":
            return None
        flags, notes = flags_for(cfg, ("--transformer-impl", "transformer_engine"))
        needs = (PACKAGE_TE,) if cfg.missing(PACKAGE_TE) else ()
        what = " ".join(f.text() for f in flags)
        return Advice(
            RemedyId.FUSED_LAYERS,
            Part.POINTWISE,
            "Transformer Engine layers: "
            + (f"install Transformer Engine, then {what}" if needs else what)
            + " (layer norm in the linear's "
            "prologue, fused bias-activation-dropout)",
            ranged(ms, FUSED_POINTWISE, basis),
            flags,
            needs=needs,
            notes=notes
            if needs or cfg.packages.get(PACKAGE_TE)
            else (*notes, "needs Transformer Engine (the log does not say whether it is installed)"),
            removes=removes,
            requires=(PACKAGE_TE,),
        )
    if cfg.framework is Framework.TORCHTITAN:
        return Advice(
            RemedyId.FUSED_LAYERS,
            Part.POINTWISE,
            "Fused layers: --compile.enable (torch.compile)",
            ranged(ms, FUSED_POINTWISE, basis),
            removes=removes,
        )
    return Advice(
        RemedyId.FUSED_LAYERS,
        Part.POINTWISE,
        "Fused layers: torch.compile(model)",
        ranged(ms, FUSED_POINTWISE, basis),
        removes=removes,
    )


def bigger_gemms(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    p = b.get(Part.LINEAR) or b.get(Part.GEMM)
    if p is None:
        return None
    of, at = p.detail.get("of_ceiling"), p.detail.get("at_ceiling_ms")
    if not isinstance(of, (int, float)) or not isinstance(at, (int, float)) or of >= th.GEMM_EFFICIENT.value:
        return None
    above = p.ms - at / th.GEMM_EFFICIENT.value
    if not named(b, above):
        return None
    basis = (
        f"the GEMMs run at {of:.0%} of the ceiling: {p.ms:.0f} ms per step where "
        f"{at / th.GEMM_EFFICIENT.value:.0f}"
        f" ms would be {th.GEMM_EFFICIENT.value:.0%} of it (× {GEMM_TO_TARGET[0]:g}–{GEMM_TO_TARGET[1]:g} "
        "of the difference)"
    )
    act = (
        "Bigger GEMMs: a larger --micro-batch-size, hidden and FFN sizes multiples of 128"
        if cfg.framework is Framework.MEGATRON
        else "Bigger GEMMs: a larger batch per step, dimensions multiples of 128"
    )
    return Advice(RemedyId.BIGGER_GEMMS, p.part, act, ranged(above, GEMM_TO_TARGET, basis))


Remedy = Callable[[FitContext], Advice | None]
# The one registry: every remedy, in the order alternatives for the same part are listed.
REMEDIES: tuple[Remedy, ...] = (
    fused_attention,
    softmax_fusion,
    attention_dropout,
    ce_fusion,
    timer_sync,
    micro_batch,
    recompute,
    cuda_graphs,
    fused_layers,
    fused_optimizer,
    grad_norm,
    grad_accum_fusion,
    overlap_comm,
    bigger_gemms,
    data_loader,
    pipeline_wait,
)


def fit(c: FitContext, remedies: Iterable[Remedy] = REMEDIES) -> list[Advice]:
    """Every remedy the budget calls for on this job, fitted to its configuration, its gain widened by
    the run-to-run spread (:func:`with_spread`). A remedy that names no removals of its own gets one
    atom of its own (its gain adds to any other's). :func:`minor` tells the ones under
    th.REMEDY_MIN_GAIN of the step apart."""
    out = []
    for r in remedies:
        a = r(c)
        if a is None:
            continue
        if not a.removes and a.gain is not None:
            a = dataclasses.replace(a, removes=(Removal(a.remedy.value, a.gain.low_ms, a.gain.high_ms),))
        out.append(dataclasses.replace(a, gain=with_spread(a.gain, c.budget)))
    return out


def minor(a: Advice, step_ms: float) -> bool:
    """A gain whose middle is under th.REMEDY_MIN_GAIN of the step: within what a rerun moves."""
    return a.gain is not None and a.gain.mid_ms < th.REMEDY_MIN_GAIN.value * step_ms

"""The remedies, one small function each (:data:`REMEDIES`), fitted to one job: each reads the step
budget (divided by op: perfd.capture.ops) and the job's configuration
(perfd.analytics.advice.remedies.JobConfig) and returns Advice — the options it sets (only those the
job's release accepts, never one already set), what it needs that the job lacks, what it costs, its
gain as a range from a model of what the change removes and what it adds (the constants and why:
perfd.analytics.advice.remedies), and what that gain is made of (its removals, which a plan counts once
where remedies overlap: perfd.analytics.advice.plan). The gaps' and the optimizer's remedies are in
perfd.analytics.advice.remedy_steps, CUDA graphs' in perfd.analytics.advice.remedy_graphs. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from perfd.analytics import thresholds as th
from perfd.analytics.advice import megatron_options as mo
from perfd.analytics.advice.remedies import (
    COMPILE_GPU_SHARE,
    COMPILED_SAVES,
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
    NoGain,
    RemedyId,
    Removal,
    Risk,
    flags_for,
    gain_of,
    idle_ms,
    merged,
    named,
    op_ms,
    ranged,
    removal,
    with_spread,
)
from perfd.analytics.advice.remedy_graphs import cuda_graphs
from perfd.analytics.advice.remedy_loss import LOSS_PASSES, fused_linear_ce, loss_only
from perfd.analytics.advice.remedy_recompute import loop_recompute
from perfd.analytics.advice.remedy_said import Say, say
from perfd.analytics.advice.remedy_steps import (
    LAUNCH_GAPS,
    data_loader,
    fused_optimizer,
    grad_accum_fusion,
    grad_norm,
    micro_batch,
    overlap_comm,
    pipeline_wait,
    timer_sync,
)
from perfd.analytics.advice.trainer_switches import in_terms
from perfd.analytics.breakdown.budget import BudgetPart, IdleCause, Phase
from perfd.analytics.breakdown.replay_table import DROPOUT_HOST, FUSED_DEVICE, FUSED_LAUNCHES, Change
from perfd.analytics.breakdown.step_parts import Part
from perfd.core.model import PACKAGE_APEX, PACKAGE_FLASH_ATTN, PACKAGE_TE

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
    basis = say(Say.DROPOUT_BASIS, drop, *REMOVED_KERNELS)
    removes = (removal(ATT_DROPOUT, drop, REMOVED_KERNELS),)
    cost = say(Say.DROPOUT_COST, cfg.arg("attention_dropout") or say(Say.THE_DEFAULT))
    if cfg.framework is Framework.MEGATRON:
        flags, notes = flags_for(cfg, ("--attention-dropout", "0.0"))
        if not flags:
            return None
        gaps_gain = gain_of(removes, basis)
        what = say(Say.DROPOUT_REPLAYED, drop, DROPOUT_HOST[1], DROPOUT_HOST[0])
        replayed = c.replayed(Change.DROPOUT, what, gaps_gain)
        return Advice(RemedyId.ATTENTION_DROPOUT, Part.ATTENTION,
                      say(Say.DROPOUT_FLAG, flags[0].text()),
                      replayed or gaps_gain, flags, cost=cost, notes=notes, removes=removes,
                      replay=Change.DROPOUT if replayed else None)
    return Advice(
        RemedyId.ATTENTION_DROPOUT,
        Part.ATTENTION,
        say(Say.DROPOUT_SDPA),
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
        gain = gain_of(removes, say(Say.FUSED_ATTENTION_BASIS, att.ms, flops / 1e12,
                                    *FUSED_ATTENTION_OF_CEILING, ceiling, hi_t, lo_t))
    why = NoGain.ATTENTION_FLOPS if gain is None else None
    if cfg.framework is Framework.MEGATRON:
        flash = cfg.present(PACKAGE_FLASH_ATTN)
        wanted: list[tuple[str, str | None]] = [("--transformer-impl", "transformer_engine")]
        wanted.append(("--attention-backend", "flash" if flash else "auto"))
        flags, notes = flags_for(cfg, *wanted)
        if not flash:
            notes = (*notes, say(Say.NOT_FLASH_BACKEND))
        needs = (PACKAGE_TE,) if cfg.missing(PACKAGE_TE) else ()
        what = " ".join(f.text() for f in flags)
        act = say(Say.FUSED_ATTENTION_INSTALL if needs else Say.FUSED_ATTENTION_FLAGS, what)
        requires = (PACKAGE_TE, PACKAGE_FLASH_ATTN) if flash else (PACKAGE_TE,)
        return Advice(RemedyId.FUSED_ATTENTION, Part.ATTENTION, act, gain, flags, needs=needs, notes=notes,
                      removes=removes, requires=requires, no_gain=why)
    sw = in_terms(RemedyId.FUSED_ATTENTION, cfg.framework, Say.FUSED_ATTENTION_SDPA)
    return Advice(RemedyId.FUSED_ATTENTION, Part.ATTENTION, sw.action, gain, sw.flags, removes=removes,
                  no_gain=why)


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
    basis = say(Say.SOFTMAX_BASIS, extra, *REMOVED_KERNELS)
    act = say(Say.SOFTMAX_INSTALL if needs else Say.SOFTMAX_REMOVE)
    removes = (removal(ATT_MASK, extra, REMOVED_KERNELS),)
    notes = () if cfg.missing(PACKAGE_APEX) or not needs else (say(Say.SOFTMAX_NO_EXTENSIONS),)
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
    """Megatron-LM's fused cross-entropy; outside it, a fused linear + cross-entropy (remedy_loss)."""
    b, cfg = c.budget, c.config
    if cfg.framework is not Framework.MEGATRON:
        return fused_linear_ce(c)
    loss = b.get(Part.LOSS)
    if loss is None or not named(b, loss.ms):
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
    basis = say(Say.CE_BASIS, loss.ms, len(_CE_GROUPS), saved, *MERGED_PASSES)
    return Advice(
        RemedyId.CE_FUSION,
        Part.LOSS,
        say(Say.CE_FLAGS, " ".join(f.text() for f in flags)),
        ranged(saved, MERGED_PASSES, basis),
        flags,
        notes=notes,
        removes=(removal(LOSS_PASSES, saved, MERGED_PASSES),),
    )


# The parts a layer's forward runs (what recomputation runs again)
_LAYER_PARTS = (Part.LINEAR, Part.GEMM, Part.ATTENTION, Part.ACTIVATION, Part.NORM, Part.POINTWISE)


def recompute(c: FitContext) -> Advice | None:
    """Activation recomputation, both ways: a job that recomputes every layer (``full``) where the
    log's memory report leaves room recomputes core attention only (``selective``: its s×s
    activations are the large ones) and wins the rest of the repeated forward back; a job short of
    memory that recomputes nothing frees attention's activations for the price of its forward."""
    b, cfg = c.budget, c.config
    if cfg.framework is not Framework.MEGATRON:
        return loop_recompute(c)  # what a capture shows the backward run again
    if not b.has_kernels:
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
        basis = say(Say.FULL_RECOMPUTE_BASIS, layers, att, again, *RECOMPUTED_FORWARD)
        room = None
        if peak is not None and total is not None:
            room = say(Say.PEAK_ROOM, peak / 1024, total / 1024)
        return Advice(
            RemedyId.RECOMPUTE,
            Part.LINEAR,
            say(Say.RECOMPUTE_LESS),
            ranged(again, RECOMPUTED_FORWARD, basis),
            flags,
            remove=("--recompute-method",),
            cost=say(Say.RECOMPUTE_LESS_COST, room),
            notes=notes,
        )
    if gran not in (None, "None") or peak is None or total is None or peak < th.MEMORY_HEADROOM.value * total:
        return None
    fwd = att / 3
    return Advice(
        RemedyId.RECOMPUTE,
        Part.ATTENTION,
        say(Say.FREE_MEMORY),
        Gain(-fwd * RECOMPUTED_FORWARD[1], -fwd * RECOMPUTED_FORWARD[0],
             say(Say.FREE_MEMORY_BASIS, fwd, att)),
        flags,
        cost=say(Say.FREE_MEMORY_COST, peak / 1024, total / 1024),
        notes=notes,
    )


def fused_layers(c: FitContext) -> Advice | None:
    """Fused layers: Transformer Engine's in Megatron-LM (the GPU time of the normalisation, activation
    and pointwise parts × FUSED_POINTWISE), torch.compile elsewhere (:func:`compiled_layers`)."""
    b, cfg = c.budget, c.config
    parts = [p for p in (b.get(Part.NORM), b.get(Part.ACTIVATION), b.get(Part.POINTWISE)) if p is not None]
    ms = sum(p.ms for p in parts)
    if cfg.framework is not Framework.MEGATRON:
        return compiled_layers(c, parts)
    if not named(b, ms):
        return None
    removes = tuple(removal(f"{p.part.value}:all", p.ms, FUSED_POINTWISE) for p in parts)
    basis = say(Say.FUSED_LAYERS_BASIS, ms, *FUSED_POINTWISE)
    if cfg.arg("transformer_impl") == "transformer_engine":
        return None
    flags, notes = flags_for(cfg, ("--transformer-impl", "transformer_engine"))
    needs = (PACKAGE_TE,) if cfg.missing(PACKAGE_TE) else ()
    what = " ".join(f.text() for f in flags)
    return Advice(
        RemedyId.FUSED_LAYERS,
        Part.POINTWISE,
        say(Say.TE_LAYERS_INSTALL if needs else Say.TE_LAYERS, what),
        ranged(ms, FUSED_POINTWISE, basis),
        flags,
        needs=needs,
        notes=notes
        if needs or cfg.packages.get(PACKAGE_TE)
        else (*notes, say(Say.TE_UNSHOWN)),
        removes=removes,
        requires=(PACKAGE_TE,),
    )


def compiled_layers(c: FitContext, parts: list[BudgetPart]) -> Advice | None:
    """torch.compile over an eager model. The GPU's side: the normalisation, activation and pointwise
    parts' kernels fused (× COMPILED_SAVES of their time saved). Where the replay reaches the job's clock,
    both sides launch by launch (Change.FUSED): the elementwise kernels run shorter and far fewer of them
    are launched, so the host's time a step falls with its launches; a host-bound step comes down to the
    larger of the two sides plus what stays serial (the data fetch, the loop between micro-batches and
    steps, the optimizer), a GPU-bound one by the GPU's side alone. Read from the replay, it removes the
    forward-backward launch gaps too, as much as the launches it takes away (the slice CUDA graphs and a
    larger micro-batch act on): a plan counts them once."""
    b, cfg = c.budget, c.config
    ms = sum(p.ms for p in parts)
    removes = tuple(removal(f"{p.part.value}:all", p.ms, COMPILED_SAVES) for p in parts)
    gpu = ranged(ms, COMPILED_SAVES, say(Say.FUSED_LAYERS_BASIS, ms, *COMPILED_SAVES)) if ms > 0 else None
    t = b.replay
    replayed = None
    if t is not None and t.fusable > 0 and t.launches > 0:
        what = say(Say.FUSED_REPLAYED, t.launches, t.fusable, t.fusable_ms, *FUSED_LAUNCHES, *FUSED_DEVICE)
        replayed = c.replayed(Change.FUSED, what, gpu)
        if replayed is not None:
            gone = tuple((1.0 - x) * t.fusable / t.launches for x in FUSED_LAUNCHES)
            launch = idle_ms(b, IdleCause.LAUNCH, Phase.LAYERS)
            removes = (*removes, Removal(LAUNCH_GAPS, launch * gone[0], launch * gone[1]))
    gain = replayed or gpu
    if gain is None or not (named(b, ms) or (replayed is not None and named(b, replayed.mid_ms))):
        return None
    gpu_side = gpu.high_ms if gpu is not None else 0.0
    if replayed is not None and gpu_side < COMPILE_GPU_SHARE * replayed.low_ms:
        # the host's gain: not promised, and its low end what the GPU's fused kernels give alone (the
        # compiled program's own host time, which no eager trace shows, may take all of the rest)
        low = gpu.low_ms if gpu is not None else 0.0
        gain = Gain(low, replayed.high_ms, say(Say.HOST_SIDE_UNMODELLED, replayed.basis, low),
                    Risk.COMPILE_HOST_SIDE)
    sw = in_terms(RemedyId.FUSED_LAYERS, cfg.framework, Say.FUSED_LAYERS_COMPILE)
    return Advice(RemedyId.FUSED_LAYERS, Part.POINTWISE, sw.action, gain, sw.flags, removes=removes,
                  replay=Change.FUSED if replayed else None)


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
    target = th.GEMM_EFFICIENT.value
    basis = say(Say.GEMM_BASIS, of, p.ms, at / target, target, *GEMM_TO_TARGET)
    sw = in_terms(RemedyId.BIGGER_GEMMS, cfg.framework, Say.BIGGER_GEMMS)
    return Advice(RemedyId.BIGGER_GEMMS, p.part, sw.action, ranged(above, GEMM_TO_TARGET, basis), sw.flags)


Remedy = Callable[[FitContext], Advice | None]
# The one registry: every remedy, in the order alternatives for the same part are listed.
REMEDIES: tuple[Remedy, ...] = (
    fused_attention,
    softmax_fusion,
    attention_dropout,
    ce_fusion,
    loss_only,
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

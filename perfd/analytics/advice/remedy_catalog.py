"""The remedies, one small function each (:data:`REMEDIES`), fitted to one job: each reads the step
budget (divided by op: perfd.capture.ops) and the job's configuration
(perfd.analytics.advice.remedies.JobConfig)
and returns Advice — the options it sets (only those the job's release accepts, never one already
set), what it needs that the job lacks, what it costs, and its gain as a range from a model of what
the change removes and what it adds (the constants and why: perfd.analytics.advice.remedies). Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from perfd.analytics import thresholds as th
from perfd.analytics.advice import megatron_options as mo
from perfd.analytics.advice.remedies import (
    DATA_KNOBS,
    DATA_WAIT_BACK,
    FUSED_ATTENTION_OF_CEILING,
    FUSED_OPTIMIZER_SAVES,
    FUSED_POINTWISE,
    GEMM_TO_TARGET,
    GRAPH_GAPS_BACK,
    GRAPH_REPLAY_COST_OF_STEP,
    HALF_MICROBATCHES,
    LEVEL2_SYNCS_PER_MICROBATCH,
    MERGED_PASSES,
    OVERLAP_HIDES,
    PIPELINE_WAIT_BACK,
    RECOMPUTED_FORWARD,
    REMOVED_KERNELS,
    SYNC_GAP_BACK,
    Advice,
    FitContext,
    Framework,
    Gain,
    JobConfig,
    RemedyId,
    flags_for,
    merged,
    named,
    op_ms,
    per_step,
    ranged,
    with_spread,
)
from perfd.analytics.breakdown.budget import Part
from perfd.analytics.incidents.verdict_text import DATA_LOADING_ACTION
from perfd.model import PACKAGE_APEX, PACKAGE_TE


# --- the remedies ------------------------------------------------------------------------------------
def attention_dropout(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    att = b.get(Part.ATTENTION)
    drop = op_ms(att, "dropout")
    if att is None or att.detail.get("fused") or not named(b, drop):
        return None
    basis = (
        f"the attention dropout's kernels, forward and backward: {drop:.0f} ms per step by op, run no "
        f"more (× {REMOVED_KERNELS[0]:g}–{REMOVED_KERNELS[1]:g}: the gaps around them move too)"
    )
    current = cfg.arg("attention_dropout")
    cost = (
        f"regularisation: attention dropout {current or 'the default'} → 0 (large-model pretraining "
        "recipes mostly use 0; watch the validation loss)"
    )
    if cfg.framework is Framework.MEGATRON:
        flags, notes = flags_for(cfg, ("--attention-dropout", "0.0"))
        if not flags:
            return None
        return Advice(
            RemedyId.ATTENTION_DROPOUT,
            Part.ATTENTION,
            f"Drop attention dropout: {flags[0].text()}",
            ranged(drop, REMOVED_KERNELS, basis),
            flags,
            cost=cost,
            notes=notes,
        )
    return Advice(
        RemedyId.ATTENTION_DROPOUT,
        Part.ATTENTION,
        "Drop attention dropout: dropout_p=0.0 in scaled_dot_product_attention (attention_dropout=0 "
        "or attn_pdrop=0 in a Hugging Face config)",
        ranged(drop, REMOVED_KERNELS, basis),
        cost=cost,
    )


def fused_attention(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    att = b.get(Part.ATTENTION)
    if att is None or att.detail.get("fused") or not named(b, att.ms):
        return None
    flops, ceiling = att.detail.get("flops"), b.ceiling_tflops
    if isinstance(flops, (int, float)) and flops > 0 and ceiling:
        lo_t = flops / (FUSED_ATTENTION_OF_CEILING[0] * ceiling * 1e9)
        hi_t = flops / (FUSED_ATTENTION_OF_CEILING[1] * ceiling * 1e9)
        gain: Gain | None = Gain(
            att.ms - lo_t,
            att.ms - hi_t,
            f"attention's {att.ms:.0f} ms per step out, its {flops / 1e12:.1f} TFLOP per "
            f"step back in at {FUSED_ATTENTION_OF_CEILING[0]:g}–"
            f"{FUSED_ATTENTION_OF_CEILING[1]:g} of the {ceiling:g} TFLOP/s matmul ceiling "
            f"({hi_t:.0f}–{lo_t:.0f} ms): fused attention never writes the s×s scores",
        )
    else:
        gain = None
    if cfg.framework is Framework.MEGATRON:
        flags, notes = flags_for(
            cfg, ("--transformer-impl", "transformer_engine"), ("--attention-backend", "flash")
        )
        needs = (PACKAGE_TE,) if cfg.missing(PACKAGE_TE) else ()
        what = " ".join(f.text() for f in flags)
        act = (
            f"Fused attention: install Transformer Engine, then {what}"
            if needs
            else f"Fused attention: {what}"
        )
        return Advice(RemedyId.FUSED_ATTENTION, Part.ATTENTION, act, gain, flags, needs=needs, notes=notes)
    if cfg.framework is Framework.TORCHTITAN:
        return Advice(
            RemedyId.FUSED_ATTENTION,
            Part.ATTENTION,
            "Fused attention: SDPA or flex attention in the model (torchtitan's own models use them)",
            gain,
        )
    return Advice(
        RemedyId.FUSED_ATTENTION,
        Part.ATTENTION,
        "Fused attention: "
        "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) in place of "
        'softmax(QKᵀ)·V (attn_implementation="sdpa" in Hugging Face)',
        gain,
    )


def softmax_fusion(c: FitContext) -> Advice | None:
    """Megatron-LM's fused scale-mask-softmax: the mask pass and the copies autograd makes of the s×s
    scores for the in-place masked fill go; the softmax itself stays (one read, one write)."""
    b, cfg = c.budget, c.config
    att = b.get(Part.ATTENTION)
    if cfg.framework is not Framework.MEGATRON or att is None or att.detail.get("fused"):
        return None
    if cfg.arg("masked_softmax_fusion") != "False":
        return None
    extra = op_ms(att, "masked_fill", "copy", "clone", "fill_", "new_zeros")
    if not named(b, extra):
        return None
    ok = mo.exists("--no-masked-softmax-fusion", cfg.version) is not False
    needs = (PACKAGE_APEX,) if cfg.missing(PACKAGE_APEX) else ()
    basis = (
        f"the mask fill and the copies of the score matrix autograd makes for it: {extra:.0f} ms per step "
        f"by op (× {REMOVED_KERNELS[0]:g}–{REMOVED_KERNELS[1]:g}); the fused kernel's softmax costs what "
        "the unfused one does"
    )
    act = (
        "Fuse scale, mask and softmax: "
        + (
            "install Apex with its CUDA extensions (the fused kernels scaled_masked_softmax_cuda), then "
            if needs
            else ""
        )
        + "remove --no-masked-softmax-fusion"
    )
    return Advice(
        RemedyId.SOFTMAX_FUSION,
        Part.ATTENTION,
        act,
        ranged(extra, REMOVED_KERNELS, basis),
        remove=("--no-masked-softmax-fusion",) if ok else (),
        needs=needs,
    )


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
    )


def timer_sync(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    gaps, syncs = per_step(b, "sync_gap_ms"), per_step(b, "syncs")
    if not gaps or not syncs or not named(b, gaps):
        return None
    if cfg.framework is not Framework.MEGATRON:
        basis = (
            f"{syncs:.0f} device synchronisations a step, the GPU idle {gaps:.0f} ms after them while the "
            f"host launches again; without them the host runs ahead (× {SYNC_GAP_BACK[0]:g}–"
            f"{SYNC_GAP_BACK[1]:g})"
        )
        return Advice(
            RemedyId.TIMER_SYNC,
            Part.IDLE_LONG,
            "Remove host synchronisations from the step: "
            ".item(), .cpu(), torch.cuda.synchronize(), printing tensors; log every N steps",
            ranged(gaps, SYNC_GAP_BACK, basis),
        )
    level = cfg.arg("timing_log_level")
    m = _microbatches(cfg)
    if level != "2" or m is None:
        return None
    removed = min(syncs, LEVEL2_SYNCS_PER_MICROBATCH * m)
    flags, notes = flags_for(cfg, ("--timing-log-level", "1"))
    if not flags:
        return None
    share = gaps * removed / syncs
    basis = (
        f"{syncs:.0f} device synchronisations a step, the GPU idle {gaps:.0f} ms after them; level 1 "
        "drops the "
        f"{removed:.0f} of the per-micro-batch timers ({LEVEL2_SYNCS_PER_MICROBATCH} × {m} micro-batches): "
        f"{share:.0f} ms of those gaps, {SYNC_GAP_BACK[0]:.0%}–{SYNC_GAP_BACK[1]:.0%} of which come back "
        "(the "
        "host still launches the work)"
    )
    return Advice(
        RemedyId.TIMER_SYNC,
        Part.IDLE_LONG,
        "Time the step without per-micro-batch synchronisations: --timing-log-level 1 (0 outside diagnosis)",
        ranged(share, SYNC_GAP_BACK, basis),
        flags,
        cost="the per-micro-batch timers go (batch-generator: the data wait perfd reads from the log; "
        "forward-compute/backward-compute): the step hook or a capture still gives the data wait",
        notes=notes,
    )


def _microbatches(cfg: JobConfig) -> int | None:
    if not cfg.micro_batch or not cfg.global_batch:
        return None
    per = cfg.micro_batch * (cfg.dp or 1)
    return cfg.global_batch // per if cfg.global_batch % per == 0 else None


def micro_batch(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    m = _microbatches(cfg)
    if cfg.framework is not Framework.MEGATRON or m is None or m < 2 or not cfg.micro_batch:
        return None
    short = b.ms(Part.IDLE_SHORT)
    gaps, syncs = per_step(b, "sync_gap_ms") or 0.0, per_step(b, "syncs") or 0.0
    per_mb_sync = (
        gaps * min(1.0, LEVEL2_SYNCS_PER_MICROBATCH * m / syncs)
        if syncs and cfg.arg("timing_log_level") == "2"
        else 0.0
    )
    base = 0.5 * (short + per_mb_sync)
    if not named(b, base):
        return None
    new = cfg.micro_batch * 2
    flags, notes = flags_for(cfg, ("--micro-batch-size", str(new)))
    if not flags:
        return None
    cost, notes2 = _memory_cost(cfg)
    if cost is None:
        return None
    if cfg.pp and cfg.pp > 1:
        p = cfg.pp
        cost += (
            f"; with {p} pipeline stages the bubble grows from {(p - 1) / (m + p - 1):.0%} to "
            f"{(p - 1) / (m // 2 + p - 1):.0%} ({m} → {m // 2} micro-batches)"
        )
    basis = (
        f"{m} → {m // 2} micro-batches a step: half the short launch gaps ({short:.0f} ms) and half the "
        f"per-micro-batch synchronisation gaps ({per_mb_sync:.0f} ms) go, {base:.0f} ms (× "
        f"{HALF_MICROBATCHES[0]:g}–{HALF_MICROBATCHES[1]:g}: the GEMMs' efficiency moves with their size)"
    )
    return Advice(
        RemedyId.MICRO_BATCH,
        Part.IDLE_SHORT,
        f"Fewer, larger micro-batches: {flags[0].text()} (global batch {cfg.global_batch} unchanged)",
        ranged(base, HALF_MICROBATCHES, basis),
        flags,
        cost=cost,
        notes=(*notes, *notes2),
    )


def _memory_cost(cfg: JobConfig) -> tuple[str | None, tuple[str, ...]]:
    """What doubling the micro-batch asks of memory (None: it does not fit), from the log's report:
    the state the step keeps ("allocated" between steps) plus twice the activations above it."""
    peak, static = cfg.memory_mib.get("max allocated"), cfg.memory_mib.get("allocated")
    total = cfg.gpu_memory_mib
    if peak is None or static is None or total is None:
        return "memory: activations double (the log's memory report or the GPU's size is unknown: check)", ()
    new = static + 2 * (peak - static)
    if new > th.MEMORY_HEADROOM.value * total:
        return None, ()
    return (
        f"memory: peak allocated {peak / 1024:.1f} → ~{new / 1024:.1f} GiB of {total / 1024:.0f} GiB "
        "(activations double)"
    ), ()


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


def cuda_graphs(c: FitContext) -> Advice | None:
    """Only where the launch gaps are large enough to pay for replaying: the low end is a loss."""
    b, cfg = c.budget, c.config
    short = b.ms(Part.IDLE_SHORT)
    if b.step_ms <= 0 or short / b.step_ms < th.LAUNCH_GAPS_FOR_GRAPHS.value:
        return None
    gain = Gain(
        GRAPH_GAPS_BACK[0] * short - GRAPH_REPLAY_COST_OF_STEP * b.step_ms,
        GRAPH_GAPS_BACK[1] * short,
        f"{GRAPH_GAPS_BACK[0]:.0%}–{GRAPH_GAPS_BACK[1]:.0%} of the {short:.0f} ms of short launch gaps come "
        f"back (the graphed regions'), less the replay's input copies and the breaks at syncs and "
        f"dynamic shapes (up to {GRAPH_REPLAY_COST_OF_STEP:.0%} of the step)",
    )
    if cfg.framework is Framework.MEGATRON:
        flags, notes = flags_for(cfg, ("--cuda-graph-impl", "local"))
        if not flags:
            flags, notes = flags_for(cfg, ("--enable-cuda-graph", None))
        if not flags:
            return None
        return Advice(
            RemedyId.CUDA_GRAPHS,
            Part.IDLE_SHORT,
            f"CUDA graphs: {flags[0].text()}",
            gain,
            flags,
            cost="memory for the graphs' static buffers",
            notes=notes,
        )
    return Advice(
        RemedyId.CUDA_GRAPHS,
        Part.IDLE_SHORT,
        'CUDA graphs: torch.compile(model, mode="reduce-overhead")',
        gain,
    )


def fused_layers(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    parts = [p for p in (b.get(Part.NORM), b.get(Part.ACTIVATION), b.get(Part.POINTWISE)) if p is not None]
    ms = sum(p.ms for p in parts)
    if not named(b, ms):
        return None
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
        )
    if cfg.framework is Framework.TORCHTITAN:
        return Advice(
            RemedyId.FUSED_LAYERS,
            Part.POINTWISE,
            "Fused layers: --compile.enable (torch.compile)",
            ranged(ms, FUSED_POINTWISE, basis),
        )
    return Advice(
        RemedyId.FUSED_LAYERS,
        Part.POINTWISE,
        "Fused layers: torch.compile(model)",
        ranged(ms, FUSED_POINTWISE, basis),
    )


def fused_optimizer(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    opt = b.get(Part.OPTIMIZER)
    if opt is None or not named(b, opt.ms):
        return None
    basis = (
        f"the optimizer's {opt.ms:.0f} ms per step in a few multi-tensor kernels instead of chains per "
        f"parameter group (× {FUSED_OPTIMIZER_SAVES[0]:g}–{FUSED_OPTIMIZER_SAVES[1]:g})"
    )
    if cfg.framework is Framework.MEGATRON:
        if not (cfg.missing(PACKAGE_APEX) and cfg.missing(PACKAGE_TE)):
            return None  # Megatron already uses a fused Adam when either is there
        return Advice(
            RemedyId.FUSED_OPTIMIZER,
            Part.OPTIMIZER,
            "A fused optimizer: install Transformer Engine "
            "or Apex (Megatron-LM falls back to torch's per-tensor Adam without them)",
            ranged(opt.ms, FUSED_OPTIMIZER_SAVES, basis),
            needs=(PACKAGE_TE, PACKAGE_APEX),
            needs_one=True,
        )
    if cfg.framework is Framework.TORCHTITAN:
        return Advice(
            RemedyId.FUSED_OPTIMIZER,
            Part.OPTIMIZER,
            "A fused optimizer: --optimizer.implementation fused",
            ranged(opt.ms, FUSED_OPTIMIZER_SAVES, basis),
        )
    return Advice(
        RemedyId.FUSED_OPTIMIZER,
        Part.OPTIMIZER,
        "A fused optimizer: torch.optim.AdamW(params, fused=True)",
        ranged(opt.ms, FUSED_OPTIMIZER_SAVES, basis),
    )


def overlap_comm(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    comm = b.get(Part.COMM_EXPOSED)
    if comm is None or not named(b, comm.ms) or not cfg.dp or cfg.dp < 2:
        return None
    basis = (
        f"exposed communication {comm.ms:.0f} ms per step, run behind the backward pass "
        f"(× {OVERLAP_HIDES[0]:g}–{OVERLAP_HIDES[1]:g})"
    )
    if cfg.framework is Framework.MEGATRON:
        flags, notes = flags_for(
            cfg,
            ("--use-distributed-optimizer", None),
            ("--overlap-grad-reduce", None),
            ("--overlap-param-gather", None),
        )
        if not flags:
            return None
        return Advice(
            RemedyId.OVERLAP_COMM,
            Part.COMM_EXPOSED,
            "Overlap gradient communication with compute: " + " ".join(f.text() for f in flags),
            ranged(comm.ms, OVERLAP_HIDES, basis),
            flags,
            cost="the distributed optimizer shards optimizer state (less memory, a param all-gather)",
            notes=notes,
        )
    return Advice(
        RemedyId.OVERLAP_COMM,
        Part.COMM_EXPOSED,
        "Overlap communication: DDP buckets overlap with "
        "backward by default (check no_sync and find_unused_parameters); FSDP: backward_prefetch",
        ranged(comm.ms, OVERLAP_HIDES, basis),
    )


def data_loader(c: FitContext) -> Advice | None:
    """The data wait the timers measured inside the capture's long gaps (a capture alone cannot tell it
    from another host wait)."""
    b, cfg = c.budget, c.config
    p = b.get(Part.DATA)
    if p is None or not named(b, p.ms):
        return None
    basis = (
        f"the step waits {p.ms:.0f} ms for its batch; a loader that keeps up hides it "
        f"(× {DATA_WAIT_BACK[0]:g}–{DATA_WAIT_BACK[1]:g})"
    )
    return Advice(
        RemedyId.DATA_LOADER,
        Part.DATA,
        DATA_LOADING_ACTION,
        ranged(p.ms, DATA_WAIT_BACK, basis),
        notes=(DATA_KNOBS[cfg.framework],),
    )


def pipeline_wait(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    p = b.get(Part.PIPELINE)
    if p is None or not named(b, p.ms):
        return None
    basis = (
        f"pipeline waits {p.ms:.0f} ms per step: the 1F1B bubble (p−1)/(m+p−1) nearly halves as the "
        f"micro-batches double (× {PIPELINE_WAIT_BACK[0]:g}–{PIPELINE_WAIT_BACK[1]:g}; imbalance between "
        "stages stays)"
    )
    if cfg.framework is Framework.MEGATRON:
        return Advice(
            RemedyId.PIPELINE,
            Part.PIPELINE,
            "Shrink the pipeline wait: more micro-batches per "
            "iteration (a larger --global-batch-size or a smaller --micro-batch-size), interleaved "
            "stages (--num-layers-per-virtual-pipeline-stage), or rebalance layers between stages "
            "(--decoder-last-pipeline-num-layers)",
            ranged(p.ms, PIPELINE_WAIT_BACK, basis),
        )
    return Advice(
        RemedyId.PIPELINE,
        Part.PIPELINE,
        "Shrink the pipeline wait: more micro-batches per step, an interleaved schedule, balanced stages",
        ranged(p.ms, PIPELINE_WAIT_BACK, basis),
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
    overlap_comm,
    bigger_gemms,
    data_loader,
    pipeline_wait,
)


def fit(c: FitContext, remedies: Iterable[Remedy] = REMEDIES) -> list[Advice]:
    """Every remedy the budget calls for on this job, fitted to its configuration, its gain widened by
    the run-to-run spread (:func:`with_spread`). :func:`minor` tells the ones under
    th.REMEDY_MIN_GAIN of the step apart."""
    out = []
    for r in remedies:
        a = r(c)
        if a is not None:
            out.append(dataclasses.replace(a, gain=with_spread(a.gain, c.budget.step_ms)))
    return out


def minor(a: Advice, step_ms: float) -> bool:
    """A gain whose middle is under th.REMEDY_MIN_GAIN of the step: within what a rerun moves."""
    return a.gain is not None and a.gain.mid_ms < th.REMEDY_MIN_GAIN.value * step_ms

"""The remedies for the step's gaps and per-step work, one small function each (the registry is
perfd.analytics.advice.remedy_catalog.REMEDIES): host synchronisations, micro-batch size, the optimizer
(fused Adam; Megatron-LM's gradient norm without Apex or Transformer Engine, an .item() per parameter
tensor; the weight gradient accumulated by its GEMM), communication overlap, the data loader and the
pipeline (CUDA graphs: perfd.analytics.advice.remedy_graphs). Each reads the budget's idle by cause and
phase (perfd.capture.sweep) and the job's configuration, and names what it removes
(:class:`~perfd.analytics.advice.remedies.Removal`) so that a plan counts two remedies acting on the same
gaps once. Pure.
"""
from __future__ import annotations

from perfd.analytics import thresholds as th
from perfd.analytics.advice.remedies import (
    BARE_SYNC,
    DATA_WAIT_BACK,
    FOREACH_SGD_SAVES,
    FUSED_ADAM_SAVES,
    GRAD_ACCUM_SAVES,
    GRAD_NORM_KERNELS,
    GRAD_NORM_SYNCS_BACK,
    HALF_MICROBATCH_LAUNCHES,
    HALF_MICROBATCH_TIMERS,
    MULTI_TENSOR_SAVES,
    OVERLAP_HIDES,
    PER_TENSOR_ADAM_SAVES,
    PER_TENSOR_LAUNCHES_BACK,
    PIPELINE_WAIT_BACK,
    SYNC_EXPOSED_JITTER,
    SYNC_GAP_BACK,
    TIMER_SYNC_BACK,
    Advice,
    FitContext,
    Flag,
    Framework,
    Gain,
    JobConfig,
    RemedyId,
    Removal,
    flags_for,
    gain_of,
    idle_ms,
    named,
    op_ms,
    ranged,
    removal,
)
from perfd.analytics.advice.remedy_said import Said, Say, say
from perfd.analytics.advice.trainer_switches import HF_ACCUMULATION, HF_BATCH, in_terms
from perfd.analytics.breakdown.budget import BudgetPart, IdleCause, Phase, StepBudget
from perfd.analytics.breakdown.casts_seen import weight_casts
from perfd.analytics.breakdown.optimizer_seen import ADAM_CLASSES, OptimizerImpl, OptimizerSeen
from perfd.analytics.breakdown.replay_table import DATA_HOST, MICROBATCH_DEVICE, Change
from perfd.analytics.breakdown.step_parts import Part
from perfd.core.model import PACKAGE_APEX, PACKAGE_TE

LAYERS, OPT = Phase.LAYERS, Phase.OPTIMIZER


def atom_idle(cause: IdleCause, phase: Phase, owner: str = "") -> str:
    """The atom of one slice of idle (the same string in every remedy that acts on it)."""
    return f"idle:{cause.value}:{phase.value}:{owner}"


TIMER_GAPS = atom_idle(IdleCause.SYNC, LAYERS, BARE_SYNC)
LAUNCH_GAPS = atom_idle(IdleCause.LAUNCH, LAYERS)
OPT_LAUNCH_GAPS = atom_idle(IdleCause.LAUNCH, OPT)
# the GPU's own switches between kernels (the host ahead) and the host refilling the queue a sync drained
SWITCH_GAPS = atom_idle(IdleCause.SWITCH, LAYERS)
OPT_SWITCH_GAPS = atom_idle(IdleCause.SWITCH, OPT)
REFILL_GAPS = atom_idle(IdleCause.REFILL, LAYERS)
NORM_SYNCS = atom_idle(IdleCause.SYNC, OPT, "aten::item")


def timer_gaps(b: StepBudget) -> float:
    """The idle after bare device synchronisations in the forward-backward phase: Megatron-LM's
    per-micro-batch timers (their batch-generator one takes the data fetch into its gap)."""
    return idle_ms(b, IdleCause.SYNC, LAYERS, BARE_SYNC)


def microbatches(cfg: JobConfig) -> int | None:
    if not cfg.micro_batch or not cfg.global_batch:
        return None
    per = cfg.micro_batch * (cfg.dp or 1)
    return cfg.global_batch // per if cfg.global_batch % per == 0 else None


def timer_sync(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    if cfg.framework is not Framework.MEGATRON:
        # the gaps the syncs drain and the host's refilling of the queue after them (their knock-on)
        drained, refill = idle_ms(b, IdleCause.SYNC), idle_ms(b, IdleCause.REFILL)
        gaps = drained + refill
        if not drained or not named(b, gaps):
            return None
        n = sum(r.gaps for r in b.idle if r.cause is IdleCause.SYNC)
        owners = sorted({r.owner for r in b.idle if r.cause is IdleCause.SYNC and r.ms >= 0.05 * drained})
        basis = say(Say.SYNC_BASIS, n, ", ".join(owners), drained, refill, *SYNC_GAP_BACK)
        sw = in_terms(RemedyId.TIMER_SYNC, cfg.framework, Say.REMOVE_SYNCS)
        return Advice(
            RemedyId.TIMER_SYNC,
            Part.IDLE_SYNC,
            sw.action,
            ranged(gaps, SYNC_GAP_BACK, basis),
            sw.flags,
            cost=sw.cost_said,
            removes=(removal("idle:sync", gaps, SYNC_GAP_BACK),),
        )
    m = microbatches(cfg)
    gaps = timer_gaps(b)
    if cfg.arg("timing_log_level") != "2" or m is None or not named(b, gaps):
        return None
    flags, notes = flags_for(cfg, ("--timing-log-level", "1"))
    if not flags:
        return None
    basis = say(Say.TIMER_BASIS, gaps, m, *TIMER_SYNC_BACK)
    gaps_gain = ranged(gaps, TIMER_SYNC_BACK, basis)
    replayed = c.replayed(Change.TIMERS, say(Say.TIMER_REPLAYED, m), gaps_gain)
    # the host's jitter is the timers' to give back only where the host sets the pace
    hidden = c.replay is not None and c.replay.host_hidden
    jitter = SYNC_EXPOSED_JITTER * b.step_sd_ms if b.step_sd_ms and not hidden else 0.0
    if replayed is not None and jitter > 0:
        replayed = Gain(replayed.low_ms, replayed.high_ms + jitter,
                        say(Say.HOST_JITTER, replayed.basis, jitter, SYNC_EXPOSED_JITTER))
    return Advice(
        RemedyId.TIMER_SYNC,
        Part.IDLE_SYNC,
        say(Say.TIMER_LEVEL),
        replayed or gaps_gain,
        flags,
        cost=say(Say.TIMER_COST),
        notes=notes,
        removes=(removal(TIMER_GAPS, gaps, TIMER_SYNC_BACK),),
        replay=Change.TIMERS if replayed else None,
    )


# A framework's words for twice the micro-batch, its knobs named (a variant is one more entry)
_MICRO_BATCH_WORDS: dict[Framework, Say] = {Framework.PYTORCH: Say.MICRO_BATCH_TORCH,
                                            Framework.HF_TRAINER: Say.MICRO_BATCH_HF,
                                            Framework.LIGHTNING: Say.MICRO_BATCH_LIGHTNING}
ACCUMULATE_GRADS = "grad_reduce:accumulate"  # autograd's AccumulateGrad adds, one per parameter a micro-batch
WEIGHT_CASTS = "casts:weights"  # autocast's casts of the weights and of their gradients, a set a micro-batch
SPLITK_REDUCES = "gemm:splitk_reduce"  # cuBLAS's split-K reductions of the weights' gradients


def micro_batch(c: FitContext) -> Advice | None:
    """Twice the micro-batch, the global batch kept: what is paid per micro-batch halves (the timers'
    gaps, the launches of the forward-backward phase); what is paid per step (the optimizer phase's
    gaps and kernels) stays. Outside Megatron-LM: :func:`loop_micro_batch`."""
    b, cfg = c.budget, c.config
    if cfg.framework is not Framework.MEGATRON:
        return loop_micro_batch(c)
    m = microbatches(cfg)
    if cfg.framework is not Framework.MEGATRON or m is None or m < 2 or not cfg.micro_batch:
        return None
    timers = timer_gaps(b) if cfg.arg("timing_log_level") == "2" else 0.0
    # a capture without its host side has no phases: every short gap is a launch gap. Half as many
    # kernels for the same work: the host's launch gaps, the GPU's own switches between kernels and the
    # refills after the per-micro-batch syncs all halve
    host = idle_ms(b, IdleCause.LAUNCH, LAYERS) if b.idle else b.ms(Part.IDLE_SHORT)
    switch, refill = idle_ms(b, IdleCause.SWITCH, LAYERS), idle_ms(b, IdleCause.REFILL, LAYERS)
    launch = host + switch + refill
    removes = (
        removal(TIMER_GAPS, timers, HALF_MICROBATCH_TIMERS),
        removal(LAUNCH_GAPS, host, HALF_MICROBATCH_LAUNCHES),
        removal(SWITCH_GAPS, switch, HALF_MICROBATCH_LAUNCHES),
        removal(REFILL_GAPS, refill, HALF_MICROBATCH_LAUNCHES),
    )
    gain_mid = sum(r.low_ms + r.high_ms for r in removes) / 2
    if not named(b, gain_mid):
        return None
    new = cfg.micro_batch * 2
    flags, notes = flags_for(cfg, ("--micro-batch-size", str(new)))
    if not flags:
        return None
    cost = memory_cost(cfg)
    if cost is None:
        return None
    if cfg.pp and cfg.pp > 1:
        p = cfg.pp
        cost = say(Say.WITH_BUBBLE, cost, p, (p - 1) / (m + p - 1), (p - 1) / (m // 2 + p - 1), m, m // 2)
    per_step = sum(idle_ms(b, c, OPT) for c in (IdleCause.LAUNCH, IdleCause.SWITCH, IdleCause.SYNC,
                                                 IdleCause.REFILL))
    basis = say(Say.MICRO_BATCH_BASIS, m, m // 2, timers, *HALF_MICROBATCH_TIMERS, launch,
                *HALF_MICROBATCH_LAUNCHES, per_step)
    gaps_gain = gain_of(removes, basis)
    replayed = c.replayed(Change.MICROBATCH, say(Say.MICRO_BATCH_REPLAYED, m // 2, new, m, cfg.micro_batch,
                                                 MICROBATCH_DEVICE[1], MICROBATCH_DEVICE[0]), gaps_gain) \
        if c.budget.replay is not None and c.budget.replay.microbatches == m else None
    return Advice(
        RemedyId.MICRO_BATCH,
        Part.IDLE_SHORT,
        say(Say.MICRO_BATCH, flags[0].text(), cfg.global_batch),
        replayed or gaps_gain,
        flags,
        cost=cost,
        notes=notes,
        removes=removes,
        replay=Change.MICROBATCH if replayed else None,
    )


def loop_micro_batch(c: FitContext) -> Advice | None:
    """A plain loop's micro-batch doubled, its gradient-accumulation steps halved: the micro-batches are
    the forward passes the trace shows between optimizer steps (perfd.capture.step_replay), and what each
    pays that does not grow with its rows goes with the absorbed ones: the launch gaps (the launches
    themselves and the host's Python between them), autograd's AccumulateGrad adds (remedies:
    HALF_MICROBATCH_LAUNCHES and the note above it), and autocast's casts of the weights to the compute
    dtype and of their gradients back, a weight's size whatever the rows (the trace's own:
    perfd.analytics.breakdown.casts_seen, which tells them from the activations'). The replay, where it
    reaches the job's clock, gives the change whole (each kernel of the doubled micro-batch 1.9-2.0× as
    long); there the casts are among its kernels, not added to it."""
    b, cfg = c.budget, c.config
    words = _MICRO_BATCH_WORDS.get(cfg.framework)
    m = b.replay.microbatches if b.replay is not None else None
    if words is None or m is None or m < 2 or m % 2:
        return None  # an odd count does not halve into micro-batches of twice the rows
    kept = m // 2
    absorbed = (m - kept) / m
    # the GPU's own switches between the kernels it had queued: one a kernel, so those of the absorbed
    # micro-batches' small kernels go with them; the host's launch gaps (it issued slower than the GPU
    # ran) mostly go, half as many kernels launched for the same work
    switch = idle_ms(b, IdleCause.SWITCH, LAYERS)
    host = idle_ms(b, IdleCause.LAUNCH, LAYERS) if b.idle else b.ms(Part.IDLE_SHORT)
    acc = op_ms(b.get(Part.GRAD_REDUCE), "accumulategrad")
    acc_share = ((m - kept) / m, (m - kept) / (m - 1))
    # the weights' casts and their gradients': one set a micro-batch, those of the absorbed ones go
    casts = weight_casts(b.casts, m)
    cast_ms, cast_n = sum(g.ms for g in casts), sum(g.count for g in casts) / m
    # cuBLAS's split-K reductions, a weight's size each (perfd.analytics.breakdown.splitk_seen): those
    # of the absorbed micro-batches go where cuBLAS keeps its split at twice the rows, none where it
    # splits twice as far; which it picks no trace of the current size says, so both ends
    splitk_n = b.splitk.per_microbatch(m) if b.splitk is not None else None
    splitk_ms = b.splitk.ms if b.splitk is not None and splitk_n else 0.0
    removes = (
        Removal(SWITCH_GAPS, switch * absorbed, switch * absorbed),
        Removal(LAUNCH_GAPS, host * HALF_MICROBATCH_LAUNCHES[0], host * HALF_MICROBATCH_LAUNCHES[1]),
        removal(ACCUMULATE_GRADS, acc, acc_share),
        Removal(WEIGHT_CASTS, cast_ms * absorbed, cast_ms * absorbed),
        Removal(SPLITK_REDUCES, 0.0, splitk_ms * absorbed),
    )
    if not named(b, sum(r.low_ms + r.high_ms for r in removes) / 2):
        return None
    basis = say(Say.MICRO_BATCH_TORCH_BASIS, m, kept, switch, absorbed, host, *HALF_MICROBATCH_LAUNCHES,
                say(Say.ACCUMULATE_GOES, acc, *acc_share) if acc else None,
                say(Say.WEIGHT_CASTS_GO, cast_n, cast_ms, absorbed) if cast_ms else None,
                say(Say.SPLITK_GO, splitk_n, splitk_ms, absorbed) if splitk_ms else None)
    gaps_gain = gain_of(removes, basis)
    what = say(Say.MICRO_BATCH_TORCH_REPLAYED, kept, m, MICROBATCH_DEVICE[1], MICROBATCH_DEVICE[0])
    replayed = c.replayed(Change.MICROBATCH, what, gaps_gain)
    # the Trainer's own switches: a flag each (the batch size the job's to scale, the steps set)
    flags = (Flag(HF_BATCH.option, f"{m / kept:g}× its value"), Flag(HF_ACCUMULATION.option, str(kept))) \
        if cfg.framework is Framework.HF_TRAINER else ()
    return Advice(
        RemedyId.MICRO_BATCH,
        Part.IDLE_SHORT,
        say(words, m, kept, m / kept),
        replayed or gaps_gain,
        flags,
        cost=say(Say.ACTIVATION_MEMORY, m / kept),
        notes=(say(Say.ONE_MICRO_BATCH, m),) if m > 2 else (),
        removes=removes,
        replay=Change.MICROBATCH if replayed else None,
    )


def memory_cost(cfg: JobConfig) -> Said | None:
    """What doubling the micro-batch asks of memory (None: it does not fit), from the log's report:
    the state the step keeps ("allocated" between steps) plus twice the activations above it."""
    peak, static = cfg.memory_mib.get("max allocated"), cfg.memory_mib.get("allocated")
    total = cfg.gpu_memory_mib
    if peak is None or static is None or total is None:
        return say(Say.MEMORY_UNKNOWN)
    new = static + 2 * (peak - static)
    if new > th.MEMORY_HEADROOM.value * total:
        return None
    return say(Say.MEMORY_PEAK, peak / 1024, new / 1024, total / 1024)


# --- the optimizer phase ------------------------------------------------------------------------------
# The ops of an update run per parameter (torch.optim's for-loop implementation), lower case: Adam's
# (or a kernel named for it), SGD's step and its momentum buffer's
_ADAM_UPDATE = ("adam", "lerp", "addcdiv", "addcmul", "sqrt")
_SGD_UPDATE = ("aten::add_", "aten::mul_")


def _adam_kernels(b: StepBudget) -> tuple[float, bool]:
    """The optimizer part's Adam kernels per step, and whether they are torch's multi-tensor (foreach)
    ones (else per tensor)."""
    opt = b.get(Part.OPTIMIZER)
    foreach = op_ms(opt, "_foreach_")
    if foreach > 0:
        return foreach, True
    return op_ms(opt, *_ADAM_UPDATE), False


def fused_optimizer(c: FitContext) -> Advice | None:
    """A fused Adam (and, in Megatron-LM, the multi-tensor scale that clipping and the master weights'
    copy use): what the optimizer phase's kernels and launch gaps cost a complete step, less what one
    fused pass over the same bytes costs. A loop's torch.optim optimizer the trace names is fused as its
    own class (:func:`_fused_torch_optimizer`)."""
    b, cfg = c.budget, c.config
    opt = b.get(Part.OPTIMIZER)
    if opt is None:
        return None
    seen = b.optimizer
    if cfg.framework.hooked and seen is not None and seen.cls is not None:
        return _fused_torch_optimizer(c, opt, seen)
    adam, foreach = _adam_kernels(b)
    saves = FUSED_ADAM_SAVES if foreach else PER_TENSOR_ADAM_SAVES
    megatron = cfg.framework is Framework.MEGATRON
    scale = op_ms(opt, "aten::mul", "aten::copy_") if megatron else 0.0
    # fewer kernels: the host's launch gaps and the GPU's own switches between them both go
    host, switch = idle_ms(b, IdleCause.LAUNCH, OPT), idle_ms(b, IdleCause.SWITCH, OPT)
    launch = host + switch
    removes = [removal("optimizer:adam", adam, saves)]
    if scale:
        removes.append(removal("optimizer:per-tensor-scale", scale, MULTI_TENSOR_SAVES))
    if host:
        removes.append(removal(OPT_LAUNCH_GAPS, host, PER_TENSOR_LAUNCHES_BACK))
    if switch:
        removes.append(removal(OPT_SWITCH_GAPS, switch, PER_TENSOR_LAUNCHES_BACK))
    mid = sum(r.low_ms + r.high_ms for r in removes) / 2
    if not named(b, mid):
        return None
    kind = say(Say.FOREACH_ADAM if foreach else Say.PER_TENSOR_ADAM)
    basis = say(Say.OPTIMIZER_BASIS, kind, adam, *saves,
                say(Say.OPT_SCALE, scale, *MULTI_TENSOR_SAVES) if scale else None,
                say(Say.OPT_LAUNCH, launch, *PER_TENSOR_LAUNCHES_BACK) if launch else None)
    gain = gain_of(removes, basis)
    if megatron:
        if cfg.present(PACKAGE_APEX) or cfg.present(PACKAGE_TE):
            return None  # Megatron already uses a fused Adam when either is there
        needs = (PACKAGE_TE, PACKAGE_APEX) if cfg.missing(PACKAGE_APEX) and cfg.missing(PACKAGE_TE) else ()
        return Advice(
            RemedyId.FUSED_OPTIMIZER,
            Part.OPTIMIZER,
            say(Say.FUSED_OPTIMIZER_INSTALL, kind),
            gain,
            needs=needs,
            needs_one=True,
            removes=tuple(removes),
            requires=(PACKAGE_TE, PACKAGE_APEX),
            notes=() if needs else (say(Say.TE_APEX_UNSHOWN),),
        )
    sw = in_terms(RemedyId.FUSED_OPTIMIZER, cfg.framework, Say.FUSED_OPTIMIZER_TORCH)
    # the model is Adam's (its foreach or per-tensor kernels): a trainer's words name AdamW
    return Advice(RemedyId.FUSED_OPTIMIZER, Part.OPTIMIZER, sw.action_with("AdamW"), gain, sw.flags,
                  removes=tuple(removes))


def _fused_torch_optimizer(c: FitContext, opt: BudgetPart, seen: OptimizerSeen) -> Advice | None:
    """``fused=True`` for the torch.optim class the trace's step annotations name (SGD, Adam, AdamW),
    modelled on that optimizer's own work in the optimizer phase: the update's kernels (the gradient
    norm's are the clipping's, kept) and, for the for-loop implementation, the launch gaps of its
    per-parameter loop. A foreach update launches a kernel per operation, not per parameter: the
    phase's gaps are the host's around it (the loop's hooks, the clipping), which fusing leaves. None
    for a class torch has no fused kernel of, one the job runs fused already, or a phase too small."""
    b, cfg = c.budget, c.config
    if not seen.fusable or seen.cls is None:
        return None
    phase = b.phase_ms.get(OPT, {})
    if b.phase_ms and not named(b, sum(phase.values())):
        return None
    impl = seen.impl or (OptimizerImpl.FOREACH if op_ms(opt, "_foreach_") else OptimizerImpl.PER_PARAMETER)
    adam = seen.cls in ADAM_CLASSES
    if impl is OptimizerImpl.FOREACH:
        update = op_ms(opt, "_foreach_") - op_ms(opt, "_foreach_norm")
        saves, launch = (FUSED_ADAM_SAVES if adam else FOREACH_SGD_SAVES), 0.0
        kind = say(Say.FOREACH_OF, seen.cls)
    else:
        update = op_ms(opt, *(_ADAM_UPDATE if adam else _SGD_UPDATE))
        saves, launch = PER_TENSOR_ADAM_SAVES, idle_ms(b, IdleCause.LAUNCH, OPT)
        kind = say(Say.PER_PARAMETER_OF, seen.cls)
    if Part.OPTIMIZER in phase:  # the update's kernels are the phase's: the zeroing's (if any) are not
        update = min(update, phase[Part.OPTIMIZER])
    removes = [removal("optimizer:update", update, saves)]
    if launch:
        removes.append(removal(OPT_LAUNCH_GAPS, launch, PER_TENSOR_LAUNCHES_BACK))
    if not named(b, sum(r.low_ms + r.high_ms for r in removes) / 2):
        return None
    basis = say(Say.OPTIMIZER_CLASS_BASIS, sum(phase.values()), kind, update, seen.cls, *saves,
                say(Say.OPT_LAUNCH, launch, *PER_TENSOR_LAUNCHES_BACK) if launch else None)
    # the Trainer's --optim names a fused AdamW only: another class goes to it as the loop's own optimizer
    framework = cfg.framework if adam or cfg.framework is not Framework.HF_TRAINER else Framework.PYTORCH
    sw = in_terms(RemedyId.FUSED_OPTIMIZER, framework, Say.FUSED_OPTIMIZER_CLASS, given=1)
    return Advice(RemedyId.FUSED_OPTIMIZER, Part.OPTIMIZER, sw.action_with(seen.cls), gain_of(removes, basis),
                  sw.flags, removes=tuple(removes))


def grad_norm(c: FitContext) -> Advice | None:
    """Megatron-LM without Apex or Transformer Engine computes the gradient norm with
    local_multi_tensor_l2_norm: a torch.norm per parameter tensor, then torch.tensor() of the list, an
    .item() each — a device synchronisation per tensor in the optimizer phase."""
    b, cfg = c.budget, c.config
    if cfg.framework is not Framework.MEGATRON or cfg.present(PACKAGE_APEX) or cfg.present(PACKAGE_TE):
        return None
    syncs = idle_ms(b, IdleCause.SYNC, OPT, "aten::item")
    n = sum(
        r.gaps for r in b.idle if r.cause is IdleCause.SYNC and r.phase is OPT and r.owner == "aten::item"
    )
    norms = op_ms(b.get(Part.OPTIMIZER), "linalg_vector_norm", "aten::norm")
    removes = (
        removal(NORM_SYNCS, syncs, GRAD_NORM_SYNCS_BACK),
        removal("optimizer:norm", norms, GRAD_NORM_KERNELS),
    )
    mid = sum(r.low_ms + r.high_ms for r in removes) / 2
    if not syncs or not named(b, mid):
        return None
    needs = (PACKAGE_TE, PACKAGE_APEX) if cfg.missing(PACKAGE_APEX) and cfg.missing(PACKAGE_TE) else ()
    basis = say(Say.GRAD_NORM_BASIS, n, syncs, *GRAD_NORM_SYNCS_BACK, norms, *GRAD_NORM_KERNELS)
    return Advice(
        RemedyId.GRAD_NORM,
        Part.IDLE_SYNC,
        say(Say.GRAD_NORM),
        gain_of(removes, basis),
        needs=needs,
        needs_one=True,
        removes=removes,
        requires=(PACKAGE_TE, PACKAGE_APEX),
        notes=() if needs else (say(Say.TE_APEX_UNSHOWN),),
    )


def grad_accum_fusion(c: FitContext) -> Advice | None:
    """With --no-gradient-accumulation-fusion each linear layer's weight gradient is a GEMM into a
    temporary, then a separate main_grad += kernel (the gradient reduction part; with DP=1 nothing else
    is there); the fused path (Apex's fused_weight_gradient_mlp_cuda or Transformer Engine) accumulates
    in the GEMM itself."""
    b, cfg = c.budget, c.config
    p = b.get(Part.GRAD_REDUCE)
    if (
        cfg.framework is not Framework.MEGATRON
        or p is None
        or cfg.arg("gradient_accumulation_fusion") != "False"
    ):
        return None
    acc = op_ms(p, "add_")
    exposed = min(p.ms, acc) if acc else p.ms
    if not named(b, exposed):
        return None
    have = cfg.present(PACKAGE_APEX) or cfg.present(PACKAGE_TE)
    needs = () if have else (PACKAGE_TE, PACKAGE_APEX)
    removes = (removal("grad_reduce:main_grad", exposed, GRAD_ACCUM_SAVES),)
    side = p.detail.get("side_stream_ms")
    basis = say(Say.GRAD_ACCUM_BASIS, acc or p.ms,
                say(Say.SIDE_STREAM, float(side)) if isinstance(side, (int, float)) and side else None,
                exposed, *GRAD_ACCUM_SAVES)
    act = say(Say.GRAD_ACCUM_INSTALL if needs else Say.GRAD_ACCUM)
    return Advice(
        RemedyId.GRAD_ACCUM_FUSION,
        Part.GRAD_REDUCE,
        act,
        gain_of(removes, basis),
        remove=("--no-gradient-accumulation-fusion",),
        needs=needs,
        needs_one=True,
        removes=removes,
        requires=(PACKAGE_TE, PACKAGE_APEX),
    )


# --- communication, data, pipeline --------------------------------------------------------------------
def overlap_comm(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    comm = b.get(Part.COMM_EXPOSED)
    if comm is None or not named(b, comm.ms) or not cfg.dp or cfg.dp < 2:
        return None
    basis = say(Say.OVERLAP_BASIS, comm.ms, *OVERLAP_HIDES)
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
            say(Say.OVERLAP_FLAGS, " ".join(f.text() for f in flags)),
            ranged(comm.ms, OVERLAP_HIDES, basis),
            flags,
            cost=say(Say.OVERLAP_COST),
            notes=notes,
        )
    sw = in_terms(RemedyId.OVERLAP_COMM, cfg.framework, Say.OVERLAP_DDP)
    return Advice(RemedyId.OVERLAP_COMM, Part.COMM_EXPOSED, sw.action, ranged(comm.ms, OVERLAP_HIDES, basis),
                  sw.flags)


FETCHED = "data:fetch"  # the atom: the training thread's own fetches of its batches


def data_loader(c: FitContext) -> Advice | None:
    """The data wait the timers measured (or the capture saw inside the data loader), hidden by a loader
    that keeps up. Where the capture shows a loader without workers (the batch made on the training
    thread), the replay moves its fetches to worker processes (Change.DATA): in a step the host paces,
    all of a fetch's time is the step's, the part under which the GPU still ran queued work too, which
    no slice of the GPU's idle shows (run_clm.py on the H200: a 7 ms data wait, 23 ms measured)."""
    b, cfg = c.budget, c.config
    p = b.get(Part.DATA)
    data = p is not None and named(b, p.ms)
    gaps = ranged(p.ms, DATA_WAIT_BACK, say(Say.DATA_BASIS, p.ms, *DATA_WAIT_BACK)) \
        if p is not None and data else None
    fetch = b.replay.fetch_ms if b.replay is not None else 0.0
    replayed = c.replayed(Change.DATA, say(Say.DATA_REPLAYED, fetch, *DATA_HOST), gaps) if fetch > 0 else None
    if replayed is not None and not named(b, replayed.high_ms):
        return None  # the fetches the workers would take are too small to name (a slice of a tensor)
    gain = replayed or gaps
    if gain is None:
        return None
    sw = in_terms(RemedyId.DATA_LOADER, cfg.framework, Say.DATA_LOADER)
    return Advice(
        RemedyId.DATA_LOADER,
        Part.DATA,
        sw.action,
        gain,
        sw.flags,
        notes=(say(Say.DATA_KNOBS, cfg.framework.value),),
        removes=(Removal(FETCHED, gain.low_ms, gain.high_ms),) if gain is replayed else (),
        replay=Change.DATA if gain is replayed else None,
    )


def pipeline_wait(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    p = b.get(Part.PIPELINE)
    if p is None or not named(b, p.ms):
        return None
    basis = say(Say.PIPELINE_BASIS, p.ms, *PIPELINE_WAIT_BACK)
    act = say(Say.PIPELINE_MEGATRON if cfg.framework is Framework.MEGATRON else Say.PIPELINE)
    return Advice(RemedyId.PIPELINE, Part.PIPELINE, act, ranged(p.ms, PIPELINE_WAIT_BACK, basis))

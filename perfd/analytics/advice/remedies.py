"""What a remedy is, and what it reads (issue "remedies an engineer can apply without checking", items
2–3): the typed shapes (JobConfig, Gain, Advice), the model constants every gain range is built from,
and the helpers that check a Megatron-LM option against the job's release. The remedies themselves,
one small function each, are perfd.analytics.advice.remedy_catalog. Pure.

Each remedy reads the budget's parts (divided by op:
perfd.capture.ops) and the job's configuration (its framework and version, its argument dump, the
packages its start-up says are missing, its memory report) and returns :class:`Advice` or nothing:

- it names only options the job's release accepts (perfd.analytics.advice.megatron_options, recorded from
  each release's own parser), never one already set to the value it would set;
- it says what it needs that the job lacks ("install Apex, then ...") and what it costs (attention
  dropout is regularisation; a larger micro-batch needs the memory the log reports free);
- its expected gain is a range from a model of what the change removes and what it adds, with the
  model's inputs in ``basis`` (the constants below say why each range is as wide as it is). A range
  whose low end is below zero promises nothing: the text says the change may be slower.

Measured against the change applied one at a time on an H100 (docs/evidence/remedies_h100/): the
ranges' constants were set from the first of those runs and checked by the next, on a fresh capture.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.advice import megatron_options as mo
from perfd.analytics.advice.remedy_said import Said, Say, say
from perfd.analytics.advice.replay_gains import ReplayGains, calibrate
from perfd.analytics.breakdown.budget import BudgetPart, IdleCause, Phase, StepBudget
from perfd.analytics.breakdown.replay_table import FUSED_DEVICE, Change
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.common import TextEnum
from perfd.core.model import (
    ABSENT,
    HF_TRAINER_FRAMEWORK,
    HOOK_FRAMEWORK,
    HOOK_FRAMEWORKS,
    LIGHTNING_FRAMEWORK,
    TORCHTITAN_FRAMEWORK,
)


class Framework(TextEnum):
    MEGATRON = "megatron"
    PYTORCH = HOOK_FRAMEWORK  # the step hook in a plain loop
    TORCHTITAN = TORCHTITAN_FRAMEWORK
    # The step hook driven by a trainer's callback (perfd.hook.hf, perfd.hook.lightning): the same loop
    # seen, advice in the trainer's own switches (perfd.analytics.advice.trainer_switches).
    HF_TRAINER = HF_TRAINER_FRAMEWORK
    LIGHTNING = LIGHTNING_FRAMEWORK

    @staticmethod
    def of(name: str | None) -> Framework:
        """A JobInfo.framework value; any other framework gets the PyTorch remedies."""
        try:
            return Framework(str(name))
        except ValueError:
            return Framework.PYTORCH

    @property
    def hooked(self) -> bool:
        """The job's steps come from the step hook in its own loop (plain, or a trainer's callback)."""
        return self.value in HOOK_FRAMEWORKS


class RemedyId(TextEnum):
    FUSED_ATTENTION = "fused_attention"
    GRAD_NORM = "grad_norm"  # Megatron-LM's per-tensor gradient norm without Apex/TE: a sync per tensor
    GRAD_ACCUM_FUSION = "grad_accum_fusion"  # the weight gradient GEMM accumulating into main_grad
    SOFTMAX_FUSION = "softmax_fusion"
    ATTENTION_DROPOUT = "attention_dropout"
    CE_FUSION = "cross_entropy_fusion"
    LOSS_ONLY = "loss_only"  # a compiled model that returns only its loss: no zero gradient for its logits
    TIMER_SYNC = "timer_sync"
    MICRO_BATCH = "micro_batch"
    CUDA_GRAPHS = "cuda_graphs"
    FUSED_LAYERS = "fused_layers"  # TE layers (Megatron) / torch.compile (PyTorch)
    FUSED_OPTIMIZER = "fused_optimizer"
    OVERLAP_COMM = "overlap_comm"
    BIGGER_GEMMS = "bigger_gemms"
    DATA_LOADER = "data_loader"
    PIPELINE = "pipeline"
    RECOMPUTE = "recompute"


@dataclass(frozen=True)
class Flag:
    option: str
    value: str | None = None
    joiner: str = " "  # a command line's "--option value"; "=" for a keyword argument (Lightning's Trainer)

    def text(self) -> str:
        return self.option if self.value is None else f"{self.option}{self.joiner}{self.value}"


@dataclass(frozen=True)
class JobConfig:
    """What the job runs with, as its log (or the hook's job info) says."""

    framework: Framework = Framework.PYTORCH
    version: str | None = None  # the framework's ("0.20.0+48a8f53")
    arguments: Mapping[str, str] = field(default_factory=dict)  # Megatron's dump: dest -> value as printed
    packages: Mapping[str, str] = field(default_factory=dict)  # JobInfo.packages: name -> version | ABSENT
    dp: int | None = None
    pp: int | None = None
    micro_batch: int | None = None
    global_batch: int | None = None
    memory_mib: Mapping[str, float] = field(default_factory=dict)  # the log's largest memory readings
    gpu_memory_mib: float | None = None  # the GPU's memory

    def arg(self, dest: str) -> str | None:
        return self.arguments.get(dest)

    def missing(self, package: str) -> bool:
        return self.packages.get(package) == ABSENT

    def present(self, package: str) -> bool:
        """The start-up says it is there (a version); False when it says absent or says nothing."""
        v = self.packages.get(package)
        return v is not None and v != ABSENT


class Risk(TextEnum):
    """Why a modelled gain is not promised though its whole range is above zero: the remedy as said, applied
    to a job like this one, was measured failing, and what makes it run (the remedy's cost or action says
    it) is not measured. The range stays, what the change would give once it runs; the plan lists the
    remedy with those to measure (not in the set), as it does a range reaching below zero."""

    # torch.compile's CUDA graphs (mode="reduce-overhead") with several micro-batches a step: micro-batch
    # k's outputs and autograd graph are alive when k + 1 replays the graphs over them (measured: the Hugging
    # Face Trainer, 4 a step, on an H200: docs/evidence/loops_ab_h200)
    GRAPHS_MICRO_BATCHES = "graphs_micro_batches"
    # the Hugging Face Trainer's CUDA graphs: its own training step calls the model, so the mark that each
    # forward needs is not the user's to add there (measured failing as above)
    GRAPHS_TRAINER = "graphs_trainer"
    # one micro-batch a step: a module that keeps a tensor it made in forward (a cache) fails even with the
    # mark before each forward (measured: Lightning's Transformer demo, the mark first in training_step:
    # docs/evidence/loops_ab2_h200); no trace shows whether a module does
    GRAPHS_KEPT_TENSOR = "graphs_kept_tensor"
    # torch.compile where the replay's gain is the host's (its launches fewer) and the GPU's fused kernels
    # give under COMPILE_GPU_SHARE of it: the compiled code's own host time (its guards, the graph breaks
    # and recompiles the module's Python causes) is in no eager trace (measured: Lightning's Transformer
    # demo, 3.3-9.5 ms predicted, -0.9 and +1.9 ms measured with its network compiled:
    # docs/evidence/loops_ab3_h200)
    COMPILE_HOST_SIDE = "compile_host_side"

    @property
    def fails_as_said(self) -> bool:
        """The remedy as said was measured failing on such a job (its range is what it gives once it
        runs); else it runs and its gain is what is not known."""
        return self is not Risk.COMPILE_HOST_SIDE


@dataclass(frozen=True)
class Gain:
    """Step time saved per step (ms; negative: slower), as a range, with how it was had."""

    low_ms: float
    high_ms: float
    basis: Said  # how the range was had (its words: perfd.report.remedy_text)
    risk: Risk | None = None  # why a range wholly above zero is not promised all the same

    @property
    def mid_ms(self) -> float:
        return (self.low_ms + self.high_ms) / 2

    @property
    def promised(self) -> bool:
        """The whole range is a gain and nothing puts the change at risk: recommended for its speed."""
        return self.low_ms > 0 and self.risk is None


class Effort(TextEnum):
    """What applying a remedy takes, in the order an engineer does them: minutes, an install, work."""

    FLAG = "flag"  # a command-line option: minutes, a restart
    INSTALL = "install"  # a package the job lacks (then its options)
    CODE = "code"  # a change to the training code or its configuration files

    @property
    def rank(self) -> int:
        return _EFFORT_RANK[self]


_EFFORT_RANK = {Effort.FLAG: 0, Effort.INSTALL: 1, Effort.CODE: 2}


class NoGain(TextEnum):
    """Why a fitted remedy has no modelled gain: it is listed apart from the plan (Plan.unmodelled), never
    ordered among nor combined with the remedies whose gain is read from the budget."""

    # fused attention: the model's core-attention FLOPs (or the GPU's matmul ceiling) are unknown, so what
    # the fused kernel would cost cannot be read, only what the unfused one costs now
    ATTENTION_FLOPS = "attention_flops"
    NOT_MODELLED = "not_modelled"  # a remedy that states no reason of its own


@dataclass(frozen=True)
class Removal:
    """What a remedy takes out of one slice of the step (``atom``, ms per step, low and high; a negative
    value is time it adds, its own kernels). Two remedies that act on the same kernels or gaps name the
    same atom, and a set of remedies removes each atom once, the most any of them removes of it
    (perfd.analytics.advice.plan): their overlap is not counted twice."""

    atom: str
    low_ms: float
    high_ms: float


@dataclass(frozen=True)
class Advice:
    """One remedy fitted to one job."""

    remedy: RemedyId
    part: Part
    action: Said  # what to do, in the job's own terms
    gain: Gain | None
    flags: tuple[Flag, ...] = ()  # options to add (each one its release accepts)
    remove: tuple[str, ...] = ()  # options to take out of the command line
    needs: tuple[str, ...] = ()  # packages the job lacks that the remedy needs
    needs_one: bool = False  # any one of ``needs`` (and of ``requires``) will do
    cost: Said | None = None  # what it costs besides time (model, memory)
    notes: tuple[Said, ...] = ()  # options left out and why, caveats
    removes: tuple[Removal, ...] = ()  # what its gain is made of (sums to ``gain`` before the spread)
    requires: tuple[str, ...] = ()  # packages it needs, present or not (``needs``: those the job lacks)
    # the replay's change its gain was read from (perfd.analytics.advice.replay_gains): a set of such
    # remedies is combined by replaying them together, not by adding what they remove
    replay: Change | None = None
    # packages its action installs whose presence the job does not report (a plain PyTorch loop's
    # start-up says nothing of them): an install all the same, though ``needs`` cannot say it is lacking
    installs: tuple[str, ...] = ()
    no_gain: NoGain | None = None  # why ``gain`` is None (NoGain.NOT_MODELLED where none is said)

    @property
    def effort(self) -> Effort:
        if self.needs or self.installs:
            return Effort.INSTALL
        return Effort.FLAG if self.flags or self.remove else Effort.CODE


@dataclass(frozen=True)
class FitContext:
    budget: StepBudget
    config: JobConfig

    @functools.cached_property
    def replay(self) -> ReplayGains | None:
        """The capture's replay on the job's own clock (None: no replay, or it cannot reach that clock)."""
        b = self.budget
        clock = b.steady_step_ms
        # the job's median is known to within one median's standard error: the run-to-run spread (that
        # of a difference of two medians, which every range carries besides) over sqrt(2)
        known = run_spread_ms(clock, b.step_sd_ms) / math.sqrt(2.0) if clock else 0.0
        return calibrate(b.replay, clock, known)

    def replayed(self, change: Change, what: Said, gaps: Gain | None) -> Gain | None:
        """The gain of ``change`` alone: the span of what the replay gives and what the trace's own
        slices give (``gaps``), the basis saying both (None: no replay). Neither model holds every
        measurement (the replay on the H200's host-bound jobs:
        docs/evidence/entries/33-issue-53-third-h200-a-b-the-launch-by-launch-replay-plan-h20.md; the
        slices on the H100's busy GPU:
        docs/evidence/entries/35-issue-53-fifth-a-b-on-an-h100-gain-model-4-unchanged-every-r.md), so the
        range is what both allow; but where the captured step ran
        longer than the job's (ReplayGains.slices_hold), the replay alone."""
        r = self.replay
        g = r.of((change,)) if r is not None else None
        if r is None or g is None:
            return None
        said = replay_basis(r, what, self.budget.step_ms)
        if gaps is None or not r.slices_hold:
            return Gain(g[0], g[1], said)
        return Gain(min(g[0], gaps.low_ms), max(g[1], gaps.high_ms),
                    say(Say.REPLAY_AND_SLICES, said, g[0], g[1], gaps.basis, gaps.low_ms, gaps.high_ms))


def replay_basis(r: ReplayGains, what: Said, traced_ms: float) -> Said:
    return say(Say.REPLAYED, what, r.scale, r.scales[0], r.scales[1], r.clock_ms, traced_ms)


# --- model constants: why each range is as wide as it is -------------------------------------------
# Fitted on a Megatron-LM job on an H100 (three runs, each predicted from its own capture and measured
# against the job as it ran:
# docs/evidence/entries/25-remedies-applied-one-at-a-time-on-the-issue-s-h100-job-attri.md,
# docs/evidence/remedies_h100) and held to the plan's A/Bs on two other configurations
# (docs/evidence/entries/31-the-plan-s-a-b-on-a-long-sequence-job-v1-model-predictions-w.md and the
# entries after it). Every range also carries the run-to-run spread of a steady
# step: the same job measured twice on one H100 ran 693.2 and 698.2 ms (0.7%), 693.3 and 693.5 ms in
# another pair; a change is told apart from a rerun only beyond it.
RUN_SPREAD_OF_STEP = 0.005
# A job whose steps move more than that (a host-bound job synchronised every micro-batch: on the H200
# the long-sequence job's steady steps had a robust deviation of ~15 ms of 200, its reruns' medians
# 197-209 ms) is told apart from a rerun only beyond its own spread: the standard error of the
# difference of two medians of RUN_SPREAD_STEPS steady steps, sqrt(2) x 1.2533 x sigma / sqrt(n), sigma
# the robust deviation of the job's steady steps (StepBudget.step_sd_ms).
RUN_SPREAD_STEPS = 20
MEDIAN_SE_OF_SD = 1.2533  # a median's standard error over a mean's, for normal steps (sqrt(pi / 2))
# The gain model's version, written with every plan the GPU A/B records (its evidence is checked against
# the model that wrote it): 1 = every range widened by RUN_SPREAD_OF_STEP; 2 = by the job's own spread;
# 3 = the host-side remedies (timers, micro-batch, CUDA graphs, dropout) read from the replay of the
# capture on the job's own clock (perfd.analytics.advice.replay_gains); 4 = as 3 where the profiler slowed
# the trace's host, the span of the replay's and the trace slices' ranges where it did not (the H100 A/B
# held the slices, not the replay: docs/evidence/README.md); 5 = as 4 with the job's clock matched to the
# replay less the time the replay does not model (perfd.analytics.advice.replay_gains); 6 = as 5 with the
# replay alone where the GPU hides the host (tried, not kept: docs/evidence/plan_h100_v8); 7 = as 5, the
# timers' host-jitter term (SYNC_EXPOSED_JITTER) only where the host sets the step's pace
# (ReplayGains.host_hidden).
GAIN_MODEL = 7
# The model's own uncertainty, each range below; the run-to-run spread is added once, beside it. Removing
# kernels from a busy GPU gives back their time; their launches and the gaps around them move too
# (attention dropout: 0.85–1.13 of its kernels' time in three runs, within the spread of 1.0 in each).
REMOVED_KERNELS = (0.88, 1.12)
# A fused kernel runs about as long as the longest pass it merges. Megatron's native cross-entropy
# fusion compiles functions that change their inputs in place (the subtraction, the exp into the same
# tensor, the division, the gradient's multiply): torch.compile writes the changed logits back, so part
# of the traffic the fusion would save stays (measured on an H100: 0.36–1.2 of this model's saving, all
# within the run-to-run spread of 0.6–0.9 of it).
MERGED_PASSES = (0.6, 0.9)
# A fused (or chunked) linear + cross-entropy (Liger Kernel's LigerFusedLinearCrossEntropyLoss, Apple's
# Cut Cross-Entropy) computes the logits a block of rows at a time and the loss and its gradient in one
# pass over each block, so the logits (rows × vocabulary) are never written whole nor read back: of the
# loss's kernels it saves at most the separate forward pass over them (about half: nanoGPT's compiled
# loss, 4.7 of 9.8 ms), and it may save none of their time (Cut Cross-Entropy's paper times its loss and
# gradient level with torch.compile's, Liger's chunks run smaller GEMMs): its sure gain is memory. The
# zero gradient a compiled model fills for logits it returns goes with the logits (REMOVED_KERNELS).
FUSED_CE_OF_LOSS = (0.0, 0.5)
# Fused attention (FlashAttention, cuDNN, TE) runs its FLOPs at this share of the measured matmul
# ceiling, forward and backward together (H100, bf16, head dim 64–128, causal, s 1k–8k).
FUSED_ATTENTION_OF_CEILING = (0.3, 0.55)
# The GPU idle after Megatron-LM's per-micro-batch timer synchronisations (forward-backward phase) goes
# with them at --timing-log-level 1: the host no longer drains the device before the next micro-batch
# (measured 0.82–1.21 of it in three runs: within the run-to-run spread of 0.9–1.1 of it in each).
TIMER_SYNC_BACK = (0.9, 1.1)
# A host that synchronises every micro-batch waits for each of its own stalls (a page fault, the OS, the
# collector); one running ahead of the GPU hides them in its queue. The replay gives the mean step, not
# that: the timers' range reaches up by the job's host jitter, the distance from its median steady step
# to its 10th percentile (1.28 robust deviations). H200, level 2 -> 1: 45 ms where the replay said 20
# (the base runs' medians 26-27 ms over their fastest steps); 3.7-17.7 ms where it said 1-8. Only where the
# host sets the pace (ReplayGains.host_hidden): on the six A/Bs of GPU-bound jobs (the replayed step's
# elasticity to the host's time 0.04-0.24) the replay alone held every timer change, the term only widened
# them (19.9 ms on the H100's wide_swiglu capture, whose steps' spread is not the host's).
SYNC_EXPOSED_JITTER = 1.28

# Outside Megatron (an .item() or a print in the loop): the host runs ahead once the sync goes; part of
# the gap comes back.
SYNC_GAP_BACK = (0.3, 0.8)
# Twice the micro-batch: half the per-micro-batch timer gaps go, and the host, which launches half as many
# kernels for the same GPU work, leaves most of the forward-backward launch gaps (0.7–0.85 of them: fitted
# on three runs, 25–37 ms measured, each within the run-to-run spread). Per-step gaps (the optimizer
# phase) do not scale.
HALF_MICROBATCH_TIMERS = (0.45, 0.55)
HALF_MICROBATCH_LAUNCHES = (0.7, 0.85)
# A plain PyTorch loop twice the micro-batch (perfd.analytics.advice.remedy_steps.micro_batch): its
# launch gaps under 5 µs are the launches themselves, one a kernel, and go with the kernels of the
# micro-batches absorbed (their share, exactly); its longer ones, the host's Python between launches,
# go as Megatron-LM's do (HALF_MICROBATCH_LAUNCHES). Autograd's AccumulateGrad adds each parameter's
# gradient to the one before every micro-batch after the first (zero_grad(set_to_none=True), torch's
# default) or every one (set_to_none=False): of m micro-batches' m - 1 to m adds, those of the absorbed
# ones go. Neither term grows with the rows.
# CUDA graphs: part of the short launch gaps come back (the graphed regions'); replaying costs input
# copies per graph, and a sync or a dynamic shape breaks a graph: with few gaps it can be slower.
GRAPH_GAPS_BACK = (0.3, 0.8)
GRAPH_REPLAY_COST_OF_STEP = 0.05
# A compiled job (torch.compile) whose host issues its step in this share of the GPU's busy time or more
# has a margin so thin that any stall of its host (a page fault, the garbage collector, a collector) shows
# as idle: nanoGPT's H200 recording, 0.87 (94 ms of the profiled host's work for 108 ms of kernels a
# step), idle 5% of its step though only 3% of it in launch gaps, under LAUNCH_GAPS_FOR_GRAPHS. Its CUDA
# graphs (mode="reduce-overhead") launch each compiled region once, so they pay below that threshold.
GRAPHS_HOST_OF_DEVICE = 0.8
# torch.compile's graphs copy only the inputs that are not static into the graph's buffers (the batch:
# nanoGPT's 16×1024 token ids, 128 KiB, a few µs) and replay one launch a region: counted as up to 1% of
# the step. Unmeasured here; the measured GRAPH_REPLAY_COST_OF_STEP is Megatron-LM's per-layer graphs,
# which copy each layer's inputs.
COMPILED_GRAPH_COST_OF_STEP = 0.01
DATA_WAIT_BACK = (0.5, 0.9)  # the data wait hidden once the loader keeps up (workers, prefetch)
# The 1F1B bubble is (p−1)/(m+p−1): twice the micro-batches nearly halve it; imbalance stays.
PIPELINE_WAIT_BACK = (0.3, 0.6)
# Fusing elementwise and normalisation chains with Transformer Engine's layers: each activation written once.
FUSED_POINTWISE = (0.2, 0.5)
# torch.compile over an eager model fuses far more (whole chains of a layer's elementwise ops, its casts):
# the share of those kernels' device time it saves, from what the replay's model keeps of it
# (replay_table.FUSED_DEVICE, its why there).
COMPILED_SAVES = (1.0 - FUSED_DEVICE[0], 1.0 - FUSED_DEVICE[1])
# torch.compile's gain is promised only where the GPU's side (its fused kernels' time saved, the top of
# the range) is at least this share of the replay's low end: beyond it the gain is the host's, which an
# eager trace cannot model (Risk.COMPILE_HOST_SIDE). The Hugging Face Trainer's Llama: the GPU's side
# up to 81 ms of a replayed 98-152 (compile measured 100-103 ms); Lightning's demo: 0.5 of 3.3-9.5.
COMPILE_GPU_SHARE = 0.5
# Full activation recomputation runs each layer's forward again in its backward: about a third of the
# layers' forward+backward time (forward 1×, backward 2×); the optimizer and the loss are not redone.
RECOMPUTED_FORWARD = (0.6, 1.0)
# A fused Adam reads the parameter, gradient and both moments once and writes three of them back; torch's
# foreach AdamW makes a pass over them per operation (mul_, lerp_, addcmul_, sqrt, div_, add_, addcdiv_):
# the fused kernel costs 0.3–0.5 of them. Per-tensor kernels (no foreach) cost more still.
FUSED_ADAM_SAVES = (0.5, 0.7)
PER_TENSOR_ADAM_SAVES = (0.6, 0.85)
# torch's foreach SGD makes one pass per operation: one without momentum (params += -lr × grads: the
# fused kernel's own pass, nothing saved), three with it (the buffer's mul_ and add_, then the
# parameters'); the fused kernel makes one.
FOREACH_SGD_SAVES = (0.0, 0.65)
# Megatron-LM's local multi_tensor_scale (clipping, copying the master weights back) is a loop of
# per-tensor kernels; Apex's or TE's is one multi-tensor kernel over the same bytes.
MULTI_TENSOR_SAVES = (0.4, 0.7)
# The optimizer phase's launch gaps are its per-tensor loops' (a kernel or two per parameter tensor):
# multi-tensor kernels leave most of them.
PER_TENSOR_LAUNCHES_BACK = (0.5, 0.9)
# Megatron-LM's local gradient norm (megatron.core.utils.local_multi_tensor_l2_norm): torch.norm per
# tensor, then torch.tensor() of the list, an .item() each; a multi-tensor l2 norm is one kernel and no
# sync: the syncs' idle goes (0.85–1.0: the one sync left) and most of the norm kernels.
GRAD_NORM_SYNCS_BACK = (0.85, 1.0)
GRAD_NORM_KERNELS = (0.5, 0.9)
# The weight gradient GEMM accumulating into main_grad (gradient_accumulation_fusion) drops the separate
# main_grad += grad kernels; the GEMM then writes fp32 (a little more traffic).
GRAD_ACCUM_SAVES = (0.6, 1.0)
OVERLAP_HIDES = (0.5, 0.9)  # exposed data-parallel communication hidden behind backward
GEMM_TO_TARGET = (0.3, 0.6)  # the share of the time above the ceiling-at-target bigger GEMMs win back
# The owner perfd.capture.sweep gives a bare torch.cuda.synchronize() (Megatron-LM's timers use it).
BARE_SYNC = "torch.cuda.synchronize()"


# --- Megatron-LM options ---------------------------------------------------------------------------
# Every option a remedy here may name (the table perfd.analytics.advice.megatron_options is generated for).
MEGATRON_OPTIONS: tuple[str, ...] = (
    "--transformer-impl", "--attention-backend", "--use-flash-attn", "--no-masked-softmax-fusion",
    "--attention-dropout", "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl",
    "--timing-log-level", "--micro-batch-size", "--global-batch-size", "--recompute-granularity",
    "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--cuda-graph-impl",
    "--enable-cuda-graph", "--num-workers", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion",
    "--num-layers-per-virtual-pipeline-stage", "--decoder-last-pipeline-num-layers", "--fp8-format",
    "--timing-log-option", "--masked-softmax-fusion", "--bias-gelu-fusion", "--bias-dropout-fusion",
    "--gradient-accumulation-fusion", "--bias-swiglu-fusion", "--ddp-bucket-size",
)


def _flag(cfg: JobConfig, option: str, value: str | None = None) -> tuple[Flag | None, Said | None]:
    """The flag if the job's release accepts it and it is not set to ``value`` already; else None and
    why (None when already set)."""
    ok = mo.exists(option, cfg.version)
    if ok is None and not mo.guess(option):
        return None, say(Say.NOT_AN_OPTION, option, mo.RELEASES[-1])
    if ok is False:
        return None, say(Say.NOT_IN_RELEASE, option, str(mo.release_of(cfg.version)))
    opt = mo.OPTIONS.get(option)
    if opt is not None:
        current = cfg.arg(opt.dest)
        if value is None and current == "True":
            return None, None
        if value is not None and current is not None and _same(current, value):
            return None, None
    return Flag(option, value), (None if ok else say(Say.VERSION_UNKNOWN, option, mo.RELEASES[-1]))


def _same(current: str, value: str) -> bool:
    # an enum as the dump prints it: "AttnBackend.auto", "<AttnBackend.auto: 5>"
    head = current.lstrip("<").split(".", 1)[0]
    if current.startswith("<") or ("." in current and head.isidentifier() and head[:1].isupper()):
        current = current.lstrip("<").split(".", 1)[-1].split(":", 1)[0]
    try:
        return float(current) == float(value)
    except ValueError:
        return current == value


def flags_for(cfg: JobConfig, *wanted: tuple[str, str | None]) -> tuple[tuple[Flag, ...], tuple[Said, ...]]:
    got: list[Flag] = []
    notes: list[Said] = []
    for option, value in wanted:
        f, why = _flag(cfg, option, value)
        if f is not None:
            got.append(f)
        if why:
            notes.append(why)
    return tuple(got), tuple(notes)


# Packages a remedy for a plain PyTorch loop installs (pip install liger-kernel, cut-cross-entropy); the
# step hook does not report them (perfd.core.model.PACKAGES), so a remedy names them in ``installs``.
PACKAGE_LIGER = "liger_kernel"
PACKAGE_CCE = "cut_cross_entropy"
# torch.compile runs each compiled region as one op, its backward as another (op names, lower case)
COMPILED_REGION = "compiledfunction"


# --- what the budget's ops say --------------------------------------------------------------------
def compiled(b: StepBudget) -> bool:
    """The capture shows torch.compile's regions (their ops launched some of the step's kernels)."""
    return any(op_ms(p, COMPILED_REGION) > 0 for p in b.parts)


def op_ms(p: BudgetPart | None, *keys: str) -> float:
    """Per-step ms of the part's ops whose name holds any of ``keys`` (lower case)."""
    if p is None:
        return 0.0
    ops = p.detail.get("op_ms")
    if not isinstance(ops, Mapping):
        return 0.0
    return sum(float(v) for k, v in ops.items() if any(x in str(k).lower() for x in keys)
               and isinstance(v, (int, float)))


def merged(p: BudgetPart | None, groups: Iterable[tuple[str, ...]]) -> float:
    """What merging each group of ops into one pass saves: each group's time but its longest op's."""
    if p is None or not isinstance(p.detail.get("op_ms"), Mapping):
        return 0.0
    ops = {str(k).lower(): float(v) for k, v in p.detail["op_ms"].items() if isinstance(v, (int, float))}
    saved = 0.0
    for keys in groups:
        members = [v for k, v in ops.items() if any(x in k for x in keys)]
        if len(members) > 1:
            saved += sum(members) - max(members)
    return saved


def ranged(ms: float, lo_hi: tuple[float, float], basis: Said) -> Gain:
    return Gain(ms * lo_hi[0], ms * lo_hi[1], basis)


def removal(atom: str, ms: float, lo_hi: tuple[float, float] = (1.0, 1.0)) -> Removal:
    return Removal(atom, ms * lo_hi[0], ms * lo_hi[1])


def gain_of(removes: Iterable[Removal], basis: Said) -> Gain:
    """The gain a remedy's removals add up to."""
    rs = list(removes)
    return Gain(sum(r.low_ms for r in rs), sum(r.high_ms for r in rs), basis)


def idle_ms(b: StepBudget, cause: IdleCause, phase: Phase | None = None, owner: str | None = None) -> float:
    """Per-step idle of one cause (in one phase, after one owner's syncs) as the capture charged it."""
    return sum(r.ms for r in b.idle if r.cause is cause and (phase is None or r.phase is phase)
               and (owner is None or r.owner == owner))


def run_spread_ms(step_ms: float, step_sd_ms: float | None) -> float:
    """How far a rerun's median step moves: the job's own spread (RUN_SPREAD_STEPS), never under
    RUN_SPREAD_OF_STEP of the step."""
    floor = RUN_SPREAD_OF_STEP * step_ms
    if step_sd_ms is None or step_sd_ms <= 0:
        return floor
    return max(floor, math.sqrt(2.0) * MEDIAN_SE_OF_SD * step_sd_ms / math.sqrt(RUN_SPREAD_STEPS))


def spread_said(spread_ms: float, step_ms: float) -> Said:
    """How a range's run-to-run spread is said beside it: its ms, its share of the step, and whether it is
    the job's own steps' spread (over the floor)."""
    own = step_ms > 0 and spread_ms > run_spread_ms(step_ms, None)
    share = say(Say.SPREAD_SHARE, spread_ms / step_ms) if step_ms > 0 else say(Say.NO_STEP)
    return say(Say.SPREAD, spread_ms, share, say(Say.OWN_SPREAD) if own else None)


def with_spread(g: Gain | None, b: StepBudget) -> Gain | None:
    """The range widened by the run-to-run spread of the step (:func:`run_spread_ms`): what a measured
    change is held to."""
    if g is None:
        return None
    s = run_spread_ms(b.step_ms, b.step_sd_ms)
    return Gain(g.low_ms - s, g.high_ms + s, say(Say.WITH_SPREAD, g.basis, spread_said(s, b.step_ms)), g.risk)


def named(b: StepBudget, ms: float) -> bool:
    """The part (or the ops) a remedy acts on hold enough of the step to be worth one."""
    return b.step_ms > 0 and ms / b.step_ms >= th.BUDGET_PART_NAMED.value

"""What to do about a step's budget, fitted to the job's own configuration (issue "remedies an
engineer can apply without checking", items 2–3). Pure: a budget and a JobConfig in, Advice out.

Each remedy is one small function in :data:`REMEDIES` that reads the budget's parts (divided by op:
perfd.capture.ops) and the job's configuration (its framework and version, its argument dump, the
packages its start-up says are missing, its memory report) and returns :class:`Advice` or nothing:

- it names only options the job's release accepts (perfd.analytics.megatron_options, recorded from
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

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from perfd.analytics import megatron_options as mo
from perfd.analytics import thresholds as th
from perfd.analytics.budget import BudgetPart, Part, StepBudget
from perfd.analytics.common import TextEnum
from perfd.analytics.verdict_text import DATA_LOADING_ACTION
from perfd.model import ABSENT, PACKAGE_APEX, PACKAGE_TE


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


class RemedyId(TextEnum):
    FUSED_ATTENTION = "fused_attention"
    SOFTMAX_FUSION = "softmax_fusion"
    ATTENTION_DROPOUT = "attention_dropout"
    CE_FUSION = "cross_entropy_fusion"
    TIMER_SYNC = "timer_sync"
    MICRO_BATCH = "micro_batch"
    CUDA_GRAPHS = "cuda_graphs"
    FUSED_LAYERS = "fused_layers"  # TE layers (Megatron) / torch.compile (PyTorch)
    FUSED_OPTIMIZER = "fused_optimizer"
    OVERLAP_COMM = "overlap_comm"
    BIGGER_GEMMS = "bigger_gemms"
    DATA_LOADER = "data_loader"
    PIPELINE = "pipeline"


@dataclass(frozen=True)
class Flag:
    option: str
    value: str | None = None

    def text(self) -> str:
        return self.option if self.value is None else f"{self.option} {self.value}"


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


@dataclass(frozen=True)
class Gain:
    """Step time saved per step (ms; negative: slower), as a range, with how it was had."""

    low_ms: float
    high_ms: float
    basis: str

    @property
    def mid_ms(self) -> float:
        return (self.low_ms + self.high_ms) / 2

    @property
    def promised(self) -> bool:
        """The whole range is a gain: the change is recommended for its speed."""
        return self.low_ms > 0


@dataclass(frozen=True)
class Advice:
    """One remedy fitted to one job."""

    remedy: RemedyId
    part: Part
    action: str  # what to do, in the job's own terms
    gain: Gain | None
    flags: tuple[Flag, ...] = ()  # options to add (each one its release accepts)
    remove: tuple[str, ...] = ()  # options to take out of the command line
    needs: tuple[str, ...] = ()  # packages the job lacks that the remedy needs
    needs_one: bool = False  # any one of ``needs`` will do
    cost: str = ""  # what it costs besides time (model, memory)
    notes: tuple[str, ...] = ()  # options left out and why, caveats


@dataclass(frozen=True)
class FitContext:
    budget: StepBudget
    config: JobConfig


# --- model constants: why each range is as wide as it is -------------------------------------------
# Removing kernels from a busy GPU gives back their time; their launches and the gaps around them move
# too, and the ops that remain can grow a little (allocations, a changed memory layout).
REMOVED_KERNELS = (0.85, 1.2)
# A fused kernel runs about as long as the longest pass it merges; how much torch.compile fuses
# (Megatron's native cross-entropy fusion) varies: the range is wide.
MERGED_PASSES = (0.6, 1.4)
# Fused attention (FlashAttention, cuDNN, TE) runs its FLOPs at this share of the measured matmul
# ceiling, forward and backward together (H100, bf16, head dim 64–128, causal, s 1k–8k).
FUSED_ATTENTION_OF_CEILING = (0.3, 0.55)
# The idle after a host synchronisation is the host launching the next work; without the sync the
# host runs ahead and hides part of it; a capture slows the host and lengthens these gaps.
SYNC_GAP_BACK = (0.3, 0.8)
# Half the micro-batches: the per-micro-batch host gaps halve; the GEMMs' efficiency moves a little
# either way with their size (not modelled: the range's width).
HALF_MICROBATCHES = (0.5, 1.2)
# CUDA graphs: part of the short launch gaps come back (the graphed regions'); replaying costs input
# copies per graph, and a sync or a dynamic shape breaks a graph: with few gaps it can be slower.
GRAPH_GAPS_BACK = (0.3, 0.8)
GRAPH_REPLAY_COST_OF_STEP = 0.05
DATA_WAIT_BACK = (0.5, 0.9)  # the data wait hidden once the loader keeps up (workers, prefetch)
# The 1F1B bubble is (p−1)/(m+p−1): twice the micro-batches nearly halve it; imbalance stays.
PIPELINE_WAIT_BACK = (0.3, 0.6)
# Fusing elementwise and normalisation chains (TE layers, torch.compile): each activation written once.
FUSED_POINTWISE = (0.2, 0.5)
FUSED_OPTIMIZER_SAVES = (0.3, 0.7)  # multi-tensor Adam against per-tensor kernels
OVERLAP_HIDES = (0.5, 0.9)  # exposed data-parallel communication hidden behind backward
GEMM_TO_TARGET = (0.3, 0.6)  # the share of the time above the ceiling-at-target bigger GEMMs win back
# Megatron-LM's level-2 timers (forward-compute, backward-compute, batch-generator) start and stop once
# per micro-batch, each with a device synchronisation (megatron/core/timers.py).
LEVEL2_SYNCS_PER_MICROBATCH = 6


# The data loader's knobs per framework (the action itself is DATA_LOADING_ACTION, shared with incidents).
DATA_KNOBS: dict[Framework, str] = {
    Framework.MEGATRON: "Megatron-LM: --num-workers",
    Framework.PYTORCH: "DataLoader(num_workers=N, pin_memory=True, prefetch_factor=4, persistent_workers=True)",
    Framework.TORCHTITAN: "torchtitan: more data-loader workers",
}


# --- Megatron-LM options ---------------------------------------------------------------------------
# Every option a remedy here may name (the table perfd.analytics.megatron_options is generated for).
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


def _flag(cfg: JobConfig, option: str, value: str | None = None) -> tuple[Flag | None, str]:
    """The flag if the job's release accepts it and it is not set to ``value`` already; else None and
    why ("" when already set)."""
    ok = mo.exists(option, cfg.version)
    if ok is None and not mo.guess(option):
        return None, f"{option} is not an option of Megatron-LM {mo.RELEASES[-1]}"
    if ok is False:
        return None, f"{option} does not exist in Megatron-LM {mo.release_of(cfg.version)}"
    opt = mo.OPTIONS.get(option)
    if opt is not None:
        current = cfg.arg(opt.dest)
        if value is None and current == "True":
            return None, ""
        if value is not None and current is not None and _same(current, value):
            return None, ""
    return Flag(option, value), ("" if ok else f"Megatron-LM version unknown: {option} as in "
                                 f"{mo.RELEASES[-1]}")


def _same(current: str, value: str) -> bool:
    try:
        return float(current) == float(value)
    except ValueError:
        return current == value


def _flags(cfg: JobConfig, *wanted: tuple[str, str | None]) -> tuple[tuple[Flag, ...], tuple[str, ...]]:
    got, notes = [], []
    for option, value in wanted:
        f, why = _flag(cfg, option, value)
        if f is not None:
            got.append(f)
        if why:
            notes.append(why)
    return tuple(got), tuple(notes)


# --- what the budget's ops say --------------------------------------------------------------------
def op_ms(p: BudgetPart | None, *keys: str) -> float:
    """Per-step ms of the part's ops whose name holds any of ``keys`` (lower case)."""
    if p is None:
        return 0.0
    ops = p.detail.get("op_ms")
    if not isinstance(ops, Mapping):
        return 0.0
    return sum(float(v) for k, v in ops.items() if any(x in str(k).lower() for x in keys)
               and isinstance(v, (int, float)))


def _merged(p: BudgetPart | None, groups: Iterable[tuple[str, ...]]) -> float:
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


def _range(ms: float, lo_hi: tuple[float, float], basis: str) -> Gain:
    return Gain(ms * lo_hi[0], ms * lo_hi[1], basis)


def _per_step(b: StepBudget, key: str) -> float | None:
    """A per-step figure the capture's budget carries in its host detail (sync gaps and counts)."""
    v = b.host.get(key) if b.host else None
    return float(v) if isinstance(v, (int, float)) else None


def _named(b: StepBudget, ms: float) -> bool:
    """The part (or the ops) a remedy acts on hold enough of the step to be worth one."""
    return b.step_ms > 0 and ms / b.step_ms >= th.BUDGET_PART_NAMED.value


# --- the remedies ------------------------------------------------------------------------------------
def attention_dropout(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    att = b.get(Part.ATTENTION)
    drop = op_ms(att, "dropout")
    if att is None or att.detail.get("fused") or not _named(b, drop):
        return None
    basis = (f"the attention dropout's kernels, forward and backward: {drop:.0f} ms per step by op, run no "
             f"more (× {REMOVED_KERNELS[0]:g}–{REMOVED_KERNELS[1]:g}: the gaps around them move too)")
    current = cfg.arg("attention_dropout")
    cost = (f"regularisation: attention dropout {current or 'the default'} → 0 (large-model pretraining "
            "recipes mostly use 0; watch the validation loss)")
    if cfg.framework is Framework.MEGATRON:
        flags, notes = _flags(cfg, ("--attention-dropout", "0.0"))
        if not flags:
            return None
        return Advice(RemedyId.ATTENTION_DROPOUT, Part.ATTENTION, f"Drop attention dropout: {flags[0].text()}",
                      _range(drop, REMOVED_KERNELS, basis), flags, cost=cost, notes=notes)
    return Advice(RemedyId.ATTENTION_DROPOUT, Part.ATTENTION,
                  "Drop attention dropout: dropout_p=0.0 in scaled_dot_product_attention (attention_dropout=0 "
                  "or attn_pdrop=0 in a Hugging Face config)", _range(drop, REMOVED_KERNELS, basis), cost=cost)


def fused_attention(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    att = b.get(Part.ATTENTION)
    if att is None or att.detail.get("fused") or not _named(b, att.ms):
        return None
    flops, ceiling = att.detail.get("flops"), b.ceiling_tflops
    if isinstance(flops, (int, float)) and flops > 0 and ceiling:
        lo_t = flops / (FUSED_ATTENTION_OF_CEILING[0] * ceiling * 1e9)
        hi_t = flops / (FUSED_ATTENTION_OF_CEILING[1] * ceiling * 1e9)
        gain: Gain | None = Gain(att.ms - lo_t, att.ms - hi_t,
                                 f"attention's {att.ms:.0f} ms per step out, its {flops / 1e12:.1f} TFLOP per "
                                 f"step back in at {FUSED_ATTENTION_OF_CEILING[0]:g}–"
                                 f"{FUSED_ATTENTION_OF_CEILING[1]:g} of the {ceiling:g} TFLOP/s matmul ceiling "
                                 f"({hi_t:.0f}–{lo_t:.0f} ms): fused attention never writes the s×s scores")
    else:
        gain = None
    if cfg.framework is Framework.MEGATRON:
        flags, notes = _flags(cfg, ("--transformer-impl", "transformer_engine"), ("--attention-backend", "flash"))
        needs = (PACKAGE_TE,) if cfg.missing(PACKAGE_TE) else ()
        what = " ".join(f.text() for f in flags)
        act = (f"Fused attention: install Transformer Engine, then {what}" if needs
               else f"Fused attention: {what}")
        return Advice(RemedyId.FUSED_ATTENTION, Part.ATTENTION, act, gain, flags, needs=needs, notes=notes)
    if cfg.framework is Framework.TORCHTITAN:
        return Advice(RemedyId.FUSED_ATTENTION, Part.ATTENTION, "Fused attention: SDPA or flex attention in the "
                      "model (torchtitan's own models use them)", gain)
    return Advice(RemedyId.FUSED_ATTENTION, Part.ATTENTION, "Fused attention: "
                  "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) in place of "
                  "softmax(QKᵀ)·V (attn_implementation=\"sdpa\" in Hugging Face)", gain)


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
    if not _named(b, extra):
        return None
    ok = mo.exists("--no-masked-softmax-fusion", cfg.version) is not False
    needs = (PACKAGE_APEX,) if not cfg.missing(PACKAGE_APEX) is False else ()
    basis = (f"the mask fill and the copies of the score matrix autograd makes for it: {extra:.0f} ms per step "
             f"by op (× {REMOVED_KERNELS[0]:g}–{REMOVED_KERNELS[1]:g}); the fused kernel's softmax costs what "
             "the unfused one does")
    act = ("Fuse scale, mask and softmax: " + ("install Apex with its CUDA extensions (the fused kernels "
           "scaled_masked_softmax_cuda), then " if needs else "") + "remove --no-masked-softmax-fusion")
    return Advice(RemedyId.SOFTMAX_FUSION, Part.ATTENTION, act, _range(extra, REMOVED_KERNELS, basis),
                  remove=("--no-masked-softmax-fusion",) if ok else (), needs=needs)


# Megatron-LM's native fused cross-entropy (megatron/core/fusions/fused_cross_entropy.py) runs the loss in
# four compiled functions: the cast with the max; the shifted exp with its sum and the target's logit;
# the division; and the whole backward.
_CE_GROUPS: tuple[tuple[str, ...], ...] = (
    ("aten::copy_", "aten::to", "aten::max"), ("aten::sub", "aten::exp", "aten::sum", "aten::masked_fill",
                                               "aten::index", "aten::lt", "aten::ge"),
    ("aten::div", "aten::log"), ("backward",))


def ce_fusion(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    loss = b.get(Part.LOSS)
    if cfg.framework is not Framework.MEGATRON or loss is None or not _named(b, loss.ms):
        return None
    saved = _merged(loss, _CE_GROUPS)
    if saved <= 0:
        return None
    wanted: list[tuple[str, str | None]] = [("--cross-entropy-loss-fusion", None)]
    if mo.exists("--cross-entropy-fusion-impl", cfg.version) is not False:
        wanted.append(("--cross-entropy-fusion-impl", "native"))  # TE's needs Transformer Engine
    flags, notes = _flags(cfg, *wanted)
    if not any(f.option == "--cross-entropy-loss-fusion" for f in flags):
        return None
    basis = (f"the loss's {loss.ms:.0f} ms per step in {len(_CE_GROUPS)} fused passes instead of one kernel per "
             f"op: each merged group costs its longest op, {saved:.0f} ms saved (× {MERGED_PASSES[0]:g}–"
             f"{MERGED_PASSES[1]:g}: what torch.compile fuses varies)")
    return Advice(RemedyId.CE_FUSION, Part.LOSS, "Fuse the cross-entropy: " + " ".join(f.text() for f in flags),
                  _range(saved, MERGED_PASSES, basis), flags, notes=notes)


def timer_sync(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    gaps, syncs = _per_step(b, "sync_gap_ms"), _per_step(b, "syncs")
    if not gaps or not syncs or not _named(b, gaps):
        return None
    if cfg.framework is not Framework.MEGATRON:
        basis = (f"{syncs:.0f} device synchronisations a step, the GPU idle {gaps:.0f} ms after them while the "
                 f"host launches again; without them the host runs ahead (× {SYNC_GAP_BACK[0]:g}–"
                 f"{SYNC_GAP_BACK[1]:g})")
        return Advice(RemedyId.TIMER_SYNC, Part.IDLE_LONG, "Remove host synchronisations from the step: "
                      ".item(), .cpu(), torch.cuda.synchronize(), printing tensors; log every N steps",
                      _range(gaps, SYNC_GAP_BACK, basis))
    level = cfg.arg("timing_log_level")
    m = _microbatches(cfg)
    if level != "2" or m is None:
        return None
    removed = min(syncs, LEVEL2_SYNCS_PER_MICROBATCH * m)
    flags, notes = _flags(cfg, ("--timing-log-level", "1"))
    if not flags:
        return None
    share = gaps * removed / syncs
    basis = (f"{syncs:.0f} device synchronisations a step, the GPU idle {gaps:.0f} ms after them; level 1 drops the "
             f"{removed:.0f} of the per-micro-batch timers ({LEVEL2_SYNCS_PER_MICROBATCH} × {m} micro-batches): "
             f"{share:.0f} ms of those gaps, {SYNC_GAP_BACK[0]:.0%}–{SYNC_GAP_BACK[1]:.0%} of which come back (the "
             "host still launches the work)")
    return Advice(RemedyId.TIMER_SYNC, Part.IDLE_LONG,
                  "Time the step without per-micro-batch synchronisations: --timing-log-level 1 (0 outside "
                  "diagnosis)", _range(share, SYNC_GAP_BACK, basis), flags,
                  cost="the per-micro-batch timers go (batch-generator: the data wait perfd reads from the log; "
                  "forward-compute/backward-compute): the step hook or a capture still gives the data wait",
                  notes=notes)


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
    gaps, syncs = _per_step(b, "sync_gap_ms") or 0.0, _per_step(b, "syncs") or 0.0
    per_mb_sync = gaps * min(1.0, LEVEL2_SYNCS_PER_MICROBATCH * m / syncs) if syncs and \
        cfg.arg("timing_log_level") == "2" else 0.0
    base = 0.5 * (short + per_mb_sync)
    if not _named(b, base):
        return None
    new = cfg.micro_batch * 2
    flags, notes = _flags(cfg, ("--micro-batch-size", str(new)))
    if not flags:
        return None
    cost, notes2 = _memory_cost(cfg)
    if cost is None:
        return None
    if cfg.pp and cfg.pp > 1:
        p = cfg.pp
        cost += (f"; with {p} pipeline stages the bubble grows from {(p - 1) / (m + p - 1):.0%} to "
                 f"{(p - 1) / (m // 2 + p - 1):.0%} ({m} → {m // 2} micro-batches)")
    basis = (f"{m} → {m // 2} micro-batches a step: half the short launch gaps ({short:.0f} ms) and half the "
             f"per-micro-batch synchronisation gaps ({per_mb_sync:.0f} ms) go, {base:.0f} ms (× "
             f"{HALF_MICROBATCHES[0]:g}–{HALF_MICROBATCHES[1]:g}: the GEMMs' efficiency moves with their size)")
    return Advice(RemedyId.MICRO_BATCH, Part.IDLE_SHORT, f"Fewer, larger micro-batches: {flags[0].text()} "
                  f"(global batch {cfg.global_batch} unchanged)", _range(base, HALF_MICROBATCHES, basis), flags,
                  cost=cost, notes=(*notes, *notes2))


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
    return (f"memory: peak allocated {peak / 1024:.1f} → ~{new / 1024:.1f} GiB of {total / 1024:.0f} GiB "
            "(activations double)"), ()


def cuda_graphs(c: FitContext) -> Advice | None:
    """Only where the launch gaps are large enough to pay for replaying: the low end is a loss."""
    b, cfg = c.budget, c.config
    short = b.ms(Part.IDLE_SHORT)
    if b.step_ms <= 0 or short / b.step_ms < th.LAUNCH_GAPS_FOR_GRAPHS.value:
        return None
    gain = Gain(GRAPH_GAPS_BACK[0] * short - GRAPH_REPLAY_COST_OF_STEP * b.step_ms, GRAPH_GAPS_BACK[1] * short,
                f"{GRAPH_GAPS_BACK[0]:.0%}–{GRAPH_GAPS_BACK[1]:.0%} of the {short:.0f} ms of short launch gaps come "
                f"back (the graphed regions'), less the replay's input copies and the breaks at syncs and "
                f"dynamic shapes (up to {GRAPH_REPLAY_COST_OF_STEP:.0%} of the step)")
    if cfg.framework is Framework.MEGATRON:
        flags, notes = _flags(cfg, ("--cuda-graph-impl", "local"))
        if not flags:
            flags, notes = _flags(cfg, ("--enable-cuda-graph", None))
        if not flags:
            return None
        return Advice(RemedyId.CUDA_GRAPHS, Part.IDLE_SHORT, f"CUDA graphs: {flags[0].text()}", gain, flags,
                      cost="memory for the graphs' static buffers", notes=notes)
    return Advice(RemedyId.CUDA_GRAPHS, Part.IDLE_SHORT, "CUDA graphs: torch.compile(model, "
                  "mode=\"reduce-overhead\")", gain)


def fused_layers(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    parts = [p for p in (b.get(Part.NORM), b.get(Part.ACTIVATION), b.get(Part.POINTWISE)) if p is not None]
    ms = sum(p.ms for p in parts)
    if not _named(b, ms):
        return None
    basis = (f"normalisation, activation and other pointwise work: {ms:.0f} ms per step, each activation written "
             f"once instead of once per op (× {FUSED_POINTWISE[0]:g}–{FUSED_POINTWISE[1]:g})")
    if cfg.framework is Framework.MEGATRON:
        if cfg.arg("transformer_impl") == "transformer_engine":
            return None
        flags, notes = _flags(cfg, ("--transformer-impl", "transformer_engine"))
        needs = (PACKAGE_TE,) if cfg.missing(PACKAGE_TE) else ()
        what = " ".join(f.text() for f in flags)
        return Advice(RemedyId.FUSED_LAYERS, Part.POINTWISE, "Transformer Engine layers: " + (
            f"install Transformer Engine, then {what}" if needs else what) + " (layer norm in the linear's "
            "prologue, fused bias-activation-dropout)", _range(ms, FUSED_POINTWISE, basis), flags, needs=needs,
            notes=notes if needs or cfg.packages.get(PACKAGE_TE) else (
                *notes, "needs Transformer Engine (the log does not say whether it is installed)"))
    if cfg.framework is Framework.TORCHTITAN:
        return Advice(RemedyId.FUSED_LAYERS, Part.POINTWISE, "Fused layers: --compile.enable (torch.compile)",
                      _range(ms, FUSED_POINTWISE, basis))
    return Advice(RemedyId.FUSED_LAYERS, Part.POINTWISE, "Fused layers: torch.compile(model)",
                  _range(ms, FUSED_POINTWISE, basis))


def fused_optimizer(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    opt = b.get(Part.OPTIMIZER)
    if opt is None or not _named(b, opt.ms):
        return None
    basis = (f"the optimizer's {opt.ms:.0f} ms per step in a few multi-tensor kernels instead of chains per "
             f"parameter group (× {FUSED_OPTIMIZER_SAVES[0]:g}–{FUSED_OPTIMIZER_SAVES[1]:g})")
    if cfg.framework is Framework.MEGATRON:
        if not (cfg.missing(PACKAGE_APEX) and cfg.missing(PACKAGE_TE)):
            return None  # Megatron already uses a fused Adam when either is there
        return Advice(RemedyId.FUSED_OPTIMIZER, Part.OPTIMIZER, "A fused optimizer: install Transformer Engine "
                      "or Apex (Megatron-LM falls back to torch's per-tensor Adam without them)",
                      _range(opt.ms, FUSED_OPTIMIZER_SAVES, basis), needs=(PACKAGE_TE, PACKAGE_APEX),
                      needs_one=True)
    if cfg.framework is Framework.TORCHTITAN:
        return Advice(RemedyId.FUSED_OPTIMIZER, Part.OPTIMIZER, "A fused optimizer: --optimizer.implementation "
                      "fused", _range(opt.ms, FUSED_OPTIMIZER_SAVES, basis))
    return Advice(RemedyId.FUSED_OPTIMIZER, Part.OPTIMIZER, "A fused optimizer: torch.optim.AdamW(params, "
                  "fused=True)", _range(opt.ms, FUSED_OPTIMIZER_SAVES, basis))


def overlap_comm(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    comm = b.get(Part.COMM_EXPOSED)
    if comm is None or not _named(b, comm.ms) or not cfg.dp or cfg.dp < 2:
        return None
    basis = (f"exposed communication {comm.ms:.0f} ms per step, run behind the backward pass "
             f"(× {OVERLAP_HIDES[0]:g}–{OVERLAP_HIDES[1]:g})")
    if cfg.framework is Framework.MEGATRON:
        flags, notes = _flags(cfg, ("--use-distributed-optimizer", None), ("--overlap-grad-reduce", None),
                              ("--overlap-param-gather", None))
        if not flags:
            return None
        return Advice(RemedyId.OVERLAP_COMM, Part.COMM_EXPOSED, "Overlap gradient communication with compute: "
                      + " ".join(f.text() for f in flags), _range(comm.ms, OVERLAP_HIDES, basis), flags,
                      cost="the distributed optimizer shards optimizer state (less memory, a param all-gather)",
                      notes=notes)
    return Advice(RemedyId.OVERLAP_COMM, Part.COMM_EXPOSED, "Overlap communication: DDP buckets overlap with "
                  "backward by default (check no_sync and find_unused_parameters); FSDP: backward_prefetch",
                  _range(comm.ms, OVERLAP_HIDES, basis))


def data_loader(c: FitContext) -> Advice | None:
    """The data wait the timers measured inside the capture's long gaps (a capture alone cannot tell it
    from another host wait)."""
    b, cfg = c.budget, c.config
    p = b.get(Part.DATA)
    if p is None or not _named(b, p.ms):
        return None
    basis = (f"the step waits {p.ms:.0f} ms for its batch; a loader that keeps up hides it "
             f"(× {DATA_WAIT_BACK[0]:g}–{DATA_WAIT_BACK[1]:g})")
    return Advice(RemedyId.DATA_LOADER, Part.DATA, DATA_LOADING_ACTION, _range(p.ms, DATA_WAIT_BACK, basis),
                  notes=(DATA_KNOBS[cfg.framework],))


def pipeline_wait(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    p = b.get(Part.PIPELINE)
    if p is None or not _named(b, p.ms):
        return None
    basis = (f"pipeline waits {p.ms:.0f} ms per step: the 1F1B bubble (p−1)/(m+p−1) nearly halves as the "
             f"micro-batches double (× {PIPELINE_WAIT_BACK[0]:g}–{PIPELINE_WAIT_BACK[1]:g}; imbalance between "
             "stages stays)")
    if cfg.framework is Framework.MEGATRON:
        return Advice(RemedyId.PIPELINE, Part.PIPELINE, "Shrink the pipeline wait: more micro-batches per "
                      "iteration (a larger --global-batch-size or a smaller --micro-batch-size), interleaved "
                      "stages (--num-layers-per-virtual-pipeline-stage), or rebalance layers between stages "
                      "(--decoder-last-pipeline-num-layers)", _range(p.ms, PIPELINE_WAIT_BACK, basis))
    return Advice(RemedyId.PIPELINE, Part.PIPELINE, "Shrink the pipeline wait: more micro-batches per step, an "
                  "interleaved schedule, balanced stages", _range(p.ms, PIPELINE_WAIT_BACK, basis))


def bigger_gemms(c: FitContext) -> Advice | None:
    b, cfg = c.budget, c.config
    p = b.get(Part.LINEAR) or b.get(Part.GEMM)
    if p is None:
        return None
    of, at = p.detail.get("of_ceiling"), p.detail.get("at_ceiling_ms")
    if not isinstance(of, (int, float)) or not isinstance(at, (int, float)) or of >= th.GEMM_EFFICIENT.value:
        return None
    above = p.ms - at / th.GEMM_EFFICIENT.value
    if not _named(b, above):
        return None
    basis = (f"the GEMMs run at {of:.0%} of the ceiling: {p.ms:.0f} ms per step where {at / th.GEMM_EFFICIENT.value:.0f}"
             f" ms would be {th.GEMM_EFFICIENT.value:.0%} of it (× {GEMM_TO_TARGET[0]:g}–{GEMM_TO_TARGET[1]:g} "
             "of the difference)")
    act = ("Bigger GEMMs: a larger --micro-batch-size, hidden and FFN sizes multiples of 128"
           if cfg.framework is Framework.MEGATRON else "Bigger GEMMs: a larger batch per step, dimensions "
           "multiples of 128")
    return Advice(RemedyId.BIGGER_GEMMS, p.part, act, _range(above, GEMM_TO_TARGET, basis))


Remedy = Callable[[FitContext], Advice | None]
# The one registry: every remedy, in the order alternatives for the same part are listed.
REMEDIES: tuple[Remedy, ...] = (fused_attention, softmax_fusion, attention_dropout, ce_fusion, timer_sync,
                                micro_batch, cuda_graphs, fused_layers, fused_optimizer, overlap_comm,
                                bigger_gemms, data_loader, pipeline_wait)


def fit(c: FitContext, remedies: Iterable[Remedy] = REMEDIES) -> list[Advice]:
    """Every remedy the budget calls for on this job, fitted to its configuration: those whose expected
    gain is worth a change (th.REMEDY_MIN_GAIN of the step at the range's middle), and those whose range
    is uncertain by nature (a possible loss) when the part they act on is large (their own gates)."""
    floor = th.REMEDY_MIN_GAIN.value * c.budget.step_ms
    return [a for r in remedies if (a := r(c)) is not None
            and (a.gain is None or not a.gain.promised or a.gain.mid_ms >= floor)]

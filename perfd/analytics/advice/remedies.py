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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.advice import megatron_options as mo
from perfd.analytics.breakdown.budget import BudgetPart, Part, StepBudget
from perfd.analytics.common import TextEnum
from perfd.model import ABSENT


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
    RECOMPUTE = "recompute"


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
# Every range also carries the run-to-run spread of a steady step: the same job measured twice on one
# H100 ran 693.2 and 698.2 ms (0.7%), 693.3 and 693.5 ms in another pair; a change is told apart from
# a rerun only beyond it.
RUN_SPREAD_OF_STEP = 0.005
# Removing kernels from a busy GPU gives back their time; their launches and the gaps around them move
# too, and the ops that remain can grow a little (allocations, a changed memory layout).
REMOVED_KERNELS = (0.85, 1.2)
# A fused kernel runs about as long as the longest pass it merges. Megatron's native cross-entropy
# fusion compiles functions that change their inputs in place (the subtraction, the exp into the same
# tensor, the division, the gradient's multiply): torch.compile writes the changed logits back, so part
# of the traffic the fusion would save stays (measured on an H100: 0.36–0.6 of this model's saving).
MERGED_PASSES = (0.4, 1.4)
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
# Full activation recomputation runs each layer's forward again in its backward: about a third of the
# layers' forward+backward time (forward 1×, backward 2×); the optimizer and the loss are not redone.
RECOMPUTED_FORWARD = (0.6, 1.0)
FUSED_OPTIMIZER_SAVES = (0.3, 0.7)  # multi-tensor Adam against per-tensor kernels
OVERLAP_HIDES = (0.5, 0.9)  # exposed data-parallel communication hidden behind backward
GEMM_TO_TARGET = (0.3, 0.6)  # the share of the time above the ceiling-at-target bigger GEMMs win back
# Megatron-LM's level-2 timers (forward-compute, backward-compute, batch-generator) start and stop once
# per micro-batch, each with a device synchronisation (megatron/core/timers.py).
LEVEL2_SYNCS_PER_MICROBATCH = 6


# The data loader's knobs per framework (the action itself is DATA_LOADING_ACTION, shared with incidents).
DATA_KNOBS: dict[Framework, str] = {
    Framework.MEGATRON: "Megatron-LM: --num-workers",
    Framework.PYTORCH: "DataLoader(num_workers=N, pin_memory=True, prefetch_factor=4, "
                       "persistent_workers=True)",
    Framework.TORCHTITAN: "torchtitan: more data-loader workers",
}


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


def flags_for(cfg: JobConfig, *wanted: tuple[str, str | None]) -> tuple[tuple[Flag, ...], tuple[str, ...]]:
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


def ranged(ms: float, lo_hi: tuple[float, float], basis: str) -> Gain:
    return Gain(ms * lo_hi[0], ms * lo_hi[1], basis)


def with_spread(g: Gain | None, step_ms: float) -> Gain | None:
    """The range widened by the run-to-run spread of the step: what a measured change is held to."""
    if g is None:
        return None
    s = RUN_SPREAD_OF_STEP * step_ms
    return Gain(g.low_ms - s, g.high_ms + s, f"{g.basis}; ± {s:.0f} ms run to run "
                f"({RUN_SPREAD_OF_STEP:.1%} of the step)")


def per_step(b: StepBudget, key: str) -> float | None:
    """A per-step figure the capture's budget carries in its host detail (sync gaps and counts)."""
    v = b.host.get(key) if b.host else None
    return float(v) if isinstance(v, (int, float)) else None


def named(b: StepBudget, ms: float) -> bool:
    """The part (or the ops) a remedy acts on hold enough of the step to be worth one."""
    return b.step_ms > 0 and ms / b.step_ms >= th.BUDGET_PART_NAMED.value

"""Plain data shared by collectors, analytics, transport and exporters.

Everything here is a dataclass of plain values: no I/O, no behaviour beyond small helpers.
Collectors produce these, the analytics consume them, the transport serialises them. A value
that a source did not report is ``None`` (absent), never 0: see docs/design.md §2 (a
metric whose inputs are missing is absent, not zero).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

# Where a step record's numbers come from, when not one specific rank:
#   "last"  - printed by the last rank on behalf of the job (Megatron's iteration line);
#   "all"   - aggregated over all ranks (Megatron's minmax timers give min and max across ranks).
RankScope = int | Literal["last", "all"]

# The capture tools, declared once: rules (perfd/rules), the capture coordinator, the CLI and the
# agent's capture manager all derive from this. "auto" = nsys when the job runs under a perfd nsys
# session or range profile, else Kineto (perfd/capture/manager.py decides); never ncu, a kernel deep
# dive asked for by name on ranks started under it (perfd ncu-prefix, perfd launch --ncu).
CaptureTool = Literal["kineto", "nsys", "ncu", "auto"]
CAPTURE_TOOLS: tuple[CaptureTool, ...] = get_args(CaptureTool)
_TOOL_OF: dict[str, CaptureTool] = {t: t for t in CAPTURE_TOOLS}


def capture_tool(v: object) -> CaptureTool | None:
    """The tool a text names (a typed closed set, never compared as free text); None: none of them."""
    return _TOOL_OF.get(v) if isinstance(v, str) else None


# How a capture ended, as perfd_agent_captures_total{status} counts it (the agent serves every tool x
# outcome from 0, so that increase() sees the first capture): ok, failed, or skipped (refused before
# it began: busy ranks, quota, a request it cannot serve; the tool then may still be "auto").
# Where a job computes (JobInfo.device): "cuda" (a GPU), "cpu" (no CUDA in its processes: the step
# hook's JOB_FLAG_NO_CUDA). Unknown (None) for a source that does not say.
Device = Literal["cuda", "cpu"]
DEVICES: tuple[Device, ...] = get_args(Device)
CUDA: Device = "cuda"
CPU: Device = "cpu"

CaptureOutcome = Literal["ok", "failed", "skipped"]
CAPTURE_OUTCOMES: tuple[CaptureOutcome, ...] = get_args(CaptureOutcome)


class CaptureFailure(str, enum.Enum):
    """Why a capture did not run, as its agent types it (the ``cause`` of a capture_failed event): the
    aggregator retries a capture whose target was not ready once it is, and takes no rule cooldown for
    it; a real failure holds the cooldown (its reason says what to fix)."""

    NOT_READY = "not_ready"  # the target cannot take it yet: no process, no hook, no Kineto poll so far
    FAILED = "failed"  # anything else: a tool missing, a refusal, a timeout, a report not analysed

    @classmethod
    def of(cls, value: object) -> CaptureFailure | None:
        """The cause a payload names, or None (an older agent's event names none)."""
        try:
            return cls(value)
        except ValueError:
            return None


class TextEnum(str, enum.Enum):
    """A closed set of names that travel as text (JSON values, labels) and show as their value
    whatever the Python version (3.12 changed how a str-mixin enum formats)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class CaptureStatus(TextEnum):
    """Where an aggregator's capture request stands (perfd.aggregator.capture_records.CaptureRecord):
    asked, then reported running by an agent, then ended; or never sent (undeliverable: no agent of
    the job; skipped: perfd could pick no tool; refused: the request itself, at the API). Shows and
    travels (JSON, the state store) as its value."""

    REQUESTED = "requested"
    STARTED = "started"
    FINISHED = "finished"
    FAILED = "failed"
    UNDELIVERABLE = "undeliverable"
    SKIPPED = "skipped"
    REFUSED = "refused"

    @property
    def live(self) -> bool:
        """Asked or running: an agent may still report it."""
        return self in (CaptureStatus.REQUESTED, CaptureStatus.STARTED)

    @property
    def ended(self) -> bool:
        """Ran to its end, well or not (what an agent reported last)."""
        return self in (CaptureStatus.FINISHED, CaptureStatus.FAILED)

    @property
    def unsent(self) -> bool:
        """Never reached an agent."""
        return self in (CaptureStatus.UNDELIVERABLE, CaptureStatus.SKIPPED)

    @property
    def refused(self) -> bool:
        """The request itself was refused (the API answers 409)."""
        return self is CaptureStatus.REFUSED

    @classmethod
    def of(cls, value: object) -> CaptureStatus:
        """A kept record's status (the state store's JSON); ValueError for one this version does not
        know."""
        return cls(value)


@dataclass(frozen=True)
class Provenance:
    """Names the source of a number: which collector, which file/line or counter."""

    collector: str  # e.g. "megatron", "nvml", "analytics"
    detail: str  # e.g. "train.log:1234", "nvmlDeviceGetPowerUsage", "formula:megatron-core>=0.12"

    def __str__(self) -> str:
        return f"{self.collector}:{self.detail}"


@dataclass
class ParseIssue:
    """A line a parser could not use. Counted and reported, never fatal."""

    line_no: int
    reason: str  # short machine-friendly reason, e.g. "iteration-line-no-iteration-number"
    text: str  # the (truncated) offending text


# The step hook's timers (collectors/hook). Its step time is the step's period: from the previous
# step's end to this one's, the time between the two steps included (the README's loop fetches its
# batch there). Of it: the data wait (every stamped fetch in the period, perfd.hook.loader, and the host
# time step_begin() -> data_ready()), the GPU time data_ready() -> end (with cuda_data_event), and the
# host time between the steps that was neither a fetch nor an announced pause ("outside the step").
HOOK_DATA_WAIT = "data-wait"
HOOK_COMPUTE = "compute"
HOOK_OUTSIDE = "outside-step"
# A hook step record's fields (text, as every record's): what its step time is (HOOK_STEP_PERIOD, or
# HOOK_STEP_IN_STEP from a hook that measured no period: the first step of a series, an older hook),
# the time inside the step beside a period (ms), and what its data wait was measured from ("fetch",
# "data_ready", "fetch+data_ready").
HOOK_STEP_TIME_FIELD = "step_time"
HOOK_STEP_PERIOD = "period"
HOOK_STEP_IN_STEP = "in-step"
HOOK_IN_STEP_FIELD = "in_step_ms"
HOOK_DATA_WAIT_FROM_FIELD = "data_wait_from"
# A pause the hook's rank announced between two steps (``with hook.phase("checkpoint")``), timed by
# the hook's own begin and end and put on the rank's next step record: the time paused *before* that
# step (a Megatron-LM timer such as save-checkpoint is printed after the step it follows). Keyed by
# the phase's name (perfd.hook.wire.PHASES), which is goodput's kind.
HOOK_PAUSE_TIMERS: dict[str, str] = {"checkpoint": "paused-checkpoint", "evaluation": "paused-evaluation"}


@dataclass
class TimerValue:
    """One Megatron timer for one log interval, in ms per iteration (averaged over the interval).

    ``minmax`` format fills min and max; ``max`` fills max only; ``all`` fills per_rank (and
    min/max are derived from it); the old one-line format gives a single value, stored as max.
    """

    min_ms: float | None = None
    max_ms: float | None = None
    per_rank: dict[int, float] = field(default_factory=dict)

    def spread(self) -> float | None:
        if self.min_ms is None or self.max_ms is None or self.min_ms <= 0:
            return None
        return self.max_ms / self.min_ms


@dataclass
class RankValue:
    """A value with the rank that holds it (Megatron straggler detector: ``98.88ms/0``)."""

    value: float
    rank: int
    unit: str


@dataclass
class StragglerLine:
    """Megatron's straggler-detector line: per quantity the min and max across ranks, and who."""

    time: str | None
    # key -> (min, max); keys: "rtt" (ms), "power" (W, converted from the mW Megatron prints),
    # "temp" (C), "util" (%), "clock" (MHz), "data_rtt" (ms), "tflops" (TF).
    quantities: dict[str, tuple[RankValue, RankValue]] = field(default_factory=dict)
    line_no: int = 0


@dataclass
class StepRecord:
    """One iteration of one job, as one source saw it. The iteration number is the join key."""

    job: str
    iteration: int
    rank: RankScope = "last"
    end_time: float | None = None  # epoch seconds (UTC), when the source gives a timestamp
    train_iters: int | None = None
    step_time_ms: float | None = None
    logged_tflops_per_gpu: float | None = None  # the framework's own throughput figure
    consumed_samples: int | None = None
    global_batch_size: int | None = None
    learning_rate: float | None = None
    lm_loss: float | None = None
    loss_scale: float | None = None
    grad_norm: float | None = None
    skipped_iterations: int | None = None
    nan_iterations: int | None = None
    # Iterations this record averages over (Megatron's log interval); timers are per-iteration means.
    interval: int | None = None
    fields: dict[str, str] = field(default_factory=dict)  # every raw key: value pair as printed
    timers: dict[str, TimerValue] = field(default_factory=dict)
    straggler: StragglerLine | None = None
    # Per-rank memory report printed after this iteration (Megatron's ``[Rank r] (after N iterations)
    # memory (MB) | allocated: ...`` lines): rank -> {"allocated": MB, "max allocated": MB, ...}.
    memory_mb: dict[int, dict[str, float]] = field(default_factory=dict)
    source: Provenance | None = None
    disturbed_by_capture: bool = False  # perfd's own capture touched this iteration
    # The first record of a run of the job: the framework's start-up output came before it. On any
    # record but the job's first, a restart (goodput counts the time before it as such).
    first_of_run: bool = False
    # The step hook's counts for the whole job per step (all ranks, as Megatron counts an iteration):
    # the tokens it took and the training script's own model FLOPs (perfd.hook.step.StepHook).
    tokens_per_step: float | None = None
    flops_per_step: float | None = None
    # The rank that took this step runs under a profiler armed for a capture (``perfd ncu-exec``'s
    # target, perfd.core.armed): armed from its process's first step, its steps are the profiler's, not
    # the job's (kept out of its MFU, step time, jitter and class).
    armed: bool = False
    # An ``"all"`` fold's ranks' own end times (perfd.core.stepfold): each rank's iteration ends when its own
    # record did, so the communication share's per-rank windows
    # (perfd.analytics.collectives.collective_windows)
    # read the fold as they read the ranks' records. Empty on a rank's own record and a log's.
    rank_end_times: dict[int, float] = field(default_factory=dict)

    def has_field(self, key: str) -> bool:
        return key in self.fields


@dataclass
class ParallelLayout:
    """Parallel layout of a job, as its sources state it. Unknown sizes stay None."""

    world_size: int | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    vpp: int | None = None  # virtual pipeline stages per pipeline rank (interleaved 1F1B)
    micro_batch_size: int | None = None
    global_batch_size: int | None = None
    num_microbatches: int | None = None  # per iteration, per DP replica

    def microbatches(self) -> int | None:
        """Micro-batches per iteration: the stated value, or global / (micro * DP)."""
        if self.num_microbatches is not None:
            return self.num_microbatches
        if self.global_batch_size and self.micro_batch_size and self.dp:
            return self.global_batch_size // (self.micro_batch_size * self.dp)
        return None


@dataclass
class ModelSpec:
    """What the FLOPs formula needs; fields a source did not state stay None."""

    num_layers: int | None = None
    hidden_size: int | None = None
    ffn_hidden_size: int | None = None
    num_attention_heads: int | None = None
    kv_channels: int | None = None
    num_query_groups: int | None = None  # None: no GQA (kv heads = attention heads)
    seq_length: int | None = None
    padded_vocab_size: int | None = None
    vocab_size: int | None = None
    swiglu: bool = False
    untie_embeddings: bool = False
    num_experts: int | None = None
    moe_router_topk: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_ffn_hidden_size: int | None = None
    moe_layer_freq: int | list[int] | None = None
    mtp_num_layers: int | None = None
    multi_latent_attention: bool = False
    parameter_count: int | None = None  # for the 6·N·tokens fallback
    dtype: str | None = None  # "bf16", "fp16", "fp8", "fp32"


@dataclass
class JobInfo:
    """Everything a log's start-up says about the job."""

    framework: str = "megatron"
    framework_version: str | None = None  # e.g. Megatron-Core "0.20.0"
    # Where it computes, as its processes say (the step hook's job flags and CUDA-timed records);
    # None: not said (Megatron-LM's log is a GPU job's, but says so nowhere perfd reads).
    device: Device | None = None
    torch_version: str | None = None
    layout: ParallelLayout = field(default_factory=ParallelLayout)
    spec: ModelSpec = field(default_factory=ModelSpec)
    timing_log_option: str | None = None  # minmax | max | all
    log_interval: int | None = None
    arguments: dict[str, str] = field(default_factory=dict)  # the raw arguments block
    # Timer blocks printed before the first iteration (startup-*, model-and-optimizer-setup, ...).
    startup_timers: dict[str, TimerValue] = field(default_factory=dict)
    # The W&B run the training script logs to (perfd launch --wandb-run-id, or the job's own
    # WANDB_RUN_ID): perfd's W&B export attaches to it instead of making a run of its own.
    wandb_run_id: str | None = None
    # The job's first start-up timestamp (epoch s): the earliest ``[...] datetime:`` line Megatron-LM
    # prints while it starts, or the first line's arrival time (perfd.core.linetimes). Goodput's start-up
    # part runs from here to the first step.
    started_at: float | None = None
    # Packages the job's remedies may need, as its start-up says (PACKAGES): name -> version, or
    # "absent" where the log says it is not installed ("Transformer Engine version ... 0.0.0", "Apex
    # is not installed"). A package the log says nothing of is not listed (unknown).
    packages: dict[str, str] = field(default_factory=dict)
    # The job's own word on the MFU alert (perfd agent --no-mfu-alert, `mfu_alert: false` in its config,
    # perfd launch --no-mfu-alert in its manifest): False for a job that is low-MFU by design (a debugging
    # run, a tiny model), exported as perfd_job_mfu_alert_opt_out_info, which PerfdJobMFULow leaves out.
    # None: not said (the alert applies).
    mfu_alert: bool | None = None


# The packages perfd's remedies name (perfd.analytics.advice.remedies), as JobInfo.packages keys.
PACKAGE_TE = "transformer_engine"
PACKAGE_APEX = "apex"
PACKAGE_FLASH_ATTN = "flash_attn"
PACKAGES: tuple[str, ...] = (PACKAGE_TE, PACKAGE_APEX, PACKAGE_FLASH_ATTN)
ABSENT = "absent"


@dataclass
class CollectiveRecord:
    """One collective or point-to-point operation on one rank, as one source saw it.

    Sources: ``"flight_recorder"`` (PyTorch's ring of recent collectives, dumped on request) and
    ``"nccl_inspector"`` (NCCL's profiler plugin, one JSON line per sampled operation). What a source
    does not report stays ``None``: Flight Recorder has no duration unless the job set
    ``TORCH_NCCL_ENABLE_TIMING=1``; the Inspector knows the rank within the communicator, not the
    global rank.
    """

    job: str
    source: str  # "flight_recorder" | "nccl_inspector"
    op: str  # canonical: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all,
    #          send, recv, barrier, ... (unknown names kept as printed, lower-cased)
    rank: int | None = None  # global rank (Flight Recorder: the dump's rank)
    raw_op: str | None = None  # as the source printed it: "nccl:all_reduce", "AllReduce"
    pg_id: int | None = None  # Flight Recorder process-group uid (creation order in the process)
    pg_name: str | None = None  # Flight Recorder pg name; Inspector comm_name when present
    pg_desc: str | None = None  # Flight Recorder pg description ("default_pg", "undefined", ...)
    comm_id: str | None = None  # Inspector communicator hash ("0x7f8c496ae9f661")
    pg_ranks: list[int] | None = None  # global ranks of the group, when the source lists them
    group_rank: int | None = None  # this rank's index within the group
    group_size: int | None = None
    nnodes: int | None = None
    collective_seq_id: int | None = None  # per process group, counts collectives
    p2p_seq_id: int | None = None  # per process group, counts point-to-point ops
    is_p2p: bool = False
    peer: int | None = None  # p2p peer, rank within the group
    bytes: int | None = None  # the larger of input and output bytes (the nccl-tests "size")
    dtype: str | None = None  # torch name ("BFloat16"); the Inspector prints none
    state: str | None = None  # Flight Recorder: scheduled | started | completed
    time_created_ns: int | None = None  # epoch ns, when the op was enqueued (Flight Recorder)
    # epoch ns; Flight Recorder: when the watchdog noticed completion (coarse); Inspector: when the
    # record was written (an upper bound of the completion time)
    time_completed_ns: int | None = None
    duration_ms: float | None = None  # Flight Recorder's includes waiting for peers
    algbw_gbs: float | None = None
    busbw_gbs: float | None = None
    timing_source: str | None = None  # Inspector: kernel_gpu | kernel_cpu | collective_cpu
    host: str | None = None
    pid: int | None = None
    provenance: Provenance | None = None


@dataclass
class Sample:
    """One time-series point from a collector (NVML, host, ...). Labels stay bounded."""

    name: str  # a catalog metric name
    value: float
    time: float  # epoch seconds
    labels: dict[str, str] = field(default_factory=dict)


LabelSet = tuple[tuple[str, str], ...]  # sorted (name, value) pairs of one Prometheus series


def label_set(labels: Mapping[str, str]) -> LabelSet:
    """The canonical, hashable form of a label map (the one every layer keys a series on)."""
    return tuple(sorted(labels.items()))


HOOK_FRAMEWORK = "pytorch"  # the framework of the JobInfo the step hook's job records make
# The trainers whose callbacks drive the step hook (perfd.hook.hf, perfd.hook.lightning): their hooks say
# which (wire.KIND_FRAMEWORK), so that the job's advice is in the trainer's own terms; they describe the
# job as a plain hook does, never as a log does.
HF_TRAINER_FRAMEWORK = "hf_trainer"
LIGHTNING_FRAMEWORK = "lightning"
HOOK_FRAMEWORKS: tuple[str, ...] = (HOOK_FRAMEWORK, HF_TRAINER_FRAMEWORK, LIGHTNING_FRAMEWORK)
TORCHTITAN_FRAMEWORK = "torchtitan"  # the JobInfo its log makes (perfd.collectors.torchtitan)


def kineto_iterations_per_step(info: JobInfo) -> int:
    """The iterations libkineto's on-demand counter counts in one training step of the job: a Kineto
    capture of N steps asks for N times this many (perfd.capture.kineto_capture), and its start and
    round-up in the same units.

    libkineto counts every ``torch.optim.Optimizer.step()`` call, a nested one too (PyTorch's global
    optimizer post-hook, registered when the process runs with KINETO_USE_DAEMON). torchtitan's
    OptimizersContainer is itself an Optimizer whose step() steps one optimizer per model part: 1 +
    the rank's model parts a step. With pipeline parallelism off there is one part, so 2: on an H200 a
    capture asked for 3 iterations held one training step, ``Optimizer.step#AdamW.step`` inside
    ``Optimizer.step#OptimizersContainer.step`` on one thread. Under pipeline parallelism a part is a
    stage of the rank: one for torchtitan's single-stage schedules (1F1B, GPipe), ``layout.vpp`` where
    a source states it; an interleaved schedule the log does not state has more, and the capture then
    holds fewer steps than asked. Any other job: 1 (one torch.optim step a training step; the HF
    Trainer's AcceleratedOptimizer wraps its optimizer without counting itself)."""
    if info.framework != TORCHTITAN_FRAMEWORK:
        return 1
    lay = info.layout
    parts = lay.vpp if lay.pp is not None and lay.pp > 1 and lay.vpp is not None and lay.vpp > 0 else 1
    return 1 + parts


def merge_job_info(held: JobInfo | None, new: JobInfo) -> JobInfo:
    """One job, two describers: a framework's log (Megatron-LM, torchtitan) says the most, the step
    hooks in the same job say the layout and dtype as the process sees them. The log's JobInfo is
    kept whichever came first, its unknown layout sizes and dtype filled from the hooks'; the same
    describer again replaces its own (the hooks are one describer whichever trainer drives them; a
    plain hook's word does not take the trainer away that another node's hooks named)."""
    if held is None or held.framework == new.framework:
        return new
    if held.framework in HOOK_FRAMEWORKS and new.framework in HOOK_FRAMEWORKS:
        if new.framework == HOOK_FRAMEWORK:
            return dataclasses.replace(new, framework=held.framework,
                                       framework_version=held.framework_version)
        return new
    if new.framework in HOOK_FRAMEWORKS:
        base, hook = held, new
    elif held.framework in HOOK_FRAMEWORKS:
        base, hook = new, held
    else:
        return new  # two logs of different frameworks: the latest says what the job is
    layout = dataclasses.replace(base.layout, **{
        f.name: getattr(hook.layout, f.name) for f in dataclasses.fields(hook.layout)
        if getattr(base.layout, f.name) is None and getattr(hook.layout, f.name) is not None})
    spec = base.spec if base.spec.dtype is not None or hook.spec.dtype is None else \
        dataclasses.replace(base.spec, dtype=hook.spec.dtype)
    opted_out = base.mfu_alert is False or hook.mfu_alert is False  # either describer's opt-out holds
    return dataclasses.replace(base, layout=layout, spec=spec,
                               mfu_alert=False if opted_out else base.mfu_alert)

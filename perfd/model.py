"""Plain data shared by collectors, analytics, transport and exporters.

Everything here is a dataclass of plain values: no I/O, no behaviour beyond small helpers.
Collectors produce these, the analytics consume them, the transport serialises them. A value
that a source did not report is ``None`` (absent), never 0: see DESIGN.md "Metrics are never
invented".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

# Where a step record's numbers come from, when not one specific rank:
#   "last"  - printed by the last rank on behalf of the job (Megatron's iteration line);
#   "all"   - aggregated over all ranks (Megatron's minmax timers give min and max across ranks).
RankScope = int | Literal["last", "all"]

# The capture tools, declared once: rules (perfd/rules), the capture coordinator, the CLI and the
# agent's capture manager all derive from this. "auto" = nsys when the job runs under a perfd nsys
# session or range profile, else Kineto (perfd/capture/manager.py decides).
CaptureTool = Literal["kineto", "nsys", "auto"]
CAPTURE_TOOLS: tuple[CaptureTool, ...] = get_args(CaptureTool)


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
    torch_version: str | None = None
    layout: ParallelLayout = field(default_factory=ParallelLayout)
    spec: ModelSpec = field(default_factory=ModelSpec)
    timing_log_option: str | None = None  # minmax | max | all
    log_interval: int | None = None
    arguments: dict[str, str] = field(default_factory=dict)  # the raw arguments block
    # Timer blocks printed before the first iteration (startup-*, model-and-optimizer-setup, ...).
    startup_timers: dict[str, TimerValue] = field(default_factory=dict)


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
